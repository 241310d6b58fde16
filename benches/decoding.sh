#!/usr/bin/env bash
# Decoding throughput of `vigil run`: the TUMBLE 10 s avg/max/count per host
# query of throughput.sh over the same rows as CSV and as JSON lines, with 1
# and 2 decode threads (VIGIL_DECODE_THREADS), runs interleaved.
#
# Usage: benches/decoding.sh [ROWS] [RUNS] [BINARY...]
# BINARY defaults to the release build; give several (an older build first,
# say) to compare them in one run. A build without decode threads ignores
# the variable, so its two rows measure the same thing.
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-10000000}
runs=${2:-5}
shift $(($# < 2 ? $# : 2))
out=benches/out
mkdir -p "$out"
csv="$out/metrics_${rows}_1000.csv"
jsonl="$out/metrics_${rows}_1000.jsonl"
[ -f "$csv" ] || python3 benches/gen_metrics.py "$rows" 1000 "$csv"
[ -f "$jsonl" ] || python3 benches/csv_to_jsonl.py "$csv" "$jsonl"
for format in csv jsonl; do
  cat > "$out/decoding_$format.sql" <<SQL
CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE, mem DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND)
WITH (connector = 'file', path = 'metrics_${rows}_1000.$format', format = '$format');
SELECT window_start, window_end, host, avg(cpu) AS avg_cpu, max(cpu) AS max_cpu, count(*) AS n
FROM TUMBLE(metrics, ts, INTERVAL '10' SECOND)
GROUP BY window_start, window_end, host;
SQL
done
if [ $# -eq 0 ]; then
  cargo build --release --quiet
  set -- "${CARGO_TARGET_DIR:-target}/release/vigil"
fi
declare -A times cpu
for _ in $(seq "$runs"); do
  for bin in "$@"; do
    for format in csv jsonl; do
      for threads in 1 2; do
        start=$(date +%s.%N)
        VIGIL_DECODE_THREADS=$threads /usr/bin/time -o "$out/decoding_cpu.txt" -f "%U %S" \
          "$bin" run "$out/decoding_$format.sql" --format csv \
          > "$out/decoding_result.csv" 2> "$out/decoding_summary.txt"
        end=$(date +%s.%N)
        grep -q "rows=$rows bad=0" "$out/decoding_summary.txt"
        times[$bin $format $threads]+="$(echo "$end - $start" | bc -l) "
        cpu[$bin $format $threads]+="$(awk '{print $1 + $2}' "$out/decoding_cpu.txt") "
      done
    done
  done
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "load average before the table: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-32s %-6s %-8s %10s %12s %10s\n' binary format threads wall_s rows_per_s cpu_s
for bin in "$@"; do
  for format in csv jsonl; do
    for threads in 1 2; do
      wall=$(median ${times[$bin $format $threads]})
      cpus=$(median ${cpu[$bin $format $threads]})
      printf '%-32s %-6s %-8s %10.3f %12.0f %10.2f\n' "$bin" "$format" "$threads" "$wall" \
        "$(echo "$rows / $wall" | bc -l)" "$cpus"
    done
  done
done
