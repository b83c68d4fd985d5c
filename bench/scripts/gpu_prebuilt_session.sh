#!/usr/bin/env bash
# One device call with binaries built on the CPU machine (no device build): GPU tests, the decode
# rows of `cisa bench model` with ours and a base binary alternated, ncu kernel times of one
# 2 x 1M decode step of each, and `cisa bench layer` with its PyTorch anchors. Everything under
# $OUT comes back in at most 3 files: session.log, gpu_tests.log and results.tgz.
#
# Here (the CPU machine), from a `ci`-preset build (nvcc, sm_90a):
#   mkdir -p .devbin/base
#   tar -C build/ci -cJf .devbin/bins.tar.xz cisa tests/cuda_select_test tests/cuda_model_ops_test \
#       tests/cuda_step_graph_test tests/cuda_backend_test tests/cuda_attention_test \
#       tests/cuda_decode_attention_test
#   xz -c <base build>/cisa > .devbin/base/cisa.xz            # optional: the A/B base
#   cp <cpp-httplib and brotli shared libraries> .devbin/      # what `cisa` links beside CUDA
# On the device (carry .devbin):
#   CISA_COMMIT=<label> REPS=2 bash bench/scripts/gpu_prebuilt_session.sh
# Environment: BINS (default .devbin/bins.tar.xz), BASE_XZ (default .devbin/base/cisa.xz; absent:
# no A/B), NEW_ARGS and BASE_ARGS (options added to the new and the base rows; BASE_SAME=1 makes
# the base the new binary itself, e.g. BASE_SAME=1 BASE_ARGS="--early-selection off": an A/B of
# one option in one binary), REPS (decode A/B repetitions, default 2), TOKENS (decode steps per
# row, default 32), NO_NCU=1, NO_LAYER=1, TESTS (names under tests/ in the tarball; default:
# every cuda_*_test in it), LAYER_AB_ARGS (more `bench layer` runs of the new binary, one per
# ';'-separated set of options, e.g. "--mma-unions --phase prefill --geometry 4:1;
# --topk-one-block --phase prefill"; run i's rows go to layer_ab<i>.json/.log), PROBES (probe
# binaries in the tarball, run after the tests, e.g. PROBES=bench/score_read_probe).
# Used for bench/results/model_h200_2026-12-03_topk/ and later folders.
set -u
OUT=${OUT:-$PWD/gpu-prebuilt-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/prebuilt_bins R=/tmp/prebuilt_results
rm -rf "$B" "$R" && mkdir -p "$B" "$R"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/session.log"; }
tar -C "$B" -xJf "${BINS:-.devbin/bins.tar.xz}" || { log "no binaries"; exit 1; }
NEW=$B/cisa BASE=
if [ -n "${BASE_SAME:-}" ]; then
  BASE=$NEW
elif [ -f "${BASE_XZ:-.devbin/base/cisa.xz}" ]; then
  xz -dc "${BASE_XZ:-.devbin/base/cisa.xz}" >"$B/cisa_base" && chmod +x "$B/cisa_base" && BASE=$B/cisa_base
fi
log "commit ${CISA_COMMIT:-unknown}; new options: ${NEW_ARGS:-none}; base binary: ${BASE:-none} ${BASE_ARGS:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$OUT/session.log"

for t in ${TESTS:-$(cd "$B/tests" && ls cuda_*_test)}; do
  echo "=== $t" >>"$OUT/gpu_tests.log"
  timeout 150 "$B/tests/$t" >>"$OUT/gpu_tests.log" 2>&1
  log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gpu_tests.log" | tail -1)"
done

# Standalone probes in the tarball (PROBES, e.g. "bench/score_read_probe"): each prints its own
# table, kept whole in probe_<name>.log and in the session log.
for p in ${PROBES:-}; do
  timeout 300 "$B/$p" >"$R/probe_$(basename "$p").log" 2>&1
  log "probe $p rc=$?"
  cat "$R/probe_$(basename "$p").log" >>"$OUT/session.log"
done

summary() { python3 bench/python/bench_model_line.py "$1" | tee -a "$OUT/session.log"; }
rows=("b2_l1m 2 1048576 4096" "b16_l128k 16 131072 1024")
for rep in $(seq "${REPS:-2}"); do
  for row in "${rows[@]}"; do
    read -r name batch ctx k <<<"$row"
    args=(bench model --synthetic qwen2.5-7b --backend cuda --attention cisa --batch "$batch"
          --context "$ctx" --fill random --budget "$k" --window 128 --tokens "${TOKENS:-32}" --json)
    for which in new base; do
      X=$NEW extra=()
      if [ "$which" = base ]; then X=$BASE; read -r -a extra <<<"${BASE_ARGS:-}"; else read -r -a extra <<<"${NEW_ARGS:-}"; fi
      [ -n "$X" ] || continue
      timeout 150 "$X" "${args[@]}" "${extra[@]}" >"$R/bench_${which}_${name}_r$rep.json" 2>"$R/bench_${which}_${name}_r$rep.log"
      log "bench $which $name rep $rep rc=$?"
      summary "$R/bench_${which}_${name}_r$rep.json"
    done
  done
done

if [ -z "${NO_NCU:-}" ] && command -v ncu >/dev/null; then
  for which in new base; do
    X=$NEW; [ "$which" = base ] && X=$BASE
    [ -n "$X" ] || continue
    timeout 200 ncu --profile-from-start off --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum --csv "$X" bench model --synthetic qwen2.5-7b --backend cuda \
      --attention cisa --batch 2 --context 1048576 --fill random --budget 4096 --window 128 \
      --tokens 4 --json --cuda-graphs off --profile-step 2 >"$R/ncu_${which}_b2_l1m.csv" 2>"$R/ncu_${which}_b2_l1m.log"
    log "ncu $which rc=$?"
    python3 bench/python/ncu_step_summary.py "$R/ncu_${which}_b2_l1m.csv" --labels dense,cisa \
      --json "$R/ncu_${which}_b2_l1m_summary.json" >"$R/ncu_${which}_b2_l1m_summary.txt" 2>&1
    gzip -f "$R/ncu_${which}_b2_l1m.csv"
  done
fi

if [ -z "${NO_LAYER:-}" ]; then
  mkdir -p /tmp/prebuilt_lists
  timeout 200 "$NEW" bench layer --backend cuda --json --dump-lists /tmp/prebuilt_lists \
    >"$R/layer_cisa.json" 2>"$R/layer_cisa.log"
  log "layer ours rc=$?"
  tail -25 "$R/layer_cisa.log" | tee -a "$OUT/session.log"
  if [ -n "${LAYER_AB_ARGS:-}" ]; then
    IFS=';' read -r -a sets <<<"$LAYER_AB_ARGS"
    for i in "${!sets[@]}"; do
      read -r -a ab <<<"${sets[$i]}"
      timeout 150 "$NEW" bench layer --backend cuda --json "${ab[@]}" >"$R/layer_ab$i.json" 2>"$R/layer_ab$i.log"
      log "layer ours with ${sets[$i]} rc=$?"
      tail -16 "$R/layer_ab$i.log" | tee -a "$OUT/session.log"
    done
  fi
  if [ -n "$BASE" ]; then
    timeout 150 "$BASE" bench layer --backend cuda --json >"$R/layer_cisa_base.json" 2>"$R/layer_cisa_base.log"
    log "layer base rc=$?"
  fi
  PYTHONUNBUFFERED=1 timeout 240 python3 bench/python/anchors_layer.py --commit "${CISA_COMMIT:-unknown}" \
    --lists /tmp/prebuilt_lists --cisa "$R/layer_cisa.json" --out "$R/layer_results.json" \
    --gather-geometries 4:1 >"$R/anchors.log" 2>&1
  log "anchors rc=$?"
  tail -40 "$R/anchors.log" | tee -a "$OUT/session.log"
fi
(cd "$R" && tar czf "$OUT/results.tgz" .)
log done
