"""Host planning (cisa.plan, SparseAttentionWrapper.plan): the binding checks the block tables in
one pass and plans with plan.h's rules; the engine's own path (adopt every row into a PageTable,
plan_dense or plan_query_groups + size_page_lists) stays as _C.plan_reference. Both must give the
same lists and refuse the same inputs with the same messages."""

import pytest
import torch

import cisa
from cisa import _C, ops
from helpers import entries_tensor


def batch(lens, num_pages, page_size=16, extra_cols=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    need = [(n + page_size - 1) // page_size for n in lens]
    cols = max(need) + extra_cols
    perm = torch.randperm(num_pages, generator=g).to(torch.int32)
    tables = torch.full((len(lens), cols), -1, dtype=torch.int32)  # unused columns: ignored
    at = 0
    for s, n in enumerate(need):
        tables[s, :n] = perm[at:at + n]
        at += n
    return tables, torch.tensor(lens, dtype=torch.int64)


def both(tables, lens, ent, num_pages, hkv, page_size=16, dense=False, sw=0, budget=0,
         window=128, qshare=1, sinks=0, last=False):
    b = ops._batch_args("plan", tables, lens, ent)
    args = (b, num_pages, hkv, page_size, dense, sw, budget, window, qshare, sinks, last)
    fast = err = ref = ref_err = None
    try:
        fast = _C.plan(*args)
    except Exception as e:  # noqa: BLE001
        err = e
    try:
        ref = _C.plan_reference(*args)
    except Exception as e:  # noqa: BLE001
        ref_err = e
    return fast, err, ref, ref_err


CASES = [
    # lens, entries, num_kv_heads, params
    ([100, 40], [(0, 90, 10), (1, 39, 1)], 2, dict(budget=1, window=1)),
    ([100, 40], [(0, 90, 10), (1, 39, 1)], 2, dict(dense=True)),
    ([100, 40], [(0, 0, 100), (1, 10, 30)], 1, dict(dense=True, sw=20)),
    ([3000, 777, 16], [(0, 2000, 1000), (1, 700, 77), (2, 15, 1)], 2,
     dict(budget=8, window=4, qshare=16, sinks=1)),
    ([3000, 777], [(0, 0, 3000), (1, 776, 1)], 4, dict(budget=8, window=4, qshare=4, last=True)),
    ([5000, 1], [(0, 4000, 1000), (1, 0, 1)], 1, dict(budget=20, window=3, qshare=32, sinks=2)),
    ([5000], [(0, 4999, 1)], 3, dict(dense=True)),
]


@pytest.mark.parametrize("lens,entries,hkv,params", CASES)
def test_plan_matches_the_engines_plan(lens, entries, hkv, params):
    num_pages = sum((n + 15) // 16 for n in lens) + 5
    tables, seq_lens = batch(lens, num_pages)
    ent = entries_tensor(entries)  # alive while the binding reads its pointer
    fast, err, ref, ref_err = both(tables, seq_lens, ent, num_pages, hkv, **params)
    assert err is None and ref_err is None, (err, ref_err)
    for got, want in zip(fast, ref):
        assert got.tolist() == list(want)
    g, o, total, nl = _C.plan_groups(ops._batch_args("plan", tables, seq_lens, ent),
                                     num_pages, hkv, 16,
                                     params.get("dense", False), params.get("sw", 0),
                                     params.get("budget", 0), params.get("window", 128),
                                     params.get("qshare", 1), params.get("sinks", 0),
                                     params.get("last", False))
    assert g.tolist() == list(ref[0]) and o.tolist() == list(ref[1])
    assert total == len(ref[2]) and nl == len(ref[4])


def _bad_inputs():
    lens = [100, 40]
    num_pages = 20
    tables, seq_lens = batch(lens, num_pages)
    ent = entries_tensor([(0, 90, 10), (1, 39, 1)])
    out = []
    t = tables.clone(); t[1, 2] = num_pages + 3; out.append(("range", t, seq_lens, ent))
    t = tables.clone(); t[0, 6] = -1; out.append(("negative page", t, seq_lens, ent))
    t = tables.clone(); t[1, 1] = t[0, 4]; out.append(("across rows", t, seq_lens, ent))
    t = tables.clone(); t[0, 5] = t[0, 2]; out.append(("within a row", t, seq_lens, ent))
    t = tables.clone(); t[0, 2] = num_pages; t[1, 0] = t[0, 0]; out.append(("first wins", t, seq_lens, ent))
    out.append(("negative len", tables, torch.tensor([100, -1]), ent))
    out.append(("too long", tables, torch.tensor([100, 16 * 9 + 1]), ent))
    out.append(("unknown seq", tables, seq_lens, entries_tensor([(2, 0, 1)])))
    out.append(("zero count", tables, seq_lens, entries_tensor([(0, 0, 0)])))
    out.append(("negative first", tables, seq_lens, entries_tensor([(0, -1, 1)])))
    out.append(("past written", tables, seq_lens, entries_tensor([(1, 35, 6)])))
    return out, num_pages


@pytest.mark.parametrize("dense", [False, True])
def test_plan_refuses_what_the_engine_refuses(dense):
    cases, num_pages = _bad_inputs()
    for name, t, lens, ent in cases:
        _, err, _, ref_err = both(t, lens, ent, num_pages, 2, dense=dense, budget=1, window=1)
        assert err is not None and ref_err is not None, name
        assert type(err) is type(ref_err) and str(err) == str(ref_err), (name, err, ref_err)
    # parameters: the same refusals
    tables, lens = batch([100, 40], num_pages)
    ent = entries_tensor([(0, 90, 10)])
    for kw in (dict(budget=-1), dict(qshare=0), dict(sw=-1, dense=True), dict(page_size=0)):
        _, err, _, ref_err = both(tables, lens, ent, num_pages if "page_size" not in kw else 8,
                                  2, **kw)
        assert type(err) is type(ref_err) and str(err) == str(ref_err), (kw, err, ref_err)


def test_bad_page_id_is_refused_by_plan_and_the_wrapper():
    num_pages = 20
    tables, lens = batch([100, 40], num_pages)
    ent = entries_tensor([(0, 90, 10), (1, 39, 1)])
    bad = tables.clone()
    bad[1, 2] = num_pages + 3
    msg = r"cisa.plan: block_tables row 1: .*page ID %d \(logical page 2\) is out of range \[0, %d\)"
    for dense in (False, True):
        with pytest.raises(IndexError, match=msg % (num_pages + 3, num_pages)):
            cisa.plan(bad, lens, ent, num_pages=num_pages, num_kv_heads=2, dense=dense,
                      budget=1, window=1)
        w = cisa.SparseAttentionWrapper(num_kv_heads=2)
        with pytest.raises(IndexError, match=msg % (num_pages + 3, num_pages)):
            w.plan(bad, lens, ent, num_pages=num_pages, dense=dense, budget=1, window=1)
        # A page past the row's used part is never read: not refused.
        ok = tables.clone()
        ok[1, 3:] = 10 ** 6
        w.plan(ok, lens, ent, num_pages=num_pages, dense=dense, budget=1, window=1)
    dup = tables.clone()
    dup[1, 0] = dup[0, 3]
    with pytest.raises(ValueError, match=r"page ID %d \(logical page 0\) is already in use"
                       % int(dup[0, 3])):
        cisa.SparseAttentionWrapper(num_kv_heads=2).plan(dup, lens, ent, num_pages=num_pages,
                                                         dense=True)
    # A page at or above num_pages but inside the cache is out of range too.
    with pytest.raises(IndexError, match=r"out of range \[0, %d\)" % (num_pages - 5)):
        cisa.plan(tables, lens, ent, num_pages=num_pages - 5, num_kv_heads=2)


def test_plan_returns_contiguous_cpu_tensors():
    tables, lens = batch([100, 40], 20)
    ent = entries_tensor([(0, 90, 10), (1, 39, 1)])
    for dense in (False, True):
        out = cisa.plan(tables, lens, ent, num_pages=20, num_kv_heads=2, dense=dense,
                        budget=1, window=1)
        for t, dt in zip(out, (torch.int64, torch.int64, torch.int32, torch.int32, torch.int32)):
            assert t.device.type == "cpu" and t.dtype == dt and t.is_contiguous()
        assert out[0].shape[1] == 5
        out[2].clone().add_(1)  # usable like any tensor
    # an empty batch
    g, o, p, c, ns = cisa.plan(tables, lens, torch.zeros((0, 3), dtype=torch.int64),
                               num_pages=20, num_kv_heads=2)
    assert g.shape == (0, 5) and o.tolist() == [0] and p.numel() == 0 and ns.numel() == 0
