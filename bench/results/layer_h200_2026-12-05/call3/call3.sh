#!/usr/bin/env bash
# Device call 3 of 2026-12-05: GPU tests, top-k v7 (--topk-staged) against the default, alternated,
# then the whole layer table with v7 and its anchors, and ncu of the v7 kernel.
set -u
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/prebuilt_bins R=/tmp/r3; rm -rf $B $R; mkdir -p $B $R /tmp/l3
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/session.log"; }
tar -C $B -xJf .devbin/bins.tar.xz
log "commit ${CISA_COMMIT:-unknown}"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $OUT/session.log
for t in cuda_select_test $(cd $B/tests && ls cuda_*_test | grep -v cuda_select_test); do
  echo "=== $t" >>$OUT/gpu_tests.log
  timeout 150 $B/tests/$t >>$OUT/gpu_tests.log 2>&1
  log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $OUT/gpu_tests.log | tail -1)"
done
for rep in 1 2; do
  for v in default staged; do
    extra=(); [ $v = staged ] && extra=(--topk-staged)
    timeout 120 $B/cisa bench layer --backend cuda --json --phase prefill "${extra[@]}" >$R/prefill_${v}_$rep.json 2>$R/prefill_${v}_$rep.log
    log "prefill $v rep $rep rc=$?"; grep -E "prefill cisa|kernels" $R/prefill_${v}_$rep.log | head -10 | tee -a $OUT/session.log
  done
done
timeout 200 $B/cisa bench layer --backend cuda --json --topk-staged --dump-lists /tmp/l3 >$R/layer_cisa.json 2>$R/layer_cisa.log
log "layer staged rc=$?"
PYTHONUNBUFFERED=1 timeout 200 python3 bench/python/anchors_layer.py --commit "${CISA_COMMIT:-unknown} --topk-staged" \
  --lists /tmp/l3 --cisa $R/layer_cisa.json --out $R/layer_results.json --gather-geometries 4:1 >$R/anchors.log 2>&1
log "anchors rc=$?"; tail -45 $R/anchors.log | tee -a $OUT/session.log
timeout 100 ncu --kernel-name regex:topk --launch-count 1 --section SpeedOfLight --section WarpStateStats \
  --section Occupancy --section LaunchStats $B/cisa bench layer --backend cuda --phase prefill --geometry 4:1 \
  --iters 1 --warmup 0 --topk-staged >$R/ncu_topk_staged.txt 2>&1
log "ncu rc=$?"
(cd $R && tar czf $OUT/results.tgz .)
