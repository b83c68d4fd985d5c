"""cisa: Chunk-Indexed Sparse Attention for PyTorch (docs/python.md).

The ops (``torch.ops.cisa.*``, also importable from here) run the project's CPU engine on CPU
tensors and, in a build with ``-DCISA_PY_CUDA=ON``, the Hopper backend on CUDA tensors;
:class:`SparseAttentionWrapper` splits a step into ``plan`` (host work) and ``run``.
"""

from . import _C, indexer
from .ops import (HAS_CUDA, chunk_scores, paged_attention, plan, rep_width, select_pages, topk,
                  update_representatives)
from .wrapper import SparseAttentionWrapper

__all__ = ["HAS_CUDA", "chunk_scores", "indexer", "paged_attention", "plan", "rep_width",
           "select_pages", "topk", "update_representatives", "SparseAttentionWrapper",
           "set_num_threads"]


def set_num_threads(n: int) -> None:
    """Worker threads of the engine's pool (0: one per hardware thread)."""
    _C.set_num_threads(n)
