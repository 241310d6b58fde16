//! Event-to-result latency, per-record mode against micro-batch mode.
//!
//! A plain program (`harness = false`, no criterion): run it with
//! `cargo bench --bench latency`. For each stream `batch_size` (the default,
//! then 1), each execution mode and each of two queries it
//!
//! 1. makes a FIFO (`mkfifo`) in a temporary directory and declares a file
//!    stream on it;
//! 2. runs the query through the library (`vigil::runtime::run`) on a
//!    background thread, with a sink that records when each result row
//!    arrives;
//! 3. writes [`ROWS`] CSV rows into the FIFO from another thread, one
//!    `write` per row at a steady [`RATE`] rows per second, recording the
//!    time just before each row's write, by row id;
//! 4. closes the FIFO, so the input ends and the run finishes.
//!
//! Latency of a result is its arrival at the sink minus the write time of
//! the row that caused it:
//!
//! - `alert` (`SELECT id, cpu FROM m WHERE cpu > 90`): the row itself, found
//!   by its `id`.
//! - `tumble` (`TUMBLE(m, ts, INTERVAL '1' SECOND)`, `count(*)` per host,
//!   watermark delay 0): the first row whose event time reaches the
//!   window's end, since its arrival is what closes the window. All of a
//!   window's rows (one per host) count as one result, arriving with the
//!   last of them. Windows closed only by the end of input are left out.
//!
//! With the default `batch_size`, a `file` source on a FIFO emits only when a
//! batch is full or the input ends, so those runs measure that wait; with
//! `batch_size = 1` the source emits each row as it reads it, and the runs
//! measure the engine.
//!
//! Event time advances [`TS_STEP_MS`] per row (faster than the wall clock)
//! so that a run closes enough windows to give a p99. The program ends on
//! its own: bounded rows per run, and a watchdog that aborts after
//! [`WATCHDOG`].

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::{Int64Type, TimestampMillisecondType};
use datafusion::arrow::record_batch::RecordBatch;
use vigil::connectors::Sink;
use vigil::engine::{Engine, Outcome};
use vigil::runtime::{RunnableQuery, run};

/// Rows written per run.
const ROWS: usize = 10_000;
/// Rows written per second.
const RATE: u64 = 2_000;
/// Event time advance per row: 20 rows (10 ms of wall time) per 1 s window,
/// so a run closes about 500 windows.
const TS_STEP_MS: i64 = 50;
/// Distinct hosts (one result row per host per window).
const HOSTS: usize = 10;
/// Event time of row 0, epoch ms.
const BASE_MS: i64 = 1_700_000_000_000;
/// The whole program is aborted if it runs longer than this.
const WATCHDOG: Duration = Duration::from_secs(300);

const MODES: &[&str] = &["per_record", "micro_batch"];

/// The stream's `batch_size` option: the default (the source emits when a
/// batch is full or the input ends, unless it reads live input), and 1 (the
/// source emits every row as it is read).
const BATCH_SIZES: &[Option<u32>] = &[None, Some(1)];

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Alert,
    Tumble,
}

const QUERIES: &[(&str, Kind, &str)] = &[
    (
        "alert: WHERE cpu > 90",
        Kind::Alert,
        "SELECT id, cpu FROM m WHERE cpu > 90;",
    ),
    (
        "tumble 1 s count per host",
        Kind::Tumble,
        "SELECT window_start, window_end, host, count(*) AS n
         FROM TUMBLE(m, ts, INTERVAL '1' SECOND)
         GROUP BY window_start, window_end, host;",
    ),
];

/// Event time of row `id`.
fn ts_of(id: usize) -> i64 {
    BASE_MS + id as i64 * TS_STEP_MS
}

/// A deterministic cpu value in [0, 100): about 10% of rows are above 90.
fn cpu_of(id: usize) -> f64 {
    let mut z = (id as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % 10_000) as f64 / 100.0
}

/// Nanoseconds since `epoch`.
fn nanos_since(epoch: Instant) -> u64 {
    epoch.elapsed().as_nanos() as u64
}

/// Records, per result row, its arrival time and its key: the row id
/// (alert) or the window end (tumble).
struct TimingSink {
    epoch: Instant,
    kind: Kind,
    arrivals: Arc<Mutex<Vec<(i64, u64)>>>,
}

impl Sink for TimingSink {
    fn write(&mut self, batch: &RecordBatch) -> vigil::error::Result<()> {
        let now = nanos_since(self.epoch);
        let mut arrivals = self.arrivals.lock().expect("not poisoned");
        match self.kind {
            Kind::Alert => {
                let ids = batch
                    .column_by_name("id")
                    .expect("an id column")
                    .as_primitive::<Int64Type>();
                arrivals.extend(ids.values().iter().map(|&id| (id, now)));
            }
            Kind::Tumble => {
                let ends = batch
                    .column_by_name("window_end")
                    .expect("a window_end column")
                    .as_primitive::<TimestampMillisecondType>();
                arrivals.extend(ends.values().iter().map(|&end| (end, now)));
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> vigil::error::Result<()> {
        Ok(())
    }
}

/// The script: mode, stream on the FIFO, query.
fn script(mode: &str, batch_size: Option<u32>, query: &str) -> String {
    let batch_size = batch_size
        .map(|n| format!(", batch_size = {n}"))
        .unwrap_or_default();
    format!(
        "SET execution_mode = '{mode}';
         CREATE STREAM m (id BIGINT, ts TIMESTAMP, host TEXT, cpu DOUBLE,
           WATERMARK FOR ts AS ts)
           WITH (connector = 'file', path = 'input.fifo', format = 'csv'{batch_size});
         {query}"
    )
}

/// Latencies of one run, in microseconds, and how many results were left
/// out (windows closed by the end of input).
struct Measured {
    latencies_us: Vec<f64>,
    excluded: usize,
}

fn measure(dir: &Path, mode: &str, batch_size: Option<u32>, kind: Kind, query: &str) -> Measured {
    let fifo = dir.join("input.fifo");
    let _ = std::fs::remove_file(&fifo);
    let status = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("running mkfifo");
    assert!(status.success(), "mkfifo {} failed", fifo.display());

    let epoch = Instant::now();
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let mut engine = Engine::new();
    let mut queries = Vec::new();
    let statements =
        vigil::sql::parse_script(&script(mode, batch_size, query)).unwrap_or_else(|e| {
            eprintln!("error: the script does not parse (is `SET execution_mode` there yet?): {e}");
            std::process::exit(1)
        });
    for statement in statements {
        let outcome = engine.execute(&statement, dir).unwrap_or_else(|e| {
            eprintln!("error: {e}");
            std::process::exit(1)
        });
        if let Outcome::Query(q) = outcome {
            queries.push(RunnableQuery {
                graph: q.graph,
                sink: Box::new(TimingSink {
                    epoch,
                    kind,
                    arrivals: arrivals.clone(),
                }),
            });
        }
    }

    // The engine, on its own thread and runtime. Opening the FIFO for
    // reading waits for the writer below, and the writer for it.
    let engine_thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        if let Err(e) = rt.block_on(run(queries)) {
            eprintln!("error: the run failed: {e}");
            std::process::exit(1);
        }
    });

    let written: Arc<Vec<AtomicU64>> = Arc::new((0..ROWS).map(|_| AtomicU64::new(0)).collect());
    let writer_thread = {
        let written = written.clone();
        std::thread::spawn(move || {
            let mut pipe = OpenOptions::new()
                .write(true)
                .open(&fifo)
                .expect("opening the FIFO for writing");
            pipe.write_all(b"id,ts,host,cpu\n")
                .expect("writing the header");
            let period = Duration::from_nanos(1_000_000_000 / RATE);
            let start = Instant::now();
            let mut line = String::with_capacity(64);
            for id in 0..ROWS {
                let due = start + period * id as u32;
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                line.clear();
                writeln!(
                    line,
                    "{id},{},host-{:02},{:.2}",
                    ts_of(id),
                    id % HOSTS,
                    cpu_of(id)
                )
                .expect("writing to a String");
                written[id].store(nanos_since(epoch), Ordering::Relaxed);
                pipe.write_all(line.as_bytes()).expect("writing a row");
            }
            // Dropping the pipe closes it: the source sees the end of input.
        })
    };
    writer_thread.join().expect("the writer thread");
    engine_thread.join().expect("the engine thread");

    let arrivals = std::mem::take(&mut *arrivals.lock().expect("not poisoned"));
    let write_ns = |id: usize| written[id].load(Ordering::Relaxed);
    let mut latencies_us = Vec::new();
    let mut excluded = 0;
    match kind {
        Kind::Alert => {
            let expected = (0..ROWS).filter(|&id| cpu_of(id) > 90.0).count();
            assert_eq!(arrivals.len(), expected, "every alert row arrives once");
            for (id, arrived) in arrivals {
                let id = usize::try_from(id).expect("a row id");
                latencies_us.push(arrived.saturating_sub(write_ns(id)) as f64 / 1e3);
            }
        }
        Kind::Tumble => {
            // One latency per window: the last of its rows to arrive.
            let mut windows: Vec<(i64, u64)> = Vec::new();
            for (end, arrived) in arrivals {
                match windows.iter_mut().find(|(e, _)| *e == end) {
                    Some(w) => w.1 = w.1.max(arrived),
                    None => windows.push((end, arrived)),
                }
            }
            for (end, arrived) in windows {
                // The first row with ts >= end closes the window.
                let closing = (end - BASE_MS + TS_STEP_MS - 1) / TS_STEP_MS;
                match usize::try_from(closing) {
                    Ok(id) if id < ROWS => {
                        latencies_us.push(arrived.saturating_sub(write_ns(id)) as f64 / 1e3);
                    }
                    _ => excluded += 1,
                }
            }
        }
    }
    latencies_us.sort_by(f64::total_cmp);
    Measured {
        latencies_us,
        excluded,
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn main() {
    std::thread::spawn(|| {
        std::thread::sleep(WATCHDOG);
        eprintln!("error: the latency benchmark ran longer than {WATCHDOG:?}; aborting");
        std::process::exit(2);
    });
    let dir = tempfile::tempdir().expect("a temporary directory");
    println!(
        "event-to-result latency: {ROWS} rows per run written to a FIFO at {RATE} rows/s, \
         {HOSTS} hosts, event time +{TS_STEP_MS} ms per row, watermark delay 0"
    );
    let mut rows = Vec::new();
    for &batch_size in BATCH_SIZES {
        let batch = batch_size.map_or_else(|| "default".to_string(), |n| n.to_string());
        for &mode in MODES {
            for &(name, kind, query) in QUERIES {
                eprintln!("running batch_size {batch} / {mode} / {name} ...");
                let m = measure(dir.path(), mode, batch_size, kind, query);
                rows.push((batch.clone(), mode, name, m));
            }
        }
    }
    println!();
    println!(
        "{:<10} {:<12} {:<27} {:>8} {:>10} {:>10} {:>10}",
        "batch_size", "mode", "query", "results", "p50 us", "p99 us", "max us"
    );
    for (batch, mode, name, m) in &rows {
        let l = &m.latencies_us;
        println!(
            "{:<10} {:<12} {:<27} {:>8} {:>10.0} {:>10.0} {:>10.0}",
            batch,
            mode,
            name,
            l.len(),
            percentile(l, 50.0),
            percentile(l, 99.0),
            l.last().copied().unwrap_or(f64::NAN)
        );
    }
    let excluded: usize = rows.iter().map(|(_, _, _, m)| m.excluded).sum();
    println!(
        "\nresults: alert rows (each a latency), or tumble windows (one latency per window, \
         all hosts); {excluded} window(s) closed only by the end of input left out"
    );
}
