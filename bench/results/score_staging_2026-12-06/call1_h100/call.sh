#!/usr/bin/env bash
# This session's device call: every CUDA test binary of the working tree (scoring staged through
# shared memory), the decode layer rows against a572648 (main before it) alternated twice, with
# 4 and 8 score tiles a block as extra sets, the scoring probe; on an H200 also the whole-model
# rows against 861e68a.
set -u
O=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv | tee $O/card.log
OUT=$O/decode CISA_COMMIT=${CISA_COMMIT:-wip} LAYER_REPS=2 NO_MODEL=1 BASE_PRECS="int8 native" \
  AB_SETS="--score-tiles 4;--score-tiles 8" BASE_XZ=.devbin/base/cisa_a572648.xz \
  BASE2_XZ=.devbin/base/cisa_staged_min4.xz \
  bash bench/scripts/gpu_decode_session.sh
B=/tmp/prebuilt_bins
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
timeout 200 $B/bench/score_read_probe >$O/probe.log 2>&1
echo "probe rc=$?" >>$O/card.log
M=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$M" -gt 100000 ]; then
  OUT=$O/model NO_NCU=1 NO_LAYER=1 TESTS=" " PROBES="" REPS=1 TOKENS=128 CISA_COMMIT=${CISA_COMMIT:-wip} \
    NEW_ARGS="--rep-precision int8 --reuse-steps 8" BASE_ARGS="--rep-precision int8 --reuse-steps 8" \
    BASE_XZ=.devbin/base/cisa_861e68a.xz bash bench/scripts/gpu_prebuilt_session.sh
fi
