//! The disk buffer end to end (`buffer = 'disk'`): the real `vigil` binary
//! reads stdin while its query is held up by a stdout that the test does
//! not read, so the query falls behind its stream at a moment the test
//! chooses.

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::support::{self, Guarded, join_within, wait_until};

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
fn start(dir: &Path, args: &[&str]) -> Guarded {
    start_writing_to(dir, args, Stdio::piped())
}

/// Like [`start`], its stdout going to `stdout`.
fn start_writing_to(dir: &Path, args: &[&str], stdout: Stdio) -> Guarded {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vigil"));
    command
        .args(["run", "q.sql", "--format", "csv"])
        .args(args)
        .current_dir(dir)
        .env_remove("VIGIL_CRASH_AT")
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(fs::File::create(dir.join("stderr.txt")).unwrap());
    support::spawn(&mut command, "vigil run")
}

/// Whether a write into the pipe whose write end is `end` would wait now:
/// the kernel has no room left in it (`poll` gives no `POLLOUT`).
fn pipe_full(end: &impl AsFd) -> bool {
    let mut poll = libc::pollfd {
        fd: end.as_fd().as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, and no waiting.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    assert!(ready >= 0, "poll: {}", std::io::Error::last_os_error());
    poll.revents & libc::POLLOUT == 0
}

/// Writes `input` to `child`'s stdin on a thread, counting the bytes
/// written; closes stdin at the end unless `keep_open`. The thread gives
/// back the open stdin when kept.
struct Producer {
    written: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    thread: JoinHandle<Option<ChildStdin>>,
    started: Instant,
    /// Another handle on the write end of the child's stdin, to ask the
    /// kernel whether the pipe is full. Let go once done with: the child
    /// sees the end of its input only once every write end is closed.
    probe: Mutex<Option<OwnedFd>>,
}

impl Producer {
    fn start(mut stdin: ChildStdin, input: Vec<u8>, keep_open: bool) -> Producer {
        let probe = stdin.as_fd().try_clone_to_owned().expect("dup stdin");
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
            probe: Mutex::new(Some(probe)),
        }
    }

    /// Waits until the producer has written everything; how long it took.
    fn wait_done(&self) -> Duration {
        self.probe.lock().unwrap().take();
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

    /// Waits until the producer is held back: rows left to write, the
    /// kernel says its write cannot go on (vigil's stdin is full), and
    /// `engine_held` (`why`, what vigil reports) says vigil is not taking
    /// more. Fails if the producer gets all its rows in first. Gives the
    /// bytes written by then.
    fn wait_held_back(&self, why: &str, mut engine_held: impl FnMut() -> bool) -> u64 {
        let probe = self.probe.lock().unwrap().take().expect("a probe");
        let what = format!("the producer to be held back ({why})");
        let written = wait_until(&what, PATIENCE, || {
            let held = engine_held() && pipe_full(&probe);
            assert!(
                !self.done.load(Ordering::Acquire),
                "the producer was never held back"
            );
            assert!(
                !self.thread.is_finished(),
                "the producer could not write: vigil is gone"
            );
            held.then(|| self.written.load(Ordering::Relaxed))
        });
        drop(probe);
        written
    }

    /// Waits until the producer has written everything; the stdin it kept
    /// open.
    fn finish(self) -> Option<ChildStdin> {
        self.wait_done();
        join_within(self.thread, PATIENCE, "the producer")
    }
}

/// Reads all of `stdout` on a thread.
fn read_all(mut stdout: impl Read + Send + 'static) -> JoinHandle<String> {
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
    let reader = read_all(child.stdout.take().unwrap());
    producer.wait_done();
    let out = join_within(reader, PATIENCE, "the unbuffered run's results");
    let status = child.wait_within(PATIENCE);
    assert!(status.success(), "{}", stderr(dir.path()));
    out
}

fn stderr(dir: &Path) -> String {
    fs::read_to_string(dir.join("stderr.txt")).unwrap_or_default()
}

/// The progress line `--progress always` drew last on stderr (each drawing
/// clears the line first).
fn last_progress(dir: &Path) -> String {
    let log = stderr(dir);
    log.rsplit("\x1b[2K")
        .next()
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The rows read so far, as the last progress line gives them.
fn rows_read(dir: &Path) -> Option<u64> {
    let line = last_progress(dir);
    let (rows, _) = line.strip_prefix("vigil: ")?.split_once(" row")?;
    rows.replace(',', "").parse().ok()
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
    // The kernel tells both: vigil's stdout is full (nothing reads it), and
    // the producer's write into its stdin cannot go on.
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("q.sql"), script("", "")).unwrap();
    let (results, out) = std::io::pipe().expect("a pipe");
    let out_probe = out.try_clone().expect("dup the pipe");
    let mut child = start_writing_to(dir.path(), &["--progress", "never"], out.into());
    let producer = Producer::start(child.stdin.take().unwrap(), rows(1, ROWS), false);
    let held_at = producer.wait_held_back("vigil's stdout full", || pipe_full(&out_probe));
    drop(out_probe);
    let reader = read_all(results);
    producer.wait_done();
    join_within(reader, PATIENCE, "the unbuffered run's results");
    let status = child.wait_within(PATIENCE);
    assert!(status.success(), "{}", stderr(dir.path()));

    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("q.sql"), script(", buffer = 'disk'", "")).unwrap();
    let mut child = start(dir.path(), &["--progress", "never"]);
    let producer = Producer::start(child.stdin.take().unwrap(), rows(1, ROWS), false);
    // Nobody reads the results yet: the query is stuck at its first
    // writes, and the producer still gets all of its rows in.
    let produced = producer.wait_done();
    let stdout = child.stdout.take().unwrap();
    let reading = Instant::now();
    let got = join_within(read_all(stdout), PATIENCE, "the buffered run's results");
    let drained = reading.elapsed();
    let status = child.wait_within(PATIENCE);
    assert!(status.success(), "{}", stderr(dir.path()));
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
    // vigil's progress line says when its buffer is full and the source
    // waits for room.
    let held_at = producer.wait_held_back("vigil reports its buffer full", || {
        last_progress(dir.path()).contains(", buffer full")
    });
    let full = folder_bytes(&buffer);
    let reader = read_all(child.stdout.take().unwrap());
    producer.wait_done();
    let got = join_within(reader, PATIENCE, "the buffered run's results");
    let status = child.wait_within(PATIENCE);
    assert!(status.success(), "{}", stderr(dir.path()));
    stop.store(true, Ordering::Relaxed);
    join_within(watcher, PATIENCE, "the buffer's watcher");
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
    fn start(mut stdout: impl Read + Send + 'static) -> PausedReader {
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

/// A row written after all the others, so that vigil's count of the rows
/// it has read tells when it has handed on the last of them.
const SENTINEL: u64 = ROWS + 1;

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
        "always",
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
    let producer = Producer::start(stdin, rows(next, ROWS), true);
    let mut stdin = producer.finish().expect("stdin kept open");
    // What is still in the pipe is not in the buffer yet. The source
    // counts a batch's rows (the progress line's figure) just before it
    // hands the batch on, so once it has counted every row, a row written
    // after them is counted only once the last batch has been handed on:
    // then every row is in the buffer.
    let path = dir.path();
    let all_read = |n: u64| move || (rows_read(path) == Some(n)).then_some(());
    wait_until("vigil to count every row", PATIENCE, all_read(ROWS));
    stdin.write_all(&rows(SENTINEL, SENTINEL)).unwrap();
    stdin.flush().unwrap();
    wait_until(
        "vigil to count the row after them",
        PATIENCE,
        all_read(SENTINEL),
    );
    let buffered = folder_bytes(&dir.path().join("ck/.buffers"));
    child.kill_group();
    drop(stdin);
    reader.pause.store(false, Ordering::Release);
    let before_crash = join_within(reader.thread, PATIENCE, "the results before the kill");
    let before_crash = String::from_utf8(before_crash).unwrap();

    // Restored, with nothing more on stdin: the buffered rows come out.
    let mut child = start(dir.path(), &args);
    drop(child.stdin.take());
    let reader = read_all(child.stdout.take().unwrap());
    let status = child.wait_within(PATIENCE);
    let after = join_within(reader, PATIENCE, "the restored run's results");
    let log = stderr(dir.path());
    assert!(status.success(), "{log}");
    assert!(log.contains("restored from checkpoint"), "{log}");
    let (old, mut new) = (ids(&before_crash), ids(&after));
    // The row after the last went into the buffer too if vigil handed it
    // on before the kill; it is not one of the rows checked.
    if new.last() == Some(&SENTINEL) {
        new.pop();
    }
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
