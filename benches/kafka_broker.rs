//! The scale-out scenario at full size, against librdkafka's mock cluster
//! or a real Kafka-compatible broker: started by `tests/kafka_broker.sh`,
//! which documents how to run it.
//!
//! A 6-partition topic of `KAFKA_ROWS` metric rows (default 2,000,000: one
//! row a second for each of 1,000 hosts, JSON, keyed by host, compressed)
//! is produced first. Three `vigil run --group` processes then run Q1 (the
//! 10-second per-host average, max and count) and an alert with `FOR 2
//! WINDOWS` into exactly-once Kafka sinks; once half of Q1's results are
//! committed, one process is killed with SIGKILL, and a fourth joins once
//! the survivors have taken over its partitions. Finally one process runs
//! the same script over the whole topic. The read_committed outputs must
//! be equal, row for row, with no duplicates, and Q1's must equal what
//! the data gives, computed here.
//!
//! - `KAFKA_BOOTSTRAP=host:port`: the broker to use; without it, a mock
//!   cluster served by this process. Topics are created here (names with a
//!   per-run suffix, so a broker can be reused).
//! - `VIGIL_BIN`: the `vigil` binary (default `target/release/vigil` under
//!   `CARGO_TARGET_DIR`).
//! - `KAFKA_ROWS`, `KAFKA_COMPRESSION` (producer and sink
//!   `compression.type`, default `gzip`), `KAFKA_CHECKPOINT` (the
//!   processes' `--checkpoint-interval`, default `1s`), `KAFKA_DELIVERY`
//!   (the sinks' `delivery`, default `exactly_once`; with `at_least_once`
//!   exact copies of a row are allowed, for brokers without transactions).
//!
//! librdkafka's mock cluster keeps at most 5 MB and 100,000 message sets
//! per partition (`rdkafka_mock.c`) and drops the oldest beyond that;
//! compression keeps 2M rows within it, and the harness checks that every
//! partition still starts at offset 0 and holds every message.
//!
//! It prints the figures and `PASS`, or `FAIL` with what differs (and
//! exits 1).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

/// Event time of the first row, epoch ms.
const T0: i64 = 1_700_000_000_000;
const HOSTS: u64 = 1000;
const PARTITIONS: i32 = 6;
/// Partitions of each output topic (the sinks key by host).
const OUT_PARTITIONS: i32 = 6;
/// The longest the single process may take to read the whole topic.
const ALONE_LIMIT: Duration = Duration::from_secs(600);

/// The longest a phase may go without progress.
const STALL_LIMIT: Duration = Duration::from_secs(120);

/// What the run is given, from the environment.
struct Setup {
    rows: u64,
    vigil: PathBuf,
    compression: String,
    checkpoint: String,
    /// The sinks' `delivery`.
    delivery: String,
    /// The broker, when it is not the mock cluster.
    external: Option<String>,
    /// Appended to topic and group names.
    suffix: String,
}

impl Setup {
    fn from_env() -> Setup {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let rows = var("KAFKA_ROWS").map_or(2_000_000, |v| {
            v.parse()
                .unwrap_or_else(|_| fail(&format!("KAFKA_ROWS={v} is not a number")))
        });
        let vigil = var("VIGIL_BIN").map_or_else(
            || {
                let target = var("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
                Path::new(&target).join("release").join("vigil")
            },
            PathBuf::from,
        );
        if !vigil.exists() {
            fail(&format!(
                "{} does not exist: build it with `cargo build --release` or set VIGIL_BIN",
                vigil.display()
            ));
        }
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Setup {
            rows,
            vigil,
            compression: var("KAFKA_COMPRESSION").unwrap_or_else(|| "gzip".into()),
            checkpoint: var("KAFKA_CHECKPOINT").unwrap_or_else(|| "1s".into()),
            delivery: var("KAFKA_DELIVERY").unwrap_or_else(|| "exactly_once".into()),
            external: var("KAFKA_BOOTSTRAP"),
            suffix: format!("{}", started.as_secs()),
        }
    }

    fn topic(&self, name: &str) -> String {
        format!("{name}-{}", self.suffix)
    }
}

/// Prints why the run cannot go on and exits 1.
fn fail(why: &str) -> ! {
    println!("FAIL: {why}");
    std::process::exit(1);
}

fn main() {
    let setup = Setup::from_env();
    let mock = match setup.external {
        Some(_) => None,
        None => Some(MockCluster::new(1).unwrap_or_else(|e| fail(&format!("mock cluster: {e}")))),
    };
    let bootstrap = match (&setup.external, &mock) {
        (Some(b), _) => b.clone(),
        (None, Some(m)) => m.bootstrap_servers(),
        (None, None) => unreachable!("a mock cluster without an external broker"),
    };
    let broker = setup
        .external
        .as_ref()
        .map_or("librdkafka mock cluster".to_string(), |b| {
            format!("broker {b}")
        });
    println!("scale-out scenario: {} rows, {broker}", setup.rows);
    let topics = Topics::new(&setup);
    let create = |name: &str, partitions: i32| match &mock {
        None => create_topic(&bootstrap, name, partitions),
        Some(m) => m
            .create_topic(name, partitions, 1)
            .unwrap_or_else(|e| fail(&format!("creating {name}: {e}"))),
    };
    create(&topics.metrics, PARTITIONS);
    for out in topics.outputs() {
        create(out, OUT_PARTITIONS);
    }
    create(&topics.probe, 1);
    let transactions = probe_transactions(&bootstrap, &topics.probe);
    match &transactions {
        Transactions::Isolated => {
            println!("a read_committed reader does not see an aborted transaction's message")
        }
        Transactions::AbortedVisible => {
            println!("a read_committed reader sees an aborted transaction's message")
        }
        Transactions::Broken(why) => println!("{why}"),
    }
    run(&setup, &bootstrap, &topics, &transactions);
}

/// Produces the data, runs the group and the single process, and says
/// whether they agree.
fn run(setup: &Setup, bootstrap: &str, topics: &Topics, transactions: &Transactions) {
    let exactly_once = setup.delivery != "at_least_once";
    if let (Transactions::Broken(why), true) = (transactions, exactly_once) {
        // Whatever happens next, the broker is not one exactly-once
        // delivery can be checked on.
        println!("(FAIL to come: {why})");
    }
    let aborted_visible = matches!(transactions, Transactions::AbortedVisible);
    let mut figures = Figures::default();
    let started = Instant::now();
    produce_metrics(bootstrap, setup, &topics.metrics);
    figures.produce = started.elapsed().as_secs_f64();
    check_kept(bootstrap, &topics.metrics, setup.rows + PARTITIONS as u64);
    let want = expected_q1(setup.rows);
    println!(
        "produced {} rows in {:.1} s ({:.0} rows/s); Q1 gives {} results",
        setup.rows,
        figures.produce,
        setup.rows as f64 / figures.produce,
        want.len()
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| fail(&format!("temporary dir: {e}")));
    let group = run_group(setup, bootstrap, topics, dir.path(), &want, &mut figures);
    let alone = run_alone(setup, bootstrap, topics, &mut figures);
    for out in topics.outputs() {
        check_kept(bootstrap, out, 0);
    }
    figures.print(setup.rows);
    let mut problems = compare(&group, &alone, &want, &figures.killed_partitions);
    if let (Transactions::Broken(why), true) = (transactions, exactly_once) {
        problems.push(why.clone());
    }
    if aborted_visible {
        // This broker lets a reader see what a killed process's open
        // transaction had written: such copies show the broker's
        // weakness, not vigil's, so they are counted and checked to be
        // exact copies from the killed process's partitions (`compare`),
        // and do not fail the run.
        problems.retain(|p| !p.starts_with(ABORTED));
    }
    if !exactly_once {
        // Rows after a moved partition's last checkpoint are produced
        // again by its new owner: exact copies are the contract.
        problems.retain(|p| !p.starts_with(ABORTED) && !p.starts_with(COPIES));
    }
    if problems.is_empty() {
        let exactly = if !exactly_once {
            "at least once each (exact copies removed)"
        } else if aborted_visible {
            "once each after removing the exact copies this broker shows"
        } else {
            "no duplicates"
        };
        println!(
            "PASS: {} Q1 results and {} alert rows, equal to one process's and to the data's, {exactly}, none missing",
            want.len(),
            alone.alerts.len()
        );
    }
    for p in &problems {
        println!("FAIL: {p}");
    }
    if !problems.is_empty() || std::env::var_os("KAFKA_KEEP").is_some() {
        println!("the processes' files are kept in {}", dir.keep().display());
    }
    if !problems.is_empty() {
        std::process::exit(1);
    }
}

/// The run's topic names.
struct Topics {
    metrics: String,
    q1: String,
    alerts: String,
    alone_q1: String,
    alone_alerts: String,
    /// Where the broker's transactions are tried.
    probe: String,
}

impl Topics {
    fn new(setup: &Setup) -> Topics {
        Topics {
            metrics: setup.topic("metrics"),
            q1: setup.topic("q1"),
            alerts: setup.topic("alerts"),
            alone_q1: setup.topic("alone-q1"),
            alone_alerts: setup.topic("alone-alerts"),
            probe: setup.topic("probe"),
        }
    }

    fn outputs(&self) -> [&String; 4] {
        [&self.q1, &self.alerts, &self.alone_q1, &self.alone_alerts]
    }
}

/// Seconds of each phase, and the moves.
#[derive(Default)]
struct Figures {
    produce: f64,
    /// From starting the three processes until half of Q1 is committed.
    first_half: f64,
    /// From the SIGKILL until every partition of the killed process ran
    /// again in a survivor.
    takeover: f64,
    /// From the fourth process's start until a pipeline ran in it.
    join: f64,
    /// From starting the three processes until all of Q1 was committed.
    group: f64,
    alone: f64,
    killed_partitions: Vec<i32>,
    joined_partitions: Vec<i32>,
}

impl Figures {
    fn print(&self, rows: u64) {
        let rate = |s: f64| rows as f64 / s;
        println!("| phase | seconds | rows/s |");
        println!("|---|---:|---:|");
        println!(
            "| produce {rows} rows | {:.1} | {:.0} |",
            self.produce,
            rate(self.produce)
        );
        println!(
            "| 3 processes, until half of Q1 is committed | {:.1} | |",
            self.first_half
        );
        println!(
            "| SIGKILL until its partitions {:?} ran in the survivors | {:.1} | |",
            self.killed_partitions, self.takeover
        );
        println!(
            "| fourth process: start until its first pipeline ran (partitions {:?}) | {:.1} | |",
            self.joined_partitions, self.join
        );
        println!(
            "| group, start until all of Q1 is committed | {:.1} | {:.0} |",
            self.group,
            rate(self.group)
        );
        println!(
            "| one process, the whole topic (`stop_at = 'latest'`) | {:.1} | {:.0} |",
            self.alone,
            rate(self.alone)
        );
    }
}

fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap_or_else(|e| fail(&format!("admin client: {e}")));
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = futures::executor::block_on(admin.create_topics([&topic], &options))
        .unwrap_or_else(|e| fail(&format!("creating topic {name}: {e}")));
    for result in results {
        if let Err((topic, code)) = result {
            fail(&format!("creating topic {topic}: {code}"));
        }
    }
}

fn producer(bootstrap: &str, compression: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "50")
        .set("batch.size", "1000000")
        .set("compression.type", compression)
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create()
        .unwrap_or_else(|e| fail(&format!("producer: {e}")))
}

fn send(producer: &BaseProducer, topic: &str, key: &str, payload: &str, partition: Option<i32>) {
    loop {
        let mut record = BaseRecord::<str, str>::to(topic).key(key).payload(payload);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        match producer.send(record) {
            Ok(()) => return,
            Err((e, _))
                if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) =>
            {
                producer.poll(Duration::from_millis(10));
            }
            Err((e, _)) => fail(&format!("producing to {topic}: {e}")),
        }
    }
}

/// The cpu of `host` at `second`.
fn cpu(host: u64, second: u64) -> u64 {
    (host * 7 + second * 13) % 100
}

/// `rows` rows over [`HOSTS`] hosts, one a second each, keyed by host (host
/// `hN` in partition `N % 6`, so a result's partition is known); then
/// a row per partition an hour later, so every window of the data closes.
fn produce_metrics(bootstrap: &str, setup: &Setup, topic: &str) {
    let producer = producer(bootstrap, &setup.compression);
    for i in 0..setup.rows {
        let (second, host) = (i / HOSTS, i % HOSTS);
        let ts = T0 + second as i64 * 1000;
        let row = format!(
            r#"{{"ts":{ts},"host":"h{host}","cpu":{}}}"#,
            cpu(host, second)
        );
        let partition = (host % PARTITIONS as u64) as i32;
        send(&producer, topic, &format!("h{host}"), &row, Some(partition));
    }
    let end = T0 + (setup.rows / HOSTS) as i64 * 1000 + 3_600_000;
    for p in 0..PARTITIONS {
        let row = format!(r#"{{"ts":{end},"host":"_end{p}","cpu":0}}"#);
        send(&producer, topic, "_end", &row, Some(p));
    }
    producer
        .flush(Duration::from_secs(300))
        .unwrap_or_else(|e| fail(&format!("flushing {topic}: {e}")));
}

fn partitions_of(consumer: &BaseConsumer, topic: &str) -> Vec<i32> {
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap_or_else(|e| fail(&format!("metadata of {topic}: {e}")));
    metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect()
}

/// Fails unless every partition of `topic` still has its first message
/// and, when `messages` is not 0, the partitions hold that many in all
/// (the mock cluster drops the oldest beyond its limits).
fn check_kept(bootstrap: &str, topic: &str, messages: u64) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap_or_else(|e| fail(&format!("consumer: {e}")));
    let mut total = 0;
    for p in partitions_of(&consumer, topic) {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .unwrap_or_else(|e| fail(&format!("offsets of {topic} [{p}]: {e}")));
        if low != 0 {
            fail(&format!(
                "partition {p} of {topic} dropped its first {low} of {high} messages: fewer rows (KAFKA_ROWS) or more compression"
            ));
        }
        total += high as u64;
    }
    if messages != 0 && total != messages {
        // Lost messages, or end offsets that are wrong: a reader tells.
        let mut reader = Reader::new(bootstrap, topic);
        reader.read_to_end_by_count(messages as usize);
        fail(&format!(
            "{topic}'s high watermarks add up to {total}, not {messages}; a reader gets {} messages",
            reader.values.len()
        ));
    }
}

/// Q1's results over the data: (host, window start ms) -> (rows, cpu sum,
/// cpu max).
type Q1 = BTreeMap<(String, i64), (u64, u64, u64)>;

fn expected_q1(rows: u64) -> Q1 {
    let mut want = Q1::new();
    for i in 0..rows {
        let (second, host) = (i / HOSTS, i % HOSTS);
        let start = T0 + (second / 10 * 10) as i64 * 1000;
        let c = cpu(host, second);
        let e = want.entry((format!("h{host}"), start)).or_insert((0, 0, 0));
        e.0 += 1;
        e.1 += c;
        e.2 = e.2.max(c);
    }
    want
}

/// Reads a topic with `isolation.level = read_committed` from its start,
/// keeping every message's value, a little more at each call.
struct Reader {
    consumer: BaseConsumer,
    topic: String,
    partitions: Vec<i32>,
    values: Vec<String>,
}

impl Reader {
    fn new(bootstrap: &str, topic: &str) -> Reader {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", format!("{topic}-reader"))
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap_or_else(|e| fail(&format!("consumer: {e}")));
        let partitions = partitions_of(&consumer, topic);
        let mut list = TopicPartitionList::new();
        for &p in &partitions {
            list.add_partition_offset(topic, p, Offset::Beginning)
                .unwrap_or_else(|e| fail(&format!("{topic}: {e}")));
        }
        consumer
            .assign(&list)
            .unwrap_or_else(|e| fail(&format!("assigning {topic}: {e}")));
        Reader {
            consumer,
            topic: topic.to_string(),
            partitions,
            values: Vec::new(),
        }
    }

    /// Reads what is there for up to `limit`.
    fn read_for(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => self
                    .values
                    .push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned()),
                Some(Err(e)) => eprintln!("reading {}: {e}", self.topic),
                None => return,
            }
        }
    }

    /// Reads until every partition's position reaches its high watermark
    /// (a read_committed reader cannot pass an open transaction).
    fn read_to_end(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            self.read_for(Duration::from_secs(1));
            if self.at_end() {
                return;
            }
        }
        eprintln!("{}: not read to its end in 120 s", self.topic);
    }

    /// Reads until `count` messages are in or nothing more comes for 10 s.
    fn read_to_end_by_count(&mut self, count: usize) {
        let mut last = Instant::now();
        while self.values.len() < count && last.elapsed() < Duration::from_secs(10) {
            let before = self.values.len();
            self.read_for(Duration::from_secs(1));
            if self.values.len() > before {
                last = Instant::now();
            }
        }
    }

    fn at_end(&self) -> bool {
        let Ok(position) = self.consumer.position() else {
            return false;
        };
        self.partitions.iter().all(|&p| {
            let high = self
                .consumer
                .fetch_watermarks(&self.topic, p, Duration::from_secs(5))
                .map_or(i64::MAX, |(_, h)| h);
            match position.find_partition(&self.topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o >= high,
                _ => high == 0,
            }
        })
    }

    /// The values of the data's rows (not the closing rows' windows).
    fn data_values(&self) -> Vec<String> {
        self.values
            .iter()
            .filter(|v| !v.contains("\"_end"))
            .cloned()
            .collect()
    }
}

/// The script, its outputs going to `q1` and `alerts`; `source` adds
/// options to the stream.
fn script(
    setup: &Setup,
    bootstrap: &str,
    topic: &str,
    q1: &str,
    alerts: &str,
    source: &str,
) -> String {
    let sink = |out: &str| {
        format!(
            "connector = 'kafka', bootstrap = '{bootstrap}', topic = '{out}', key = 'host',
               delivery = '{}', properties.compression.type = '{}'",
            setup.delivery, setup.compression
        )
    };
    format!(
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
           WATERMARK FOR ts AS ts - INTERVAL '2' SECOND)
         WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = '{topic}', {source}
               properties.session.timeout.ms = '6000',
               properties.heartbeat.interval.ms = '500');
         CREATE SINK q1 WITH ({});
         CREATE SINK alerts WITH ({});
         SET query_name = 'q1';
         INSERT INTO q1
           SELECT window_start, window_end, host, avg(cpu) AS avg_cpu, max(cpu) AS max_cpu,
                  count(*) AS n
           FROM TUMBLE(m, ts, INTERVAL '10' SECOND)
           GROUP BY window_start, window_end, host;
         CREATE ALERT hot AS
           SELECT window_end, host, max(cpu) AS max_cpu
           FROM TUMBLE(m, ts, INTERVAL '1' MINUTE) GROUP BY window_end, host
         ALERT WHEN max_cpu >= 99 FOR 2 WINDOWS;
         INSERT INTO alerts SELECT * FROM hot;",
        sink(q1),
        sink(alerts)
    )
}

/// A `vigil run --group` process in `dir`, its stderr in `<name>.stderr`.
fn member(setup: &Setup, dir: &Path, group: &str, name: &str) -> Child {
    let stderr = std::fs::File::create(dir.join(format!("{name}.stderr")))
        .unwrap_or_else(|e| fail(&format!("stderr file: {e}")));
    Command::new(&setup.vigil)
        .current_dir(dir)
        .args(["run", "q.sql", "--group", group, "--checkpoint-dir", "ck"])
        .args(["--checkpoint-interval", &setup.checkpoint])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| fail(&format!("starting {}: {e}", setup.vigil.display())))
}

fn stderr_of(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.stderr"))).unwrap_or_default()
}

/// How many times each partition's pipeline started and stopped in a
/// process's stderr.
fn pipeline_events(stderr: &str) -> (BTreeMap<i32, usize>, BTreeMap<i32, usize>) {
    let (mut started, mut stopped) = (BTreeMap::new(), BTreeMap::new());
    for line in stderr.lines() {
        let Some(rest) = line.strip_prefix("vigil: partition ") else {
            continue;
        };
        let Some((p, event)) = rest.split_once(": ") else {
            continue;
        };
        let Ok(p) = p.parse::<i32>() else { continue };
        match event {
            "pipeline started" => *started.entry(p).or_insert(0) += 1,
            "pipeline stopped" => *stopped.entry(p).or_insert(0) += 1,
            _ => {}
        }
    }
    (started, stopped)
}

/// The partitions a process runs by its stderr.
fn held(stderr: &str) -> Vec<i32> {
    let (started, stopped) = pipeline_events(stderr);
    started
        .into_iter()
        .filter(|(p, n)| *n > stopped.get(p).copied().unwrap_or(0))
        .map(|(p, _)| p)
        .collect()
}

/// Every started count of `names`' stderr, summed by partition.
fn starts(dir: &Path, names: &[&str]) -> BTreeMap<i32, usize> {
    let mut all = BTreeMap::new();
    for name in names {
        for (p, n) in pipeline_events(&stderr_of(dir, name)).0 {
            *all.entry(p).or_insert(0) += n;
        }
    }
    all
}

/// Polls `state` (done yet, and a count that grows while work goes on)
/// until it is done, failing (with the processes' stderr) if a process in
/// `alive` ended or the count stood still for [`STALL_LIMIT`].
fn wait_for(
    dir: &Path,
    alive: &mut [(&str, &mut Child)],
    what: &str,
    mut state: impl FnMut() -> (bool, usize),
) {
    let mut last = (0, Instant::now());
    loop {
        let (done, count) = state();
        if done {
            return;
        }
        if count != last.0 {
            last = (count, Instant::now());
        }
        for (name, child) in alive.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                fail(&format!(
                    "{name} ended ({status}) while waiting for {what}:\n{}",
                    stderr_of(dir, name)
                ));
            }
        }
        if last.1.elapsed() > STALL_LIMIT {
            let logs: Vec<String> = alive
                .iter()
                .map(|(name, _)| format!("{name}:\n{}", tail(&stderr_of(dir, name))))
                .collect();
            fail(&format!(
                "waiting for {what}: nothing moved for {} s (at {count})\n{}",
                STALL_LIMIT.as_secs(),
                logs.join("\n")
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The newest checkpoint folder's name in a query's checkpoint folder.
fn newest_checkpoint(dir: &Path) -> String {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("manifest.json").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .max()
        .unwrap_or_else(|| "none".to_string())
}

/// The last lines of a log.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Problems that only an aborted transaction's rows, visible to the
/// reader, explain start with this.
const ABORTED: &str = "copies of the killed process's rows";

/// Problems that at-least-once delivery explains start with these.
const COPIES: &str = "copies of other rows";

/// The partition of host `hN`'s rows and results.
fn partition_of_row(value: &str) -> Option<i32> {
    let row: serde_json::Value = serde_json::from_str(value).ok()?;
    let host: u64 = row["host"].as_str()?.strip_prefix('h')?.parse().ok()?;
    Some((host % PARTITIONS as u64) as i32)
}

/// How many rows of the group's output are exact copies of another of
/// its rows: (those of the `killed` partitions, the others).
fn copies(group: &Output, killed: &[i32]) -> (usize, usize) {
    let repeated = |values: &[String]| -> Vec<Option<i32>> {
        values
            .windows(2)
            .filter(|w| w[0] == w[1])
            .map(|w| partition_of_row(&w[0]))
            .collect()
    };
    let all: Vec<Option<i32>> = repeated(&group.q1_values)
        .into_iter()
        .chain(repeated(&group.alerts))
        .collect();
    let of_killed = all
        .iter()
        .filter(|p| p.is_some_and(|p| killed.contains(&p)))
        .count();
    (of_killed, all.len() - of_killed)
}

/// Q1's results, as parsed and as written, and the alert rows.
struct Output {
    q1: Q1,
    q1_values: Vec<String>,
    alerts: Vec<String>,
    duplicates: Vec<String>,
}

/// Three members, one killed halfway, a fourth joining; returns what they
/// wrote once all of Q1 is in.
fn run_group(
    setup: &Setup,
    bootstrap: &str,
    topics: &Topics,
    dir: &Path,
    want: &Q1,
    figures: &mut Figures,
) -> Output {
    let sql = script(
        setup,
        bootstrap,
        &topics.metrics,
        &topics.q1,
        &topics.alerts,
        "",
    );
    std::fs::write(dir.join("q.sql"), sql).unwrap_or_else(|e| fail(&format!("q.sql: {e}")));
    let group = setup.topic("vigil");
    let mut q1 = Reader::new(bootstrap, &topics.q1);
    let started = Instant::now();
    let mut a = member(setup, dir, &group, "a");
    let mut b = member(setup, dir, &group, "b");
    let mut c = member(setup, dir, &group, "c");
    let half = want.len() / 2;
    wait_for(
        dir,
        &mut [("a", &mut a), ("b", &mut b), ("c", &mut c)],
        "half of Q1",
        || {
            q1.read_for(Duration::from_millis(500));
            (q1.values.len() >= half, q1.values.len())
        },
    );
    figures.first_half = started.elapsed().as_secs_f64();
    println!(
        "half of Q1 committed after {:.1} s; SIGKILL to a",
        figures.first_half
    );

    figures.killed_partitions = held(&stderr_of(dir, "a"));
    let newest: Vec<String> = figures
        .killed_partitions
        .iter()
        .map(|p| {
            format!(
                "p{p}: {}",
                newest_checkpoint(&dir.join("ck").join(format!("q1-p{p}")))
            )
        })
        .collect();
    println!(
        "a's newest Q1 checkpoints at the kill: {}",
        newest.join(", ")
    );
    let before = starts(dir, &["b", "c"]);
    let killed = Instant::now();
    let _ = a.kill();
    let _ = a.wait();
    wait_for(
        dir,
        &mut [("b", &mut b), ("c", &mut c)],
        "the takeover",
        || {
            let now = starts(dir, &["b", "c"]);
            let moved =
                |p: &i32| now.get(p).copied().unwrap_or(0) > before.get(p).copied().unwrap_or(0);
            (figures.killed_partitions.iter().all(moved), 0)
        },
    );
    figures.takeover = killed.elapsed().as_secs_f64();
    println!(
        "partitions {:?} of a ran again in b or c after {:.1} s; d joins",
        figures.killed_partitions, figures.takeover
    );

    let joined = Instant::now();
    let mut d = member(setup, dir, &group, "d");
    wait_for(
        dir,
        &mut [("b", &mut b), ("c", &mut c), ("d", &mut d)],
        "d's first pipeline",
        || (!held(&stderr_of(dir, "d")).is_empty(), 0),
    );
    figures.join = joined.elapsed().as_secs_f64();
    let all = want.len();
    let mut alive = [("b", &mut b), ("c", &mut c), ("d", &mut d)];
    wait_for(dir, &mut alive, "all of Q1", || {
        q1.read_for(Duration::from_millis(500));
        (q1.data_values().len() >= all, q1.values.len())
    });
    figures.group = started.elapsed().as_secs_f64();
    // d's moves settle within the session timeout; its partitions then.
    std::thread::sleep(Duration::from_secs(2));
    figures.joined_partitions = held(&stderr_of(dir, "d"));
    for (name, child) in alive.iter_mut() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        if !child.wait().is_ok_and(|s| s.success()) {
            eprintln!(
                "{name} did not end cleanly:\n{}",
                tail(&stderr_of(dir, name))
            );
        }
    }
    q1.read_to_end();
    let mut alerts = Reader::new(bootstrap, &topics.alerts);
    alerts.read_to_end();
    output(&q1, &alerts)
}

/// What the broker does with a transaction.
enum Transactions {
    /// A read_committed reader sees only committed ones.
    Isolated,
    /// A read_committed reader sees an aborted transaction's messages
    /// (librdkafka's mock cluster ignores the isolation level).
    AbortedVisible,
    /// The broker cannot run one: why.
    Broken(String),
}

/// Commits nothing and aborts one transaction on `topic`, then reads it
/// with `isolation.level = read_committed`.
fn probe_transactions(bootstrap: &str, topic: &str) -> Transactions {
    match try_transactions(bootstrap, topic) {
        Err(why) => Transactions::Broken(why),
        Ok(true) => Transactions::AbortedVisible,
        Ok(false) => Transactions::Isolated,
    }
}

/// Whether the aborted message is read.
fn try_transactions(bootstrap: &str, topic: &str) -> Result<bool, String> {
    let transactional: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", format!("{topic}-txn"))
        .create()
        .map_err(|e| format!("transactional producer: {e}"))?;
    let timeout = Duration::from_secs(30);
    let step = |what: &str, r: rdkafka::error::KafkaResult<()>| {
        r.map_err(|e| format!("the broker cannot {what}: {e}"))
    };
    step(
        "init a transactional producer",
        transactional.init_transactions(timeout),
    )?;
    step("begin a transaction", transactional.begin_transaction())?;
    send(&transactional, topic, "k", "aborted", None);
    step("flush a transaction", transactional.flush(timeout))?;
    step(
        "abort a transaction",
        transactional.abort_transaction(timeout),
    )?;
    let plain = producer(bootstrap, "none");
    send(&plain, topic, "k", "committed", None);
    step("take a plain message", plain.flush(timeout))?;
    let mut reader = Reader::new(bootstrap, topic);
    reader.read_to_end();
    if !reader.values.iter().any(|v| v == "committed") {
        return Err(format!(
            "{topic}: a plain message after an aborted transaction was not read back: {:?}",
            reader.values
        ));
    }
    Ok(reader.values.iter().any(|v| v == "aborted"))
}

/// One process over the whole topic, to its end.
fn run_alone(setup: &Setup, bootstrap: &str, topics: &Topics, figures: &mut Figures) -> Output {
    let dir = tempfile::tempdir().unwrap_or_else(|e| fail(&format!("temporary dir: {e}")));
    let source = "start = 'earliest', stop_at = 'latest',";
    let sql = script(
        setup,
        bootstrap,
        &topics.metrics,
        &topics.alone_q1,
        &topics.alone_alerts,
        source,
    );
    std::fs::write(dir.path().join("q.sql"), sql).unwrap_or_else(|e| fail(&format!("q.sql: {e}")));
    let started = Instant::now();
    let stderr_path = dir.path().join("alone.stderr");
    let stderr =
        std::fs::File::create(&stderr_path).unwrap_or_else(|e| fail(&format!("stderr file: {e}")));
    let mut child = Command::new(&setup.vigil)
        .current_dir(dir.path())
        .args(["run", "q.sql", "--checkpoint-dir", "ck"])
        .args(["--checkpoint-interval", &setup.checkpoint])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| fail(&format!("starting {}: {e}", setup.vigil.display())));
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        if started.elapsed() > ALONE_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            let said = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            fail(&format!(
                "the single process did not reach the end of the topic in {} s:\n{}",
                ALONE_LIMIT.as_secs(),
                tail(&said)
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    figures.alone = started.elapsed().as_secs_f64();
    let said = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    // Its counters (rows, late, bad per stream and query) say where rows
    // went when the output is not what the data gives.
    for line in said.lines() {
        if line.contains("rows=") || line.contains("late=") {
            println!("single process: {line}");
        }
    }
    if !status.success() {
        fail(&format!(
            "the single process failed ({status}):\n{}",
            tail(&said)
        ));
    }
    let mut q1 = Reader::new(bootstrap, &topics.alone_q1);
    q1.read_to_end();
    let mut alerts = Reader::new(bootstrap, &topics.alone_alerts);
    alerts.read_to_end();
    output(&q1, &alerts)
}

impl Output {
    /// The output without exact copies of a row.
    fn deduplicated(&self) -> Output {
        self.deduplicated_if(true)
    }

    fn deduplicated_if(&self, dedup: bool) -> Output {
        let mut q1_values = self.q1_values.clone();
        let mut alerts = self.alerts.clone();
        if dedup {
            q1_values.dedup();
            alerts.dedup();
        }
        let duplicates = if dedup {
            // A result twice with different values is still a problem.
            let mut keys = BTreeSet::new();
            q1_values
                .iter()
                .filter(|v| !keys.insert(parse_q1(v).0))
                .cloned()
                .collect()
        } else {
            self.duplicates.clone()
        };
        Output {
            q1: self.q1.clone(),
            q1_values,
            alerts,
            duplicates,
        }
    }
}

fn output(q1: &Reader, alerts: &Reader) -> Output {
    let mut q1_values = q1.data_values();
    let mut parsed = Q1::new();
    let mut duplicates = Vec::new();
    for value in &q1_values {
        let (key, result) = parse_q1(value);
        if parsed.insert(key, result).is_some() {
            duplicates.push(value.clone());
        }
    }
    q1_values.sort();
    let mut alerts = alerts.data_values();
    alerts.sort();
    Output {
        q1: parsed,
        q1_values,
        alerts,
        duplicates,
    }
}

/// One Q1 row: its key and (rows, cpu sum, cpu max), the sum from the
/// average.
fn parse_q1(value: &str) -> ((String, i64), (u64, u64, u64)) {
    fn bad<T>(value: &str) -> T {
        fail(&format!("a Q1 row that is not what Q1 gives: {value}"))
    }
    let row: serde_json::Value = serde_json::from_str(value).unwrap_or_else(|_| bad(value));
    let host = row["host"]
        .as_str()
        .unwrap_or_else(|| bad(value))
        .to_string();
    let start = chrono::NaiveDateTime::parse_from_str(
        row["window_start"].as_str().unwrap_or_else(|| bad(value)),
        "%Y-%m-%dT%H:%M:%S",
    )
    .unwrap_or_else(|_| bad(value))
    .and_utc()
    .timestamp_millis();
    let n = row["n"].as_u64().unwrap_or_else(|| bad(value));
    let avg = row["avg_cpu"].as_f64().unwrap_or_else(|| bad(value));
    let max = row["max_cpu"].as_f64().unwrap_or_else(|| bad(value));
    (
        (host, start),
        (n, (avg * n as f64).round() as u64, max as u64),
    )
}

/// What differs between the group's output, the single process's and the
/// data's Q1.
fn compare(group: &Output, alone: &Output, want: &Q1, killed: &[i32]) -> Vec<String> {
    let mut problems = Vec::new();
    let (of_killed, others) = copies(group, killed);
    if of_killed > 0 {
        println!(
            "the group's output has {of_killed} exact copies of results of the killed process's partitions {killed:?}"
        );
        problems.push(format!(
            "{ABORTED}: {of_killed} Q1 and alert rows twice in the group's output"
        ));
    }
    if others > 0 {
        println!(
            "the group's output has {others} exact copies of results of partitions the killed process did not hold"
        );
        problems.push(format!(
            "{COPIES}: {others} Q1 and alert rows twice in the group's output"
        ));
    }
    let (group, alone) = (&group.deduplicated(), &alone.deduplicated_if(false));
    for (name, out) in [("the group", group), ("the single process", alone)] {
        if !out.duplicates.is_empty() {
            problems.push(format!(
                "{name} wrote {} Q1 results twice, such as {}",
                out.duplicates.len(),
                out.duplicates[0]
            ));
        }
        let missing: Vec<_> = want.keys().filter(|k| !out.q1.contains_key(*k)).collect();
        if !missing.is_empty() {
            problems.push(format!(
                "{name} misses {} Q1 results, such as {:?}",
                missing.len(),
                missing[0]
            ));
        }
        let wrong: Vec<_> = out
            .q1
            .iter()
            .filter(|(k, v)| want.get(*k) != Some(*v))
            .collect();
        if !wrong.is_empty() {
            problems.push(format!(
                "{name} has {} Q1 results the data does not give, such as {:?} (want {:?})",
                wrong.len(),
                wrong[0],
                want.get(wrong[0].0)
            ));
        }
    }
    if group.q1_values != alone.q1_values {
        problems.push(format!(
            "Q1 rows differ between the group ({}) and the single process ({})",
            group.q1_values.len(),
            alone.q1_values.len()
        ));
    }
    if group.alerts != alone.alerts {
        let (g, a): (BTreeSet<_>, BTreeSet<_>) =
            (group.alerts.iter().collect(), alone.alerts.iter().collect());
        problems.push(format!(
            "alert rows differ: the group {} , the single process {}; only in the group: {:?}; only alone: {:?}",
            group.alerts.len(),
            alone.alerts.len(),
            g.difference(&a).take(3).collect::<Vec<_>>(),
            a.difference(&g).take(3).collect::<Vec<_>>()
        ));
    }
    if group.alerts.is_empty() {
        problems.push("no alert rows".to_string());
    }
    problems
}
