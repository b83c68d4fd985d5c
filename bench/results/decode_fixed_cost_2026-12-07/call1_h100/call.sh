#!/usr/bin/env bash
# Device call (2026-12-07, second session): the fused-merge test first, then every CUDA test
# binary, the decode layer rows (native and int8, twice, reuse r = 2/4/8) with decode anchors and
# AB sets (budgets 2048 / 8192, pool-order pages, --fused-merge), then prefill int8 rows + anchors.
set -u
O=$OUT
mkdir -p /tmp/fm && tar -C /tmp/fm -xJf .devbin/bins.tar.xz tests/cuda_attention_test
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $O/card.log
timeout 120 /tmp/fm/tests/cuda_attention_test --gtest_filter='*FusedMerge*' 2>&1 | tail -15 | tee $O/fused_test.log
OUT=$O/decode CISA_COMMIT=${CISA_COMMIT:-wip} LAYER_REPS=2 NO_MODEL=1 \
  AB_SETS="--budget 2048;--budget 8192;--contiguous-pages;--fused-merge;--fused-merge --blocks-per-sm 4;--fused-merge --blocks-per-sm 3;--blocks-per-sm 1" \
  BASE_XZ=/nonexistent bash bench/scripts/gpu_decode_session.sh
B=/tmp/prebuilt_bins P=$O/prefill
mkdir -p $P && rm -rf /tmp/prefill_lists && mkdir -p /tmp/prefill_lists
timeout 200 $B/cisa bench layer --backend cuda --json --phase prefill --rep-precision int8 \
  --dump-lists /tmp/prefill_lists >$P/layer_int8.json 2>$P/layer_int8.log
echo "[$(date +%H:%M:%S)] prefill layer rc=$?" | tee -a $O/card.log
PYTHONUNBUFFERED=1 timeout 200 python3 bench/python/anchors_layer.py --commit "${CISA_COMMIT:-wip}" \
  --lists /tmp/prefill_lists --cisa $P/layer_int8.json --out $P/anchors.json --no-flex \
  --gather-geometries none >$P/anchors.log 2>&1
echo "[$(date +%H:%M:%S)] prefill anchors rc=$?" | tee -a $O/card.log
(cd $O && tar czf /tmp/prefill.tgz prefill && rm -rf prefill && mv /tmp/prefill.tgz prefill.tgz)
