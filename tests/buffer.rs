//! The disk buffer end to end (`buffer = 'disk'`): the real `vigil` binary
//! reads stdin while its query is held up by a stdout that the test does
//! not read, so the query falls behind its stream at a moment the test
//! chooses.

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Rows of input: more than the channels, the stdout pipe and the output
/// buffers hold together, so an unbuffered run cannot take them all while
/// its stdout is not read.
const ROWS: u64 = 400_000;

/// How long a test waits for something that should happen.
const PATIENCE: Duration = Duration::from_secs(120);

fn script(options: &str, extra: &str) -> String {
    format!(
        "{extra}CREATE STREAM s (id BIGINT, host TEXT, cpu DOUBLE)
           WITH (connector = 'stdin', format = 'csv'{options});
         SELECT id, host, cpu * 2 AS twice FROM s;\n"
    )
}

/// Rows `from..=to` as CSV (with the header when `from` is 1).
fn rows(from: u64, to: u64) -> Vec<u8> {
    let mut out = String::new();
    if from == 1 {
        out.push_str("id,host,cpu\n");
    }
    for i in from..=to {
        out.push_str(&format!("{i},h{},{}.5\n", i % 7, i % 100));
    }
    out.into_bytes()
}

/// Starts `vigil run q.sql ARGS` in `dir`, its stdin and stdout piped,
/// stderr into `stderr.txt`.
fn start(dir: &Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["run", "q.sql", "--format", "csv"])
        .args(args)
        .current_dir(dir)
        .env_remove("VIGIL_CRASH_AT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(fs::File::create(dir.join("stderr.txt")).unwrap())
        .spawn()
        .expect("vigil starts")
}

/// Writes `input` to `child`'s stdin on a thread, counting the bytes
/// written; closes stdin at the end unless `keep_open`. The thread gives
/// back the open stdin when kept.
struct Producer {
    written: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    thread: JoinHandle<Option<std::process::ChildStdin>>,
    started: Instant,
}

impl Producer {
    fn start(mut stdin: std::process::ChildStdin, input: Vec<u8>, keep_open: bool) -> Producer {
        let written = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let (w, d) = (written.clone(), done.clone());
        let thread = std::thread::spawn(move || {
            for chunk in input.chunks(16 << 10) {
                if stdin.write_all(chunk).is_err() {
                    return None;
                }
                w.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            d.store(true, Ordering::Release);
            keep_open.then_some(stdin)
        });
        Producer {
            written,
            done,
            thread,
            started: Instant::now(),
        }
    }

    /// Waits until the producer has written everything; how long it took.
    fn wait_done(&self) -> Duration {
        while !self.done.load(Ordering::Acquire) {
            assert!(
                self.started.elapsed() < PATIENCE,
                "the producer was held up: {} bytes written",
                self.written.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        self.started.elapsed()
    }

    /// Waits until the producer has made no progress for `quiet`, and
    /// checks that it has not finished: it is held back.
    fn wait_held_back(&self, quiet: Duration) -> u64 {
        let mut last = (self.written.load(Ordering::Relaxed), Instant::now());
        loop {
            std::thread::sleep(Duration::from_millis(20));
            assert!(
                !self.done.load(Ordering::Acquire),
                "the producer was never held back"
            );
            let now = self.written.load(Ordering::Relaxed);
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() >= quiet {
                return now;
            }
            assert!(self.started.elapsed() < PATIENCE, "no steady state");
        }
    }
}

/// Reads all of `stdout` on a thread.
fn read_all(mut stdout: ChildStdout) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).expect("stdout is text");
        text
    })
}

/// The output of an unbuffered run over the same rows, its stdout read as
/// it comes.
fn unbuffered_output(rows_to: u64) -> String {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("q.sql"), script("", "")).unwrap();
    let mut child = start(dir.path(), &["--progress", "never"]);
    let producer = Producer::start(child.stdin.take().unwrap(), rows(1, rows_to), false);
    let out = read_all(child.stdout.take().unwrap()).join().unwrap();
    producer.wait_done();
    assert!(child.wait().unwrap().success(), "{}", stderr(dir.path()));
    out
}

fn stderr(dir: &Path) -> String {
    fs::read_to_string(dir.join("stderr.txt")).unwrap_or_default()
}

/// Bytes of the files under `dir`, all folders down.
fn folder_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => folder_bytes(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

#[test]
fn a_query_that_falls_behind_does_not_hold_up_stdin() {
    let want = unbuffered_output(ROWS);
    assert_eq!(want.lines().count() as u64, ROWS + 1);

    // Without a buffer, a query stuck at its writes holds the producer up.
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("q.sql"), script("", "")).unwrap();
    let mut child = start(dir.path(), &["--progress", "never"]);
    let producer = Producer::start(child.stdin.take().unwrap(), rows(1, ROWS), false);
    let held_at = producer.wait_held_back(Duration::from_secs(1));
    drop(read_all(child.stdout.take().unwrap()));
    producer.wait_done();
    assert!(child.wait().unwrap().success(), "{}", stderr(dir.path()));

    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("q.sql"), script(", buffer = 'disk'", "")).unwrap();
    let mut child = start(dir.path(), &["--progress", "never"]);
    let producer = Producer::start(child.stdin.take().unwrap(), rows(1, ROWS), false);
    // Nobody reads the results yet: the query is stuck at its first
    // writes, and the producer still gets all of its rows in.
    let produced = producer.wait_done();
    let stdout = child.stdout.take().unwrap();
    let reading = Instant::now();
    let got = read_all(stdout).join().unwrap();
    let drained = reading.elapsed();
    assert!(child.wait().unwrap().success(), "{}", stderr(dir.path()));
    println!(
        "buffer: {ROWS} rows ({} bytes) written to stdin in {produced:.2?} with stdout unread \
         (unbuffered: held up after {held_at} bytes); the results then took {drained:.2?} to read",
        rows(1, ROWS).len()
    );
    assert!(got == want, "the buffered run's results differ");
}

#[test]
fn a_full_buffer_holds_the_producer_back_within_its_bound() {
    let want = unbuffered_output(ROWS);
    let dir = tempfile::tempdir().unwrap();
    let extra = "SET query_name = 'pass';\n";
    let options = ", buffer = 'disk', buffer_max = '1MiB'";
    fs::write(dir.path().join("q.sql"), script(options, extra)).unwrap();
    let args = ["--checkpoint-dir", "ck", "--progress", "always"];
    let mut child = start(dir.path(), &args);
    let producer = Producer::start(child.stdin.take().unwrap(), rows(1, ROWS), false);
    let buffer = dir.path().join("ck/.buffers/pass/in0-s");
    let peak = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (peak, stop, buffer) = (peak.clone(), stop.clone(), buffer.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(folder_bytes(&buffer), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let held_at = producer.wait_held_back(Duration::from_secs(1));
    let full = folder_bytes(&buffer);
    let got = read_all(child.stdout.take().unwrap()).join().unwrap();
    producer.wait_done();
    assert!(child.wait().unwrap().success(), "{}", stderr(dir.path()));
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    let peak = peak.load(Ordering::Relaxed);
    println!(
        "buffer_max 1MiB: the producer was held back after {held_at} of {} bytes, the buffer \
         holding {full} bytes; its peak was {peak} bytes",
        rows(1, ROWS).len()
    );
    assert!(
        full > 512 << 10,
        "held back before the buffer filled: {full} bytes"
    );
    assert!(
        peak <= 1 << 20,
        "the buffer grew past its bound: {peak} bytes"
    );
    // The progress line said so while the producer was held back.
    let log = stderr(dir.path());
    assert!(log.contains(", buffer full"), "{log}");
    assert!(log.contains(", buffered "), "{log}");
    assert!(got == want, "the buffered run's results differ");
}

/// The ids in CSV results `id,host,twice` (the header skipped).
fn ids(output: &str) -> Vec<u64> {
    output
        .lines()
        .filter_map(|line| line.split(',').next()?.parse().ok())
        .collect()
}

fn manifests(dir: &Path) -> usize {
    fs::read_dir(dir.join("ck/pass"))
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.path().join("manifest.json").exists())
                .count()
        })
        .unwrap_or(0)
}

/// Reads `stdout` on a thread while not paused; gives back all it read.
struct PausedReader {
    pause: Arc<AtomicBool>,
    thread: JoinHandle<Vec<u8>>,
}

impl PausedReader {
    fn start(mut stdout: ChildStdout) -> PausedReader {
        let pause = Arc::new(AtomicBool::new(false));
        let paused = pause.clone();
        let thread = std::thread::spawn(move || {
            let mut all = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                if paused.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                match stdout.read(&mut chunk) {
                    Ok(0) | Err(_) => return all,
                    Ok(n) => all.extend_from_slice(&chunk[..n]),
                }
            }
        });
        PausedReader { pause, thread }
    }
}

/// The bytes under `dir` once they have not changed for half a second.
fn settled(dir: &Path) -> u64 {
    let mut last = (folder_bytes(dir), Instant::now());
    while last.1.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(20));
        let now = folder_bytes(dir);
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    last.0
}

#[test]
fn a_crash_loses_nothing_that_was_buffered() {
    let dir = tempfile::tempdir().unwrap();
    let extra = "SET query_name = 'pass';\n";
    fs::write(dir.path().join("q.sql"), script(", buffer = 'disk'", extra)).unwrap();
    let args = [
        "--checkpoint-dir",
        "ck",
        "--checkpoint-interval",
        "100ms",
        "--progress",
        "never",
    ];
    let mut child = start(dir.path(), &args);
    let mut stdin = child.stdin.take().unwrap();
    let reader = PausedReader::start(child.stdout.take().unwrap());

    // Rows trickle in, their results read, until checkpoints are taken
    // (a source sends a barrier when it reads, so rows must come).
    let mut next = 1;
    let waiting = Instant::now();
    while manifests(dir.path()) < 2 {
        assert!(
            waiting.elapsed() < PATIENCE,
            "no checkpoint: {}",
            stderr(dir.path())
        );
        stdin.write_all(&rows(next, next + 99)).unwrap();
        stdin.flush().unwrap();
        next += 100;
        std::thread::sleep(Duration::from_millis(10));
    }
    // The rest goes in while nobody reads the results: into the buffer.
    reader.pause.store(true, Ordering::Release);
    std::thread::sleep(Duration::from_millis(100));
    let producer = Producer::start(stdin, rows(next, ROWS), true);
    producer.wait_done();
    // What is still in the pipe is not in the buffer yet: wait until the
    // source has taken it all in.
    let buffered = settled(&dir.path().join("ck/.buffers"));
    child.kill().unwrap();
    child.wait().unwrap();
    drop(producer.thread.join());
    reader.pause.store(false, Ordering::Release);
    let before_crash = String::from_utf8(reader.thread.join().unwrap()).unwrap();

    // Restored, with nothing more on stdin: the buffered rows come out.
    let mut child = start(dir.path(), &args);
    drop(child.stdin.take());
    let after = read_all(child.stdout.take().unwrap()).join().unwrap();
    let status = child.wait().unwrap();
    let log = stderr(dir.path());
    assert!(status.success(), "{log}");
    assert!(log.contains("restored from checkpoint"), "{log}");
    let (old, new) = (ids(&before_crash), ids(&after));
    println!(
        "buffer crash: {} result rows before the kill ({} rows trickled in while read; buffer \
         {buffered} bytes on disk), {} after the restore, from row {}",
        old.len(),
        next - 1,
        new.len(),
        new.first().copied().unwrap_or(0)
    );
    assert!(!new.is_empty(), "the restore handed on nothing");
    let all: BTreeSet<u64> = old.iter().chain(&new).copied().collect();
    let missing: Vec<u64> = (1..=ROWS).filter(|i| !all.contains(i)).take(5).collect();
    assert!(missing.is_empty(), "rows lost, e.g. {missing:?}");
    // After the restore, the rows come in order, once each.
    assert!(new.windows(2).all(|w| w[0] + 1 == w[1]), "out of order");
    assert_eq!(*new.last().unwrap(), ROWS);
}

/// A webhook receiver that holds every request until opened, and then
/// keeps the ids of the rows it was sent, in order.
struct Gate {
    addr: std::net::SocketAddr,
    open: tokio::sync::watch::Sender<bool>,
    ids: Arc<std::sync::Mutex<Vec<u64>>>,
    _runtime: tokio::runtime::Runtime,
}

impl Gate {
    fn start() -> Gate {
        let (open, opened) = tokio::sync::watch::channel(false);
        let ids = Arc::new(std::sync::Mutex::new(Vec::new()));
        let state = (opened, ids.clone());
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(held))
            .with_state(state);
        let (addr, runtime) = super::webhook::serve_locally(app);
        Gate {
            addr,
            open,
            ids,
            _runtime: runtime,
        }
    }

    fn ids(&self) -> Vec<u64> {
        self.ids.lock().unwrap().clone()
    }
}

type GateState = (
    tokio::sync::watch::Receiver<bool>,
    Arc<std::sync::Mutex<Vec<u64>>>,
);

async fn held(
    axum::extract::State((mut opened, ids)): axum::extract::State<GateState>,
    body: axum::body::Bytes,
) -> axum::http::StatusCode {
    let _ = opened.wait_for(|&open| open).await;
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
    let mut ids = ids.lock().unwrap();
    ids.extend(rows.iter().map(|row| row["id"].as_u64().unwrap()));
    axum::http::StatusCode::OK
}

/// A service whose one query sends stream `ev` to the webhook at `gate`.
fn held_service(dir: &Path, gate: &Gate, buffer: &str) -> super::service::Server {
    let setup = format!(
        "CREATE STREAM ev (id BIGINT, host TEXT) WITH (connector = 'push'{buffer});
         CREATE SINK hook WITH (connector = 'webhook', url = 'http://{}/hook', timeout = '10min');
         INSERT INTO hook SELECT id, host FROM ev;",
        gate.addr
    );
    fs::write(dir.join("setup.sql"), setup).unwrap();
    let args = ["--addr", "127.0.0.1:0", "--token", super::service::TOKEN];
    let extra = ["--ingest-timeout", "200ms", "setup.sql"];
    super::service::Server::start(dir, &[&args[..], &extra[..]].concat())
}

/// Request `r`'s rows, as JSON lines.
fn push_body(r: u64, per_request: u64) -> String {
    (0..per_request)
        .map(|j| format!("{{\"id\": {}, \"host\": \"h{j}\"}}\n", r * per_request + j))
        .collect()
}

#[test]
fn pushes_return_while_the_query_is_behind() {
    use super::service::post;
    let (requests, per_request) = (200u64, 1000u64);
    // Without a buffer, pushes into a query held up by its webhook are
    // refused once its queues are full.
    let held = Gate::start();
    let dir = tempfile::tempdir().unwrap();
    let server = held_service(dir.path(), &held, "");
    let refused = (0..requests).find(|&r| {
        let body = push_body(r, per_request);
        let answer = post(
            &server,
            "/streams/ev/rows",
            Some("application/x-ndjson"),
            &body,
        );
        assert!(matches!(answer.status, 200 | 429), "{}", answer.body);
        answer.status == 429
    });
    let refused = refused.expect("an unbuffered push is refused");
    drop(server);

    let gate = Gate::start();
    let dir = tempfile::tempdir().unwrap();
    let server = held_service(dir.path(), &gate, ", buffer = 'disk'");
    // The webhook holds the query's first results: it falls behind, and
    // every push after that goes to its buffer.
    let mut slowest = Duration::ZERO;
    let pushing = Instant::now();
    for r in 0..requests {
        let body = push_body(r, per_request);
        let started = Instant::now();
        let answer = post(
            &server,
            "/streams/ev/rows",
            Some("application/x-ndjson"),
            &body,
        );
        slowest = slowest.max(started.elapsed());
        assert_eq!(answer.status, 200, "{}\n{}", answer.body, server.stderr());
    }
    let pushed = pushing.elapsed();
    assert!(gate.ids().is_empty(), "the webhook let nothing through yet");
    gate.open.send_replace(true);
    let total = requests * per_request;
    let draining = Instant::now();
    while (gate.ids().len() as u64) < total {
        assert!(
            draining.elapsed() < PATIENCE,
            "{} of {total} rows",
            gate.ids().len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "buffer, service: {requests} pushes of {per_request} rows in {pushed:.2?} (slowest \
         {slowest:.2?}) while the webhook held the query (unbuffered: push {refused} got 429); \
         drained in {:.2?}",
        draining.elapsed()
    );
    assert_eq!(
        gate.ids(),
        (0..total).collect::<Vec<_>>(),
        "once each, in order"
    );
}
