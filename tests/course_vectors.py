#!/usr/bin/env python3
"""Independent inputs and expected results for the three course_*.case conformance cases.

How it was run (from the repository root, Python 3.11, standard library only):

    python3 tests/course_vectors.py                # prints inputs' summary + expected outputs;
                                                   # writes nothing
    python3 tests/course_vectors.py --write-cases  # rewrites tests/cases/course_*.case from
                                                   # scratch (comment, input, SQL, expected output)
    python3 tests/course_vectors.py --check        # exit 1 if a course_*.case on disk differs
                                                   # from what --write-cases would write

The inputs imitate the `task_events` table of the Google cluster trace (2011): columns
ts (epoch milliseconds), job, task, machine (empty = NULL for SUBMIT, as in the trace),
event_type (SUBMIT, SCHEDULE, EVICT, FAIL, FINISH, KILL, LOST). They come from a small
task-lifecycle simulation driven by a fixed 64-bit LCG (no `random` module), so they are
identical on every Python version. Rows are written in arrival order: time order, except
that a few rows are delayed by less than the declared watermark delay (so none is late).

The expected results apply the rules of /work/shared/spec/semantics.md and the rules for
HOP / SESSION below directly, with no vigil code involved:

- watermark = largest ts seen so far on the stream - delay, checked before each row;
- TUMBLE(size): the row goes to [k*size, (k+1)*size);
- HOP(slide, size): the row goes to every [k*slide, k*slide + size) containing it; it is
  late only when every such window has window_end <= watermark (else it is counted in the
  windows still open);
- SESSION(gap) per key: a row at t opens [t, t + gap); overlapping sessions of the key merge
  (half-open, so rows exactly gap apart do not); it is late when t + gap <= watermark;
- WHERE is applied before the window; a (window, key) with no rows emits nothing;
- cascading: the outer GROUP BY window_start, window_end counts the inner rows that pass
  HAVING, per window; a window whose inner result is empty emits nothing;
- at the end of the input every open window fires.

The script also asserts what makes each case interesting (empty windows present, out-of-
order rows present, no row late, no session merge with an already fired session, ...), and
recomputes each result a second way, in batch over the whole input (valid since no row is
late), which must give the same groups as the row-by-row streaming computation.

`--dump NAME` prints the input CSV of the case whose file name contains NAME (handy for
checking a window by hand with awk).
"""

import argparse
import datetime as dt
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = os.path.join(HERE, "cases")
EPOCH = dt.datetime(1970, 1, 1)
SEC = 1000
MIN = 60 * SEC

NEG_INF = float("-inf")


# ---------------------------------------------------------------------------------------
# deterministic pseudo-random numbers


class Lcg:
    """64-bit LCG (Knuth's MMIX constants); uses the high 31 bits."""

    MASK = (1 << 64) - 1

    def __init__(self, seed):
        self.state = seed & self.MASK

    def next(self):
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) & self.MASK
        return self.state >> 33

    def below(self, n):
        return self.next() % n

    def between(self, lo, hi):
        """Uniform integer in [lo, hi]."""
        return lo + self.below(hi - lo + 1)

    def chance(self, percent):
        return self.below(100) < percent

    def pick(self, seq):
        return seq[self.below(len(seq))]


# ---------------------------------------------------------------------------------------
# task_events simulation

# (ts_ms, job, task, machine or None, event_type)


def task_lifecycle(rng, job, task, t_submit, machines, run_ms, end_weights, limit=None,
                   max_attempts=3):
    """Events of one task: SUBMIT, SCHEDULE, then an end event; EVICT / FAIL / LOST are
    followed by a resubmission (up to max_attempts). `limit` caps every event time (the end
    event is pulled before it) so a phase of the simulation can end cleanly."""
    events = []
    t = t_submit
    for attempt in range(max_attempts):
        events.append((t, job, task, None, "SUBMIT"))
        t += rng.between(200, 20 * SEC)
        machine = rng.pick(machines)
        events.append((t, job, task, machine, "SCHEDULE"))
        t_end = t + rng.between(*run_ms)
        if limit is not None and t_end >= limit:
            t_end = limit - rng.between(1, 5 * SEC)
            assert t_end > t, (job, task)
        t = t_end
        kind = weighted(rng, end_weights)
        if attempt == max_attempts - 1 and kind in ("EVICT", "FAIL", "LOST"):
            kind = "KILL"
        events.append((t, job, task, machine, kind))
        if kind not in ("EVICT", "FAIL", "LOST"):
            break
        t += rng.between(500, 15 * SEC)  # resubmitted shortly after
        if limit is not None and t + 60 * SEC >= limit:
            break
    return events


def weighted(rng, weights):
    total = sum(w for _, w in weights)
    x = rng.below(total)
    for name, w in weights:
        if x < w:
            return name
        x -= w
    raise AssertionError


def job_events(rng, job, t_start, ntasks, machines, run_ms, end_weights, spacing_ms,
               limit=None):
    out = []
    for task in range(ntasks):
        t = t_start + task * spacing_ms + rng.between(0, spacing_ms // 2)
        out.extend(task_lifecycle(rng, job, task, t, machines, run_ms, end_weights, limit))
    return out


def arrival_order(rng, events, jitter_ms, percent):
    """Time order, except that `percent` % of the rows are delayed by up to jitter_ms.
    Sorting by (ts + delay) keeps every row within jitter_ms of the largest ts before it."""
    keyed = []
    for i, e in enumerate(sorted(events)):
        delay = rng.between(1, jitter_ms) if rng.chance(percent) else 0
        keyed.append((e[0] + delay, i, e))
    keyed.sort()
    return [e for _, _, e in keyed]


END_MIX = [("FINISH", 60), ("FAIL", 12), ("KILL", 10), ("EVICT", 12), ("LOST", 6)]


def gen_terminations():
    """About 12 minutes of short tasks; minute [00:17, 00:18) has no event at all,
    minute [00:18, 00:19) only SUBMIT / SCHEDULE events."""
    rng = Lcg(2011)
    machines = [101, 102, 103, 104, 105, 106]
    ev = []
    # phase A: jobs 1..6 submitted 00:10 .. 00:13, everything over before 00:17
    for j in range(6):
        ev += job_events(rng, 1 + j, 10 * MIN + j * 30 * SEC + rng.between(0, 9999),
                         rng.between(2, 5), machines, (10 * SEC, 150 * SEC), END_MIX,
                         8 * SEC, limit=17 * MIN)
    # explicit boundary rows: a task of job 7 ending exactly at 00:14:00 and one ending
    # 1 ms before 00:15:00
    ev += [(13 * MIN + 5 * SEC, 7, 0, None, "SUBMIT"),
           (13 * MIN + 9 * SEC, 7, 0, 104, "SCHEDULE"),
           (14 * MIN, 7, 0, 104, "FINISH"),
           (13 * MIN + 6 * SEC, 7, 1, None, "SUBMIT"),
           (13 * MIN + 11 * SEC, 7, 1, 105, "SCHEDULE"),
           (15 * MIN - 1, 7, 1, 105, "KILL"),
           # task 2 FINISHes at 00:15:59.800 but arrives after the FAIL of task 3 at
           # 00:16:02 (2.2 s out of order, inside the 5 s delay: not late)
           (15 * MIN + 20 * SEC, 7, 2, None, "SUBMIT"),
           (15 * MIN + 24 * SEC, 7, 2, 106, "SCHEDULE"),
           (16 * MIN - 200, 7, 2, 106, "FINISH"),
           (15 * MIN + 30 * SEC, 7, 3, None, "SUBMIT"),
           (15 * MIN + 33 * SEC, 7, 3, 101, "SCHEDULE"),
           (16 * MIN + 2 * SEC, 7, 3, 101, "FAIL")]
    # phase B: long tasks of job 8 submitted and scheduled in minute 00:18 only
    for task in range(4):
        t = 18 * MIN + task * 9 * SEC + rng.between(0, 4000)
        m = rng.pick(machines)
        ev.append((t, 8, task, None, "SUBMIT"))
        ev.append((t + rng.between(1000, 5000), 8, task, m, "SCHEDULE"))
        end = 19 * MIN + 30 * SEC + task * 40 * SEC + rng.between(0, 9999)
        ev.append((end, 8, task, m, weighted(rng, END_MIX[:3])))
    # phase C: jobs 9..12 from 00:19:10
    for j in range(4):
        ev += job_events(rng, 9 + j, 19 * MIN + 10 * SEC + j * 35 * SEC + rng.between(0, 9999),
                         rng.between(2, 4), machines, (15 * SEC, 120 * SEC), END_MIX, 6 * SEC)
    rows = arrival_order(rng, ev, 4 * SEC, 35)
    moved = (16 * MIN - 200, 7, 2, 106, "FINISH")
    rows.remove(moved)
    rows.insert(rows.index((16 * MIN + 2 * SEC, 7, 3, 101, "FAIL")) + 1, moved)
    return rows


def gen_busy():
    """About an hour on 8 machines: busy from 00:10, a lull around 00:40, busy again
    from 00:55. Machines 201 and 202 get more work than the others."""
    rng = Lcg(42)
    machines = [201, 201, 201, 202, 202, 203, 204, 205, 206, 207, 208]
    mix = [("FINISH", 70), ("FAIL", 8), ("KILL", 8), ("EVICT", 10), ("LOST", 4)]
    ev = []
    job = 1
    t = 10 * MIN
    while t < 33 * MIN:
        ev += job_events(rng, job, t, rng.between(1, 3), machines, (30 * SEC, 6 * MIN), mix,
                         20 * SEC, limit=40 * MIN)
        job += 1
        t += rng.between(40 * SEC, 110 * SEC)
    # the lull: two single-task jobs
    for t in (43 * MIN + 17 * SEC, 49 * MIN + 3 * SEC):
        ev += job_events(rng, job, t, 1, machines, (2 * MIN, 4 * MIN), mix[:1], 1,
                         limit=55 * MIN)
        job += 1
    t = 55 * MIN
    while t < 68 * MIN:
        ev += job_events(rng, job, t, rng.between(1, 3), machines, (30 * SEC, 5 * MIN), mix,
                         20 * SEC)
        job += 1
        t += rng.between(30 * SEC, 100 * SEC)
    return arrival_order(rng, ev, 20 * SEC, 10)


def gen_sessions():
    """Ten jobs over about 1h40; each job works in bursts, and some pause for more than
    10 minutes. Job 4 pauses exactly 10 minutes (two sessions), job 5 pauses 10 minutes
    less 1 ms (one session)."""
    rng = Lcg(7)
    machines = [301, 302, 303, 304, 305]
    ev = []
    bursts = {  # job -> list of (burst start minute, number of tasks)
        1: [(10, 3)],
        2: [(11, 2), (32, 2)],
        3: [(14, 4), (30, 1), (58, 2)],
        6: [(20, 2), (36, 3)],
        7: [(25, 5)],
        8: [(40, 2), (47, 2), (75, 1)],
        9: [(62, 3)],
        10: [(66, 1), (90, 2)],
    }
    for job, plan in bursts.items():
        for start_min, ntasks in plan:
            ev += job_events(rng, job, start_min * MIN + rng.between(0, 50 * SEC), ntasks,
                             machines, (20 * SEC, 4 * MIN), END_MIX, 30 * SEC)
    # job 4: a task ends at 00:22:13.500; the next SUBMIT is exactly 10 minutes later
    ev += [(18 * MIN + 2 * SEC, 4, 0, None, "SUBMIT"),
           (18 * MIN + 6 * SEC, 4, 0, 302, "SCHEDULE"),
           (22 * MIN + 13 * SEC + 500, 4, 0, 302, "FINISH"),
           (32 * MIN + 13 * SEC + 500, 4, 1, None, "SUBMIT"),
           (32 * MIN + 15 * SEC, 4, 1, 304, "SCHEDULE"),
           (34 * MIN, 4, 1, 304, "FINISH")]
    # job 5: a task ends at 00:50:00; the next SUBMIT is 9:59.999 later
    ev += [(46 * MIN + 30 * SEC, 5, 0, None, "SUBMIT"),
           (46 * MIN + 31 * SEC, 5, 0, 305, "SCHEDULE"),
           (50 * MIN, 5, 0, 305, "FINISH"),
           (60 * MIN - 1, 5, 1, None, "SUBMIT"),
           (60 * MIN + 4 * SEC, 5, 1, 301, "SCHEDULE"),
           (61 * MIN + 30 * SEC, 5, 1, 301, "LOST"),
           (61 * MIN + 40 * SEC, 5, 1, None, "SUBMIT"),
           (61 * MIN + 44 * SEC, 5, 1, 303, "SCHEDULE"),
           (63 * MIN, 5, 1, 303, "FINISH")]
    return arrival_order(rng, ev, 45 * SEC, 10)


# ---------------------------------------------------------------------------------------
# window semantics


def tumble_windows(size):
    return lambda t: [(t - t % size, t - t % size + size)]


def hop_windows(slide, size, offset=0):
    def windows(t):
        k_hi = (t - offset) // slide            # last window starting at or before t
        k_lo = (t - offset - size) // slide + 1  # first window ending after t
        return [(k * slide + offset, k * slide + offset + size) for k in range(k_lo, k_hi + 1)]
    return windows


class Stats:
    def __init__(self):
        self.rows = 0
        self.late = 0
        self.out_of_order = 0
        self.partly_late = 0
        self.max_disorder = 0  # largest (max ts seen before a row) - (its ts), ms


def run_windows(rows, ts_of, delay, windows_of, key_of, where=lambda r: True):
    """TUMBLE / HOP with EMIT ON WINDOW CLOSE. Returns ({(start, end, key): [rows]}, stats)."""
    wm = NEG_INF
    max_ts = NEG_INF
    groups = {}
    st = Stats()
    for r in rows:
        st.rows += 1
        t = ts_of(r)
        if t < max_ts:
            st.out_of_order += 1
            st.max_disorder = max(st.max_disorder, max_ts - t)
        if where(r):
            ws = windows_of(t)
            assert ws and all(s <= t < e for s, e in ws)
            open_ws = [(s, e) for s, e in ws if e > wm]
            if not open_ws:
                st.late += 1
            else:
                if len(open_ws) < len(ws):
                    st.partly_late += 1
                for s, e in open_ws:
                    groups.setdefault((s, e, key_of(r)), []).append(r)
        max_ts = max(max_ts, t)
        wm = max_ts - delay
    return groups, st


def run_sessions(rows, ts_of, delay, gap, key_of, where=lambda r: True):
    """SESSION per key. Returns ({(start, end, key): [rows]}, stats)."""
    wm = NEG_INF
    max_ts = NEG_INF
    open_s = {}   # key -> list of [start, end, rows]
    fired = {}    # key -> list of (start, end)
    out = {}
    st = Stats()

    def fire(limit):
        for key, sessions in open_s.items():
            keep = []
            for s in sessions:
                if s[1] <= limit:
                    out[(s[0], s[1], key)] = s[2]
                    fired.setdefault(key, []).append((s[0], s[1]))
                else:
                    keep.append(s)
            open_s[key] = keep

    for r in rows:
        st.rows += 1
        t = ts_of(r)
        if t < max_ts:
            st.out_of_order += 1
            st.max_disorder = max(st.max_disorder, max_ts - t)
        if where(r):
            key = key_of(r)
            if t + gap <= wm:
                st.late += 1
            else:
                start, end, members = t, t + gap, [r]
                # a row that would reach into an already fired session is left undefined by
                # the rules; the generated inputs must never contain one
                for fs, fe in fired.get(key, []):
                    assert not (fs < end and start < fe), ("merge with fired session", r)
                keep = []
                for s in open_s.get(key, []):
                    if s[0] < end and start < s[1]:
                        start, end, members = min(start, s[0]), max(end, s[1]), s[2] + members
                    else:
                        keep.append(s)
                keep.append([start, end, members])
                open_s[key] = keep
        max_ts = max(max_ts, t)
        wm = max_ts - delay
        fire(wm)
    fire(float("inf"))
    for (s, e, _), members in out.items():
        ts = [ts_of(m) for m in members]
        assert s == min(ts) and e == max(ts) + gap
    return out, st


def batch_windows(rows, ts_of, windows_of, key_of, where):
    """Second, non-streaming computation (valid when no row is late): every row into every
    window that contains it, found by scanning the window grid."""
    out = {}
    for r in rows:
        if where(r):
            for s, e in windows_of(ts_of(r)):
                out.setdefault((s, e, key_of(r)), []).append(r)
    return out


def batch_sessions(rows, ts_of, gap, key_of):
    """Second, non-streaming computation (valid when no row is late): sort each key's
    rows by time and cut wherever two neighbours are gap or more apart."""
    out = {}
    by_key = {}
    for r in rows:
        by_key.setdefault(key_of(r), []).append(r)
    for key, rs in by_key.items():
        rs = sorted(rs, key=ts_of)
        cur = [rs[0]]
        for r in rs[1:]:
            if ts_of(r) - ts_of(cur[-1]) >= gap:
                out[(ts_of(cur[0]), ts_of(cur[-1]) + gap, key)] = cur
                cur = []
            cur.append(r)
        out[(ts_of(cur[0]), ts_of(cur[-1]) + gap, key)] = cur
    return out


def same_groups(a, b):
    norm = lambda g: {k: sorted(v, key=repr) for k, v in g.items()}
    return norm(a) == norm(b)


# ---------------------------------------------------------------------------------------
# the three cases

TS, JOB, TASK, MACHINE, TYPE = range(5)


def iso(ms):
    text = (EPOCH + dt.timedelta(milliseconds=ms)).strftime("%Y-%m-%dT%H:%M:%S")
    return text + (".%03d" % (ms % 1000) if ms % 1000 else "")


def csv_input(rows):
    lines = ["ts,job,task,machine,event_type"]
    for ts, job, task, machine, kind in rows:
        lines.append(f"{ts},{job},{task},{'' if machine is None else machine},{kind}")
    return "\n".join(lines)


def create_stream(delay_text):
    return (
        "CREATE STREAM task_events (\n"
        "  ts TIMESTAMP, job BIGINT, task BIGINT, machine BIGINT, event_type TEXT,\n"
        f"  WATERMARK FOR ts AS ts - INTERVAL {delay_text}\n"
        ") WITH (connector = 'file', path = 'task_events.csv', format = 'csv');\n"
    )


def case_terminations():
    rows = gen_terminations()
    delay = 5 * SEC
    terminal = ("FINISH", "FAIL", "KILL")
    groups, st = run_windows(rows, lambda r: r[TS], delay, tumble_windows(MIN),
                             lambda r: (), lambda r: r[TYPE] in terminal)
    assert st.late == 0 and st.out_of_order > 0
    assert same_groups(groups, batch_windows(rows, lambda r: r[TS], tumble_windows(MIN),
                                             lambda r: (), lambda r: r[TYPE] in terminal))
    out = []
    for (s, e, _), members in sorted(groups.items()):
        counts = [sum(1 for m in members if m[TYPE] == k) for k in terminal]
        out.append(f"{iso(s)},{iso(e)},{counts[0]},{counts[1]},{counts[2]}")
    # what makes the case interesting
    minutes_any = {r[TS] // MIN for r in rows}
    minutes_term = {r[TS] // MIN for r in rows if r[TYPE] in terminal}
    assert 17 not in minutes_any, "minute 00:17 must be empty"
    assert 18 in minutes_any and 18 not in minutes_term, "minute 00:18 without terminations"
    for k in terminal:
        assert any(r[TYPE] == k for r in rows), k
    sql = create_stream("'5' SECOND") + (
        "\n"
        "SELECT window_start, window_end,\n"
        "  count(*) FILTER (WHERE event_type = 'FINISH') AS finished,\n"
        "  count(*) FILTER (WHERE event_type = 'FAIL') AS failed,\n"
        "  count(*) FILTER (WHERE event_type = 'KILL') AS killed\n"
        "FROM TUMBLE(task_events, ts, INTERVAL '1' MINUTE)\n"
        "WHERE event_type IN ('FINISH', 'FAIL', 'KILL')\n"
        "GROUP BY window_start, window_end;"
    )
    header = "window_start,window_end,finished,failed,killed"
    comment = f"""\
# Google cluster-trace shape (task_events): per 1 minute tumbling window, the number
# of FINISH, FAIL and KILL events, one row per window. Generated by
#   python3 tests/course_vectors.py --write-cases
# (a {len(rows)}-row task-lifecycle simulation, ts in epoch ms from 00:10:00; the
# script implements the window rules itself). Watermark delay 5 s; {st.out_of_order} rows
# arrive out of order, by at most {st.max_disorder} ms, so no row is late.
# - The WHERE keeps the three terminal kinds only, so a window with no FINISH /
#   FAIL / KILL emits nothing: [00:17, 00:18) has no event at all, [00:18, 00:19)
#   only SUBMIT / SCHEDULE of job 8 (its ends come from 00:19:30 on).
# - Boundaries: job 7 task 0 FINISHes at exactly 00:14:00 (counted in [00:14,
#   00:15)), job 7 task 1 is KILLed at 00:14:59.999 (also [00:14, 00:15)).
# - Out of order across a window boundary: the FINISH of job 7 task 2 at
#   00:15:59.800 arrives after the FAIL at 00:16:02 (watermark 00:15:57 < 00:16:00,
#   not late) and is counted in [00:15, 00:16).
# - EVICT / LOST / SUBMIT / SCHEDULE rows are filtered out before the window.
# Hand-checked (awk over the input): [00:10, 00:11) has one terminal row, the FAIL
# of job 2 task 0 at 00:10:58.036 -> 0,1,0; [00:13, 00:14) FINISH x5 (00:13:06.946,
# 10.185, 12.005, 21.511, 28.039), KILL x2 (00:13:41.593, 54.242), LOST ignored
# -> 5,0,2; [00:14, 00:15) FINISH at 00:14:00, 05.763, 16.055 and the KILL at
# 00:14:59.999 -> 3,0,1; [00:15, 00:16) FINISH 09.568, 22.869, 59.800 -> 3,0,0;
# [00:16, 00:17) FAIL 02.000, FINISH 34.385 -> 1,1,0.
"""
    return "course_tumble_terminations.case", comment, rows, sql, header, out, st


def case_busy():
    rows = gen_busy()
    delay = 30 * SEC
    slide, size = 5 * MIN, 15 * MIN
    groups, st = run_windows(rows, lambda r: r[TS], delay, hop_windows(slide, size),
                             lambda r: r[MACHINE], lambda r: r[TYPE] == "SCHEDULE")
    assert st.late == 0 and st.out_of_order > 0
    assert same_groups(groups, batch_windows(rows, lambda r: r[TS], hop_windows(slide, size),
                                             lambda r: r[MACHINE],
                                             lambda r: r[TYPE] == "SCHEDULE"))
    busy = {}  # (start, end) -> number of machines with >= 3 SCHEDULE
    all_windows = set()
    for (s, e, machine), members in groups.items():
        all_windows.add((s, e))
        if len(members) >= 3:
            busy[(s, e)] = busy.get((s, e), 0) + 1
    assert all_windows - set(busy), "some window with SCHEDULE rows must have no busy machine"
    out = [f"{iso(e)},{n}" for (s, e), n in sorted(busy.items())]
    sql = create_stream("'30' SECOND") + (
        "\n"
        "SELECT window_end, count(*) AS busy\n"
        "FROM (\n"
        "  SELECT window_start, window_end, machine, count(*) AS n\n"
        "  FROM HOP(task_events, ts, INTERVAL '5' MINUTE, INTERVAL '15' MINUTE)\n"
        "  WHERE event_type = 'SCHEDULE'\n"
        "  GROUP BY window_start, window_end, machine\n"
        "  HAVING count(*) >= 3\n"
        ")\n"
        "GROUP BY window_start, window_end;"
    )
    header = "window_end,busy"
    detail = []
    for (s, e) in sorted(all_windows):
        per = sorted(((m, len(v)) for (ws, we, m), v in groups.items() if (ws, we) == (s, e)))
        detail.append(f"#   [{iso(s)[11:16]}, {iso(e)[11:16]}): "
                      + " ".join(f"{m}:{n}" for m, n in per))
    comment = f"""\
# Google cluster-trace shape (task_events): sliding windows of 15 min every 5 min;
# a machine is busy in a window when it has at least 3 SCHEDULE events there; the
# cascading query emits (window_end, number of busy machines). Generated by
#   python3 tests/course_vectors.py --write-cases
# (a {len(rows)}-row task-lifecycle simulation on 8 machines, ts in epoch ms from 00:10;
# the script implements the window rules itself). Watermark delay 30 s; {st.out_of_order}
# rows arrive out of order, by at most {st.max_disorder} ms, so no row is late.
# Each row is in 3 windows; a window ends on every multiple of 5 min. The lull
# (only two single-task jobs between 00:40 and 00:55) gives windows that have
# SCHEDULE rows but no busy machine; they emit nothing, as do [00:00, 00:15) (the
# input starts at 00:10) and [01:10, 01:25). HAVING >= 3 is inclusive: machine 201
# with exactly 3 SCHEDULE in [00:30, 00:45) is busy (the only one there).
# SCHEDULE events per machine and window (machine:count):
""" + "\n".join(detail) + """
# Hand-checked (awk over the input): [00:00, 00:15) 202:2 206:2 207:2 -> nothing;
# [00:05, 00:20) 202:4 207:3 -> busy 2; [00:30, 00:45) 201:3 (00:31:59.120,
# 00:32:36.834, 00:43:25.486) -> busy 1; [00:40, 00:55) 201:1 207:1 -> nothing.
"""
    return "course_hop_busy_machines.case", comment, rows, sql, header, out, st


def case_sessions():
    rows = gen_sessions()
    delay = 1 * MIN
    gap = 10 * MIN
    groups, st = run_sessions(rows, lambda r: r[TS], delay, gap, lambda r: r[JOB])
    assert st.late == 0 and st.out_of_order > 0
    assert same_groups(groups, batch_sessions(rows, lambda r: r[TS], gap, lambda r: r[JOB]))
    out = [f"{job},{iso(s)},{iso(e)},{len(m)}"
           for (s, e, job), m in sorted(groups.items(), key=lambda kv: (kv[0][2], kv[0][0]))]
    sql = create_stream("'1' MINUTE") + (
        "\n"
        "SELECT job, window_start, window_end, count(*) AS n_events\n"
        "FROM SESSION(task_events, ts, INTERVAL '10' MINUTE)\n"
        "GROUP BY window_start, window_end, job;"
    )
    header = "job,window_start,window_end,n_events"
    comment = f"""\
# Google cluster-trace shape (task_events): session windows with a 10 minute gap per
# job: job, window_start (first event), window_end (last event + 10 min), number of
# events. Generated by
#   python3 tests/course_vectors.py --write-cases
# (a {len(rows)}-row task-lifecycle simulation of 10 jobs working in bursts, ts in epoch
# ms from 00:10; the script implements the session rules itself). Watermark delay
# 1 min; {st.out_of_order} rows arrive out of order, by at most {st.max_disorder} ms, so no row is late
# and no row reaches into a session that has already fired.
# - job 4: FINISH at 00:22:13.500, next SUBMIT exactly 10 min later at 00:32:13.500
#   -> two sessions, [00:18:02, 00:32:13.500) and [00:32:13.500, 00:44:00).
# - job 5: FINISH at 00:50:00, next SUBMIT at 00:59:59.999 (1 ms inside the gap)
#   -> one session [00:46:30, 01:13:00) of 9 events.
# - jobs with one burst have one session; a pause of more than 10 min between
#   bursts splits the job (job 3: three sessions).
# Sessions still open at the end of the input fire there.
# Hand-checked (awk over the input): job 2 has events 00:12:00.875 .. 00:15:13.628
# (6) and 00:32:20.481 .. 00:37:32.893 (9) -> [00:12:00.875, 00:25:13.628) 6 and
# [00:32:20.481, 00:47:32.893) 9; job 3: 00:14:59.949 .. 00:20:19.787 (15), then
# 00:30:35.891 (16 s after that session's end 00:30:19.787) .. 00:32:13.613 (3),
# then 00:58:24.503 .. 01:02:07.711 (6).
"""
    return "course_session_jobs.case", comment, rows, sql, header, out, st


def render(case):
    name, comment, rows, sql, header, out, st = case
    text = (comment + "--- file task_events.csv\n" + csv_input(rows) + "\n--- sql\n" + sql
            + "\n--- output\n" + "\n".join([header] + out) + "\n--- stderr\n"
            + f"vigil: stream task_events: rows={st.rows} bad=0\n"
            + f"vigil: query 1: out={len(out)} late={st.late}\n")
    return name, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write-cases", action="store_true",
                    help="rewrite tests/cases/course_*.case from scratch")
    ap.add_argument("--check", action="store_true",
                    help="fail when a course_*.case on disk differs from the generated one")
    ap.add_argument("--dump", metavar="NAME", help="print the input CSV of one case and exit")
    args = ap.parse_args()
    cases = [case_terminations(), case_busy(), case_sessions()]
    if args.dump:
        for c in cases:
            if args.dump in c[0]:
                print(csv_input(c[2]))
        return 0
    status = 0
    for case in cases:
        name, text = render(case)
        path = os.path.join(CASES, name)
        if args.write_cases:
            with open(path, "w") as f:
                f.write(text)
            print(f"wrote {path}")
        elif args.check:
            try:
                with open(path) as f:
                    same = f.read() == text
            except FileNotFoundError:
                same = False
            print(f"{name}: {'ok' if same else 'DIFFERS'}")
            status |= 0 if same else 1
        else:
            _, _, rows, _, header, out, st = case
            print(f"== {name}: {st.rows} rows, {st.out_of_order} out of order, "
                  f"late={st.late}, {len(out)} output rows")
            print(header)
            print("\n".join(out))
    return status


if __name__ == "__main__":
    sys.exit(main())
