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

use super::{
    CHANNEL_CAPACITY, RunnableQuery, Subscriber, merge, run_late_source, run_sink, run_source,
    spawn_stages,
};
use crate::connectors::{Sink, SourceLocation, SourceStats};
use crate::error::{Error, Result};
use crate::exec::{END_OF_INPUT, LateRows, Message, QueryStats};
use crate::plan::StreamDef;
use crate::planner::{ExecutionMode, QueryGraph};

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
}

#[derive(Default)]
struct State {
    queries: BTreeMap<QueryId, Running>,
    hubs: HashMap<String, Hub>,
    /// Counts the queries that ended, to forget the oldest first.
    ended: u64,
}

/// What the live runtime knows of a query, running or ended.
struct Running {
    label: String,
    stats: Arc<QueryStats>,
    sources: Vec<(String, Arc<SourceStats>)>,
    tasks: Vec<tokio::task::AbortHandle>,
    done: watch::Receiver<Option<Result<(), String>>>,
    state: QueryState,
    /// Why it failed.
    error: Option<String>,
    /// When it ended, in the order queries end.
    ended: u64,
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
}

impl Live {
    /// An empty runtime. Queries run on the tokio runtime of the caller.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts `graph`, its results going to `sink`; `label` names it in
    /// listings. Must be called within a tokio runtime.
    pub fn start(&self, graph: QueryGraph, sink: Box<dyn Sink>, label: &str) -> Result<QueryId> {
        let query = RunnableQuery { graph, sink };
        let ids = self.start_all(vec![(query, label.to_string())])?;
        Ok(ids[0])
    }

    /// Starts `queries` together, each with its label: queries of the group
    /// that read the same file stream share one reading of it (a fixed
    /// script, whose queries are all known at the start), and `late(stream)`
    /// inputs get the rows the group's other queries drop as late. Queries
    /// started by separate calls read their files on their own. Must be
    /// called within a tokio runtime.
    pub fn start_all(&self, queries: Vec<(RunnableQuery, String)>) -> Result<Vec<QueryId>> {
        let mut group = Group::default();
        let mut wired = Vec::with_capacity(queries.len());
        for (query, label) in queries {
            wired.push((self.wire(query, &mut group)?, label));
        }
        group.check_late_streams()?;
        let sources = self.start_sources(group)?;
        let mut ids = Vec::with_capacity(wired.len());
        for (mut query, label) in wired {
            for stream in &query.streams {
                let (stats, watcher) = sources.get(stream).expect("every input has a source");
                query.sources.push((stream.clone(), stats.clone()));
                query.tasks.push(watch_source(watcher.clone()));
            }
            ids.push(self.track(query, &label));
        }
        Ok(ids)
    }

    /// Starts a query's tasks up to its sink; its inputs join `group`.
    fn wire(&self, query: RunnableQuery, group: &mut Group) -> Result<Wired> {
        let RunnableQuery { graph, sink } = query;
        let QueryGraph {
            inputs,
            join,
            stages,
            mode,
            stats,
            late_outputs,
            ..
        } = graph;
        let mut wired = Wired {
            stats: stats.clone(),
            ..Wired::default()
        };
        for (stream, output) in late_outputs {
            group.late_outputs.entry(stream).or_default().push(output);
        }
        let per_record = mode == ExecutionMode::PerRecord;
        let mut branches = Vec::with_capacity(inputs.len());
        for input in inputs {
            let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
            let stream = &input.stream;
            group
                .sources
                .entry(stream.name.clone())
                .or_insert_with(|| (stream.clone(), Vec::new()))
                .1
                .push(Subscriber { tx, per_record });
            if !wired.streams.contains(&stream.name) {
                wired.streams.push(stream.name.clone());
            }
            let output = spawn_stages(input.stages, rx, &mut wired.tasks);
            branches.push((output, stream.idle_timeout));
        }
        let merged = if branches.len() == 1 && join.is_none() {
            branches.pop().expect("one input").0
        } else {
            let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
            wired
                .tasks
                .push(tokio::spawn(merge::run(branches, join, tx)));
            rx
        };
        let output = spawn_stages(stages, merged, &mut wired.tasks);
        wired.tasks.push(tokio::task::spawn_blocking(move || {
            run_sink(sink, output, &stats)
        }));
        Ok(wired)
    }

    /// Starts one source per stream of a group: a push stream's hub, the
    /// late rows of the group's queries, or a reading of its own. Returns,
    /// per stream, its counters and what its source ended with.
    fn start_sources(&self, group: Group) -> Result<HashMap<String, SourceHandle>> {
        let Group {
            sources,
            late_outputs,
        } = group;
        let mut handles = HashMap::new();
        let mut state = self.lock();
        for (name, (stream, subscribers)) in sources {
            let (done_tx, done) = watch::channel(None);
            let stats = if stream.source.location == SourceLocation::Push {
                let hub = state.hubs.entry(name.clone()).or_default();
                for subscriber in subscribers {
                    if hub.ended {
                        let _ = subscriber.tx.try_send(Message::Watermark(END_OF_INPUT));
                    } else {
                        hub.subscribers.push(subscriber);
                    }
                }
                let _ = done_tx.send(Some(Ok(())));
                hub.stats.clone()
            } else {
                let stats = Arc::new(SourceStats::default());
                let task_stats = stats.clone();
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
                                run_source(&config, &task_stats, subscribers)
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
            handles.insert(name, (stats, done));
        }
        Ok(handles)
    }

    /// Lists a wired query and watches for its end.
    fn track(&self, query: Wired, label: &str) -> QueryId {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let Wired {
            stats,
            sources,
            tasks,
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
        };
        self.lock().queries.insert(id, running);
        let live = self.clone();
        tokio::spawn(async move {
            let outcome = wait_all(tasks).await.map_err(|e| e.to_string());
            // The listing shows the end before waiters learn of it, so a
            // waiter that then lists the queries sees it.
            live.ended(id, outcome.as_ref().err());
            let _ = done_tx.send(Some(outcome));
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
            .filter(|(_, q)| q.state == kind)
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
    /// the stream are counted and dropped, as a live feed would.
    pub async fn push(&self, stream: &str, batch: RecordBatch) -> Result<()> {
        let (subscribers, stats) = {
            let mut state = self.lock();
            let hub = state.hubs.entry(stream.to_string()).or_default();
            if hub.ended {
                return Err(Error::Connector(format!("stream {stream} has ended")));
            }
            hub.subscribers.retain(|s| !s.tx.is_closed());
            let senders: Vec<Subscriber> = hub
                .subscribers
                .iter()
                .map(|s| Subscriber {
                    tx: s.tx.clone(),
                    per_record: s.per_record,
                })
                .collect();
            (senders, hub.stats.clone())
        };
        stats
            .rows
            .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        for subscriber in &subscribers {
            subscriber.send_async(&batch).await;
        }
        Ok(())
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
            let _ = subscriber.tx.send(Message::Watermark(END_OF_INPUT)).await;
        }
    }

    /// Forgets push stream `stream` (it was dropped or replaced): the
    /// queries reading it see the end of its input, and a stream declared
    /// later under the same name starts with a hub of its own. Must be
    /// called within a tokio runtime: the end is sent by a task, as a busy
    /// query may not take it at once.
    pub fn retire_stream(&self, stream: &str) {
        let Some(hub) = self.lock().hubs.remove(stream) else {
            return;
        };
        tokio::spawn(async move {
            for subscriber in hub.subscribers {
                let _ = subscriber.tx.send(Message::Watermark(END_OF_INPUT)).await;
            }
        });
    }

    /// The running queries.
    pub fn queries(&self) -> Vec<QueryInfo> {
        let mut queries = self.all_queries();
        queries.retain(|q| q.state == QueryState::Running);
        queries
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
            })
            .collect()
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
        let done = self.lock().queries.get(&id).map(|q| q.done.clone());
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

/// The queries being started together and the streams they read.
#[derive(Default)]
struct Group {
    /// Per stream: its definition and the query inputs reading it.
    sources: BTreeMap<String, (Arc<StreamDef>, Vec<Subscriber>)>,
    /// Where the group's window operators send late rows, by stream.
    late_outputs: HashMap<String, Vec<Arc<LateRows>>>,
}

impl Group {
    /// `late(s)` reads what the group's queries over `s` drop: a group
    /// without such a query has nothing to give it.
    fn check_late_streams(&self) -> Result<()> {
        for (stream, _) in self.sources.values() {
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

/// A query whose tasks have started, not yet listed.
#[derive(Default)]
struct Wired {
    stats: Arc<QueryStats>,
    /// The streams it reads, in order, once each.
    streams: Vec<String>,
    sources: Vec<(String, Arc<SourceStats>)>,
    tasks: Vec<JoinHandle<Result<()>>>,
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
