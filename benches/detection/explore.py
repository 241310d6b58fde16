#!/usr/bin/env python3
"""Prototype streaming alert rules in Python and score them like score.py does.

Not part of the scorer: a workbench for choosing the rules of queries/pack. Every rule is
one that windowed SQL can express:

  1. tumbling window of W minutes per host/metric: avg (and max/min/median/count);
  2. per key, history over the window results: ROWS BETWEEN k PRECEDING AND CURRENT ROW
     (median, mad, avg, stddev, min, max, count), lag, or UNBOUNDED PRECEDING;
  3. condition per window; alert state machine per key: pending while the condition holds,
     firing once it held FOR n consecutive windows (one `firing` event, event_time =
     window_end), resolved when the RESOLVE WHEN condition holds (default: condition
     false), which emits `resolved` (event_time = window_end).

    python3 benches/detection/explore.py nab     # broad grid over NAB (~2 min)
    python3 benches/detection/explore.py nab2    # refined NAB grid around the best (~40 s)
    python3 benches/detection/explore.py smd     # broad grid over SMD (~2-3 min)
    python3 benches/detection/explore.py smd2    # refined SMD grid (~40 s)

Results are scored with score.py's functions (NAB: windows detected and false positives by
event time, not the NAB score; SMD point-adjusted and raw F1); event_time of a firing is
the window_end of the window that completed the FOR run. It loads the tuning set only (score.py's TUNE_NAB_GROUPS and
TUNE_SMD_MACHINES): the test set must stay unseen while rules are chosen.
"""

import bisect
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import score  # noqa: E402
from score import mad_sorted, median_sorted  # noqa: E402

DATA = os.environ.get("VIGIL_DATA", score.DEFAULT_DATA)


# ---------------------------------------------------------------------------------------
# windows and history

def tumble(ts, vals, w_s):
    """Tumbling windows aligned to the epoch: list of (start, end, [values]) with rows,
    ascending (rows sorted by event time first; NAB's one out-of-order hour is on time for
    a watermark delay of an hour)."""
    order = sorted(range(len(ts)), key=ts.__getitem__)
    out = []
    cur = None
    for i in order:
        s = ts[i] - ts[i] % w_s
        if cur is None or s != cur[0]:
            cur = (s, s + w_s, [])
            out.append(cur)
        cur[2].append(vals[i])
    return out


def rolling(xs, k, fn):
    """fn(sorted history, x) per position, history = the last k+1 values, current one
    included (ROWS BETWEEN k PRECEDING AND CURRENT ROW)."""
    win = []
    out = []
    for i, x in enumerate(xs):
        bisect.insort(win, x)
        if i > k:
            del win[bisect.bisect_left(win, xs[i - k - 1])]
        out.append(fn(win, x))
    return out


def rob_stats(win, x):
    m = median_sorted(win)
    return m, mad_sorted(win, m), len(win)


def mean_std(xs, k):
    """(mean, sample stddev, count) over the last k+1 values incl. current."""
    out = []
    s = s2 = 0.0
    for i, x in enumerate(xs):
        s += x
        s2 += x * x
        if i > k:
            y = xs[i - k - 1]
            s -= y
            s2 -= y * y
        n = min(i + 1, k + 1)
        mu = s / n
        var = (s2 - n * mu * mu) / (n - 1) if n > 1 else 0.0
        out.append((mu, math.sqrt(max(var, 0.0)), n))
    return out


def state_machine(cond, resolve, n_for, times):
    """Events (time, 'firing'|'resolved') of one key. resolve=None: condition false."""
    ev = []
    firing = False
    run = 0
    for i, c in enumerate(cond):
        if firing:
            r = resolve[i] if resolve is not None else not c
            if r:
                firing = False
                run = 0
                ev.append((times[i], "resolved"))
            continue
        if c:
            run += 1
            if run >= n_for:
                firing = True
                ev.append((times[i], "firing"))
        else:
            run = 0
    return ev


# ---------------------------------------------------------------------------------------
# rules: each takes window results of one key -> (cond, resolve) lists

def agg_of(wins, agg):
    if agg == "avg":
        return [sum(v) / len(v) for _, _, v in wins]
    if agg == "max":
        return [max(v) for _, _, v in wins]
    if agg == "min":
        return [min(v) for _, _, v in wins]
    if agg == "median":
        return [median_sorted(sorted(v)) for _, _, v in wins]
    raise ValueError(agg)


def z_scores(x, k, minhist, denom="mad", floor_rel=0.0):
    """Robust z of each x against the last k+1 windows (incl. current); None when the
    history is short or the spread is 0. denom: 'mad' | 'mad_or_std' (stddev when MAD=0)."""
    rs = rolling(x, k, rob_stats)
    ms = mean_std(x, k) if denom == "mad_or_std" else None
    out = []
    for i, (m, mad, n) in enumerate(rs):
        if n < minhist:
            out.append(None)
            continue
        d = mad
        if floor_rel:
            d = max(d, floor_rel * abs(m))
        if d > 0:
            out.append(0.6745 * (x[i] - m) / d)
        elif denom == "mad_or_std" and ms[i][1] > 0:
            out.append((x[i] - ms[i][0]) / ms[i][1])
        else:
            out.append(None)
    return out


def rule_z(wins, p):
    x = agg_of(wins, p.get("agg", "avg"))
    z = z_scores(x, p["k"], p.get("minhist", p["k"] // 2), p.get("denom", "mad"),
                 p.get("floor", 0.0))
    T, R = p["T"], p.get("R")
    side = p.get("side", "both")

    def val(zz):
        if zz is None:
            return None
        return abs(zz) if side == "both" else (zz if side == "up" else -zz)
    cond = [(val(zz) is not None and val(zz) > T) for zz in z]
    res = None if R is None else [(val(zz) is None or val(zz) < R) for zz in z]
    return cond, res


def rule_rel(wins, p):
    """|avg - moving avg of the last k windows (incl. current)| / |moving avg| > r."""
    x = agg_of(wins, "avg")
    ms = mean_std(x, p["k"])
    cond, res = [], []
    for xi, (mu, sd, n) in zip(x, ms):
        ok = n >= p.get("minhist", p["k"] // 2) and mu != 0
        rel = abs(xi - mu) / abs(mu) if ok else 0.0
        cond.append(ok and rel > p["r"])
        res.append(rel < p.get("rr", p["r"]))
    return cond, (res if "rr" in p else None)


def rule_range(wins, p):
    """Learned range of the window aggregate over the first `learn` windows (frozen),
    alert when outside [min - m*span, max + m*span]."""
    x = agg_of(wins, p.get("agg", "avg"))
    L = p["learn"]
    if L >= len(x):
        return [False] * len(x), None
    lo, hi = min(x[:L]), max(x[:L])
    span = hi - lo
    if p.get("abs_margin"):
        span = max(span, p["abs_margin"])
    m = p["m"]
    cond = [i >= L and (xi > hi + m * span or xi < lo - m * span) for i, xi in enumerate(x)]
    return cond, None


def rule_newrange(wins, p):
    """Expanding range: outside [min, max] of all earlier windows (UNBOUNDED PRECEDING,
    excluding current = lag of the running min/max) by margin m * span, after `learn`
    windows of warm-up."""
    x = agg_of(wins, p.get("agg", "avg"))
    lo = hi = None
    cond = []
    for i, xi in enumerate(x):
        if lo is None:
            cond.append(False)
            lo = hi = xi
            continue
        span = hi - lo
        c = i >= p["learn"] and (xi > hi + p["m"] * span or xi < lo - p["m"] * span)
        cond.append(c)
        lo, hi = min(lo, xi), max(hi, xi)
    return cond, None


def rule_z_and_rel(wins, p):
    c1, r1 = rule_z(wins, p)
    x = agg_of(wins, "avg")
    ms = mean_std(x, p["k"])
    cond = [a and (mu != 0 and abs(xi - mu) / abs(mu) > p["r"]) for a, xi, (mu, _, _) in zip(c1, x, ms)]
    return cond, r1


RULES = {"z": rule_z, "rel": rule_rel, "range": rule_range, "newrange": rule_newrange,
         "zrel": rule_z_and_rel}


def run_rule(wins, rule, p):
    cond, res = RULES[rule](wins, p)
    return state_machine(cond, res, p.get("n", 1), [e for _, e, _ in wins])


# ---------------------------------------------------------------------------------------
# NAB

def nab_eval(series, wins_by_series, rule, p):
    det = fp = nfire = 0
    per = {}
    for s in series:
        ev = run_rule(wins_by_series[s.name], rule, p)
        times = [t for t, st in ev if st == "firing"]
        d, f, _ = score.score_windows(s.windows, times)
        det += d
        fp += f
        nfire += len(times)
        per[s.name] = (d, len(s.windows), f)
    return det, fp, nfire, per


def fmt_p(rule, p):
    return rule + " " + " ".join("%s=%s" % (k, v) for k, v in p.items())


def nab_grid():
    series = score.load_nab(DATA, set(score.TUNE_NAB_GROUPS))
    total = sum(len(s.windows) for s in series)
    results = []
    cache = {}

    def wins(W):
        if W not in cache:
            cache[W] = {s.name: tumble(s.ts, s.values, W * 60) for s in series}
        return cache[W]

    grid = []
    for W in (10, 30, 60):
        day = 24 * 60 // W
        for kd in (1, 3):
            k = day * kd
            for T in (4, 5, 6, 8):
                for n in (1, 2, 3):
                    for R in (None, 3):
                        for denom in ("mad", "mad_or_std"):
                            grid.append(("z", dict(W=W, k=k, T=T, n=n, R=R, denom=denom)))
        for r in (0.5, 1.0, 2.0):
            for n in (1, 2, 3):
                grid.append(("rel", dict(W=W, k=day, r=r, n=n)))
        for m in (0.0, 0.1, 0.25, 0.5):
            for n in (1, 2, 3):
                grid.append(("range", dict(W=W, learn=2 * day, m=m, n=n)))
                grid.append(("newrange", dict(W=W, learn=2 * day, m=m, n=n)))
    t0 = time.time()
    for rule, p in grid:
        pp = dict(p)
        W = pp.pop("W")
        det, fp, nf, per = nab_eval(series, wins(W), rule, pp)
        results.append((det, fp, nf, rule, p, per))
    print("# NAB grid: %d configs in %.0f s; %d windows" % (len(grid), time.time() - t0, total))
    return results, total


# ---------------------------------------------------------------------------------------
# SMD

def smd_prepare(W):
    machines = score.load_smd(DATA, set(score.TUNE_SMD_MACHINES))
    out = []
    for m in machines:
        per_metric = {}
        for metric in score.SMD_METRICS:
            per_metric[metric] = tumble(m.ts, m.columns[metric], W * 60)
        out.append((m, per_metric))
    return out


def smd_eval(prepared, rule, p, min_metrics=1, combine="any"):
    """combine='any': each metric its own alert, a row predicted while any is firing.
    combine='count': per machine and window, count metrics whose condition holds; the
    machine's alert condition is count >= min_metrics (FOR n, resolve when count <
    max(1, min_metrics // 2) if p['Rc'] else the condition false)."""
    tot = [0, 0, 0]
    raw = [0, 0, 0]
    nfire = 0
    for m, per_metric in prepared:
        events = []
        if combine == "any":
            for metric, wins in per_metric.items():
                ev = run_rule(wins, rule, p)
                events.extend((t, metric, st) for t, st in ev)
        else:
            counts = None
            times = None
            rcounts = None
            for metric, wins in per_metric.items():
                cond, res = RULES[rule](wins, p)
                if counts is None:
                    counts = [0] * len(cond)
                    rcounts = [0] * len(cond)
                    times = [e for _, e, _ in wins]
                for i, c in enumerate(cond):
                    if c:
                        counts[i] += 1
                    if res is not None and not res[i]:
                        rcounts[i] += 1  # metrics still not resolved
            cond = [c >= min_metrics for c in counts]
            if p.get("R") is not None:
                res = [rc == 0 for rc in rcounts]
            else:
                res = None
            ev = state_machine(cond, res, p.get("n", 1), times)
            events = [(t, "machine", st) for t, st in ev]
        nfire += sum(1 for e in events if e[2] == "firing")
        pred = score.rows_in_intervals(m.ts, events)
        adj = score.point_adjust(m.labels, pred)
        for acc, pr in ((tot, adj), (raw, pred)):
            a, b, c = score.confusion(m.labels, pr)
            acc[0] += a
            acc[1] += b
            acc[2] += c
    P, R, F = score.prf(*tot)
    _, _, RF = score.prf(*raw)
    return P, R, F, RF, nfire


def smd_grid():
    """Per-metric robust z (cached per W, k) and learned ranges; combine per machine."""
    t0 = time.time()
    machines = score.load_smd(DATA, set(score.TUNE_SMD_MACHINES))
    print("# SMD loaded in %.0f s" % (time.time() - t0))
    rows = []

    def evaluate(name, per_machine_cond_res_times, n_for):
        """per_machine: list of (machine, [(key, cond, res, times)])."""
        tot = [0, 0, 0]
        raw = [0, 0, 0]
        nfire = 0
        for m, keyed in per_machine_cond_res_times:
            events = []
            for key, cond, res, times in keyed:
                ev = state_machine(cond, res, n_for, times)
                events.extend((t, key, st) for t, st in ev)
            nfire += sum(1 for e in events if e[2] == "firing")
            pred = score.rows_in_intervals(m.ts, events)
            adj = score.point_adjust(m.labels, pred)
            for acc, pr in ((tot, adj), (raw, pred)):
                a, b, c = score.confusion(m.labels, pr)
                acc[0] += a
                acc[1] += b
                acc[2] += c
        P, R, F = score.prf(*tot)
        _, _, RF = score.prf(*raw)
        rows.append((F, P, R, RF, nfire, name))
        print("| %s | %.3f | %.3f | %.3f | %.3f | %d |" % (name, P, R, F, RF, nfire), flush=True)

    for W in (5, 10):
        t1 = time.time()
        wins = [(m, {met: tumble(m.ts, m.columns[met], W * 60) for met in score.SMD_METRICS})
                for m in machines]
        day = 24 * 60 // W
        zs = []
        for m, pm in wins:
            zm = {}
            for met, ws in pm.items():
                x = agg_of(ws, "avg")
                zm[met] = (z_scores(x, day, day // 2, "mad_or_std"), x, [e for _, e, _ in ws])
            zs.append((m, zm))
        print("# SMD W=%d: z computed in %.0f s" % (W, time.time() - t1), flush=True)
        # any metric, per-metric alerts
        for T in (6, 10, 20):
            for n in (1, 2):
                for R in (None, 3):
                    pm = []
                    for m, zm in zs:
                        keyed = []
                        for met, (z, x, times) in zm.items():
                            cond = [zz is not None and abs(zz) > T for zz in z]
                            res = None if R is None else [zz is None or abs(zz) < R for zz in z]
                            keyed.append((met, cond, res, times))
                        pm.append((m, keyed))
                    evaluate("z-any W=%d k=%d T=%s n=%d R=%s" % (W, day, T, n, R), pm, n)
        # count of metrics with |z| > T per machine window
        for T in (4, 6, 10):
            for c in (2, 3, 5, 8):
                for n in (1, 2):
                    pm = []
                    for m, zm in zs:
                        times = next(iter(zm.values()))[2]
                        cnt = {}
                        for met, (z, x, tt) in zm.items():
                            for zz, t in zip(z, tt):
                                if zz is not None and abs(zz) > T:
                                    cnt[t] = cnt.get(t, 0) + 1
                        alltimes = sorted(set(t for _, (_, _, tt) in zm.items() for t in tt))
                        cond = [cnt.get(t, 0) >= c for t in alltimes]
                        pm.append((m, [("machine", cond, None, alltimes)]))
                    evaluate("z-count W=%d k=%d T=%s c>=%d n=%d" % (W, day, T, c, n), pm, n)
        # learned range per metric over the first 15 % of windows (frozen)
        for margin in (0.0, 0.1, 0.25):
            for c in (1, 2, 3, 5):
                for n in (1, 2):
                    pm = []
                    for m, zm in zs:
                        cnt = {}
                        keyed = []
                        for met, (z, x, tt) in zm.items():
                            L = int(0.15 * len(x))
                            lo, hi = min(x[:L]), max(x[:L])
                            span = hi - lo
                            cond = [i >= L and (xi > hi + margin * span or xi < lo - margin * span)
                                    for i, xi in enumerate(x)]
                            if c == 1:
                                keyed.append((met, cond, None, tt))
                            for cc, t in zip(cond, tt):
                                if cc:
                                    cnt[t] = cnt.get(t, 0) + 1
                        if c > 1:
                            alltimes = sorted(set(t for _, (_, _, tt) in zm.items() for t in tt))
                            keyed = [("machine", [cnt.get(t, 0) >= c for t in alltimes], None,
                                      alltimes)]
                        pm.append((m, keyed))
                    evaluate("range%s W=%d learn=15%% m=%s %s n=%d" % (
                        "-any" if c == 1 else "-count", W, margin,
                        "" if c == 1 else "c>=%d" % c, n), pm, n)
    rows.sort(reverse=True)
    print("\n# SMD sorted by point-adjusted F1")
    print("| rule | precision | recall | F1 (PA) | F1 (raw) | alerts |")
    for F, P, R, RF, nf, name in rows:
        print("| %s | %.3f | %.3f | %.3f | %.3f | %d |" % (name, P, R, F, RF, nf))


def nab_refined():
    series = score.load_nab(DATA, set(score.TUNE_NAB_GROUPS))
    total = sum(len(s.windows) for s in series)
    cache={}
    def Wn(w):
        if w not in cache: cache[w]={s.name: tumble(s.ts,s.values,w*60) for s in series}
        return cache[w]
    def rule_or(wins, p):
        c1, _ = rule_z(wins, p)
        c2, _ = rule_newrange(wins, dict(learn=p["learn"], m=p["m"]))
        return [a or b for a, b in zip(c1, c2)], None
    RULES["z|newrange"] = rule_or
    grid=[]
    for k in (24, 48):
      for T in (3.5, 4, 4.5):
        for R in (None, 2):
          for agg in ("avg", "max", "median"):
            for mh in (k//2, k):
              grid.append(("z", dict(W=60,k=k,T=T,n=1,R=R,denom="mad_or_std",agg=agg,minhist=mh)))
    for W in (10,30,60):
      day=24*60//W
      for L in (1,2,3):
        for m in (0.0,0.05):
          for n in (1,2):
            grid.append(("range", dict(W=W,learn=L*day,m=m,n=n)))
            grid.append(("newrange", dict(W=W,learn=L*day,m=m,n=n)))
    for T in (4,5,6):
      for L in (1,2):
        grid.append(("z|newrange", dict(W=60,k=24,T=T,n=1,R=None,denom="mad_or_std",learn=L*24,m=0.0)))
    out=[]
    for rule,p in grid:
        pp=dict(p); w=pp.pop("W")
        det,fp,nf,per=nab_eval(series,Wn(w),rule,pp)
        out.append((det,fp,nf,fmt_p(rule,p)))
    out.sort(key=lambda r:(-r[0],r[1]))
    for det,fp,nf,name in out: print("| %s | %d/%d | %d | %d |"%(name,det,total,fp,nf))


def smd_refined():
    machines = score.load_smd(DATA, set(score.TUNE_SMD_MACHINES))
    def prep(W, k):
        zs=[]
        for m in machines:
            zm={}
            for met in score.SMD_METRICS:
                ws=tumble(m.ts, m.columns[met], W*60)
                x=agg_of(ws,"avg")
                zm[met]=(z_scores(x,k,k//2,"mad_or_std"), [s for s,_,_ in ws], [e for _,e,_ in ws])
            zs.append((m,zm))
        return zs
    def ev_eval(zs, mk_events):
        tot=[0,0,0]; raw=[0,0,0]; nf=0
        for m,zm in zs:
            events=mk_events(zm)
            nf+=sum(1 for e in events if e[2]=="firing")
            pred=score.rows_in_intervals(m.ts, events)
            adj=score.point_adjust(m.labels,pred)
            for acc,pr in ((tot,adj),(raw,pred)):
                a,b,c=score.confusion(m.labels,pr); acc[0]+=a;acc[1]+=b;acc[2]+=c
        P,R,F=score.prf(*tot); _,_,RF=score.prf(*raw)
        return P,R,F,RF,nf
    def count_rule(T,c,n,use_start,R=None,rc=None):
        def mk(zm):
            cnt={}; rcnt={}
            for met,(z,ss,ee) in zm.items():
                tt = ss if use_start else ee
                for zz,t in zip(z,tt):
                    if zz is not None and abs(zz)>T: cnt[t]=cnt.get(t,0)+1
                    if R is not None and zz is not None and abs(zz)>R: rcnt[t]=rcnt.get(t,0)+1
            times=sorted(set(t for _,(z,ss,ee) in zm.items() for t in (ss if use_start else ee)))
            cond=[cnt.get(t,0)>=c for t in times]
            res=None if R is None else [rcnt.get(t,0)<rc for t in times]
            return [(t,"m",st) for t,st in state_machine(cond,res,n,times)]
        return mk
    def any_rule(T,n,R,use_start):
        def mk(zm):
            out=[]
            for met,(z,ss,ee) in zm.items():
                tt = ss if use_start else ee
                cond=[zz is not None and abs(zz)>T for zz in z]
                res=None if R is None else [zz is None or abs(zz)<R for zz in z]
                out += [(t,met,st) for t,st in state_machine(cond,res,n,tt)]
            return out
        return mk
    for W,k in ((5,288),(60,24)):
        t0=time.time(); zs=prep(W,k); print("# W=%d prep %.0f s"%(W,time.time()-t0),flush=True)
        cfgs=[]
        if W==5:
            for T in (5,6,8):
                for c in (4,5,6):
                    cfgs.append(("z-count W=5 k=288 T=%s c>=%d n=1"%(T,c), count_rule(T,c,1,False)))
            cfgs.append(("z-count W=5 k=288 T=6 c>=5 n=1 event_time=window_start", count_rule(6,5,1,True)))
            cfgs.append(("z-count W=5 k=288 T=6 c>=5 n=1 resolve: <2 metrics |z|>3", count_rule(6,5,1,False,3,2)))
            cfgs.append(("z-count W=5 k=288 T=4 c>=5 n=2 event_time=window_start", count_rule(4,5,2,True)))
        else:
            cfgs.append(("z-any W=60 k=24 T=3.5 n=1 R=2 (NAB rule)", any_rule(3.5,1,2,False)))
            cfgs.append(("z-any W=60 k=24 T=3.5 n=1 R=2 event_time=window_start", any_rule(3.5,1,2,True)))
            for T in (4,6):
                for c in (3,5):
                    cfgs.append(("z-count W=60 k=24 T=%s c>=%d n=1"%(T,c), count_rule(T,c,1,False)))
        for name,mk in cfgs:
            print("| %s | %.3f | %.3f | %.3f | %.3f | %d |"%((name,)+ev_eval(zs,mk)),flush=True)


def nab_broad():
    results, total = nab_grid()
    results.sort(key=lambda r: (-r[0], r[1]))
    print("| rule | windows | FP | firing |")
    for det, fp, nf, rule, p, per in results:
        print("| %s | %d/%d | %d | %d |" % (fmt_p(rule, p), det, total, fp, nf))


if __name__ == "__main__":
    cmds = {"nab": nab_broad, "nab2": nab_refined, "smd": smd_grid, "smd2": smd_refined}
    what = sys.argv[1] if len(sys.argv) > 1 else "nab"
    if what not in cmds:
        sys.exit("usage: explore.py nab|nab2|smd|smd2")
    cmds[what]()
