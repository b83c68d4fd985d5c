#!/usr/bin/env bash
# Fifth device call (2026-12-07): how evenly the decode attention's blocks finish (call4's ncu
# part, which failed without LD_LIBRARY_PATH): SM active cycles (min / avg / max over SMs)
# against the kernel's elapsed cycles, 4:1 and 32:1 at k = 4096.
set -u
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/b O=$OUT
mkdir -p $B && tar -C $B -xJf .devbin/bins.tar.xz cisa
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for geo in 4:1 32:1; do
  timeout 100 $NCU --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max \
    -k regex:"attention_kernel" --launch-count 12 --csv --page raw \
    $B/cisa bench layer --backend cuda --phase decode --geometry $geo --rep-precision int8 \
    --warmup 1 --iters 1 >$O/ncu_balance_${geo/:/x}.csv 2>&1
  echo "ncu balance $geo rc=$?"
done
