#!/usr/bin/env bash
# Device call 2 of 2026-12-07's third session: prepared, NOT RUN (the session's device time ran
# out). Carry .devbin with bins.tar.xz packed from a build of main at or after 9e71a02 (as
# gpu_decode_session.sh says) and base/cisa.xz = 01f185f's cisa; on the device:
#   CISA_COMMIT=<sha> bash bench/results/decode_sm_balance_2026-12-07/call2_not_run.sh
# PlanOptions::sm_rates (even shares sized by each SM's measured streaming rate, a block taking
# a slot of its own SM): the attention and planner tests, then the decode layer
# rows (int8) three times, alternating main's binary (base), ours, ours with --even-shares
# --sm-rates and ours with --even-shares; then ncu in-kernel attention times and SM balance at
# 4:1, default against --even-shares --sm-rates.
set -u
O=$OUT
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $O/card.log
B=/tmp/prebuilt_bins
mkdir -p $B && tar -C $B -xJf .devbin/bins.tar.xz && xz -dc .devbin/base/cisa.xz >$B/cisa_base && chmod +x $B/cisa_base
timeout 60 $B/tests/cuda_attention_test --gtest_filter='*EvenShares*:*FusedMerge*:*DecodeTasks*' 2>&1 | tail -12 | tee $O/tests.log
timeout 20 $B/tests/cuda_plan_shares_test 2>&1 | tail -3 | tee -a $O/tests.log
L=$O/layer; mkdir -p $L
for rep in 1 2 3; do
  for v in base int8 rates even; do
    X=$B/cisa; flags=
    case $v in base) X=$B/cisa_base ;; rates) flags="--even-shares --sm-rates" ;; even) flags=--even-shares ;; esac
    timeout 60 $X bench layer --backend cuda --json --phase decode --rep-precision int8 $flags \
      >$L/layer_${v}_$rep.json 2>$L/layer_${v}_$rep.log
    echo "$v $rep rc=$?" | tee -a $O/card.log
    grep -E "SM rates|attention  " $L/layer_${v}_$rep.log | tee -a $O/card.log
  done
done
(cd $O && tar czf layer.tgz layer && rm -rf layer)
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for q in base rates; do
  flag=; [ $q = rates ] && flag="--even-shares --sm-rates"
  timeout 40 $NCU --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max \
    -k regex:"attention_kernel|merge_kernel" --launch-count 24 --csv --page raw \
    $B/cisa bench layer --backend cuda --phase decode --geometry 4:1 --rep-precision int8 \
    --warmup 1 --iters 1 $flag >$O/ncu_4x1_4096_$q.csv 2>&1
  echo "ncu 4:1 $q rc=$?" | tee -a $O/card.log
done
