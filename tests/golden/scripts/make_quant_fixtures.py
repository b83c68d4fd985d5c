#!/usr/bin/env python3
"""Write the dequantisation fixtures of tests/golden/quant_golden_test.cpp with the `gguf` package.

The gguf PyPI package (written by the llama.cpp authors, independent of cisa) is the reference:

* real: for a few tensors of every type in the two model files, a few rows dequantised by
  gguf.quants.dequantize (rows 0, 1 and the last one). The C++ test reads the same rows of the
  same files with our reader and compares exactly.
* synthetic: seeded random floats quantised *and* dequantised by gguf for the types the models
  do not contain (Q4_0, Q5_1, F16, BF16) and those they do (Q4_1, Q5_0, Q8_0), storing the raw
  blocks so the test needs no model file.
* tables: each model's full tensor table (name, type, shape, absolute data offset, byte size) as
  gguf.GGUFReader sees it, for comparison with our reader.

Files written under tests/golden/fixtures/:
  quant_index.txt        one line per fixture (see the header comment it carries)
  quant_expected.f32     the expected floats, little-endian, concatenated
  quant_synthetic.bin    the raw blocks of the synthetic fixtures, concatenated
  quant_tensors_<model>.txt

  pip install gguf numpy
  python3 tests/golden/scripts/make_quant_fixtures.py [--models-dir models]
"""
from __future__ import annotations

import argparse
import importlib.metadata
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize, quantize
except ImportError:
    sys.exit("make_quant_fixtures: needs the gguf package (pip install gguf)")

REPO = Path(__file__).resolve().parents[3]
OUT = REPO / "tests" / "golden" / "fixtures"

MODELS = {
    "gemma3-270m": ("gemma-3-270m-q4_k_m.gguf", [
        "token_embd.weight",          # Q8_0
        "blk.0.attn_q.weight",        # Q5_0
        "blk.0.attn_v.weight",        # Q8_0
        "blk.0.attn_output.weight",   # Q4_K
        "blk.0.ffn_down.weight",      # Q6_K
        "blk.2.ffn_down.weight",      # Q4_K
        "blk.17.ffn_gate.weight",     # Q5_0
        "blk.0.attn_k_norm.weight",   # F32
        "output_norm.weight",         # F32
    ]),
    "smollm2-135m": ("SmolLM2-135M-Instruct.Q4_1.gguf", [
        "token_embd.weight",          # Q8_0
        "blk.0.attn_q.weight",        # Q4_1
        "blk.0.ffn_down.weight",      # Q4_1
        "blk.29.ffn_up.weight",       # Q4_1
        "blk.0.attn_norm.weight",     # F32
    ]),
}


def rows_of(tensor, rows):
    """Dequantises the given rows of a 1-D or 2-D GGUF tensor with the gguf package."""
    qtype = tensor.tensor_type
    data = tensor.data
    if data.ndim == 1:
        data = data.reshape(1, -1)
    picked = data[rows]
    if qtype in (T.F32, T.F16):
        return picked.astype(np.float32)
    return dequantize(picked, qtype).astype(np.float32)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir", type=Path, default=REPO / "models")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)

    index = ["# kind model-or-name tensor type row n raw_offset raw_bytes f32_offset",
             "# real: rows of a tensor in a model file; synthetic: raw blocks in quant_synthetic.bin",
             f"# written by tests/golden/scripts/make_quant_fixtures.py with gguf {importlib.metadata.version('gguf')}"]
    expected: list[np.ndarray] = []
    raw: list[bytes] = []
    f32_off = 0
    raw_off = 0

    for model, (filename, tensors) in MODELS.items():
        path = args.models_dir / filename
        if not path.exists():
            sys.exit(f"make_quant_fixtures: {path} is missing; run `cisa pull {model}` first")
        reader = gguf.GGUFReader(str(path))
        table = [f"# {model}: name type ne0,ne1,... absolute_offset n_bytes (gguf.GGUFReader)"]
        for t in reader.tensors:
            shape = ",".join(str(int(d)) for d in t.shape)
            table.append(f"{t.name} {t.tensor_type.name} {shape} {int(t.data_offset)} {int(t.n_bytes)}")
        (OUT / f"quant_tensors_{model}.txt").write_text("\n".join(table) + "\n")

        by_name = {t.name: t for t in reader.tensors}
        for name in tensors:
            t = by_name[name]
            n_rows = 1 if len(t.shape) == 1 else int(np.prod([int(d) for d in t.shape[1:]]))
            n_cols = int(t.shape[0])
            rows = sorted({0, min(1, n_rows - 1), n_rows - 1})
            values = rows_of(t, rows)
            for k, r in enumerate(rows):
                index.append(f"real {model} {name} {t.tensor_type.name} {r} {n_cols} 0 0 {f32_off}")
                expected.append(values[k].reshape(-1))
                f32_off += n_cols

    rng = np.random.default_rng(20240531)
    for qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.F16, T.BF16):
        x = (rng.standard_normal((4, 256)) * rng.uniform(0.01, 3.0, size=(4, 1))).astype(np.float32)
        x[1, :40] = 0.0  # an all-zero block and a partly zero one
        q = quantize(x, qtype)
        back = dequantize(q, qtype).astype(np.float32)
        blob = np.ascontiguousarray(q).view(np.uint8).tobytes()
        for r in range(4):
            row_bytes = len(blob) // 4
            index.append(f"synthetic seeded_{qtype.name.lower()} - {qtype.name} {r} 256 "
                         f"{raw_off + r * row_bytes} {row_bytes} {f32_off}")
            expected.append(back[r])
            f32_off += 256
        raw.append(blob)
        raw_off += len(blob)

    (OUT / "quant_index.txt").write_text("\n".join(index) + "\n")
    np.concatenate(expected).astype("<f4").tofile(OUT / "quant_expected.f32")
    (OUT / "quant_synthetic.bin").write_bytes(b"".join(raw))
    total = sum(p.stat().st_size for p in OUT.glob("quant_*"))
    print(f"wrote {len(index) - 3} fixtures, {total} bytes under {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
