#!/usr/bin/env bash
# ncu of the decode top-k kernel (topk_cluster_kernel, or a base binary's topk_kernel) in one `cisa bench layer` decode step, with
# the SASS-level source counters (which instructions the warps stall on). Run after
# gpu_prebuilt_session.sh or gpu_decode_session.sh has unpacked the binaries into
# /tmp/prebuilt_bins (carry .devbin). Writes $OUT/ncu_topk.tgz (the device returns few files) with
# <name>.txt (the sections) and <name>_sass.csv (per-instruction samples) for our binary and, when
# present, each base binary; the headline metrics go to stdout.
# GEOMETRY (default 4:1) picks the layer geometry; PROFILE_BINS (default "cisa cisa_base
# cisa_base2") the binaries under /tmp/prebuilt_bins.
set -u
O=${OUT:-$PWD/gpu-topk-out}/ncu_topk
B=/tmp/prebuilt_bins
mkdir -p "$O"
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for name in ${PROFILE_BINS:-cisa cisa_base cisa_base2}; do
  [ -x "$B/$name" ] || continue
  timeout 240 ncu --kernel-name regex:"topk_(cluster_)?kernel" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
    --section LaunchStats --section SourceCounters --export "$O/$name" --force-overwrite \
    "$B/$name" bench layer --backend cuda --phase decode --geometry "${GEOMETRY:-4:1}" \
    --rep-precision int8 --iters 2 --warmup 1 >"$O/${name}_run.log" 2>&1
  rc=$?  # before the date's command substitution below resets $?
  echo "[$(date +%H:%M:%S)] ncu $name rc=$rc"
  ncu --import "$O/$name.ncu-rep" >"$O/$name.txt" 2>&1
  ncu --import "$O/$name.ncu-rep" --page source --print-source sass --csv >"$O/${name}_sass.csv" 2>&1
  rm -f "$O/$name.ncu-rep"
  grep -E "Duration|Elapsed Cycles|SM Active Cycles|Issued Warp|Max Active Clusters|Registers Per" \
    "$O/$name.txt"
done
tar -C "$O/.." -czf "$O.tgz" ncu_topk && rm -rf "$O"
