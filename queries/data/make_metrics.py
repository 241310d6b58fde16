#!/usr/bin/env python3
"""Generate queries/data/metrics.csv: a small, realistic multi-host metrics stream.

    python3 queries/data/make_metrics.py            # rewrites queries/data/metrics.csv
    python3 queries/data/make_metrics.py --summary  # also prints the facts tests rely on

Deterministic (fixed seed, standard library only), so re-running it gives the same file
byte for byte.

Shape:
- columns ts,host,cpu,mem,disk_io; ts is ISO-8601 UTC (`2024-05-06T09:00:00Z`);
- 5 hosts, one row per host per second, 10 minutes (600 s) => 3000 rows;
- cpu and mem in percent (0..100), disk_io in operations per second;
- host web-02 has a CPU spike (cpu > 90) from 09:05:00 to 09:05:59;
- a few rows arrive late, but never more than 2 s behind the largest timestamp already
  written, so a stream declared with `WATERMARK FOR ts AS ts - INTERVAL '2' SECOND` drops
  none of them.
"""

import datetime as dt
import math
import os
import random
import sys

SEED = 20240506
START = dt.datetime(2024, 5, 6, 9, 0, 0, tzinfo=dt.timezone.utc)
SECONDS = 600
MAX_DISORDER_S = 2
SPIKE_HOST = "web-02"
SPIKE_FROM_S, SPIKE_TO_S = 300, 360  # [09:05:00, 09:06:00)

# host -> (cpu baseline, cpu noise, mem baseline, disk_io baseline)
HOSTS = {
    "web-01": (35.0, 6.0, 52.0, 40.0),
    "web-02": (38.0, 6.0, 55.0, 45.0),
    "db-01": (55.0, 8.0, 78.0, 420.0),
    "cache-01": (18.0, 3.0, 63.0, 12.0),
    "batch-01": (48.0, 6.0, 40.0, 160.0),
}


def clamp(x, lo, hi):
    return max(lo, min(hi, x))


def generate():
    rng = random.Random(SEED)
    mem_state = {h: v[2] for h, v in HOSTS.items()}
    rows = []  # (emit_second, delay, seq, ts, host, cpu, mem, disk_io)
    seq = 0
    for s in range(SECONDS):
        t = START + dt.timedelta(seconds=s)
        for host, (cpu0, noise, _mem0, io0) in HOSTS.items():
            # A slow wave (about a 5-minute period) plus noise.
            wave = 5.0 * math.sin(2 * math.pi * s / 300.0 + len(host))
            cpu = cpu0 + wave + rng.gauss(0.0, noise)
            if host == "batch-01" and (s // 60) % 2 == 1:
                cpu += 12.0  # batch jobs every other minute
            if host == SPIKE_HOST and SPIKE_FROM_S <= s < SPIKE_TO_S:
                cpu = rng.uniform(91.0, 99.5)  # the incident
            cpu = round(clamp(cpu, 0.5, 100.0), 1)
            mem_state[host] = clamp(mem_state[host] + rng.gauss(0.0, 0.15), 5.0, 97.0)
            mem = round(mem_state[host], 1)
            disk_io = round(max(0.0, io0 * (1.0 + rng.gauss(0.0, 0.2))), 1)
            # About 0.3% of rows are delayed by 1 or 2 seconds in the file.
            delay = rng.choice([1, 2]) if rng.random() < 0.003 else 0
            if s + delay >= SECONDS:
                delay = 0
            rows.append((s + delay, delay, seq, t, host, cpu, mem, disk_io))
            seq += 1
    # File order: by the second a row is emitted; a delayed row comes after the rows that
    # belong to that second, so it is exactly `delay` seconds behind the largest timestamp.
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    return [r[3:] for r in rows]


def check(rows):
    """The guarantees the header promises."""
    max_seen = None
    late_by = []
    for r in rows:
        t = r[0]
        if max_seen is not None and t < max_seen:
            late_by.append((max_seen - t).total_seconds())
            assert max_seen - t <= dt.timedelta(seconds=MAX_DISORDER_S), r
        max_seen = t if max_seen is None or t > max_seen else max_seen
    assert len(rows) == SECONDS * len(HOSTS)
    assert late_by, "the file should contain some out-of-order rows"
    return late_by


def main():
    rows = generate()
    late_by = check(rows)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metrics.csv")
    with open(out, "w", newline="\n") as f:
        f.write("ts,host,cpu,mem,disk_io\n")
        for t, host, cpu, mem, disk_io in rows:
            f.write(f"{t.strftime('%Y-%m-%dT%H:%M:%SZ')},{host},{cpu},{mem},{disk_io}\n")
    if "--summary" in sys.argv:
        print(f"rows={len(rows)} out_of_order_rows={len(late_by)} max_behind_s={max(late_by)}")
        spike = sorted({(r[0] - START).total_seconds() // 10 for r in rows if r[2] > 90.0})
        hosts = sorted({r[1] for r in rows if r[2] > 90.0})
        print(f"hosts_with_cpu_gt_90={hosts} ten_second_windows_with_cpu_gt_90={len(spike)}")
        print(f"rows_with_cpu_gt_90={sum(1 for r in rows if r[2] > 90.0)}")


if __name__ == "__main__":
    main()
