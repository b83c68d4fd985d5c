#!/usr/bin/env bash
# Second device call (2026-12-07): the fused-merge test with a budget whose CISA lists split
# (the first call's budget of 40 made none), every CUDA test binary, ncu in-kernel durations of
# the decode attention and merge kernels at 4:1 and 32:1 for three budgets (the fixed cost inside
# the kernels against the event-timed one), and layer rows at budgets 256 / 1024 and with
# --fused-merge --blocks-per-sm 1.
set -u
O=$OUT
mkdir -p /tmp/fm && xz -dc .devbin/cat.xz > /tmp/fm/cuda_attention_test && chmod +x /tmp/fm/cuda_attention_test
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $O/card.log
timeout 120 /tmp/fm/cuda_attention_test > $O/attention_test.log 2>&1
echo "attention test rc=$?" | tee -a $O/card.log; grep -E "OK|FAILED|Failure" $O/attention_test.log | head -20
OUT=$O/decode CISA_COMMIT=${CISA_COMMIT:-wip} LAYER_REPS=1 NO_MODEL=1 \
  AB_SETS="--budget 256;--budget 1024;--fused-merge --blocks-per-sm 1;--budget 2048;--budget 8192" \
  BASE_XZ=/nonexistent bash bench/scripts/gpu_decode_session.sh >/dev/null 2>&1
echo "decode session done" | tee -a $O/card.log
B=/tmp/prebuilt_bins
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for geo in 4:1 32:1; do
  for bud in 1024 4096 8192; do
    for fm in "" --fused-merge; do
      f=$O/ncu_${geo/:/x}_${bud}${fm:+_fm}.csv
      timeout 100 $NCU --clock-control none --cache-control none --metrics gpu__time_duration.sum,launch__grid_size \
        -k regex:"attention_kernel|merge_kernel" --launch-count 60 --csv --page raw \
        $B/cisa bench layer --backend cuda --phase decode --geometry $geo --rep-precision int8 \
        --warmup 1 --iters 1 --budget $bud $fm >$f 2>&1
      echo "ncu $geo $bud $fm rc=$?" | tee -a $O/card.log
    done
  done
done
(cd $O && tar czf ncu.tgz ncu_*.csv && rm -f ncu_*.csv)
