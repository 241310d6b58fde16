#!/usr/bin/env python3
"""Independent expected results for the NAB replay tests in tests/examples.rs.

How it was run (from the repository root, Python 3, standard library only):

    python3 tests/nab_expected.py

It reads queries/data/nab/machine_temperature_system_failure.csv in file order and applies
the rules of the semantics reference by hand, with no vigil code involved:

- the stream is declared `WATERMARK FOR "timestamp" AS "timestamp"` (delay 0), so the
  watermark is the largest event time seen so far;
- TUMBLE windows are [k*size, (k+1)*size) aligned to the epoch; timestamps are naive = UTC;
- a row is late when its window_end <= the watermark at its arrival; late rows are counted
  and are not part of any window;
- at the end of the input every open window fires; a window with no rows emits nothing;
- median of an even count is the mean of the two middle values.

The printed figures are hard-coded in tests/examples.rs; re-run this script and update the
constants there if the data file ever changes.
"""

import csv
import datetime as dt
import math
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "queries", "data", "nab", "machine_temperature_system_failure.csv")
EPOCH = dt.datetime(1970, 1, 1)


def read_rows():
    with open(DATA, newline="") as f:
        for rec in csv.DictReader(f):
            t = dt.datetime.strptime(rec["timestamp"], "%Y-%m-%d %H:%M:%S")
            ms = (t - EPOCH) // dt.timedelta(milliseconds=1)
            yield ms, float(rec["value"])


def tumble(size_ms):
    watermark = None
    windows = {}  # window_start_ms -> list of values
    late = 0
    n = 0
    for ms, value in read_rows():
        n += 1
        start = ms - ms % size_ms
        end = start + size_ms
        if watermark is not None and end <= watermark:
            late += 1
        else:
            windows.setdefault(start, []).append(value)
        watermark = ms if watermark is None else max(watermark, ms)
    return n, late, windows


def iso(ms):
    return (EPOCH + dt.timedelta(milliseconds=ms)).strftime("%Y-%m-%dT%H:%M:%S")


def describe(start, size_ms, values):
    return (
        f"window_start={iso(start)} window_end={iso(start + size_ms)} n={len(values)} "
        f"avg={math.fsum(values) / len(values)!r} min={min(values)!r} max={max(values)!r} "
        f"median={statistics.median(values)!r}"
    )


def report(label, size_ms, probes):
    rows, late, windows = tumble(size_ms)
    starts = sorted(windows)
    print(f"== {label} (size {size_ms // 1000} s)")
    print(f"rows={rows} late={late} windows={len(windows)} "
          f"rows_in_windows={sum(len(v) for v in windows.values())}")
    print("first: " + describe(starts[0], size_ms, windows[starts[0]]))
    print("last:  " + describe(starts[-1], size_ms, windows[starts[-1]]))
    for p in probes:
        t = dt.datetime.strptime(p, "%Y-%m-%d %H:%M:%S")
        ms = (t - EPOCH) // dt.timedelta(milliseconds=1)
        print("probe: " + describe(ms, size_ms, windows.get(ms, [float("nan")])))


def main():
    report("hourly", 3_600_000, ["2014-01-07 02:00:00", "2014-01-07 03:00:00"])
    report("10 minutes", 600_000,
           ["2014-01-07 02:00:00", "2014-01-07 02:40:00", "2014-01-07 02:50:00"])


if __name__ == "__main__":
    main()
