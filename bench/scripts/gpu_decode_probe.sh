#!/usr/bin/env bash
# One device call for the dense-decode investigation (issue 6, docs/cuda-notes.md "v9"): the
# memory-side probe (bench/cuda/decode_read_probe.cu), `cisa bench layer --phase decode` of the
# given binaries, decode-only PyTorch anchors, and ncu counters of our dense decode kernel, of the
# probe's copy-only kernel and of FlashAttention's / cuDNN's decode kernels on the same shapes.
#   PROBE=.devbin/probe BINS=".devbin/v8 .devbin/v9" bench/scripts/gpu_decode_probe.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
log() { echo "[probe $(date +%H:%M:%S)] $*" | tee -a "$OUT/session.log"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee -a "$OUT/session.log"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_op_read_hit_rate.pct,l1tex__m_xbar2l1tex_read_bytes.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second,dram__cycles_elapsed.avg.per_second,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_requests_srcunit_tex_op_read.sum

# TESTS=1: the GPU tests of the last binary directory in BINS first (its cuda_*_test binaries).
if [ -n "${TESTS:-}" ]; then
  tb=$(echo ${BINS:-} | awk '{print $NF}')
  for t in cuda_select_test cuda_attention_test cuda_decode_attention_test; do
    timeout 150 "$tb/$t" >"$OUT/$t.log" 2>&1
    log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$t.log" | tr '\n' ' ')"
    grep -B3 -A12 "Failure" "$OUT/$t.log" | head -30
  done
fi
if [ -n "${PROBE:-}" ]; then
  log "probe ${PROBE_ARGS:-}"
  timeout 120 "$PROBE" ${PROBE_ARGS:-} | tee "$OUT/probe.txt"
  [ -n "${PROBE_ONLY:-}" ] && { log done; exit 0; }
fi
for round in 1 2; do
  for b in ${BINS:-}; do
    tag=$(basename "$b")
    timeout 60 "$b"/cisa bench layer --backend cuda --json --phase decode ${LAYER_ARGS:-} >"$OUT/decode_${tag}_$round.json" 2>"$OUT/decode_${tag}_$round.log"
    log "$tag round $round rc=$?"; grep decode "$OUT/decode_${tag}_$round.log"
  done
  if [ $round = 1 ] && [ -z "${NO_ANCHORS:-}" ] && [ -n "${BINS:-}" ]; then
    last=$(basename $(echo $BINS | awk '{print $NF}'))
    PYTHONUNBUFFERED=1 timeout 150 python3 bench/python/anchors_layer.py --commit "${CISA_COMMIT:-unknown}" --lists /nonexistent \
      --cisa "$OUT/decode_${last}_1.json" --out "$OUT/layer_results.json" --no-flex --gather-geometries none 2>&1 |
      tee "$OUT/anchors.log" | tail -22
    log "anchors rc=${PIPESTATUS[0]}"
  fi
done
# PREFILL_GEOS="4:1 …": the terminal prefill of each binary too (the same mma.sync kernel runs
# union tiles and partial tiles there).
for geo in ${PREFILL_GEOS:-}; do
  for b in ${BINS:-}; do
    tag=$(basename "$b")
    timeout 120 "$b"/cisa bench layer --backend cuda --json --phase prefill --geometry $geo >"$OUT/prefill_${tag}_${geo/:/x}.json" 2>"$OUT/prefill_${tag}_${geo/:/x}.log"
    log "$tag prefill $geo rc=$?"; grep prefill "$OUT/prefill_${tag}_${geo/:/x}.log"
  done
done
if [ -n "${NCU_GEOS:-}" ] && [ -n "$NCU" ]; then
  for geo in $NCU_GEOS; do
    for b in ${NCU_BINS:-$(echo ${BINS:-} | awk '{print $NF}')}; do
      timeout 120 $NCU --clock-control none --metrics $M -k regex:attention_kernel --launch-count 1 --csv --page raw \
        "$b"/cisa bench layer --backend cuda --phase decode --geometry $geo --warmup 1 --iters 1 >"$OUT/ncu_$(basename $b)_${geo/:/x}.csv" 2>&1
      log "ncu $(basename $b) $geo rc=$?"
    done
    if [ -n "${PROBE:-}" ]; then
      timeout 120 $NCU --clock-control none --metrics $M -k regex:paged_copy_kernel --launch-count 1 --csv --page raw \
        "$PROBE" $geo >"$OUT/ncu_probe_${geo/:/x}.csv" 2>&1
      log "ncu probe $geo rc=$?"
      timeout 120 $NCU --clock-control none --metrics $M -k regex:paged_ldg_kernel --launch-skip 9 --launch-count 1 --csv --page raw \
        "$PROBE" $geo >"$OUT/ncu_probe_ldg4_${geo/:/x}.csv" 2>&1
      log "ncu probe ldg $geo rc=$?"
    fi
    hq=${geo%:*}; hkv=${geo#*:}; seqs=$([ "$geo" = 32:1 ] && echo 32 || echo 16)
    cat >/tmp/sdpa_once.py <<PY
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
k = torch.randn($seqs, $hkv, 1 << 20, 128, dtype=torch.bfloat16, device="cuda"); v = torch.randn_like(k)
q = torch.randn($seqs, $hq, 1, 128, dtype=torch.bfloat16, device="cuda")
for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
    with sdpa_kernel([be]):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.cuda.synchronize()
PY
    timeout 150 $NCU --clock-control none --metrics $M -k 'regex:flash|fmha|sdpa|cudnn' --launch-count 6 --csv --page raw \
      python3 /tmp/sdpa_once.py >"$OUT/ncu_sdpa_${geo/:/x}.csv" 2>&1
    log "ncu sdpa $geo rc=$?"
  done
fi
# The tool brings back only a few files: pack the counters into one archive.
(cd "$OUT" && ls ncu_*.csv >/dev/null 2>&1 && tar czf ncu.tgz ncu_*.csv && rm -f ncu_*.csv)
(cd "$OUT" && tar czf results.tgz --exclude results.tgz --exclude ncu.tgz --exclude session.log --exclude probe.txt * && find . -maxdepth 1 -type f ! -name '*.tgz' ! -name session.log ! -name probe.txt -delete)
log done
