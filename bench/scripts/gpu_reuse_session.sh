#!/usr/bin/env bash
# One device call for selection reuse on the GPU (docs/design.md "Selection reuse"), with binaries
# built on the CPU machine and carried in .devbin/ (see gpu_prebuilt_session.sh for the packing):
# the GPU tests, the whole-model decode rows of `cisa bench model` at r = 1, 2, 4 (2 x 1M and
# 16 x 128K, Qwen2.5-7B shape, TOKENS decode steps, default 128), and `cisa bench layer --phase decode` (fresh and kept selection
# times, per-step averages at r = 2, 4, 8) with its PyTorch anchors of the same call.
#   tar -C build/ci -cJf .devbin/bins.tar.xz cisa tests/cuda_selection_reuse_test ...
#   OUT=... CISA_COMMIT=<label> bash bench/scripts/gpu_reuse_session.sh
# Environment: TESTS (default below), NO_LAYER=1, ROWS (default: all rows below).
set -u
OUT=${OUT:-$PWD/gpu-reuse-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/reuse_bins
rm -rf "$B" && mkdir -p "$B"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/session.log"; }
tar -C "$B" -xJf "${BINS:-.devbin/bins.tar.xz}" || { log "no binaries"; exit 1; }
log "commit ${CISA_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$OUT/session.log"

for t in ${TESTS:-cuda_selection_reuse_test cuda_select_test cuda_step_graph_test cuda_backend_kv_test}; do
  [ -x "$B/tests/$t" ] || continue
  timeout 240 "$B/tests/$t" >"$OUT/test_$t.log" 2>&1
  log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_$t.log" | tr '\n' ' ')"
done

summary() { python3 bench/python/bench_model_line.py "$1" | tee -a "$OUT/session.log"; }
# name batch context k r check
ROWS=${ROWS:-"b2_l1m_r1 2 1048576 4096 1 new-chunks
b2_l1m_r2 2 1048576 4096 2 new-chunks
b2_l1m_r4 2 1048576 4096 4 new-chunks
b16_l128k_r1 16 131072 1024 1 new-chunks
b16_l128k_r2 16 131072 1024 2 new-chunks
b16_l128k_r4 16 131072 1024 4 new-chunks
b2_l1m_r1b 2 1048576 4096 1 new-chunks
b2_l1m_r4b 2 1048576 4096 4 new-chunks"}
while read -r name batch ctx k r check; do
  [ -n "$name" ] || continue
  timeout 200 "$B/cisa" bench model --synthetic qwen2.5-7b --backend cuda --attention cisa \
    --batch "$batch" --context "$ctx" --fill random --budget "$k" --window 128 --tokens "${TOKENS:-128}" \
    --reuse-steps "$r" --reuse-check "$check" --json >"$OUT/bench_$name.json" 2>"$OUT/bench_$name.log"
  log "bench $name rc=$?"
  summary "$OUT/bench_$name.json"
done <<<"$ROWS"

if [ -z "${NO_LAYER:-}" ]; then
  mkdir -p /tmp/reuse_lists
  timeout 200 "$B/cisa" bench layer --backend cuda --phase decode --dump-lists /tmp/reuse_lists \
    --json >"$OUT/layer.json" 2>"$OUT/layer.log"
  log "layer rc=$?"
  grep -E "decode" "$OUT/layer.log" | tee -a "$OUT/session.log"
  timeout 200 python3 bench/python/anchors_layer.py --lists /tmp/reuse_lists --cisa "$OUT/layer.json" \
    --out "$OUT/layer_results.json" --gather-geometries 4:1 --no-flex >"$OUT/anchors.log" 2>&1
  log "anchors rc=$?"
  tail -30 "$OUT/anchors.log" | tee -a "$OUT/session.log"
fi
log done
# Everything but the session log in one file (the device returns a limited number of files).
(cd "$OUT" && tar czf results.tgz --exclude results.tgz --exclude session.log ./*) && \
  find "$OUT" -mindepth 1 ! -name results.tgz ! -name session.log -delete
