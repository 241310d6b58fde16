//! Overload end to end: producers much faster than a query, for a bounded
//! time, against the real `vigil` binary. Back-pressure must hold memory
//! under a stated bound (peak resident memory, from the kernel's `VmHWM`)
//! and lose no row: a generator writing into stdin, HTTP clients pushing
//! concurrently (they get 429 with `Retry-After` and try again), and a
//! webhook receiver that answers slowly. The figures are printed, so CI
//! logs show them.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::service::{Server, TOKEN, agent, bearer, status_code};
use super::support::{self, Guarded, PeakRss, join_within};
use super::webhook::serve_locally;

/// Peak resident memory the process may reach under overload.
const RSS_BOUND: u64 = 300 << 20;

/// How long the producers offer more than the query takes: long enough
/// that a source read without back-pressure would pass the memory bound
/// several times over (the generator makes millions of rows a second).
const FEED_FOR: Duration = Duration::from_secs(12);

/// How long vigil may take, past the feeding, to take the last rows and
/// end; and its results to be complete.
const PATIENCE: Duration = Duration::from_secs(120);

/// Windows each row belongs to: HOP of 1 s every 100 ms.
const WINDOWS_PER_ROW: u64 = 10;

/// A query that costs per row: every row goes into ten windows, each with
/// an exact median, per host.
const HOP_QUERY: &str = "SELECT window_end, host, count(*) AS n, median(v) AS med \
     FROM HOP(m, ts, INTERVAL '100' MILLISECOND, INTERVAL '1' SECOND) \
     GROUP BY window_start, window_end, host";

/// Appends rows `from..to` as CSV lines `ts,host,v`, `per_ms` rows to a
/// millisecond of event time.
fn csv_rows(from: u64, to: u64, per_ms: u64, out: &mut Vec<u8>) {
    for i in from..to {
        writeln!(out, "{},h{},{}", i / per_ms, i % 50, i % 1000).expect("write to a vec");
    }
}

/// Rows per second the generator itself makes, measured for `for_how_long`.
fn generator_rate(for_how_long: Duration) -> f64 {
    let start = Instant::now();
    let mut rows = 0;
    let mut buffer = Vec::with_capacity(1 << 20);
    while start.elapsed() < for_how_long {
        buffer.clear();
        csv_rows(rows, rows + 10_000, 1, &mut buffer);
        std::io::sink().write_all(&buffer).expect("sink");
        rows += 10_000;
    }
    rows as f64 / start.elapsed().as_secs_f64()
}

/// Sums column `column` of CSV lines read from `from` (after its header).
fn sum_column(from: impl std::io::Read + Send + 'static, column: &str) -> JoinHandle<u64> {
    let column = column.to_string();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(from).lines();
        let header = lines.next().and_then(Result::ok).unwrap_or_default();
        let Some(index) = header.split(',').position(|c| c == column) else {
            return 0;
        };
        lines
            .map_while(Result::ok)
            .filter_map(|line| line.split(',').nth(index)?.parse::<u64>().ok())
            .sum()
    })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn start_run(dir: &Path, sql: &str) -> Guarded {
    std::fs::write(dir.join("q.sql"), sql).expect("write the script");
    let mut command = Command::new(env!("CARGO_BIN_EXE_vigil"));
    command
        .args(["run", "q.sql", "--format", "csv"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"] {
        command.env_remove(var);
    }
    support::spawn(&mut command, "vigil run")
}

/// Writes rows into `stdin` as fast as it takes them, for `FEED_FOR`, then
/// closes it; returns how many rows were written, and the seconds the
/// writing took.
fn feed(mut stdin: std::process::ChildStdin) -> (u64, f64) {
    let start = Instant::now();
    stdin.write_all(b"ts,host,v\n").expect("write the header");
    let (mut rows, mut buffer) = (0, Vec::with_capacity(1 << 20));
    while start.elapsed() < FEED_FOR {
        buffer.clear();
        csv_rows(rows, rows + 2_000, 1, &mut buffer);
        stdin.write_all(&buffer).expect("vigil reads its stdin");
        rows += 2_000;
    }
    (rows, start.elapsed().as_secs_f64())
}

/// What a run fed by [`feed`] did.
struct Fed {
    /// Rows written into its stdin.
    written: u64,
    /// Seconds the writing took.
    fed_for: f64,
    /// Its peak resident memory, in bytes.
    peak: u64,
    /// The sum of column `n` of its CSV results on stdout (0 without one).
    counted: u64,
    stderr: String,
}

/// Runs `sql` fed by [`feed`] until it ends; asserts that it succeeded.
fn run_fed(sql: &str) -> Fed {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = start_run(dir.path(), sql);
    let peak = PeakRss::watch(child.id());
    let counted = sum_column(child.stdout.take().expect("stdout"), "n");
    let stderr = child.stderr.take().expect("stderr");
    let stderr = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    // Fed on a thread: a write vigil does not take cannot hold the test
    // past the deadline below (the kill breaks the pipe).
    let stdin = child.stdin.take().expect("stdin");
    let feeder = std::thread::spawn(move || feed(stdin));
    let status = child.wait_within(FEED_FOR + PATIENCE);
    let peak = peak.finish();
    let (written, fed_for) = join_within(feeder, PATIENCE, "the feeder");
    let stderr = join_within(stderr, PATIENCE, "vigil's stderr");
    assert!(status.success(), "vigil failed: {stderr}");
    Fed {
        written,
        fed_for,
        peak,
        counted: join_within(counted, PATIENCE, "vigil's results"),
        stderr,
    }
}

const STDIN_STREAM: &str = "CREATE STREAM m (ts TIMESTAMP, host TEXT, v DOUBLE, \
     WATERMARK FOR ts AS ts) WITH (connector = 'stdin', format = 'csv');";

#[test]
fn a_generator_ten_times_faster_than_the_query_is_held_back_without_losing_rows() {
    let generator = generator_rate(Duration::from_secs(1));
    let Fed {
        written,
        fed_for,
        peak,
        counted,
        ..
    } = run_fed(&format!("{STDIN_STREAM}\n{HOP_QUERY};"));
    let taken = written as f64 / fed_for;
    eprintln!(
        "overload/stdin: generator {generator:.0} rows/s, vigil took {taken:.0} rows/s \
         ({:.1}x offered), {written} rows in {fed_for:.1} s, peak RSS {:.1} MiB (bound {:.0} MiB)",
        generator / taken,
        mib(peak),
        mib(RSS_BOUND)
    );
    assert!(
        generator >= 10.0 * taken,
        "the generator ({generator:.0} rows/s) is not 10x faster than the query ({taken:.0} rows/s)"
    );
    assert!(peak > 0 && peak < RSS_BOUND, "peak RSS {peak} bytes");
    assert_eq!(
        counted,
        written * WINDOWS_PER_ROW,
        "every row in its ten windows"
    );
}

/// Pushes CSV rows to `/streams/m/rows` from `clients` threads until the
/// deadline. A refused batch is dropped by its client, which waits
/// `Retry-After` and goes on with new rows, so that event time keeps up
/// with the wall clock as a live feed's does. Returns the rows taken and
/// the 429 answers seen.
fn push_concurrently(server: &Server, clients: usize, deadline: Instant) -> (u64, u64) {
    let next = Arc::new(AtomicU64::new(0));
    let (taken, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    std::thread::scope(|scope| {
        for _ in 0..clients {
            let (next, taken, refused) = (next.clone(), taken.clone(), refused.clone());
            scope.spawn(move || {
                let agent = agent(Some(Duration::from_secs(60)));
                while Instant::now() < deadline {
                    let from = next.fetch_add(2_000, Ordering::Relaxed);
                    let mut body = b"ts,host,v\n".to_vec();
                    csv_rows(from, from + 2_000, 1, &mut body);
                    match push_once(server, &agent, &body) {
                        Some(rows) => taken.fetch_add(rows, Ordering::Relaxed),
                        None => refused.fetch_add(1, Ordering::Relaxed),
                    };
                }
            });
        }
    });
    (
        taken.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    )
}

/// Posts `body`: the rows taken, or `None` after a 429 and the wait its
/// `Retry-After` asks for.
fn push_once(server: &Server, agent: &ureq::Agent, body: &[u8]) -> Option<u64> {
    let mut response = agent
        .post(server.url("/streams/m/rows"))
        .header("authorization", bearer(TOKEN))
        .header("content-type", "text/csv")
        .send(body)
        .expect("the server answers");
    let status = status_code(&response);
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let answer: serde_json::Value =
        serde_json::from_str(&response.body_mut().read_to_string().expect("a body"))
            .expect("a JSON answer");
    match status {
        200 => Some(answer["rows"].as_u64().expect("rows taken")),
        429 => {
            assert_eq!(answer["rows"], 0, "one batch per request: all or nothing");
            let seconds = retry_after.expect("429 carries Retry-After");
            assert!(seconds >= 1, "Retry-After {seconds}");
            std::thread::sleep(Duration::from_secs(seconds));
            None
        }
        other => panic!("push answered {other}: {answer}"),
    }
}

/// Sums column `n` of the CSV file at `path` (0 while it does not exist).
fn sum_file(path: &Path) -> u64 {
    let Ok(text) = std::fs::read_to_string(path) else {
        return 0;
    };
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let Some(index) = header.split(',').position(|c| c == "n") else {
        return 0;
    };
    lines
        .filter_map(|l| l.split(',').nth(index)?.parse::<u64>().ok())
        .sum()
}

#[test]
fn concurrent_http_pushes_get_429_when_the_query_is_behind_and_lose_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("setup.sql"),
        format!(
            "CREATE STREAM m (ts TIMESTAMP, host TEXT, v DOUBLE, \
               WATERMARK FOR ts AS ts - INTERVAL '60' SECOND) WITH (connector = 'push');
             CREATE SINK out WITH (path = 'out.csv', format = 'csv');
             INSERT INTO out {HOP_QUERY};"
        ),
    )
    .expect("write the script");
    let server = Server::start(
        dir.path(),
        &[
            "--addr",
            "127.0.0.1:0",
            "--token",
            TOKEN,
            // Short, so that a query that is behind only now and then
            // still refuses: on an idle machine it nearly keeps up.
            "--ingest-timeout",
            "20ms",
            "setup.sql",
        ],
    );
    let peak = PeakRss::watch(server.pid());
    let started = Instant::now();
    let (taken, refused) = push_concurrently(&server, 4, started + FEED_FOR);
    let fed_for = started.elapsed().as_secs_f64();
    // A row far ahead closes every window of the rows taken; its own stay
    // open, so it counts in no result.
    let last = agent(Some(Duration::from_secs(60)))
        .post(server.url("/streams/m/rows"))
        .header("authorization", bearer(TOKEN))
        .header("content-type", "text/csv")
        .send("ts,host,v\n999999999999,end,0\n")
        .expect("the server answers");
    assert_eq!(status_code(&last), 200);
    // The results are complete when their counts add up (checked below,
    // with vigil's stderr, if they do not in time).
    let out = dir.path().join("out.csv");
    let waiting = Instant::now();
    while sum_file(&out) < taken * WINDOWS_PER_ROW && waiting.elapsed() < PATIENCE {
        std::thread::sleep(Duration::from_millis(200));
    }
    let peak = peak.finish();
    let counted = sum_file(&out);
    eprintln!(
        "overload/http: 4 clients, {taken} rows taken in {fed_for:.1} s ({:.0} rows/s), \
         {refused} answers 429, results complete {:.1} s later, peak RSS {:.1} MiB (bound {:.0} MiB)",
        taken as f64 / fed_for,
        waiting.elapsed().as_secs_f64(),
        mib(peak),
        mib(RSS_BOUND)
    );
    assert!(
        refused > 0,
        "the clients offered more than the query takes, yet got no 429"
    );
    assert!(peak > 0 && peak < RSS_BOUND, "peak RSS {peak} bytes");
    assert_eq!(counted, taken * WINDOWS_PER_ROW, "{}", server.stderr());
}

/// A webhook receiver that takes `delay` to answer each POST and counts
/// the rows it was sent.
struct SlowHook {
    addr: std::net::SocketAddr,
    rows: Arc<AtomicU64>,
    _runtime: tokio::runtime::Runtime,
}

impl SlowHook {
    fn start(delay: Duration) -> Self {
        let rows = Arc::new(AtomicU64::new(0));
        let counted = rows.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |body: axum::body::Bytes| {
                let counted = counted.clone();
                async move {
                    tokio::time::sleep(delay).await;
                    let batch: Vec<serde_json::Value> =
                        serde_json::from_slice(&body).expect("a JSON array");
                    counted.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    axum::http::StatusCode::OK
                }
            }),
        );
        let (addr, runtime) = serve_locally(app);
        Self {
            addr,
            rows,
            _runtime: runtime,
        }
    }
}

#[test]
fn a_slow_webhook_slows_its_query_not_the_memory() {
    let generator = generator_rate(Duration::from_secs(1));
    let hook = SlowHook::start(Duration::from_millis(100));
    let sql = format!(
        "{STDIN_STREAM}\nCREATE SINK hook WITH (connector = 'webhook', url = 'http://{}/hook');\n\
         INSERT INTO hook SELECT ts, host, v FROM m;",
        hook.addr
    );
    let Fed {
        written,
        fed_for,
        peak,
        stderr,
        ..
    } = run_fed(&sql);
    let delivered = hook.rows.load(Ordering::Relaxed);
    eprintln!(
        "overload/webhook: {written} rows written in {fed_for:.1} s ({:.0} rows/s) to a receiver \
         taking 100 ms per POST, {delivered} delivered, peak RSS {:.1} MiB (bound {:.0} MiB)",
        written as f64 / fed_for,
        mib(peak),
        mib(RSS_BOUND)
    );
    assert!(peak > 0 && peak < RSS_BOUND, "peak RSS {peak} bytes");
    let taken = written as f64 / fed_for;
    assert!(
        taken * 10.0 < generator,
        "the source was not held back: {taken:.0} rows/s of {generator:.0}"
    );
    assert_eq!(delivered, written, "{stderr}");
}
