//! The harness's report: the Markdown tables, the targets of issue 11 with
//! PASS or FAIL, and the machine it ran on.

use std::fmt::Write as _;

use crate::{Row, latency};

pub fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// The main table, in Markdown.
pub fn table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| query | what | input | rows | s | rows/s | MB/s in | CPU s | peak RSS MB | results | notes |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        if let Some(e) = &r.failed {
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | failed: {e} | | | | | | |",
                r.name, r.what, r.input, r.rows
            );
            continue;
        }
        let mbs = if r.bytes > 0 {
            format!("{:.0}", mb(r.bytes) / r.wall)
        } else {
            "-".into()
        };
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {:.3} | {:.2} M | {mbs} | {:.2} | {:.0} | {} | {} |",
            r.name,
            r.what,
            r.input,
            r.rows,
            r.wall,
            r.rate() / 1e6,
            r.cpu,
            mb(r.rss),
            r.results,
            r.notes
        );
    }
    t
}

/// The Nexmark table: events/s, events per CPU second, Flink's per core.
pub fn nexmark_table(rows: &[(Row, f64)]) -> String {
    let mut t = String::from(
        "| query | what | events | s | events/s | CPU s | events/s per core (per CPU s) | Flink 1.13 per core | vigil / Flink | peak RSS MB | results |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (r, flink) in rows {
        if let Some(e) = &r.failed {
            let _ = writeln!(
                t,
                "| {} | {} | {} | failed: {e} | | | | {:.1} K | | | |",
                r.name,
                r.what,
                r.rows,
                flink / 1e3
            );
            continue;
        }
        let per_core = r.rows as f64 / r.cpu;
        let _ = writeln!(
            t,
            "| {} | {} | {} | {:.3} | {:.2} M | {:.2} | {:.2} M | {:.1} K | {:.0}x | {:.0} | {} |",
            r.name,
            r.what,
            r.rows,
            r.wall,
            r.rate() / 1e6,
            r.cpu,
            per_core / 1e6,
            flink / 1e3,
            per_core / flink,
            mb(r.rss),
            r.results
        );
    }
    t
}

pub fn find<'a>(rows: &'a [Row], name: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.name == name && r.failed.is_none())
}

/// One target: what, the measured value, the goal, PASS/FAIL (or n/a).
pub fn target(
    t: &mut String,
    what: &str,
    value: Option<f64>,
    shown: impl Fn(f64) -> String,
    goal: &str,
    pass: impl Fn(f64) -> bool,
) {
    let (v, verdict) = match value {
        Some(v) if v.is_finite() => (shown(v), if pass(v) { "PASS" } else { "FAIL" }),
        _ => (
            "not measured (failed or not run: see above)".to_string(),
            "n/a",
        ),
    };
    let _ = writeln!(t, "| {what} | {v} | {goal} | {verdict} |");
}

/// The measurements the targets need, beyond the rows.
pub struct Extra<'a> {
    pub nexmark: &'a [(Row, f64)],
    pub latency: Option<&'a latency::Latency>,
    pub latency_rate: u64,
    pub startup_ms: Option<f64>,
    pub parallelism: usize,
}

/// The targets table of issue 11.
pub fn targets(rows: &[Row], x: &Extra) -> String {
    let rate = |name: &str| find(rows, name).map(Row::rate);
    let mut t = String::from("| target | measured | goal | |\n|---|---|---|---|\n");
    let m = |v: f64| format!("{:.2} M rows/s", v / 1e6);
    let ratio = |v: f64| format!("{v:.2}x");
    target(
        &mut t,
        &format!("Q1 CSV rows/s (parallelism {})", x.parallelism),
        rate("q1"),
        m,
        ">= 5 M rows/s at parallelism 2",
        |v| v >= 5e6,
    );
    let duck = find(rows, "duckdb q1")
        .zip(find(rows, "q1"))
        .map(|(d, v)| d.wall / v.wall);
    target(
        &mut t,
        "Q1 vs DuckDB 2-thread batch (DuckDB time / vigil time)",
        duck,
        ratio,
        ">= 0.5x",
        |v| v >= 0.5,
    );
    target(
        &mut t,
        "Q7 (Arrow batches, Session) rows/s",
        rate("q7"),
        m,
        ">= 20 M rows/s",
        |v| v >= 20e6,
    );
    target(
        &mut t,
        "Q4 exact median rows/s",
        rate("q4"),
        m,
        ">= 2 M rows/s",
        |v| v >= 2e6,
    );
    let hop = rate("q2").zip(rate("q1")).map(|(a, b)| a / b);
    target(&mut t, "Q2 HOP / Q1", hop, ratio, ">= 0.7x", |v| v >= 0.7);
    let json = rate("q1json").zip(rate("q1")).map(|(a, b)| a / b);
    target(
        &mut t,
        "JSON lines / CSV (Q1)",
        json,
        ratio,
        ">= 0.5x",
        |v| v >= 0.5,
    );
    for q in ["q5", "q7"] {
        let vs = x
            .nexmark
            .iter()
            .find(|(r, _)| r.name == format!("nexmark {q}") && r.failed.is_none())
            .map(|(r, flink)| r.rows as f64 / r.cpu / flink);
        target(
            &mut t,
            &format!("Nexmark {q} per core / Flink's"),
            vs,
            ratio,
            ">= 20x",
            |v| v >= 20.0,
        );
    }
    let rss = |name: &str| find(rows, name).map(|r| mb(r.rss));
    let mbs = |v: f64| format!("{v:.0} MB");
    target(&mut t, "Q6 peak RSS", rss("q6"), mbs, "< 400 MB", |v| {
        v < 400.0
    });
    target(&mut t, "Q1 peak RSS", rss("q1"), mbs, "< 150 MB", |v| {
        v < 150.0
    });
    let p99 = x.latency.map(|l| {
        // Not keeping up with the offered rate is a failure whatever the p99.
        if l.achieved_rate < 0.95 * x.latency_rate as f64 {
            f64::INFINITY
        } else {
            latency::percentile(&l.latencies_us, 99.0) / 1e3
        }
    });
    let offered = x.latency_rate as f64 / 1e3;
    let (shown, pass) = match p99 {
        Some(v) if v.is_infinite() => (Some(f64::NAN), false),
        other => (other, true),
    };
    if pass {
        target(
            &mut t,
            &format!("per-record p99 at {offered:.0} K rows/s offered"),
            shown,
            |v| format!("{v:.2} ms"),
            "< 1 ms",
            |v| v < 1.0,
        );
    } else {
        let _ = writeln!(
            t,
            "| per-record p99 at {offered:.0} K rows/s offered | did not keep up with the offered rate | < 1 ms | FAIL |"
        );
    }
    target(
        &mut t,
        "start-up to first result",
        x.startup_ms,
        |v| format!("{v:.1} ms"),
        "< 50 ms",
        |v| v < 50.0,
    );
    t
}

/// nproc, CPU model and memory, from /proc.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!(
        "{cores} cores ({model}), {:.1} GB memory",
        mem_kb as f64 / 1e6
    )
}

pub fn latency_line(l: &Result<latency::Latency, String>, rate: u64) -> String {
    match l {
        Ok(l) => format!(
            "per-record latency, `SELECT id, cpu FROM m WHERE cpu > 90` through a FIFO and stdout: \
             {} rows offered at {rate} rows/s, written at {:.0} rows/s, {} results; \
             p50 {:.0} us, p99 {:.0} us, max {:.0} us; vigil CPU {:.2} s, peak RSS {:.0} MB\n",
            l.rows,
            l.achieved_rate,
            l.results,
            latency::percentile(&l.latencies_us, 50.0),
            latency::percentile(&l.latencies_us, 99.0),
            l.latencies_us.last().copied().unwrap_or(f64::NAN),
            l.cpu.as_secs_f64(),
            mb(l.peak_rss)
        ),
        Err(e) => format!("per-record latency: failed: {e}\n"),
    }
}

/// Notes the peers' ratios and Q6's memory per open state on the rows.
pub fn ratios(rows: &mut [Row], hosts: u64, many_hosts: u64) {
    let times: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| r.failed.is_none())
        .map(|r| (r.name.clone(), r.wall))
        .collect();
    let results: Vec<(String, u64)> = rows
        .iter()
        .filter(|r| r.failed.is_none())
        .map(|r| (r.name.clone(), r.results))
        .collect();
    let time = |name: &str| times.iter().find(|(n, _)| n == name).map(|(_, t)| *t);
    let result_rows = |name: &str| results.iter().find(|(n, _)| n == name).map(|(_, c)| *c);
    let q1 = find(rows, "q1").cloned();
    let q6 = find(rows, "q6").cloned();
    for r in rows.iter_mut().filter(|r| r.failed.is_none()) {
        let Some((peer, query)) = r.name.split_once(' ') else {
            continue;
        };
        if peer != "datafusion" && peer != "duckdb" {
            continue;
        }
        if let Some(vigil) = time(query) {
            r.notes = format!(
                "vigil {query} is {:.2}x its speed (its query time, without process start)",
                r.wall / vigil
            );
        }
        match result_rows(query) {
            Some(n) if n != r.results => {
                let _ = write!(r.notes, "; vigil gave {n} result rows!");
            }
            Some(_) => r.notes.push_str("; the same result rows as vigil"),
            None => {}
        }
    }
    if let (Some(q1), Some(q6), Some(r)) = (q1, q6, rows.iter_mut().find(|r| r.name == "q6")) {
        let extra_rss = q6.rss.saturating_sub(q1.rss) as f64;
        let extra_hosts = many_hosts.saturating_sub(hosts).max(1) as f64;
        r.notes = format!(
            "{:.0} bytes of RSS over Q1's per extra host, each with one or two (window, host) states open",
            extra_rss / extra_hosts
        );
    }
}
