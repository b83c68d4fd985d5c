#!/usr/bin/env bash
# One device call for the decode work of issue 15, with binaries built on the CPU machine (see
# gpu_prebuilt_session.sh for how to pack .devbin/bins.tar.xz): every CUDA test binary and the
# probes (PROBES), then `cisa bench layer --phase decode` with native and int8 representatives
# (page lists of the int8 run dumped) and the PyTorch decode anchors in the same call, then the
# whole-model decode rows of gpu_prebuilt_session.sh (NEW_ARGS against BASE_ARGS, one binary).
# Everything comes back under $OUT as summary.log and all.tgz, which holds tests/ and model/
# (gpu_prebuilt_session.sh's session.log, gpu_tests.log, results.tgz) and layer/
# (layer_<precision>[_<rep>].json/.log, anchors.json/.log).
# With a base binary (BASE_XZ, default .devbin/base/cisa.xz), its decode rows (the precisions in
# BASE_PRECS, default int8) run after ours in every repetition (layer_base_<precision>_<rep>.json):
# an A/B on the same machine. AB_SETS: ';'-separated option sets of `cisa bench layer` run with our
# binary at int8 after those, in every repetition (layer_int8_set<i>_<rep>.json). LAYER_REPS
# (default 1) repeats the layer rows; NO_MODEL=1 skips the whole-model rows. BASE2_XZ: a second
# base binary, run at int8 after the first in every repetition (layer_base2_int8_<rep>.json).
# Run on the device (carry .devbin):
#   CISA_COMMIT=<label> PROBES=bench/score_read_probe NEW_ARGS="..." BASE_ARGS="..." \
#     bash bench/scripts/gpu_decode_session.sh
set -u
O=${OUT:-$PWD/gpu-decode-out}
mkdir -p "$O/tests" "$O/layer" "$O/model"
export BASE_SAME=1 NO_NCU=1 NO_LAYER=1
OUT=$O/tests REPS=0 bash bench/scripts/gpu_prebuilt_session.sh
B=/tmp/prebuilt_bins L=$O/layer
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
rm -rf /tmp/decode_lists && mkdir -p /tmp/decode_lists
BASE=
if [ -f "${BASE_XZ:-.devbin/base/cisa.xz}" ]; then
  xz -dc "${BASE_XZ:-.devbin/base/cisa.xz}" >"$B/cisa_base" && chmod +x "$B/cisa_base" && BASE=$B/cisa_base
fi
BASE2=
if [ -n "${BASE2_XZ:-}" ] && [ -f "$BASE2_XZ" ]; then
  xz -dc "$BASE2_XZ" >"$B/cisa_base2" && chmod +x "$B/cisa_base2" && BASE2=$B/cisa_base2
fi
IFS=';' read -r -a sets <<<"${AB_SETS:-}"
for rep in $(seq "${LAYER_REPS:-1}"); do
  sfx=; [ "$rep" -gt 1 ] && sfx=_$rep
  runs=(native int8)
  [ -n "$BASE" ] && for bp in ${BASE_PRECS:-int8}; do runs+=("base:$bp"); done
  [ -n "$BASE2" ] && runs+=("base2:int8")
  for i in "${!sets[@]}"; do runs+=("set:$i"); done
  for r in "${runs[@]}"; do
    X=$B/cisa prec=$r dump=() extra=() name=layer_$r$sfx
    case $r in
      base:*) X=$BASE prec=${r#base:} name=layer_base_${r#base:}_$rep ;;
      base2:*) X=$BASE2 prec=int8 name=layer_base2_int8_$rep ;;
      set:*) prec=int8 name=layer_int8_set${r#set:}_$rep
        read -r -a extra <<<"${sets[${r#set:}]}" ;;
    esac
    [ "$r" = int8 ] && [ "$rep" = 1 ] && dump=(--dump-lists /tmp/decode_lists)
    timeout 150 "$X" bench layer --backend cuda --json --phase decode --rep-precision "$prec" \
      "${dump[@]}" "${extra[@]}" >"$L/$name.json" 2>"$L/$name.log"
    rc=$?  # before the date's command substitution below resets $?
    echo "[$(date +%H:%M:%S)] $name (${extra[*]}) rc=$rc" | tee -a "$L/session.log"
    grep -E "cisa G=1|cisa r=8|clusters of" "$L/$name.log" | tee -a "$L/session.log"
  done
done
PYTHONUNBUFFERED=1 timeout 240 python3 bench/python/anchors_layer.py --commit "${CISA_COMMIT:-unknown}" \
  --lists /tmp/decode_lists --cisa "$L/layer_int8.json" --out "$L/anchors.json" --no-flex \
  --gather-geometries none >"$L/anchors.log" 2>&1
rc=$?
echo "[$(date +%H:%M:%S)] anchors rc=$rc" | tee -a "$L/session.log"
[ -n "${NO_MODEL:-}" ] || OUT=$O/model TESTS=" " PROBES="" REPS=${REPS:-1} TOKENS=${TOKENS:-128} \
  bash bench/scripts/gpu_prebuilt_session.sh
# The device returns only a few files a call: everything goes into one archive beside one summary.
cat "$O"/tests/session.log "$O"/layer/session.log "$O"/layer/anchors.log "$O"/model/session.log \
  >"$O/summary.log" 2>/dev/null
(cd "$O" && tar czf /tmp/gpu_decode_all.tgz tests layer model && rm -rf tests layer model &&
  mv /tmp/gpu_decode_all.tgz all.tgz)
