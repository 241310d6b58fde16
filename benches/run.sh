#!/usr/bin/env bash
# vigil against its peers in one run: streaming queries Q0-Q7, Nexmark, and
# Q1/Q4 as batch queries in DataFusion and DuckDB, on the release binary.
# See benches/README.md, "Against the peers"; `benches/run.sh --help` lists
# the options (--quick, --seed, --rows, --hosts, --only, --parallelism, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin vigil
exec cargo bench --quiet --bench harness -- "$@"
