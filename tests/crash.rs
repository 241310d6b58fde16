//! The crash test of `vigil run` checkpoints: one script with a query per
//! stateful feature over 600k rows (about 7 hours of event time), killed with SIGKILL at least 20 times
//! (at named crash points, and by the test once the run's checkpoints show
//! it went a random share of its input further) and restarted each time
//! from its checkpoints; at the end every sink file must equal, byte for
//! byte, the one an uninterrupted run writes. Every run has two instances
//! of each keyed stage.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{self, Guarded};

const METRIC_ROWS: usize = 600_000;
/// The event-time steps of `metrics.csv` and `net.csv`: sparse enough that
/// 600k rows span about 7 hours (hundreds of windows per query), dense
/// enough that every host has dozens of rows in each minute.
const METRIC_STEP_MS: i64 = 33;
const NET_STEP_MS: i64 = 300;
const HOSTS: u64 = 50;
/// The first event time, in epoch milliseconds.
const T0: i64 = 1_700_000_000_000;
const KILLS: usize = 20;
/// The longest one run may take, to its end or to its kill; a straight
/// run reads all its rows on a loaded two-core machine well within it.
const RUN_LIMIT: Duration = Duration::from_secs(600);
/// The checkpoint interval of the crash runs.
const INTERVAL_MS: u64 = 200;
const SINKS: [&str; 8] = [
    "tumble",
    "hop",
    "session",
    "alert",
    "invariant",
    "over",
    "union",
    "join",
];

const SCRIPT: &str = "
CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE, mem DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) WITH (path = 'metrics.csv');
CREATE STREAM net (ts TIMESTAMP, host TEXT, bytes BIGINT,
  WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) WITH (path = 'net.csv');

CREATE SINK tumble_out WITH (path = 'out/tumble.csv', format = 'csv');
CREATE SINK hop_out WITH (path = 'out/hop.csv', format = 'csv');
CREATE SINK session_out WITH (path = 'out/session.csv', format = 'csv');
CREATE SINK alert_out WITH (path = 'out/alert.csv', format = 'csv');
CREATE SINK invariant_out WITH (path = 'out/invariant.csv', format = 'csv');
CREATE SINK over_out WITH (path = 'out/over.csv', format = 'csv');
CREATE SINK union_out WITH (path = 'out/union.csv', format = 'csv');
CREATE SINK join_out WITH (path = 'out/join.csv', format = 'csv');

CREATE VIEW per_host AS
  SELECT window_start, window_end, host, avg(cpu) AS avg_cpu, avg(mem) AS avg_mem
  FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
  GROUP BY window_start, window_end, host;

INSERT INTO tumble_out
  SELECT window_start, host, count(*) AS n, avg(cpu) AS avg_cpu, max(mem) AS max_mem
  FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
  GROUP BY window_start, window_end, host;

INSERT INTO hop_out
  SELECT window_start, host, count(*) AS n, min(cpu) AS min_cpu, max(cpu) AS max_cpu
  FROM HOP(metrics, ts, INTERVAL '1' MINUTE, INTERVAL '5' MINUTE)
  GROUP BY window_start, window_end, host;

INSERT INTO session_out
  SELECT host, window_start, window_end, count(*) AS n, sum(cpu) AS total
  FROM SESSION(metrics, ts, INTERVAL '30' SECOND)
  GROUP BY window_start, window_end, host;

CREATE ALERT hot AS
  SELECT window_end, host, avg(cpu) AS avg_cpu
  FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE) GROUP BY window_end, host
ALERT WHEN avg_cpu > 80 FOR 3 WINDOWS RESOLVE WHEN avg_cpu < 70;
INSERT INTO alert_out SELECT * FROM hot;

CREATE INVARIANT mem_range AS SELECT * FROM per_host
  LEARN RANGE OF avg_mem TRAIN FOR 60 WINDOWS MODE OFFLINE;
INSERT INTO invariant_out SELECT window_end, host, avg_mem, violation FROM mem_range;

INSERT INTO over_out
  SELECT window_end, host, avg_cpu,
         avg(avg_cpu) OVER (PARTITION BY host ORDER BY window_end
                            ROWS BETWEEN 4 PRECEDING AND CURRENT ROW) AS ma5
  FROM per_host;

INSERT INTO union_out
  SELECT window_start, count(*) AS n, sum(v) AS total FROM (
    SELECT window_start, window_end, CAST(mem AS BIGINT) AS v
    FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
    UNION ALL
    SELECT window_start, window_end, bytes AS v FROM TUMBLE(net, ts, INTERVAL '1' MINUTE)
  ) GROUP BY window_start, window_end;

INSERT INTO join_out
  SELECT c.window_start, c.host, c.avg_cpu, m.total_bytes
  FROM (SELECT window_start, window_end, host, avg(cpu) AS avg_cpu
        FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE) GROUP BY window_start, window_end, host) c
  JOIN (SELECT window_start, window_end, host, sum(bytes) AS total_bytes
        FROM TUMBLE(net, ts, INTERVAL '1' MINUTE) GROUP BY window_start, window_end, host) m
  ON c.host = m.host AND c.window_start = m.window_start;
";

/// A seeded PCG-style generator: the same input on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    /// Uniform in `low..high`.
    fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low)
    }
}

/// An event time, 5% of the time up to 2 s earlier than `t` (out of
/// order, within the 5 s watermark delay).
fn jitter(rng: &mut Rng, t: i64) -> i64 {
    if rng.next().is_multiple_of(20) {
        t - rng.range(0, 2000) as i64
    } else {
        t
    }
}

/// Writes `metrics.csv` (`METRIC_ROWS` rows; each host is silent 2 minutes in 10, so
/// that sessions end; cpu follows a slow wave per host so that alerts fire
/// and resolve) and `net.csv` (a row every `NET_STEP_MS` over the same span).
fn write_inputs(dir: &Path) {
    let mut rng = Rng(12345);
    let mut metrics = String::with_capacity(METRIC_ROWS * 32);
    metrics.push_str("ts,host,cpu,mem\n");
    let (mut rows, mut t) = (0, T0);
    while rows < METRIC_ROWS {
        t += METRIC_STEP_MS;
        let host = rng.next() % HOSTS;
        let second = (t - T0) / 1000;
        if (second + host as i64 * 37) % 600 < 120 {
            continue;
        }
        let ts = jitter(&mut rng, t);
        let period = 600.0 + host as f64 * 20.0;
        let wave = (((t - T0) as f64 / 1000.0) / period * std::f64::consts::TAU).sin();
        let noise = (rng.range(0, 200) as f64 - 100.0) / 10.0;
        let cpu = (60.0 + 30.0 * wave + noise).clamp(0.0, 100.0);
        let mem = 1000.0 + host as f64 * 10.0 + rng.range(0, 1000) as f64 / 10.0;
        writeln!(metrics, "{ts},h{host:02},{cpu:.1},{mem:.1}").unwrap();
        rows += 1;
    }
    fs::write(dir.join("metrics.csv"), metrics).unwrap();
    let end = t;
    let mut net = String::from("ts,host,bytes\n");
    let mut t = T0;
    while t < end {
        t += NET_STEP_MS;
        let host = rng.next() % HOSTS;
        let ts = jitter(&mut rng, t);
        writeln!(net, "{ts},h{host:02},{}", rng.range(0, 100_000)).unwrap();
    }
    fs::write(dir.join("net.csv"), net).unwrap();
}

/// A run folder: the inputs (hard links to the generated ones), the
/// script and an empty `out/`.
fn run_dir(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    fs::create_dir_all(dir.join("out")).unwrap();
    for input in ["metrics.csv", "net.csv"] {
        fs::hard_link(root.join(input), dir.join(input)).unwrap();
    }
    fs::write(dir.join("script.sql"), SCRIPT).unwrap();
    dir
}

/// Starts `vigil run script.sql` in `dir`, stderr into `stderr`.
fn start(dir: &Path, checkpoints: bool, crash_at: Option<&str>, stderr: &Path) -> Guarded {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vigil"));
    command
        .current_dir(dir)
        // Two instances of every keyed stage, whatever the machine: the
        // restores must find each key's state where its rows go.
        .args([
            "run",
            "script.sql",
            "--progress",
            "never",
            "--parallelism",
            "2",
        ])
        .env_remove("VIGIL_CRASH_AT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(stderr).unwrap());
    if checkpoints {
        let interval = format!("{INTERVAL_MS}ms");
        command.args(["--checkpoint-dir", "ck", "--checkpoint-interval", &interval]);
    }
    if let Some(point) = crash_at {
        command.env("VIGIL_CRASH_AT", point);
    }
    let what = match (checkpoints, crash_at) {
        (false, _) => "the straight vigil run".to_string(),
        (true, None) => format!("the vigil run in {}", dir.display()),
        (true, Some(point)) => format!("the vigil run in {} armed at {point}", dir.display()),
    };
    support::spawn(&mut command, &what)
}

/// How one run was asked to die.
#[derive(Clone, Debug)]
enum Kill {
    /// At crash point `point`, its `n`-th hit.
    At(&'static str, u64),
    /// By the test, once a query has a complete checkpoint `bytes` further
    /// into `metrics.csv` than the one it restored from, and `jitter`
    /// after that. The checkpoints anchor the kill to the run's progress,
    /// whatever the machine's speed: no query gets more than about `bytes`
    /// further per run (the first to get there sets the kill off), so the
    /// kills land before the input ends. The jitter (below one checkpoint
    /// interval) only moves the kill to a random moment between two
    /// checkpoints: nothing is waited for with it.
    AfterProgress { bytes: u64, jitter: Duration },
    /// By the test, once every query has a complete checkpoint.
    AfterFirstCheckpoint,
    /// Not at all: the run ends by itself.
    Never,
}

/// The crash points and the range their hit number is drawn from: small
/// enough that each run dies well before its input ends.
const POINTS: [(&str, u64, u64); 5] = [
    ("read", 3, 20),
    ("fire", 10, 300),
    ("checkpoint-write", 1, 25),
    ("before-manifest", 1, 25),
    ("sink-flush", 1, 25),
];

/// What one run did.
struct Outcome {
    killed: bool,
    restores: usize,
    elapsed: Duration,
    stderr: String,
}

fn queries_checkpointed(ck: &Path) -> usize {
    let Ok(queries) = fs::read_dir(ck) else {
        return 0;
    };
    queries
        .flatten()
        .filter(|query| {
            fs::read_dir(query.path()).is_ok_and(|mut ids| {
                ids.any(|id| id.is_ok_and(|id| id.path().join("manifest.json").exists()))
            })
        })
        .count()
}

/// Per query folder under `ck`, how far into `metrics.csv` (bytes) its
/// newest complete checkpoint had read: what a run restores from, and how
/// far it got. A checkpoint removed by retention while it is read is
/// skipped.
fn metrics_checkpointed(ck: &Path) -> BTreeMap<String, u64> {
    let mut read = BTreeMap::new();
    for query in fs::read_dir(ck).into_iter().flatten().flatten() {
        let mut complete: Vec<(u64, PathBuf)> = fs::read_dir(query.path())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|c| {
                let id = c.file_name().to_str()?.strip_prefix("chk-")?.parse().ok()?;
                let manifest = c.path().join("manifest.json");
                manifest.exists().then_some((id, manifest))
            })
            .collect();
        complete.sort();
        let offset = complete.iter().rev().find_map(|(_, manifest)| {
            let manifest: serde_json::Value =
                serde_json::from_str(&fs::read_to_string(manifest).ok()?).ok()?;
            let sources = manifest["sources"].as_array()?;
            let metrics = sources.iter().find(|s| s["stream"] == "metrics")?;
            metrics["position"]["offset"].as_u64()
        });
        if let Some(offset) = offset {
            read.insert(query.file_name().to_string_lossy().into_owned(), offset);
        }
    }
    read
}

/// A query has a checkpoint at least `bytes` further into `metrics.csv`
/// than in `from`.
fn progressed(from: &BTreeMap<String, u64>, now: &BTreeMap<String, u64>, bytes: u64) -> bool {
    now.iter()
        .any(|(query, at)| *at >= from.get(query).copied().unwrap_or(0) + bytes)
}

/// The queries a run's stderr says were restored.
fn count_restores(stderr: &str) -> usize {
    stderr
        .lines()
        .filter(|l| l.starts_with("vigil: query ") && l.contains(" restored from checkpoint "))
        .count()
}

fn run_once(dir: &Path, kill: &Kill, index: usize) -> Outcome {
    let stderr_path = dir.join(format!("stderr-{index}.txt"));
    let crash_at = match kill {
        Kill::At(point, n) => Some(format!("{point}:{n}")),
        _ => None,
    };
    let ck = dir.join("ck");
    // Where each query restores from: its newest complete checkpoint.
    let restored = metrics_checkpointed(&ck);
    let started = Instant::now();
    let mut child = start(dir, true, crash_at.as_deref(), &stderr_path);
    let mut due: Option<Instant> = None;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < RUN_LIMIT,
            "run {index} ({kill:?}) neither ended nor reached its kill within {RUN_LIMIT:?}; checkpoints at {:?} (restored from {restored:?})\n{}",
            metrics_checkpointed(&ck),
            fs::read_to_string(&stderr_path).unwrap_or_default()
        );
        if due.is_none() {
            due = match kill {
                Kill::AfterProgress { bytes, jitter } => {
                    progressed(&restored, &metrics_checkpointed(&ck), *bytes)
                        .then(|| Instant::now() + *jitter)
                }
                Kill::AfterFirstCheckpoint => {
                    (queries_checkpointed(&ck) == SINKS.len()).then(Instant::now)
                }
                _ => None,
            };
        }
        if due.is_some_and(|at| Instant::now() >= at) {
            child.signal(libc::SIGKILL);
            break child.wait_within(Duration::from_secs(60));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let elapsed = started.elapsed();
    let stderr = fs::read_to_string(&stderr_path).unwrap();
    let killed = status.signal() == Some(9);
    assert!(
        killed || status.success(),
        "run {index} ({kill:?}) failed: {status}\n{stderr}"
    );
    if let (Kill::At(point, n), true) = (kill, killed) {
        assert!(
            stderr.contains(&format!("crash point {point}:{n} reached")),
            "run {index} died of SIGKILL elsewhere than at {point}:{n}\n{stderr}"
        );
    }
    let restores = count_restores(&stderr);
    Outcome {
        killed,
        restores,
        elapsed,
        stderr,
    }
}

/// The kills of the crash runs: first once every query has a checkpoint
/// (so that every later run restores), then each crash point twice and
/// kills after random progress in between, `KILLS` or more in all.
fn schedule(rng: &mut Rng, input_bytes: u64) -> Vec<Kill> {
    let mut kills = vec![Kill::AfterFirstCheckpoint];
    // Each random kill comes 1% to 5% of the input further on: together
    // (at most ten of them, and what the leading query checkpoints in the
    // jitter) they stay well within the input.
    for round in 0..2 {
        for (point, low, high) in POINTS {
            kills.push(Kill::At(point, rng.range(low, high)));
            if round == 0 || kills.len() < KILLS {
                kills.push(Kill::AfterProgress {
                    bytes: input_bytes * rng.range(10, 50) / 1000,
                    jitter: Duration::from_millis(rng.range(0, INTERVAL_MS)),
                });
            }
        }
    }
    kills
}

/// The first line where `got` and `want` differ, for the failure message.
fn first_difference(got: &str, want: &str) -> String {
    let mut lines = got.lines().zip(want.lines()).enumerate();
    match lines.find(|(_, (g, w))| g != w) {
        Some((i, (g, w))) => format!("line {}: got {g:?}, expected {w:?}", i + 1),
        None => format!(
            "one is a prefix of the other: {} lines against {} expected",
            got.lines().count(),
            want.lines().count()
        ),
    }
}

#[test]
fn sink_files_survive_sigkill_at_every_phase() {
    let root = tempfile::tempdir().expect("temp dir");
    let root = root.path();
    let began = Instant::now();
    write_inputs(root);
    println!("inputs written in {:.1?}", began.elapsed());

    let straight = run_dir(root, "straight");
    let started = Instant::now();
    let status = start(&straight, false, None, &straight.join("stderr.txt")).wait_within(RUN_LIMIT);
    let full_run = started.elapsed();
    let log = fs::read_to_string(straight.join("stderr.txt")).unwrap();
    assert!(status.success(), "the straight run failed: {log}");
    println!("straight run: {full_run:.1?}");
    let mut expected = Vec::new();
    for sink in SINKS {
        let text = fs::read_to_string(straight.join(format!("out/{sink}.csv"))).unwrap();
        let rows = text.lines().count().saturating_sub(1);
        println!("  {sink}: {rows} rows");
        assert!(
            rows >= 400,
            "query {sink} gives too few rows ({rows})\n{log}"
        );
        expected.push(text);
    }

    let crashed = run_dir(root, "crashed");
    let mut rng = Rng(0x5eed);
    let input_bytes = fs::metadata(root.join("metrics.csv")).unwrap().len();
    let (mut kills, mut restores, mut hit_points) = (0, 0, Vec::new());
    for (index, kill) in schedule(&mut rng, input_bytes).iter().enumerate() {
        let outcome = run_once(&crashed, kill, index);
        let what = match kill {
            Kill::At(point, n) => format!("at {point}:{n}"),
            Kill::AfterProgress { bytes, jitter } => format!(
                "{jitter:.1?} after a query checkpointed {:.1}% more of the input",
                *bytes as f64 * 100.0 / input_bytes as f64
            ),
            Kill::AfterFirstCheckpoint => "once every query had a checkpoint".into(),
            Kill::Never => unreachable!(),
        };
        println!(
            "run {index}: {} {what} ({:.1?}), {} queries restored",
            if outcome.killed {
                "killed"
            } else {
                "ended, not killed,"
            },
            outcome.elapsed,
            outcome.restores
        );
        assert!(
            outcome.killed,
            "run {index} read all its input before its kill ({what}): the schedule goes too far into the input\n{}",
            outcome.stderr
        );
        if index > 0 {
            assert_eq!(
                outcome.restores,
                SINKS.len(),
                "run {index} did not restore every query\n{}",
                outcome.stderr
            );
        }
        kills += 1;
        restores += outcome.restores;
        if let Kill::At(point, _) = kill
            && !hit_points.contains(point)
        {
            hit_points.push(*point);
        }
    }
    let last = run_once(&crashed, &Kill::Never, kills);
    assert_eq!(
        last.restores,
        SINKS.len(),
        "the last run did not restore\n{}",
        last.stderr
    );
    restores += last.restores;
    println!(
        "last run: {:.1?}; {kills} kills, {restores} query restores, crash points hit: {}",
        last.elapsed,
        hit_points.join(", ")
    );
    assert!(kills >= KILLS);
    assert_eq!(hit_points.len(), POINTS.len());

    let mut wrong = Vec::new();
    for (sink, want) in SINKS.iter().zip(&expected) {
        let got = fs::read_to_string(crashed.join(format!("out/{sink}.csv"))).unwrap();
        if &got != want {
            wrong.push(format!("{sink}.csv: {}", first_difference(&got, want)));
        }
    }
    assert!(
        wrong.is_empty(),
        "sink files differ from the straight run:\n{}",
        wrong.join("\n")
    );
    println!(
        "all {} sink files identical; total {:.1?}",
        SINKS.len(),
        began.elapsed()
    );
}
