//! Scale-out over a Kafka consumer group: `vigil run --group NAME`.
//!
//! Every process started with the same group joins one Kafka consumer
//! group on the script's topic; Kafka's group protocol (cooperative-sticky
//! assignment) splits the topic's partitions among them and moves them
//! when a process joins, leaves or dies. vigil keeps no coordinator of its
//! own.
//!
//! A process runs one pipeline per partition it is given: the script's
//! queries over that partition alone (a Kafka-Streams-style task), each
//! query checkpointed under `<name>-p<partition>` in the checkpoint
//! directory every process shares. Given a partition, a process starts its
//! pipeline, which restores from the partition's last complete checkpoint
//! and reads on from the offsets in it; when the partition is taken away,
//! it stops the pipeline at a last checkpoint before the group hands the
//! partition on, so the next owner starts where it stopped. A
//! process that dies is noticed by the group after its session timeout;
//! whoever gets its partitions restores them from their checkpoints, and a
//! Kafka sink's transactional id per partition fences the dead process's
//! transactions.
//!
//! The member consumer only holds the group's assignment: its partitions
//! are paused at once, and each pipeline reads its partition with a
//! consumer of its own, from the checkpoint's offsets.
//!
//! Each process also writes what it holds to `<checkpoint dir>/groups/
//! <NAME>/<member>.json` every second, which `vigil group` reads (see
//! [`status`]).

pub mod scale;
pub mod status;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc as std_mpsc};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::topic_partition_list::TopicPartitionList;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::connectors::kafka::{Endpoint, Reporter};
use crate::error::{Error, Result};
use crate::runtime::autoscale::AutoscaleSettings;
use crate::runtime::live::{Live, NamedQuery, QueryId};
use crate::state::store::Location;
use scale::{LoadMeter, MemberLoad, Scaler};

/// How long a pipeline may take to stop when its partition goes.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the member's status file is written.
const STATUS_EVERY: Duration = Duration::from_secs(1);

/// What a process of a group needs.
pub struct GroupConfig {
    /// The group's name, also the Kafka consumer group's.
    pub name: String,
    /// The topic whose partitions are split, with its brokers.
    pub endpoint: Endpoint,
    /// The checkpoint directory every member shares.
    pub checkpoint_dir: Location,
    /// How the group works out the processes it needs (`SET autoscale =
    /// 'on'` in its scripts), if it does: see [`scale`].
    pub autoscale: Option<AutoscaleSettings>,
    /// How often its pipelines checkpoint.
    pub checkpoint_interval: Duration,
}

/// Builds the pipeline of one partition: the script's queries over it.
pub type Pipelines = Box<dyn Fn(i32) -> Result<Vec<NamedQuery>> + Send + Sync>;

/// What a member writes about itself for `vigil group`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MemberStatus {
    /// `host:pid`.
    pub member: String,
    /// The topic and brokers.
    pub topic: String,
    /// The brokers.
    pub bootstrap: String,
    /// The partitions it runs now.
    pub partitions: Vec<i32>,
    /// When this was written, epoch milliseconds.
    pub updated_ms: i64,
    /// What it measured over its last `autoscale.interval`, in a group
    /// that autoscales.
    #[serde(default)]
    pub load: Option<MemberLoad>,
}

/// The folder members of group `name` write their status to.
pub fn status_dir(checkpoint_dir: &Location, name: &str) -> Location {
    checkpoint_dir.child("groups").child(name)
}

/// A change of this member's share of the topic.
enum Change {
    /// These partitions are now this member's.
    Assigned(Vec<i32>),
    /// These partitions go; the sender waits for the answer until their
    /// pipelines have stopped.
    Revoked(Vec<i32>, std_mpsc::Sender<()>),
    /// These partitions were lost: this member's session timed out (a
    /// stall longer than `session.timeout.ms`) and the group may have
    /// given them to another member already, which restored them from
    /// their last checkpoint. Their pipelines are cancelled with no last
    /// checkpoint: one written now would be newer than the new owner's
    /// start, by a process that no longer owns the partition, and the new
    /// owner's transactional producer has fenced this one's anyway.
    Lost(Vec<i32>, std_mpsc::Sender<()>),
}

/// The member consumer's context: hands rebalances to the runtime.
struct Member {
    reporter: Reporter,
    changes: mpsc::UnboundedSender<Change>,
}

impl rdkafka::client::ClientContext for Member {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.reporter.error(error, reason);
    }
}

impl ConsumerContext for Member {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(list) = rebalance {
            let (done, wait) = std_mpsc::channel();
            let change = match consumer.assignment_lost() {
                true => Change::Lost(partitions(list), done),
                false => Change::Revoked(partitions(list), done),
            };
            if self.changes.send(change).is_ok() {
                // The partitions may go only once their pipelines stopped.
                let _ = wait.recv_timeout(STOP_TIMEOUT);
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance {
            // The member only holds the assignment; pipelines read.
            if let Err(e) = consumer.pause(list) {
                self.reporter
                    .warn(&format!("pausing the group's partitions: {e}"));
            }
            let _ = self.changes.send(Change::Assigned(partitions(list)));
        }
    }
}

fn partitions(list: &TopicPartitionList) -> Vec<i32> {
    list.elements().iter().map(|e| e.partition()).collect()
}

/// Runs this process's share of group `config.name` on `live` until
/// `leave` is set: pipelines start and stop as partitions come and go.
/// Leaving stops every pipeline and leaves the group.
pub async fn run_group(
    live: &Live,
    config: GroupConfig,
    pipelines: Pipelines,
    leave: Arc<AtomicBool>,
) -> Result<()> {
    let (changes, mut incoming) = mpsc::unbounded_channel();
    let member = join(&config, changes)?;
    let status = StatusWriter::new(&config)?;
    let polling = {
        let leave = leave.clone();
        std::thread::Builder::new()
            .name("vigil-group".into())
            .spawn(move || poll_membership(member, &leave))
            .map_err(|e| Error::io("starting the group member".to_string(), e))?
    };
    let mut running: BTreeMap<i32, Vec<QueryId>> = BTreeMap::new();
    let mut scaling = config.autoscale.clone().map(|settings| {
        let meter = LoadMeter::new(settings.interval);
        let scaler = Scaler::new(settings, config.checkpoint_interval);
        (meter, Arc::new(Mutex::new(scaler)))
    });
    let mut ticker = tokio::time::interval(STATUS_EVERY);
    let (failed, mut failures) = mpsc::unbounded_channel();
    let outcome = loop {
        tokio::select! {
            change = incoming.recv() => match change {
                Some(Change::Assigned(list)) => {
                    if let Err(e) = start(live, &pipelines, &mut running, &list, &failed) {
                        break Err(e);
                    }
                    status.write(&running);
                }
                Some(Change::Revoked(list, done)) => {
                    stop(live, &mut running, &list).await;
                    let _ = done.send(());
                    status.write(&running);
                }
                Some(Change::Lost(list, done)) => {
                    for (p, ids) in take(&mut running, &list) {
                        cancel(live, &ids).await;
                        crate::diag::warning!(
                            "partition {p}: lost (this member's session timed out): pipeline cancelled with no last checkpoint"
                        );
                    }
                    let _ = done.send(());
                    status.write(&running);
                }
                None => break Ok(()),
            },
            _ = ticker.tick() => {
                let load = scaling.as_mut().and_then(|(meter, _)| {
                    let ids: Vec<QueryId> = running.values().flatten().copied().collect();
                    meter.tick(live, &ids)
                });
                let measured = load.is_some();
                status.write_load(&running, load);
                if let (true, Some((_, scaler))) = (measured, &scaling) {
                    scale_step(scaler.clone(), &config, status.member());
                }
            }
            // A pipeline that fails would fail again on any member: the
            // member ends, saying why, and its partitions move on.
            Some(failure) = failures.recv() => break Err(failure),
        }
    };
    leave.store(true, Ordering::Relaxed);
    // The member answers no more revocations: stop what is left.
    let all: Vec<i32> = running.keys().copied().collect();
    stop(live, &mut running, &all).await;
    drop(incoming);
    let _ = tokio::task::spawn_blocking(move || polling.join()).await;
    status.remove();
    outcome
}

/// Runs one step of the group's scaler (see [`scale`]) off the async
/// runtime: it reads the brokers and may run the hook. A step still
/// running when the next is due makes that one wait its turn.
fn scale_step(scaler: Arc<Mutex<Scaler>>, config: &GroupConfig, me: String) {
    let (dir, name) = (config.checkpoint_dir.clone(), config.name.clone());
    tokio::task::spawn_blocking(move || {
        let mut scaler = scaler.lock().unwrap_or_else(|e| e.into_inner());
        scaler.step(&dir, &name, &me);
    });
}

/// The member consumer, subscribed to the topic.
fn join(
    config: &GroupConfig,
    changes: mpsc::UnboundedSender<Change>,
) -> Result<BaseConsumer<Member>> {
    let context = Member {
        reporter: Reporter::new(format!("group {}", config.name)),
        changes,
    };
    let consumer: BaseConsumer<Member> = config
        .endpoint
        .client_config(&[
            ("group.id", &config.name),
            ("enable.auto.commit", "false"),
            ("partition.assignment.strategy", "cooperative-sticky"),
        ])
        .create_with_context(context)
        .map_err(|e| Error::Connector(format!("kafka: group {}: {e}", config.name)))?;
    consumer
        .subscribe(&[&config.endpoint.topic])
        .map_err(|e| Error::Connector(format!("kafka: group {}: {e}", config.name)))?;
    Ok(consumer)
}

/// Keeps the member in the group (its rebalances run in these polls) until
/// `leave`; then leaves, which revokes its partitions.
fn poll_membership(member: BaseConsumer<Member>, leave: &AtomicBool) {
    while !leave.load(Ordering::Relaxed) {
        // Its partitions are paused: a message here is one fetched before
        // the pause, which a pipeline reads itself.
        let _ = member.poll(Duration::from_millis(100));
    }
    member.unsubscribe();
    for _ in 0..20 {
        let _ = member.poll(Duration::from_millis(50));
    }
}

/// Starts the pipelines of the partitions in `list` not running yet.
fn start(
    live: &Live,
    pipelines: &Pipelines,
    running: &mut BTreeMap<i32, Vec<QueryId>>,
    list: &[i32],
    failed: &mpsc::UnboundedSender<Error>,
) -> Result<()> {
    for &p in list {
        if running.contains_key(&p) {
            continue;
        }
        let ids = live.start_all(pipelines(p)?)?;
        for &id in &ids {
            let ended = live.wait(id);
            let failed = failed.clone();
            tokio::spawn(async move {
                if let Err(e) = ended.await {
                    let _ = failed.send(Error::Connector(format!("partition {p}: {e}")));
                }
            });
        }
        crate::diag::note!("partition {p}: pipeline started");
        running.insert(p, ids);
    }
    Ok(())
}

/// Stops the pipelines of the partitions in `list` after a last
/// checkpoint and waits until they have ended. Whoever takes a partition
/// next then restores exactly where it stopped: it repeats nothing, and no
/// transaction of this process's is left open for it to fence (a reader
/// of a broker without `read_committed`, as librdkafka's mock, would see
/// that one's rows). A pipeline that does not stop in time is cancelled,
/// as a process that dies would be.
async fn stop(live: &Live, running: &mut BTreeMap<i32, Vec<QueryId>>, list: &[i32]) {
    let stopping = take(running, list);
    let ids: Vec<QueryId> = stopping.iter().flat_map(|(_, ids)| ids.clone()).collect();
    let checkpointed = live.stop_at_checkpoint(&ids, STOP_TIMEOUT).await;
    for (p, ids) in stopping {
        if !checkpointed {
            cancel(live, &ids).await;
        }
        match checkpointed {
            true => crate::diag::note!("partition {p}: pipeline stopped at a checkpoint"),
            false => crate::diag::note!(
                "partition {p}: pipeline cancelled: it did not stop at a checkpoint within {}s",
                STOP_TIMEOUT.as_secs()
            ),
        }
    }
}

/// Takes the partitions of `list` that run out of `running`, with their
/// pipelines' queries.
fn take(running: &mut BTreeMap<i32, Vec<QueryId>>, list: &[i32]) -> Vec<(i32, Vec<QueryId>)> {
    list.iter()
        .filter_map(|p| Some((*p, running.remove(p)?)))
        .collect()
}

/// Cancels queries `ids` and waits (up to [`STOP_TIMEOUT`]) until they
/// have ended, as a process that dies would end them.
async fn cancel(live: &Live, ids: &[QueryId]) {
    // Waited for from before they are cancelled, which unlists them.
    let ended: Vec<_> = ids.iter().map(|&id| live.wait(id)).collect();
    for &id in ids {
        live.stop(id);
    }
    for ended in ended {
        let _ = tokio::time::timeout(STOP_TIMEOUT, ended).await;
    }
}

/// Writes this member's status file.
struct StatusWriter {
    path: Location,
    status: Mutex<MemberStatus>,
}

impl StatusWriter {
    fn new(config: &GroupConfig) -> Result<Self> {
        let dir = status_dir(&config.checkpoint_dir, &config.name);
        dir.make_folder()?;
        let host = sysinfo::System::host_name().unwrap_or_else(|| "localhost".into());
        let member = format!("{host}:{}", std::process::id());
        Ok(StatusWriter {
            path: dir.child(&format!("{}.json", member.replace(':', "-"))),
            status: Mutex::new(MemberStatus {
                member,
                topic: config.endpoint.topic.clone(),
                bootstrap: config.endpoint.bootstrap.clone(),
                partitions: Vec::new(),
                updated_ms: 0,
                load: None,
            }),
        })
    }

    /// This member's name.
    fn member(&self) -> String {
        let status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        status.member.clone()
    }

    /// Writes it, with the load of a window just measured if there is one
    /// (the last one stays otherwise).
    fn write_load(&self, running: &BTreeMap<i32, Vec<QueryId>>, load: Option<MemberLoad>) {
        if let Some(load) = load {
            let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
            status.load = Some(load);
        }
        self.write(running);
    }

    /// Writes it (a put: a reader never sees half): a failure is a
    /// warning, since the status is for people only, and the leader reads
    /// the load in it.
    fn write(&self, running: &BTreeMap<i32, Vec<QueryId>>) {
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        status.partitions = running.keys().copied().collect();
        status.updated_ms = chrono::Utc::now().timestamp_millis();
        let text = serde_json::to_string_pretty(&*status).unwrap_or_default();
        if let Err(e) = self.path.put(text.into_bytes()) {
            crate::diag::warning!("cannot write {}: {e}", self.path);
        }
    }

    fn remove(&self) {
        let _ = self.path.remove();
    }
}
