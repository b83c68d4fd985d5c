#!/usr/bin/env bash
# Device call 2 of 2026-12-05: tests, the default layer table with anchors, A/B runs, ncu of top-k.
set -u
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
CISA_COMMIT=${CISA_COMMIT:-unknown} REPS=0 NO_NCU=1 \
LAYER_AB_ARGS="--mma-unions --phase prefill --geometry 4:1;--topk-smem-cluster 2 --phase prefill --geometry 4:1;--topk-smem-cluster 8 --phase prefill --geometry 4:1" \
  bash bench/scripts/gpu_prebuilt_session.sh
B=/tmp/prebuilt_bins
echo "nsys: $(command -v nsys || echo none)" | tee -a $OUT/session.log
for v in default smem4; do
  extra=(); [ $v = smem4 ] && extra=(--topk-smem-cluster 4)
  timeout 120 ncu --kernel-name regex:topk --launch-count 1 --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats \
    $B/cisa bench layer --backend cuda --phase prefill --geometry 4:1 --iters 1 --warmup 0 "${extra[@]}" \
    > $OUT/ncu_topk_$v.txt 2>&1
  echo "ncu $v rc=$?" | tee -a $OUT/session.log
done
if command -v nsys >/dev/null; then
  timeout 120 nsys profile --cuda-graph-trace=node -o /tmp/step_g4 --force-overwrite true \
    $B/cisa bench layer --backend cuda --phase prefill --geometry 4:1 --iters 3 --warmup 1 >/tmp/nsys.log 2>&1
  echo "nsys rc=$?" | tee -a $OUT/session.log
  timeout 90 nsys stats --report cuda_gpu_trace --format csv /tmp/step_g4.nsys-rep 2>/dev/null | gzip > $OUT/nsys_trace.csv.gz
fi
# Mixed tiles in the server: one server without, one with --mixed-tiles (synthetic qwen2.5-7b).
for m in plain mixed; do
  sa=""; [ $m = mixed ] && sa="--mixed-tiles"
  OUT=/tmp/serve_$m SKIP_BUILD=1 CISA_BIN=$B/cisa SERVE_ARGS="$sa" NUM_PROMPTS=16 CONCURRENCY=8 \
    INPUT_LEN=32768 OUTPUT_LEN=256 ALT_BUDGET=0 REPEAT=0 DEADLINE_S=100 \
    bash bench/scripts/gpu_serve_session.sh >/dev/null 2>&1
  echo "serve $m rc=$?" | tee -a $OUT/session.log
  grep -E "ok |pass (dense|cisa)" /tmp/serve_$m/session.log | tee -a $OUT/session.log
done
mkdir -p /tmp/extra && cp -r /tmp/serve_plain /tmp/serve_mixed $OUT/ncu_topk_*.txt /tmp/extra/ 2>/dev/null
[ -f $OUT/nsys_trace.csv.gz ] && mv $OUT/nsys_trace.csv.gz /tmp/extra/
rm -f $OUT/ncu_topk_*.txt
tar -C /tmp/extra -czf $OUT/extra.tgz .
