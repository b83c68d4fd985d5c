#!/usr/bin/env bash
# Short device call (2026-12-07, fourth session; little device time left): binaries of d205b75,
# base/cisa.xz = 01f185f's cisa. Most important first, results written as they come:
# cuda_decode_attention_test (EvenSharesBySmRateMatchCpu's first device run), the int8 decode
# layer rows alternated twice (base, ours, ours --even-shares --sm-rates, ours --even-shares),
# ncu attention times at 4:1 (default, sm_rates), then the decode anchors and every CUDA test.
set -u
O=$OUT
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $O/card.log
B=/tmp/prebuilt_bins
mkdir -p $B && tar -C $B -xJf .devbin/bins.tar.xz && xz -dc .devbin/base/cisa.xz >$B/cisa_base && chmod +x $B/cisa_base
timeout 90 $B/tests/cuda_decode_attention_test >$O/decode_attention_test.log 2>&1
echo "cuda_decode_attention_test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $O/decode_attention_test.log | tr '\n' ' ')" | tee -a $O/card.log
L=$O/layer; mkdir -p $L; rm -rf /tmp/decode_lists && mkdir -p /tmp/decode_lists
for rep in 1 2; do
  for v in base int8 rates even; do
    X=$B/cisa; flags=(); dump=()
    case $v in base) X=$B/cisa_base ;; rates) flags=(--even-shares --sm-rates) ;; even) flags=(--even-shares) ;; esac
    [ $v = int8 ] && [ $rep = 1 ] && dump=(--dump-lists /tmp/decode_lists)
    timeout 60 $X bench layer --backend cuda --json --phase decode --rep-precision int8 "${flags[@]}" "${dump[@]}" \
      >$L/layer_${v}_$rep.json 2>$L/layer_${v}_$rep.log
    echo "$v $rep rc=$?" | tee -a $O/card.log
    grep -E "SM rates|cisa G=1|cisa r=8" $L/layer_${v}_$rep.log | tee -a $O/card.log
  done
done
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
PYTHONUNBUFFERED=1 timeout 150 python3 bench/python/anchors_layer.py --commit d205b75 \
  --lists /tmp/decode_lists --cisa $L/layer_int8_1.json --out $L/anchors.json --no-flex \
  --gather-geometries none >$L/anchors.log 2>&1
echo "anchors rc=$?" | tee -a $O/card.log
for t in $B/tests/cuda_*_test; do
  timeout 90 $t >/tmp/full.log 2>&1; rc=$?
  echo "$(basename $t) rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' /tmp/full.log | tr '\n' ' ')" | tee -a $O/card.log
done
