#!/usr/bin/env bash
# Device call 4 of 2026-12-05: the committed defaults (v10 unions on wgmma, top-k v7; v6 removed):
# GPU tests, the layer table with its anchors, an A/B against the one-block top-k, ncu source
# counters of the v7 kernel.
set -u
CISA_COMMIT=${CISA_COMMIT:-unknown} REPS=0 NO_NCU=1 \
LAYER_AB_ARGS="--topk-one-block --phase prefill" \
  bash bench/scripts/gpu_prebuilt_session.sh
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
timeout 150 ncu --kernel-name regex:topk_staged --launch-count 1 --section SourceCounters --section WarpStateStats \
  --section InstructionStats --print-details all /tmp/prebuilt_bins/cisa bench layer --backend cuda --phase prefill \
  --geometry 4:1 --iters 1 --warmup 0 >/tmp/ncu_src.txt 2>&1
echo "ncu source rc=$?" | tee -a $OUT/session.log
gzip -c /tmp/ncu_src.txt >$OUT/ncu_topk_staged_source.txt.gz
