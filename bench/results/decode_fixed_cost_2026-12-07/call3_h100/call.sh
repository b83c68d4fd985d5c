#!/usr/bin/env bash
# Third device call (2026-12-07): L2 cache policies in the decode scoring kernel (representatives
# evict-first, exponent bytes evict-last) against the binary without them (.devbin/base), the
# decode layer rows of both alternated three times, the scoring tests, and ncu of the decode
# scoring kernel of both (in-kernel time and DRAM bytes read).
set -u
O=$OUT
export LD_LIBRARY_PATH=$PWD/.devbin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=$O/decode CISA_COMMIT=${CISA_COMMIT:-wip} LAYER_REPS=3 NO_MODEL=1 BASE_PRECS=int8 \
  bash bench/scripts/gpu_decode_session.sh >/dev/null 2>&1
echo "decode session done" | tee -a $O/card.log
B=/tmp/prebuilt_bins
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
xz -dc .devbin/base/cisa.xz > $B/cisa_base0 && chmod +x $B/cisa_base0
for geo in 4:1 32:1; do
  for x in cisa cisa_base0; do
    f=$O/ncu_${geo/:/x}_$x.csv
    timeout 100 $NCU --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct \
      -k regex:"score_few" --launch-count 12 --csv --page raw \
      $B/$x bench layer --backend cuda --phase decode --geometry $geo --rep-precision int8 \
      --warmup 1 --iters 1 >$f 2>&1
    echo "ncu $geo $x rc=$?" | tee -a $O/card.log
  done
done
(cd $O && tar czf ncu.tgz ncu_*.csv && rm -f ncu_*.csv)
