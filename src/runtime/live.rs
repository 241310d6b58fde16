//! A live runtime: queries start and stop while the program runs (the REPL,
//! `vigil serve`, a program embedding vigil), and rows can be pushed into
//! streams.
//!
//! Unlike [`run`](super::run), which reads each stream once for a fixed set
//! of queries, every query started here reads its file sources on its own,
//! from the start, so a query typed later sees the whole file. Streams with
//! `connector = 'push'` have one hub each: pushed rows go to every query
//! reading the stream at that moment.

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
use crate::connectors::{Sink, SourceLocation, SourcePosition, SourceStats};
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

    /// Starts a query's tasks up to its sink, restored from its checkpoint
    /// if it has one; its inputs join `group`.
    fn wire(&self, query: NamedQuery, group: &mut Group) -> Result<Wired> {
        let NamedQuery {
            query:
                RunnableQuery {
                    mut graph,
                    mut sink,
                },
            name,
            ..
        } = query;
        let checkpoints = match (&self.coordinator, &name) {
            (Some(coordinator), Some(name)) => Some(Arc::new(QueryCheckpoints::open(
                coordinator.clone(),
                name,
                graph.stats.clone(),
            )?)),
            _ => None,
        };
        let shapes = super::checkpoint::graph_shapes(&mut graph)?;
        let allow = name
            .as_ref()
            .is_some_and(|n| self.lock().allow_non_restored.remove(n));
        let positions = match &checkpoints {
            Some(checkpoints) if allow => {
                checkpoints.restore_allowing(&mut graph, sink.as_mut(), true)?
            }
            Some(checkpoints) => checkpoints.restore(&mut graph, sink.as_mut())?,
            None => None,
        };
        // The checkpoint restored, for the disk buffers: right after a
        // restore, it is the only checkpoint kept that this run knows.
        let restored = match (&checkpoints, &positions) {
            (Some(checkpoints), Some(sources)) => {
                checkpoints.oldest_kept().map(|id| (id, sources.clone()))
            }
            _ => None,
        };
        let positions = positions.or_else(|| {
            let name = name.as_ref()?;
            self.lock().start_positions.get(name).cloned()
        });
        let QueryGraph {
            inputs,
            join,
            stages,
            mode,
            schema,
            stats,
            late_outputs,
            ..
        } = graph;
        let time_column = super::latency_column(
            &schema,
            inputs.first().and_then(|input| {
                let stream = &input.stream;
                stream
                    .event_time
                    .map(|i| stream.schema.field(i).name().as_str())
            }),
        );
        if let Some(errors) = sink.client_errors() {
            let _ = stats.sink_errors.set(errors);
        }
        let mut tasks = Vec::new();
        let mut wired = Wired {
            stats: stats.clone(),
            shapes,
            checkpoints: checkpoints.clone(),
            ..Wired::default()
        };
        let mut wiring = Wiring {
            tasks: &mut tasks,
            stats: &stats,
            checkpoints: checkpoints.as_ref(),
        };
        for (stream, output) in late_outputs {
            group.late_outputs.entry(stream).or_default().push(output);
        }
        let per_record = mode == ExecutionMode::PerRecord;
        let mut branches = Vec::with_capacity(inputs.len());
        for (i, input) in inputs.into_iter().enumerate() {
            let (tx, rx) = wiring.channel(format!("in{i} source"), &input_prefix(i, 0));
            let rx = if per_record { rx.per_record() } else { rx };
            let stream = &input.stream;
            let position = positions
                .as_ref()
                .and_then(|p| position_of(p, &stream.name));
            let key = SourceKey::new(&stream.name, position.as_ref());
            let buffer = match stream.buffer.disk_bytes() {
                Some(max_bytes) => {
                    let place = self.buffer_place(name.as_deref(), i, &stream.name, &restored)?;
                    let opened =
                        BufferedSender::open(tx.clone(), max_bytes, place, checkpoints.clone())?;
                    // The drain reads the buffer's files: on a thread of its
                    // own, not a worker of the runtime.
                    let drain = opened.1;
                    wiring.tasks.push(tokio::task::spawn_blocking(move || {
                        futures::executor::block_on(drain)
                    }));
                    Some(Arc::new(opened.0))
                }
                None => None,
            };
            group
                .sources
                .entry(key.clone())
                .or_insert_with(|| (stream.clone(), Vec::new(), position))
                .1
                .push(Subscriber {
                    tx,
                    checkpoints: checkpoints.clone(),
                    buffer,
                });
            if !wired.streams.contains(&key) {
                wired.streams.push(key);
            }
            let prefix = move |j| input_prefix(i, j);
            let output = spawn_stages(input.stages, rx, &prefix, &mut wiring);
            branches.push((output, stream.idle_timeout));
        }
        let merged = if branches.len() == 1 && join.is_none() {
            branches.pop().expect("one input").0
        } else {
            merge::spawn(branches, join, &stage_prefix(0), &mut wiring)
        };
        let output = spawn_stages(stages, merged, &stage_prefix, &mut wiring);
        let (sink_stats, sink_checkpoints) = (stats.clone(), checkpoints.clone());
        wiring.tasks.push(tokio::task::spawn_blocking(move || {
            run_sink(sink, output, &sink_stats, sink_checkpoints, time_column)
        }));
        wired.tasks = tasks;
        Ok(wired)
    }

    /// Where input `input` (reading `stream`) of query `name` keeps its disk
    /// buffer, and what the checkpoint restored (`restored`) says of it.
    fn buffer_place(
        &self,
        name: Option<&str>,
        input: usize,
        stream: &str,
        restored: &Option<(u64, Vec<SourceEntry>)>,
    ) -> Result<BufferPlace> {
        // The buffers are local files: beside a store on the local file
        // system, in a temporary folder beside one on an object store.
        let root = self
            .coordinator
            .as_ref()
            .and_then(|c| c.config().dir.local_path());
        let dir = match (root, name) {
            (Some(root), Some(name)) => Some(buffer_dir(&root, name, input, stream)?),
            _ => None,
        };
        let restored = restored.as_ref().and_then(|(id, sources)| {
            let entry = sources.iter().find(|s| s.stream == stream)?;
            Some((*id, entry.clone()))
        });
        Ok(BufferPlace { dir, restored })
    }

    /// Starts one source per stream of a group: a push stream's hub, the
    /// late rows of the group's queries, or a reading of its own. Returns,
    /// per stream, its counters and what its source ended with.
    fn start_sources(&self, group: Group) -> Result<HashMap<SourceKey, SourceHandle>> {
        let Group {
            sources,
            late_outputs,
        } = group;
        let mut handles = HashMap::new();
        // Barriers asked for from now on go through the group's sources.
        let first_barrier = self.coordinator.as_ref().map_or(0, |c| c.first_barrier());
        let mut state = self.lock();
        for (key, (stream, subscribers, position)) in sources {
            let (done_tx, done) = watch::channel(None);
            let stats = if stream.source.location == SourceLocation::Push {
                let hub = state.hubs.entry(stream.name.clone()).or_default();
                if let (Some(wal), Some(position)) = (hub.wal.clone(), position) {
                    report_buffers(&subscribers, &hub.stats);
                    let live = self.clone();
                    let gate = hub.gate.clone();
                    let name = stream.name.clone();
                    let joining = Joining::start(&hub.joining);
                    tokio::spawn(async move {
                        live.join_replayed(&name, &wal, &gate, position.rows, subscribers)
                            .await;
                        drop(joining);
                    });
                    let _ = done_tx.send(Some(Ok(())));
                    handles.insert(key, (hub.stats.clone(), done));
                    continue;
                }
                for subscriber in subscribers {
                    if let Some(buffer) = &subscriber.buffer {
                        buffer.report_to(hub.stats.clone());
                    }
                    if hub.ended {
                        end_soon(subscriber);
                    } else {
                        hub.subscribers.push(subscriber);
                    }
                }
                let _ = done_tx.send(Some(Ok(())));
                hub.stats.clone()
            } else {
                let stats = Arc::new(SourceStats::default());
                report_buffers(&subscribers, &stats);
                let task_stats = stats.clone();
                let coordinator = self.coordinator.clone().map(|c| (c, first_barrier));
                let late = stream.late_of.as_ref().map(|of| {
                    let (tx, rx) = mpsc::unbounded_channel();
                    for output in late_outputs.get(of).into_iter().flatten() {
                        output.subscribe(tx.clone());
                    }
                    rx
                });
                tokio::spawn(async move {
                    let outcome = match late {
                        Some(rx) => run_late_source(rx, subscribers, task_stats).await,
                        None => {
                            let config = stream.source.clone();
                            tokio::task::spawn_blocking(move || {
                                run_source(&config, &task_stats, subscribers, position, coordinator)
                            })
                            .await
                            .unwrap_or_else(|e| {
                                Err(Error::Connector(format!("a task failed: {e}")))
                            })
                        }
                    };
                    let _ = done_tx.send(Some(outcome.map_err(|e| e.to_string())));
                });
                stats
            };
            handles.insert(key, (stats, done));
        }
        Ok(handles)
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

    /// Sends `batch` to every query reading push stream `stream`, waiting
    /// while they are busy (back-pressure). Rows pushed while no query reads
    /// the stream are counted and dropped, as a live feed would. A stream
    /// with a write-ahead log (see [`Live::attach_wal`]) appends the batch
    /// to it first: when this returns `Ok`, the batch is on disk. The work
    /// runs on a task of its own, so a caller that gives up waiting cannot
    /// leave a logged batch half handed out.
    pub async fn push(&self, stream: &str, batch: RecordBatch) -> Result<()> {
        self.push_until(stream, batch, None).await
    }

    /// Sends `batch` like [`Live::push`], but waits at most `timeout` for
    /// the stream's queries to have room for it; then gives up with
    /// [`Error::Busy`], having handed out nothing. With a write-ahead log,
    /// the room is looked for before the batch is logged, and a logged
    /// batch is always handed out: if other pushes took the room meanwhile,
    /// this one waits for it past `timeout`, holding only its own rows.
    pub async fn push_within(
        &self,
        stream: &str,
        batch: RecordBatch,
        timeout: std::time::Duration,
    ) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        self.push_until(stream, batch, Some(deadline)).await
    }

    async fn push_until(
        &self,
        stream: &str,
        batch: RecordBatch,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<()> {
        let (wal, order) = {
            let mut state = self.lock();
            let hub = state.hubs.entry(stream.to_string()).or_default();
            if hub.ended {
                return Err(Error::Connector(format!("stream {stream} has ended")));
            }
            (hub.wal.clone(), hub.order.clone())
        };
        let Some(wal) = wal else {
            return self.deliver(stream, batch, None, deadline).await;
        };
        if let Some(deadline) = deadline {
            self.wait_for_room(stream, &batch, deadline).await?;
        }
        let live = self.clone();
        let stream = stream.to_string();
        tokio::spawn(async move { live.push_logged(&stream, &wal, &order, batch).await })
            .await
            .unwrap_or_else(|e| Err(Error::Connector(format!("a push failed: {e}"))))
    }

    /// Appends `batch` to the log, then hands it out in log order, with
    /// the hub's position set to its sequence number.
    async fn push_logged(
        &self,
        stream: &str,
        wal: &Arc<Wal>,
        order: &Sequencer,
        batch: RecordBatch,
    ) -> Result<()> {
        let (ticket, appended) = {
            let mut next = order.next.lock().await;
            *next += 1;
            let (wal, logged) = (wal.clone(), batch.clone());
            let mut append = Box::pin(async move { wal.append(&logged).await });
            // The first poll queues the record; holding the lock over it
            // makes ticket order the log's order.
            let first = futures::poll!(&mut append);
            (*next, (first, append))
        };
        let outcome = match appended {
            (std::task::Poll::Ready(outcome), _) => outcome,
            (std::task::Poll::Pending, append) => append.await,
        };
        let mut done = order.done.subscribe();
        let _ = done.wait_for(|&d| d + 1 >= ticket).await;
        let result = match outcome {
            Ok(seq) => self.deliver(stream, batch, Some(seq), None).await,
            Err(e) => Err(e),
        };
        order.done.send_replace(ticket);
        result
    }

    /// The live subscribers of push stream `stream`, and its gate and
    /// counters.
    fn hub_parts(&self, stream: &str) -> (Arc<tokio::sync::Mutex<()>>, Arc<SourceStats>) {
        let mut state = self.lock();
        let hub = state.hubs.entry(stream.to_string()).or_default();
        (hub.gate.clone(), hub.stats.clone())
    }

    fn live_subscribers(&self, stream: &str) -> Vec<Subscriber> {
        let mut state = self.lock();
        state
            .hubs
            .entry(stream.to_string())
            .or_default()
            .listening()
    }

    /// Hands `batch` to the stream's subscribers; its position becomes
    /// `seq` (a logged batch) or goes up by one. With a deadline, takes room
    /// in every subscriber first and hands out nothing if it cannot by then.
    async fn deliver(
        &self,
        stream: &str,
        batch: RecordBatch,
        seq: Option<u64>,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<()> {
        let (gate, stats) = self.hub_parts(stream);
        let _turn = gate.lock().await;
        let subscribers = self.live_subscribers(stream);
        let started = std::time::Instant::now();
        let rooms = match deadline {
            Some(deadline) => Some(reserve_all(&subscribers, stream, &batch, deadline).await?),
            None => None,
        };
        if let Some(hub) = self.lock().hubs.get_mut(stream) {
            hub.pushed = seq.unwrap_or(hub.pushed + 1);
        }
        stats
            .rows
            .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        match rooms {
            Some(rooms) => {
                for room in rooms.into_iter().flatten() {
                    room.send(Message::Batch(batch.clone())).await;
                }
            }
            None => {
                for subscriber in &subscribers {
                    subscriber.send_async(&batch).await;
                }
            }
        }
        let waited = started.elapsed().as_nanos() as u64;
        stats.blocked_ns.fetch_add(waited, Ordering::Relaxed);
        Ok(())
    }

    /// Waits until every query reading `stream` has room for `batch`, or
    /// fails with [`Error::Busy`] at `deadline`.
    async fn wait_for_room(
        &self,
        stream: &str,
        batch: &RecordBatch,
        deadline: tokio::time::Instant,
    ) -> Result<()> {
        let subscribers = self.live_subscribers(stream);
        reserve_all(&subscribers, stream, batch, deadline).await?;
        Ok(())
    }

    /// Makes push stream `stream` durable: later pushes are appended to
    /// `wal` before queries see them, and its position (what checkpoints
    /// record) is the log's sequence number, starting from the log's last.
    pub fn attach_wal(&self, stream: &str, wal: Arc<Wal>) {
        let mut state = self.lock();
        let hub = state.hubs.entry(stream.to_string()).or_default();
        hub.pushed = hub.pushed.max(wal.last_seq());
        hub.wal = Some(wal);
    }

    /// The write-ahead logs of the push streams, by stream.
    pub fn wals(&self) -> Vec<(String, Arc<Wal>)> {
        let mut wals: Vec<(String, Arc<Wal>)> = self
            .lock()
            .hubs
            .iter()
            .filter_map(|(name, hub)| Some((name.clone(), hub.wal.clone()?)))
            .collect();
        wals.sort_by(|a, b| a.0.cmp(&b.0));
        wals
    }

    /// The position of push stream `stream`: batches handed out so far, or
    /// the sequence number of the last one with a write-ahead log.
    pub fn pushed(&self, stream: &str) -> u64 {
        self.lock().hubs.get(stream).map_or(0, |hub| hub.pushed)
    }

    /// Where query `name` reads its streams from when it starts without a
    /// checkpoint: a durable session reads a push stream's log from where
    /// it stood when the query first started.
    pub fn set_start_positions(&self, name: &str, positions: Vec<SourceEntry>) {
        self.lock()
            .start_positions
            .insert(name.to_string(), positions);
    }

    /// Gives `subscribers` (queries restored to position `after` of push
    /// stream `stream`) the logged batches after it, then lets them join
    /// the stream's hub. Holding the gate, no batch is handed out
    /// meanwhile: they see every batch once, in order.
    async fn join_replayed(
        &self,
        stream: &str,
        wal: &Arc<Wal>,
        gate: &tokio::sync::Mutex<()>,
        after: u64,
        subscribers: Vec<Subscriber>,
    ) {
        let _turn = gate.lock().await;
        let through = self.pushed(stream);
        let reading = wal.clone();
        let records = tokio::task::spawn_blocking(move || reading.replay(after))
            .await
            .unwrap_or_else(|e| Err(Error::Connector(format!("a task failed: {e}"))));
        let records = match records {
            Ok(records) => records,
            Err(e) => {
                crate::diag::warning!("stream {stream}: cannot replay its log: {e}");
                Vec::new()
            }
        };
        if let Some((first, _)) = records.first()
            && *first > after + 1
        {
            crate::diag::warning!(
                "stream {stream}: the log no longer holds batches {} to {}; the restored queries miss them",
                after + 1,
                first - 1
            );
        }
        for (seq, batch) in records {
            if seq > through {
                break;
            }
            for subscriber in &subscribers {
                subscriber.send_async(&batch).await;
            }
        }
        let mut state = self.lock();
        match state.hubs.get_mut(stream).filter(|h| !h.ended) {
            Some(hub) => hub.subscribers.extend(subscribers),
            None => {
                for subscriber in subscribers {
                    end_soon(subscriber);
                }
            }
        }
    }

    /// The counters of push stream `stream` (rows pushed, bad rows).
    pub fn push_stats(&self, stream: &str) -> Arc<SourceStats> {
        self.lock()
            .hubs
            .entry(stream.to_string())
            .or_default()
            .stats
            .clone()
    }

    /// Ends push stream `stream`: its queries see the end of input (every
    /// window fires) and finish.
    pub async fn end_stream(&self, stream: &str) {
        let subscribers = {
            let mut state = self.lock();
            let hub = state.hubs.entry(stream.to_string()).or_default();
            hub.ended = true;
            std::mem::take(&mut hub.subscribers)
        };
        for subscriber in subscribers {
            subscriber
                .send_message(Message::Watermark(END_OF_INPUT))
                .await;
        }
    }

    /// Forgets push stream `stream` (it was dropped or replaced): the
    /// queries reading it see the end of its input, and a stream declared
    /// later under the same name starts with a hub of its own. Must be
    /// called within a tokio runtime: the end is sent by a task, as a busy
    /// query may not take it at once.
    pub fn retire_stream(&self, stream: &str) {
        let Some(mut hub) = self.lock().hubs.remove(stream) else {
            return;
        };
        // The log closes now, before a stream of the same name opens it.
        drop(hub.wal.take());
        tokio::spawn(async move {
            for subscriber in hub.subscribers {
                subscriber
                    .send_message(Message::Watermark(END_OF_INPUT))
                    .await;
            }
        });
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

    /// Stops queries `ids` after one more checkpoint, taken for them all:
    /// their sources stop right after its barrier (without the end of
    /// input, so open windows stay open in it), and each query ends once
    /// its sink has written the checkpoint and committed what it holds, so
    /// whoever restores it next repeats nothing. Queries that share a file
    /// source with them stop too. A push stream goes on for its other
    /// readers: these queries leave it right after the barrier, which the
    /// stream's gate keeps between two pushes, and the rows pushed later
    /// are in its log for whoever restores them. Waits up to `timeout` for
    /// them all to end; false if one did not (it is still running:
    /// [`Live::stop`] cancels it), or if checkpoints are off.
    pub async fn stop_at_checkpoint(&self, ids: &[QueryId], timeout: std::time::Duration) -> bool {
        let Some(coordinator) = self.coordinator.clone() else {
            return false;
        };
        let (files, pushed) = self.sources_by_kind(ids);
        let id = coordinator.request();
        for source in &files {
            source.stop_after.store(id, Ordering::Release);
        }
        let ended = async {
            for (stream, queries) in &pushed {
                self.leave_at_barrier(stream, queries, id).await;
            }
            for &query in ids {
                self.wait_run(query).await;
            }
        };
        tokio::time::timeout(timeout, ended).await.is_ok()
    }

    /// The file sources of queries `ids`, and per push stream they read,
    /// the checkpoints of the queries of `ids` reading it.
    fn sources_by_kind(&self, ids: &[QueryId]) -> (Vec<Arc<SourceStats>>, Vec<PushReaders>) {
        let state = self.lock();
        let mut files = Vec::new();
        let mut pushed: Vec<PushReaders> = Vec::new();
        for id in ids {
            let Some(query) = state.queries.get(id) else {
                continue;
            };
            for (name, stats) in &query.sources {
                let hub = state
                    .hubs
                    .values()
                    .any(|hub| Arc::ptr_eq(&hub.stats, stats));
                match (hub, &query.checkpoints) {
                    (false, _) => files.push(stats.clone()),
                    (true, Some(checkpoints)) => {
                        match pushed.iter_mut().find(|(stream, _)| stream == name) {
                            Some((_, queries)) => queries.push(checkpoints.clone()),
                            None => pushed.push((name.clone(), vec![checkpoints.clone()])),
                        }
                    }
                    (true, None) => {}
                }
            }
        }
        (files, pushed)
    }

    /// Sends barrier `id` to the readers of push stream `stream` that
    /// collect their checkpoints in `queries`, and takes them off it: the
    /// barrier is the last message their input gets, so they end without
    /// the end of input.
    async fn leave_at_barrier(&self, stream: &str, queries: &[Arc<QueryCheckpoints>], id: u64) {
        let Some((gate, joining)) = self
            .lock()
            .hubs
            .get(stream)
            .map(|hub| (hub.gate.clone(), hub.joining.subscribe()))
        else {
            return;
        };
        // A run just started may still be catching up from the log, not
        // yet among the subscribers: the barrier would miss it and it
        // would never end. Its join ends soon (it replays what the log
        // holds), and no new one starts for a query being stopped.
        let mut joining = joining;
        let _ = joining.wait_for(|n| *n == 0).await;
        let _turn = gate.lock().await;
        let (leaving, pushed) = {
            let mut state = self.lock();
            let Some(hub) = state.hubs.get_mut(stream) else {
                return;
            };
            let (leaving, staying) = std::mem::take(&mut hub.subscribers)
                .into_iter()
                .partition::<Vec<_>, _>(|s| {
                    s.checkpoints
                        .as_ref()
                        .is_some_and(|c| queries.iter().any(|q| Arc::ptr_eq(c, q)))
                });
            hub.subscribers = staying;
            (leaving, hub.pushed)
        };
        let position = SourcePosition {
            rows: pushed,
            ..SourcePosition::default()
        };
        for subscriber in leaving {
            subscriber.add_source(id, stream, Some(position.clone()));
            subscriber.send_message(Message::Barrier(id)).await;
        }
    }

    /// Stops query `id`: its tasks are cancelled, its sink finishes with
    /// what it has and it is no longer listed. False if no such query is
    /// running.
    pub fn stop(&self, id: QueryId) -> bool {
        let query = {
            let mut state = self.lock();
            match state.queries.get(&id) {
                Some(q) if q.state == QueryState::Running => state.queries.remove(&id),
                _ => None,
            }
        };
        let Some(query) = query else {
            return false;
        };
        for task in &query.tasks {
            task.abort();
        }
        true
    }

    /// Removes ended (failed or finished) query `id` from the listing;
    /// false if no such query is kept or it is still running.
    pub fn forget(&self, id: QueryId) -> bool {
        let mut state = self.lock();
        match state.queries.get(&id) {
            Some(q) if q.state != QueryState::Running => state.queries.remove(&id).is_some(),
            _ => false,
        }
    }

    /// Waits until query `id` ends (its inputs ended, or it was stopped);
    /// its error, if it failed. The query is looked up when this is called,
    /// so the future borrows nothing and can be awaited later; it resolves
    /// at once for an unknown id.
    pub fn wait(&self, id: QueryId) -> impl Future<Output = Result<()>> + Send + 'static {
        let done = self.lock().queries.get(&id).map(|q| q.life.subscribe());
        async move {
            let Some(mut done) = done else {
                return Ok(());
            };
            loop {
                if let Some(outcome) = done.borrow().clone() {
                    return outcome.map_err(Error::Connector);
                }
                if done.changed().await.is_err() {
                    return Ok(());
                }
            }
        }
    }

    /// Waits until the current run of query `id` ends (unlike
    /// [`Live::wait`], also a run that ends to be replaced).
    async fn wait_run(&self, id: QueryId) {
        let done = self.lock().queries.get(&id).map(|q| q.done.clone());
        if let Some(mut done) = done {
            let _ = done.wait_for(|outcome| outcome.is_some()).await;
        }
    }

    /// Stops every query and ends every push stream.
    pub async fn shutdown(&self) {
        let ids: Vec<QueryId> = self.queries().iter().map(|q| q.id).collect();
        for id in ids {
            self.stop(id);
        }
        let streams: Vec<String> = self.lock().hubs.keys().cloned().collect();
        for stream in streams {
            self.end_stream(&stream).await;
        }
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

/// Takes room for `batch` in every subscriber (`None` for one that has
/// stopped listening), or fails with [`Error::Busy`] if one of them has
/// none by `deadline`. A query with a disk buffer has room while its buffer
/// does.
async fn reserve_all(
    subscribers: &[Subscriber],
    stream: &str,
    batch: &RecordBatch,
    deadline: tokio::time::Instant,
) -> Result<Vec<Option<Room>>> {
    let rows = batch.num_rows();
    let mut rooms = Vec::with_capacity(subscribers.len());
    for subscriber in subscribers {
        let reserved = match &subscriber.buffer {
            Some(buffer) => buffer.room_within(batch, deadline).await.map(|room| {
                room.map(|channel| match channel {
                    Some(channel) => Room::Channel(channel),
                    None => Room::Buffer(buffer.clone()),
                })
            }),
            None => subscriber
                .tx
                .reserve_within(rows, deadline)
                .await
                .map(|room| room.map(Room::Channel)),
        };
        match reserved {
            Ok(Some(room)) => rooms.push(Some(room)),
            Ok(None) => {
                return Err(Error::Busy {
                    message: format!(
                        "stream {stream}: its queries are behind and had no room for {rows} rows within the ingest timeout"
                    ),
                    retry_after: std::time::Duration::from_secs(1),
                });
            }
            Err(super::channel::Closed) => rooms.push(None),
        }
    }
    Ok(rooms)
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

/// Adds the disk buffers of `subscribers` to their source's counters.
fn report_buffers(subscribers: &[Subscriber], stats: &Arc<SourceStats>) {
    for buffer in subscribers.iter().filter_map(|s| s.buffer.as_ref()) {
        buffer.report_to(stats.clone());
    }
}

/// Sends the end of input to a query that joins a stream which has ended:
/// at once when it has room (and no disk buffer), else from a task.
fn end_soon(subscriber: Subscriber) {
    if subscriber.buffer.is_none() && subscriber.tx.try_send(Message::Watermark(END_OF_INPUT)) {
        return;
    }
    tokio::spawn(async move {
        subscriber
            .send_message(Message::Watermark(END_OF_INPUT))
            .await;
    });
}

/// Where a checkpoint left `stream`.
fn position_of(sources: &[SourceEntry], stream: &str) -> Option<SourcePosition> {
    sources
        .iter()
        .find(|s| s.stream == stream)
        .and_then(|s| s.position.clone())
}

/// A task of a query that ends with its source's error, or when the
/// source ends.
fn watch_source(mut done: SourceDone) -> JoinHandle<Result<()>> {
    tokio::spawn(async move {
        loop {
            if let Some(outcome) = done.borrow().clone() {
                return outcome.map_err(Error::Connector);
            }
            if done.changed().await.is_err() {
                return Ok(());
            }
        }
    })
}

/// Waits for every task of a query; the first error, in the order they
/// fail. A failure stops the other tasks: a query whose operator failed
/// must not keep reading (another input of a join would keep it running).
async fn wait_all(tasks: Vec<JoinHandle<Result<()>>>) -> Result<()> {
    let mut first_error = None;
    let mut pending = tasks;
    while !pending.is_empty() {
        let (joined, _, rest) = futures::future::select_all(pending).await;
        pending = rest;
        let outcome = match joined {
            Ok(outcome) => outcome,
            Err(e) if e.is_cancelled() => Ok(()),
            Err(e) => Err(Error::Connector(format!("a task failed: {e}"))),
        };
        if let Err(e) = outcome
            && first_error.is_none()
        {
            first_error = Some(e);
            for task in &pending {
                task.abort();
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}
