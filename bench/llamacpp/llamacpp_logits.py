#!/usr/bin/env python3
"""llama.cpp's side of bench/llamacpp/cisa_logits: one prompt on a fixed schedule through
llama-cpp-python's low-level API (0.3.36, CPU, f16 KV cache, flash attention off, as the golden
fixtures), one record per logits row in cisa_logits' format (its header comment).

    python3 bench/llamacpp/llamacpp_logits.py -m MODEL --ids IDS.txt [--n-batch B] [--split S]
        [--generate N] [--outputs all|last] [--threads 2] [--swa-full 1|0] -o OUT.bin

Schedule: tokens [0, S) in llama_decode calls of B tokens (n_batch = n_ubatch = B), then tokens
[S, n) one per call, then N greedy tokens (argmax, ties to the smaller id) one per call.
--outputs all asks for every prefill row's logits (what cisa_logits records); --outputs last asks
only for each call's last row, as llama-cpp-python's Llama does without logits_all, which changes
llama.cpp's last layer: it drops the other rows before that layer's FFN (ggml_get_rows on
inp_out_ids), so the FFN's matrix products see another number of rows. Prefill records are then
written for the rows asked for only.
"""
from __future__ import annotations

import argparse
import ctypes
import struct
import sys

import numpy as np

REC = np.dtype([("position", "<i4"), ("phase", "<i4"), ("argmax", "<i4"), ("pad", "<i4"),
                ("checksum", "<u8"), ("top_ids", "<i4", (20,)), ("top_logits", "<f4", (20,)),
                ("lse", "<f8")])
assert REC.itemsize == 192


def summarise(row: np.ndarray, position: int, phase: int) -> np.ndarray:
    r = np.zeros((), REC)
    bits = row.view(np.uint32).astype(np.uint64)
    mult = (2 * np.arange(row.size, dtype=np.uint64) + 1)
    with np.errstate(over="ignore"):
        r["checksum"] = np.sum(bits * mult, dtype=np.uint64)
    r["position"], r["phase"] = position, phase
    r["argmax"] = int(np.argmax(row))  # first maximum: ties to the smaller id
    order = np.lexsort((np.arange(row.size), -row.astype(np.float64)))[:20]
    r["top_ids"] = order
    r["top_logits"] = row[order]
    mx = float(row.max())
    r["lse"] = mx + np.log(np.exp(row.astype(np.float64) - mx).sum())
    return r


def write(path: str, recs: list) -> None:
    arr = np.array(recs, dtype=REC) if recs else np.zeros(0, REC)
    with open(path, "wb") as f:
        f.write(b"CISALGT1" + struct.pack("<II", 1, len(arr)))
        f.write(arr.tobytes())


def read(path: str) -> np.ndarray:
    data = open(path, "rb").read()
    if data[:8] != b"CISALGT1":
        raise SystemExit(f"{path}: not a CISALGT1 file")
    _, n = struct.unpack("<II", data[8:16])
    return np.frombuffer(data[16:], dtype=REC, count=n)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--ids-out")
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--split", type=int, default=-1)
    ap.add_argument("--generate", type=int, default=0)
    ap.add_argument("--outputs", choices=["all", "last"], default="all")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--swa-full", type=int, choices=[0, 1], default=1)
    args = ap.parse_args()
    import llama_cpp as L  # type: ignore

    ids = [int(t) for t in open(args.ids).read().split()]
    n = len(ids)
    split = n if args.split < 0 or args.split > n else args.split
    L.llama_backend_init()
    quiet = L.llama_log_callback(lambda level, text, user: None)
    L.llama_log_set(quiet, ctypes.c_void_p(0))
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(args.model.encode(), mp)
    vocab = L.llama_model_get_vocab(model)
    V = L.llama_vocab_n_tokens(vocab)
    cp = L.llama_context_default_params()
    cp.n_ctx = (n + args.generate + 255) // 256 * 256
    cp.n_batch = args.n_batch
    cp.n_ubatch = args.n_batch
    cp.n_threads = args.threads
    cp.n_threads_batch = args.threads
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.swa_full = bool(args.swa_full)
    ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(max(args.n_batch, 1), 0, 1)
    recs = []

    def run(chunk, start, all_outputs, phase):
        batch.n_tokens = len(chunk)
        for i, tok in enumerate(chunk):
            batch.token[i] = tok
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if (all_outputs or i == len(chunk) - 1) else 0
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise SystemExit(f"llama_decode returned {rc}")
        rows = range(len(chunk)) if all_outputs else [len(chunk) - 1]
        for i in rows:
            ptr = L.llama_get_logits_ith(ctx, i)
            row = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(V,)).copy()
            recs.append(summarise(row, start + i, phase))

    for b0 in range(0, split, args.n_batch):
        run(ids[b0:min(b0 + args.n_batch, split)], b0, args.outputs == "all", 0)
    for q in range(split, n):
        run([ids[q]], q, False, 1)
    gen = []
    for g in range(args.generate):
        gen.append(int(recs[-1]["argmax"]))
        if g + 1 == args.generate:
            break
        run([gen[-1]], n + g, False, 2)
    write(args.out, recs)
    if args.ids_out:
        open(args.ids_out, "w").write("".join(f"{t}\n" for t in gen))
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    print(f"llamacpp_logits: {n} prompt tokens (split {split}, n_batch {args.n_batch}, outputs "
          f"{args.outputs}), {args.generate} generated, {len(recs)} records", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
