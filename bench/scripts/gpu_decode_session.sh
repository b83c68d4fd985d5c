#!/usr/bin/env bash
# One device call for the decode work of issue 15, with binaries built on the CPU machine (see
# gpu_prebuilt_session.sh for how to pack .devbin/bins.tar.xz): every CUDA test binary and the
# probes (PROBES), then `cisa bench layer --phase decode` with native and int8 representatives
# (page lists of the int8 run dumped) and the PyTorch decode anchors in the same call, then the
# whole-model decode rows of gpu_prebuilt_session.sh (NEW_ARGS against BASE_ARGS, one binary).
# Everything comes back under $OUT: tests/ and model/ (gpu_prebuilt_session.sh's session.log,
# gpu_tests.log, results.tgz) and layer/ (layer_<precision>.json/.log, anchors.json/.log).
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
for p in native int8; do
  dump=()
  [ "$p" = int8 ] && dump=(--dump-lists /tmp/decode_lists)
  timeout 150 "$B/cisa" bench layer --backend cuda --json --phase decode --rep-precision "$p" \
    "${dump[@]}" >"$L/layer_$p.json" 2>"$L/layer_$p.log"
  echo "[$(date +%H:%M:%S)] layer $p rc=$?" | tee -a "$L/session.log"
done
PYTHONUNBUFFERED=1 timeout 240 python3 bench/python/anchors_layer.py --commit "${CISA_COMMIT:-unknown}" \
  --lists /tmp/decode_lists --cisa "$L/layer_int8.json" --out "$L/anchors.json" --no-flex \
  --gather-geometries none >"$L/anchors.log" 2>&1
echo "[$(date +%H:%M:%S)] anchors rc=$?" | tee -a "$L/session.log"
OUT=$O/model TESTS=" " PROBES="" REPS=${REPS:-1} TOKENS=${TOKENS:-128} \
  bash bench/scripts/gpu_prebuilt_session.sh
