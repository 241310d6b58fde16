#!/usr/bin/env python3
"""The parameter search behind the pack's frozen series rules, on the tuning set only.

    python3 -m venv /tmp/tune-venv && /tmp/tune-venv/bin/pip install numpy
    /tmp/tune-venv/bin/python benches/detection/tune.py [--nab-only | --smd-only] [--top N]

It loads only the tuning set of score.py (NAB realAWSCloudwatch + realKnownCause, SMD
machines 1-6, 1-7, 2-1, 2-2, 2-7, 2-8, 3-3, 3-4), replays each candidate rule the way its
SQL runs in vigil (TUMBLE buckets, `change_score` of the bucket against the rows before it,
the alert's firing, RESOLVE and KEEP FIRING FOR), scores it with score.py's own NAB and SMD
functions, and prints the best candidates. The frozen choices are the CHOSEN constants
below; they are what queries/pack/series/shift_or_spike.sql, machine_metrics_burst.sql
and machine_metrics_episode.sql say. The test set is never loaded, so nothing here can be
chosen on it.

numpy is needed for speed (rolling medians over 7 million SMD samples); score.py itself
stays standard library only.
"""

import argparse
import itertools
import os
import sys
import warnings

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nab  # noqa: E402
import score  # noqa: E402

MAD_SIGMA = 1.4826
NAB_PROFILES = {"standard": (1.0, 0.11, 1.0), "reward_low_FP_rate": (1.0, 0.22, 1.0)}

# The frozen parameters (see the query files).
CHOSEN_NAB = {"hour_ref": 48, "hour_t": 4.0, "hour_keep_h": 24,
              "sample_ref": 1152, "sample_t": 8.0, "sample_keep_h": 6}
CHOSEN_SMD_BURST = {"ref": 240, "far": 16.0, "k": 2}
CHOSEN_SMD_EPISODE = {"ref": 240, "far": 6.0, "k": 4, "off": 6.0, "keep_min": 60}


def change_score(v, k, ref, min_ref):
    """|change_score(v, k)| OVER (ROWS BETWEEN ref + k - 1 PRECEDING AND CURRENT ROW), row by
    row: the median of the last k values against the ref values before them, scaled by the
    larger of 1.4826 MAD and the standard deviation; NaN where the reference has fewer than
    min_ref values or no spread."""
    n = len(v)
    padded = np.concatenate([np.full(ref + k - 1, np.nan), v])
    frames = sliding_window_view(padded, ref + k)
    reference = frames[:, :ref]
    recent = np.nanmedian(frames[:, ref:], axis=1) if k > 1 else v
    med = np.nanmedian(reference, axis=1)
    mad = np.nanmedian(np.abs(reference - med[:, None]), axis=1) * MAD_SIGMA
    scale = np.maximum(mad, np.nanstd(reference, axis=1))
    have = np.sum(~np.isnan(reference), axis=1)
    scale = np.where((scale > 0) & (have >= min_ref), scale, np.nan)
    out = np.abs(recent - med) / scale
    assert len(out) == n
    return out


def buckets(ts, values, width):
    """TUMBLE(width seconds) averages in time order: (window_end, mean)."""
    t = np.asarray(ts, dtype=float)
    keys = np.floor(t / width).astype(np.int64)
    uniq, inverse = np.unique(keys, return_inverse=True)
    means = np.bincount(inverse, np.asarray(values, float)) / np.bincount(inverse)
    return (uniq + 1) * width, means


def alert_edges(ends, fire, resolve, keep_s):
    """An alert over rows at times `ends`: fires on `fire` when not firing; a firing alert
    resolves at a row where `resolve` has held, row after row, for keep_s seconds since
    the first of those rows (KEEP FIRING FOR; 0 = the first such row). Returns its changes,
    [(state, time)], and a per-row firing flag (the resolving row is not firing)."""
    changes, firing_rows = [], np.zeros(len(ends), bool)
    firing, quiet_since = False, None
    for i, t in enumerate(ends):
        if not firing:
            if fire[i]:
                firing, quiet_since = True, None
                changes.append(("firing", t))
        elif resolve[i]:
            quiet_since = t if quiet_since is None else quiet_since
            if t - quiet_since >= keep_s:
                firing = False
                changes.append(("resolved", t))
        else:
            quiet_since = None
        firing_rows[i] = firing
    return changes, firing_rows


def firing_times(changes):
    return [t for state, t in changes if state == "firing"]


# NAB


def nab_features(series):
    """Per series, the scores every candidate reads, computed once per reference length."""
    out = []
    for s in series:
        h_end, h_mean = buckets(s.ts, s.values, 3600)
        m_end, m_mean = buckets(s.ts, s.values, 60)
        out.append({
            "s": s, "layout": nab.layout(s.ts, s.windows, s.name),
            "hour_end": h_end, "minute_end": m_end,
            "hour": {r: change_score(h_mean, 1, r, r) for r in (24, 48, 96)},
            "sample": {r: np.fmax(change_score(m_mean, 1, r, r), change_score(m_mean, 6, r, r))
                       for r in (576, 1152)},
        })
    return out


def nab_firings(f, p):
    with np.errstate(invalid="ignore"):
        z = f["hour"][p["hour_ref"]]
        times = firing_times(nab_hour_alert(f["hour_end"], z, p)[0])
        if p["sample_t"] is not None:
            z = f["sample"][p["sample_ref"]]
            more = firing_times(nab_sample_alert(f["minute_end"], z, p)[0])
            times = times + more
    return nab.detection_rows(f["s"].ts, sorted(times))


def nab_hour_alert(ends, z, p):
    return alert_edges(ends, z > p["hour_t"], ~(z > p["hour_t"]), p["hour_keep_h"] * 3600)


def nab_sample_alert(ends, z, p):
    return alert_edges(ends, z > p["sample_t"], ~(z > p["sample_t"]), p["sample_keep_h"] * 3600)


def nab_scores(features, p):
    raw = dict.fromkeys(NAB_PROFILES, 0.0)
    windows = hits = fps = 0
    for f in features:
        rows = nab_firings(f, p)
        for name, profile in NAB_PROFILES.items():
            r, h, fp = nab.file_raw(f["layout"], rows, profile)
            raw[name] += r
        windows += f["layout"].windows
        hits, fps = hits + h, fps + fp
    return ({name: nab.normalised(raw[name], windows, prof)
             for name, prof in NAB_PROFILES.items()}, hits, windows, fps)


def nab_grid():
    for hr, ht, hk in itertools.product((24, 48, 96), (3.0, 4.0, 5.0), (6, 12, 24)):
        for sr, st, sk in itertools.product((576, 1152), (None, 8.0, 12.0, 20.0), (6,)):
            if st is None and sr != 1152:
                continue
            yield {"hour_ref": hr, "hour_t": ht, "hour_keep_h": hk,
                   "sample_ref": sr, "sample_t": st, "sample_keep_h": sk}


def tune_nab(data_dir, top):
    series = score.load_nab(data_dir, set(score.TUNE_NAB_GROUPS))
    features = nab_features(series)
    rows = []
    for p in nab_grid():
        scores, hits, windows, fps = nab_scores(features, p)
        rows.append((scores["standard"], scores["reward_low_FP_rate"], hits, windows, fps, p))
    rows.sort(key=lambda r: -r[0])
    print("NAB tuning set (%d series): best by the standard profile" % len(series))
    for r in rows[:top]:
        print_nab_row(r)
    chosen = [r for r in rows if r[5] == CHOSEN_NAB]
    print("chosen (queries/pack/series/shift_or_spike.sql):")
    print_nab_row(chosen[0])


def print_nab_row(r):
    std, low_fp, hits, windows, fps, p = r
    print("  standard %6.2f  low FP %6.2f  windows %d/%d  false alerts %4d  %s"
          % (std, low_fp, hits, windows, fps, p))


# SMD


def smd_features(machines, ref):
    out = []
    for m in machines:
        z = np.vstack([change_score(np.asarray(m.columns[name], float), 1, ref, ref // 2)
                       for name in score.SMD_METRICS])
        out.append((m, np.asarray(m.ts, float) + 60, z))
    return out


def smd_scores(features, far, k, off, keep_min, pa_k=score.DEFAULT_PA_K):
    labels, pred, alerts = [], [], 0
    with np.errstate(invalid="ignore"):
        for m, ends, z in features:
            n_far = np.sum(z > far, axis=0)
            resolve = n_far < k if off is None else np.sum(z > off, axis=0) < k
            changes, firing = alert_edges(ends, n_far >= k, resolve, keep_min * 60)
            labels.append(list(m.labels))
            pred.append(list(firing.astype(int)))
            alerts += len(firing_times(changes))
    out = {}
    for name, adjust in (("pa", score.point_adjust),
                         ("pa_k", lambda y, p: score.point_adjust_k(y, p, pa_k)),
                         ("raw", lambda y, p: p)):
        tp = fp = fn = 0
        for y, p in zip(labels, pred):
            a, b, c = score.confusion(y, adjust(y, p))
            tp, fp, fn = tp + a, fp + b, fn + c
        out[name] = score.prf(tp, fp, fn)[2]
    return out, alerts


def tune_smd(data_dir, top):
    machines = score.load_smd(data_dir, set(score.TUNE_SMD_MACHINES))
    features = smd_features(machines, CHOSEN_SMD_BURST["ref"])
    rows = []
    for far, k, off, keep in itertools.product((6.0, 8.0, 12.0, 16.0), (2, 3, 4),
                                               (None, 3.0, 4.0, 6.0), (0, 10, 30, 60)):
        if off is None and keep:
            continue
        f1, alerts = smd_scores(features, far, k, off, keep)
        rows.append((f1, alerts, {"far": far, "k": k, "off": off, "keep_min": keep}))
    print("SMD tuning set (%d machines), reference %d minutes"
          % (len(machines), CHOSEN_SMD_BURST["ref"]))
    print(" best point-adjusted F1 (the burst rule):")
    for r in sorted(rows, key=lambda r: -r[0]["pa"])[:top]:
        print_smd_row(r)
    print(" best min(F1 PA / 0.90, F1 PA%%%d / 0.60) (the episode rule):" % score.DEFAULT_PA_K)
    balanced = lambda r: -min(r[0]["pa"] / 0.9, r[0]["pa_k"] / 0.6)
    for r in sorted(rows, key=balanced)[:top]:
        print_smd_row(r)
    print("chosen (queries/pack/series/machine_metrics_burst.sql, machine_metrics_episode.sql):")
    for chosen in (CHOSEN_SMD_BURST, CHOSEN_SMD_EPISODE):
        want = {"far": chosen["far"], "k": chosen["k"], "off": chosen.get("off"),
                "keep_min": chosen.get("keep_min", 0)}
        print_smd_row(next(r for r in rows if r[2] == want))


def print_smd_row(r):
    f1, alerts, p = r
    print("  F1 PA %.3f  PA%%%d %.3f  raw %.3f  alerts %4d  %s"
          % (f1["pa"], score.DEFAULT_PA_K, f1["pa_k"], f1["raw"], alerts, p))


# Replays for tests/series_pack.rs: the chosen rules' changes on one bundled file.


def iso(t):
    return score.fmt_ts(t).replace(" ", "T")[:19]


def print_changes(alert, changes, z, cut_offs):
    """The changes, and how close any score comes to a cut-off (so a test built on them
    does not hang on float rounding)."""
    for state, t in changes:
        print("%s %s %s" % (alert, state, iso(t)))
    finite = z[np.isfinite(z)]
    closest = min(np.min(np.abs(finite - c)) for c in cut_offs)
    print("%s: closest score to a cut-off (%s): %.3g"
          % (alert, ", ".join("%g" % c for c in cut_offs), closest))


def replay_nab(path):
    """The chosen NAB rule on a long-format CSV (ts,host,metric,value) of one series."""
    import csv
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    ts = [score.parse_ts(r["ts"]) for r in rows]
    values = [float(r["value"]) for r in rows]
    p = CHOSEN_NAB
    ends, means = buckets(ts, values, 3600)
    z = change_score(means, 1, p["hour_ref"], p["hour_ref"])
    print_changes("hour_shift", nab_hour_alert(ends, z, p)[0], z, [p["hour_t"]])
    ends, means = buckets(ts, values, 60)
    z = np.fmax(change_score(means, 1, p["sample_ref"], p["sample_ref"]),
                change_score(means, 6, p["sample_ref"], p["sample_ref"]))
    print_changes("sample_spike", nab_sample_alert(ends, z, p)[0], z, [p["sample_t"]])


def replay_smd(path):
    """The chosen SMD rules on a wide SMD CSV (offset_s, the 38 metrics, label)."""
    import csv
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    ends = np.array([score.SMD_BASE_EPOCH + int(r["offset_s"]) + 60 for r in rows], float)
    ref = CHOSEN_SMD_BURST["ref"]
    z = np.vstack([change_score(np.array([float(r[m]) for r in rows]), 1, ref, ref // 2)
                   for m in score.SMD_METRICS])
    b, e = CHOSEN_SMD_BURST, CHOSEN_SMD_EPISODE
    n_far = np.sum(z > b["far"], axis=0)
    print_changes("machine_metrics_burst", alert_edges(ends, n_far >= b["k"], n_far < b["k"], 0)[0],
                  z, [b["far"]])
    n_far = np.sum(z > e["far"], axis=0)
    n_off = np.sum(z > e["off"], axis=0)
    changes = alert_edges(ends, n_far >= e["k"], n_off < e["k"], e["keep_min"] * 60)[0]
    print_changes("machine_metrics_episode", changes, z, [e["far"], e["off"]])


def main(argv=None):
    warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN frames before a series fills
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=score.DEFAULT_DATA)
    ap.add_argument("--nab-only", action="store_true")
    ap.add_argument("--smd-only", action="store_true")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--replay-nab", metavar="CSV", help="print the chosen NAB rule's changes")
    ap.add_argument("--replay-smd", metavar="CSV", help="print the chosen SMD rules' changes")
    args = ap.parse_args(argv)
    if args.replay_nab or args.replay_smd:
        if args.replay_nab:
            replay_nab(args.replay_nab)
        if args.replay_smd:
            replay_smd(args.replay_smd)
        return
    if not args.smd_only:
        tune_nab(args.data, args.top)
    if not args.nab_only:
        tune_smd(args.data, args.top)


if __name__ == "__main__":
    main()
