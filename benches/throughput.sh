#!/usr/bin/env bash
# End-to-end throughput of `vigil run` on a 1M-row CSV: tumbling 10 s average
# per host over 1,000 hosts. Builds the release binary, generates the data
# once under benches/out/, runs the query RUNS times and prints the median.
#
# Usage: benches/throughput.sh [ROWS] [HOSTS] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-1000000}
hosts=${2:-1000}
runs=${3:-5}
out=benches/out
mkdir -p "$out"
csv="$out/metrics_${rows}_${hosts}.csv"
[ -f "$csv" ] || python3 benches/gen_metrics.py "$rows" "$hosts" "$csv"
cat > "$out/tumble_avg.sql" <<SQL
CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE, mem DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND)
WITH (connector = 'file', path = '$(basename "$csv")', format = 'csv');
SELECT window_start, window_end, host, avg(cpu) AS avg_cpu, max(cpu) AS max_cpu, count(*) AS n
FROM TUMBLE(metrics, ts, INTERVAL '10' SECOND)
GROUP BY window_start, window_end, host;
SQL
cargo build --release --quiet
bin=${CARGO_TARGET_DIR:-target}/release/vigil
times=()
for _ in $(seq "$runs"); do
  start=$(date +%s.%N)
  "$bin" run "$out/tumble_avg.sql" --format csv > "$out/result.csv" 2> "$out/summary.txt"
  end=$(date +%s.%N)
  times+=("$(echo "$end - $start" | bc -l)")
done
median=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
echo "runs (s): ${times[*]}"
echo "median: ${median} s for ${rows} rows = $(echo "$rows / $median" | bc) rows/s"
echo "result rows: $(($(wc -l < "$out/result.csv") - 1)); $(tr '\n' ' ' < "$out/summary.txt")"
