#!/usr/bin/env bash
# The scale-out scenario at full size, against a Kafka protocol of your
# choice: 2,000,000 metric rows in a 6-partition topic keyed by host; three
# `vigil run --group` processes run Q1 (10-second per-host aggregate) and an
# alert with FOR into exactly-once Kafka sinks; one is killed with SIGKILL
# once half of Q1 is committed, a fourth joins once its partitions have
# moved; the read_committed output must equal, row for row, one process's
# run of the same script over the whole topic, and the data's own Q1. The
# work is done by benches/kafka_broker.rs (its doc says what it checks);
# this script picks the broker and builds and runs it.
#
# Usage:
#   tests/kafka_broker.sh mock      # librdkafka's mock cluster (default)
#   tests/kafka_broker.sh tansu     # tansu, in-memory storage, 127.0.0.1
#   KAFKA_BOOTSTRAP=host:port tests/kafka_broker.sh external
#
# Environment:
#   VIGIL_BIN        the vigil binary (default $CARGO_TARGET_DIR/release/vigil,
#                    else target/release/vigil): build it with
#                    `cargo build --release` first
#   TANSU_BIN        tansu's binary (default: `tansu` on PATH, else
#                    /work/tools/tansu/bin/tansu); install it with
#                    cargo install tansu@0.5.9 --locked --features dynostore
#                    (the default features have no in-memory storage;
#                    neither 0.5.9 nor 0.6.0 has transactions, so run it
#                    with KAFKA_DELIVERY=at_least_once; 0.6.0 also reports
#                    wrong end offsets)
#   KAFKA_ROWS       rows (default 2000000)
#   KAFKA_COMPRESSION  producer and sink compression.type (default gzip)
#   KAFKA_CHECKPOINT the processes' --checkpoint-interval (default 1s)
#   KAFKA_DELIVERY   the sinks' delivery (default exactly_once)
#   KAFKA_KEEP=1     keep the processes' stderr and checkpoints
#   HARNESS_PROFILE  cargo profile the harness is built with (default dev:
#                    it only produces and reads; vigil is the release binary)
#
# Prints the figures and PASS, or FAIL with what differs (exit 1).
set -euo pipefail

cd "$(dirname "$0")/.."
mode=${1:-mock}
target=${CARGO_TARGET_DIR:-target}
export VIGIL_BIN=${VIGIL_BIN:-$target/release/vigil}
if [[ ! -x $VIGIL_BIN ]]; then
    echo "kafka_broker.sh: $VIGIL_BIN is not there: cargo build --release, or set VIGIL_BIN" >&2
    exit 2
fi

# A port nothing listens on now.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_tansu() {
    local bin=${TANSU_BIN:-}
    if [[ -z $bin ]]; then
        bin=$(command -v tansu || echo /work/tools/tansu/bin/tansu)
    fi
    if [[ ! -x $bin ]]; then
        echo "kafka_broker.sh: no tansu at $bin: cargo install tansu --locked --features dynostore, or set TANSU_BIN" >&2
        exit 2
    fi
    local port
    port=$(free_port)
    tansu_log=$(mktemp -t tansu.XXXXXX.log)
    echo "tansu: $("$bin" --version 2>&1 | head -1), log in $tansu_log"
    "$bin" broker \
        --listener-url "tcp://127.0.0.1:$port" \
        --advertised-listener-url "tcp://127.0.0.1:$port" \
        --storage-engine memory://tansu/ >"$tansu_log" 2>&1 &
    tansu_pid=$!
    trap 'kill "$tansu_pid" 2>/dev/null || true; wait "$tansu_pid" 2>/dev/null || true' EXIT
    for _ in $(seq 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            export KAFKA_BOOTSTRAP=127.0.0.1:$port
            return
        fi
        if ! kill -0 "$tansu_pid" 2>/dev/null; then
            echo "kafka_broker.sh: tansu ended:" >&2
            cat "$tansu_log" >&2
            exit 2
        fi
        sleep 0.1
    done
    echo "kafka_broker.sh: tansu does not listen on $port after 10 s" >&2
    exit 2
}

case $mode in
    mock) unset KAFKA_BOOTSTRAP ;;
    tansu) start_tansu ;;
    external)
        if [[ -z ${KAFKA_BOOTSTRAP:-} ]]; then
            echo "kafka_broker.sh: external needs KAFKA_BOOTSTRAP=host:port" >&2
            exit 2
        fi
        ;;
    *)
        echo "usage: $0 [mock|tansu|external]" >&2
        exit 2
        ;;
esac

cargo bench --profile "${HARNESS_PROFILE:-dev}" --bench kafka_broker
