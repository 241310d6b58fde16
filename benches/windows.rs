//! End-to-end throughput of windowed aggregates, through the library API.
//!
//! Generates one CSV of [`ROWS`] rows into a temporary directory (epoch-ms
//! timestamps about 1 ms apart with a little jitter, 100 hosts, `cpu`
//! DOUBLE; each host goes quiet for 7 s out of every 30 s, so sessions
//! close), then measures, per query, the whole run: the file source parses
//! the CSV, the operators aggregate, a counting sink takes the results.
//! Planning is done outside the timed part. Criterion reports rows per
//! second of input.
//!
//! Run with `cargo bench --bench windows`; see `benches/README.md`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use vigil::engine::{Engine, Outcome};
use vigil::runtime::{RunnableQuery, run};

mod common;
use common::{CountSink, write_csv};

/// Input rows per run.
const ROWS: u64 = 200_000;
/// Distinct hosts.
const HOSTS: u64 = 100;

const STREAM: &str = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND)
  WITH (connector = 'file', path = 'metrics.csv', format = 'csv');";

const QUERIES: &[(&str, &str)] = &[
    (
        "tumble_10s",
        "SELECT window_start, window_end, host,
                avg(cpu) AS avg_cpu, max(cpu) AS max_cpu, count(*) AS n
         FROM TUMBLE(m, ts, INTERVAL '10' SECOND)
         GROUP BY window_start, window_end, host;",
    ),
    (
        "hop_10s_60s",
        "SELECT window_start, window_end, host,
                avg(cpu) AS avg_cpu, max(cpu) AS max_cpu, count(*) AS n
         FROM HOP(m, ts, INTERVAL '10' SECOND, INTERVAL '60' SECOND)
         GROUP BY window_start, window_end, host;",
    ),
    (
        "median_10s",
        "SELECT window_start, window_end, host, median(cpu) AS median_cpu
         FROM TUMBLE(m, ts, INTERVAL '10' SECOND)
         GROUP BY window_start, window_end, host;",
    ),
    (
        "session_5s",
        "SELECT host, window_start, window_end,
                avg(cpu) AS avg_cpu, max(cpu) AS max_cpu, count(*) AS n
         FROM SESSION(m, ts, INTERVAL '5' SECOND)
         GROUP BY host, window_start, window_end;",
    ),
];

/// Parses and plans `query` over the stream; relative paths resolve in
/// `dir`.
fn plan(dir: &Path, query: &str, count: &Arc<AtomicU64>) -> Vec<RunnableQuery> {
    let script = format!("{STREAM}\n{query}");
    let mut engine = Engine::new();
    let mut queries = Vec::new();
    for statement in vigil::sql::parse_script(&script).expect("the script parses") {
        if let Outcome::Query(q) = engine.execute(&statement, dir).expect("the script plans") {
            queries.push(RunnableQuery {
                graph: q.graph,
                sink: Box::new(CountSink(count.clone())),
            });
        }
    }
    queries
}

/// Runs planned queries to the end of the input; returns (result rows,
/// late rows).
fn execute(
    rt: &tokio::runtime::Runtime,
    queries: Vec<RunnableQuery>,
    count: &AtomicU64,
) -> (u64, u64) {
    count.store(0, Ordering::Relaxed);
    let report = rt.block_on(run(queries)).expect("the query runs");
    let late = report
        .queries
        .iter()
        .map(|q| q.late_rows.load(Ordering::Relaxed))
        .sum();
    (count.load(Ordering::Relaxed), late)
}

fn windows(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    write_csv(&dir.path().join("metrics.csv"), ROWS, HOSTS);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let count = Arc::new(AtomicU64::new(0));

    let mut group = c.benchmark_group("windows");
    group
        .throughput(Throughput::Elements(ROWS))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(10));
    for &(name, query) in QUERIES {
        // One checked run first: the query must produce results and drop
        // no row as late, or the figure would not mean what it says.
        let (out, late) = execute(&rt, plan(dir.path(), query, &count), &count);
        eprintln!("{name}: {ROWS} rows in, {out} results out, {late} late");
        assert!(out > 0, "{name} produced no results");
        assert_eq!(late, 0, "{name} dropped rows as late");
        group.bench_function(name, |b| {
            b.iter_batched(
                || plan(dir.path(), query, &count),
                |queries| execute(&rt, queries, &count),
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, windows);
criterion_main!(benches);
