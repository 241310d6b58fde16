#!/usr/bin/env bash
# Runs the whole suite N times in a row (default 5) with a CPU hog on one
# core beside it, without retries, and prints how often each test failed.
# A test that fails here is a bug in the test or in the engine: find which.
#   tests/stress.sh [RUNS]       HOG='stress-ng --cpu 1' tests/stress.sh 3
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/vigil/target}"
out=$(mktemp -d /tmp/vigil-stress.XXXXXX)

cargo nextest list --locked --run-ignored all >/dev/null || exit 1

# One core busy the whole time; killed with this script.
${HOG:-yes} >/dev/null &
hog=$!
trap 'kill $hog 2>/dev/null' EXIT

failed_runs=0
for i in $(seq 1 "$runs"); do
  start=$SECONDS
  if cargo nextest run --locked --profile stress --run-ignored all >"$out/run-$i.log" 2>&1; then
    echo "stress: run $i of $runs passed in $((SECONDS - start)) s"
  else
    failed_runs=$((failed_runs + 1))
    echo "stress: run $i of $runs FAILED in $((SECONDS - start)) s (log: $out/run-$i.log)"
  fi
  cp target/nextest/stress/junit.xml "$out/run-$i.xml"
done

python3 - "$out" "$runs" <<'PY'
import glob, sys, xml.etree.ElementTree as ET
out, runs = sys.argv[1], int(sys.argv[2])
failures, tests = {}, set()
for path in sorted(glob.glob(f"{out}/run-*.xml")):
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name")
        tests.add(name)
        if case.find("failure") is not None or case.find("error") is not None:
            failures[name] = failures.get(name, 0) + 1
print(f"stress: {len(tests)} tests, {runs} runs with a CPU hog beside them")
if not failures:
    print("stress: per-test failure counts: no test failed")
for name, count in sorted(failures.items(), key=lambda f: -f[1]):
    print(f"stress: {count} of {runs} runs failed {name}")
PY
exit $((failed_runs > 0))
