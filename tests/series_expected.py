#!/usr/bin/env python3
"""Independent expected alerts for the series rules in tests/series_pack.rs.

How it was run (from the repository root, Python 3, standard library only):

    python3 tests/series_expected.py

It replays, in plain Python and with no vigil code, the SQL of
`queries/pack/series/robust_z_or_new_extreme.sql` (and the `level_shift` alert of
`shift_or_spike.sql`) over
`queries/data/nab/machine_temperature_long.csv`, and of
`queries/pack/series/machine_multi_metric.sql` over the SMD slice
`tests/data/smd/machine-1-6_slice.csv` (see tests/data/smd/PROVENANCE), by the rules of the
semantics reference and grammar/README.md:

- TUMBLE windows are [k*size, (k+1)*size) on the epoch; the watermark is the largest event
  time seen minus the declared delay, and a row is late when its window_end <= the watermark
  at its arrival (none is, with these delays; the script checks);
- `ROWS BETWEEN n PRECEDING AND CURRENT ROW` over a key's windows in window_end order;
  median of an even count = mean of the two middle values; mad = median of |x - median|;
  stddev is the sample standard deviation (NULL for one value);
- an alert without FOR or RESOLVE fires at the first row where its condition is true and
  resolves at the first row where it is not (NULL is not true); its event_time is the row's
  window_end.

It prints every alert change as `state event_time`, and for each firing the margin of the
condition that decided it (how far |z| is from its cut-off), so that a change decided by
float rounding would show. The lists are hard-coded in tests/series_pack.rs; re-run this
script and update them if a data file or a rule changes.
"""

import csv
import datetime as dt
import math
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
NAB = os.path.join(HERE, "..", "queries", "data", "nab", "machine_temperature_long.csv")
SMD = os.path.join(HERE, "data", "smd", "machine-1-6_slice.csv")
EPOCH = dt.datetime(1970, 1, 1)
# score.py's base epoch for SMD offsets: 2024-01-01T00:00:00 UTC.
SMD_BASE_MS = (dt.datetime(2024, 1, 1) - EPOCH) // dt.timedelta(milliseconds=1)


def parse_ms(text):
    text = text.replace("T", " ")
    t = dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S")
    return (t - EPOCH) // dt.timedelta(milliseconds=1)


def iso(ms):
    return (EPOCH + dt.timedelta(milliseconds=ms)).strftime("%Y-%m-%dT%H:%M:%S")


def tumble_avg(rows, size_ms, delay_ms):
    """rows: (ms, key, value) in arrival order -> {key: {window_end: avg}}."""
    watermark = None
    sums = {}
    for ms, key, value in rows:
        end = ms - ms % size_ms + size_ms
        assert watermark is None or end > watermark, "a late row at %s" % iso(ms)
        sums.setdefault(key, {}).setdefault(end, []).append(value)
        mark = ms - delay_ms
        watermark = mark if watermark is None else max(watermark, mark)
    return {k: {e: math.fsum(v) / len(v) for e, v in w.items()} for k, w in sums.items()}


def robust_z(v, frame):
    """The CASE of the rules: robust z when mad > 0, else classic z when stddev > 0."""
    med = statistics.median(frame)
    mad = statistics.median([abs(x - med) for x in frame])
    if mad > 0:
        return 0.6745 * (v - med) / mad
    if len(frame) > 1:
        sd = statistics.stdev(frame)
        if sd > 0:
            return (v - math.fsum(frame) / len(frame)) / sd
    return None


def alert_changes(rows):
    """rows: (event_time_ms, condition, note) in event-time order -> [(state, ms, note)]."""
    firing = False
    out = []
    for ms, cond, note in rows:
        if cond and not firing:
            out.append(("firing", ms, note))
            firing = True
        elif not cond and firing:
            out.append(("resolved", ms, note))
            firing = False
    return out


def robust_z_or_new_extreme():
    with open(NAB, newline="") as f:
        rows = [(parse_ms(r["ts"]), (r["host"], r["metric"]), float(r["value"]))
                for r in csv.DictReader(f)]
    (hourly,) = tumble_avg(rows, 3_600_000, 3_600_000).values()
    ends = sorted(hourly)
    values = [hourly[e] for e in ends]
    judged = []
    closest = math.inf
    for i, (end, v) in enumerate(zip(ends, values)):
        frame = values[max(0, i - 24): i + 1]
        z = robust_z(v, frame)
        far = len(frame) >= 25 and z is not None and abs(z) > 4
        hours = i + 1
        new = False
        if i > 0:
            high, low = max(values[:i]), min(values[:i])
            new = hours > 48 and (v > high or v < low)
        margin = None if z is None else abs(z) - 4
        if z is not None and len(frame) >= 25:
            closest = min(closest, abs(margin))
        judged.append((end, far or new, "far=%s new=%s |z|-4=%s" % (far, new, margin)))
    print("robust_z_or_new_extreme: closest |z| to the cut-off 4, over all hours: %.3g" % closest)
    return alert_changes(judged)


def machine_multi_metric():
    with open(SMD, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        metrics = header[1:-1]
        rows = []
        for rec in reader:
            ms = SMD_BASE_MS + int(rec[0]) * 1000
            for m, v in zip(metrics, rec[1:-1]):
                rows.append((ms, m, float(v)))
    per_metric = tumble_avg(rows, 300_000, 60_000)
    out_count = {}
    closest = {}
    for m, windows in per_metric.items():
        ends = sorted(windows)
        values = [windows[e] for e in ends]
        for i, end in enumerate(ends):
            frame = values[max(0, i - 288): i + 1]
            z = robust_z(values[i], frame)
            hit = len(frame) >= 144 and z is not None and abs(z) > 5
            out_count[end] = out_count.get(end, 0) + (1 if hit else 0)
            if len(frame) >= 144 and z is not None:
                closest[end] = min(closest.get(end, math.inf), abs(abs(z) - 5))
    print("machine_multi_metric: closest |z| to the cut-off 5, over all windows: %.3g"
          % min(closest.values()))
    ends = sorted(out_count)
    return alert_changes([(e, out_count[e] >= 6,
                           "metrics_out=%d closest |z|-5=%.3g" % (out_count[e], closest.get(e, math.nan)))
                          for e in ends])


def cusum(values, k, h, warmup):
    """The self-starting two-sided CUSUM of grammar/README.md, row by row: NULL while the
    reference (the values since the last reset) holds fewer than `warmup` values; else z
    against the reference's mean and population stddev, S+ and S- with allowance k, the
    result S+ if S+ >= S- else -S-; past h the sums reset and the reference restarts at x."""
    reference, up, down, out = [], 0.0, 0.0, []
    for x in values:
        if len(reference) < warmup:
            reference.append(x)
            out.append(None)
            continue
        mean = math.fsum(reference) / len(reference)
        sd = statistics.pstdev(reference) or 1e-9 * max(abs(mean), 1.0)
        z = (x - mean) / sd
        up, down = max(0.0, up + z - k), max(0.0, down - z - k)
        result = up if up >= down else -down
        out.append(result)
        if abs(result) > h:
            up, down, reference = 0.0, 0.0, [x]
        else:
            reference.append(x)
    return out


def keep_firing_changes(rows, keep_ms):
    """rows: (ms, condition, note) -> changes of an alert with KEEP FIRING FOR keep_ms: it
    resolves at a row where the condition has not held, row after row, for keep_ms since
    the first of those rows."""
    firing, quiet_since, out = False, None, []
    for ms, cond, note in rows:
        if cond:
            quiet_since = None
            if not firing:
                out.append(("firing", ms, note))
                firing = True
        elif firing:
            quiet_since = ms if quiet_since is None else quiet_since
            if ms - quiet_since >= keep_ms:
                out.append(("resolved", ms, note))
                firing, quiet_since = False, None
    return out


def shift_or_spike_level_shift():
    """`level_shift` of queries/pack/series/shift_or_spike.sql: cusum(v, 2, 10, 48) over
    the hourly means, firing past 10, KEEP FIRING FOR 24 hours."""
    with open(NAB, newline="") as f:
        rows = [(parse_ms(r["ts"]), (r["host"], r["metric"]), float(r["value"]))
                for r in csv.DictReader(f)]
    (hourly,) = tumble_avg(rows, 3_600_000, 3_600_000).values()
    ends = sorted(hourly)
    scores = cusum([hourly[e] for e in ends], 2.0, 10.0, 48)
    return keep_firing_changes(
        [(e, c is not None and abs(c) > 10, "cusum %s (margin %s)" % (
            c, None if c is None else abs(abs(c) - 10))) for e, c in zip(ends, scores)],
        24 * 3_600_000)


def main():
    for name, changes in [("robust_z_or_new_extreme", robust_z_or_new_extreme()),
                          ("machine_multi_metric", machine_multi_metric()),
                          ("shift_or_spike level_shift", shift_or_spike_level_shift())]:
        print("== %s: %d changes, %d firing" % (
            name, len(changes), sum(1 for c in changes if c[0] == "firing")))
        for state, ms, note in changes:
            print("%s %s  %s" % (state, iso(ms), note))


if __name__ == "__main__":
    main()
