"""Calibrated CISA indexers (SPEC section 6) for the Python package: the ``.cisaidx`` files that
``cisa calibrate`` writes, read here without the C++ model library, and explicit per-(layer, KV
group) choices of index query head.

The file (docs/calibration.md, "The indexer file"; the C++ reader is ``src/calib/indexer_file.cpp``)
is little-endian: a 32-byte header (magic ``CISAIDX\\0``, u32 version 1 or 2, u32 0, u64 payload
size, u64 FNV-1a 64 of the payload) and a payload naming the model it was calibrated on
(architecture, name, n_layer, n_embd, n_head, n_head_kv, head_dim, a hash of the GGUF's query/key
weights), the calibration settings and documents, and per (global layer, KV group) every
candidate's scores and the chosen one: a query head of the group, the mean of the group's heads,
or (version 2, ``cisa calibrate --fit``) a fitted mix of the heads, whose coefficients version 2
carries per group (:meth:`Indexer.mixes`; the transformers backend applies it). Every read is
bounds-checked and the contents are validated as the C++ reader validates them; anything wrong
raises ``ValueError`` naming the file and the reason.

    idx = cisa.indexer.load_indexer("indexers/smollm2-135m.cisaidx")
    idx.heads()          # {(layer, kv_group): query head, None for the mean, or "fit"}
    idx.mixes()          # {(layer, kv_group): the fit's coefficients} where "fit" was chosen

A Hugging Face model cannot be matched against the weights hash (it hashes GGUF tensor bytes), so
:meth:`Indexer.check_shape` compares only the architecture-independent shapes (n_layer, n_head,
n_head_kv, head_dim); the weights are not checked (docs/python.md).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

MAGIC = b"CISAIDX\0"
VERSIONS = (1, 2)
MEAN, FIT = -1, -2  # Candidate.head of the mean of the group's heads and of the fitted mix
_HEADER = 32
_MAX_STRING = 4096
_MAX_DOCUMENTS = 1 << 16
_MAX_DIM = 1 << 20
_MAX_PAGES = 1 << 26  # plan.h's kMaxSelectionPages
_MAX_PAGE_SIZE = 1 << 20


def fnv1a64(data: bytes, h: int = 0xCBF29CE484222325) -> int:
    """FNV-1a 64 (the file's payload hash)."""
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


@dataclass
class Candidate:
    head: int  # absolute query head, MEAN (-1) or FIT (-2, the fitted mix; version 2)
    kl: float  # mean KL(p || pi), nats
    captured: float  # mean dense mass captured by the candidate's top-k


@dataclass
class Group:
    layer: int
    kv_group: int
    positions: int
    oracle: float
    candidates: List[Candidate]
    chosen: int  # index into candidates
    mix: List[float] = field(default_factory=list)  # the fit's [h_g][d/2][2] coefficients

    @property
    def head(self):
        """The chosen query head (absolute index), None for the mean, or "fit" for the fitted
        mix of the group's heads."""
        h = self.candidates[self.chosen].head
        return "fit" if h == FIT else None if h == MEAN else h


@dataclass
class Indexer:
    arch: str
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    weights_hash: int
    budget: int
    window: int
    sink_pages: int
    page_size: int
    positions: int
    seed: int
    criterion: str  # "kl" or "mass"
    fit: bool = False  # version 2: the fitted mix is among the candidates
    fit_ridge: float = 0.0
    documents: List[Tuple[str, int, int]] = field(default_factory=list)  # name, tokens, hash
    groups: List[Group] = field(default_factory=list)
    source: str = "<bytes>"

    def heads(self) -> Dict[Tuple[int, int], object]:
        """The choice per (layer, KV group): a query head (absolute index), None (the mean) or
        "fit" (the fitted mix). Layers and groups that are not listed (sliding-window layers) use
        the mean."""
        return {(g.layer, g.kv_group): g.head for g in self.groups}

    def mixes(self) -> Dict[Tuple[int, int], List[float]]:
        """The fit's coefficients of every (layer, KV group) whose choice is "fit": h_g * head_dim
        floats laid out [h_g][head_dim / 2][2], (alpha, beta) per query head of the group (in
        order) and RoPE frequency pair i, acting on pair i of that head's post-RoPE query as the
        complex number alpha + i beta (docs/calibration.md, "A fitted index query"). Pair i is
        channels (2i, 2i + 1) of the GGUF's llama layout, (i, i + head_dim / 2) of Hugging
        Face's (``cisa.transformers.apply_mix``)."""
        return {(g.layer, g.kv_group): list(g.mix) for g in self.groups if g.head == "fit"}

    def check_shape(self, n_layer: int, n_head: int, n_head_kv: int, head_dim: int) -> None:
        """Raises ValueError unless the model has the shapes the indexer was calibrated on. The
        weights are not compared: the file's hash is of GGUF tensor bytes."""
        want = dict(n_layer=self.n_layer, n_head=self.n_head, n_head_kv=self.n_head_kv,
                    head_dim=self.head_dim)
        got = dict(n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim)
        if want != got:
            diff = ", ".join(f"{k} {want[k]} vs {got[k]}" for k in want if want[k] != got[k])
            raise ValueError(f"cisa indexer {self.source}: calibrated on {self.arch} "
                             f"'{self.name}' ({_shape(want)}), but this model has {_shape(got)} "
                             f"({diff}): an indexer applies only to the model it was made for")


def _shape(d):
    return ", ".join(f"{k} {v}" for k, v in d.items())


class _Reader:
    def __init__(self, data: bytes, source: str):
        self.b, self.pos, self.source = data, 0, source

    def get(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        if len(self.b) - self.pos < n:
            raise ValueError(f"{self.source}: indexer file is truncated (while reading {what})")
        v = struct.unpack_from(fmt, self.b, self.pos)
        self.pos += n
        return v[0] if len(v) == 1 else v

    def str(self, what: str) -> str:
        n = self.get("<I", what)
        if n > _MAX_STRING:
            raise ValueError(f"{self.source}: indexer file is corrupted: {what} is {n} bytes long")
        if len(self.b) - self.pos < n:
            raise ValueError(f"{self.source}: indexer file is truncated (while reading {what})")
        s = self.b[self.pos:self.pos + n]
        self.pos += n
        try:
            return s.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{self.source}: indexer file is corrupted: {what} is not UTF-8")

    def left(self) -> int:
        return len(self.b) - self.pos


def parse_indexer(data: bytes, source: str = "<bytes>") -> Indexer:
    """Parses and validates the bytes of a ``.cisaidx`` file (version 1 or 2)."""
    data = bytes(data)
    if len(data) < 8 or data[:8] != MAGIC:
        raise ValueError(f"{source}: not a CISA indexer file (bad magic)")
    h = _Reader(data, source)
    h.get("<8s", "magic")
    version = h.get("<I", "version")
    if version not in VERSIONS:
        raise ValueError(f"{source}: indexer file version {version} is not supported (this "
                         f"package reads {VERSIONS[0]} to {VERSIONS[-1]})")
    reserved = h.get("<I", "header")
    size = h.get("<Q", "payload size")
    digest = h.get("<Q", "payload hash")
    if h.left() != size:
        kind = "truncated" if h.left() < size else "longer than its header says"
        raise ValueError(f"{source}: indexer file is {kind}: payload of {h.left()} bytes, header "
                         f"says {size}")
    payload = data[_HEADER:]
    if fnv1a64(payload) != digest or reserved != 0:
        raise ValueError(f"{source}: indexer file is corrupted (payload hash mismatch)")

    def bad(msg):
        return ValueError(f"{source}: indexer file is corrupted: {msg}")

    r = _Reader(payload, source)
    arch, name = r.str("architecture"), r.str("model name")
    n_layer, n_embd, n_head, n_head_kv, head_dim = (r.get("<i", "model shape") for _ in range(5))
    weights_hash = r.get("<Q", "weights hash")
    budget, window, sinks, page_size, positions = (r.get("<q", "settings") for _ in range(5))
    seed = r.get("<Q", "seed")
    crit = r.get("<I", "criterion")
    if crit > 1:
        raise bad(f"unknown criterion {crit}")
    fit, ridge = 0, 0.05
    if version >= 2:
        fit = r.get("<I", "fit flag")
        if fit > 1:
            raise bad(f"fit flag {fit}")
        ridge = r.get("<d", "fit ridge")
    n_docs = r.get("<I", "document count")
    if n_docs > _MAX_DOCUMENTS:
        raise bad(f"{n_docs} documents")
    docs = [(r.str("document name"), r.get("<q", "document tokens"), r.get("<Q", "document hash"))
            for _ in range(n_docs)]
    n_groups = r.get("<I", "group count")
    if n_groups > max(n_layer, 0) * max(n_head_kv, 0):
        raise bad(f"{n_groups} groups for a model of {max(n_layer, 0) * max(n_head_kv, 0)}")
    groups = []
    for _ in range(n_groups):
        layer, kv_group = r.get("<i", "group layer"), r.get("<i", "group KV head")
        gpos, oracle = r.get("<q", "group positions"), r.get("<d", "group oracle mass")
        n_cand = r.get("<I", "candidate count")
        if n_cand > max(n_head, 0) + 2:
            raise bad(f"{n_cand} candidates")
        cands = [Candidate(r.get("<i", "candidate head"), r.get("<d", "candidate KL"),
                           r.get("<d", "candidate mass")) for _ in range(n_cand)]
        chosen, mix = r.get("<i", "chosen candidate"), []
        if version >= 2:
            n_mix = r.get("<I", "fit coefficient count")
            if n_mix > _MAX_DIM:
                raise bad(f"{n_mix} fit coefficients")
            if r.left() // 4 < n_mix:
                raise ValueError(f"{source}: indexer file is truncated (while reading fit "
                                 f"coefficients)")
            mix = list(struct.unpack_from(f"<{n_mix}f", r.b, r.pos))
            r.pos += 4 * n_mix
        groups.append(Group(layer, kv_group, gpos, oracle, cands, chosen, mix))
    if r.left():
        raise bad(f"{r.left()} bytes after the last group")
    idx = Indexer(arch, name, n_layer, n_embd, n_head, n_head_kv, head_dim, weights_hash, budget,
                  window, sinks, page_size, positions, seed, "kl" if crit == 0 else "mass",
                  fit == 1, ridge, docs, groups, source)
    _validate(idx, bad)
    return idx


def _validate(idx: Indexer, bad) -> None:
    """The checks of the C++ reader's validate() (src/calib/indexer_file.cpp)."""
    if not idx.arch:
        raise bad("empty architecture")
    for v in (idx.n_layer, idx.n_embd, idx.n_head, idx.n_head_kv, idx.head_dim):
        if v <= 0 or v > _MAX_DIM:
            raise bad(f"model dimension {v} out of range")
    if idx.n_head % idx.n_head_kv:
        raise bad("query heads not a multiple of KV heads")
    if (idx.budget < 1 or idx.window < 0 or idx.sink_pages < 0 or idx.page_size < 1 or
            idx.positions < 0 or idx.budget > _MAX_PAGES or idx.window > _MAX_PAGES or
            idx.sink_pages > _MAX_PAGES or idx.page_size > _MAX_PAGE_SIZE):
        raise bad(f"calibration settings out of range (budget {idx.budget}, window {idx.window}, "
                  f"sink pages {idx.sink_pages}, page size {idx.page_size})")
    if not (idx.fit_ridge >= 0 and idx.fit_ridge != float("inf")):
        raise bad("fit ridge out of range")
    hg = idx.n_head // idx.n_head_kv
    n_cand = hg + 1 + (1 if idx.fit else 0)
    seen = set()
    for g in idx.groups:
        if not (0 <= g.layer < idx.n_layer and 0 <= g.kv_group < idx.n_head_kv):
            raise bad(f"group (layer {g.layer}, KV group {g.kv_group}) out of range")
        if (g.layer, g.kv_group) in seen:
            raise bad(f"layer {g.layer}, KV group {g.kv_group} appears twice")
        seen.add((g.layer, g.kv_group))
        if len(g.candidates) != n_cand:
            raise bad(f"layer {g.layer} has {len(g.candidates)} candidates, expected {n_cand}")
        if any(c.head != g.kv_group * hg + i for i, c in enumerate(g.candidates[:hg])):
            raise bad("candidate head out of order")
        if g.candidates[hg].head != MEAN:
            raise bad("the candidate after the heads is not the mean")
        if idx.fit and g.candidates[-1].head != FIT:
            raise bad("the last candidate is not the fit")
        if not 0 <= g.chosen < n_cand:
            raise bad(f"chosen candidate {g.chosen} out of range")
        if len(g.mix) != (hg * idx.head_dim if idx.fit else 0) or (idx.fit and idx.head_dim % 2):
            raise bad(f"layer {g.layer} has {len(g.mix)} fit coefficients")
        if any(v != v or abs(v) == float("inf") for v in g.mix):
            raise bad("a fit coefficient is not finite")
        if g.positions < 0 or g.oracle != g.oracle or abs(g.oracle) == float("inf"):
            raise bad("group statistics out of range")
        if any(c.kl != c.kl or c.captured != c.captured for c in g.candidates):
            raise bad("NaN score")


def load_indexer(path) -> Indexer:
    """Reads and validates a ``.cisaidx`` file."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"cannot open indexer file '{path}': {e.strerror}") from e
    return parse_indexer(data, path)
