#!/usr/bin/env bash
# `cisa serve --backend cuda` on the H200 (issue 13's serving measurement, docs/server.md): in ONE
# device call, build `cisa` with the cuda preset, start `cisa serve --synthetic MODEL --backend cuda
# --attention cisa` on 127.0.0.1 and drive it with `cisa bench serve` (fixed-output requests,
# ignore_eos): dense against CISA through the per-request "attention" / "cisa" body fields, one
# server for all passes. Synthetic weights: speed only.
#
#   OUT=/tmp/out CISA_COMMIT=$(git rev-parse --short HEAD) bash bench/scripts/gpu_serve_session.sh
#
# cpp-httplib: the device image has no libcpp-httplib-dev. Put upstream's single-header httplib.h
# (v0.11.4, the whole header; Debian's /usr/include/httplib.h is declarations only) in
# .devdeps/include (ignored by git) and carry .devdeps: CMakeLists.txt falls back to it when
# pkg-config finds no cpp-httplib. nlohmann-json is on the image.
#
# Every stage runs under `timeout`, cut to what is left of DEADLINE_S (default 570 s from the
# script's start); a pass that cannot finish in what is left is skipped with a message.
# Results: $OUT/summary.json (every pass's `cisa bench serve --json`, the CISA read fraction of
# each pass from /metrics, the ratios, commands, commit, machine), $OUT/session.log,
# $OUT/server.log, $OUT/build.log (its tail).
#
# Environment: MODEL (qwen2.5-7b), NUM_PROMPTS (16), INPUT_LEN (32768), OUTPUT_LEN (256),
# CONCURRENCY (8; also the server's --parallel), BUDGET (1024), WINDOW (128), QSHARE (16),
# ALT_BUDGET (512: a second CISA pass with this budget per request; 0: none),
# PREFILL_CHUNK (4096), PREFILL_BLOCK (4096), PORT (18080), REPEAT (1: repeat dense and CISA when
# time is left), PASS_EST (45: seconds a pass takes; skipped when less is left), SKIP_BUILD=1 (use CISA_BIN, default build/cuda/cisa, as it is), DEADLINE_S,
# CISA_COMMIT, TREE_NOTE, MIN_TOKEN_ID / MAX_TOKEN_ID (random prompt ids, default 1000 / 9999),
# BACKEND (cuda; cpu with THREADS for a dry run: MODEL=tiny-llama MAX_TOKEN_ID=255 BACKEND=cpu).
# A real model (the verbosity-adjusted speedup): MODEL_FILE (a GGUF; replaces --synthetic MODEL),
# PROMPT_FILE (text prompts, one per line: bench/serve/make_chat_prompts.py; INPUT_LEN then only
# sizes the context and should be the longest prompt's tokens), ENDPOINT (completions | chat),
# VERBOSITY=1 (two more passes, dense and CISA with --honor-eos: mean output lengths with EOS
# honoured, and the fixed-output speedup divided by their ratio). EOS_BODY: JSON members added to
# those two passes' request bodies, e.g. '"temperature": 0.7, "seed": 1' (greedy small models
# loop until max_tokens, so their lengths would measure the cap: docs/server.md). SERVE_ARGS: more
# `cisa serve` arguments (e.g. "--indexer indexers/smollm2-135m.cisaidx --sink-pages 1"). CPU dry run:
#   MODEL_FILE=models/SmolLM2-135M-Instruct.Q4_1.gguf PROMPT_FILE=/tmp/p.txt ENDPOINT=chat \
#   VERBOSITY=1 INPUT_LEN=1200 OUTPUT_LEN=64 NUM_PROMPTS=4 CONCURRENCY=4 BUDGET=8 WINDOW=4 \
#   QSHARE=4 ALT_BUDGET=0 REPEAT=0 BACKEND=cpu SKIP_BUILD=1 CISA_BIN=build/ci/cisa \
#   bash bench/scripts/gpu_serve_session.sh
set -uo pipefail
OUT=${OUT:-$PWD/serve-out}
mkdir -p "$OUT"
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
MODEL=${MODEL:-qwen2.5-7b}
NUM_PROMPTS=${NUM_PROMPTS:-16}
INPUT_LEN=${INPUT_LEN:-32768}
OUTPUT_LEN=${OUTPUT_LEN:-256}
CONCURRENCY=${CONCURRENCY:-8}
BUDGET=${BUDGET:-1024}
WINDOW=${WINDOW:-128}
QSHARE=${QSHARE:-16}
ALT_BUDGET=${ALT_BUDGET:-512}
PREFILL_CHUNK=${PREFILL_CHUNK:-4096}
PREFILL_BLOCK=${PREFILL_BLOCK:-4096}
PORT=${PORT:-18080}
REPEAT=${REPEAT:-1}
PASS_EST=${PASS_EST:-45}  # seconds one pass is expected to take: a pass is skipped when less is left
CONTEXT=$(((INPUT_LEN + OUTPUT_LEN + 511) / 256 * 256))
export CISA_COMMIT=${CISA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
TREE_NOTE=${TREE_NOTE:-}
MODEL_FILE=${MODEL_FILE:-}
t_start=$(date +%s)
DEADLINE_S=${DEADLINE_S:-570}
tmp=$(mktemp -d)
left() { echo $((DEADLINE_S - ($(date +%s) - t_start))); }
log() { echo "[gpu_serve_session $(date +%H:%M:%S) +$(($(date +%s) - t_start))s] $*" | tee -a "$OUT/session.log"; }
# bounded SECONDS CMD...: runs CMD under timeout min(SECONDS, what is left of the deadline - 10 s).
bounded() {
  local want=$1 l
  shift
  l=$(($(left) - 10))
  if [ "$l" -lt 20 ]; then log "skipped (deadline: ${l}s left): $*"; return 124; fi
  [ "$want" -gt "$l" ] && want=$l
  timeout "$want" "$@"
}
cisa=${CISA_BIN:-build/cuda/cisa}
BACKEND=${BACKEND:-cuda}
THREADS=${THREADS:-0}

log "commit=$CISA_COMMIT model=${MODEL_FILE:-$MODEL} requests=$NUM_PROMPTS input=$INPUT_LEN output=$OUTPUT_LEN concurrency=$CONCURRENCY context=$CONTEXT k=$BUDGET W=$WINDOW G=$QSHARE deadline=${DEADLINE_S}s"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$tmp/gpu.txt" 2>&1
cat "$tmp/gpu.txt" | tee -a "$OUT/session.log"

# ---- build: only `cisa` (~4 min cold on 16 cores) -------------------------------------------------
if [ -z "${SKIP_BUILD:-}" ]; then
  log "configure + build (cmake --preset cuda -DCISA_BUILD_BENCH=OFF; target cisa)"
  bounded 330 bash -c 'cmake --preset cuda -DCISA_BUILD_BENCH=OFF && cmake --build build/cuda -j16 --target cisa' \
    >"$tmp/build.log" 2>&1
  rc=$?
  grep -E "cisa:|error|FAILED" "$tmp/build.log" | head -40 >"$OUT/build.log"
  tail -40 "$tmp/build.log" >>"$OUT/build.log"
  if [ $rc -ne 0 ]; then log "BUILD FAILED rc=$rc"; grep -E "error|FAILED" "$tmp/build.log" | head -20; exit 1; fi
  log "built"
fi
[ -x "$cisa" ] || { log "no $cisa"; exit 1; }
"$cisa" serve --help >/dev/null 2>&1 || { log "this cisa has no serve (cpp-httplib not found at configure)"; exit 1; }

# ---- the server ------------------------------------------------------------------------------------
if [ -n "${MODEL_FILE:-}" ]; then model_args=(-m "$MODEL_FILE"); else model_args=(--synthetic "$MODEL"); fi
serve_cmd=("$cisa" serve "${model_args[@]}" --backend "$BACKEND" --threads "$THREADS" --attention cisa --budget "$BUDGET"
  --window "$WINDOW" --qshare "$QSHARE" --context "$CONTEXT" --parallel "$CONCURRENCY"
  --prefill-chunk "$PREFILL_CHUNK" --prefill-block "$PREFILL_BLOCK" --max-waiting 256
  --host 127.0.0.1 --port "$PORT")
# shellcheck disable=SC2206
[ -n "${SERVE_ARGS:-}" ] && serve_cmd+=(${SERVE_ARGS})
log "server: ${serve_cmd[*]}"
timeout -s INT $(($(left) - 5)) "${serve_cmd[@]}" >"$OUT/server.log" 2>&1 &
server_pid=$!
stop_server() { kill -INT "$server_pid" 2>/dev/null; sleep 2; kill -KILL "$server_pid" 2>/dev/null; }
trap stop_server EXIT
http_get() { python3 -c "import sys,urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT'+sys.argv[1], timeout=5).read().decode())" "$1"; }
t_load=$(date +%s)
until http_get /health >/dev/null 2>&1; do
  if ! kill -0 "$server_pid" 2>/dev/null; then log "the server exited:"; tail -5 "$OUT/server.log"; exit 1; fi
  if [ $(($(date +%s) - t_load)) -gt 180 ] || [ "$(left)" -lt 40 ]; then log "the server did not come up"; exit 1; fi
  sleep 1
done
log "server up after $(($(date +%s) - t_load)) s: $(head -1 "$OUT/server.log")"
http_get /v1/models >"$tmp/models.json"

# ---- passes ---------------------------------------------------------------------------------------
# pass NAME EXTRA_BODY N INPUT OUTPUT EST_S [ARGS...]: one `cisa bench serve`, with /metrics around
# it; ARGS go to bench serve (e.g. --honor-eos).
passes=()
prompt_args=()
[ -n "${PROMPT_FILE:-}" ] && prompt_args=(--prompt-file "$PROMPT_FILE" --endpoint "${ENDPOINT:-completions}")
pass() {
  local name=$1 extra=$2 n=$3 in=$4 outl=$5 est=$6
  shift 6
  if [ "$(left)" -lt $((est + 15)) ]; then log "pass $name skipped: ~${est}s needed, $(left)s left"; return; fi
  http_get /metrics >"$tmp/metrics_before_$name.txt" 2>/dev/null
  local cmd=("$cisa" bench serve --port "$PORT" --num-prompts "$n" --concurrency "$CONCURRENCY"
    --input-len "$in" --output-len "$outl" --min-token-id "${MIN_TOKEN_ID:-1000}"
    --max-token-id "${MAX_TOKEN_ID:-9999}" --seed 1 --timeout 400 --quiet --json --extra-body "$extra"
    "${prompt_args[@]}" "$@")
  log "pass $name: ${cmd[*]}"
  bounded $((est * 3)) "${cmd[@]}" >"$tmp/pass_$name.json" 2>"$tmp/pass_$name.err"
  local rc=$?
  http_get /metrics >"$tmp/metrics_after_$name.txt" 2>/dev/null
  printf '%s\n' "${cmd[*]}" >"$tmp/pass_$name.cmd"
  python3 - "$tmp/pass_$name.json" <<'EOF' | tee -a "$OUT/session.log"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(f"  ok {d['successful_requests']} failed {d['failed_requests']} {d.get('first_error', '')} "
          f"| total {d['total_token_throughput']:.0f} tok/s, output {d['output_throughput']:.1f} tok/s, "
          f"duration {d['duration_s']:.1f} s | TTFT mean {d['ttft']['mean_ms']:.0f} ms median "
          f"{d['ttft']['median_ms']:.0f} | TPOT mean {d['tpot']['mean_ms']:.1f} ms median {d['tpot']['median_ms']:.1f}")
except Exception as e:
    print("  no result:", e)
EOF
  [ $rc -ne 0 ] && log "  bench serve rc=$rc $(tail -2 "$tmp/pass_$name.err")"
  passes+=("$name")
}
# Warm-up: cuBLASLt's algorithm timing, first launches (not reported as a result).
warm_in=$((INPUT_LEN < 2048 ? INPUT_LEN / 2 : 1024))
pass warmup '{"attention": "dense"}' 2 "$warm_in" 8 20
pass warmup_cisa '{}' 2 "$warm_in" 8 20
pass dense '{"attention": "dense"}' "$NUM_PROMPTS" "$INPUT_LEN" "$OUTPUT_LEN" "$PASS_EST"
pass cisa '{}' "$NUM_PROMPTS" "$INPUT_LEN" "$OUTPUT_LEN" "$PASS_EST"
if [ "$ALT_BUDGET" -gt 0 ]; then
  pass "cisa_k$ALT_BUDGET" "{\"cisa\": {\"budget\": $ALT_BUDGET}}" "$NUM_PROMPTS" "$INPUT_LEN" "$OUTPUT_LEN" "$PASS_EST"
fi
if [ "${VERBOSITY:-0}" = 1 ]; then
  eos=${EOS_BODY:+, $EOS_BODY}
  pass dense_eos "{\"attention\": \"dense\"$eos}" "$NUM_PROMPTS" "$INPUT_LEN" "$OUTPUT_LEN" "$PASS_EST" --honor-eos
  pass cisa_eos "{${EOS_BODY:-}}" "$NUM_PROMPTS" "$INPUT_LEN" "$OUTPUT_LEN" "$PASS_EST" --honor-eos
fi
if [ "$REPEAT" = 1 ]; then
  pass dense_2 '{"attention": "dense"}' "$NUM_PROMPTS" "$INPUT_LEN" "$OUTPUT_LEN" "$PASS_EST"
  pass cisa_2 '{}' "$NUM_PROMPTS" "$INPUT_LEN" "$OUTPUT_LEN" "$PASS_EST"
fi
stop_server
trap - EXIT

# ---- summary --------------------------------------------------------------------------------------
python3 - "$tmp" "$OUT/summary.json" "${passes[*]}" <<EOF
import json, os, re, sys, datetime
tmp, out, names = sys.argv[1], sys.argv[2], sys.argv[3].split()
def metrics(path):
    m = {}
    try:
        for line in open(path):
            g = re.match(r'^(cisa_global_pages_(read|dense)_total) ([0-9.e+]+)', line)
            if g: m[g.group(1)] = float(g.group(3))
    except OSError:
        pass
    return m
gpu = open(os.path.join(tmp, "gpu.txt")).read().strip()
res = {"what": "cisa serve --backend $BACKEND, synthetic $MODEL (synthetic weights, speed only), "
               "driven by cisa bench serve: fixed-output requests (ignore_eos), dense vs CISA per request",
       "weights": "synthetic weights, speed only",
       "commit": "$CISA_COMMIT", "tree_note": "$TREE_NOTE",
       "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
       "machine": {"gpu": gpu, "cpus": os.cpu_count()},
       "server_command": "${serve_cmd[*]}",
       "protocol": {"num_prompts": $NUM_PROMPTS, "input_len": $INPUT_LEN, "output_len": $OUTPUT_LEN,
                    "concurrency": $CONCURRENCY, "context": $CONTEXT, "budget": $BUDGET,
                    "window": $WINDOW, "qshare": $QSHARE, "prefill_chunk": $PREFILL_CHUNK,
                    "prefill_block": $PREFILL_BLOCK, "eos_pass_body_members": '${EOS_BODY:-}',
                    "serve_args": '${SERVE_ARGS:-}'},
       "passes": {}}
try:
    res["server_models"] = json.load(open(os.path.join(tmp, "models.json")))
except Exception:
    pass
for n in names:
    p = {"command": open(os.path.join(tmp, f"pass_{n}.cmd")).read().strip()}
    try:
        p["result"] = json.load(open(os.path.join(tmp, f"pass_{n}.json")))
    except Exception as e:
        p["error"] = f"no JSON result: {e}"
    a, b = metrics(os.path.join(tmp, f"metrics_before_{n}.txt")), metrics(os.path.join(tmp, f"metrics_after_{n}.txt"))
    rd = b.get("cisa_global_pages_read_total", 0) - a.get("cisa_global_pages_read_total", 0)
    dn = b.get("cisa_global_pages_dense_total", 0) - a.get("cisa_global_pages_dense_total", 0)
    if dn > 0: p["global_pages_read_fraction"] = rd / dn
    res["passes"][n] = p
def r(n):
    return res["passes"].get(n, {}).get("result")
ratios = {}
for c, d in [("cisa", "dense"), ("cisa_2", "dense_2"), ("cisa_k$ALT_BUDGET", "dense")]:
    rc, rdn = r(c), r(d)
    if not rc or not rdn or rc.get("failed_requests") or rdn.get("failed_requests"): continue
    ratios[f"{c}/{d}"] = {
        "total_token_throughput": rc["total_token_throughput"] / rdn["total_token_throughput"],
        "output_throughput": rc["output_throughput"] / rdn["output_throughput"],
        "mean_ttft_dense_over_cisa": rdn["ttft"]["mean_ms"] / rc["ttft"]["mean_ms"],
        "mean_tpot_dense_over_cisa": rdn["tpot"]["mean_ms"] / rc["tpot"]["mean_ms"],
        "mean_output_tokens": [rc["total_output_tokens"] / max(1, rc["successful_requests"]),
                               rdn["total_output_tokens"] / max(1, rdn["successful_requests"])]}
res["ratios"] = ratios
res["verbosity_adjusted_speedup"] = (
    "undefined for synthetic weights: the synthetic model has no tokenizer and so no EOS token; "
    "every request runs to max_tokens whether or not EOS is honoured, so the ratio of mean output "
    "lengths with EOS honoured is not a property of this run (it needs a real model's outputs)")
if "$MODEL_FILE":
    res["weights"] = "real: $MODEL_FILE"
    res["what"] = res["what"].replace("synthetic $MODEL (synthetic weights, speed only)", "$MODEL_FILE")
    res["verbosity_adjusted_speedup"] = "needs VERBOSITY=1 (the dense_eos and cisa_eos passes)"
ce, de = r("cisa_eos"), r("dense_eos")
if "$MODEL_FILE" and ce and de and not ce.get("failed_requests") and not de.get("failed_requests"):
    mean_out = lambda x: x["total_output_tokens"] / max(1, x["successful_requests"])
    v = {"mean_output_tokens_cisa": mean_out(ce), "mean_output_tokens_dense": mean_out(de),
         "length_ratio_cisa_over_dense": mean_out(ce) / max(1e-9, mean_out(de))}
    if "cisa/dense" in ratios:
        s = ratios["cisa/dense"]["total_token_throughput"]
        v["fixed_output_speedup"] = s
        v["verbosity_adjusted_speedup"] = s / v["length_ratio_cisa_over_dense"]
    res["verbosity"] = v
    res["verbosity_adjusted_speedup"] = v.get("verbosity_adjusted_speedup", "no fixed-output cisa/dense ratio")
    print("verbosity:", json.dumps(v))
json.dump(res, open(out, "w"), indent=1)
for k, v in ratios.items():
    print(f"{k}: total token throughput x{v['total_token_throughput']:.3f}, output x{v['output_throughput']:.3f}, "
          f"TTFT dense/cisa x{v['mean_ttft_dense_over_cisa']:.3f}, TPOT dense/cisa x{v['mean_tpot_dense_over_cisa']:.3f}")
EOF
log "done: $OUT/summary.json"
