#!/usr/bin/env python3
"""Writes the rows of a metrics CSV (from gen_metrics.py) as JSON lines.

Usage: csv_to_jsonl.py IN.csv OUT.jsonl
Each row becomes {"ts": <epoch ms>, "host": "...", "cpu": x, "mem": y}, the
numbers written as they are in the CSV, so both files hold the same values.
"""
import sys


def main() -> None:
    src, out = sys.argv[1], sys.argv[2]
    with open(src) as f, open(out, "w") as o:
        next(f)
        for line in f:
            ts, host, cpu, mem = line.rstrip("\n").split(",")
            o.write(f'{{"ts":{ts},"host":"{host}","cpu":{cpu},"mem":{mem}}}\n')


if __name__ == "__main__":
    main()
