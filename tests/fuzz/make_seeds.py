#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/.

  python3 tests/fuzz/make_seeds.py            # every corpus
  python3 tests/fuzz/make_seeds.py indexer    # one (gguf, gguf_tokenizer, indexer, tokenizer,
                                              # cli_args, server_request)

gguf: small files from the gguf package's writer (pip install gguf); gguf_tokenizer: two
tokenizer-only GGUFs written with struct (no packages needed). indexer: the committed
indexers/*.cisaidx (the small one whole, both as bare payloads behind the mode byte, truncated and
bit-flipped copies). tokenizer and cli_args: hand-written texts and command lines; server_request:
hand-written request bodies. Each seed starts
with the mode bytes its fuzzer reads (see the .cpp files).
"""
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CORPUS = HERE / "corpus"


def out_dir(name):
    d = CORPUS / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def gguf_seeds():
    import numpy as np
    import gguf

    out = out_dir("gguf")

    def write(name, fill):
        w = gguf.GGUFWriter(str(out / name), "llama")
        fill(w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    def small(w):
        w.add_block_count(2)
        w.add_context_length(128)
        w.add_token_list(["<s>", "</s>", "a", "b"])
        w.add_token_scores([0.0, 0.0, -1.0, -2.0])
        w.add_token_types([3, 3, 1, 1])
        w.add_bool("test.flag", True)
        w.add_float32("test.f", 0.5)
        w.add_tensor("w.f32", np.arange(8, dtype=np.float32).reshape(2, 4))

    def quantised(w):
        w.add_string("general.name", "seed")
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2, 64)).astype(np.float32)
        for qt in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0,
                   gguf.GGMLQuantizationType.Q5_1):
            q = gguf.quants.quantize(x, qt)
            w.add_tensor(f"w.{qt.name}", q, raw_shape=q.shape, raw_dtype=qt)

    def with_tokenizer(w):
        # Reaches Tokenizer::from_gguf in gguf_fuzz.
        w.add_tokenizer_model("llama")
        toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581a", "a", "b"]
        w.add_token_list(toks)
        w.add_token_scores([0.0] * 259 + [-1.0, -2.0, -3.0])
        w.add_token_types([2, 3, 3] + [6] * 256 + [1, 1, 1])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)

    write("small.gguf", small)
    write("quantised.gguf", quantised)
    write("tokenizer.gguf", with_tokenizer)


def raw_gguf(kvs):
    """A GGUF v3 file of metadata only (no tensors), written with struct: kvs is a list of
    (key, kind, value) with kind u32, bool, str, [str], [f32] or [i32]."""
    def s(x):
        b = x.encode() if isinstance(x, str) else x
        return struct.pack("<Q", len(b)) + b

    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, kind, v in kvs:
        out += s(key)
        if kind == "u32":
            out += struct.pack("<II", 4, v)
        elif kind == "bool":
            out += struct.pack("<IB", 7, v)
        elif kind == "str":
            out += struct.pack("<I", 8) + s(v)
        elif kind == "[str]":
            out += struct.pack("<IIQ", 9, 8, len(v)) + b"".join(s(x) for x in v)
        else:
            code, fmt = {"[f32]": (6, "f"), "[i32]": (5, "i")}[kind]
            out += struct.pack("<IIQ", 9, code, len(v)) + struct.pack(f"<{len(v)}{fmt}", *v)
    return out + b"\0" * (-len(out) % 32)


def gguf_tokenizer_seeds():
    """Seeds that reach Tokenizer::from_gguf in gguf_fuzz; need no Python packages."""
    out = out_dir("gguf")
    spm = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581a", "a", "b"]
    (out / "tokenizer_spm.gguf").write_bytes(raw_gguf([
        ("general.architecture", "str", "llama"),
        ("tokenizer.ggml.model", "str", "llama"),
        ("tokenizer.ggml.tokens", "[str]", spm),
        ("tokenizer.ggml.scores", "[f32]", [0.0] * 259 + [-1.0, -2.0, -3.0]),
        ("tokenizer.ggml.token_type", "[i32]", [2, 3, 3] + [6] * 256 + [1, 1, 1]),
        ("tokenizer.ggml.unknown_token_id", "u32", 0),
        ("tokenizer.ggml.bos_token_id", "u32", 1),
        ("tokenizer.ggml.eos_token_id", "u32", 2),
        ("tokenizer.ggml.add_space_prefix", "bool", 0),
    ]))
    bpe = [chr(c) for c in range(0x21, 0x7F)] + ["\u0120", "\u0120a", "ab", "<|im_end|>"]
    (out / "tokenizer_bpe.gguf").write_bytes(raw_gguf([
        ("general.architecture", "str", "llama"),
        ("tokenizer.ggml.model", "str", "gpt2"),
        ("tokenizer.ggml.pre", "str", "smollm"),
        ("tokenizer.ggml.tokens", "[str]", bpe),
        ("tokenizer.ggml.token_type", "[i32]", [1] * (len(bpe) - 1) + [3]),
        ("tokenizer.ggml.merges", "[str]", ["\u0120 a", "a b"]),
        ("tokenizer.ggml.eos_token_id", "u32", len(bpe) - 1),
    ]))


def indexer_seeds():
    out = out_dir("indexer")
    header = 8 + 4 + 4 + 8 + 8
    for f in sorted((ROOT / "indexers").glob("*.cisaidx")):
        b = f.read_bytes()
        stem = f.stem
        # Mode byte 0x01: the payload alone, the fuzzer writes the header (and its hash).
        (out / f"{stem}.payload").write_bytes(b"\x01" + b[header:])
        if len(b) <= 2048:
            (out / f"{stem}.file").write_bytes(b"\x00" + b)  # mode 0x00: the whole file
        (out / f"{stem}.truncated").write_bytes(b"\x00" + b[: header + 40])
        flipped = bytearray(b)
        flipped[header + 2] ^= 0x10  # a bit of the architecture string: hash mismatch
        (out / f"{stem}.flipped").write_bytes(b"\x00" + bytes(flipped[:2048]))
        p = bytearray(b[header:])
        struct.pack_into("<I", p, 0, 0xFFFFFFF0)  # architecture length out of range
        (out / f"{stem}.badlen.payload").write_bytes(b"\x01" + bytes(p))


def tokenizer_seeds():
    out = out_dir("tokenizer")
    texts = {
        "english": "Once upon a time, there was a little fox. It's 2024; they'll say \"hi\".",
        "chat_gemma": "<start_of_turn>user\nHello there<end_of_turn>\n<start_of_turn>model\n",
        "chat_smollm": "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi",
        "unicode": "caf\u00e9 \u4e2d\u6587 \u0928\u092e\u0938\u094d\u0924\u0947 \U0001F44D \u00bd \u2581x",
        "digits": "3.14159 1234567890 x1y22z333  \t\n\n   end",
        "spaces": "  a  b   \n\n\n\t\t c ",
        "code": "def f(x):\n    return x**2  # square\n\nprint(f(3))\n",
    }
    for i, (name, t) in enumerate(texts.items()):
        for tok in range(5):
            flags = 1 if "chat" in name else 0
            (out / f"{name}.{tok}").write_bytes(bytes([tok, flags]) + t.encode())
    (out / "invalid_utf8").write_bytes(b"\x00\x00" + b"a\xc3 b\xff\xfe\xe2\x82 \xf0\x9f\x91")
    (out / "bos").write_bytes(b"\x03\x02" + b"hello")


def cli_args_seeds():
    out = out_dir("cli_args")
    lines = {
        "run": [b"-m", b"gemma3-270m", b"-p", b"Once upon a time", b"-n", b"32", b"--greedy"],
        "ranges": [b"--context", b"8192", b"--temperature", b"0.7", b"--top-p=0.9", b"--offset", b"-5"],
        "bad_number": [b"--context", b"12x"],
        "out_of_range": [b"--tokens", b"99999999999"],
        "data": [b"--data", b"a.txt", b"b.txt", b"--backend", b"cuda", b"file.gguf"],
        "help": [b"--help"],
        "flag_value": [b"--json=1"],
        "control": [b"-p", b"\x1b[31mred\x1b]0;title\x07", b"\xc2\x9b"],
        "missing": [b"--model"],
    }
    for name, words in lines.items():
        for config in (0, 3, 12):
            (out / f"{name}.{config}").write_bytes(bytes([config]) + b"\x00".join(words))


def server_request_seeds():
    """Request bodies behind the selector byte (server_request_fuzz.cpp): bit 0 the route (1: chat),
    the rest the model (0 tiny dense, 1 tiny CISA, 2 synthetic without a tokenizer, 3+ models/)."""
    out = out_dir("server_request")
    completions = {
        "text": b'{"model": "fuzz", "prompt": "abc", "max_tokens": 4, "temperature": 0}',
        "ids": b'{"prompt": [1, 3, 4, 5], "max_tokens": 8, "ignore_eos": true, "seed": 7}',
        "stream": b'{"prompt": ["abc"], "stream": true, "stream_options": {"include_usage": true}}',
        "sampling": b'{"prompt": "ab", "temperature": 0.7, "top_p": 0.9, "top_k": 40, "stop": ["x", "y"]}',
        "dense": b'{"prompt": [1, 3], "attention": "dense"}',
        "cisa": b'{"prompt": [1, 3], "attention": "cisa", "cisa": {"budget": 8, "window": 2, "qshare": 4, "sink_pages": 1}}',
        "cisa_huge": b'{"prompt": [1, 3], "cisa": {"budget": 9223372036854775807, "window": -1}}',
        "unsupported": b'{"prompt": "a", "logprobs": 0, "echo": false, "best_of": 1, "response_format": {"type": "text"}, "presence_penalty": 0}',
        "bad_types": b'{"prompt": "a", "max_tokens": "4", "n": 2, "stop": [1]}',
        "big_numbers": b'{"prompt": [18446744073709551615], "max_tokens": 1e300, "seed": -1}',
    }
    chats = {
        "chat": b'{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}], "max_tokens": 4}',
        "parts": b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}',
        "roles": b'{"messages": [{"role": "developer", "content": "d"}, {"role": "assistant", "content": "x"}, {"role": "tool", "content": 1}]}',
        "parts_bad": b'{"messages": [{"role": "user", "content": [{"type": 1, "text": "a"}]}]}',
    }
    for name, body in completions.items():
        for sel in (0, 2, 4, 6):
            (out / f"{name}.{sel}").write_bytes(bytes([sel]) + body)
    for name, body in chats.items():
        for sel in (1, 7, 9):
            (out / f"{name}.{sel}").write_bytes(bytes([sel]) + body)


ALL = {"gguf": gguf_seeds, "gguf_tokenizer": gguf_tokenizer_seeds, "indexer": indexer_seeds, "tokenizer": tokenizer_seeds,
       "cli_args": cli_args_seeds, "server_request": server_request_seeds}

if __name__ == "__main__":
    for name in sys.argv[1:] or ALL:
        try:
            ALL[name]()
        except ImportError as e:
            print(f"{name}: skipped ({e}); pip install gguf numpy")
            continue
        print(f"{name}: seeds written under", CORPUS)
