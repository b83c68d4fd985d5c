#!/usr/bin/env bash
# `cisa eval --backend cuda` at scale on the H200 (issue 14): the models and the source reach the
# device in <= 64 MiB pieces over consecutive calls of one warm machine, the build runs in the
# background while the pieces arrive, and the evaluation runs in the background across calls; each
# call returns what has finished so far. Nothing here is needed to run `cisa eval` elsewhere.
#
# Here (the machine without a GPU), once:
#   git archive --format=tar.gz HEAD >.stage/src.tgz      # the committed tree, not a dirty one
#   tar czf .stage/texts.tgz -C .cache eval_texts          # haystacks (scripts/eval_texts.py)
#   cat models/gemma-3-270m-q4_k_m.gguf models/SmolLM2-135M-Instruct.Q4_1.gguf |
#     split -b 51000000 -d -a 1 - .stage/part               # part0 … part6
# (.stage is in .git/info/exclude.) On the device, one call each, within the idle release:
#   bash bench/scripts/gpu_eval_session.sh start   # carry .stage/src.tgz .stage/texts.tgz .devdeps
#                                                  #   .stage/part0: unpack, build in background
#   bash bench/scripts/gpu_eval_session.sh part    # carry .stage/partN (N = 1 … 6)
#   bash bench/scripts/gpu_eval_session.sh eval    # models checked (sha256), PLAN started in the
#                                                  #   background; waits, returns results so far
#   bash bench/scripts/gpu_eval_session.sh wait    # waits again (WAIT_S), returns results so far
# MODELS=gemma: the parts hold Gemma 3 270M alone (split models/gemma-3-270m-q4_k_m.gguf only).
# SEED_RUN=DIR: before the runs start, copy the committed run directory DIR (its results.jsonl
# and run.json) to /tmp/cisa_eval/runs/<its name without "h200-">, so that a plan line with
# --resume adds to it instead of running it again.
# Environment: CISA_COMMIT (recorded), PLAN (a file of `cisa eval` argument lines, one run per
# line, run in order; default bench/eval/plan_h200.txt), WAIT_S (seconds a call waits for the
# background runs, default 540), RUN_TESTS (a ctest regex run after the build, e.g. a GPU test).
# Results under $OUT: runs.tgz (every run directory: results.jsonl, run.json, summary.md),
# progress.log (the runs' stderr), session.log, build.log's tail, nvidia-smi.txt.
set -uo pipefail
mode=${1:-}
OUT=${OUT:-$PWD/eval-out}
mkdir -p "$OUT"
root=$(cd "$(dirname "$0")/../.." && pwd)
S=/tmp/cisa_eval            # survives between calls while the machine stays warm
mkdir -p "$S/stage" "$S/runs"
t0=$(date +%s)
WAIT_S=${WAIT_S:-540}
MODELS=${MODELS:-all}  # all: the parts hold Gemma then SmolLM2; gemma: Gemma alone
log() { echo "[gpu_eval $(date +%H:%M:%S) +$(($(date +%s) - t0))s] $*" | tee -a "$S/session.log"; }
collect() {
  cp "$S/session.log" "$OUT/" 2>/dev/null
  tail -40 "$S/build.log" >"$OUT/build_tail.log" 2>/dev/null
  cp "$S/progress.log" "$OUT/" 2>/dev/null
  [ -f "$S/tests.log" ] && cp "$S/tests.log" "$OUT/"
  tar czf "$OUT/runs.tgz" -C "$S" runs 2>/dev/null
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
}
take_parts() {
  for f in "$root"/.stage/part*; do
    [ -f "$f" ] || continue
    cp "$f" "$S/stage/" && log "staged $(basename "$f") ($(stat -c %s "$f") bytes)"
  done
}

case "$mode" in
  start)
    log "start: commit=${CISA_COMMIT:-unknown}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$S/session.log"
    rm -rf "$S/src" && mkdir -p "$S/src" && tar xzf "$root/.stage/src.tgz" -C "$S/src" || exit 1
    tar xzf "$root/.stage/texts.tgz" -C "$S" || exit 1
    [ -d "$root/.devdeps" ] && cp -r "$root/.devdeps" "$S/src/"
    take_parts
    # The build outlives this call (its own session); `eval` waits for it.
    (cd "$S/src" && setsid bash -c "cmake --preset cuda -DCISA_BUILD_BENCH=OFF >'$S/build.log' 2>&1 &&
       cmake --build build/cuda -j16 >>'$S/build.log' 2>&1; echo \$? >'$S/build.rc'" \
       </dev/null >/dev/null 2>&1 &)
    log "build started in the background"
    ;;
  part)
    take_parts
    ;;
  eval | wait)
    take_parts
    if [ ! -f "$S/build.rc" ]; then
      log "waiting for the build"
      while [ ! -f "$S/build.rc" ] && [ $(($(date +%s) - t0)) -lt 400 ]; do sleep 5; done
    fi
    rc=$(cat "$S/build.rc" 2>/dev/null || echo none)
    log "build rc=$rc"
    if [ "$rc" != 0 ]; then grep -E "error|FAILED" "$S/build.log" | head -20; collect; exit 1; fi
    cisa=$S/src/build/cuda/cisa
    if [ "$mode" = eval ] && [ ! -f "$S/models.ok" ]; then
      cat "$S"/stage/part? >"$S/blob" && mkdir -p "$S/models" &&
        head -c 253113024 "$S/blob" >"$S/models/gemma-3-270m-q4_k_m.gguf" &&
        if [ "$MODELS" = all ]; then
          tail -c +253113025 "$S/blob" >"$S/models/SmolLM2-135M-Instruct.Q4_1.gguf"
        fi && rm -f "$S/blob"
      sums="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  gemma-3-270m-q4_k_m.gguf"
      [ "$MODELS" = all ] && sums="$sums
b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  SmolLM2-135M-Instruct.Q4_1.gguf"
      (cd "$S/models" && echo "$sums" | sha256sum -c -) | tee -a "$S/session.log" && touch "$S/models.ok"
      [ -f "$S/models.ok" ] || { log "model check failed"; collect; exit 1; }
      mkdir -p "$S/src/models" && ln -sf "$S"/models/*.gguf "$S/src/models/"
    fi
    if [ "$mode" = eval ] && [ -n "${RUN_TESTS:-}" ]; then
      log "ctest -R '$RUN_TESTS'"
      (cd "$S/src" && timeout 240 ctest --test-dir build/cuda -R "$RUN_TESTS" --output-on-failure \
        --timeout 200) >"$S/tests.log" 2>&1
      log "tests rc=$? $(grep -E 'tests passed|tests failed' "$S/tests.log" | tail -1)"
    fi
    if [ "$mode" = eval ] && [ ! -f "$S/runner.started" ] && [ -n "${SEED_RUN:-}" ]; then
      seed_to="$S/runs/$(basename "$SEED_RUN" | sed 's/^h200-//')"
      mkdir -p "$seed_to" && cp "$root/$SEED_RUN"/results.jsonl "$root/$SEED_RUN"/run.json "$seed_to/" &&
        log "seeded $seed_to from $SEED_RUN ($(wc -l <"$seed_to/results.jsonl") results)"
    fi
    if [ "$mode" = eval ] && [ ! -f "$S/runner.started" ]; then
      plan=${PLAN:-$root/bench/eval/plan_h200.txt}
      cp "$plan" "$S/plan.txt"
      touch "$S/runner.started"
      # One run per plan line, in order; each line's arguments follow `cisa eval`.
      cat >"$S/runner.sh" <<EOF
cd "$S/src"
while IFS= read -r line; do
  case "\$line" in '' | '#'*) continue ;; esac
  echo "=== \$(date +%H:%M:%S) cisa eval \$line" >>"$S/progress.log"
  eval "$cisa eval --backend cuda --texts $S/eval_texts \$line" >>"$S/progress.log" 2>&1
  echo "=== rc=\$?" >>"$S/progress.log"
done <"$S/plan.txt"
touch "$S/runner.done"
EOF
      setsid bash "$S/runner.sh" </dev/null >/dev/null 2>&1 &
      log "runner started: $(grep -cv '^#\|^$' "$S/plan.txt") runs"
    fi
    while [ ! -f "$S/runner.done" ] && [ $(($(date +%s) - t0)) -lt "$WAIT_S" ]; do sleep 10; done
    log "$( [ -f "$S/runner.done" ] && echo 'all runs done' || echo 'runs continue in the background')"
    grep -E "^\[" "$S/progress.log" | tail -3
    collect
    ;;
  *)
    echo "usage: gpu_eval_session.sh start|part|eval|wait" >&2
    exit 2
    ;;
esac
