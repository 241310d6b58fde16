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

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use datafusion::arrow::record_batch::RecordBatch;
use vigil::connectors::Sink;
use vigil::engine::{Engine, Outcome};
use vigil::runtime::{RunnableQuery, run};

/// Input rows per run.
const ROWS: u64 = 200_000;
/// Distinct hosts.
const HOSTS: u64 = 100;
/// Event time of the first row, epoch ms (2023-11-14).
const BASE_MS: i64 = 1_700_000_000_000;

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
        "session_5s",
        "SELECT host, window_start, window_end,
                avg(cpu) AS avg_cpu, max(cpu) AS max_cpu, count(*) AS n
         FROM SESSION(m, ts, INTERVAL '5' SECOND)
         GROUP BY host, window_start, window_end;",
    ),
];

/// SplitMix64: a small deterministic generator, so every run reads the same
/// data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Whether `host` is silent during second `sec` of the data: 7 s out of
/// every 30 s, staggered across hosts. Longer than the 5 s session gap.
fn quiet(host: u64, sec: u64) -> bool {
    (sec + host * 3) % 30 < 7
}

/// Writes the input CSV: row `i` at `BASE_MS + i` ms, +-20 ms of jitter
/// (well inside the 2 s watermark delay), on a random host that is not
/// quiet at that time.
fn write_csv(path: &Path) {
    let mut rng = Rng(42);
    let mut text = String::with_capacity(ROWS as usize * 32);
    text.push_str("ts,host,cpu\n");
    for i in 0..ROWS {
        let jitter = (rng.next() % 41) as i64 - 20;
        let ts = BASE_MS + i as i64 + jitter;
        let sec = i / 1000;
        let mut host = rng.next() % HOSTS;
        while quiet(host, sec) {
            host = (host + 1) % HOSTS;
        }
        let cpu = (rng.next() % 10_000) as f64 / 100.0;
        writeln!(text, "{ts},host-{host:03},{cpu:.2}").expect("writing to a String");
    }
    std::fs::write(path, text).expect("writing the benchmark CSV");
}

/// Counts result rows.
struct CountSink(Arc<AtomicU64>);

impl Sink for CountSink {
    fn write(&mut self, batch: &RecordBatch) -> vigil::error::Result<()> {
        self.0.fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn finish(&mut self) -> vigil::error::Result<()> {
        Ok(())
    }
}

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
    write_csv(&dir.path().join("metrics.csv"));
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
