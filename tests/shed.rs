//! Load shedding end to end (issue 12): the real `vigil` binary fed live
//! rows through stdin at 3x what its query can process, once without
//! shedding (results fall ever further behind) and once with it (results
//! stay within the bound), with the shed count and `_shed_fraction`
//! checked against the rows actually kept.
//!
//! The generator gives row `i` the event time `t0 + i / rate` (t0 = wall
//! clock at start) and writes it no earlier than that: when vigil cannot
//! keep up, back-pressure delays the writes, so results come late rather
//! than the event clock slowing down with the reader.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::support::{self, Guarded, join_within};

const HOSTS: u64 = 4;
/// Windows each row is in: 2 s windows sliding by 500 ms.
const WINDOWS_PER_ROW: u64 = 4;
const WINDOW_MS: i64 = 2_000;
const DELAY_MS: i64 = 500;
const MAX_LATENCY_MS: i64 = 1_000;
/// How long vigil may take, once its input has ended, to finish (and the
/// threads feeding and reading it to end).
const PATIENCE: Duration = Duration::from_secs(120);

/// A query that is expensive per row (a regular expression over a long
/// string, and a median), not per window: what shedding can save.
const QUERY: &str = "SELECT window_end, host, median(v) AS med,
  max(length(regexp_replace(repeat(host, 20), '[0-9]', 'xy', 'g'))) AS w, count(*) AS n
  FROM HOP(m, ts, INTERVAL '500' MILLISECOND, INTERVAL '2' SECOND)
  GROUP BY window_start, window_end, host;";

fn script(with: &str) -> String {
    format!(
        "SET parallelism = 1;
CREATE STREAM m (ts TIMESTAMP, host TEXT, v DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '{DELAY_MS}' MILLISECOND)
  WITH (connector = 'stdin', format = 'csv', batch_size = '1024'{with});
{QUERY}\n"
    )
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

/// One result row as it arrived.
struct Arrival {
    /// Wall clock at arrival minus the window's end, in milliseconds.
    latency_ms: i64,
    /// When it arrived, since the run started.
    at: Duration,
    rows: u64,
    shed_fraction: Option<f64>,
}

struct Run {
    offered: u64,
    arrivals: Vec<Arrival>,
    stderr: String,
}

fn start(dir: &Path, sql: &str) -> Guarded {
    std::fs::write(dir.join("q.sql"), sql).expect("write script");
    let mut command = Command::new(env!("CARGO_BIN_EXE_vigil"));
    command
        .args(["run", "q.sql", "--format", "csv"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    support::spawn(&mut command, "vigil run")
}

/// Runs `sql` for `length`, offering `rate` rows per second (or as many as
/// it takes, when `None`); then ends the input and, if `drain`, waits for
/// the results of what was written, else kills vigil.
fn run(sql: &str, rate: Option<f64>, length: Duration, drain: bool) -> Run {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = start(dir.path(), sql);
    let started = Instant::now();
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let stdout = child.stdout.take().expect("stdout");
    let reader = {
        let arrivals = arrivals.clone();
        std::thread::spawn(move || read_results(stdout, started, &arrivals))
    };
    let stderr = child.stderr.take().expect("stderr");
    let errors = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let stop = Arc::new(AtomicBool::new(false));
    let input = child.stdin.take().expect("stdin");
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || generate(input, rate, started, &stop))
    };
    // The run's length, by design: not a wait for anything.
    std::thread::sleep(length);
    stop.store(true, Ordering::Relaxed);
    if !drain {
        child.kill_group();
    }
    let offered = join_within(writer, PATIENCE, "the generator");
    child.wait_within(PATIENCE);
    join_within(reader, PATIENCE, "vigil's results");
    let arrivals = std::mem::take(&mut *arrivals.lock().unwrap());
    Run {
        offered,
        arrivals,
        stderr: join_within(errors, PATIENCE, "vigil's stderr"),
    }
}

/// Writes rows until told to stop; returns how many it wrote.
fn generate(mut input: impl Write, rate: Option<f64>, started: Instant, stop: &AtomicBool) -> u64 {
    let t0 = now_ms();
    // Unthrottled rows get the wall clock as event time, so windows fire
    // as often as in a throttled run.
    let per_ms = rate.unwrap_or(100_000.0) / 1000.0;
    let mut text = String::from("ts,host,v\n");
    let mut written = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let due = match rate {
            Some(rate) => (started.elapsed().as_secs_f64() * rate) as u64,
            None => written + 1000,
        };
        if due <= written {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        // At most 10 ms of rows at once, so a stop is not late.
        let until = due.min(written + (per_ms * 10.0).max(1.0) as u64);
        let now = now_ms();
        for i in written..until {
            let ts = match rate {
                Some(_) => t0 + (i as f64 / per_ms) as i64,
                None => now,
            };
            let v = (i.wrapping_mul(7919)) % 1000;
            text.push_str(&format!("{ts},h{},{v}\n", i % HOSTS));
        }
        if input.write_all(text.as_bytes()).is_err() {
            break;
        }
        text.clear();
        written = until;
    }
    written
}

fn read_results(stdout: impl std::io::Read, started: Instant, into: &Mutex<Vec<Arrival>>) {
    let mut lines = BufReader::new(stdout).lines();
    let Some(Ok(header)) = lines.next() else {
        return;
    };
    let names: Vec<&str> = header.split(',').collect();
    let column = |name: &str| names.iter().position(|n| *n == name);
    let (end, rows) = (column("window_end"), column("n"));
    let fraction = column("_shed_fraction");
    for line in lines.map_while(|l| l.ok()) {
        let fields: Vec<&str> = line.split(',').collect();
        let end = end.and_then(|i| parse_time(fields[i])).expect("window_end");
        into.lock().unwrap().push(Arrival {
            latency_ms: now_ms() - end,
            at: started.elapsed(),
            rows: rows.and_then(|i| fields[i].parse().ok()).expect("n"),
            shed_fraction: fraction.and_then(|i| fields[i].parse().ok()),
        });
    }
}

/// `2026-12-01T17:49:57.100` as epoch milliseconds.
fn parse_time(text: &str) -> Option<i64> {
    let t = chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f").ok()?;
    Some(t.and_utc().timestamp_millis())
}

/// The largest latency of the results that arrived after `from`.
fn worst_latency(run: &Run, from: Duration, to: Duration) -> i64 {
    run.arrivals
        .iter()
        .filter(|a| a.at >= from && a.at <= to)
        .map(|a| a.latency_ms)
        .max()
        .unwrap_or(i64::MAX)
}

/// The worst latency per second of the run, for the log.
fn timeline(run: &Run) -> String {
    let mut worst: Vec<i64> = Vec::new();
    for a in &run.arrivals {
        let second = a.at.as_secs() as usize;
        if worst.len() <= second {
            worst.resize(second + 1, i64::MIN);
        }
        worst[second] = worst[second].max(a.latency_ms);
    }
    let shown: Vec<String> = worst
        .iter()
        .map(|&w| match w {
            i64::MIN => "-".into(),
            w => w.to_string(),
        })
        .collect();
    shown.join(" ")
}

/// The `shed=` count of the run summary line starting with `prefix` (0
/// when it says none).
fn summary_shed(stderr: &str, prefix: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no run summary in {stderr}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("shed="))
        .map_or(0, |n| n.parse().expect("a number"))
}

#[test]
fn shedding_holds_latency_under_the_bound_at_three_times_capacity() {
    let bound_ms = MAX_LATENCY_MS + WINDOW_MS + DELAY_MS;
    let length = Duration::from_secs(16);

    // What the query can do: rows taken in 3 s of unthrottled input, after
    // a second of warming up.
    let warm = run(&script(""), None, Duration::from_secs(1), false).offered;
    let measured = run(&script(""), None, Duration::from_secs(4), false).offered;
    let capacity = (measured.saturating_sub(warm) as f64 / 3.0).max(1000.0);
    let rate = 3.0 * capacity;
    eprintln!("shed: capacity {capacity:.0} rows/s, offering {rate:.0} rows/s for {length:?}");

    let exact = run(&script(""), Some(rate), length, false);
    let late = worst_latency(&exact, length - Duration::from_secs(4), length);
    eprintln!(
        "shed: without shedding: {} rows written, worst latency in the last 4 s {late} ms (bound {bound_ms} ms)",
        exact.offered
    );
    eprintln!("shed: worst latency per second (ms): {}", timeline(&exact));

    let with = format!(", shed = 'random', max_latency = '{MAX_LATENCY_MS} milliseconds'");
    let shed = run(&script(&with), Some(rate), length, true);
    // The first seconds are the controller finding its rate.
    let held = worst_latency(&shed, Duration::from_secs(5), length);
    let kept: u64 = shed.arrivals.iter().map(|a| a.rows).sum::<u64>() / WINDOWS_PER_ROW;
    let dropped = summary_shed(&shed.stderr, "vigil: query 1:");
    let by_stream = summary_shed(&shed.stderr, "vigil: stream m:");
    // Per result, n * f / (1 - f) rows were dropped from its window; each
    // pane is in WINDOWS_PER_ROW windows.
    let from_fractions: f64 = shed
        .arrivals
        .iter()
        .map(|a| {
            let f = a.shed_fraction.expect("_shed_fraction column");
            a.rows as f64 * f / (1.0 - f)
        })
        .sum::<f64>()
        / WINDOWS_PER_ROW as f64;
    eprintln!(
        "shed: with shedding: {} rows offered, {kept} kept, {dropped} shed (stream m: {by_stream}; by _shed_fraction {from_fractions:.0}), worst latency after 5 s {held} ms (bound {bound_ms} ms)",
        shed.offered
    );
    eprintln!("shed: worst latency per second (ms): {}", timeline(&shed));

    assert!(late > 2 * bound_ms, "without shedding, latency {late} ms");
    assert!(held <= bound_ms, "with shedding, latency {held} ms");
    assert!(dropped > 0, "{}", shed.stderr);
    assert_eq!(dropped, shed.offered - kept, "{}", shed.stderr);
    assert_eq!(by_stream, dropped, "{}", shed.stderr);
    // Rows of a (pane, host) whose every row was dropped have no result
    // to report them: a few at most.
    assert!(
        (from_fractions - dropped as f64).abs() <= 1e-3 * dropped as f64 + 1.0,
        "_shed_fraction says {from_fractions}, the summary {dropped}"
    );
}
