#!/usr/bin/env python3
"""Writes fp64 reference logits for the two real models, computed with numpy from the weights as
the `gguf` PyPI package dequantises them (no activation quantisation, no reduced-precision
cache): the exact function of the stored weights that cisa's forward pass implements.

    pip install gguf numpy        # written with gguf 0.19.0
    python3 tests/golden/scripts/make_model_reference.py [--models-dir models] [--tokens 64]

For each model it takes the first --tokens token IDs of llama.cpp's "p100" prompt from
tests/golden/fixtures/logits_<model>.bin (so the tokens do not depend on our tokenizer) and writes
tests/golden/fixtures/reference_<model>.bin in the same CISALOG1 format (top-20 logits and the
log-sum-exp at every position). tests/golden/model_golden_test.cpp runs cisa with weights widened
to f32 (ModelOptions::weights_f32) against it.

The architectures are written out from their published descriptions (Gemma 3: Google's
gemma_pytorch and the Gemma 3 report; Llama: Touvron et al.), with the GGUF conventions checked
against llama.cpp's loader: Gemma's norm weights already hold the +1, sliding-window layers are
those with l mod 6 < 5 and use RoPE base 10,000, RoPE pairs (i, i + d/2) for Gemma and (2i, 2i+1)
for Llama, Gemma's embeddings are scaled by sqrt(n_embd) and its attention by 1/sqrt(head_dim).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import struct
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODELS = {"gemma3-270m": "gemma-3-270m-q4_k_m.gguf", "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf"}
TOP_K = 20


def read_p100_ids(path: pathlib.Path) -> list[int]:
    b = path.read_bytes()
    p = 8

    def u32():
        nonlocal p
        v = struct.unpack_from("<I", b, p)[0]
        p += 4
        return v

    def s():
        nonlocal p
        n = u32()
        p += n

    if b[:8] != b"CISALOG1":
        sys.exit(f"{path}: not a CISALOG1 file")
    u32(); s(); u32(); u32(); u32()
    s(); s(); s()
    n = u32()
    return list(struct.unpack_from(f"<{n}i", b, p))


def forward(path: pathlib.Path, ids: list[int]) -> np.ndarray:
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in r.tensors}
    arch = r.fields["general.architecture"].contents()

    def W(name):
        t = tensors[name]
        return dequantize(t.data, t.tensor_type).astype(np.float64)

    def key(k, default=None):
        f = r.fields.get(f"{arch}.{k}")
        return f.contents() if f is not None else default

    n_layer, E = key("block_count"), key("embedding_length")
    hq, hkv = key("attention.head_count"), key("attention.head_count_kv")
    d = key("attention.key_length", E // hq)
    eps = key("attention.layer_norm_rms_epsilon")
    base = key("rope.freq_base", 10000.0)
    gemma = arch == "gemma3"
    swa = key("attention.sliding_window", 0) if gemma else 0
    g = hq // hkv
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(x, b):
        inv = b ** (-2.0 * np.arange(d // 2) / d)
        ang = pos[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        y = x.copy()
        if gemma:  # NEOX: (i, i + d/2)
            a, bb = x[..., : d // 2], x[..., d // 2:]
            y[..., : d // 2], y[..., d // 2:] = a * c - bb * s, a * s + bb * c
        else:  # NORM: (2i, 2i + 1)
            a, bb = x[..., 0::2], x[..., 1::2]
            y[..., 0::2], y[..., 1::2] = a * c - bb * s, a * s + bb * c
        return y

    emb = W("token_embd.weight")
    x = emb[ids].copy()
    if gemma:
        x *= float(np.float32(math.sqrt(E)))
    scale = 1.0 / math.sqrt(d)
    for l in range(n_layer):
        P = f"blk.{l}."
        local = gemma and swa > 0 and (l % 6) < 5
        h = rms(x, W(P + "attn_norm.weight"))
        q = (h @ W(P + "attn_q.weight").T).reshape(n, hq, d)
        k = (h @ W(P + "attn_k.weight").T).reshape(n, hkv, d)
        v = (h @ W(P + "attn_v.weight").T).reshape(n, hkv, d)
        if gemma:
            q, k = rms(q, W(P + "attn_q_norm.weight")), rms(k, W(P + "attn_k_norm.weight"))
        b = 10000.0 if local else base
        q, k = rope(q, b), rope(k, b)
        t, s_ = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        allowed = (s_ <= t) & ((t - s_ < swa) if local else True)
        att = np.empty_like(q)
        for hh in range(hq):
            sc = (q[:, hh, :] @ k[:, hh // g, :].T) * scale
            sc = np.where(allowed, sc, -np.inf)
            pr = np.exp(sc - sc.max(1, keepdims=True))
            pr /= pr.sum(1, keepdims=True)
            att[:, hh, :] = pr @ v[:, hh // g, :]
        o = att.reshape(n, hq * d) @ W(P + "attn_output.weight").T
        if gemma:
            o = rms(o, W(P + "post_attention_norm.weight"))
        x = x + o
        h = rms(x, W(P + "ffn_norm.weight"))
        gt, up = h @ W(P + "ffn_gate.weight").T, h @ W(P + "ffn_up.weight").T
        if gemma:
            act = 0.5 * gt * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (gt + 0.044715 * gt ** 3)))
        else:
            act = gt / (1.0 + np.exp(-gt))
        o = (act * up) @ W(P + "ffn_down.weight").T
        if gemma:
            o = rms(o, W(P + "post_ffw_norm.weight"))
        x = x + o
        print(f"  layer {l + 1}/{n_layer}", file=sys.stderr, end="\r", flush=True)
    x = rms(x, W("output_norm.weight"))
    out = W("output.weight") if "output.weight" in tensors else emb
    return x @ out.T


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models-dir", default=str(ROOT / "models"))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--model", choices=sorted(MODELS), action="append")
    args = ap.parse_args()
    fx = ROOT / "tests" / "golden" / "fixtures"
    for name in args.model or sorted(MODELS):
        ids = read_p100_ids(fx / f"logits_{name}.bin")[: args.tokens]
        logits = forward(pathlib.Path(args.models_dir) / MODELS[name], ids)
        n_vocab = logits.shape[1]
        out = bytearray(b"CISALOG1")
        out += struct.pack("<I", 1)

        def put(s: str):
            bb = s.encode()
            out.extend(struct.pack("<I", len(bb)) + bb)

        from importlib.metadata import version
        put(json.dumps({"generator": "tests/golden/scripts/make_model_reference.py", "gguf": version("gguf"),
                        "numpy": np.__version__, "model": name, "precision": "fp64, weights dequantised by gguf"},
                       sort_keys=True))
        out += struct.pack("<III", n_vocab, TOP_K, 1)
        put("p100_head")
        put(json.dumps({"tokens": f"the first {len(ids)} of logits_{name}.bin p100"}))
        put("")
        out += struct.pack("<I", len(ids)) + struct.pack(f"<{len(ids)}i", *ids)
        out += struct.pack("<I", len(ids)) + struct.pack(f"<{len(ids)}I", *range(len(ids)))
        for row in logits:
            order = np.lexsort((np.arange(n_vocab), -row))[:TOP_K]
            mx = row.max()
            lse = mx + math.log(np.exp(row - mx).sum())
            out += order.astype("<i4").tobytes() + row[order].astype("<f4").tobytes() + struct.pack("<f", lse)
        (fx / f"reference_{name}.bin").write_bytes(bytes(out))
        print(f"{name}: {len(ids)} positions -> reference_{name}.bin", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
