//! A live runtime: queries start and stop while the program runs (the REPL,
//! `vigil serve`, a program embedding vigil), and rows can be pushed into
//! streams.
//!
//! Unlike [`run`](super::run), which reads each stream once for a fixed set
//! of queries, every query started here reads its file sources on its own,
//! from the start, so a query typed later sees the whole file. Streams with
//! `connector = 'push'` have one hub each: pushed rows go to every query
//! reading the stream at that moment.

mod push;
mod stop;
mod wire;

use stop::wait_all;
use wire::{end_soon, watch_source};

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use datafusion::arrow::record_batch::RecordBatch;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::buffer::{BufferPlace, BufferedSender, buffer_dir};
use super::checkpoint::{
    CheckpointConfig, Coordinator, QueryCheckpoints, input_prefix, stage_prefix,
};
use super::wal::Wal;
use super::{
    RunnableQuery, Subscriber, Wiring, merge, run_late_source, run_sink, run_source, spawn_stages,
};
use crate::connector::{Sink, SourceLocation, SourcePosition, SourceStats};
use crate::error::{Error, Result};
use crate::exec::{END_OF_INPUT, LateRows, Message, QueryStats};
use crate::plan::StreamDef;
use crate::planner::{ExecutionMode, QueryGraph};
use crate::state::store::{OperatorShape, SourceEntry};

/// A push stream, and the checkpoints of the queries reading it that a
/// stop at a checkpoint takes off it.
type PushReaders = (String, Vec<Arc<QueryCheckpoints>>);

/// Identifies a running query within a [`Live`] runtime.
pub type QueryId = u64;

/// Finished queries kept in the listing ([`Live::all_queries`]), the most
/// recent; older ones are forgotten.
pub const KEEP_FINISHED: usize = 16;
/// Failed queries kept in the listing until [`Live::forget`] removes them;
/// beyond this many the oldest failures are forgotten, so a long-running
/// service cannot fill up with them.
pub const KEEP_FAILED: usize = 64;

/// Starts, lists and stops queries; routes pushed rows.
#[derive(Clone, Default)]
pub struct Live {
    state: Arc<Mutex<State>>,
    next_id: Arc<AtomicU64>,
    /// Takes the checkpoints of named queries, when set.
    coordinator: Option<Arc<Coordinator>>,
    /// The checkpoint timer has started.
    ticking: Arc<std::sync::atomic::AtomicBool>,
}

/// A query to start, with what names it.
pub struct NamedQuery {
    /// The query and its sink.
    pub query: RunnableQuery,
    /// What listings show for it.
    pub label: String,
    /// Its stable name, under which its checkpoints are kept; `None` for a
    /// query that is not checkpointed.
    pub name: Option<String>,
}

#[derive(Default)]
struct State {
    queries: BTreeMap<QueryId, Running>,
    hubs: HashMap<String, Hub>,
    /// Counts the queries that ended, to forget the oldest first.
    ended: u64,
    /// Per query name, where it reads its streams from when it has no
    /// checkpoint (see [`Live::set_start_positions`]).
    start_positions: HashMap<String, Vec<SourceEntry>>,
    /// Query names whose next restore starts changed operators empty
    /// instead of refusing (see [`Live::allow_non_restored`]).
    allow_non_restored: std::collections::HashSet<String>,
}

/// What the live runtime knows of a query, running or ended.
struct Running {
    label: String,
    stats: Arc<QueryStats>,
    sources: Vec<(String, Arc<SourceStats>)>,
    tasks: Vec<tokio::task::AbortHandle>,
    /// How this run of it ended.
    done: watch::Receiver<Option<Result<(), String>>>,
    /// How it ended, over its runs: a query changed while it runs (see
    /// [`Live::start_in_place`]) goes on under its id, and its waiters
    /// wait on.
    life: Arc<watch::Sender<Option<Result<(), String>>>>,
    /// This run ends to be replaced: its end is not the query's.
    restarting: Arc<std::sync::atomic::AtomicBool>,
    state: QueryState,
    /// Why it failed.
    error: Option<String>,
    /// When it ended, in the order queries end.
    ended: u64,
    /// Its stateful operators, as a checkpoint stores them.
    shapes: Vec<OperatorShape>,
    /// Where it collects its checkpoints, if it takes them.
    checkpoints: Option<Arc<QueryCheckpoints>>,
}

/// Where a query is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryState {
    /// Reading its streams.
    Running,
    /// Its inputs ended and it wrote its last results.
    Finished,
    /// A task of it failed (a run-time error, an unreadable source, a sink
    /// that cannot be written); its other tasks were stopped.
    Failed,
}

impl QueryState {
    /// `running`, `finished` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            QueryState::Running => "running",
            QueryState::Finished => "finished",
            QueryState::Failed => "failed",
        }
    }
}

impl std::fmt::Display for QueryState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The queries reading a push stream, and whether it has ended.
#[derive(Default)]
struct Hub {
    subscribers: Vec<Subscriber>,
    stats: Arc<SourceStats>,
    ended: bool,
    /// Batches pushed so far: the position a checkpoint records. With a
    /// write-ahead log, the sequence number of the last batch handed out.
    pushed: u64,
    /// Held while rows or a barrier go out, so every subscriber sees them
    /// in the same order.
    gate: Arc<tokio::sync::Mutex<()>>,
    /// Where pushed batches are made durable before they are handed out.
    wal: Option<Arc<Wal>>,
    /// Hands logged batches out in the order the log took them.
    order: Arc<Sequencer>,
    /// Readers being caught up from the log (see [`Live::join_replayed`])
    /// and not among `subscribers` yet: a barrier meant for them waits
    /// until they are.
    joining: Arc<watch::Sender<usize>>,
}

/// One reader of a push stream being caught up from its log, counted in
/// [`Hub::joining`] until dropped (also when its task is cancelled).
struct Joining(Arc<watch::Sender<usize>>);

impl Joining {
    fn start(count: &Arc<watch::Sender<usize>>) -> Self {
        count.send_modify(|n| *n += 1);
        Self(count.clone())
    }
}

impl Drop for Joining {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl Hub {
    /// The subscribers still listening (the others are forgotten).
    fn listening(&mut self) -> Vec<Subscriber> {
        self.subscribers.retain(|s| !s.tx.is_closed());
        self.subscribers.clone()
    }
}

/// Tickets in log order: a push takes one as it queues its batch to the
/// log, and hands the batch out once every earlier ticket is done, so that
/// `pushed` only goes up and equals the log's sequence number.
struct Sequencer {
    /// The last ticket given; held while a batch is queued to the log.
    next: tokio::sync::Mutex<u64>,
    /// The last ticket done.
    done: watch::Sender<u64>,
}

impl Default for Sequencer {
    fn default() -> Self {
        Self {
            next: tokio::sync::Mutex::new(0),
            done: watch::channel(0).0,
        }
    }
}

/// A snapshot of one query.
#[derive(Debug, Clone)]
pub struct QueryInfo {
    /// Its id.
    pub id: QueryId,
    /// What it runs (its SQL, or a name).
    pub label: String,
    /// Running, finished or failed.
    pub state: QueryState,
    /// Why it failed (for a failed query).
    pub error: Option<String>,
    /// Result rows so far.
    pub rows_out: u64,
    /// Rows its windows dropped as late.
    pub late_rows: u64,
    /// Per stream it reads: name, rows read, bad rows.
    pub sources: Vec<(String, u64, u64)>,
    /// Its counters, live: operators, queues, latency, shed rows.
    pub stats: Arc<QueryStats>,
    /// Per stream it reads, its name and the source's counters, live (a
    /// push stream's are shared by every query reading it).
    pub inputs: Vec<(String, Arc<SourceStats>)>,
}

impl Live {
    /// An empty runtime. Queries run on the tokio runtime of the caller.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty runtime that checkpoints its named queries as `config`
    /// says, and restores them from their checkpoints when they start.
    pub fn with_checkpoints(config: CheckpointConfig) -> Self {
        Self {
            coordinator: Some(Arc::new(Coordinator::new(config))),
            ..Self::default()
        }
    }

    /// Starts the checkpoint timer, once: on a thread of its own, so that
    /// busy operator tasks cannot delay it. It ends with the runtime.
    fn start_ticking(&self) {
        let Some(coordinator) = self.coordinator.clone() else {
            return;
        };
        if self.ticking.swap(true, Ordering::AcqRel) {
            return;
        }
        let handle = tokio::runtime::Handle::current();
        let state = Arc::downgrade(&self.state);
        let next_id = self.next_id.clone();
        let ticking = self.ticking.clone();
        let period = coordinator.config().interval;
        let started = std::thread::Builder::new()
            .name("vigil-checkpoints".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(period);
                    let Some(state) = state.upgrade() else {
                        return;
                    };
                    let live = Live {
                        state,
                        next_id: next_id.clone(),
                        coordinator: Some(coordinator.clone()),
                        ticking: ticking.clone(),
                    };
                    let id = coordinator.request();
                    handle.block_on(live.barrier_hubs(id));
                }
            });
        if let Err(e) = started {
            crate::diag::warning!("no checkpoint timer: {e}");
        }
    }

    /// Asks for a savepoint under `root` (see [`Coordinator::savepoint`]);
    /// its id. Without checkpoints, `None`.
    pub async fn savepoint(&self, root: &std::path::Path, stop: bool) -> Option<u64> {
        let coordinator = self.coordinator.clone()?;
        let id = coordinator.savepoint(&root.into(), stop);
        self.barrier_hubs(id).await;
        Some(id)
    }

    /// Sends barrier `id` into every push stream, recording how many
    /// batches each had taken.
    async fn barrier_hubs(&self, id: u64) {
        let gates: Vec<(String, Arc<tokio::sync::Mutex<()>>)> = self
            .lock()
            .hubs
            .iter()
            .map(|(name, hub)| (name.clone(), hub.gate.clone()))
            .collect();
        for (stream, gate) in gates {
            let _turn = gate.lock().await;
            let Some((subscribers, pushed)) = self.hub_senders(&stream) else {
                continue;
            };
            let position = SourcePosition {
                rows: pushed,
                ..SourcePosition::default()
            };
            for subscriber in subscribers {
                subscriber.add_source(id, &stream, Some(position.clone()));
                subscriber.send_message(Message::Barrier(id)).await;
            }
        }
    }

    /// The live subscribers of push stream `stream` and the batches it has
    /// taken; `None` for no such stream or one that ended.
    fn hub_senders(&self, stream: &str) -> Option<(Vec<Subscriber>, u64)> {
        let mut state = self.lock();
        let hub = state.hubs.get_mut(stream).filter(|h| !h.ended)?;
        Some((hub.listening(), hub.pushed))
    }

    /// What takes the checkpoints, if this runtime takes them.
    pub fn coordinator(&self) -> Option<&Arc<Coordinator>> {
        self.coordinator.as_ref()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts `graph`, its results going to `sink`; `label` names it in
    /// listings. Must be called within a tokio runtime.
    pub fn start(&self, graph: QueryGraph, sink: Box<dyn Sink>, label: &str) -> Result<QueryId> {
        self.start_named(graph, sink, label, None)
    }

    /// Starts a query like [`Live::start`]; with a `name` (and checkpoints
    /// on) it is restored from its latest checkpoint and checkpointed.
    pub fn start_named(
        &self,
        graph: QueryGraph,
        sink: Box<dyn Sink>,
        label: &str,
        name: Option<String>,
    ) -> Result<QueryId> {
        let query = NamedQuery {
            query: RunnableQuery { graph, sink },
            label: label.to_string(),
            name,
        };
        let ids = self.start_all(vec![query])?;
        Ok(ids[0])
    }

    /// Starts `queries` together, each with its label: queries of the group
    /// that read the same file stream share one reading of it (a fixed
    /// script, whose queries are all known at the start), and `late(stream)`
    /// inputs get the rows the group's other queries drop as late. Queries
    /// started by separate calls read their files on their own. Must be
    /// called within a tokio runtime.
    pub fn start_all(&self, queries: Vec<NamedQuery>) -> Result<Vec<QueryId>> {
        self.start_all_as(queries.into_iter().map(|q| (q, None)).collect())
    }

    /// Starts query `query` under the id of ended query `id`, which it
    /// replaces in the listing (a query changed while it runs: see
    /// [`Live::stop_at_checkpoint`]). Fails if `id` is still running.
    pub fn start_in_place(&self, id: QueryId, query: NamedQuery) -> Result<()> {
        // The ended run stays listed, restarting, until the new one takes
        // its place: meanwhile the query still counts as reading its
        // streams (see [`Live::running_or_restarting`]).
        let life = match self.lock().queries.get(&id) {
            Some(q) if q.state == QueryState::Running => {
                return Err(Error::Plan(format!("query {id} is still running")));
            }
            Some(q) => q.life.clone(),
            None => Arc::new(watch::channel(None).0),
        };
        let started = self.start_all_as(vec![(
            query,
            Some(Replaced {
                id,
                life: life.clone(),
            }),
        )]);
        if let Err(e) = &started {
            self.lock().queries.remove(&id);
            let _ = life.send_replace(Some(Err(e.to_string())));
        }
        started.map(|_| ())
    }

    /// Marks query `id`'s current run as ending to be replaced (by
    /// [`Live::start_in_place`]): its waiters wait on through the end of
    /// this run. False if it is not running.
    pub fn begin_restart(&self, id: QueryId) -> bool {
        let state = self.lock();
        match state.queries.get(&id) {
            Some(q) if q.state == QueryState::Running => {
                q.restarting.store(true, Ordering::Release);
                true
            }
            _ => false,
        }
    }

    /// Ends the current run of query `id` to start a changed one in its
    /// place ([`Live::start_in_place`]): with `checkpoint`, right after
    /// one more checkpoint ([`Live::stop_at_checkpoint`]), else at once.
    /// Its waiters wait on. An error if it is not running, or did not
    /// reach the checkpoint within `timeout` (it is stopped then, and its
    /// waiters learn that it ended).
    pub async fn end_run_for_restart(
        &self,
        id: QueryId,
        checkpoint: bool,
        timeout: std::time::Duration,
    ) -> Result<()> {
        if !self.begin_restart(id) {
            return Err(Error::Plan(format!("query {id} is not running")));
        }
        if checkpoint && self.stop_at_checkpoint(&[id], timeout).await {
            return Ok(());
        }
        self.abort_run(id);
        self.wait_run(id).await;
        if !checkpoint {
            return Ok(());
        }
        let why = format!(
            "query {id} did not reach a checkpoint within {timeout:?} to be changed; it was stopped"
        );
        self.abandon_restart(id, &why);
        Err(Error::Connector(why))
    }

    /// Cancels the tasks of query `id`'s current run, keeping it listed.
    fn abort_run(&self, id: QueryId) {
        if let Some(query) = self.lock().queries.get(&id) {
            for task in &query.tasks {
                task.abort();
            }
        }
    }

    /// Ends a restart of query `id` that will not happen: its waiters
    /// learn how its last run ended (`error` says why it was not
    /// restarted).
    pub fn abandon_restart(&self, id: QueryId, error: &str) {
        let life = self.lock().queries.get(&id).map(|q| {
            q.restarting.store(false, Ordering::Release);
            q.life.clone()
        });
        if let Some(life) = life {
            let _ = life.send_replace(Some(Err(error.to_string())));
        }
    }

    /// Lets the next restore of query `name` start the operators that
    /// changed since its checkpoint empty, instead of refusing it.
    pub fn allow_non_restored(&self, name: &str) {
        self.lock().allow_non_restored.insert(name.to_string());
    }

    /// The stateful operators of query `id` (running or ended), as a
    /// checkpoint of it stores them.
    pub fn shapes(&self, id: QueryId) -> Option<Vec<OperatorShape>> {
        self.lock().queries.get(&id).map(|q| q.shapes.clone())
    }

    fn start_all_as(&self, queries: Vec<(NamedQuery, Option<Replaced>)>) -> Result<Vec<QueryId>> {
        let mut group = Group::default();
        let mut wired = Vec::with_capacity(queries.len());
        for (query, id) in queries {
            let label = query.label.clone();
            wired.push((self.wire(query, &mut group)?, label, id));
        }
        self.start_ticking();
        group.check_late_streams()?;
        let sources = self.start_sources(group)?;
        let mut ids = Vec::with_capacity(wired.len());
        for (mut query, label, id) in wired {
            for key in &query.streams {
                let (stats, watcher) = sources.get(key).expect("every input has a source");
                query.sources.push((key.stream.clone(), stats.clone()));
                query.tasks.push(watch_source(watcher.clone()));
            }
            let streams = query.sources.iter().map(|(_, s)| s.clone()).collect();
            let _ = query.stats.sources.set(streams);
            ids.push(self.track(query, &label, id));
        }
        Ok(ids)
    }

    /// Lists a wired query and watches for its end.
    fn track(&self, query: Wired, label: &str, place: Option<Replaced>) -> QueryId {
        let (id, life) = match place {
            Some(Replaced { id, life }) => (id, life),
            None => (
                self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
                Arc::new(watch::channel(None).0),
            ),
        };
        let restarting = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let Wired {
            stats,
            sources,
            tasks,
            shapes,
            checkpoints,
            ..
        } = query;
        let (done_tx, done) = watch::channel(None);
        let running = Running {
            label: label.to_string(),
            stats,
            sources,
            tasks: tasks.iter().map(|t| t.abort_handle()).collect(),
            done,
            state: QueryState::Running,
            error: None,
            ended: 0,
            shapes,
            checkpoints,
            life: life.clone(),
            restarting: restarting.clone(),
        };
        self.lock().queries.insert(id, running);
        let live = self.clone();
        tokio::spawn(async move {
            let outcome = wait_all(tasks).await.map_err(|e| e.to_string());
            // The listing shows the end before waiters learn of it, so a
            // waiter that then lists the queries sees it.
            live.ended(id, outcome.as_ref().err());
            let _ = done_tx.send(Some(outcome.clone()));
            if !restarting.load(Ordering::Acquire) {
                // `send` would drop the outcome while nobody waits yet.
                let _ = life.send_replace(Some(outcome));
            }
        });
        id
    }

    /// The counters of queries `ids` and of the streams they read (each
    /// stream once), in order.
    pub fn report(&self, ids: &[QueryId]) -> super::RunReport {
        let state = self.lock();
        let mut report = super::RunReport::default();
        for id in ids {
            let Some(query) = state.queries.get(id) else {
                continue;
            };
            report.queries.push(query.stats.clone());
            for (name, stats) in &query.sources {
                if !report.streams.iter().any(|(_, s)| Arc::ptr_eq(s, stats)) {
                    report.streams.push((name.clone(), stats.clone()));
                }
            }
        }
        // By name, as the summary lists them.
        report.streams.sort_by(|a, b| a.0.cmp(&b.0));
        report
    }

    /// Records that query `id` ended, with `error` if it failed, and
    /// forgets the oldest ended queries beyond those kept. Nothing if it
    /// was stopped (and so is no longer listed).
    fn ended(&self, id: QueryId, error: Option<&String>) {
        let mut state = self.lock();
        state.ended += 1;
        let order = state.ended;
        let Some(query) = state.queries.get_mut(&id) else {
            return;
        };
        query.tasks.clear();
        query.ended = order;
        query.error = error.cloned();
        query.state = match error {
            Some(_) => QueryState::Failed,
            None => QueryState::Finished,
        };
        let (kind, keep) = match query.state {
            QueryState::Failed => (QueryState::Failed, KEEP_FAILED),
            _ => (QueryState::Finished, KEEP_FINISHED),
        };
        let mut ended: Vec<(u64, QueryId)> = state
            .queries
            .iter()
            .filter(|(_, q)| q.state == kind && !q.restarting.load(Ordering::Acquire))
            .map(|(&id, q)| (q.ended, id))
            .collect();
        if ended.len() > keep {
            ended.sort_unstable();
            for (_, old) in &ended[..ended.len() - keep] {
                state.queries.remove(old);
            }
        }
    }

    /// Where query `name` reads its streams from when it starts without a
    /// checkpoint: a durable session reads a push stream's log from where
    /// it stood when the query first started.
    pub fn set_start_positions(&self, name: &str, positions: Vec<SourceEntry>) {
        self.lock()
            .start_positions
            .insert(name.to_string(), positions);
    }

    /// The running queries.
    pub fn queries(&self) -> Vec<QueryInfo> {
        let mut queries = self.all_queries();
        queries.retain(|q| q.state == QueryState::Running);
        queries
    }

    /// The ids of the running queries and of those whose run ended to be
    /// replaced by a changed one (between [`Live::end_run_for_restart`]
    /// and [`Live::start_in_place`]): what still reads its streams and
    /// needs their logs.
    pub fn running_or_restarting(&self) -> Vec<QueryId> {
        self.lock()
            .queries
            .iter()
            .filter(|(_, q)| q.state == QueryState::Running || q.restarting.load(Ordering::Acquire))
            .map(|(&id, _)| id)
            .collect()
    }

    /// The running queries and the ended ones still kept, by id: failed
    /// ones until [`Live::forget`] removes them (at most [`KEEP_FAILED`]),
    /// the last [`KEEP_FINISHED`] finished ones. Stopped queries are not
    /// listed.
    pub fn all_queries(&self) -> Vec<QueryInfo> {
        self.lock()
            .queries
            .iter()
            .map(|(&id, q)| QueryInfo {
                id,
                label: q.label.clone(),
                state: q.state,
                error: q.error.clone(),
                rows_out: q.stats.rows_out.load(Ordering::Relaxed),
                late_rows: q.stats.late_rows.load(Ordering::Relaxed),
                sources: q
                    .sources
                    .iter()
                    .map(|(name, s)| {
                        (
                            name.clone(),
                            s.rows.load(Ordering::Relaxed),
                            s.bad_rows.load(Ordering::Relaxed),
                        )
                    })
                    .collect(),
                stats: q.stats.clone(),
                inputs: q.sources.clone(),
            })
            .collect()
    }
}

/// What a query's source ended with: `None` while it runs.
type SourceDone = watch::Receiver<Option<Result<(), String>>>;

/// A source's counters and its end.
type SourceHandle = (Arc<SourceStats>, SourceDone);

/// A stream, the query inputs reading it and where they start.
type GroupSource = (Arc<StreamDef>, Vec<Subscriber>, Option<SourcePosition>);

/// The queries being started together and the streams they read.
#[derive(Default)]
struct Group {
    /// Per stream and position to read from: its definition, the query
    /// inputs reading it and the position.
    sources: BTreeMap<SourceKey, GroupSource>,
    /// Where the group's window operators send late rows, by stream.
    late_outputs: HashMap<String, Vec<Arc<LateRows>>>,
}

impl Group {
    /// `late(s)` reads what the group's queries over `s` drop: a group
    /// without such a query has nothing to give it.
    fn check_late_streams(&self) -> Result<()> {
        for (stream, _, _) in self.sources.values() {
            if let Some(of) = &stream.late_of
                && !self.late_outputs.contains_key(of)
            {
                return Err(Error::Plan(format!(
                    "{} reads the rows that windowed queries over {of} drop as late; start it together with them (in the same `vigil run`)",
                    stream.name
                )));
            }
        }
        Ok(())
    }
}

/// The id and waiters a query started in place of another takes over.
struct Replaced {
    id: QueryId,
    life: Arc<watch::Sender<Option<Result<(), String>>>>,
}

/// A query whose tasks have started, not yet listed.
#[derive(Default)]
struct Wired {
    stats: Arc<QueryStats>,
    shapes: Vec<OperatorShape>,
    checkpoints: Option<Arc<QueryCheckpoints>>,
    /// The sources it reads, in order, once each.
    streams: Vec<SourceKey>,
    sources: Vec<(String, Arc<SourceStats>)>,
    tasks: Vec<JoinHandle<Result<()>>>,
}

/// Room taken for a pushed batch in one query: in its channel, or in its
/// disk buffer.
enum Room {
    Channel(super::channel::Reservation),
    Buffer(Arc<BufferedSender>),
}

impl Room {
    /// Sends `message` into the room (a disk buffer with room takes it
    /// without waiting).
    async fn send(self, message: Message) {
        match self {
            Room::Channel(room) => room.send(message),
            Room::Buffer(buffer) => {
                buffer.send(message).await;
            }
        }
    }
}

/// One reading of a stream: queries of a group restored to the same
/// position of a stream share it, others read it on their own.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct SourceKey {
    stream: String,
    /// The position as JSON; empty for the start.
    position: String,
}

impl SourceKey {
    fn new(stream: &str, position: Option<&SourcePosition>) -> Self {
        Self {
            stream: stream.to_string(),
            position: position
                .map(|p| serde_json::to_string(p).unwrap_or_default())
                .unwrap_or_default(),
        }
    }
}
