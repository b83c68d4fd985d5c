#!/usr/bin/env bash
# Prepared 2026-12-08 (no device was lent that session), not run yet. Prefill A/B of
# PlanOptions::attention_pdl (40ce5ff): the 4:1 prefill rows (G = 4, 16, 32) with the attention
# launch as a programmatic dependent (default) and as an ordinary launch (--no-attention-pdl),
# alternated twice, then the prefill anchors. The question: do the paired-tile rows (G = 4, 16)
# lose their 0.07-0.6 ms of graph step over busy time with an ordinary launch (docs/cuda-notes.md)?
# Same .devbin as call.sh; run as  CISA_COMMIT=<commit> bash <this file>
set -u
CISA_COMMIT=${CISA_COMMIT:-wip}
O=$OUT
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $O/card.log
B=/tmp/prebuilt_bins
[ -x $B/cisa ] || { mkdir -p $B && tar -C $B -xJf .devbin/bins.tar.xz; }
P=$O/prefill; mkdir -p $P; rm -rf /tmp/prefill_lists && mkdir -p /tmp/prefill_lists
for rep in 1 2; do
  for v in pdl ordinary; do
    flags=(); dump=()
    [ $v = ordinary ] && flags=(--no-attention-pdl)
    [ $v = pdl ] && [ $rep = 1 ] && dump=(--dump-lists /tmp/prefill_lists)
    timeout 120 $B/cisa bench layer --backend cuda --json --phase prefill --geometry 4:1 \
      --rep-precision int8 "${flags[@]}" "${dump[@]}" >$P/layer_${v}_$rep.json 2>$P/layer_${v}_$rep.log
    echo "[$(date +%H:%M:%S)] prefill $v $rep rc=$?" | tee -a $O/card.log
  done
  (cd $O && tar czf prefill.tgz prefill)
done
PYTHONUNBUFFERED=1 timeout 200 python3 bench/python/anchors_layer.py --commit $CISA_COMMIT \
  --lists /tmp/prefill_lists --cisa $P/layer_pdl_1.json --out $P/anchors.json --no-flex \
  --gather-geometries none >$P/anchors.log 2>&1
echo "[$(date +%H:%M:%S)] prefill anchors rc=$?" | tee -a $O/card.log
(cd $O && tar czf prefill.tgz prefill && rm -rf prefill)
