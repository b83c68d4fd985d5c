#!/usr/bin/env bash
# The whole model on the GPU (docs/bench-model.md), one device call per mode: build with the cuda
# preset and run the GPU tests; `cisa bench model`'s fixed-output protocol (dense against CISA,
# synthetic Qwen2.5-7B shape) over a grid of (batch, context); the transformers/SDPA anchor at the
# contexts it can run. Every result is a JSON file under $OUT. Every stage runs under `timeout`,
# cut to what is left of DEADLINE_S (default 570 s from the script's start), and a stage with less
# than 30 s left is skipped with a message, so one mode never outlives a 10-minute call.
#
#   OUT=/tmp/out bash scripts/gpu_model_session.sh tests    # call 1: build + GPU tests (~6-9 min cold)
#   OUT=/tmp/out bash scripts/gpu_model_session.sh bench    # call 2: the grid (build/cuda kept warm)
#   OUT=/tmp/out bash scripts/gpu_model_session.sh anchor   # call 3: the transformers anchor
#   OUT=/tmp/out bash scripts/gpu_model_session.sh graphs   # step graphs: build what they need,
#       their GPU test, then the two goal rows (16 x 128K, 2 x 1M) and B = 1 at 1K with
#       --cuda-graphs on and off (same binary, same call), then the other CUDA backend tests
#   OUT=/tmp/out bash scripts/gpu_model_session.sh profile  # build cisa (and PROFILE_TARGETS,
#       tests that are then run); per row (16 x 128K, 2 x 1M, 1 x 1K): the bench with graphs on,
#       then ncu kernel times of one dense and one CISA decode step (--profile-step 2, graphs
#       off; NO_NCU=1 skips it) summed by bench/python/ncu_step_summary.py
#   python3 bench/python/plot_model_throughput.py $OUT -o throughput.png
#
# Modes: build, tests (build + tests), bench, anchor, graphs, profile, all (everything; needs DEADLINE_S
# raised).
# Environment: CISA_COMMIT (recorded in every JSON; default git rev-parse, which on the device machine
# can name the session's starting commit rather than the tree sent: pass it), MODEL (default
# qwen2.5-7b), TOKENS (default 32), SKIP_BUILD=1 (use build/cuda as it is), DEADLINE_S, GRID
# (space-separated row names of the grid below to run only those), NCU_PROFILE=1 (graphs mode:
# ncu kernel times of a 16 x 128K CISA run).
set -uo pipefail
mode=${1:-all}
case "$mode" in all | build | tests | bench | anchor | graphs | profile) ;; *) echo "gpu_model_session.sh: unknown mode '$mode' (all, build, tests, bench, anchor, graphs, profile)" >&2; exit 2 ;; esac
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
MODEL=${MODEL:-qwen2.5-7b}
TOKENS=${TOKENS:-32}
export CISA_COMMIT=${CISA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
t_start=$(date +%s)
DEADLINE_S=${DEADLINE_S:-570}
# bounded SECONDS CMD...: runs CMD under timeout min(SECONDS, what is left of the deadline).
bounded() {
  local want=$1 left
  shift
  left=$((DEADLINE_S - ($(date +%s) - t_start)))
  if [ "$left" -lt 30 ]; then log "skipped (deadline: ${left}s left): $*"; return 124; fi
  [ "$want" -gt "$left" ] && want=$left
  timeout "$want" "$@"
}
log() { echo "[gpu_model_session $(date +%H:%M:%S) +$(($(date +%s) - t_start))s] $*" | tee -a "$OUT/session.log"; }
cisa=build/cuda/cisa
# build_targets SECONDS TARGET...: configure the cuda preset and build only those targets; exits
# the script on a failed build.
build_targets() {
  local limit=$1
  shift
  log "configure + build ($*)"
  bounded "$limit" bash -c 'cmake --preset cuda -DCISA_BUILD_BENCH=OFF >/dev/null && cmake --build build/cuda -j16 --target "$@"' _ "$@" \
    >"$OUT/build.log" 2>&1
  local rc=$?
  tail -3 "$OUT/build.log"
  if [ $rc -ne 0 ]; then log "BUILD FAILED rc=$rc"; grep -E "error|FAILED" "$OUT/build.log" | head -20; exit 1; fi
}

log "mode=$mode commit=$CISA_COMMIT model=$MODEL tokens=$TOKENS"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 | tee -a "$OUT/session.log"

# ---- build: the cuda preset (sm_90a), 16 cores, ~4 minutes cold -----------------------------------
if [ "$mode" = all ] || [ "$mode" = build ] || [ "$mode" = tests ]; then
  if [ -z "${SKIP_BUILD:-}" ]; then
    log "configure + build (cmake --preset cuda)"
    bounded 420 bash -c 'cmake --preset cuda -DCISA_BUILD_BENCH=OFF && cmake --build build/cuda -j16' \
      >"$OUT/build.log" 2>&1
    rc=$?
    tail -3 "$OUT/build.log"
    if [ $rc -ne 0 ]; then log "BUILD FAILED rc=$rc"; grep -E "error|FAILED" "$OUT/build.log" | head -20; exit 1; fi
  fi
fi
if [ "$mode" != anchor ] && [ "$mode" != graphs ] && [ "$mode" != profile ]; then
  [ -x "$cisa" ] || { log "no $cisa: run the build stage first"; exit 1; }
fi

# ---- GPU tests ----------------------------------------------------------------------------------
if [ "$mode" = all ] || [ "$mode" = tests ]; then
  log "GPU tests (ctest -L gpu)"
  bounded 240 ctest --test-dir build/cuda -L gpu --output-on-failure --timeout 120 >"$OUT/gpu_tests.log" 2>&1
  log "ctest rc=$? $(grep -E 'tests passed|tests failed' "$OUT/gpu_tests.log" | tail -1)"
  grep -E "Failed|\*\*\*" "$OUT/gpu_tests.log" | head -20
fi

# ---- the bench grid: dense vs CISA in each invocation --------------------------------------------
# name batch context budget window qshare fill timeout_s
grid=(
  "b16_l4k     16   4096 1024 128 16 prompt 150"
  "b16_l16k    16  16384 1024 128 16 prompt 200"
  "b16_l32k    16  32768 1024 128 16 random 150"
  "b16_l64k    16  65536 1024 128 16 random 200"
  "b16_l128k   16 131072 1024 128 16 random 300"
  "b2_l256k     2 262144 4096 128 16 random 200"
  "b2_l1m       2 1048576 4096 128 16 random 420"
)
if [ "$mode" = all ] || [ "$mode" = bench ]; then
  for row in "${grid[@]}"; do
    read -r name B L K W G fill tmo <<<"$row"
    if [ -n "${GRID:-}" ] && [[ " $GRID " != *" $name "* ]]; then continue; fi
    log "bench $name: B=$B L=$L k=$K W=$W G=$G fill=$fill (timeout ${tmo}s)"
    bounded "$tmo" "$cisa" bench model --synthetic "$MODEL" --backend cuda --attention cisa \
      --batch "$B" --context "$L" --tokens "$TOKENS" --fill "$fill" --budget "$K" --window "$W" \
      --qshare "$G" --prefill-block 4096 --json >"$OUT/model_${MODEL}_${name}.json" 2>"$OUT/model_${MODEL}_${name}.log"
    rc=$?
    log "bench $name rc=$rc"
    [ $rc -eq 0 ] || { tail -5 "$OUT/model_${MODEL}_${name}.log"; rm -f "$OUT/model_${MODEL}_${name}.json"; }
    python3 - "$OUT/model_${MODEL}_${name}.json" <<'EOF' 2>/dev/null | tee -a "$OUT/session.log"
import json, sys
j = json.load(open(sys.argv[1]))
for m, r in j["runs"].items():
    print(f"  {m:6s} decode {r['decode_tok_s']:.1f} tok/s, step {r['decode_step_ms_median']:.2f} ms, "
          f"floor {r['roofline']['floor_ms']:.2f} ms ({r['roofline']['percent_of_roofline']:.0f}% of roofline), TTFT {r['ttft_s']}")
if "cisa_vs_dense" in j: print("  cisa/dense decode %.2fx" % j["cisa_vs_dense"]["decode_speedup"])
EOF
  done
fi

# ---- the transformers/SDPA anchor on the same shape ---------------------------------------------
if [ "$mode" = all ] || [ "$mode" = anchor ]; then
  log "HF anchor (prompt prefill, small contexts)"
  bounded 200 python3 bench/python/hf_model_anchor.py --model "$MODEL" --batch 16 --context 4096 16384 \
    --tokens "$TOKENS" --fill prompt --time-limit 150 >"$OUT/hf_${MODEL}_prompt.jsonl" 2>"$OUT/hf_${MODEL}_prompt.log"
  log "HF anchor prompt rc=$?"
  log "HF anchor (random K/V, the bench grid's random-fill contexts)"
  bounded 220 python3 bench/python/hf_model_anchor.py --model "$MODEL" --batch 16 --context 32768 65536 131072 \
    --tokens "$TOKENS" --fill random --time-limit 170 >"$OUT/hf_${MODEL}_random_b16.jsonl" 2>"$OUT/hf_${MODEL}_random_b16.log"
  log "HF anchor random B=16 rc=$?"
  bounded 140 python3 bench/python/hf_model_anchor.py --model "$MODEL" --batch 2 --context 262144 1048576 \
    --tokens "$TOKENS" --fill random --time-limit 100 >"$OUT/hf_${MODEL}_random_b2.jsonl" 2>"$OUT/hf_${MODEL}_random_b2.log"
  log "HF anchor random B=2 rc=$?"
  cat "$OUT"/hf_"${MODEL}"_*.jsonl | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if r.get("header"): continue
    print("  HF B=%s L=%s %s: %s" % (r["batch"], r["context"], r["fill"],
          r.get("error") or "decode %.1f tok/s, TTFT %s" % (r["decode_tok_s"], r.get("ttft_ms"))))' | tee -a "$OUT/session.log"
fi
# ---- step graphs: only the targets they need, their test, the goal rows with graphs on and off ----
if [ "$mode" = graphs ]; then
  if [ -z "${SKIP_BUILD:-}" ]; then
    build_targets 330 cisa cuda_step_graph_test cuda_backend_test cuda_backend_kv_test cuda_attention_test cuda_decode_attention_test cuda_select_test
  fi
  log "step-graph test"
  bounded 120 build/cuda/tests/cuda_step_graph_test >"$OUT/gpu_tests.log" 2>&1
  log "cuda_step_graph_test rc=$?"
  grep -E "graphs off|OK \]|FAILED|Failure|differ" "$OUT/gpu_tests.log" | head -20
  # name batch context budget window graphs
  ggrid=(
    "b16_l128k_on   16  131072 1024 128 on"
    "b2_l1m_on       2 1048576 4096 128 on"
    "b16_l128k_off  16  131072 1024 128 off"
    "b2_l1m_off      2 1048576 4096 128 off"
    "b1_l1k_on       1    1024 1024 128 on"
    "b1_l1k_off      1    1024 1024 128 off"
  )
  for row in "${ggrid[@]}"; do
    read -r name B L K W graphs <<<"$row"
    if [ -n "${GRID:-}" ] && [[ " $GRID " != *" $name "* ]]; then continue; fi
    log "bench $name: B=$B L=$L k=$K W=$W --cuda-graphs $graphs"
    bounded 150 "$cisa" bench model --synthetic "$MODEL" --backend cuda --attention cisa \
      --batch "$B" --context "$L" --tokens "$TOKENS" --fill random --budget "$K" --window "$W" \
      --cuda-graphs "$graphs" --json >"$OUT/graphs_${name}.json" 2>"$OUT/graphs_${name}.log"
    rc=$?
    log "bench $name rc=$rc"
    [ $rc -eq 0 ] || { tail -5 "$OUT/graphs_${name}.log"; rm -f "$OUT/graphs_${name}.json"; }
    python3 - "$OUT/graphs_${name}.json" <<'EOF' 2>/dev/null | tee -a "$OUT/session.log"
import json, sys
j = json.load(open(sys.argv[1]))
for m, r in j["runs"].items():
    g = r.get("cuda_graphs", {})
    print(f"  {m:6s} step {r['decode_step_ms_median']:.2f} ms, floor {r['roofline']['floor_ms']:.2f} ms, "
          f"graphs {g.get('enabled')} (eager {g.get('eager_steps')}, captured {g.get('captured_steps')}, "
          f"replayed {g.get('replayed_steps')})")
if "cisa_vs_dense" in j: print("  cisa/dense decode %.2fx" % j["cisa_vs_dense"]["decode_speedup"])
EOF
  done
  log "other CUDA backend tests"
  for t in cuda_backend_test cuda_backend_kv_test cuda_attention_test cuda_decode_attention_test cuda_select_test; do
    bounded 90 "build/cuda/tests/$t" >>"$OUT/gpu_tests.log" 2>&1
    log "$t rc=$?"
  done
  grep -E "PASSED|FAILED" "$OUT/gpu_tests.log" | tee -a "$OUT/session.log"
  if [ -n "${NCU_PROFILE:-}" ]; then
    # Kernel times of a CISA decode step (16 x 128K, k = 1024, W = 128, graphs on), each kernel
    # alone: ncu's gpu__time_duration for every launch of the run (clocks and caches as found);
    # the last complete step is the launches between the last two argmax kernels.
    log "ncu kernel times (16 x 128K CISA, 3 decode steps)"
    bounded 150 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
      "$cisa" bench model --synthetic "$MODEL" --backend cuda --attention cisa --batch 16 \
      --context 131072 --tokens 3 --fill random --budget 1024 --window 128 --json \
      >"$OUT/ncu_b16_l128k.csv" 2>"$OUT/ncu_b16_l128k.log"
    log "ncu rc=$? $(wc -l <"$OUT/ncu_b16_l128k.csv") lines"
    gzip -f "$OUT/ncu_b16_l128k.csv"
  fi
  # A device call brings back at most 8 files: everything of this mode in one archive.
  (cd "$OUT" && tar czf /tmp/graphs_all.tgz . && rm -f ./*.json ./*.log ./*.gz && mv /tmp/graphs_all.tgz .)
fi
# ---- profile: where a decode step's device time goes, kernel by kernel ----------------------------
if [ "$mode" = profile ]; then
  if [ -z "${SKIP_BUILD:-}" ]; then
    # shellcheck disable=SC2086
    build_targets 360 cisa ${PROFILE_TARGETS:-}
  fi
  # AB_SRC=tree.tgz (e.g. `git archive --format=tar.gz BASE`): that tree's cisa is built too, and
  # every row's bench runs with it right after ours (bench_base_*.json), in the same call.
  base_cisa=
  if [ -n "${AB_SRC:-}" ]; then
    log "configure + build the base tree's cisa ($AB_SRC)"
    rm -rf /tmp/ab_base && mkdir -p /tmp/ab_base && tar xzf "$AB_SRC" -C /tmp/ab_base
    [ -d .devdeps ] && cp -r .devdeps /tmp/ab_base/
    if bounded 300 bash -c "cd /tmp/ab_base && cmake --preset cuda -DCISA_BUILD_BENCH=OFF -DCISA_BUILD_TESTS=OFF >/dev/null && cmake --build build/cuda -j16 --target cisa" >"$OUT/build_base.log" 2>&1; then
      base_cisa=/tmp/ab_base/build/cuda/cisa
    else
      log "base build failed"; tail -5 "$OUT/build_base.log"
    fi
  fi
  for t in ${PROFILE_TARGETS:-}; do
    log "test $t"
    bounded 120 "build/cuda/tests/$t" >>"$OUT/gpu_tests.log" 2>&1
    log "$t rc=$? $(grep -E "PASSED|FAILED" "$OUT/gpu_tests.log" | tail -1)"
  done
  # name batch context budget window
  pgrid=(
    "b16_l128k  16  131072 1024 128"
    "b2_l1m      2 1048576 4096 128"
    "b1_l1k      1    1024 1024 128"
  )
  for row in "${pgrid[@]}"; do
    read -r name B L K W <<<"$row"
    if [ -n "${GRID:-}" ] && [[ " $GRID " != *" $name "* ]]; then continue; fi
    args=(bench model --synthetic "$MODEL" --backend cuda --attention cisa --batch "$B" --context "$L"
          --fill random --budget "$K" --window "$W")
    log "bench $name (graphs on, $TOKENS tokens)"
    bounded 150 "$cisa" "${args[@]}" --tokens "$TOKENS" --json >"$OUT/bench_${name}.json" 2>"$OUT/bench_${name}.log"
    log "bench $name rc=$?"
    if [ -n "$base_cisa" ]; then
      log "bench $name with the base tree's cisa"
      bounded 150 "$base_cisa" "${args[@]}" --tokens "$TOKENS" --json >"$OUT/bench_base_${name}.json" 2>"$OUT/bench_base_${name}.log"
      log "bench base $name rc=$?"
    fi
    for f in "$OUT/bench_${name}.json" "$OUT/bench_base_${name}.json"; do
      [ -f "$f" ] || continue
      echo "  $(basename "$f"):" | tee -a "$OUT/session.log"
      python3 - "$f" <<'EOF' 2>/dev/null | tee -a "$OUT/session.log"
import json, sys
j = json.load(open(sys.argv[1]))
for m, r in j["runs"].items():
    print(f"  {m:6s} step {r['decode_step_ms_median']:.2f} ms, floor {r['roofline']['floor_ms']:.2f} ms")
if "cisa_vs_dense" in j: print("  cisa/dense decode %.2fx" % j["cisa_vs_dense"]["decode_speedup"])
EOF
    done
    [ -n "${NO_NCU:-}" ] && continue
    log "ncu $name (step 2 of 4, graphs off)"
    bounded 200 ncu --profile-from-start off --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum --csv "$cisa" "${args[@]}" --tokens 4 --cuda-graphs off \
      --profile-step 2 >"$OUT/ncu_${name}.csv" 2>"$OUT/ncu_${name}.log"
    log "ncu $name rc=$? $(wc -l <"$OUT/ncu_${name}.csv") lines"
    python3 bench/python/ncu_step_summary.py "$OUT/ncu_${name}.csv" --labels dense,cisa \
      --json "$OUT/ncu_${name}_summary.json" 2>&1 | tee "$OUT/ncu_${name}_summary.txt"
  done
  (cd "$OUT" && tar czf /tmp/profile_all.tgz . && rm -f ./*.json ./*.log ./*.csv ./*.txt && mv /tmp/profile_all.tgz .)
fi
log "done"
