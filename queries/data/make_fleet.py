#!/usr/bin/env python3
"""Generate queries/data/fleet.csv: six hours of metrics from a small fleet, with incidents.

    python3 queries/data/make_fleet.py            # rewrites queries/data/fleet.csv
    python3 queries/data/make_fleet.py --summary  # also prints the incidents and the alerts
                                                  # each queries/pack/*.sql rule must raise

Deterministic (fixed seed, standard library only): re-running it gives the same file byte
for byte. The demo data set of the query pack (queries/pack/, see queries/README.md).

Shape:
- columns ts,host,cpu,mem,disk_io (the same as metrics.csv); ts is ISO-8601 UTC
  (`2024-06-03T08:00:00Z`); cpu and mem in percent (0..100), disk_io in operations/s;
- 9 hosts in two tiers: web-01 .. web-06 behind one load balancer (they share the
  traffic, so they look alike: cpu ~36 %, mem 48..58 %, disk_io ~40/s) and batch-01 ..
  batch-03 (busy workers: cpu ~77 %, mem ~68 %, disk_io ~230/s);
- each host reports every 10 s (host number i at second i of each 10 s), from 08:00:00
  to 13:59:5x: 6 hours, 2,160 rows per host; 19,350 rows (the silent host misses 90);
- web cpu follows a shared traffic wave (70-minute period), batch cpu a shared job wave
  (45 minutes), memory a slow mean-reverting walk, disk_io independent noise; no trend,
  so the first two hours are a fair sample of normal for the learned-range rule;
- about 0.2 % of rows arrive 10 to 20 s late in the file, never more than 20 s behind
  the largest timestamp already written: a stream declared with
  `WATERMARK FOR ts AS ts - INTERVAL '30' SECOND` drops none of them.

Incidents (all after 10:00, so the 08:00-10:00 training period of learned_range.sql is
clean), one host each, each meant for one pack rule:

  spike    web-01    10:20:00-10:22:30  cpu jumps to 85..97 % for 2.5 minutes
                     -> spike_vs_moving_average.sql and mad_own_history.sql
  hot      batch-02  10:50:00-11:15:00  cpu 91..97 % for 25 minutes (normal ~78 %)
                     -> high_cpu_sustained.sql
  drift    web-05    from 11:20 its cpu drifts up to 18 points above its peers by 12:00,
                     stays there until 13:00, is back to normal by 13:10
                     -> peer_outlier.sql
  leak     web-03    11:30:00-12:30:00  mem climbs 0.5 point a minute (+5 %/10 min,
                     50 -> 80 %), then the process restarts and mem drops back
                     -> memory_creep.sql
  disk_io  web-02    12:10:00-12:35:00  disk_io x3.5 (~45 -> ~160/s) -> learned_range.sql
  silent   web-04    13:00:00-13:15:00  no rows for 15 minutes -> no_data.sql
  crash    web-06    13:25:00-end  its application died, the node stays up: cpu ~2 %,
                     mem ~12 %, far from both tiers in (cpu, mem) -> dbscan_outlier.sql

`--summary` also replays each pack rule over the generated rows, in plain Python written
from the rule's SQL and the alert semantics of tests/cases/alert_*.case (independently of
vigil), and prints the alert changes it must emit: the expected values hard-coded in
tests/examples.rs come from there.
"""

import datetime as dt
import math
import os
import random
import statistics
import sys

SEED = 20240603
START = dt.datetime(2024, 6, 3, 8, 0, 0, tzinfo=dt.timezone.utc)
HOURS = 6
STEP_S = 10
MAX_DISORDER_S = 20  # the pack declares a 30 s watermark delay

# host -> (cpu baseline, cpu noise, mem baseline, disk_io baseline)
HOSTS = {
    "web-01": (36.0, 5.0, 48.0, 40.0),
    "web-02": (38.0, 5.0, 55.0, 45.0),
    "web-03": (35.0, 5.0, 50.0, 38.0),
    "web-04": (37.0, 5.0, 58.0, 42.0),
    "web-05": (37.0, 5.0, 52.0, 41.0),
    "web-06": (36.0, 5.0, 56.0, 44.0),
    "batch-01": (76.0, 4.0, 66.0, 220.0),
    "batch-02": (78.0, 4.0, 70.0, 240.0),
    "batch-03": (77.0, 4.0, 68.0, 230.0),
}


def at(hh, mm, ss=0):
    """Seconds since START of the wall-clock time hh:mm:ss (START is 08:00)."""
    return (hh - 8) * 3600 + mm * 60 + ss


# Incident periods, in seconds since START, [from, to).
SPIKE = ("web-01", at(10, 20), at(10, 22, 30))
HOT = ("batch-02", at(10, 50), at(11, 15))
DRIFT = ("web-05", at(11, 20), at(12, 0), at(13, 0), at(13, 10))  # ramp up, hold, ramp down
DRIFT_POINTS = 18.0
LEAK = ("web-03", at(11, 30), at(12, 30))
LEAK_PER_MIN = 0.5
DISK = ("web-02", at(12, 10), at(12, 35))
DISK_FACTOR = 3.5
SILENT = ("web-04", at(13, 0), at(13, 15))
CRASH = ("web-06", at(13, 25), HOURS * 3600)


def clamp(x, lo, hi):
    return max(lo, min(hi, x))


def iso(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def drift_amount(s):
    _, up, top, down, end = DRIFT
    if s < up or s >= end:
        return 0.0
    if s < top:
        return DRIFT_POINTS * (s - up) / (top - up)
    if s < down:
        return DRIFT_POINTS
    return DRIFT_POINTS * (end - s) / (end - down)


def generate():
    rng = random.Random(SEED)
    mem_state = {h: v[2] for h, v in HOSTS.items()}
    rows = []  # (emit_second, seq, ts_second, host, cpu, mem, disk_io)
    seq = 0
    for tick in range(0, HOURS * 3600, STEP_S):
        for i, (host, (cpu0, noise, mem0, io0)) in enumerate(HOSTS.items()):
            s = tick + i  # host i reports at second i of every 10 s
            if host.startswith("web"):
                wave = 6.0 * math.sin(2 * math.pi * s / 4200.0)  # shared traffic, 70 min
            else:
                wave = 3.0 * math.sin(2 * math.pi * s / 2700.0)  # shared job mix, 45 min
            cpu = cpu0 + wave + rng.gauss(0.0, noise)
            # memory: a slow walk that returns to the host's baseline
            mem_state[host] += 0.05 * (mem0 - mem_state[host]) + rng.gauss(0.0, 0.25)
            mem = mem_state[host]
            disk_io = io0 * (1.0 + rng.gauss(0.0, 0.2))
            delay = rng.choice([10, 15, 20]) if rng.random() < 0.002 else 0

            if host == SPIKE[0] and SPIKE[1] <= s < SPIKE[2]:
                cpu = rng.uniform(85.0, 97.0)
            if host == HOT[0] and HOT[1] <= s < HOT[2]:
                cpu = rng.uniform(91.0, 97.0)
            if host == DRIFT[0]:
                cpu += drift_amount(s)
            if host == LEAK[0] and LEAK[1] <= s < LEAK[2]:
                mem += LEAK_PER_MIN * (s - LEAK[1]) / 60.0
            if host == DISK[0] and DISK[1] <= s < DISK[2]:
                disk_io *= DISK_FACTOR
            if host == CRASH[0] and CRASH[1] <= s < CRASH[2]:
                cpu = rng.uniform(0.5, 3.5)
                mem = 12.0 + rng.gauss(0.0, 0.3)
            if host == SILENT[0] and SILENT[1] <= s < SILENT[2]:
                continue

            cpu = round(clamp(cpu, 0.1, 100.0), 1)
            mem = round(clamp(mem, 1.0, 99.0), 1)
            disk_io = round(max(0.0, disk_io), 1)
            if s + delay >= HOURS * 3600:
                delay = 0
            rows.append((s + delay, seq, s, host, cpu, mem, disk_io))
            seq += 1
    # File order: by the second a row is written; a delayed row comes after the rows that
    # belong to that second.
    rows.sort(key=lambda r: (r[0], r[1]))
    return [(r[2], r[3], r[4], r[5], r[6]) for r in rows]


def check(rows):
    """The guarantees the header promises; returns how far behind each late row is."""
    max_seen = None
    late_by = []
    for r in rows:
        s = r[0]
        if max_seen is not None and s < max_seen:
            late_by.append(max_seen - s)
            assert max_seen - s <= MAX_DISORDER_S, r
        max_seen = s if max_seen is None or s > max_seen else max_seen
    assert late_by, "the file should contain some out-of-order rows"
    per_host = {}
    for s, host, *_ in rows:
        per_host.setdefault(host, []).append(s)
    gaps = {}
    for h, v in per_host.items():
        v.sort()
        gaps[h] = max(b - a for a, b in zip(v, v[1:]))
    assert all(g == STEP_S for h, g in gaps.items() if h != SILENT[0]), gaps
    return late_by


# ---------------------------------------------------------------------------------------
# Reference evaluation of the pack rules (queries/pack/*.sql), from their text.
# Times are seconds since START; a window is named by its end.
# ---------------------------------------------------------------------------------------


def windows(rows, size_s, column):
    """{host: [(window_end, avg(column))]} in window order (no row, no window)."""
    index = {"cpu": 2, "mem": 3, "disk_io": 4}[column]
    acc = {}
    for r in rows:
        end = (r[0] // size_s + 1) * size_s
        acc.setdefault(r[1], {}).setdefault(end, []).append(r[index])
    return {
        h: [(end, sum(v) / len(v)) for end, v in sorted(per.items())]
        for h, per in acc.items()
    }


def alert_changes(series, step_s, when, resolve=None, hold_rows=None, hold_s=None):
    """The changes [(t, 'firing' | 'resolved')] of one key's rows [(t, values)] under the
    alert state machine:
    pending -> firing after `hold_rows` consecutive rows or `hold_s` of event time since
    the first true row, a skipped window (a gap > step_s) breaking a pending episode;
    firing -> resolved when `resolve` (default: `when` is not true)."""
    changes = []
    phase, since, count, last = "inactive", None, 0, None
    for t, v in series:
        skipped = last is not None and t - last > step_s
        last = t
        if phase == "pending" and skipped:
            phase = "inactive"
        holds = when(v)
        if phase == "firing":
            if resolve(v) if resolve else not holds:
                phase = "inactive"
                changes.append((t, "resolved"))
            continue
        if not holds:
            phase = "inactive"
            continue
        if phase == "inactive":
            phase, since, count = "pending", t, 0
        count += 1
        fires = (hold_rows is None and hold_s is None) or (
            hold_rows is not None and count >= hold_rows
        ) or (hold_s is not None and t - since >= hold_s)
        if fires:
            phase = "firing"
            changes.append((t, "firing"))
    return changes


def rule_high_cpu(rows):
    out = []
    for host, series in windows(rows, 60, "cpu").items():
        for t, state in alert_changes(
            series, 60, lambda x: x > 90, lambda x: x < 80, hold_s=600
        ):
            out.append((t, host, state))
    return out


def rule_memory_creep(rows):
    out = []
    for host, series in windows(rows, 300, "mem").items():
        rated = []
        for k, (t, m) in enumerate(series):
            growth = m - series[k - 6][1] if k >= 6 else None
            rise = m - series[k - 1][1] if k >= 1 else None
            rated.append((t, (growth, rise)))
        for t, state in alert_changes(
            rated,
            300,
            lambda v: v[0] is not None and v[0] > 10 and v[1] > 1,
            lambda v: v[0] is not None and v[0] < 3,
            hold_rows=3,
        ):
            out.append((t, host, state))
    return out


def rule_spike(rows):
    out = []
    for host, series in windows(rows, 60, "cpu").items():
        rated = []
        for k, (t, x) in enumerate(series):
            if k >= 5:  # the query keeps rows with 5 earlier windows
                baseline = sum(v for _, v in series[k - 5 : k]) / 5
                rated.append((t, (x, baseline)))
        for t, state in alert_changes(
            rated, 60, lambda v: v[0] > v[1] + 30, lambda v: v[0] < v[1] + 15
        ):
            out.append((t, host, state))
    return out


def mad(values):
    m = statistics.median(values)
    return statistics.median(abs(v - m) for v in values)


def rule_mad(rows):
    out = []
    for host, series in windows(rows, 60, "cpu").items():
        rated = []
        for k, (t, x) in enumerate(series):
            recent = [v for _, v in series[max(0, k - 29) : k + 1]]
            if len(recent) < 10:  # the query keeps rows with 10 minutes of history
                continue
            typical, spread = statistics.median(recent), mad(recent)
            score = 0.6745 * (x - typical) / spread if spread else None
            rated.append((t, (x, typical, score)))
        for t, state in alert_changes(
            rated,
            60,
            lambda v: v[2] is not None and v[2] > 5 and v[0] - v[1] > 25,
        ):
            out.append((t, host, state))
    return out


def robust_z(x, values):
    m = statistics.median(values)
    spread = mad(values)
    if spread:
        return 0.6745 * (x - m) / spread
    mean_ad = sum(abs(v - m) for v in values) / len(values)
    return (x - m) / (1.253314 * mean_ad) if mean_ad else 0.0


def by_window(per_host):
    """{window_end: {host: value}} from {host: [(window_end, value)]}."""
    out = {}
    for host, series in per_host.items():
        for t, v in series:
            out.setdefault(t, {})[host] = v
    return out


def rule_peer(rows):
    cpu = by_window(windows(rows, 60, "cpu"))
    rated = {}
    for t, hosts in sorted(cpu.items()):
        tiers = {}
        for h, v in hosts.items():
            tiers.setdefault(h.split("-")[0], {})[h] = v
        for peers in tiers.values():
            values = list(peers.values())
            m = statistics.median(values)
            for h, v in peers.items():
                z = robust_z(v, values)
                rated.setdefault(h, []).append((t, (len(values), z, v - m)))
    out = []
    for host, series in rated.items():
        for t, state in alert_changes(
            series,
            60,
            lambda v: v[0] >= 5 and v[1] > 3.5 and v[2] > 10,
            lambda v: v[2] < 5,
            hold_s=600,
        ):
            out.append((t, host, state))
    return out


def dbscan_noise(points, eps, min_pts):
    """Hosts that are noise: not core and within eps of no core point (order-free)."""
    near = {
        h: [g for g, q in points.items() if math.dist(p, q) <= eps]
        for h, p in points.items()
    }
    core = {h for h, n in near.items() if len(n) >= min_pts}
    return {h for h, n in near.items() if h not in core and not core.intersection(n)}


def rule_dbscan(rows):
    cpu = by_window(windows(rows, 60, "cpu"))
    mem = by_window(windows(rows, 60, "mem"))
    rated = {}
    for t in sorted(cpu):
        points = {h: (cpu[t][h], mem[t][h]) for h in cpu[t]}
        noise = dbscan_noise(points, 30.0, 3)
        for h in points:
            rated.setdefault(h, []).append((t, h in noise))
    out = []
    for host, series in rated.items():
        for t, state in alert_changes(series, 60, lambda n: n, hold_rows=5):
            out.append((t, host, state))
    return out


def rule_learned_range(rows):
    io = windows(rows, 60, "disk_io")
    first = min(series[0][0] for series in io.values())  # the first window to close
    out = []
    for host, series in io.items():
        trained = [v for t, v in series if t < first + 2 * 3600]
        lo, hi = min(trained), max(trained)
        judged = [(t, not lo <= v <= hi) for t, v in series if t >= first + 2 * 3600]
        for t, state in alert_changes(judged, 60, lambda v: v, hold_rows=5):
            out.append((t, host, state))
    return out


def rule_no_data(rows):
    out = []
    per_host = {}
    for s, host, *_ in rows:
        per_host.setdefault(host, []).append(s)
    for host, times in per_host.items():
        times.sort()
        for a, b in zip(times, times[1:]):
            if b - a > 300:
                out.append((a + 300, host, "firing"))
                out.append((b, host, "resolved"))
    return out


RULES = [
    ("high_cpu_sustained.sql", rule_high_cpu),
    ("memory_creep.sql", rule_memory_creep),
    ("spike_vs_moving_average.sql", rule_spike),
    ("mad_own_history.sql", rule_mad),
    ("peer_outlier.sql", rule_peer),
    ("dbscan_outlier.sql", rule_dbscan),
    ("learned_range.sql", rule_learned_range),
    ("no_data.sql", rule_no_data),
]


def clock(s):
    return (START + dt.timedelta(seconds=s)).strftime("%Y-%m-%dT%H:%M:%S")


def summary(rows, late_by):
    print(f"rows={len(rows)} hosts={len(HOSTS)} out_of_order_rows={len(late_by)} "
          f"max_behind_s={max(late_by)}")
    print(f"first={clock(rows[0][0])} last={clock(max(r[0] for r in rows))}")
    print("incidents (host, from, to):")
    for name, spec in [("spike", SPIKE), ("hot", HOT), ("leak", LEAK), ("disk_io", DISK),
                       ("silent", SILENT), ("crash", CRASH)]:
        print(f"  {name:8} {spec[0]:9} {clock(spec[1])} {clock(spec[2])}")
    print(f"  {'drift':8} {DRIFT[0]:9} {clock(DRIFT[1])} {clock(DRIFT[4])} "
          f"(+{DRIFT_POINTS:g} cpu points from {clock(DRIFT[2])} to {clock(DRIFT[3])})")
    print("expected alert changes (file: host state event_time, ...):")
    for name, rule in RULES:
        changes = sorted(rule(rows))
        text = ", ".join(f"{h} {state} {clock(t)}" for t, h, state in changes) or "none"
        print(f"  {name}: {text}")


def main():
    rows = generate()
    late_by = check(rows)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fleet.csv")
    with open(out, "w", newline="\n") as f:
        f.write("ts,host,cpu,mem,disk_io\n")
        for s, host, cpu, mem, disk_io in rows:
            t = START + dt.timedelta(seconds=s)
            f.write(f"{iso(t)},{host},{cpu},{mem},{disk_io}\n")
    if "--summary" in sys.argv:
        summary(rows, late_by)


if __name__ == "__main__":
    main()
