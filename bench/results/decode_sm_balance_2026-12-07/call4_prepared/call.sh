#!/usr/bin/env bash
# Prepared 2026-12-08 (no device was lent that session), not run yet. Decode A/B of
# measure_sm_rates timing attention itself (30371f3) and of the fused merge with even shares
# (6bd0fce), on binaries of the commit named by CISA_COMMIT, built on the CPU machine and carried
# in .devbin (bins.tar.xz: cisa and build/ci/tests/cuda_*_test; base/cisa.xz: main's cisa before
# those commits, e.g. 6560246's, as the base), run as
#   CISA_COMMIT=<commit> bash <this file>      (device `run` with carry [".devbin"])
# Most important first, results written as they come: cuda_decode_attention_test (the rate and
# fused-merge tests), the int8 decode layer rows alternated twice (base, ours, ours --even-shares
# --sm-rates, ours with --fused-merge too), ncu attention at 4:1 for three of them, the decode
# anchors, every CUDA test; on an H200 the prefill rows with anchors; ncu of every kernel of a
# 4:1 decode run; one run with --contiguous-pages. Summaries: bench/python/decode_ab_table.py on
# layer.tgz, bench/python/ncu_kernel_fit.py on ncu.tgz.
set -u
CISA_COMMIT=${CISA_COMMIT:-wip}
O=$OUT
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $O/card.log
B=/tmp/prebuilt_bins
mkdir -p $B && tar -C $B -xJf .devbin/bins.tar.xz && xz -dc .devbin/base/cisa.xz >$B/cisa_base && chmod +x $B/cisa_base
timeout 90 $B/tests/cuda_decode_attention_test >$O/decode_attention_test.log 2>&1
echo "cuda_decode_attention_test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $O/decode_attention_test.log | tr '\n' ' ')" | tee -a $O/card.log
L=$O/layer; mkdir -p $L; rm -rf /tmp/decode_lists && mkdir -p /tmp/decode_lists
for rep in 1 2; do
  for v in base int8 rates ratesfm; do
    X=$B/cisa; flags=(); dump=()
    case $v in base) X=$B/cisa_base ;; rates) flags=(--even-shares --sm-rates) ;; ratesfm) flags=(--even-shares --sm-rates --fused-merge) ;; fm) flags=(--fused-merge) ;; esac
    [ $v = int8 ] && [ $rep = 1 ] && dump=(--dump-lists /tmp/decode_lists)
    timeout 60 $X bench layer --backend cuda --json --phase decode --rep-precision int8 "${flags[@]}" "${dump[@]}" \
      >$L/layer_${v}_$rep.json 2>$L/layer_${v}_$rep.log
    echo "$v $rep rc=$?" | tee -a $O/card.log
    grep -E "SM rates" $L/layer_${v}_$rep.log | tee -a $O/card.log
  done
  (cd $O && tar czf layer.tgz layer)
done
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for q in base rates ratesfm; do
  flag=; [ $q = rates ] && flag="--even-shares --sm-rates"; [ $q = ratesfm ] && flag="--even-shares --sm-rates --fused-merge"
  skip=0; [ $q != base ] && skip=6  # measure_sm_rates' six attention launches
  timeout 50 $NCU --clock-control none --cache-control none --launch-skip $skip \
    --metrics gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max \
    -k regex:"attention_kernel|merge_kernel" --launch-count 24 --csv --page raw \
    $B/cisa bench layer --backend cuda --phase decode --geometry 4:1 --rep-precision int8 \
    --warmup 1 --iters 1 $flag >$O/ncu_4x1_4096_$q.csv 2>&1
  echo "ncu 4:1 $q rc=$?" | tee -a $O/card.log
done
(cd $O && tar czf ncu.tgz ncu_*.csv && rm -f ncu_*.csv)
PYTHONUNBUFFERED=1 timeout 150 python3 bench/python/anchors_layer.py --commit $CISA_COMMIT \
  --lists /tmp/decode_lists --cisa $L/layer_int8_1.json --out $L/anchors.json --no-flex \
  --gather-geometries none >$L/anchors.log 2>&1
echo "anchors rc=$?" | tee -a $O/card.log
(cd $O && tar czf layer.tgz layer && rm -rf layer)
for t in $B/tests/cuda_*_test; do
  timeout 90 $t >/tmp/full.log 2>&1; rc=$?
  echo "$(basename $t) rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' /tmp/full.log | tr '\n' ' ')" | tee -a $O/card.log
done
if grep -q H200 $O/card.log; then
  P=$O/prefill
  mkdir -p $P && rm -rf /tmp/prefill_lists && mkdir -p /tmp/prefill_lists
  timeout 150 $B/cisa bench layer --backend cuda --json --phase prefill --rep-precision int8 \
    --dump-lists /tmp/prefill_lists >$P/layer_int8.json 2>$P/layer_int8.log
  echo "[$(date +%H:%M:%S)] prefill layer rc=$?" | tee -a $O/card.log
  PYTHONUNBUFFERED=1 timeout 150 python3 bench/python/anchors_layer.py --commit $CISA_COMMIT \
    --lists /tmp/prefill_lists --cisa $P/layer_int8.json --out $P/anchors.json --no-flex \
    --gather-geometries none >$P/anchors.log 2>&1
  echo "[$(date +%H:%M:%S)] prefill anchors rc=$?" | tee -a $O/card.log
  (cd $O && tar czf prefill.tgz prefill && rm -rf prefill)
fi
timeout 60 $NCU --clock-control none --cache-control none --metrics gpu__time_duration.sum \
  --launch-count 400 --csv --page raw \
  $B/cisa bench layer --backend cuda --phase decode --geometry 4:1 --rep-precision int8 \
  --warmup 1 --iters 1 >$O/ncu_all_4x1.csv 2>&1
echo "ncu all 4:1 rc=$?" | tee -a $O/card.log
(cd $O && gzip -f ncu_all_4x1.csv)
mkdir -p $O/contig
timeout 60 $B/cisa bench layer --backend cuda --json --phase decode --rep-precision int8 --contiguous-pages \
  >$O/contig/layer_contig_1.json 2>$O/contig/layer_contig_1.log
echo "contig rc=$?" | tee -a $O/card.log
(cd $O && tar czf contig.tgz contig && rm -rf contig)
