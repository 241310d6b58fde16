//! The Kafka scale-out harness: Q1 read from a Kafka topic by 1, 2 and 3
//! `vigil run --group` processes, and the time a partition with 100,000
//! keys of state takes to move to a process that joins.
//!
//! The brokers are librdkafka's mock cluster, served by this process on a
//! localhost port (no Kafka install needed); the `vigil` processes are real
//! clients of it. Run after a release build:
//!
//! ```text
//! cargo build --release && cargo bench --bench kafka
//! ```
//!
//! `VIGIL_BIN` names the binary (default `target/release/vigil` under
//! `CARGO_TARGET_DIR`), `KAFKA_BENCH_ROWS` the rows (default 400,000: the
//! mock cluster keeps about 5 MB per partition and drops older messages,
//! which the harness checks).
//! It prints a Markdown table. On a 2-core machine the processes share two
//! cores with each other and with the mock brokers, so more processes
//! cannot add throughput here: the figures show the cost of splitting, not
//! the gain on more machines.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// Event time of the first row, epoch ms.
const T0: i64 = 1_700_000_000_000;
const HOSTS: u64 = 1000;
const PARTITIONS: i32 = 6;
/// Keys of state in the partition-move measurement, over two partitions:
/// the one that moves holds about half (100,000).
const MOVE_KEYS: u64 = 200_000;

fn main() {
    let rows: u64 = std::env::var("KAFKA_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400_000);
    let vigil = vigil_binary();
    assert!(
        vigil.exists(),
        "{} does not exist: build it with `cargo build --release` or set VIGIL_BIN",
        vigil.display()
    );
    let cluster = MockCluster::new(1).expect("the mock cluster starts");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("metrics", PARTITIONS, 1).unwrap();
    let started = Instant::now();
    produce_metrics(&bootstrap, rows);
    eprintln!("produced {rows} rows in {:.1?}", started.elapsed());
    assert_kept(&bootstrap, "metrics");
    let windows = expected_results(rows);

    println!("| processes | rows | seconds | rows/s (all) | rows/s per process |");
    println!("|---:|---:|---:|---:|---:|");
    for processes in 1..=3 {
        let out = format!("out{processes}");
        cluster.create_topic(&out, 1, 1).unwrap();
        let seconds = scale_out_run(&vigil, &bootstrap, processes, &out, windows);
        let all = rows as f64 / seconds;
        println!(
            "| {processes} | {rows} | {seconds:.2} | {all:.0} | {:.0} |",
            all / processes as f64
        );
    }

    cluster.create_topic("moves", 2, 1).unwrap();
    let moved = partition_move(&vigil, &bootstrap);
    println!();
    println!(
        "A partition holding {} of {MOVE_KEYS} keys' open windows moved to a joining process in {:.2} s (from its start until its pipeline ran; the first process had stopped it at a checkpoint after {:.2} s; restoring the checkpoint: {})",
        MOVE_KEYS / 2,
        moved.seconds,
        moved.stopped,
        moved.restore
    );
}

fn vigil_binary() -> PathBuf {
    if let Ok(path) = std::env::var("VIGIL_BIN") {
        return PathBuf::from(path);
    }
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    Path::new(&target).join("release").join("vigil")
}

fn producer(bootstrap: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .unwrap()
}

fn send(producer: &BaseProducer, topic: &str, key: &str, payload: &str, partition: Option<i32>) {
    loop {
        let mut record = BaseRecord::<str, str>::to(topic).key(key).payload(payload);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        match producer.send(record) {
            Ok(()) => return,
            Err(_) => {
                producer.poll(Duration::from_millis(10));
            }
        }
    }
}

/// `rows` rows over [`HOSTS`] hosts, one a second each, keyed by host; then
/// a row per partition an hour later, so every window closes.
fn produce_metrics(bootstrap: &str, rows: u64) {
    let producer = producer(bootstrap);
    for i in 0..rows {
        let (second, host) = (i / HOSTS, i % HOSTS);
        let ts = T0 + second as i64 * 1000;
        let cpu = (host * 7 + second * 13) % 100;
        let row = format!(r#"{{"ts":{ts},"host":"h{host}","cpu":{cpu}}}"#);
        send(&producer, "metrics", &format!("h{host}"), &row, None);
    }
    let end = T0 + (rows / HOSTS) as i64 * 1000 + 3_600_000;
    for p in 0..PARTITIONS {
        let row = format!(r#"{{"ts":{end},"host":"_end{p}","cpu":0}}"#);
        send(&producer, "metrics", "_end", &row, Some(p));
    }
    producer.flush(Duration::from_secs(120)).unwrap();
}

/// Panics unless every partition of `topic` still has its first message.
fn assert_kept(bootstrap: &str, topic: &str) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for p in 0..PARTITIONS {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .unwrap();
        assert_eq!(
            low, 0,
            "partition {p} of {topic} dropped its first {low} of {high} messages: fewer rows (KAFKA_BENCH_ROWS)"
        );
    }
}

/// The Q1 results the data gives: its distinct (10 s window, host) pairs
/// (the closing rows' windows stay open).
fn expected_results(rows: u64) -> u64 {
    let pairs: std::collections::HashSet<(u64, u64)> =
        (0..rows).map(|i| (i / HOSTS / 10, i % HOSTS)).collect();
    pairs.len() as u64
}

fn script(dir: &Path, bootstrap: &str, topic: &str, out: &str) {
    let sql = format!(
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
           WATERMARK FOR ts AS ts - INTERVAL '2' SECOND)
         WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = '{topic}',
               start = 'earliest', properties.session.timeout.ms = '6000',
               properties.heartbeat.interval.ms = '500');
         CREATE SINK out WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = '{out}',
               key = 'host', delivery = 'at_least_once');
         INSERT INTO out
           SELECT window_start, window_end, host, avg(cpu) AS avg_cpu, max(cpu) AS max_cpu,
                  count(*) AS n
           FROM TUMBLE(m, ts, INTERVAL '10' SECOND)
           GROUP BY window_start, window_end, host;"
    );
    std::fs::write(dir.join("q.sql"), sql).unwrap();
}

fn member(vigil: &Path, dir: &Path, group: &str, stderr: &Path) -> Child {
    Command::new(vigil)
        .current_dir(dir)
        .args([
            "run",
            "q.sql",
            "--group",
            group,
            "--checkpoint-dir",
            "ck",
            "--checkpoint-interval",
            "10s",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(stderr).unwrap())
        .spawn()
        .expect("vigil starts")
}

/// Messages written to `topic` (one partition) so far: its end offset
/// (the mock cluster may have dropped the oldest since).
fn messages(bootstrap: &str, topic: &str) -> u64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(5))
        .map_or(0, |(_, high)| high as u64)
}

/// Seconds from starting `processes` members until `out` holds every data
/// result (and the closing rows' own).
fn scale_out_run(vigil: &Path, bootstrap: &str, processes: usize, out: &str, want: u64) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    script(dir.path(), bootstrap, "metrics", out);
    let started = Instant::now();
    let mut members: Vec<Child> = (0..processes)
        .map(|i| {
            let stderr = dir.path().join(format!("m{i}.stderr"));
            member(vigil, dir.path(), &format!("bench-{out}"), &stderr)
        })
        .collect();
    let deadline = started + Duration::from_secs(1800);
    while messages(bootstrap, out) < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let seconds = started.elapsed().as_secs_f64();
    for m in &mut members {
        let _ = m.kill();
        let _ = m.wait();
    }
    assert!(
        messages(bootstrap, out) >= want,
        "{out}: {} of {want} results after {seconds:.0} s",
        messages(bootstrap, out)
    );
    seconds
}

/// One process takes both partitions of `moves` (one row for each of
/// [`MOVE_KEYS`] hosts, windows left open) and checkpoints; a second joins
/// and takes a partition over: how long that took (see [`Move`]).
fn partition_move(vigil: &Path, bootstrap: &str) -> Move {
    let producer = producer(bootstrap);
    for host in 0..MOVE_KEYS {
        let row = format!(r#"{{"ts":{T0},"host":"k{host}","cpu":1}}"#);
        send(&producer, "moves", &format!("k{host}"), &row, None);
    }
    producer.flush(Duration::from_secs(60)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    script(dir.path(), bootstrap, "moves", "moves_out");
    let first_err = dir.path().join("first.stderr");
    let mut first = member(vigil, dir.path(), "bench-moves", &first_err);
    // Two checkpoints after both pipelines run hold every key.
    let deadline = Instant::now() + Duration::from_secs(300);
    while !std::fs::read_to_string(&first_err)
        .is_ok_and(|t| t.matches("pipeline started").count() >= 2)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(25));
    let second_err = dir.path().join("second.stderr");
    let started = Instant::now();
    let mut second = member(vigil, dir.path(), "bench-moves", &second_err);
    let mut stopped = None;
    while !std::fs::read_to_string(&second_err).is_ok_and(|t| t.contains("pipeline started"))
        && Instant::now() < deadline + Duration::from_secs(120)
    {
        if stopped.is_none()
            && std::fs::read_to_string(&first_err)
                .is_ok_and(|t| t.contains("stopped at a checkpoint"))
        {
            stopped = Some(started.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let moved = started.elapsed().as_secs_f64();
    let said = std::fs::read_to_string(&second_err).unwrap_or_default();
    let restore = said
        .lines()
        .find(|l| l.contains("restored from checkpoint"))
        .unwrap_or("no restore line")
        .to_string();
    for m in [&mut first, &mut second] {
        let _ = m.kill();
        let _ = m.wait();
    }
    Move {
        seconds: moved,
        stopped: stopped.unwrap_or(f64::NAN),
        restore,
    }
}

/// How a partition moved in [`partition_move`].
struct Move {
    /// From the joining process's start until its pipeline ran.
    seconds: f64,
    /// From that start until the first process had stopped the partition
    /// at a checkpoint (the group protocol's share, and the stop's).
    stopped: f64,
    /// What the joining process said about restoring.
    restore: String,
}
