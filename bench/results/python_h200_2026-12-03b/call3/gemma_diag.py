# Gemma 3 on the GPU: does generate() with cisa.transformers.Cache give the same steps as with
# DynamicCache, and is CISA's generate deterministic? (diagnostic, device call 3)
import sys
sys.path.insert(0, "python/tests")
import torch
import cisa.transformers as ct
from test_gpu_transformers import model_of, prompt, teacher_forced  # noqa: E402


@torch.no_grad()
def gen(model, impl, ids, n, **kw):
    model.set_attn_implementation(impl)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                         do_sample=False, output_scores=True, return_dict_in_generate=True, **kw)
    return out.sequences, torch.stack([s.float() for s in out.scores], 1)


for shape in ("gemma-3-1b", "llama-3.2-1b"):
    model = model_of(shape)
    p, n = 1000, 16
    ids = prompt(2, p, seed=1)
    ref, ref_s = gen(model, "sdpa", ids, n)
    d1, s1 = gen(model, "cisa_gpu_full", ids, n)
    d2, s2 = gen(model, "cisa_gpu_full", ids, n)
    c1, t1 = gen(model, "cisa_gpu_full", ids, n, past_key_values=ct.Cache(model))
    full = teacher_forced(model, "cisa_gpu_full", ref, p)

    def first_diff(a, b):
        return [int((a[r, p:] != b[r, p:]).nonzero()[0, 0]) if (a[r, p:] != b[r, p:]).any() else -1
                for r in range(a.shape[0])]
    print(shape, "first diff vs sdpa: dyn", first_diff(d1, ref), "cache", first_diff(c1, ref),
          "| dyn vs dyn", first_diff(d1, d2), "| cache vs dyn", first_diff(c1, d1))
    k = min(s1.shape[1], t1.shape[1])
    print(shape, "max |scores dyn - dyn2| per step", (s1 - s2).abs().amax((0, 2)).tolist()[:k])
    print(shape, "max |scores cache - dyn| per step", (t1[:, :k] - s1[:, :k]).abs().amax((0, 2)).tolist())
    print(shape, "max |teacher-forced - dyn scores| step 0..3",
          (full[:, :4] - s1[:, :4]).abs().amax((0, 2)).tolist())
    top2 = ref_s.topk(2, -1).values
    print(shape, "sdpa top-1 margins row 1:", (top2[1, :, 0] - top2[1, :, 1]).tolist())
