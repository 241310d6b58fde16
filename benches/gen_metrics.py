#!/usr/bin/env python3
"""Writes a synthetic metrics CSV for the throughput benchmark.

Usage: gen_metrics.py ROWS HOSTS OUT.csv
One row per host per second (ts in epoch ms, host, cpu, mem), in time order
with a little jitter inside each second; deterministic.
"""
import random
import sys


def main() -> None:
    rows, hosts, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    rng = random.Random(42)
    base = 1_700_000_000_000
    with open(out, "w") as f:
        f.write("ts,host,cpu,mem\n")
        for i in range(rows):
            second, h = divmod(i, hosts)
            ts = base + second * 1000 + rng.randrange(1000)
            f.write(f"{ts},host-{h:04d},{rng.uniform(0, 100):.2f},{rng.uniform(0, 64):.2f}\n")


if __name__ == "__main__":
    main()
