//! What checkpoints cost, through the library API.
//!
//! 1. Overhead: a 10 s `TUMBLE` with `avg`, `max` and `count` per host over
//!    [`ROWS`] rows and [`HOSTS`] hosts (the data of `benches/windows.rs`,
//!    larger), run to the end of its input [`RUNS`] times without
//!    checkpoints and [`RUNS`] times with a checkpoint every second,
//!    alternating, after one warm-up run. Prints every run, the medians and
//!    the ratio of the throughputs.
//! 2. Size and duration: [`KEYS`] hosts pushed into one open 10 s window
//!    (the watermark stays inside it), then [`SAVEPOINTS`] savepoints of that
//!    state, one after the other. Prints the bytes and the write time of
//!    each (`CheckpointStats`), the time from asking to completion, and the
//!    medians.
//!
//! Run with `cargo bench --bench checkpoints`; see `benches/README.md`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, Float64Array, StringArray, TimestampMillisecondArray};
use datafusion::arrow::record_batch::RecordBatch;
use vigil::engine::{Engine, Outcome};
use vigil::planner::QueryGraph;
use vigil::runtime::checkpoint::CheckpointConfig;
use vigil::runtime::live::{Live, NamedQuery};
use vigil::runtime::{RunnableQuery, run_on};
use vigil::state::store::QueryStore;

mod common;
use common::{BASE_MS, CountSink, Rng, write_csv};

/// Input rows per run of the overhead benchmark.
const ROWS: u64 = 10_000_000;
/// Distinct hosts in it.
const HOSTS: u64 = 1_000;
/// Timed runs per mode.
const RUNS: usize = 5;
/// Time between two checkpoints in the runs that take them.
const INTERVAL: Duration = Duration::from_secs(1);
/// Keys in the open window of the size benchmark.
const KEYS: usize = 100_000;
/// Savepoints taken of that state.
const SAVEPOINTS: usize = 7;
/// Rows per pushed batch.
const PUSH_BATCH: usize = 8_192;

/// The stable name under which the query's checkpoints are kept.
const NAME: &str = "q1";

const TUMBLE: &str = "SELECT window_start, window_end, host,
        avg(cpu) AS avg_cpu, max(cpu) AS max_cpu, count(*) AS n
  FROM TUMBLE(m, ts, INTERVAL '10' SECOND)
  GROUP BY window_start, window_end, host;";

const FILE_STREAM: &str = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND)
  WITH (connector = 'file', path = 'metrics.csv', format = 'csv');";

const PUSH_STREAM: &str = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND)
  WITH (connector = 'push');";

/// Plans `stream` and the tumbling query; relative paths resolve in `dir`.
fn plan(dir: &Path, stream: &str) -> QueryGraph {
    let script = format!("{stream}\n{TUMBLE}");
    let mut engine = Engine::new();
    let mut graphs = Vec::new();
    for statement in vigil::sql::parse_script(&script).expect("the script parses") {
        if let Outcome::Query(q) = engine.execute(&statement, dir).expect("the script plans") {
            graphs.push(q.graph);
        }
    }
    graphs.pop().expect("the script has a query")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// One run of the overhead benchmark.
struct Run {
    seconds: f64,
    results: u64,
    late: u64,
    checkpoints: u64,
    failed: u64,
    last_bytes: u64,
    last_write_us: u64,
}

/// Runs the query over `dir/metrics.csv` to the end, with a checkpoint
/// every [`INTERVAL`] into a fresh folder when `checkpoints` is set. The
/// timer covers starting the tasks to the last result; planning is outside
/// it. Each run gets its own tokio runtime, so nothing of one run (the
/// checkpoint timer) is left running in the next.
fn run_once(dir: &Path, checkpoints: bool) -> Run {
    let count = Arc::new(AtomicU64::new(0));
    let graph = plan(dir, FILE_STREAM);
    let stats = graph.stats.clone();
    let store = tempfile::tempdir().expect("a temporary directory");
    let live = if checkpoints {
        let mut config = CheckpointConfig::new(store.path());
        config.interval = INTERVAL;
        Live::with_checkpoints(config)
    } else {
        Live::new()
    };
    let query = NamedQuery {
        query: RunnableQuery {
            graph,
            sink: Box::new(CountSink(count.clone())),
        },
        label: NAME.to_string(),
        name: Some(NAME.to_string()),
    };
    let rt = runtime();
    let started = Instant::now();
    rt.block_on(run_on(&live, vec![query], |_| {}))
        .expect("the query runs");
    let seconds = started.elapsed().as_secs_f64();
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let (done, failed, last_bytes, last_write_us) = match live.coordinator() {
        Some(c) => {
            let s = c.stats();
            (
                get(&s.completed),
                get(&s.failed),
                get(&s.last_bytes),
                get(&s.last_duration_us),
            )
        }
        None => (0, 0, 0, 0),
    };
    Run {
        seconds,
        results: get(&count),
        late: get(&stats.late_rows),
        checkpoints: done,
        failed,
        last_bytes,
        last_write_us,
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn overhead() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let started = Instant::now();
    write_csv(&dir.path().join("metrics.csv"), ROWS, HOSTS);
    eprintln!(
        "wrote {ROWS} rows over {HOSTS} hosts in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let warm = run_once(dir.path(), false);
    eprintln!(
        "warm-up: {:.3} s, {} results, {} late",
        warm.seconds, warm.results, warm.late
    );
    assert!(warm.results > 0, "the query produced no results");
    assert_eq!(warm.late, 0, "the query dropped rows as late");
    let mut off = Vec::new();
    let mut on = Vec::new();
    println!("run  checkpoints      s   Mrows/s   results  taken  last bytes  last write us");
    for round in 0..RUNS {
        // Alternate which mode goes first, so a slow spell of the shared
        // machine does not always fall on the same one.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for checkpoints in order {
            let run = run_once(dir.path(), checkpoints);
            assert_eq!(run.results, warm.results, "the results changed");
            assert_eq!(run.failed, 0, "a checkpoint could not be written");
            if checkpoints {
                assert!(run.checkpoints > 0, "no checkpoint was taken");
            }
            println!(
                "{:>3}  {:<11} {:>6.3} {:>9.2} {:>9} {:>6} {:>11} {:>14}",
                round + 1,
                if checkpoints { "every 1 s" } else { "off" },
                run.seconds,
                ROWS as f64 / run.seconds / 1e6,
                run.results,
                run.checkpoints,
                run.last_bytes,
                run.last_write_us
            );
            if checkpoints { &mut on } else { &mut off }.push(run.seconds);
        }
    }
    let off = median(&mut off);
    let on = median(&mut on);
    println!(
        "median: off {off:.3} s ({:.2} M rows/s), checkpoints every 1 s {on:.3} s ({:.2} M rows/s); throughput ratio {:.3}",
        ROWS as f64 / off / 1e6,
        ROWS as f64 / on / 1e6,
        off / on
    );
}

/// [`KEYS`] rows, one per host, all in the window starting at [`BASE_MS`]
/// (rounded down to 10 s) and at most 5 s into it, in batches.
fn key_batches(graph: &QueryGraph) -> Vec<RecordBatch> {
    let schema = graph.inputs[0].stream.schema.clone();
    let start = BASE_MS - BASE_MS % 10_000;
    let mut rng = Rng(7);
    let mut batches = Vec::new();
    for first in (0..KEYS).step_by(PUSH_BATCH) {
        let keys = first..(first + PUSH_BATCH).min(KEYS);
        let ts: TimestampMillisecondArray = keys
            .clone()
            .map(|k| start + (k as i64 * 5_000) / KEYS as i64)
            .collect::<Vec<_>>()
            .into();
        let host: StringArray = keys.clone().map(|k| Some(format!("host-{k:06}"))).collect();
        let cpu: Float64Array = keys
            .map(|_| (rng.next_u64() % 10_000) as f64 / 100.0)
            .collect::<Vec<_>>()
            .into();
        let columns: Vec<ArrayRef> = vec![Arc::new(ts), Arc::new(host), Arc::new(cpu)];
        batches.push(RecordBatch::try_new(schema.clone(), columns).expect("the batch matches"));
    }
    batches
}

/// Rows of the largest state table in the newest savepoint under `root`.
fn state_rows(root: &Path) -> usize {
    let store = QueryStore::open(&root.into(), NAME, usize::MAX).expect("the savepoint folder");
    let checkpoint = store
        .latest()
        .expect("the savepoint reads")
        .checkpoint
        .expect("a savepoint is there");
    checkpoint
        .operators
        .iter()
        .flat_map(|o| o.state.tables.iter())
        .map(|t| t.batch.num_rows())
        .max()
        .unwrap_or(0)
}

fn size() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let graph = plan(dir.path(), PUSH_STREAM);
    let batches = key_batches(&graph);
    let count = Arc::new(AtomicU64::new(0));
    // Checkpoints by the timer would write the same state in between;
    // only savepoints are wanted here.
    let mut config = CheckpointConfig::new(dir.path().join("checkpoints"));
    config.interval = Duration::from_secs(3600);
    let live = Live::with_checkpoints(config);
    let rt = runtime();
    let mut bytes = Vec::new();
    let mut writes = Vec::new();
    let mut totals = Vec::new();
    println!("savepoint  state rows      bytes   write ms   asked to done ms");
    rt.block_on(async {
        let id = live
            .start_named(
                graph,
                Box::new(CountSink(count.clone())),
                NAME,
                Some(NAME.into()),
            )
            .expect("the query starts");
        for batch in batches {
            live.push("m", batch).await.expect("the rows are pushed");
        }
        let coordinator = live.coordinator().expect("checkpoints are on").clone();
        let stats = coordinator.stats().clone();
        for k in 0..SAVEPOINTS {
            let root = dir.path().join(format!("savepoint-{k}"));
            let asked = Instant::now();
            let sp = live.savepoint(&root, false).await.expect("a savepoint id");
            let done = coordinator.wait_for(sp, 1, Duration::from_secs(120)).await;
            let total = asked.elapsed();
            assert_eq!(done, 1, "savepoint {sp} did not complete");
            let rows = state_rows(&root);
            assert!(rows >= KEYS, "the savepoint holds {rows} rows, not {KEYS}");
            let b = stats.last_bytes.load(Ordering::Relaxed);
            let us = stats.last_duration_us.load(Ordering::Relaxed);
            println!(
                "{:>9} {:>11} {:>10} {:>10.2} {:>18.2}",
                k + 1,
                rows,
                b,
                us as f64 / 1e3,
                total.as_secs_f64() * 1e3
            );
            bytes.push(b as f64);
            writes.push(us as f64 / 1e3);
            totals.push(total.as_secs_f64() * 1e3);
        }
        assert_eq!(count.load(Ordering::Relaxed), 0, "the window fired early");
        live.end_stream("m").await;
        live.wait(id).await.expect("the query ends");
    });
    assert_eq!(
        count.load(Ordering::Relaxed),
        KEYS as u64,
        "one result per key"
    );
    println!(
        "median of {SAVEPOINTS}: {:.0} bytes ({:.1} bytes per key), write {:.2} ms, asked to done {:.2} ms",
        median(&mut bytes),
        median(&mut bytes) / KEYS as f64,
        median(&mut writes),
        median(&mut totals)
    );
}

fn main() {
    overhead();
    size();
}
