#!/usr/bin/env python3
"""Writes small seed files for gguf_fuzz into tests/fuzz/corpus/gguf/ with the gguf package's writer."""
from pathlib import Path

import numpy as np
import gguf

OUT = Path(__file__).resolve().parent / "corpus" / "gguf"
OUT.mkdir(parents=True, exist_ok=True)


def write(name, fill):
    w = gguf.GGUFWriter(str(OUT / name), "llama")
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
    for qt in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q5_1):
        q = gguf.quants.quantize(x, qt)
        w.add_tensor(f"w.{qt.name}", q, raw_shape=q.shape, raw_dtype=qt)


write("small.gguf", small)
write("quantised.gguf", quantised)
print("seeds in", OUT)
