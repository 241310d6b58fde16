"""The NAB score (Numenta Anomaly Benchmark, Lavin and Ahmad 2015) and NAB's windowed
Gaussian detector, for benches/detection/score.py.

Written from the rules summarised in the shared data's nab/scoring/README.md and checked
against NAB's published scoreboard (`score.py --nab-check`); no NAB code is used.

A file's rows are taken in file order. Each labelled window [start, end] is the run of
rows from the row whose timestamp equals start to the row whose timestamp equals end. The
first min(floor(0.15 rows), 750) rows are the probationary period and are not scored.
Every scored row has a weight: inside a window, tpWeight * sigma(y) / sigma(-1) with
y = -(right - i + 1) / width (the full tpWeight on the window's first row); outside,
fpWeight * sigma(y) with y = (i - prev_right) / (prev_width - 1), the distance past the
previous window, or -fpWeight before the first window. sigma(y) = 2 / (1 + e^(5y)) - 1,
and -1 beyond y > 3. A file scores, per window, its earliest detection's weight (or
-fnWeight when it has none), plus the weight of every detection outside the windows.
"""

import bisect
import json
import math
import os

PROBATION_FRACTION = 0.15
PROBATION_MAX_ROWS = 750
PROFILES = ("standard", "reward_low_FP_rate", "reward_low_FN_rate")
# The entries of final_results.json printed beside the queries.
PUBLISHED_SHOWN = ("ARTime", "numenta", "contextOSE", "windowedGaussian", "null")

# windowedGaussian's parameters (NAB v1.1).
WG_WINDOW = 6400
WG_STEP = 100
WG_MIN_STD = 0.000001
# NAB's results CSVs hold the anomaly scores as Python 2's str(float) wrote them (pandas of
# the time): 12 significant digits, so a score within 5e-13 of 1 was read back as 1.0.
PUBLISHED_DIGITS = 12


class NabError(Exception):
    """Labels and data that do not fit together (a window edge with no row)."""


def probation_rows(n_rows):
    """Rows at the start of a file that are not scored."""
    return min(math.floor(PROBATION_FRACTION * n_rows), PROBATION_MAX_ROWS)


def scaled_sigmoid(y):
    """2 / (1 + e^(5y)) - 1, and -1 past y > 3: 0.98661 at -1, 0 at 0, -0.98661 at 1."""
    if y > 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * y)) - 1.0


def load_profiles(path):
    """{profile: (tpWeight, fpWeight, fnWeight)} from NAB's profiles.json."""
    try:
        with open(path) as f:
            raw = json.load(f)
        return {p: (float(raw[p]["CostMatrix"]["tpWeight"]),
                    float(raw[p]["CostMatrix"]["fpWeight"]),
                    float(raw[p]["CostMatrix"]["fnWeight"])) for p in PROFILES}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise NabError("cannot read the NAB profiles %s: %s" % (path, e))


def load_published(path):
    """{detector: {profile: score}} from NAB's final_results.json."""
    try:
        with open(path) as f:
            raw = json.load(f)
        return {d: {p: float(v[p]) for p in PROFILES} for d, v in raw.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise NabError("cannot read NAB's published results %s: %s" % (path, e))


class Layout:
    """One file's rows as NAB scores them.

    window[i]: the index of the window row i lies in, or -1; unit[i]: the row's weight
    before the cost matrix (sigma(y) / sigma(-1) inside a window, sigma(y) outside);
    scored_from: the first row after the probationary period; windows: how many windows
    have a scored row (the others count neither as hit nor as miss)."""

    def __init__(self, window, unit, scored_from, windows):
        self.window, self.unit, self.scored_from, self.windows = \
            window, unit, scored_from, windows

    def weight(self, i, profile):
        """Row i's score as a detection under profile (tp, fp, fn)."""
        tp, fp, _ = profile
        return self.unit[i] * (tp if self.window[i] >= 0 else fp)


def layout(ts, windows, name="series"):
    """The Layout of a file with row timestamps ts (file order) and label windows
    [(start, end)] (timestamps equal to row timestamps, in time order)."""
    n = len(ts)
    first_of = {}
    for i, t in enumerate(ts):
        first_of.setdefault(t, i)
    spans = []
    for a, b in windows:
        if a not in first_of or b not in first_of:
            raise NabError("%s: window [%s, %s] has an edge that matches no row"
                           % (name, a, b))
        spans.append((a, b))
    max_tp = scaled_sigmoid(-1.0)
    window = [-1] * n
    unit = [0.0] * n
    pending = 0
    cur = -1
    right = width = None
    prev_right = prev_width = None
    for i, t in enumerate(ts):
        # A window opens on the row that carries its start timestamp; its right edge is the
        # first row that carries its end timestamp.
        if pending < len(spans) and t == spans[pending][0]:
            cur = pending
            pending += 1
            right = first_of[spans[cur][1]]
            width = float(right - first_of[spans[cur][0]] + 1)
        if cur >= 0:
            window[i] = cur
            unit[i] = scaled_sigmoid(-(right - i + 1) / width) / max_tp
        elif prev_right is None:
            unit[i] = -1.0
        else:
            unit[i] = scaled_sigmoid(abs(prev_right - i) / (prev_width - 1.0))
        if cur >= 0 and t == spans[cur][1]:
            prev_right, prev_width = i, width
            cur = -1
    if pending < len(spans):
        raise NabError("%s: window [%s, %s] never opens (its start is out of order)"
                       % (name, spans[pending][0], spans[pending][1]))
    start = probation_rows(n)
    scored = {window[i] for i in range(start, n) if window[i] >= 0}
    return Layout(window, unit, start, len(scored))


def file_raw(lay, detected, profile):
    """Raw NAB score of one file whose detections are the row indices `detected`, and
    (windows detected, false-positive detection rows). Probationary rows are skipped."""
    tp, fp, fn = profile
    best = {}
    fp_sum = 0.0
    fp_rows = 0
    for i in sorted(set(detected)):
        if i < lay.scored_from:
            continue
        k = lay.window[i]
        if k >= 0:
            if k not in best:
                best[k] = lay.unit[i] * tp  # rows come in order: the first is the earliest
        else:
            fp_sum += lay.unit[i] * fp
            fp_rows += 1
    raw = sum(best.values()) - fn * (lay.windows - len(best)) + fp_sum
    return raw, len(best), fp_rows


def normalised(raw, n_windows, profile):
    """100 (raw - null) / (perfect - null): 0 = detect nothing, 100 = every window on its
    first row. null = -fnWeight per window, perfect = tpWeight per window."""
    tp, _, fn = profile
    null = -fn * n_windows
    perfect = tp * n_windows
    if perfect == null:
        return 0.0
    return 100.0 * (raw - null) / (perfect - null)


def sweep(files, profile):
    """NAB's threshold optimisation: files = [(Layout, per-row anomaly scores)]. All scored
    rows of all files are pooled; each distinct score, from the highest down, is tried as
    the threshold (a row is a detection when its score >= the threshold). Returns
    (best corpus raw score, its threshold; None when detecting nothing is best)."""
    tp, fp, fn = profile
    rows = []
    n_windows = 0
    for f, (lay, scores) in enumerate(files):
        if len(scores) != len(lay.window):
            raise NabError("file %d: %d scores for %d rows" % (f, len(scores), len(lay.window)))
        n_windows += lay.windows
        for i in range(lay.scored_from, len(scores)):
            k = lay.window[i]
            rows.append((scores[i], (f, k) if k >= 0 else None,
                         lay.unit[i] * (tp if k >= 0 else fp)))
    rows.sort(key=lambda r: r[0], reverse=True)
    total = -fn * n_windows
    best_raw, best_threshold = total, None
    window_part = {}
    j = 0
    while j < len(rows):
        threshold = rows[j][0]
        while j < len(rows) and rows[j][0] == threshold:
            _, key, w = rows[j]
            if key is None:
                total += w
            else:
                old = window_part.get(key, -fn)
                if w > old:
                    window_part[key] = w
                    total += w - old
            j += 1
        if total > best_raw:
            best_raw, best_threshold = total, threshold
    return best_raw, best_threshold


def detection_rows(ts, times):
    """Row index of each alert time: the first row in file order whose timestamp is at or
    after it (times after the last row have none)."""
    running = []
    hi = float("-inf")
    for t in ts:
        hi = max(hi, t)
        running.append(hi)
    out = []
    for t in times:
        i = bisect.bisect_left(running, t)
        if i < len(ts):
            out.append(i)
    return out


def normal_tail(x, mean, std):
    """P(X > x) of a normal distribution, taken on the far side of the mean when x is
    below it (so always <= 0.5)."""
    if x < mean:
        x = 2 * mean - x
    return 0.5 * math.erfc(((x - mean) / std) / math.sqrt(2))


def windowed_gaussian(values, size=WG_WINDOW, step=WG_STEP):
    """NAB's windowedGaussian anomaly score of each value, in order: 1 - the normal tail
    probability of the value under the mean and (population) standard deviation of the
    previous values, 0 for the first. The window first grows to `size` (6400) values, one
    per row; after that new values wait in a step buffer of `step` (100) that is appended
    (dropping the oldest `step`) only when full."""
    out = []
    window = []
    buf = []
    mean, std = 0.0, 1.0
    # Welford's running mean and sum of squared deviations while the window grows.
    run_mean = 0.0
    run_m2 = 0.0
    for x in values:
        out.append(1.0 - normal_tail(x, mean, std) if window else 0.0)
        if len(window) < size:
            window.append(x)
            d = x - run_mean
            run_mean += d / len(window)
            run_m2 += d * (x - run_mean)
            mean = run_mean
            std = math.sqrt(max(run_m2, 0.0) / len(window))
        else:
            buf.append(x)
            if len(buf) == step:
                window = window[step:] + buf
                buf = []
                mean = math.fsum(window) / len(window)
                std = math.sqrt(math.fsum((v - mean) ** 2 for v in window) / len(window))
        if std == 0.0:
            std = WG_MIN_STD
    return out


def as_published(score):
    """A score as NAB's results CSVs hold it (12 significant digits)."""
    return float("%.*g" % (PUBLISHED_DIGITS, score))
