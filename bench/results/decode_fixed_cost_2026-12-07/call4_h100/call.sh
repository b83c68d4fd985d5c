#!/usr/bin/env bash
# Fourth device call (2026-12-07): every CUDA test binary of the final tree (L2 cache policies in
# the decode scoring and fused-selection kernels, the fixed fused-merge test), then the decode
# layer rows (native and int8) alternated with the binary without the policies (.devbin/base)
# twice, and the decode anchors.
set -u
OUT0=$OUT; OUT=$OUT/decode CISA_COMMIT=${CISA_COMMIT:-wip} LAYER_REPS=2 NO_MODEL=1 BASE_PRECS=int8 \
  bash bench/scripts/gpu_decode_session.sh
# How evenly the decode attention's blocks finish: SM active cycles (min / avg / max over SMs)
# against the kernel's elapsed cycles, 4:1 and 32:1 at k = 4096.
B=/tmp/prebuilt_bins O=$OUT0
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for geo in 4:1 32:1; do
  timeout 100 $NCU --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max \
    -k regex:"attention_kernel" --launch-count 12 --csv --page raw \
    $B/cisa bench layer --backend cuda --phase decode --geometry $geo --rep-precision int8 \
    --warmup 1 --iters 1 >$O/ncu_balance_${geo/:/x}.csv 2>&1
  echo "ncu balance $geo rc=$?"
done
(cd $O && tar czf ncu_balance.tgz ncu_balance_*.csv && rm -f ncu_balance_*.csv)
