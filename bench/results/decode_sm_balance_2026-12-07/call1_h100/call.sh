#!/usr/bin/env bash
# Device call 1 (2026-12-07, third session). Binaries of 01f185f + PlanOptions::even_shares:
# every CUDA test, the decode layer rows twice with anchors, alternated with main's binary (base)
# and --even-shares (set0); then per-block timing of decode attention launches (probe build of
# main + attn_probe.diff), ncu in-kernel attention times and SM balance at 4:1 with and without
# --even-shares; on an H200 also the prefill rows with anchors.
set -u
O=$OUT
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $O/card.log
OUT=$O/decode CISA_COMMIT=${CISA_COMMIT:-wip} LAYER_REPS=2 NO_MODEL=1 BASE_XZ=.devbin/base/cisa.xz \
  AB_SETS="--even-shares" bash bench/scripts/gpu_decode_session.sh
xz -dc .devbin/cisa_probe.xz >/tmp/cisa_probe && chmod +x /tmp/cisa_probe
rm -f /tmp/attn_probe.bin
timeout 100 /tmp/cisa_probe bench layer --backend cuda --json --phase decode --rep-precision int8 \
  --geometry 4:1 >$O/probe_layer.json 2>$O/probe_layer.log
echo "probe rc=$?" | tee -a $O/card.log
timeout 60 python3 .devbin/probe_analyze.py /tmp/attn_probe.bin $O/probe.npz 2>&1 | tee $O/probe.txt
B=/tmp/prebuilt_bins
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for geo in 4:1; do
  for q in base even; do
    flag=; [ $q = even ] && flag=--even-shares
    timeout 60 $NCU --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max \
      -k regex:"attention_kernel|merge_kernel" --launch-count 24 --csv --page raw \
      $B/cisa bench layer --backend cuda --phase decode --geometry $geo --rep-precision int8 \
      --warmup 1 --iters 1 $flag >$O/ncu_${geo/:/x}_4096_$q.csv 2>&1
    echo "ncu $geo $q rc=$?" | tee -a $O/card.log
  done
done
(cd $O && tar czf ncu.tgz ncu_*.csv && rm -f ncu_*.csv)
if grep -q H200 $O/card.log; then
  P=$O/prefill
  mkdir -p $P && rm -rf /tmp/prefill_lists && mkdir -p /tmp/prefill_lists
  timeout 200 $B/cisa bench layer --backend cuda --json --phase prefill --rep-precision int8 \
    --dump-lists /tmp/prefill_lists >$P/layer_int8.json 2>$P/layer_int8.log
  echo "[$(date +%H:%M:%S)] prefill layer rc=$?" | tee -a $O/card.log
  PYTHONUNBUFFERED=1 timeout 200 python3 bench/python/anchors_layer.py --commit "${CISA_COMMIT:-wip}" \
    --lists /tmp/prefill_lists --cisa $P/layer_int8.json --out $P/anchors.json --no-flex \
    --gather-geometries none >$P/anchors.log 2>&1
  echo "[$(date +%H:%M:%S)] prefill anchors rc=$?" | tee -a $O/card.log
  (cd $O && tar czf /tmp/prefill.tgz prefill && rm -rf prefill && mv /tmp/prefill.tgz prefill.tgz)
fi
