//! The `kafka` connector against a real Kafka protocol: librdkafka's mock
//! cluster, served on a localhost port by this test process, with `vigil
//! run` processes as its clients. Results are read back with
//! `isolation.level = read_committed`, as a downstream consumer would.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::support::{self, Guarded};

const HOSTS: usize = 6;
/// Seconds of data per host, one row a second.
const SECONDS: usize = 3000;
/// The replay's speed-up: `SECONDS` of event time take 3 s, so a run
/// passes dozens of 100 ms checkpoints on any machine and a crash point
/// at the third is reached.
const SPEED: usize = 1000;
const T0: i64 = 1_700_000_000_000;
/// The longest a `vigil run` of these tests may take.
const RUN_LIMIT: Duration = Duration::from_secs(120);
/// The longest the producer's queue may stay full.
const SEND_LIMIT: Duration = Duration::from_secs(60);
/// The longest a member may take to leave its group on SIGTERM.
const LEAVE_LIMIT: Duration = Duration::from_secs(120);

/// A mock cluster with topic `metrics` (3 partitions) and `out` (1).
fn cluster() -> MockCluster<'static, rdkafka::producer::DefaultProducerContext> {
    let cluster = MockCluster::new(1).expect("the mock cluster starts");
    cluster.create_topic("metrics", 3, 1).unwrap();
    cluster.create_topic("out", 1, 1).unwrap();
    cluster
}

pub(crate) fn producer(bootstrap: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap()
}

/// Queues `record`, waiting while the producer's queue is full, at most
/// [`SEND_LIMIT`]; any other refusal fails at once.
fn queue(producer: &BaseProducer, mut record: BaseRecord<'_, str, str>) {
    let deadline = Instant::now() + SEND_LIMIT;
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                assert!(
                    Instant::now() < deadline,
                    "the producer's queue stayed full for {SEND_LIMIT:?} (topic {})",
                    back.topic
                );
                record = back;
                producer.poll(Duration::from_millis(20));
            }
            Err((e, back)) => panic!("producing to {}: {e}", back.topic),
        }
    }
}

/// Waits until `producer` has delivered every message it queued.
fn flush(producer: &BaseProducer) {
    producer
        .flush(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("the producer did not deliver its messages within 60 s: {e}"));
}

fn cpu(host: usize, second: usize) -> usize {
    (host * 7 + second * 13) % 100
}

/// Every row as a JSON message keyed by its host, in event-time order,
/// and three messages that do not decode.
fn produce_metrics(bootstrap: &str) {
    let producer = producer(bootstrap);
    let send = |key: &str, payload: Option<&str>| {
        let mut record = BaseRecord::<str, str>::to("metrics").key(key);
        if let Some(p) = payload {
            record = record.payload(p);
        }
        queue(&producer, record);
    };
    for second in 0..SECONDS {
        for host in 0..HOSTS {
            let ts = T0 + second as i64 * 1000;
            let row = format!(
                r#"{{"ts": {ts}, "host": "h{host}", "cpu": {}}}"#,
                cpu(host, second)
            );
            send(&format!("h{host}"), Some(&row));
        }
        if second == 100 {
            send("h0", Some("not json at all"));
            send("h1", Some(r#"{"ts": "yesterday", "host": "h1", "cpu": 1}"#));
            send("h2", None);
        }
    }
    flush(&producer);
}

/// What the query must give: per host and minute, the rows and their cpu
/// sum.
fn expected() -> BTreeMap<(String, i64), (u64, u64)> {
    expected_hosts(HOSTS, SECONDS)
}

/// Every message of partition 0 of `topic` a read_committed consumer
/// sees, up to the partition's end when called: (key, value). Fails when
/// the end is not reached within a minute.
fn read_topic(bootstrap: &str, topic: &str) -> Vec<(Option<String>, String)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "test-reader")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let (low, high) = consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("the end of {topic}: {e}"));
    if high <= low {
        return Vec::new();
    }
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&list).unwrap();
    let mut out = Vec::new();
    let limit = Duration::from_secs(60);
    let deadline = Instant::now() + limit;
    loop {
        assert!(
            Instant::now() < deadline,
            "read {} messages of {topic} in {limit:?}, not up to its end at offset {high}",
            out.len()
        );
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => out.push((
                m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
            )),
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {
                let position = consumer.position().unwrap();
                let at = position.find_partition(topic, 0).map(|e| e.offset());
                if matches!(at, Some(Offset::Offset(o)) if o >= high) {
                    break;
                }
            }
        }
    }
    out
}

/// The results in `messages`, checked to be keyed by their host and
/// unique.
fn results(messages: &[(Option<String>, String)]) -> BTreeMap<(String, i64), (u64, u64)> {
    let mut got = BTreeMap::new();
    for (key, value) in messages {
        let row: serde_json::Value = serde_json::from_str(value).unwrap();
        let host = row["host"].as_str().unwrap().to_string();
        assert_eq!(key.as_deref(), Some(host.as_str()), "{value}");
        let start = chrono::NaiveDateTime::parse_from_str(
            row["window_start"].as_str().unwrap(),
            "%Y-%m-%dT%H:%M:%S",
        )
        .unwrap()
        .and_utc()
        .timestamp_millis();
        let n = row["n"].as_u64().unwrap();
        let total = row["total"].as_f64().unwrap() as u64;
        let before = got.insert((host, start), (n, total));
        assert!(before.is_none(), "a result came twice: {value}");
    }
    got
}

fn script(dir: &Path, bootstrap: &str, delivery: &str) {
    let sql = format!(
        "CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE, _partition BIGINT, _offset BIGINT,
           WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
         WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = 'metrics',
               stop_at = 'latest', batch_size = '200', dead_letter = 'bad.txt',
               replay = 'realtime', speed = '{SPEED}');
         CREATE SINK out WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = 'out',
               key = 'host', delivery = '{delivery}');
         INSERT INTO out
           SELECT window_start, host, count(*) AS n, sum(cpu) AS total
           FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
           GROUP BY window_start, window_end, host;
         "
    );
    fs::write(dir.join("q.sql"), sql).unwrap();
}

/// A mock cluster holding `produce_metrics`' messages, and a directory
/// with the script whose sink delivers as `delivery` says. The cluster
/// lives as long as the value kept.
fn with_metrics(
    delivery: &str,
) -> (
    MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    String,
    tempfile::TempDir,
) {
    let cluster = cluster();
    let bootstrap = cluster.bootstrap_servers();
    produce_metrics(&bootstrap);
    let dir = tempfile::tempdir().unwrap();
    script(dir.path(), &bootstrap, delivery);
    (cluster, bootstrap, dir)
}

/// Runs `vigil run q.sql` with checkpoints in `dir` to its end, armed at
/// crash point `crash_at`.
fn vigil_run(dir: &Path, crash_at: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vigil"));
    command
        .current_dir(dir)
        .args([
            "run",
            "q.sql",
            "--checkpoint-dir",
            "ck",
            "--checkpoint-interval",
            "100ms",
        ])
        .env_remove("VIGIL_CRASH_AT");
    if let Some(point) = crash_at {
        command.env("VIGIL_CRASH_AT", point);
    }
    let what = match crash_at {
        Some(point) => format!("vigil run with checkpoints, armed at {point}"),
        None => "vigil run with checkpoints".to_string(),
    };
    support::run_within(&mut command, RUN_LIMIT, &what)
}

/// Runs `vigil run q.sql` plus `args` in `dir` to its end, within
/// [`RUN_LIMIT`].
fn run_script(dir: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vigil"));
    command.current_dir(dir).args(["run", "q.sql"]).args(args);
    let what = format!("vigil run q.sql {}", args.join(" "));
    support::run_within(&mut command, RUN_LIMIT, what.trim_end())
}

#[test]
fn a_topic_is_read_aggregated_and_written_back_exactly_once() {
    let (_cluster, bootstrap, dir) = with_metrics("exactly_once");
    let started = Instant::now();
    let out = vigil_run(dir.path(), None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Paced: the last batch is not due before its event time, sped up, is
    // (the first batch of 200 messages spans at most 200 s).
    let paced = Duration::from_millis(((SECONDS - 200) * 1000 / SPEED) as u64);
    assert!(started.elapsed() >= paced, "{:?}", started.elapsed());
    assert!(
        stderr.contains(&format!("rows={} bad=3", HOSTS * SECONDS)),
        "{stderr}"
    );
    // The three partitions arrive at their own pace; aligned, no row is
    // late for a watermark 5 s behind the newest.
    assert!(stderr.contains("late=0"), "{stderr}");
    let got = results(&read_topic(&bootstrap, "out"));
    assert_eq!(got, expected());

    // The bad messages are in the dead-letter file as they came, with
    // their partition and offset.
    let dead = fs::read_to_string(dir.path().join("bad.txt")).unwrap();
    let lines: Vec<&str> = dead.lines().collect();
    assert_eq!(lines.len(), 3, "{dead}");
    for line in &lines {
        assert!(line.starts_with("partition "), "{line}");
        assert!(line.contains(" offset "), "{line}");
    }
    assert!(dead.contains("\tnot json at all"), "{dead}");
    assert!(dead.contains("the message has no value"), "{dead}");
}

#[test]
fn a_crash_between_checkpoint_and_commit_loses_and_repeats_nothing() {
    // Killed after its third checkpoint is written, before its sink
    // commits the transaction of that checkpoint's results.
    killed_and_restored_exactly_once("after-manifest:3");
}

#[test]
fn a_crash_after_a_commit_publishes_that_checkpoint_once() {
    // Killed once its third checkpoint's transaction is committed: the
    // restore from that checkpoint must find its epoch published.
    killed_and_restored_exactly_once("committed:3");
}

/// Runs the exactly-once query killed at crash point `point`, then again
/// restored: every result once, none missing.
fn killed_and_restored_exactly_once(point: &str) {
    let (_cluster, bootstrap, dir) = with_metrics("exactly_once");
    let first = vigil_run(dir.path(), Some(point));
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert_eq!(first.status.signal(), Some(9), "not killed:\n{stderr}");
    let second = vigil_run(dir.path(), None);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{stderr}");
    assert!(stderr.contains("restored from checkpoint"), "{stderr}");
    let got = results(&read_topic(&bootstrap, "out"));
    assert_eq!(got, expected());
}

#[test]
fn a_kafka_topic_is_a_control_stream() {
    let cluster = MockCluster::new(1).expect("the mock cluster starts");
    cluster.create_topic("words", 2, 1).unwrap();
    cluster.create_topic("stop_words", 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let producer = producer(&bootstrap);
    let send = |topic: &str, key: &str, payload: String| {
        producer
            .send(BaseRecord::<str, str>::to(topic).key(key).payload(&payload))
            .expect("queued");
    };
    send("stop_words", "DROP", r#"{"ts": 0, "key": "DROP"}"#.into());
    send(
        "stop_words",
        "IGNORE",
        r#"{"ts": 0, "key": "IGNORE"}"#.into(),
    );
    for (i, word) in ["Apache", "DROP", "Flink", "IGNORE", "Kafka"]
        .iter()
        .enumerate()
    {
        let ts = (i as i64 + 1) * 1000;
        send(
            "words",
            word,
            format!(r#"{{"ts": {ts}, "word": "{word}"}}"#),
        );
    }
    flush(&producer);
    let dir = tempfile::tempdir().unwrap();
    let read = |topic: &str| {
        format!(
            "WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = '{topic}', stop_at = 'latest')"
        )
    };
    fs::write(
        dir.path().join("q.sql"),
        format!(
            "CREATE STREAM words (ts TIMESTAMP, word TEXT, WATERMARK FOR ts AS ts) {};
             CREATE STREAM stop_words (ts TIMESTAMP, key TEXT, WATERMARK FOR ts AS ts) {};
             SELECT word FROM CONTROLLED(words, stop_words, word);",
            read("words"),
            read("stop_words")
        ),
    )
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_vigil"));
    command
        .current_dir(dir.path())
        .args(["run", "q.sql", "--format", "csv"]);
    let out = support::run_within(&mut command, RUN_LIMIT, "vigil run of the control stream");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut words: Vec<&str> = stdout.lines().skip(1).collect();
    words.sort();
    assert_eq!(words, ["Apache", "Flink", "Kafka"], "{stderr}");
}

#[test]
fn a_stream_that_starts_at_the_end_of_its_topic_ends_at_once() {
    let cluster = cluster();
    let bootstrap = cluster.bootstrap_servers();
    produce_metrics(&bootstrap);
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("q.sql"),
        format!(
            "CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
             WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = 'metrics',
                   start = 'latest', stop_at = 'latest');
             SELECT host, count(*) FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
             GROUP BY window_start, window_end, host;"
        ),
    )
    .unwrap();
    let out = run_script(dir.path(), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("rows=0 bad=0"), "{stderr}");
}

#[test]
fn exactly_once_without_checkpoints_is_refused() {
    let cluster = cluster();
    let bootstrap = cluster.bootstrap_servers();
    let dir = tempfile::tempdir().unwrap();
    script(dir.path(), &bootstrap, "exactly_once");
    let out = run_script(dir.path(), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("delivery = 'exactly_once'") && stderr.contains("--checkpoint-dir"),
        "{stderr}"
    );
}

#[test]
fn at_least_once_writes_every_result_without_checkpoints() {
    let (_cluster, bootstrap, dir) = with_metrics("at_least_once");
    let out = run_script(dir.path(), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(results(&read_topic(&bootstrap, "out")), expected());
}

/// The results in `messages`, at least once: a message that came more
/// than once counts once.
fn results_at_least_once(
    messages: &[(Option<String>, String)],
) -> BTreeMap<(String, i64), (u64, u64)> {
    let mut distinct = messages.to_vec();
    distinct.sort();
    distinct.dedup();
    results(&distinct)
}

/// The brokers refuse the next `count` produce requests with an error
/// librdkafka does not retry by itself: the messages in them fail their
/// delivery.
fn refuse_produce_requests(
    cluster: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    count: usize,
) {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let refusal = RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_RECORD;
    cluster.request_errors(RDKafkaApiKey::Produce, &vec![refusal; count]);
}

/// Checks that `messages` hold every result at least once, each right;
/// `stderr` is the run's, for the failure message.
fn assert_every_result(messages: &[(Option<String>, String)], stderr: &str) {
    let got = results_at_least_once(messages);
    let want = expected();
    let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(k)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} results lost, such as {:?}\n{stderr}",
        missing.len(),
        want.len(),
        missing.first()
    );
    assert_eq!(got, want);
}

#[test]
fn at_least_once_sends_again_the_results_whose_delivery_failed() {
    let (cluster, bootstrap, dir) = with_metrics("at_least_once");
    // The input is in the topic: the next produce requests are the sink's.
    refuse_produce_requests(&cluster, 3);
    let out = vigil_run(dir.path(), None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The refusals happened, and were reported.
    assert!(stderr.contains("was not delivered"), "{stderr}");
    assert_every_result(&read_topic(&bootstrap, "out"), &stderr);
}

#[test]
fn at_least_once_sends_again_the_results_that_timed_out_while_the_broker_was_down() {
    let (_cluster, bootstrap, dir) = with_metrics("at_least_once");
    // The sink writes to a cluster of its own, down when the query starts:
    // its messages time out after a second (`message.timeout.ms`), and
    // librdkafka gives up on them.
    let sink_cluster = cluster();
    let sink_bootstrap = sink_cluster.bootstrap_servers();
    let sql = fs::read_to_string(dir.path().join("q.sql")).unwrap();
    let (source, sink) = sql.split_once("CREATE SINK").unwrap();
    let sink = sink.replacen(&bootstrap, &sink_bootstrap, 1).replacen(
        "delivery = 'at_least_once'",
        "delivery = 'at_least_once', properties.message.timeout.ms = '1000'",
        1,
    );
    fs::write(
        dir.path().join("q.sql"),
        format!("{source}CREATE SINK{sink}"),
    )
    .unwrap();
    sink_cluster.broker_down(1).unwrap();
    let stderr_path = dir.path().join("stderr.txt");
    let mut command = Command::new(env!("CARGO_BIN_EXE_vigil"));
    command
        .current_dir(dir.path())
        .args(["run", "q.sql"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&stderr_path).unwrap());
    let mut run = support::spawn(&mut command, "vigil run with its sink's broker down");
    let stderr = || fs::read_to_string(&stderr_path).unwrap_or_default();
    // The broker comes back once the sink reports a result whose delivery
    // timed out.
    let timed_out = wait_until(RUN_LIMIT, || {
        if let Some(status) = run.try_wait().unwrap() {
            panic!(
                "vigil ended ({status}) while the broker was down:\n{}",
                stderr()
            );
        }
        stderr()
            .lines()
            .any(|l| l.contains("was not delivered") && l.contains("timed out"))
    });
    assert!(timed_out, "no delivery timed out:\n{}", stderr());
    sink_cluster.broker_up(1).unwrap();
    let status = run.wait_within(RUN_LIMIT);
    let stderr = stderr();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("timed out"), "{stderr}");
    assert_every_result(&read_topic(&sink_bootstrap, "out"), &stderr);
}

#[test]
fn at_least_once_fails_the_query_once_its_deliveries_keep_failing() {
    let (cluster, _bootstrap, dir) = with_metrics("at_least_once");
    refuse_produce_requests(&cluster, 1000);
    let out = vigil_run(dir.path(), None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("vigil: error") || l.starts_with("error"))
        .unwrap_or_else(|| panic!("no error line in {stderr}"));
    assert!(error.contains("sink out"), "{error}");
    assert!(error.contains("not delivered"), "{error}");
    assert!(error.contains("InvalidRecord"), "{error}");
}

/// Starts `vigil run q.sql` in `dir`, its stderr into `stderr`, guarded.
fn start_run(dir: &Path, stderr: &Path, what: &str) -> support::Guarded {
    support::spawn(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .current_dir(dir)
            .args(["run", "q.sql"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(stderr).unwrap()),
        what,
    )
}

#[test]
fn an_unreachable_broker_is_reported_and_waited_for() {
    // A port nothing listens on: the source retries and warns, and the
    // process stays up until it is stopped.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("q.sql"),
        format!(
            "CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
             WITH (connector = 'kafka', bootstrap = '127.0.0.1:{port}', topic = 'metrics');
             SELECT host, count(*) FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
             GROUP BY window_start, window_end, host;"
        ),
    )
    .unwrap();
    let stderr_path = dir.path().join("stderr.txt");
    let mut child = start_run(
        dir.path(),
        &stderr_path,
        "vigil run with an unreachable broker",
    );
    let warned = wait_until(Duration::from_secs(60), || {
        assert!(
            child.try_wait().unwrap().is_none(),
            "vigil ended: {}",
            fs::read_to_string(&stderr_path).unwrap()
        );
        fs::read_to_string(&stderr_path)
            .unwrap()
            .contains("stream metrics: kafka:")
    });
    child.kill_group();
    assert!(
        warned,
        "no warning: {}",
        fs::read_to_string(&stderr_path).unwrap()
    );
}

#[test]
fn a_live_topic_fires_windows_while_a_partition_stays_empty() {
    // Partition 2 never gets a message: once the consumer reached its end
    // it is idle and does not hold the watermark back, so windows fire
    // while the topic is live (no stop_at).
    let cluster = cluster();
    let bootstrap = cluster.bootstrap_servers();
    let producer = producer(&bootstrap);
    for second in 0..600i64 {
        for p in 0..2 {
            let row = format!(
                r#"{{"ts": {}, "host": "h{p}", "cpu": 1}}"#,
                T0 + second * 1000
            );
            producer
                .send(
                    BaseRecord::<str, str>::to("metrics")
                        .partition(p)
                        .payload(&row),
                )
                .unwrap();
        }
        producer.poll(Duration::ZERO);
    }
    flush(&producer);
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("q.sql"),
        format!(
            "CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE,
               WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
             WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = 'metrics');
             CREATE SINK out WITH (path = 'out.csv', format = 'csv');
             INSERT INTO out SELECT window_start, host, count(*) AS n
             FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
             GROUP BY window_start, window_end, host;"
        ),
    )
    .unwrap();
    let stderr_path = dir.path().join("stderr.txt");
    let mut child = start_run(dir.path(), &stderr_path, "vigil run of a live topic");
    let stderr = || fs::read_to_string(&stderr_path).unwrap_or_default();
    // The data runs from 22:13:20 to 22:23:19: the watermark reaches
    // 22:23:14 and closes the windows from 22:13 to 22:22, 10 per host.
    let out = dir.path().join("out.csv");
    let rows = || fs::read_to_string(&out).map_or(0, |t| t.lines().count().saturating_sub(1));
    let fired = wait_until(Duration::from_secs(60), || {
        assert!(
            child.try_wait().unwrap().is_none(),
            "vigil ended:\n{}",
            stderr()
        );
        rows() >= 20
    });
    assert!(fired, "{} rows:\n{}", rows(), stderr());
    // Nothing more comes: the last window stays open. Stopped by SIGTERM,
    // vigil fires no open window and its sink keeps every row fired
    // before: the file then holds all the run gave while live.
    assert!(child.try_wait().unwrap().is_none(), "vigil ended");
    child.signal(libc::SIGTERM);
    let status = child.wait_within(LEAVE_LIMIT);
    assert!(status.success(), "{status}\n{}", stderr());
    assert!(stderr().contains("vigil: stopped by"), "{}", stderr());
    assert_eq!(
        rows(),
        20,
        "{}",
        fs::read_to_string(&out).unwrap_or_default()
    );
}

/// Rows of `hosts` hosts for seconds `from..to`, keyed by host (so a host
/// stays in one partition), as the scale-out test sends them.
pub(crate) fn produce_hosts(bootstrap: &str, hosts: usize, seconds: std::ops::Range<usize>) {
    let producer = producer(bootstrap);
    for second in seconds {
        for host in 0..hosts {
            let ts = T0 + second as i64 * 1000;
            let row = format!(
                r#"{{"ts": {ts}, "host": "h{host}", "cpu": {}}}"#,
                cpu(host, second)
            );
            let key = format!("h{host}");
            queue(
                &producer,
                BaseRecord::to("metrics")
                    .key(key.as_str())
                    .payload(row.as_str()),
            );
        }
        producer.poll(Duration::ZERO);
    }
    flush(&producer);
}

/// One row per partition an hour after the data, so that every window of
/// the data closes on a live topic; its host starts with `_`.
pub(crate) fn produce_closing_rows(bootstrap: &str, partitions: i32, second: usize) {
    let producer = producer(bootstrap);
    for p in 0..partitions {
        let ts = T0 + (second as i64 + 3600) * 1000;
        let row = format!(r#"{{"ts": {ts}, "host": "_end{p}", "cpu": 0}}"#);
        producer
            .send(
                BaseRecord::<str, str>::to("metrics")
                    .partition(p)
                    .payload(&row),
            )
            .unwrap();
    }
    flush(&producer);
}

/// What the query gives over [`produce_hosts`]' rows of `0..seconds`.
pub(crate) fn expected_hosts(hosts: usize, seconds: usize) -> BTreeMap<(String, i64), (u64, u64)> {
    let mut want = BTreeMap::new();
    for host in 0..hosts {
        for second in 0..seconds {
            let minute = (T0 + second as i64 * 1000) / 60_000 * 60_000;
            let e = want.entry((format!("h{host}"), minute)).or_insert((0, 0));
            e.0 += 1;
            e.1 += cpu(host, second) as u64;
        }
    }
    want
}

/// The data results in `out` so far (not the closing rows').
pub(crate) fn data_results(bootstrap: &str) -> BTreeMap<(String, i64), (u64, u64)> {
    let mut got = results(&read_topic(bootstrap, "out"));
    got.retain(|(host, _), _| !host.starts_with('_'));
    got
}

/// Starts `vigil run q.sql --group cpu --checkpoint-dir ck` in `dir`, its
/// stderr in `<name>.stderr`. The member is killed when the value is
/// dropped: a test that fails leaves none running (they would wait for
/// the brokers the test took with it).
pub(crate) fn member(dir: &Path, name: &str) -> Guarded {
    // Set, it keeps that many checkpoints per query, for a failure's
    // evidence.
    let keep = std::env::var("VIGIL_TEST_KEEP_CHECKPOINTS").unwrap_or_else(|_| "3".into());
    support::spawn(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .current_dir(dir)
            .args([
                "run",
                "q.sql",
                "--group",
                "cpu",
                "--checkpoint-dir",
                "ck",
                "--checkpoint-interval",
                "200ms",
                "--keep-checkpoints",
                &keep,
            ])
            .env_remove("VIGIL_CRASH_AT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.join(format!("{name}.stderr"))).unwrap()),
        &format!("group member {name}"),
    )
}

/// Member `name`'s stderr so far.
fn member_stderr(dir: &Path, name: &str) -> String {
    fs::read_to_string(dir.join(format!("{name}.stderr"))).unwrap_or_default()
}

/// Stops member `name` with SIGTERM: it must leave within [`LEAVE_LIMIT`]
/// and end well. Gives its stderr.
pub(crate) fn terminate(dir: &Path, name: &str, child: &mut Guarded) -> String {
    child.signal(libc::SIGTERM);
    let status = child.wait_within(LEAVE_LIMIT);
    let stderr = member_stderr(dir, name);
    assert!(status.success(), "{name}: {status}\n{stderr}");
    stderr
}

/// The end (next offset) of each of the `partitions` of `topic`.
fn topic_ends(bootstrap: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    (0..partitions)
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("the end of {topic} partition {p}: {e}"))
                .1
        })
        .collect()
}

/// The partitions the member with process id `pid` says it runs, in its
/// status file under `ck/groups/cpu`.
fn member_partitions(ck: &Path, pid: u32) -> Vec<i32> {
    let suffix = format!("-{pid}.json");
    fs::read_dir(ck.join("groups/cpu"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().ends_with(&suffix))
        .filter_map(|f| fs::read_to_string(f.path()).ok())
        .filter_map(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .flat_map(|status| {
            let partitions = status["partitions"].as_array().cloned().unwrap_or_default();
            partitions
                .into_iter()
                .filter_map(|p| p.as_i64().map(|p| p as i32))
        })
        .collect()
}

/// The stream options of one process reading the whole topic once.
const READ_ALL: &str = "stop_at = 'latest', start = 'earliest',";

/// Runs `script` as one process to the end of its input, which must go
/// well: the answer a group's is compared with.
fn run_alone(script: &str) {
    let alone = tempfile::tempdir().unwrap();
    fs::write(alone.path().join("q.sql"), script).unwrap();
    let run = vigil_run(alone.path(), None);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// The complete checkpoints of every query folder under `ck` (not the
/// groups' status folder), oldest first: (id, manifest). One removed by
/// retention while it is read is left out.
fn complete_checkpoints(ck: &Path) -> BTreeMap<String, Vec<(u64, serde_json::Value)>> {
    let mut queries = BTreeMap::new();
    for query in fs::read_dir(ck).into_iter().flatten().flatten() {
        let folder = query.file_name().to_string_lossy().into_owned();
        if folder == "groups" || !query.path().is_dir() {
            continue;
        }
        let mut complete: Vec<(u64, serde_json::Value)> = fs::read_dir(query.path())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|c| {
                let id = c.file_name().to_str()?.strip_prefix("chk-")?.parse().ok()?;
                let text = fs::read_to_string(c.path().join("manifest.json")).ok()?;
                Some((id, serde_json::from_str(&text).ok()?))
            })
            .collect();
        complete.sort_by_key(|(id, _)| *id);
        queries.insert(folder, complete);
    }
    queries
}

/// The query a checkpoint folder is named after (`q%2Eq1-p0`: `q.q1-p0`).
fn query_of_folder(folder: &str) -> String {
    let mut bytes = Vec::new();
    let mut rest = folder.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        match (b, tail.get(..2).and_then(|h| std::str::from_utf8(h).ok())) {
            (b'%', Some(hex)) if u8::from_str_radix(hex, 16).is_ok() => {
                bytes.push(u8::from_str_radix(hex, 16).unwrap());
                rest = &tail[2..];
            }
            _ => {
                bytes.push(b);
                rest = tail;
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The topic and partitions the query of checkpoint folder `folder` reads
/// in group `cpu` over the `partitions` of topic `metrics`: a part per
/// partition (`-p<n>`) reads partition n of `metrics`; the part after a
/// re-partitioning (`-r<n>`) partition n of its exchange; the part over
/// every key (`-global`) every partition of its exchange.
fn reads(folder: &str, partitions: i32) -> Option<(String, Vec<i32>)> {
    let query = query_of_folder(folder);
    if let Some(base) = query.strip_suffix("-global") {
        return Some((format!("cpu-{base}-global"), (0..partitions).collect()));
    }
    let (base, part) = query.rsplit_once('-')?;
    let (kind, n) = part.split_at(1);
    let n: i32 = n.parse().ok()?;
    match kind {
        "p" => Some(("metrics".into(), vec![n])),
        "r" => Some((format!("cpu-{base}-repartition"), vec![n])),
        _ => None,
    }
}

/// What keeps group `cpu` (its checkpoints under `ck`, its brokers at
/// `ends`' cluster) from having committed all it was given: empty once
/// every query's two newest complete checkpoints record the same source
/// positions, at the end of the partitions it reads. A sink commits a
/// checkpoint's transaction before it takes the next barrier, so the
/// older of the two had its results committed, and with nothing read
/// since, the transactions after it hold no rows (no query here fires on
/// processing time). `partitions` is the data topic's.
fn uncommitted(ck: &Path, ends: &BaseConsumer, partitions: i32) -> Vec<String> {
    let mut missing = Vec::new();
    let checkpoints = complete_checkpoints(ck);
    for p in 0..partitions {
        if !checkpoints.keys().any(|f| f.ends_with(&format!("-p{p}"))) {
            missing.push(format!(
                "partition {p}: no pipeline has a checkpoint folder yet"
            ));
        }
    }
    for (folder, complete) in &checkpoints {
        let [.., (older, before), (newest, last)] = complete.as_slice() else {
            missing.push(format!("{folder}: fewer than two complete checkpoints"));
            continue;
        };
        if before["sources"] != last["sources"] {
            missing.push(format!(
                "{folder}: still reading (checkpoints {older} and {newest} differ)"
            ));
            continue;
        }
        let Some((topic, read)) = reads(folder, partitions) else {
            continue;
        };
        let sources = last["sources"].as_array().cloned().unwrap_or_default();
        for p in read {
            let (_, high) = match ends.fetch_watermarks(&topic, p, Duration::from_secs(10)) {
                Ok(ends) => ends,
                Err(e) => {
                    missing.push(format!("{folder}: the end of {topic} partition {p}: {e}"));
                    continue;
                }
            };
            let at = sources
                .iter()
                .find_map(|s| s["position"]["extra"]["offsets"][p.to_string()].as_i64())
                .unwrap_or(0);
            if at != high {
                missing.push(format!(
                    "{folder}: checkpoint {newest} read {topic} partition {p} to {at}, not to its end {high}"
                ));
            }
        }
    }
    missing
}

/// Waits until group `cpu` with its checkpoints in `dir/ck` has committed
/// all it was given (see [`uncommitted`]), at most 90 s; `stderr` gives
/// the members' output for the failure.
///
/// Why the tests wait for this before they SIGKILL or SIGSTOP a member:
/// librdkafka's mock brokers do not implement read_committed (a reader
/// sees a killed producer's open transaction), so a member must not be
/// stopped with rows in an open transaction.
fn wait_until_committed(dir: &Path, bootstrap: &str, partitions: i32, stderr: impl Fn() -> String) {
    let ends: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let ck = dir.join("ck");
    let limit = Duration::from_secs(90);
    let mut missing = Vec::new();
    let committed = wait_until(limit, || {
        missing = uncommitted(&ck, &ends, partitions);
        missing.is_empty()
    });
    assert!(
        committed,
        "the group had not committed all it read within {limit:?}:\n{}\n{}",
        missing.join("\n"),
        stderr()
    );
}

/// Waits until `done` holds, for at most `limit`.
pub(crate) fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    done()
}

/// The scale-out test's script: per host and minute into `<out>`, and an
/// alert with `FOR` into `<alerts>`.
pub(crate) fn group_script(bootstrap: &str, out: &str, alerts: &str, end: &str) -> String {
    format!(
        "CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE,
           WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
         WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = 'metrics', {end}
               properties.session.timeout.ms = '6000',
               properties.heartbeat.interval.ms = '500');
         CREATE SINK out WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = '{out}',
               key = 'host');
         CREATE SINK alerts WITH (connector = 'kafka', bootstrap = '{bootstrap}',
               topic = '{alerts}', key = 'host');
         INSERT INTO out
           SELECT window_start, host, count(*) AS n, sum(cpu) AS total
           FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
           GROUP BY window_start, window_end, host;
         CREATE ALERT hot AS
           SELECT window_end, host, max(cpu) AS max_cpu
           FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE) GROUP BY window_end, host
         ALERT WHEN max_cpu >= 99 FOR 2 WINDOWS;
         INSERT INTO alerts SELECT * FROM hot;"
    )
}

/// The alert rows of the data's hosts in `topic`, sorted.
fn alert_rows(bootstrap: &str, topic: &str) -> Vec<String> {
    let mut rows: Vec<String> = read_topic(bootstrap, topic)
        .into_iter()
        .map(|(_, v)| v)
        .filter(|v| !v.contains("\"_end"))
        .collect();
    rows.sort();
    rows
}

#[test]
fn a_group_of_processes_shares_a_topic_and_survives_a_sigkill() {
    const GROUP_HOSTS: usize = 12;
    const HALF: usize = 1500;
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("metrics", 6, 1).unwrap();
    for topic in ["out", "alerts", "alone_out", "alone_alerts"] {
        cluster.create_topic(topic, 1, 1).unwrap();
    }
    let bootstrap = cluster.bootstrap_servers();
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("q.sql"),
        group_script(&bootstrap, "out", "alerts", ""),
    )
    .unwrap();
    produce_hosts(&bootstrap, GROUP_HOSTS, 0..HALF);
    let mut a = member(dir.path(), "a");
    let mut b = member(dir.path(), "b");
    // Half the data gives results for most of its minutes.
    let first_half = expected_hosts(GROUP_HOSTS, HALF).len() * 3 / 4;
    let stderr =
        |name: &str| fs::read_to_string(dir.path().join(format!("{name}.stderr"))).unwrap();
    let half_done = wait_until(Duration::from_secs(60), || {
        for (name, child) in [("a", &mut *a), ("b", &mut *b)] {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("{name} ended: {status}\n{}", stderr(name));
            }
        }
        data_results(&bootstrap).len() >= first_half
    });
    assert!(
        half_done,
        "no results:\na:\n{}\nb:\n{}",
        stderr("a"),
        stderr("b")
    );
    // Under load the group may still be settling (a member's status
    // shows no partitions between a revocation and the next assignment).
    let list = || {
        let out = support::run_within(
            Command::new(env!("CARGO_BIN_EXE_vigil"))
                .current_dir(dir.path())
                .args(["group", "cpu", "--checkpoint-dir", "ck"]),
            RUN_LIMIT,
            "vigil group cpu",
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let held = |listing: &str| listing.lines().filter(|l| l.contains(" ago")).count();
    let settled = wait_until(Duration::from_secs(30), || held(&list()) == 6);
    let listing = list();
    assert!(settled, "every partition held once:\n{listing}");
    // SIGKILL once the first half's results are committed: librdkafka's
    // mock brokers do not implement read_committed (they show a killed
    // producer's open transaction), so the kill must not land in a
    // transaction with rows.
    wait_until_committed(dir.path(), &bootstrap, 6, || {
        format!("a:\n{}\nb:\n{}", stderr("a"), stderr("b"))
    });
    a.kill_group();
    let mut c = member(dir.path(), "c");
    produce_hosts(&bootstrap, GROUP_HOSTS, HALF..SECONDS);
    produce_closing_rows(&bootstrap, 6, SECONDS);
    let want = expected_hosts(GROUP_HOSTS, SECONDS);
    let complete = wait_until(Duration::from_secs(90), || {
        data_results(&bootstrap).len() >= want.len()
    });
    assert!(
        complete,
        "results missing\nb:\n{}\nc:\n{}",
        stderr("b"),
        stderr("c")
    );
    // Every result once (`results` checks), none missing, none wrong.
    assert_eq!(data_results(&bootstrap), want);
    // The alerts are those one process gives, reading the whole topic.
    run_alone(&group_script(
        &bootstrap,
        "alone_out",
        "alone_alerts",
        READ_ALL,
    ));
    let alerts = alert_rows(&bootstrap, "alerts");
    assert!(alerts.len() > 20, "{alerts:?}");
    assert_eq!(alerts, alert_rows(&bootstrap, "alone_alerts"));
    for (name, child) in [("b", &mut b), ("c", &mut c)] {
        let stderr = terminate(dir.path(), name, child);
        assert!(stderr.contains("left group cpu"), "{stderr}");
    }
}

/// A member that leaves while rows flow stops each pipeline at a checkpoint
/// that commits everything it wrote, so its successor repeats nothing.
/// librdkafka's mock brokers show a producer's aborted transactions: a
/// pipeline cancelled with rows in an open one shows them here twice.
#[test]
fn a_member_that_leaves_while_rows_flow_hands_its_partitions_on_at_a_checkpoint() {
    const GROUP_HOSTS: usize = 12;
    const CHUNK: usize = 60;
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("metrics", 6, 1).unwrap();
    cluster.create_topic("out", 1, 1).unwrap();
    cluster.create_topic("alerts", 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("q.sql"),
        group_script(&bootstrap, "out", "alerts", ""),
    )
    .unwrap();
    produce_hosts(&bootstrap, GROUP_HOSTS, 0..CHUNK);
    let first_chunk = topic_ends(&bootstrap, "metrics", 6);
    let mut a = member(dir.path(), "a");
    let mut b = member(dir.path(), "b");
    let stderr =
        |name: &str| fs::read_to_string(dir.path().join(format!("{name}.stderr"))).unwrap();
    let both_run = wait_until(Duration::from_secs(60), || {
        stderr("a").contains("pipeline started") && stderr("b").contains("pipeline started")
    });
    assert!(both_run, "a:\n{}\nb:\n{}", stderr("a"), stderr("b"));
    // A minute of event time every 100 ms, while `a` leaves. The last ten
    // minutes wait until `a` was told to leave, so that rows still come
    // after it was, however slow the machine.
    let told = Arc::new(AtomicBool::new(false));
    let producing = {
        let bootstrap = bootstrap.clone();
        let told = told.clone();
        std::thread::spawn(move || {
            for from in (CHUNK..SECONDS).step_by(CHUNK) {
                if from == SECONDS - 10 * CHUNK {
                    support::wait_until("member a to be told to leave", RUN_LIMIT, || {
                        told.load(Ordering::Relaxed).then_some(())
                    });
                }
                produce_hosts(&bootstrap, GROUP_HOSTS, from..from + CHUNK);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // `a` leaves once a pipeline of its has checkpointed rows produced
    // after the first minute: rows flow through it.
    let pid = a.id();
    let flowing = wait_until(Duration::from_secs(60), || {
        let checkpoints = complete_checkpoints(&dir.path().join("ck"));
        member_partitions(&dir.path().join("ck"), pid)
            .iter()
            .any(|&p| {
                checkpoints
                    .iter()
                    .filter(|(folder, _)| folder.ends_with(&format!("-p{p}")))
                    .filter_map(|(_, complete)| complete.last())
                    .any(|(_, manifest)| {
                        manifest["sources"][0]["position"]["extra"]["offsets"][p.to_string()]
                            .as_i64()
                            .is_some_and(|at| at > first_chunk[p as usize])
                    })
            })
    });
    assert!(flowing, "no rows flow through a:\n{}", stderr("a"));
    a.signal(libc::SIGTERM);
    told.store(true, Ordering::Relaxed);
    let status = a.wait_within(LEAVE_LIMIT);
    assert!(status.success(), "a: {status}\n{}", stderr("a"));
    assert!(
        stderr("a").contains("pipeline stopped at a checkpoint")
            && !stderr("a").contains("pipeline cancelled"),
        "{}",
        stderr("a")
    );
    producing.join().unwrap();
    produce_closing_rows(&bootstrap, 6, SECONDS);
    let want = expected_hosts(GROUP_HOSTS, SECONDS);
    let complete = wait_until(Duration::from_secs(90), || {
        data_results(&bootstrap).len() >= want.len()
    });
    assert!(complete, "results missing\nb:\n{}", stderr("b"));
    // Every result once (`results` checks), none missing, none wrong.
    assert_eq!(data_results(&bootstrap), want);
    terminate(dir.path(), "b", &mut b);
}

/// A member that stalls longer than its session (SIGSTOP) loses its
/// partitions to the other member; woken (SIGCONT), it cancels their
/// pipelines with no last checkpoint, since the new owner may already run
/// them, and stays in the group. The stall is between two bursts of rows:
/// librdkafka's mock brokers would show the rows of a transaction the
/// stalled member left open.
#[test]
fn a_member_that_stalls_past_its_session_gives_its_partitions_up_and_goes_on() {
    const GROUP_HOSTS: usize = 12;
    const HALF: usize = SECONDS / 2;
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("metrics", 6, 1).unwrap();
    cluster.create_topic("out", 1, 1).unwrap();
    cluster.create_topic("alerts", 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("q.sql"),
        group_script(&bootstrap, "out", "alerts", ""),
    )
    .unwrap();
    produce_hosts(&bootstrap, GROUP_HOSTS, 0..HALF);
    let mut a = member(dir.path(), "a");
    let mut b = member(dir.path(), "b");
    let stderr =
        |name: &str| fs::read_to_string(dir.path().join(format!("{name}.stderr"))).unwrap();
    let first_half = expected_hosts(GROUP_HOSTS, HALF).len() - GROUP_HOSTS;
    let both_run = wait_until(Duration::from_secs(90), || {
        data_results(&bootstrap).len() >= first_half
    });
    assert!(both_run, "a:\n{}\nb:\n{}", stderr("a"), stderr("b"));
    // Stopped with rows in an open transaction, `a` would leave them for
    // the mock brokers' readers to see (no read_committed there).
    wait_until_committed(dir.path(), &bootstrap, 6, || {
        format!("a:\n{}\nb:\n{}", stderr("a"), stderr("b"))
    });
    let count = |name: &str, what: &str| stderr(name).matches(what).count();
    let held_by_a = count("a", "pipeline started") - count("a", "pipeline stopped");
    let started_by_b = count("b", "pipeline started");
    assert!(held_by_a > 0, "a:\n{}\nb:\n{}", stderr("a"), stderr("b"));
    a.signal(libc::SIGSTOP);
    // b takes a's partitions once a's session (6 s) is over.
    let taken = wait_until(Duration::from_secs(60), || {
        count("b", "pipeline started") >= started_by_b + held_by_a
    });
    a.signal(libc::SIGCONT);
    assert!(taken, "b:\n{}", stderr("b"));
    let lost = wait_until(Duration::from_secs(30), || {
        stderr("a").contains("lost (this member's session timed out)")
    });
    assert!(lost, "a:\n{}", stderr("a"));
    assert!(a.try_wait().unwrap().is_none(), "a ended:\n{}", stderr("a"));
    produce_hosts(&bootstrap, GROUP_HOSTS, HALF..SECONDS);
    produce_closing_rows(&bootstrap, 6, SECONDS);
    let want = expected_hosts(GROUP_HOSTS, SECONDS);
    let complete = wait_until(Duration::from_secs(90), || {
        data_results(&bootstrap).len() >= want.len()
    });
    assert!(
        complete,
        "results missing\na:\n{}\nb:\n{}",
        stderr("a"),
        stderr("b")
    );
    // Every result once (`results` checks), none missing, none wrong.
    assert_eq!(data_results(&bootstrap), want);
    for (name, child) in [("a", &mut a), ("b", &mut b)] {
        terminate(dir.path(), name, child);
    }
}

#[test]
fn a_group_refuses_queries_it_would_answer_in_part() {
    let dir = tempfile::tempdir().unwrap();
    let stream = "CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
         WITH (connector = 'kafka', bootstrap = '127.0.0.1:9', topic = 'metrics');
         CREATE STREAM local (ts TIMESTAMP, host TEXT, WATERMARK FOR ts AS ts) WITH (path = 'l.csv');";
    for (query, want) in [
        (
            "SELECT window_start, count(*) AS n FROM (
               SELECT window_start, window_end, host FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
               UNION ALL
               SELECT window_start, window_end, host FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
             ) GROUP BY window_start, window_end;",
            "after merging several streams",
        ),
        (
            "SELECT host, count(*) FROM TUMBLE(local, ts, INTERVAL '1' MINUTE)
             GROUP BY window_start, window_end, host;",
            "stream local, which is not a kafka stream",
        ),
        (
            "CREATE STREAM scattered (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
               WITH (connector = 'kafka', bootstrap = '127.0.0.1:9', topic = 'metrics',
                     partitioned_by = 'none');
             CREATE VIEW per_host AS SELECT window_end, host, avg(cpu) AS a
               FROM TUMBLE(scattered, ts, INTERVAL '1' MINUTE) GROUP BY window_end, host;
             SELECT host, robust_z(a) OVER (PARTITION BY window_end) AS z FROM per_host;",
            "re-partitioned by host and it keeps state over every key",
        ),
        (
            "CREATE STREAM odd (ts TIMESTAMP, host TEXT, WATERMARK FOR ts AS ts)
               WITH (connector = 'kafka', bootstrap = '127.0.0.1:9', topic = 'metrics',
                     partitioned_by = 'hots');",
            "bad value 'hots' for option 'partitioned_by'",
        ),
    ] {
        fs::write(dir.path().join("l.csv"), "ts,host\n").unwrap();
        fs::write(dir.path().join("q.sql"), format!("{stream}\n{query}")).unwrap();
        let out = run_script(dir.path(), &["--group", "g", "--checkpoint-dir", "ck"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(want), "{stderr}");
    }
}

/// Rows of `hosts` hosts for seconds `from..to`, each second's row of a
/// host in another partition of `partitions`: not keyed by host.
fn produce_scattered(
    bootstrap: &str,
    hosts: usize,
    partitions: usize,
    seconds: std::ops::Range<usize>,
) {
    let producer = producer(bootstrap);
    for second in seconds {
        for host in 0..hosts {
            let ts = T0 + second as i64 * 1000;
            let row = format!(
                r#"{{"ts": {ts}, "host": "h{host}", "cpu": {}}}"#,
                cpu(host, second)
            );
            let partition = ((host + second) % partitions) as i32;
            queue(
                &producer,
                BaseRecord::to("metrics")
                    .partition(partition)
                    .payload(row.as_str()),
            );
        }
        producer.poll(Duration::ZERO);
    }
    flush(&producer);
}

#[test]
fn a_group_re_partitions_a_topic_keyed_otherwise_than_its_query() {
    const GROUP_HOSTS: usize = 12;
    const HALF: usize = 600;
    const SECONDS_HERE: usize = 1200;
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("metrics", 6, 1).unwrap();
    cluster.create_topic("out", 1, 1).unwrap();
    // The mock brokers do not create topics for clients: the exchange's.
    cluster.create_topic("cpu-q.q1-repartition", 6, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE,
           WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
         WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = 'metrics',
               partitioned_by = 'none',
               properties.session.timeout.ms = '6000',
               properties.heartbeat.interval.ms = '500');
         CREATE SINK out WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = 'out',
               key = 'host');
         INSERT INTO out
           SELECT window_start, host, count(*) AS n, sum(cpu) AS total
           FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
           GROUP BY window_start, window_end, host;"
    );
    fs::write(dir.path().join("q.sql"), script).unwrap();
    produce_scattered(&bootstrap, GROUP_HOSTS, 6, 0..HALF);
    let mut a = member(dir.path(), "a");
    let mut b = member(dir.path(), "b");
    let stderr =
        |name: &str| fs::read_to_string(dir.path().join(format!("{name}.stderr"))).unwrap();
    // Each host's minute is in six partitions: only re-partitioned by host
    // does a result count all 60 rows.
    let first_half = expected_hosts(GROUP_HOSTS, HALF - 60).len();
    let half_done = wait_until(Duration::from_secs(60), || {
        for (name, child) in [("a", &mut *a), ("b", &mut *b)] {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("{name} ended: {status}\n{}", stderr(name));
            }
        }
        data_results(&bootstrap).len() >= first_half
    });
    assert!(
        half_done,
        "no results:\na:\n{}\nb:\n{}",
        stderr("a"),
        stderr("b")
    );
    // SIGKILL once all is committed: the mock brokers show a killed
    // producer's open transaction (no read_committed), so it must hold no
    // rows.
    wait_until_committed(dir.path(), &bootstrap, 6, || {
        format!("a:\n{}\nb:\n{}", stderr("a"), stderr("b"))
    });
    a.kill_group();
    let mut c = member(dir.path(), "c");
    produce_scattered(&bootstrap, GROUP_HOSTS, 6, HALF..SECONDS_HERE);
    produce_closing_rows(&bootstrap, 6, SECONDS_HERE);
    let want = expected_hosts(GROUP_HOSTS, SECONDS_HERE);
    let complete = wait_until(Duration::from_secs(90), || {
        data_results(&bootstrap).len() >= want.len()
    });
    assert!(
        complete,
        "results missing: {} of {}\nb:\n{}\nc:\n{}",
        data_results(&bootstrap).len(),
        want.len(),
        stderr("b"),
        stderr("c")
    );
    // Every result once (`results` checks), none missing, none wrong.
    assert_eq!(data_results(&bootstrap), want);
    for (name, child) in [("b", &mut b), ("c", &mut c)] {
        terminate(dir.path(), name, child);
    }
}

/// The script of the test of queries over every key: per minute over all
/// hosts into `<totals>`, and a peer alert (each host's 10 s mean against
/// the hosts of the same window) into `<peers>`.
fn global_script(bootstrap: &str, totals: &str, peers: &str, end: &str) -> String {
    format!(
        "CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE,
           WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
         WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = 'metrics', {end}
               properties.session.timeout.ms = '6000',
               properties.heartbeat.interval.ms = '500');
         CREATE SINK totals WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = '{totals}');
         CREATE SINK peers WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = '{peers}',
               key = 'host');
         INSERT INTO totals
           SELECT window_start, count(*) AS n, sum(cpu) AS total
           FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
           GROUP BY window_start, window_end;
         CREATE VIEW per_host AS
           SELECT window_end, host, avg(cpu) AS avg_cpu
           FROM TUMBLE(metrics, ts, INTERVAL '10' SECOND) GROUP BY window_end, host;
         CREATE ALERT outlier AS
           SELECT window_end, host, avg_cpu, robust_z(avg_cpu) OVER (PARTITION BY window_end) AS z
           FROM per_host
         ALERT WHEN abs(z) > 1.5 FOR 2 WINDOWS;
         INSERT INTO peers SELECT * FROM outlier;"
    )
}

/// The messages of `topic` about the data (not the closing rows), sorted.
fn data_rows(bootstrap: &str, topic: &str, seconds: usize) -> Vec<String> {
    let end = chrono::DateTime::from_timestamp_millis(T0 + seconds as i64 * 1000)
        .unwrap()
        .naive_utc()
        .format("%Y-%m-%dT%H:%M:%S")
        .to_string();
    let mut rows: Vec<String> = read_topic(bootstrap, topic)
        .into_iter()
        .map(|(_, v)| v)
        .filter(|v| !v.contains("\"_end"))
        .filter(|v| {
            let row: serde_json::Value = serde_json::from_str(v).unwrap();
            let at = row["window_start"]
                .as_str()
                .or(row["event_time"].as_str())
                .unwrap()
                .to_string();
            at < end
        })
        .collect();
    rows.sort();
    rows
}

#[test]
fn a_group_answers_queries_over_every_key_once_whatever_its_processes() {
    const GROUP_HOSTS: usize = 12;
    const SECONDS_HERE: usize = 1200;
    const HALF: usize = 600;
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("metrics", 6, 1).unwrap();
    for topic in ["totals", "peers", "alone_totals", "alone_peers"] {
        cluster.create_topic(topic, 1, 1).unwrap();
    }
    // The mock brokers do not create topics for clients: the exchanges'.
    for query in ["q.q1", "q.q3"] {
        cluster
            .create_topic(&format!("cpu-{query}-global"), 6, 1)
            .unwrap();
    }
    let bootstrap = cluster.bootstrap_servers();
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("q.sql"),
        global_script(&bootstrap, "totals", "peers", ""),
    )
    .unwrap();
    produce_hosts(&bootstrap, GROUP_HOSTS, 0..HALF);
    let mut a = member(dir.path(), "a");
    let mut b = member(dir.path(), "b");
    let stderr =
        |name: &str| fs::read_to_string(dir.path().join(format!("{name}.stderr"))).unwrap();
    // The minutes of the first half that close (22:13 to 22:22; 22:23 waits
    // for the second half).
    let first_half_minutes = 10;
    let first_half = wait_until(Duration::from_secs(60), || {
        for (name, child) in [("a", &mut *a), ("b", &mut *b)] {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("{name} ended: {status}\n{}", stderr(name));
            }
        }
        data_rows(&bootstrap, "totals", SECONDS_HERE).len() >= first_half_minutes
    });
    assert!(
        first_half,
        "no totals:\na:\n{}\nb:\n{}",
        stderr("a"),
        stderr("b")
    );
    // SIGKILL once the first half's results are committed, through the
    // exchanges too: librdkafka's mock brokers do not implement
    // read_committed (they show a killed producer's open transaction), so
    // the kill must not land in a transaction with rows. With the first
    // half read, every pipeline only commits empty ones.
    wait_until_committed(dir.path(), &bootstrap, 6, || {
        format!("a:\n{}\nb:\n{}", stderr("a"), stderr("b"))
    });
    a.kill_group();
    let mut c = member(dir.path(), "c");
    produce_hosts(&bootstrap, GROUP_HOSTS, HALF..SECONDS_HERE);
    produce_closing_rows(&bootstrap, 6, SECONDS_HERE);
    // One process reading the whole topic gives the answer to compare.
    run_alone(&global_script(
        &bootstrap,
        "alone_totals",
        "alone_peers",
        READ_ALL,
    ));
    let totals = data_rows(&bootstrap, "alone_totals", SECONDS_HERE);
    let mut minutes: BTreeMap<i64, (u64, u64)> = BTreeMap::new();
    for ((_, minute), (n, total)) in expected_hosts(GROUP_HOSTS, SECONDS_HERE) {
        let e = minutes.entry(minute).or_default();
        e.0 += n;
        e.1 += total;
    }
    let want: Vec<(u64, u64)> = minutes.into_values().collect();
    let got: Vec<(u64, u64)> = totals
        .iter()
        .map(|t| {
            let row: serde_json::Value = serde_json::from_str(t).unwrap();
            (
                row["n"].as_u64().unwrap(),
                row["total"].as_f64().unwrap() as u64,
            )
        })
        .collect();
    assert_eq!(got, want, "{totals:?}");
    let peers = data_rows(&bootstrap, "alone_peers", SECONDS_HERE);
    assert!(peers.len() > 5, "the peer alert fires: {peers:?}");
    let complete = wait_until(Duration::from_secs(90), || {
        data_rows(&bootstrap, "totals", SECONDS_HERE).len() >= totals.len()
            && data_rows(&bootstrap, "peers", SECONDS_HERE).len() >= peers.len()
    });
    let missing = |got: &[String], want: &[String]| -> Vec<String> {
        want.iter().filter(|w| !got.contains(w)).cloned().collect()
    };
    let (got_totals, got_peers) = (
        data_rows(&bootstrap, "totals", SECONDS_HERE),
        data_rows(&bootstrap, "peers", SECONDS_HERE),
    );
    // Each once, none missing, none different.
    if !complete || got_totals != totals || got_peers != peers {
        let said = format!(
            "results differ: totals {:?} of {} missing (and {:?} not of one process's), peers {:?} of {} missing (and {:?} not of one process's)\nb:\n{}\nc:\n{}\nwhere the parts over every key stand:\n{}",
            missing(&got_totals, &totals),
            totals.len(),
            missing(&totals, &got_totals),
            missing(&got_peers, &peers),
            peers.len(),
            missing(&peers, &got_peers),
            stderr("b"),
            stderr("c"),
            exchange_positions(&dir.path().join("ck"))
        );
        for member in [&mut b, &mut c] {
            member.kill_group();
        }
        let kept = keep_evidence(
            dir,
            &bootstrap,
            &["cpu-q.q1-global", "cpu-q.q3-global"],
            6,
            "T22:33",
        );
        panic!("{said}\nthe exchange's messages: {kept}");
    }
    for (name, child) in [("b", &mut b), ("c", &mut c)] {
        terminate(dir.path(), name, child);
    }
}

/// The newest checkpoint's source position of each `-global` query under
/// `ck`, for a failure message.
fn exchange_positions(ck: &Path) -> String {
    let mut out = String::new();
    for entry in fs::read_dir(ck).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with("-global") {
            continue;
        }
        let mut checkpoints: Vec<_> = fs::read_dir(entry.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        checkpoints.sort();
        let Some(last) = checkpoints.last() else {
            continue;
        };
        let manifest = fs::read_to_string(last.join("manifest.json")).unwrap_or_default();
        let manifest: serde_json::Value = serde_json::from_str(&manifest).unwrap_or_default();
        out.push_str(&format!(
            "{name} {}: {}\n",
            last.display(),
            manifest["sources"]
        ));
    }
    out
}

/// Keeps `dir` (the members' stderr and checkpoints) and writes into it
/// every message of the internal topic `topic` (`partitions` of them) and
/// the rows that came more than once, for a failure message: the path.
fn keep_evidence(
    dir: tempfile::TempDir,
    bootstrap: &str,
    topics: &[&str],
    partitions: i32,
    mark: &str,
) -> String {
    use datafusion::arrow::ipc::reader::StreamReader;
    use datafusion::arrow::util::display::array_value_to_string;
    use rdkafka::message::Headers;
    let path = dir.keep();
    let mut files = Vec::new();
    for topic in topics {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "test-evidence")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut lines = Vec::new();
        let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for p in 0..partitions {
            let Ok((_, high)) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10)) else {
                continue;
            };
            let mut list = TopicPartitionList::new();
            list.add_partition_offset(topic, p, Offset::Beginning)
                .unwrap();
            consumer.assign(&list).unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut next = 0;
            while next < high && Instant::now() < deadline {
                let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) else {
                    continue;
                };
                next = m.offset() + 1;
                let at = format!("p{p} o{}", m.offset());
                let headers: Vec<String> = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| {
                                format!(
                                    "{}={}",
                                    h.key,
                                    String::from_utf8_lossy(h.value.unwrap_or_default())
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let mut rows = 0;
                let mut marked = Vec::new();
                if let Some(payload) = m.payload().filter(|p| !p.is_empty())
                    && let Ok(reader) = StreamReader::try_new(std::io::Cursor::new(payload), None)
                {
                    for batch in reader.flatten() {
                        for row in 0..batch.num_rows() {
                            let text: Vec<String> = batch
                                .columns()
                                .iter()
                                .map(|c| array_value_to_string(c, row).unwrap_or_default())
                                .collect();
                            let text = text.join(",");
                            if text.contains(mark) {
                                marked.push(text.clone());
                            }
                            seen.entry(text).or_default().push(at.clone());
                            rows += 1;
                        }
                    }
                }
                lines.push(format!(
                    "{at} {} rows={rows} {}",
                    headers.join(" "),
                    marked.join("; ")
                ));
            }
            // Evidence for a failure already reported: what was read is
            // kept, and said to be partial.
            if next < high {
                lines.push(format!(
                    "p{p}: read to offset {next} of {high} within 30 s, the rest is missing here"
                ));
            }
        }
        lines.push("rows more than once:".into());
        for (row, places) in seen.iter().filter(|(_, places)| places.len() > 1) {
            lines.push(format!("{row} at {places:?}"));
        }
        let file = path.join(format!("{topic}.txt"));
        fs::write(&file, lines.join("\n")).unwrap();
        files.push(file.display().to_string());
    }
    files.join(", ")
}

#[test]
fn transactions_whose_commit_fails_for_a_while_still_deliver_each_result_once() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let (cluster, bootstrap, dir) = with_metrics("exactly_once");
    // The transaction coordinator answers the first commits with errors a
    // client must retry through (librdkafka finds the coordinator again).
    cluster.request_errors(
        RDKafkaApiKey::EndTxn,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
        ],
    );
    let out = vigil_run(dir.path(), None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(results(&read_topic(&bootstrap, "out")), expected());
}
