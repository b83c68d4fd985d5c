#!/usr/bin/env python3
"""Writes llama.cpp's logits for single-token decode steps (tests/golden/fixtures/decode_<model>.bin).

llama.cpp's CPU build computes a batch of one token differently from a batch of several: its
attention products (K·Q and V·P, f16) take the one-column dot product instead of the matrix
kernel, which adds the same products in another order (docs/models-runtime.md, "Numerics"). The
logits fixtures (make_llamacpp_fixtures.py) hold whole-prompt batches only; these hold decode
steps. Token ids come from those fixtures (no tokenizer or corpus needed here), so run
make_llamacpp_fixtures.py first. Needs llama-cpp-python 0.3.36 built as bench/llamacpp/README.md
says (the fixtures' instruction sets, no AMX), then

    python3 tests/golden/scripts/make_llamacpp_decode_fixtures.py --models-dir models

Per model, two schedules (llama_decode calls; n_ctx rounded up to 256, n_batch = n_ubatch = 512,
f16 KV cache, flash attention off, swa_full, 2 threads, as the logits fixtures):

  "p100:prefill=40"    the p100 prompt's ids: tokens [0, 40) in one call, then each further
                       token in a call of its own; logits stored at positions 39 .. n-1
  "p2000:prefill=560"  the first 620 ids of p2000: tokens [0, 560) in calls of 512 and 48, then
                       one token per call; logits stored at 559 .. 619 (Gemma 3's sliding-window
                       layers attend to the last 512 positions only)

Format: CISALOG1, exactly as logits_<model>.bin (make_llamacpp_fixtures.py's docstring); the
prompt name carries the schedule (the number after "prefill=" is the first call's token count),
the source string is JSON naming the logits fixture the ids come from.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import pathlib
import struct
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_llamacpp_fixtures import MODELS, TOP_K, fail, import_llama_cpp, sha256_of  # noqa: E402

SCHEDULES = [("p100", None, 40), ("p2000", 620, 560)]  # (prompt, tokens used, prefill tokens)


def read_fixture_ids(path: pathlib.Path) -> dict[str, list[int]]:
    b = path.read_bytes()
    p = 0

    def take(n):
        nonlocal p
        s = b[p:p + n]
        p += n
        return s

    def u32():
        return struct.unpack("<I", take(4))[0]

    def string():
        return take(u32()).decode()

    if take(8) != b"CISALOG1" or u32() != 1:
        fail(f"{path}: not a CISALOG1 fixture")
    string()
    _, top_k, n_prompts = u32(), u32(), u32()
    out = {}
    for _ in range(n_prompts):
        name = string()
        string()
        string()
        n = u32()
        out[name] = list(struct.unpack(f"<{n}i", take(4 * n)))
        npos = u32()
        take(4 * npos + npos * (8 * top_k + 4))
    return out


def decode_fixture(L, name: str, path: pathlib.Path, sha: str, ids_of: dict, threads: int, log):
    import numpy as np

    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        fail(f"llama.cpp could not load {path}")
    V = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    meta = {
        "generator": "tests/golden/scripts/make_llamacpp_decode_fixtures.py",
        "llama_cpp_python": L.__version__,
        "model": name, "model_file": path.name, "model_sha256": sha,
        "settings": {"n_batch": 512, "n_ubatch": 512, "n_threads": threads,
                     "flash_attn": "disabled", "type_k": "f16", "type_v": "f16",
                     "swa_full": True, "device": "CPU",
                     "schedule": "prefill=S: tokens [0, S) in calls of <= 512, then one token "
                                 "per call; logits stored from position S-1 on"},
        "system_info": L.llama_print_system_info().decode(),
    }
    out = bytearray()

    def put_str(s: str):
        e = s.encode()
        out.extend(struct.pack("<I", len(e)))
        out.extend(e)

    out.extend(b"CISALOG1")
    out.extend(struct.pack("<I", 1))
    put_str(json.dumps(meta, sort_keys=True))
    out.extend(struct.pack("<III", V, TOP_K, len(SCHEDULES)))
    for pname, used, split in SCHEDULES:
        ids = ids_of[pname][:used] if used else ids_of[pname]
        n = len(ids)
        cp = L.llama_context_default_params()
        cp.n_ctx = (n + 255) // 256 * 256
        cp.n_batch = cp.n_ubatch = 512
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.swa_full = True
        ctx = L.llama_init_from_model(model, cp)
        batch = L.llama_batch_init(512, 0, 1)
        rows = {}
        t0 = time.time()

        def run(first, count):
            batch.n_tokens = count
            for i in range(count):
                batch.token[i] = ids[first + i]
                batch.pos[i] = first + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1 if first + i >= split - 1 else 0
            if L.llama_decode(ctx, batch) != 0:
                fail(f"{name}/{pname}: llama_decode failed")
            for i in range(count):
                if first + i >= split - 1:
                    ptr = L.llama_get_logits_ith(ctx, i)
                    row = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                                shape=(V,)).astype(np.float64)
                    order = np.lexsort((np.arange(V), -row))[:TOP_K]
                    mx = row.max()
                    lse = mx + math.log(np.exp(row - mx).sum())
                    rows[first + i] = (order.astype("<i4"), row[order].astype("<f4"), lse)

        for b0 in range(0, split, 512):
            run(b0, min(512, split - b0))
        for q in range(split, n):
            run(q, 1)
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        log(f"{name}/{pname}: {n} tokens, prefill {split}, {n - split} decode steps, "
            f"{time.time() - t0:.1f}s")
        put_str(f"{pname}:prefill={split}")
        put_str(json.dumps({"ids_from": f"logits_{name}.bin", "prompt": pname, "tokens": n},
                           sort_keys=True))
        put_str("")
        out.extend(struct.pack("<I", n))
        out.extend(struct.pack(f"<{n}i", *ids))
        positions = sorted(rows)
        out.extend(struct.pack("<I", len(positions)))
        out.extend(struct.pack(f"<{len(positions)}I", *positions))
        for p in positions:
            top_ids, top_vals, lse = rows[p]
            out.extend(top_ids.tobytes())
            out.extend(top_vals.tobytes())
            out.extend(struct.pack("<f", float(lse)))
    L.llama_model_free(model)
    return bytes(out)


def main() -> int:
    ap = argparse.ArgumentParser(description="llama.cpp decode-step fixtures")
    ap.add_argument("--models-dir", default=str(ROOT / "models"))
    ap.add_argument("--out", default=str(ROOT / "tests" / "golden" / "fixtures"))
    ap.add_argument("--model", choices=sorted(MODELS), action="append", default=None)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    L = import_llama_cpp()
    L.llama_backend_init()
    quiet = L.llama_log_callback(lambda level, text, user: None)
    L.llama_log_set(quiet, ctypes.c_void_p(0))
    out = pathlib.Path(args.out)

    def log(msg: str):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    for name in args.model or sorted(MODELS):
        path = pathlib.Path(args.models_dir) / MODELS[name]
        ids_of = read_fixture_ids(out / f"logits_{name}.bin")
        data = decode_fixture(L, name, path, sha256_of(path), ids_of, args.threads, log)
        (out / f"decode_{name}.bin").write_bytes(data)
        log(f"{name}: decode fixture {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
