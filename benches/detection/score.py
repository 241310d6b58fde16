#!/usr/bin/env python3
"""Detection-quality scorer for vigil alert queries.

Runs vigil alert query files over real labelled metric series (NAB and SMD, from the
shared data directory) and scores the alerts they emit against the labels, beside a
naive baseline computed here in Python. See benches/detection/README.md.

    cargo build --release && python3 benches/detection/score.py [options]
    python3 benches/detection/score.py --self-test

Python 3 standard library only.
"""

import argparse
import bisect
import calendar
import concurrent.futures
import csv
import glob
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_DATA = os.path.join(os.path.dirname(REPO_ROOT), "shared", "data")

# SMD metric names, in column order (README of the shared data, from OmniAnomaly issue 22).
SMD_METRICS = [
    "cpu_r", "load_1", "load_5", "load_15", "mem_shmem", "mem_u", "mem_u_e", "total_mem",
    "disk_q", "disk_r", "disk_rb", "disk_svc", "disk_u", "disk_w", "disk_wa", "disk_wb",
    "si", "so", "eth1_fi", "eth1_fo", "eth1_pi", "eth1_po", "tcp_tw", "tcp_use",
    "active_opens", "curr_estab", "in_errs", "in_segs", "listen_overflows", "out_rsts",
    "out_segs", "passive_opens", "retransegs", "tcp_timeouts", "udp_in_dg", "udp_out_dg",
    "udp_rcv_buf_errs", "udp_snd_buf_errs",
]
# The data the README's figures were measured on: the NAB groups and SMD machines the shared
# data directory held then. It now holds the full NAB corpus and 19 SMD machines; `all`
# selects everything present.
DEFAULT_NAB_GROUPS = "realAWSCloudwatch,realKnownCause"
DEFAULT_SMD_MACHINES = ("machine-1-6,machine-1-7,machine-2-1,machine-2-2,"
                        "machine-2-7,machine-2-8,machine-3-3,machine-3-4")
# SMD has no timestamps: ts = this base + offset_s.
SMD_BASE_EPOCH = calendar.timegm((2024, 1, 1, 0, 0, 0))

# Baseline: trailing window of event time, robust z threshold.
BASELINE_WINDOW_S = 24 * 3600
BASELINE_THRESHOLD = 3.5
MAD_SCALE = 0.6745

# Columns of an alert row that name the episode (the alert and its key columns).
EPISODE_KEYS = ("alert", "host", "metric")


class ScoreError(Exception):
    """An error that ends the run with a message and a non-zero status."""


# ---------------------------------------------------------------------------------------
# Timestamps

_TS_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2})(?::(\d{2})(\.\d+)?)?"
    r"\s*(Z|[+-]\d{2}:?\d{2})?$")


def parse_ts(text):
    """ISO-8601 / 'YYYY-MM-DD HH:MM:SS[.ffffff]' (naive = UTC), or epoch ms -> epoch seconds."""
    if isinstance(text, (int, float)):
        return text / 1000.0  # epoch milliseconds
    s = text.strip()
    m = _TS_RE.match(s)
    if not m:
        if re.match(r"^-?\d+$", s):
            return int(s) / 1000.0
        raise ValueError("not a timestamp: %r" % text)
    y, mo, d, h, mi, sec, frac, tz = m.groups()
    t = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(sec or 0)))
    if frac:
        t += float(frac)
    if tz and tz != "Z":
        sign = 1 if tz[0] == "+" else -1
        digits = tz[1:].replace(":", "")
        t -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return t


def fmt_ts(epoch):
    """Epoch seconds -> '2014-02-14T14:30:00' (UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch))


# ---------------------------------------------------------------------------------------
# Data

class Series:
    """One NAB series: name (file stem), timestamps, values (file order), label windows."""

    def __init__(self, name, relpath, ts, values, windows):
        self.name, self.relpath, self.ts, self.values, self.windows = \
            name, relpath, ts, values, windows


class Machine:
    """One SMD machine: row timestamps, {metric: values}, per-row labels (0/1)."""

    def __init__(self, name, path, ts, columns, labels):
        self.name, self.path, self.ts, self.columns, self.labels = \
            name, path, ts, columns, labels


def selection(text):
    """A comma-separated --nab-groups / --smd-machines value: a set of names, or None (all)."""
    names = [w.strip() for w in text.split(",") if w.strip()]
    if names == ["all"]:
        return None
    if not names:
        raise ScoreError("empty selection %r (use names, or `all`)" % text)
    return set(names)


def check_selected(kind, wanted, found):
    """Every name asked for must exist: a misspelt machine must not shrink the data silently."""
    if wanted is not None and wanted - found:
        raise ScoreError("no %s named %s in the data" % (kind, ", ".join(sorted(wanted - found))))


def halves(names):
    """The sorted names cut in two halves (the first one gets the odd name out)."""
    names = sorted(names)
    cut = (len(names) + 1) // 2
    return names[:cut], names[cut:]


def load_nab(data_dir, groups=None):
    """The NAB series present in data_dir that combined_windows.json lists, of the given
    groups (folders under nab/data; None = all)."""
    labels_path = os.path.join(data_dir, "nab", "labels", "combined_windows.json")
    if not os.path.isfile(labels_path):
        raise ScoreError("missing NAB labels: %s" % labels_path)
    with open(labels_path) as f:
        windows = json.load(f)
    out = []
    check_selected("NAB group", groups, {r.split("/")[0] for r in windows})
    for relpath in sorted(windows):
        if groups is not None and relpath.split("/")[0] not in groups:
            continue
        path = os.path.join(data_dir, "nab", "data", relpath)
        if not os.path.isfile(path):
            continue  # a series of the full benchmark that this data set does not ship
        ts, values = [], []
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader)
            if header[:2] != ["timestamp", "value"]:
                raise ScoreError("%s: unexpected header %r" % (path, header))
            for lineno, row in enumerate(reader, 2):
                try:
                    ts.append(parse_ts(row[0]))
                    values.append(float(row[1]))
                except (ValueError, IndexError) as e:
                    raise ScoreError("%s:%d: %s" % (path, lineno, e))
        wins = [(parse_ts(a), parse_ts(b)) for a, b in windows[relpath]]
        name = os.path.splitext(os.path.basename(relpath))[0]
        out.append(Series(name, relpath, ts, values, wins))
    if not out:
        raise ScoreError("no NAB series found under %s" % os.path.join(data_dir, "nab", "data"))
    return out


def load_smd(data_dir, machines=None):
    """The SMD machines of data_dir/server_machines/smd (the given names; None = all)."""
    paths = sorted(glob.glob(os.path.join(data_dir, "server_machines", "smd",
                                          "machine-*_test.csv.gz")))
    if not paths:
        raise ScoreError("no SMD files under %s" %
                         os.path.join(data_dir, "server_machines", "smd"))
    name_of = lambda path: os.path.basename(path)[:-len("_test.csv.gz")]
    check_selected("SMD machine", machines, {name_of(p) for p in paths})
    out = []
    for path in paths:
        name = name_of(path)
        if machines is not None and name not in machines:
            continue
        with gzip.open(path, "rt", newline="") as f:
            reader = csv.reader(f)
            header = next(reader)
            if header != ["offset_s"] + SMD_METRICS + ["label"]:
                raise ScoreError("%s: unexpected header (expected offset_s, the 38 metrics, "
                                 "label)" % path)
            ts, labels = [], []
            cols = [[] for _ in SMD_METRICS]
            for lineno, row in enumerate(reader, 2):
                if len(row) != len(header):
                    raise ScoreError("%s:%d: %d fields, expected %d"
                                     % (path, lineno, len(row), len(header)))
                ts.append(SMD_BASE_EPOCH + int(row[0]))
                labels.append(int(float(row[-1])))
                for i, v in enumerate(row[1:-1]):
                    cols[i].append(float(v))
        out.append(Machine(name, path, ts, dict(zip(SMD_METRICS, cols)), labels))
    return out


def write_nab_input(series, path):
    """Long format ts,host,metric,value (file order kept: it has a real out-of-order part)."""
    with open(path, "w", newline="") as f:
        w = f.write
        w("ts,host,metric,value\n")
        host = series.name
        for t, v in zip(series.ts, series.values):
            w("%s,%s,value,%r\n" % (fmt_ts(t), host, v))


def write_smd_input(machine, path):
    """Long format: one row per (row, metric), rows in time order, metrics in column order."""
    cols = [machine.columns[m] for m in SMD_METRICS]
    with open(path, "w", newline="") as f:
        f.write("ts,host,metric,value\n")
        host = machine.name
        lines = []
        for i, t in enumerate(machine.ts):
            tsx = fmt_ts(t)
            for m, col in zip(SMD_METRICS, cols):
                lines.append("%s,%s,%s,%r\n" % (tsx, host, m, col[i]))
            if len(lines) > 50000:
                f.write("".join(lines))
                lines = []
        f.write("".join(lines))


# ---------------------------------------------------------------------------------------
# Baseline: trailing robust z-score

def median_sorted(a):
    n = len(a)
    h = n // 2
    return a[h] if n % 2 else (a[h - 1] + a[h]) / 2.0


def _kth_distance(a, m, k):
    """The k-th (1-based) smallest |a_i - m| of a sorted list a, and the (k+1)-th or None.

    The k values nearest to m are a contiguous run of a: binary-search its start."""
    n = len(a)
    lo, hi = 0, n - k
    while lo < hi:
        mid = (lo + hi) // 2
        if m - a[mid] > a[mid + k] - m:
            lo = mid + 1
        else:
            hi = mid
    dk = max(m - a[lo], a[lo + k - 1] - m)
    nxt = []
    if lo > 0:
        nxt.append(m - a[lo - 1])
    if lo + k < n:
        nxt.append(a[lo + k] - m)
    return dk, (min(nxt) if nxt else None)


def mad_sorted(a, m=None):
    """Median absolute deviation (from the median) of a sorted list, exactly."""
    if m is None:
        m = median_sorted(a)
    n = len(a)
    if n % 2:
        return _kth_distance(a, m, n // 2 + 1)[0]
    d1, d2 = _kth_distance(a, m, n // 2)
    return (d1 + d2) / 2.0


def robust_z(x, a):
    """0.6745 (x - median) / MAD over the sorted list a; None when MAD = 0."""
    m = median_sorted(a)
    mad = mad_sorted(a, m)
    if mad == 0:
        return None
    return MAD_SCALE * (x - m) / mad


def baseline_alerts(ts, values, window_s=BASELINE_WINDOW_S, threshold=BASELINE_THRESHOLD):
    """Indices (into ts/values) of samples the baseline alerts on.

    Samples are taken in event-time order (a stable sort, so file order among equal
    timestamps). For a sample at time t the window is every sample with event time in
    (t - window_s, t] taken so far, the sample itself included. z = 0.6745 (x - median) /
    MAD over that window; an alert for |z| > threshold; a window with MAD = 0 is skipped.
    """
    order = sorted(range(len(ts)), key=ts.__getitem__)
    win = []          # sorted values of the window
    head = 0          # first position (in `order`) still inside the window
    out = []
    insort, bl = bisect.insort, bisect.bisect_left
    for pos, i in enumerate(order):
        t, x = ts[i], values[i]
        insort(win, x)
        lim = t - window_s
        while ts[order[head]] <= lim:
            del win[bl(win, values[order[head]])]
            head += 1
        n = len(win)
        h = n // 2
        m = win[h] if n % 2 else (win[h - 1] + win[h]) * 0.5
        # quick rejection: |x - m| <= threshold * MAD / 0.6745 is impossible to beat
        # without computing MAD, so compute it only when needed
        d = x - m
        if d == 0:
            continue
        mad = mad_sorted(win, m)
        if mad == 0:
            continue
        if abs(MAD_SCALE * d / mad) > threshold:
            out.append(i)
    out.sort()
    return out


# ---------------------------------------------------------------------------------------
# Scoring

def score_windows(windows, alert_times):
    """NAB rule. A window [start, end] (both included) is detected when at least one alert
    event lies in it; an alert event outside every window is a false positive.
    Returns (windows detected, false positives, per-window first-alert earliness
    (0 = at the window start, 1 = at its end; None if missed))."""
    detected = 0
    fp = 0
    first = [None] * len(windows)
    for t in alert_times:
        hit = False
        for k, (a, b) in enumerate(windows):
            if a <= t <= b:
                hit = True
                if first[k] is None or t < first[k]:
                    first[k] = t
        if not hit:
            fp += 1
    earliness = []
    for k, (a, b) in enumerate(windows):
        if first[k] is not None:
            detected += 1
            earliness.append((first[k] - a) / (b - a) if b > a else 0.0)
        else:
            earliness.append(None)
    return detected, fp, earliness


def segments(labels):
    """Contiguous runs of 1 in labels, as (start, end_exclusive)."""
    out = []
    start = None
    for i, v in enumerate(labels):
        if v and start is None:
            start = i
        elif not v and start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(labels)))
    return out


def point_adjust(labels, pred):
    """Point adjust: if any row of a labelled anomaly segment is predicted, every row of
    that segment counts as predicted. Rows outside segments are unchanged."""
    adj = list(pred)
    for a, b in segments(labels):
        if any(pred[a:b]):
            for i in range(a, b):
                adj[i] = 1
    return adj


def confusion(labels, pred):
    tp = fp = fn = 0
    for y, p in zip(labels, pred):
        if p and y:
            tp += 1
        elif p:
            fp += 1
        elif y:
            fn += 1
    return tp, fp, fn


def prf(tp, fp, fn):
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return p, r, f


def rows_in_intervals(row_ts, events):
    """Per-row 0/1: the row lies in a firing interval [firing event_time, resolved
    event_time) of any episode. events: (time, key, state) with state 'firing' or
    'resolved'; an episode is one key; an interval still open at the end runs to the end
    of the data."""
    changes = []  # (time, +1/-1) for the union of intervals
    open_since = {}
    for t, key, state in sorted(events, key=lambda e: (e[0], 0 if e[2] == "resolved" else 1)):
        if state == "firing":
            if key not in open_since:
                open_since[key] = t
        elif state == "resolved":
            s = open_since.pop(key, None)
            if s is not None:
                changes.append((s, t))
    end = float("inf")
    for s in open_since.values():
        changes.append((s, end))
    pred = [0] * len(row_ts)
    if not changes:
        return pred
    # mark rows by sweeping sorted row times (row_ts is ascending)
    for s, e in changes:
        i = bisect.bisect_left(row_ts, s)
        j = bisect.bisect_left(row_ts, e) if e != end else len(row_ts)
        for k in range(i, j):
            pred[k] = 1
    return pred


def rows_at_times(row_ts, times):
    """Per-row 0/1: the row's time is one of times (point alerts, for the baseline)."""
    pred = [0] * len(row_ts)
    for t in times:
        i = bisect.bisect_left(row_ts, t)
        if i < len(row_ts) and row_ts[i] == t:
            pred[i] = 1
    return pred


# ---------------------------------------------------------------------------------------
# vigil

_help_cache = {}


def vigil_has_input_flag(vigil):
    if vigil not in _help_cache:
        try:
            r = subprocess.run([vigil, "run", "--help"], capture_output=True, text=True,
                               timeout=60)
            _help_cache[vigil] = "--input" in r.stdout
        except OSError as e:
            raise ScoreError("cannot run vigil at %s: %s" % (vigil, e))
    return _help_cache[vigil]


_STREAM_RE = re.compile(r"CREATE\s+STREAM\s+metrics\b", re.I)
_PATH_RE = re.compile(r"(\bpath\s*=\s*)'(?:[^']|'')*'", re.I)


def query_with_path(sql, input_path):
    """The query text with the path of stream `metrics` replaced (the fallback used when
    vigil has no --input flag)."""
    m = _STREAM_RE.search(sql)
    if not m:
        raise ScoreError("query declares no stream `metrics`")
    p = _PATH_RE.search(sql, m.end())
    if not p:
        raise ScoreError("stream `metrics` has no path option")
    return sql[:p.start()] + p.group(1) + "'" + input_path.replace("'", "''") + "'" + \
        sql[p.end():]


def run_vigil(vigil, query, input_path, workdir):
    """Run one query file over one input; the alert rows (dicts with a `state`)."""
    input_path = os.path.abspath(input_path)
    if vigil_has_input_flag(vigil):
        cmd = [vigil, "run", query, "--input", "metrics=" + input_path, "--format", "jsonl"]
    else:
        with open(query) as f:
            sql = query_with_path(f.read(), input_path)
        digest = hashlib.sha1((query + input_path).encode()).hexdigest()[:12]
        tmp_query = os.path.join(workdir, "q_%s_%s" % (digest, os.path.basename(query)))
        with open(tmp_query, "w") as f:
            f.write(sql)
        cmd = [vigil, "run", tmp_query, "--format", "jsonl"]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.time() - t0
    if r.returncode != 0:
        raise ScoreError("vigil failed (status %d) on %s with %s:\n  %s\n%s" % (
            r.returncode, os.path.basename(query), os.path.basename(input_path),
            " ".join(cmd), r.stderr.strip()))
    rows = []
    for lineno, line in enumerate(r.stdout.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise ScoreError("%s on %s: stdout line %d is not JSON: %.200s" % (
                os.path.basename(query), os.path.basename(input_path), lineno, line))
        if isinstance(obj, dict) and "state" in obj:
            rows.append(obj)
    return rows, elapsed


def alert_events(rows, source):
    """(event time, episode key, state, host) of alert rows."""
    out = []
    for r in rows:
        state = r.get("state")
        if state not in ("firing", "resolved"):
            raise ScoreError("%s: alert row with state %r: %s" % (source, state, r))
        et = r.get("event_time")
        if et is None:
            raise ScoreError("%s: alert row without event_time: %s" % (source, r))
        try:
            t = parse_ts(et)
        except ValueError as e:
            raise ScoreError("%s: %s" % (source, e))
        key = tuple(r.get(k) for k in EPISODE_KEYS)
        out.append((t, key, state, r.get("host")))
    return out


def discover_queries(repo_root):
    """queries/pack/**/*.sql with `-- score: nab` and/or `-- score: smd` lines."""
    out = []
    pattern = os.path.join(repo_root, "queries", "pack", "**", "*.sql")
    for path in sorted(glob.glob(pattern, recursive=True)):
        sets = query_datasets(path)
        if sets:
            out.append((path, sets))
    return out


def query_datasets(path):
    sets = set()
    with open(path) as f:
        for line in f:
            m = re.match(r"^\s*--\s*score:\s*(.*)$", line)
            if m:
                for word in re.split(r"[\s,]+", m.group(1).strip().lower()):
                    if word in ("nab", "smd"):
                        sets.add(word)
    return sets


# ---------------------------------------------------------------------------------------
# Reports

def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def pct(x):
    return "%.1f %%" % (100.0 * x)


def nab_row(name, per_series, series):
    total_w = sum(len(s.windows) for s in series)
    det = sum(d for d, fp, n, e in per_series.values())
    fps = sum(fp for d, fp, n, e in per_series.values())
    n = sum(n for d, fp, n, e in per_series.values())
    early = [x for d, fp, nn, e in per_series.values() for x in e if x is not None]
    return [name, "%d / %d" % (det, total_w), pct(det / total_w if total_w else 0), fps, n,
            ("%.2f" % (sum(early) / len(early))) if early else "-"]


def smd_row(name, per_machine):
    tp = fp = fn = 0
    rtp = rfp = rfn = 0
    alerts = 0
    for (a, b, c), (ra, rb, rc), n in per_machine.values():
        tp, fp, fn = tp + a, fp + b, fn + c
        rtp, rfp, rfn = rtp + ra, rfp + rb, rfn + rc
        alerts += n
    p, r, f = prf(tp, fp, fn)
    _, _, rf = prf(rtp, rfp, rfn)
    return [name, "%.3f" % p, "%.3f" % r, "%.3f" % f, "%.3f" % rf, alerts]


def score_nab_series(s, times):
    d, fp, early = score_windows(s.windows, times)
    return d, fp, len(times), early


def score_smd_machine(m, pred, n_alerts):
    adj = point_adjust(m.labels, pred)
    return confusion(m.labels, adj), confusion(m.labels, pred), n_alerts


# ---------------------------------------------------------------------------------------
# Baseline with a cache

def _cache_key(path, extra):
    st = os.stat(path)
    return hashlib.sha1(("%s|%d|%d|%s" % (os.path.abspath(path), st.st_mtime_ns,
                                          st.st_size, extra)).encode()).hexdigest()


def cached(cache_dir, path, extra, compute):
    if cache_dir is None:
        return compute()
    f = os.path.join(cache_dir, "baseline_%s.json" % _cache_key(path, extra))
    if os.path.isfile(f):
        with open(f) as fh:
            return json.load(fh)
    val = compute()
    tmp = f + ".tmp%d" % os.getpid()
    with open(tmp, "w") as fh:
        json.dump(val, fh)
    os.replace(tmp, f)
    return val


BASELINE_TAG = "v1 window=%d threshold=%s" % (BASELINE_WINDOW_S, BASELINE_THRESHOLD)


def baseline_nab(s, data_dir, cache_dir):
    path = os.path.join(data_dir, "nab", "data", s.relpath)
    idx = cached(cache_dir, path, BASELINE_TAG,
                 lambda: baseline_alerts(s.ts, s.values))
    return [s.ts[i] for i in idx]


def baseline_smd(m, cache_dir):
    """{metric: [row indices alerting]}"""
    def compute():
        return {metric: baseline_alerts(m.ts, m.columns[metric]) for metric in SMD_METRICS}
    return cached(cache_dir, m.path, BASELINE_TAG, compute)


# ---------------------------------------------------------------------------------------
# Self-test

def self_test():
    failures = []

    def check(name, got, want):
        ok = got == want if not isinstance(want, float) else abs(got - want) < 0.005
        print("%s %s: got %r, want %r" % ("ok  " if ok else "FAIL", name, got, want))
        if not ok:
            failures.append(name)

    # robust z on the 5-value example
    a = sorted([10, 11, 9, 10, 50])
    check("median", median_sorted(a), 10)
    check("MAD", mad_sorted(a), 1)
    check("z(50)", round(robust_z(50, a), 2), 26.98)
    check("MAD even count", mad_sorted(sorted([1, 2, 3, 4, 100, 7])), 2.0)  # med 3.5, |d| 0.5 0.5 1.5 2.5 3.5 96.5
    check("MAD = 0 skipped", robust_z(5, [5, 5, 5, 6]), None)
    # brute-force MAD on awkward lists
    import random
    rnd = random.Random(7)
    bad = 0
    for _ in range(2000):
        xs = sorted(rnd.choice([rnd.randint(0, 5), rnd.random()]) for _ in range(rnd.randint(1, 30)))
        med = median_sorted(xs)
        want = median_sorted(sorted(abs(x - med) for x in xs))
        if abs(mad_sorted(xs) - want) > 1e-12:
            bad += 1
    check("MAD vs brute force (2000 lists)", bad, 0)
    # baseline over a series: 5 samples one minute apart, the last one a spike
    ts = [0, 60, 120, 180, 240]
    check("baseline alerts", baseline_alerts(ts, [10, 11, 9, 10, 50]), [4])
    # trailing window drops old samples: window 150 s -> at t=240 the window is
    # {120, 180, 240} = [9, 10, 50]: median 10, MAD 1 -> z = 26.98 still
    check("baseline window expiry", baseline_alerts(ts, [10, 11, 9, 10, 50], window_s=150), [4])
    # ... and a window holding only [10, 50] (t in (90, 240], 2 samples at t=180,240):
    # median 30, MAD 20 -> z = 0.67: no alert
    check("baseline short window", baseline_alerts(ts, [10, 11, 9, 10, 50], window_s=61), [])

    # windows: hits, detection, false positives
    wins = [(100, 200), (300, 400)]
    d, fp, early = score_windows(wins, [50, 100, 150, 250, 400, 401])
    check("windows detected", d, 2)
    check("false positives", fp, 3)
    check("earliness", early, [0.0, 1.0])
    d, fp, early = score_windows(wins, [])
    check("no alerts", (d, fp, early), (0, 0, [None, None]))
    check("no windows: every alert is FP", score_windows([], [1, 2])[:2], (0, 2))

    # point adjust
    labels = [0, 1, 1, 1, 0, 0, 1, 1, 0]
    pred   = [1, 0, 1, 0, 0, 0, 0, 0, 0]
    check("segments", segments(labels), [(1, 4), (6, 8)])
    adj = point_adjust(labels, pred)
    check("point adjust", adj, [1, 1, 1, 1, 0, 0, 0, 0, 0])
    check("confusion adjusted", confusion(labels, adj), (3, 1, 2))
    check("confusion raw", confusion(labels, pred), (1, 1, 4))
    p, r, f = prf(3, 1, 2)
    check("precision", p, 0.75)
    check("recall", r, 0.6)
    check("F1", round(f, 4), round(2 * 0.75 * 0.6 / 1.35, 4))
    check("segment at the end", segments([0, 1, 1]), [(1, 3)])

    # firing intervals -> rows
    row_ts = [0, 60, 120, 180, 240, 300]
    ev = [(60, ("a", "h", "cpu"), "firing"), (180, ("a", "h", "cpu"), "resolved"),
          (240, ("a", "h", "mem"), "firing")]
    check("intervals, open one runs to the end", rows_in_intervals(row_ts, ev),
          [0, 1, 1, 0, 1, 1])
    ev2 = [(0, ("a", "h", "cpu"), "firing"), (120, ("a", "h", "mem"), "firing"),
           (180, ("a", "h", "cpu"), "resolved"), (240, ("a", "h", "mem"), "resolved")]
    check("overlapping episodes", rows_in_intervals(row_ts, ev2), [1, 1, 1, 1, 0, 0])
    check("point alerts", rows_at_times(row_ts, [60, 61, 300]), [0, 1, 0, 0, 0, 1])

    # timestamps
    check("parse ISO", parse_ts("2014-02-14T14:30:00"), calendar.timegm((2014, 2, 14, 14, 30, 0)))
    check("parse NAB label", parse_ts("2014-02-14 14:30:00.000000"),
          calendar.timegm((2014, 2, 14, 14, 30, 0)))
    check("parse Z", parse_ts("2014-02-14T14:30:00Z"), parse_ts("2014-02-14 14:30:00"))
    check("parse offset", parse_ts("2014-02-14T15:30:00+01:00"), parse_ts("2014-02-14T14:30:00"))
    check("parse fraction", parse_ts("2014-02-14T14:30:00.5") - parse_ts("2014-02-14T14:30:00"), 0.5)
    check("format", fmt_ts(SMD_BASE_EPOCH + 90), "2024-01-01T00:01:30")
    check("halves", halves(["m-3", "m-1", "m-4", "m-2"]), (["m-1", "m-2"], ["m-3", "m-4"]))
    check("halves, odd count", halves(["c", "a", "b"]), (["a", "b"], ["c"]))
    check("selection", (selection("a, b"), selection("all")), ({"a", "b"}, None))
    check("default SMD machines", len(selection(DEFAULT_SMD_MACHINES)), 8)
    try:
        check_selected("SMD machine", {"a", "x"}, {"a", "b"})
        check("unknown machine rejected", False, True)
    except ScoreError as e:
        check("unknown machine rejected", "x" in str(e), True)

    # fallback path rewrite
    sql = ("CREATE STREAM other (ts TIMESTAMP) WITH (path = 'x.csv');\n"
           "CREATE STREAM metrics (ts TIMESTAMP, host TEXT, metric TEXT, value DOUBLE,\n"
           "  WATERMARK FOR ts AS ts - INTERVAL '1' MINUTE) WITH (path = 'data/m.csv', format = 'csv');")
    got = query_with_path(sql, "/tmp/it's.csv")
    check("path rewrite", got.count("'/tmp/it''s.csv'") == 1 and "'x.csv'" in got, True)

    # alert rows -> events
    rows = [{"alert": "a", "host": "h", "metric": "cpu", "state": "firing",
             "event_time": "2014-02-14T14:30:00"}]
    check("alert events", alert_events(rows, "t"),
          [(parse_ts("2014-02-14T14:30:00"), ("a", "h", "cpu"), "firing", "h")])

    print()
    if failures:
        print("self-test: %d FAILED: %s" % (len(failures), ", ".join(failures)))
        return 1
    print("self-test: all passed")
    return 0


# ---------------------------------------------------------------------------------------
# Main

def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Score vigil alert queries on labelled NAB and SMD data, beside a "
                    "trailing robust z-score baseline.")
    ap.add_argument("--data", default=DEFAULT_DATA,
                    help="shared data directory (default: ../shared/data from the repo "
                         "root, here %(default)s)")
    ap.add_argument("--vigil", default=os.path.join(REPO_ROOT, "target", "release", "vigil"),
                    help="vigil binary (default: target/release/vigil)")
    ap.add_argument("--queries", nargs="+", metavar="FILE",
                    help="query files (default: queries/pack/**/*.sql with a `-- score: nab` "
                         "or `-- score: smd` line, each run on the data sets it names; "
                         "files given here without such a line run on both)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--nab-only", action="store_true", help="score NAB only")
    g.add_argument("--smd-only", action="store_true", help="score SMD only")
    ap.add_argument("--nab-groups", default=DEFAULT_NAB_GROUPS, metavar="A,B",
                    help="NAB folders to score (default %(default)s, the 24 labelled series "
                         "the README's figures are for; `all` for every labelled series)")
    ap.add_argument("--smd-machines", default=DEFAULT_SMD_MACHINES, metavar="A,B",
                    help="SMD machines to score (default the 8 the README's figures are for: "
                         "%(default)s; `all` for every machine present)")
    ap.add_argument("--split", action="store_true",
                    help="SMD: also score each half of the machines (sorted by name, first "
                         "half / second half) on its own")
    ap.add_argument("--jobs", type=int, default=2, help="vigil processes at once (default 2)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the baseline row")
    ap.add_argument("--workdir", help="where to write the prepared inputs (default: a temp "
                                      "dir, removed at the end)")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "vigil-detect-cache"),
                    help="baseline cache dir, keyed by data file path+mtime (default "
                         "%(default)s; 'none' to disable)")
    ap.add_argument("--verbose", "-v", action="store_true", help="per-series details")
    ap.add_argument("--self-test", action="store_true",
                    help="check the scoring functions on tiny hand-made inputs and exit")
    args = ap.parse_args(argv)

    if args.self_test:
        return self_test()
    try:
        return run(args)
    except ScoreError as e:
        print("score.py: error: %s" % e, file=sys.stderr)
        return 1


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(args):
    t_start = time.time()
    data_dir = os.path.abspath(args.data)
    if not os.path.isdir(data_dir):
        raise ScoreError("data directory not found: %s (use --data)" % data_dir)
    do_nab = not args.smd_only
    do_smd = not args.nab_only

    if args.queries:
        queries = []
        for q in args.queries:
            if not os.path.isfile(q):
                raise ScoreError("query file not found: %s" % q)
            sets = query_datasets(q) or {"nab", "smd"}
            queries.append((os.path.abspath(q), sets))
    else:
        queries = discover_queries(REPO_ROOT)
        if not queries:
            log("score.py: no queries/pack/**/*.sql with a `-- score:` line; baseline only")
    if queries:
        if not (os.path.isfile(args.vigil) and os.access(args.vigil, os.X_OK)):
            raise ScoreError("vigil binary not found at %s (cargo build --release, or "
                             "--vigil PATH)" % args.vigil)
    cache_dir = None if args.cache == "none" else args.cache
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)

    own_workdir = args.workdir is None
    workdir = tempfile.mkdtemp(prefix="vigil-detect-") if own_workdir else args.workdir
    os.makedirs(workdir, exist_ok=True)
    try:
        if do_nab:
            score_nab_all(args, data_dir, workdir, cache_dir,
                          [(q, s) for q, s in queries if "nab" in s])
        if do_smd:
            score_smd_all(args, data_dir, workdir, cache_dir,
                          [(q, s) for q, s in queries if "smd" in s])
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    log("score.py: done in %.1f s" % (time.time() - t_start))
    return 0


def qname(q):
    return os.path.splitext(os.path.basename(q))[0]


def run_all(args, queries, inputs, workdir):
    """Run every query over every (name, input path); {(query, name): rows}."""
    jobs = [(q, name, path) for q, _ in queries for name, path in inputs]
    out = {}
    if not jobs:
        return out
    t0 = time.time()
    cpu = 0.0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        futs = {ex.submit(run_vigil, args.vigil, q, path, workdir): (q, name)
                for q, name, path in jobs}
        for fut in concurrent.futures.as_completed(futs):
            q, name = futs[fut]
            try:
                rows, el = fut.result()
            except ScoreError:
                for f in futs:
                    f.cancel()
                raise
            cpu += el
            out[(q, name)] = rows
    log("score.py: %d vigil runs in %.1f s (%.1f s summed)" % (len(jobs), time.time() - t0, cpu))
    return out


def score_nab_all(args, data_dir, workdir, cache_dir, queries):
    t0 = time.time()
    series = load_nab(data_dir, selection(args.nab_groups))
    inputs = []
    if queries:
        for s in series:
            p = os.path.join(workdir, "nab_%s.csv" % s.name)
            write_nab_input(s, p)
            inputs.append((s.name, p))
    log("score.py: NAB: %d series, %d samples, %d windows (loaded in %.1f s)" % (
        len(series), sum(len(s.ts) for s in series), sum(len(s.windows) for s in series),
        time.time() - t0))
    table = []
    details = []
    if not args.no_baseline:
        t1 = time.time()
        per = {s.name: score_nab_series(s, baseline_nab(s, data_dir, cache_dir)) for s in series}
        log("score.py: NAB baseline in %.1f s" % (time.time() - t1))
        table.append(nab_row("baseline: trailing 24 h robust z > 3.5", per, series))
        details.append(("baseline", per))
    results = run_all(args, queries, inputs, workdir)
    for q, _ in queries:
        per = {}
        for s in series:
            evs = alert_events(results[(q, s.name)], "%s on %s" % (qname(q), s.name))
            foreign = [e for e in evs if e[3] is not None and e[3] != s.name]
            if foreign:
                raise ScoreError("%s on %s: alert for another host %r" % (
                    qname(q), s.name, foreign[0][3]))
            per[s.name] = score_nab_series(s, [e[0] for e in evs if e[2] == "firing"])
        table.append(nab_row(qname(q), per, series))
        details.append((qname(q), per))
    print("## NAB (%d series, %d labelled windows)\n" % (
        len(series), sum(len(s.windows) for s in series)))
    print("A window is detected when an alert event (a `firing` row) has its event_time in "
          "[start, end]; an alert event outside every window of its series is a false "
          "positive. Earliness: mean position of the first hit in a detected window "
          "(0 = window start, 1 = end).\n")
    print(md_table(["rule", "windows detected", "detection rate", "false-positive alerts",
                    "alerts total", "earliness"], table))
    print()
    if args.verbose:
        for name, per in details:
            print("### NAB per series: %s\n" % name)
            rows = []
            for s in series:
                d, fp, n, e = per[s.name]
                rows.append([s.name, "%d / %d" % (d, len(s.windows)), fp, n,
                             " ".join("-" if x is None else "%.2f" % x for x in e) or "-"])
            print(md_table(["series", "windows detected", "false positives", "alerts",
                            "earliness per window"], rows))
            print()


def score_smd_all(args, data_dir, workdir, cache_dir, queries):
    t0 = time.time()
    machines = load_smd(data_dir, selection(args.smd_machines))
    log("score.py: SMD: %d machines, %d rows, %d anomalous (loaded in %.1f s)" % (
        len(machines), sum(len(m.ts) for m in machines),
        sum(sum(m.labels) for m in machines), time.time() - t0))
    inputs = []
    if queries:
        t1 = time.time()
        for m in machines:
            p = os.path.join(workdir, "smd_%s.csv" % m.name)
            write_smd_input(m, p)
            inputs.append((m.name, p))
        log("score.py: SMD inputs written in %.1f s" % (time.time() - t1))
    table = []
    details = []
    if not args.no_baseline:
        t1 = time.time()
        per = {}
        for m in machines:
            alerts = baseline_smd(m, cache_dir)
            rows = set()
            n = 0
            for metric in SMD_METRICS:
                rows.update(alerts[metric])
                n += len(alerts[metric])
            pred = [0] * len(m.ts)
            for i in rows:
                pred[i] = 1
            per[m.name] = score_smd_machine(m, pred, n)
        log("score.py: SMD baseline in %.1f s" % (time.time() - t1))
        table.append(smd_row("baseline: trailing 24 h robust z > 3.5, any metric", per))
        details.append(("baseline", per))
    results = run_all(args, queries, inputs, workdir)
    for q, _ in queries:
        per = {}
        for m in machines:
            evs = alert_events(results[(q, m.name)], "%s on %s" % (qname(q), m.name))
            foreign = [e for e in evs if e[3] is not None and e[3] != m.name]
            if foreign:
                raise ScoreError("%s on %s: alert for another host %r" % (
                    qname(q), m.name, foreign[0][3]))
            pred = rows_in_intervals(m.ts, [(t, k, st) for t, k, st, _ in evs])
            per[m.name] = score_smd_machine(m, pred, sum(1 for e in evs if e[2] == "firing"))
        table.append(smd_row(qname(q), per))
        details.append((qname(q), per))
    print("## SMD (%d machines, %d rows, %d labelled anomaly segments)\n" % (
        len(machines), sum(len(m.ts) for m in machines),
        sum(len(segments(m.labels)) for m in machines)))
    print("Rows are predicted anomalous while any alert of their machine is firing "
          "([firing event_time, resolved event_time)). Point adjust: if any row of a "
          "contiguous labelled anomaly segment is predicted, every row of that segment "
          "counts as predicted. Precision/recall/F1 over all rows of all machines; "
          "F1 (raw) without point adjust. Alerts: firing events.\n")
    print(md_table(["rule", "precision", "recall", "F1 (point-adjusted)", "F1 (raw)",
                    "alerts"], table))
    print()
    if args.split:
        for half in halves(m.name for m in machines):
            print("### SMD half: %s\n" % ", ".join(half))
            print(md_table(["rule", "precision", "recall", "F1 (point-adjusted)", "F1 (raw)",
                            "alerts"],
                           [smd_row(name, {k: v for k, v in per.items() if k in half})
                            for name, per in details]))
            print()
    if args.verbose:
        for name, per in details:
            print("### SMD per machine: %s\n" % name)
            rows = []
            for m in machines:
                row = smd_row(m.name, {m.name: per[m.name]})
                row.insert(1, len(segments(m.labels)))
                rows.append(row)
            print(md_table(["machine", "segments", "precision", "recall",
                            "F1 (point-adjusted)", "F1 (raw)", "alerts"], rows))
            print()


if __name__ == "__main__":
    sys.exit(main())
