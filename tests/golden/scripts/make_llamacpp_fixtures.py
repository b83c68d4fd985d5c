#!/usr/bin/env python3
"""Writes conformance fixtures from llama.cpp (via llama-cpp-python) for the two real models.

Nobody here wrote llama.cpp, so its token IDs and logits are an independent reference for our
tokenizers and forward passes. This script installs nothing; set up once with

    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==0.3.36   # CPU build from source,
                                                 # compiles llama.cpp: ~8 minutes on 2 cores
    pip install rdata==1.1.0                     # reads the R data files of janeaustenr
    apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_*.deb /tmp/janeausten

(only the .deb's data files are needed: `apt-get download` avoids pulling in R itself) and run

    python3 tests/golden/scripts/make_llamacpp_fixtures.py --models-dir models \\
        --janeausten-dir /tmp/janeausten [--only tokens|logits] [--model gemma3-270m|smollm2-135m]

Run time on the shared 2-core machine (load average 4-9 from other builds): token fixtures 6 s;
logits 209 s for Gemma 3 and 470 s for SmolLM2 (its 8,000-token prompt alone 414 s), most of it
the 8K prefills. Progress is printed with timestamps; run it in the background for the logits.

Outputs, under tests/golden/fixtures/:

tokens_<model>.json
    llama.cpp's tokenizer (model loaded with vocab_only) on varied texts: for every case the
    text (hex of its bytes, plus a readable copy when it is valid UTF-8), the add_special and
    parse_special flags, the token IDs from llama_tokenize, and llama_detokenize's output
    (remove_special=false) without and with unparse_special, as hex. It also records the special
    token ids, the end-of-generation set, and FNV-1a-64 digests of llama_token_to_piece over
    blocks of 256 consecutive token ids (piece bytes, each preceded by its u32 LE length), with
    special=false and special=true, so every vocabulary entry's rendering is checked.

logits_<model>.bin  (all little-endian)
    Top-20 logits computed by llama.cpp on CPU for prompts of about 100, 2,000 and 8,000
    tokens cut from Jane Austen's novels (Debian r-cran-janeaustenr 1.0.0-1, public domain).
      char[8]  magic "CISALOG1"
      u32      format version (1)
      str      JSON metadata: llama-cpp-python version, model file and sha256, settings
               (n_ctx, n_batch, n_ubatch, threads, flash attention, KV type), system info
      u32      n_vocab
      u32      top_k (20)
      u32      number of prompts, then for each prompt:
        str    name ("p100", "p2000", "p8000")
        str    source: JSON {package, file, object, line_join, char_offset, char_length}
        str    the prompt text (UTF-8)
        u32    n_tokens, then i32[n_tokens]: llama.cpp's token IDs (with BOS where the model
               adds one), so forward-pass tests need not depend on our tokenizer
        u32    n_positions, then u32[n_positions]: positions (0-based) whose logits are stored
        per position: i32[top_k] ids (descending logit; ties by smaller id),
                      f32[top_k] logits, f32 log-sum-exp of all n_vocab logits
    where str = u32 byte length + UTF-8 bytes. The logits at position p are the model's
    prediction of token p+1 after reading tokens 0..p. Logits were requested (batch.logits=1)
    only at the stored positions; the hidden states do not depend on which outputs are read.
"""
from __future__ import annotations

import argparse
import ctypes
import gzip
import hashlib
import json
import math
import pathlib
import struct
import sys
import time
import warnings
import zlib

ROOT = pathlib.Path(__file__).resolve().parents[3]
PINNED_LLAMA_CPP_PYTHON = "0.3.36"

MODELS = {
    "gemma3-270m": "gemma-3-270m-q4_k_m.gguf",
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
}

# (name, target token count, novel object in janeaustenr, first line to use)
PROMPTS = [
    ("p100", 100, "prideprejudice", "It is a truth universally acknowledged"),
    ("p2000", 2000, "emma", "Emma Woodhouse, handsome, clever, and rich"),
    ("p8000", 8000, "persuasion", "Sir Walter Elliot, of Kellynch Hall"),
]
DENSE_POSITIONS = 256  # stored positions of the long prompts, evenly spaced, last one included
TOP_K = 20

AUSTEN_SAMPLE = (
    "It is a truth universally acknowledged, that a single man in possession\n"
    "of a good fortune, must be in want of a wife.\n\n"
    "However little known the feelings or views of such a man may be on his\n"
    "first entering a neighbourhood, this truth is so well fixed in the minds\n"
    "of the surrounding families, that he is considered the rightful property\n"
    "of some one or other of their daughters.\n\n"
    "\"My dear Mr. Bennet,\" said his lady to him one day, \"have you heard that\n"
    "Netherfield Park is let at last?\""
)

PY_CODE = (
    "def fib(n: int) -> int:\n"
    "    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    "    a, b = 0, 1\n"
    "    for _ in range(n):\n"
    "        a, b = b, a + b\n"
    "    return a\n\n\n"
    "if __name__ == '__main__':\n"
    "\tprint([fib(i) for i in range(10)])  # tab-indented\n"
)
CPP_CODE = (
    "#include <vector>\n"
    "template <class T> T sum(const std::vector<T>& v) {\n"
    "  T s{};\n"
    "  for (auto x : v) s += x;  // 0x7fffffff\n"
    "  return s;\n"
    "}\n"
)

# (name, text as str or bytes); every case runs with the flag combinations in FLAGS.
TEXTS: list[tuple[str, str | bytes]] = [
    ("empty", ""),
    ("hello", "Hello world"),
    ("leading_space", " Hello world"),
    ("leading_spaces", "   three leading spaces"),
    ("leading_tab", "\tTab at the start"),
    ("leading_newline", "\nNewline first"),
    ("trailing_spaces", "trailing spaces   "),
    ("single_space", " "),
    ("only_spaces", "      "),
    ("newlines", "Hello\nworld\n\nnew paragraph\n\n\n"),
    ("crlf", "line one\r\nline two\r\n"),
    ("whitespace_runs", "a  b   c    d\t\te\n \n  \t x     \n\n\n\n\n\n\n\n\n\n\n\ny"),
    ("tabs", "\t\t\tindented\tcolumns\t\t\t\t|"),
    ("digits", "1234567890 3.14159 1,000,000 2024-05-17 0x1F 1e-9 007"),
    ("numbers_unicode", "٣٤٥ ½ ² Ⅻ ① ༣ 𝟘𝟙"),
    ("accents", "Café naïve résumé façade Ångström Zürich São Paulo Dvořák"),
    ("combining", "e\u0301 n\u0303 a\u030a"),
    ("cjk", "日本語のテキストです。中文文本，标点符号。한국어 텍스트"),
    ("emoji", "👍🏽 🚀🔥 family: 👨‍👩‍👧‍👦 flags: 🇫🇷🇯🇵 ❤️"),
    ("scripts", "Привет мир, γειά σου κόσμε, שלום עולם, مرحبا بالعالم, नमस्ते दुनिया"),
    ("rare_chars", "𓀀𓁐 𐌰𐌱𐌲 ꙮ 🀄 \U0001FAE8 \U000E0041"),
    ("unicode_spaces", "nbsp\u00a0ideographic\u3000linesep\u2028nel\u0085thin\u2009end"),
    ("contractions", "I'm you're they've we'll she'd it's don't CAN'T 'quoted' rock'n'roll"),
    ("punctuation", "Wait... what?! (yes) [no] {maybe} <tag> \"quote\" — dash – ‘single’ “double” …"),
    ("repeats", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa !!!!!!!!!!!! ------------ ............"),
    ("python", PY_CODE),
    ("cpp", CPP_CODE),
    ("json", '{"key": [1, 2.5, -3e10, true, null], "nested": {"a": "b\\n"}}'),
    ("html", '<b>HTML</b> &amp; <div class="x" id=\'y\'>text</div>'),
    ("markdown", "# Title\n\n- item 1\n- item 2\n\n```python\nprint('hi')\n```\n"),
    ("url", "https://example.org/path?q=1&r=two#frag user@example.com"),
    ("control_chars", "a\x01b\x07c\x1bd\x7fe"),
    ("nul_byte", "a\x00b"),
    ("invalid_utf8", b"\xff\xfe invalid \xc3( \xe2\x82 mid \x80\x80 end"),
    ("truncated_utf8", b"abc\xe2\x82"),
    ("lone_continuation", b"\x80abc"),
    ("gemma_chat", "<start_of_turn>user\nHello there<end_of_turn>\n<start_of_turn>model\n"),
    ("gemma_specials", "<bos>text<eos> <pad><unk><mask> <unused0>[multimodal]<start_of_image>"),
    ("chatml", "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"),
    ("smol_specials", "<|endoftext|>text<|endoftext|> <repo_name>x<file_sep>y<gh_stars>"),
    ("special_glued", "x<end_of_turn>y<|im_end|>z<start_of_turn><|im_start|>"),
    ("space_marker", "▁already▁escaped ▁ ▁▁"),
    ("austen", AUSTEN_SAMPLE),
]
# (add_special, parse_special) combinations run for every text.
FLAGS = [(True, False), (False, False), (True, True)]


def fail(msg: str) -> None:
    sys.exit("make_llamacpp_fixtures.py: " + msg)


def import_llama_cpp():
    try:
        import llama_cpp  # type: ignore
    except ImportError:
        fail('needs llama-cpp-python: CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==%s'
             % PINNED_LLAMA_CPP_PYTHON)
    if llama_cpp.__version__ != PINNED_LLAMA_CPP_PYTHON:
        print(f"warning: llama-cpp-python {llama_cpp.__version__} != pinned {PINNED_LLAMA_CPP_PYTHON}",
              file=sys.stderr)
    return llama_cpp


def sha256_of(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class LlamaModel:
    """Thin wrapper over llama.cpp's C API (llama-cpp-python's low-level bindings)."""

    def __init__(self, L, path: pathlib.Path, vocab_only: bool):
        self.L = L
        mp = L.llama_model_default_params()
        mp.vocab_only = vocab_only
        mp.n_gpu_layers = 0
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            fail(f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
        L = self.L
        cap = len(text) + 8
        while True:
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, text, len(text), buf, cap, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            cap = -n

    def detokenize(self, ids: list[int], unparse_special: bool) -> bytes:
        L = self.L
        arr = (L.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 16 * len(ids)
        while True:
            buf = (ctypes.c_char * cap)()
            n = L.llama_detokenize(self.vocab, arr, len(ids), buf, cap, False, unparse_special)
            if n >= 0:
                return bytes(buf[:n])
            cap = -n

    def piece(self, token: int, special: bool) -> bytes:
        cap = 64
        while True:
            buf = (ctypes.c_char * cap)()
            n = self.L.llama_token_to_piece(self.vocab, token, buf, cap, 0, special)
            if n >= 0:
                return bytes(buf[:n])
            cap = -n

    def free(self):
        self.L.llama_model_free(self.model)


def fnv1a64(data: bytes, h: int = 0xCBF29CE484222325) -> int:
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def piece_digests(m: LlamaModel, special: bool, block: int) -> list[str]:
    out = []
    for start in range(0, m.n_vocab, block):
        h = 0xCBF29CE484222325
        for tok in range(start, min(start + block, m.n_vocab)):
            p = m.piece(tok, special)
            h = fnv1a64(struct.pack("<I", len(p)) + p, h)
        out.append(f"{h:016x}")
    return out


def as_bytes(t: str | bytes) -> bytes:
    return t if isinstance(t, bytes) else t.encode("utf-8")


def token_fixture(L, name: str, path: pathlib.Path, sha: str) -> dict:
    m = LlamaModel(L, path, vocab_only=True)
    v = m.vocab
    null = -1
    doc = {
        "generator": "tests/golden/scripts/make_llamacpp_fixtures.py",
        "llama_cpp_python": L.__version__,
        "model": name,
        "model_file": path.name,
        "model_sha256": sha,
        "vocab_size": m.n_vocab,
        "bos": L.llama_vocab_bos(v),
        "eos": L.llama_vocab_eos(v),
        "eot": L.llama_vocab_eot(v),
        "add_bos": bool(L.llama_vocab_get_add_bos(v)),
        "add_eos": bool(L.llama_vocab_get_add_eos(v)),
        "eog_ids": [t for t in range(m.n_vocab) if L.llama_vocab_is_eog(v, t)],
        "control_ids_count": sum(1 for t in range(m.n_vocab) if L.llama_vocab_is_control(v, t)),
        "cases": [],
    }
    for k in ("bos", "eos", "eot"):
        if doc[k] == null:
            doc[k] = -1
    for case_name, text in TEXTS:
        raw = as_bytes(text)
        for add_special, parse_special in FLAGS:
            ids = m.tokenize(raw, add_special, parse_special)
            case = {
                "name": case_name,
                "add_special": add_special,
                "parse_special": parse_special,
                "text_hex": raw.hex(),
                "ids": ids,
                "detok_hex": m.detokenize(ids, False).hex(),
                "detok_special_hex": m.detokenize(ids, True).hex(),
            }
            try:
                case["text"] = raw.decode("utf-8")
            except UnicodeDecodeError:
                pass
            doc["cases"].append(case)
    block = 256
    doc["piece_digest_block"] = block
    doc["piece_digests"] = piece_digests(m, False, block)
    doc["piece_digests_special"] = piece_digests(m, True, block)
    m.free()
    return doc


# ---- prompts from Jane Austen -------------------------------------------------------------------

def load_austen(janeausten_dir: pathlib.Path) -> dict[str, list[str]]:
    """Reads the novels (character vectors, one line each) from the package's lazy-load DB."""
    try:
        import rdata  # type: ignore
    except ImportError:
        fail("needs `pip install rdata==1.1.0`")
    hits = list(janeausten_dir.rglob("janeaustenr/data/Rdata.rdx"))
    if not hits:
        fail(f"no janeaustenr/data/Rdata.rdx under {janeausten_dir} (dpkg-deb -x the package there)")
    ddir = hits[0].parent
    warnings.simplefilter("ignore")
    index = rdata.conversion.convert(rdata.parser.parse_data(gzip.decompress((ddir / "Rdata.rdx").read_bytes())))
    db = (ddir / "Rdata.rdb").read_bytes()
    books = {}
    for obj, (off, length) in index["variables"].items():
        blob = db[int(off):int(off) + int(length)]
        # Each object: a 4-byte big-endian uncompressed length, then a zlib stream.
        data = zlib.decompress(blob[4:])
        books[str(obj)] = [str(s) for s in rdata.conversion.convert(rdata.parser.parse_data(data))]
    return books


def cut_prompt(m: LlamaModel, book: list[str], first_line: str, target: int):
    """The longest prefix (whole words) of the book from first_line that tokenizes to <= target."""
    text = "\n".join(book)
    start = text.find(first_line)
    if start < 0:
        fail(f"line {first_line!r} not found")
    hi = min(len(text) - start, target * 8)
    lo = 0
    # Binary search on the character length; then back off to a word boundary.
    while lo < hi:
        mid = (lo + hi + 1) // 2
        n = len(m.tokenize(text[start:start + mid].encode(), True, False))
        if n <= target:
            lo = mid
        else:
            hi = mid - 1
    length = lo
    while length > 0 and not text[start + length - 1].isspace() and text[start + length:start + length + 1].isalnum():
        length -= 1
    return start, length, text[start:start + length]


def logits_fixture(L, name: str, path: pathlib.Path, sha: str, books, threads: int, log) -> bytes:
    import numpy as np

    m = LlamaModel(L, path, vocab_only=False)
    n_ctx_train = L.llama_model_n_ctx_train(m.model)
    prompts = []
    for pname, target, obj, first_line in PROMPTS:
        off, length, text = cut_prompt(m, books[obj], first_line, target)
        ids = m.tokenize(text.encode(), True, False)
        if len(ids) > n_ctx_train:
            fail(f"{pname}: {len(ids)} tokens exceed the model's context {n_ctx_train}")
        prompts.append((pname, obj, off, length, text, ids))

    settings = {
        "n_batch": 512, "n_ubatch": 512, "n_threads": threads, "flash_attn": "disabled",
        "type_k": "f16", "type_v": "f16", "device": "CPU", "outputs": "stored positions only",
    }
    meta = {
        "generator": "tests/golden/scripts/make_llamacpp_fixtures.py",
        "llama_cpp_python": L.__version__,
        "model": name, "model_file": path.name, "model_sha256": sha,
        "settings": settings,
        "system_info": L.llama_print_system_info().decode(),
    }
    out = bytearray()

    def put_str(s: str):
        b = s.encode("utf-8")
        out.extend(struct.pack("<I", len(b)))
        out.extend(b)

    out.extend(b"CISALOG1")
    out.extend(struct.pack("<I", 1))
    put_str(json.dumps(meta, sort_keys=True))
    out.extend(struct.pack("<III", m.n_vocab, TOP_K, len(prompts)))
    timings = {}
    for pname, obj, off, length, text, ids in prompts:
        n = len(ids)
        if n <= 128:
            positions = list(range(n))
        else:
            positions = sorted({round(i * (n - 1) / (DENSE_POSITIONS - 1)) for i in range(DENSE_POSITIONS)})
        want = set(positions)
        cp = L.llama_context_default_params()
        cp.n_ctx = ((n + 255) // 256) * 256
        cp.n_batch = 512
        cp.n_ubatch = 512
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.no_perf = False
        ctx = L.llama_init_from_model(m.model, cp)
        if not ctx:
            fail(f"{name}/{pname}: llama_init_from_model failed")
        batch = L.llama_batch_init(512, 0, 1)
        rows = {}
        t0 = time.time()
        for b0 in range(0, n, 512):
            chunk = ids[b0:b0 + 512]
            batch.n_tokens = len(chunk)
            for i, tok in enumerate(chunk):
                batch.token[i] = tok
                batch.pos[i] = b0 + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1 if (b0 + i) in want else 0
            rc = L.llama_decode(ctx, batch)
            if rc != 0:
                fail(f"{name}/{pname}: llama_decode returned {rc}")
            for i in range(len(chunk)):
                if (b0 + i) in want:
                    ptr = L.llama_get_logits_ith(ctx, i)
                    row = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(m.n_vocab,))
                    row = row.astype(np.float64)
                    order = np.lexsort((np.arange(m.n_vocab), -row))[:TOP_K]
                    mx = row.max()
                    lse = mx + math.log(np.exp(row - mx).sum())
                    rows[b0 + i] = (order.astype(np.int32), row[order].astype(np.float32), np.float32(lse))
            log(f"{name}/{pname}: {min(b0 + 512, n)}/{n} tokens, {time.time() - t0:.1f}s")
        elapsed = time.time() - t0
        timings[pname] = elapsed
        log(f"{name}/{pname}: {n} tokens in {elapsed:.1f}s ({n / elapsed:.1f} tok/s)")
        L.llama_batch_free(batch)
        L.llama_free(ctx)

        put_str(pname)
        put_str(json.dumps({
            "package": "r-cran-janeaustenr 1.0.0-1", "file": "janeaustenr/data/Rdata.rdb",
            "object": obj, "line_join": "\\n", "char_offset": off, "char_length": length,
        }, sort_keys=True))
        put_str(text)
        out.extend(struct.pack("<I", n))
        out.extend(struct.pack(f"<{n}i", *ids))
        out.extend(struct.pack("<I", len(positions)))
        out.extend(struct.pack(f"<{len(positions)}I", *positions))
        for p in positions:
            top_ids, top_vals, lse = rows[p]
            out.extend(top_ids.astype("<i4").tobytes())
            out.extend(top_vals.astype("<f4").tobytes())
            out.extend(struct.pack("<f", float(lse)))
    m.free()
    log(f"{name}: prefill timings {json.dumps({k: round(v, 1) for k, v in timings.items()})}")
    return bytes(out)


def main() -> int:
    ap = argparse.ArgumentParser(description="llama.cpp conformance fixtures")
    ap.add_argument("--models-dir", default=str(ROOT / "models"))
    ap.add_argument("--janeausten-dir", default="/tmp/janeausten")
    ap.add_argument("--out", default=str(ROOT / "tests" / "golden" / "fixtures"))
    ap.add_argument("--only", choices=["tokens", "logits"], default=None)
    ap.add_argument("--model", choices=sorted(MODELS), action="append", default=None)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    L = import_llama_cpp()
    L.llama_backend_init()
    # Silence llama.cpp's loader chatter; keep the callback alive for the whole run.
    quiet = L.llama_log_callback(lambda level, text, user: None)
    L.llama_log_set(quiet, ctypes.c_void_p(0))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(msg: str):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    books = None
    for name in args.model or sorted(MODELS):
        path = pathlib.Path(args.models_dir) / MODELS[name]
        if not path.exists():
            fail(f"{path} is missing (scripts/pull_model.py fetches it)")
        sha = sha256_of(path)
        if args.only in (None, "tokens"):
            t0 = time.time()
            doc = token_fixture(L, name, path, sha)
            (out / f"tokens_{name}.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
            log(f"{name}: {len(doc['cases'])} token cases in {time.time() - t0:.1f}s")
        if args.only in (None, "logits"):
            if books is None:
                books = load_austen(pathlib.Path(args.janeausten_dir))
            t0 = time.time()
            data = logits_fixture(L, name, path, sha, books, args.threads, log)
            (out / f"logits_{name}.bin").write_bytes(data)
            log(f"{name}: logits fixture {len(data)} bytes in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
