#!/usr/bin/env bash
# Sixth device call (2026-12-07): PlanOptions::task_queue (page-split decode lists split n times
# finer, run by one wave of blocks taking tasks from a queue). Every CUDA test binary, the decode
# layer rows twice with AB sets --task-queue 2 / 4 / 8 and 4 with the fused merge, the decode
# anchors, then ncu in-kernel attention times and SM balance at 4:1 and 32:1 (k = 4096) without
# and with --task-queue 4.
set -u
O=$OUT
OUT=$O/decode CISA_COMMIT=${CISA_COMMIT:-wip} LAYER_REPS=2 NO_MODEL=1 BASE_XZ=/nonexistent \
  AB_SETS="--task-queue 2;--task-queue 4;--task-queue 8;--task-queue 4 --fused-merge" \
  bash bench/scripts/gpu_decode_session.sh
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/prebuilt_bins
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for geo in 4:1 32:1; do
  for q in 0 4; do
    timeout 60 $NCU --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max \
      -k regex:"attention_kernel|merge_kernel" --launch-count 24 --csv --page raw \
      $B/cisa bench layer --backend cuda --phase decode --geometry $geo --rep-precision int8 \
      --warmup 1 --iters 1 --task-queue $q >$O/ncu_${geo/:/x}_4096_q$q.csv 2>&1
    echo "ncu $geo q$q rc=$?"
  done
done
(cd $O && tar czf ncu.tgz ncu_*.csv && rm -f ncu_*.csv)
