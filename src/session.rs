//! Embedding vigil: a [`Session`] plans SQL, runs continuous queries in the
//! background, takes rows pushed by the program and hands results and
//! alerts back as async streams. The REPL and `vigil serve` are built on it.
//!
//! ```no_run
//! # async fn demo() -> vigil::error::Result<()> {
//! use futures::StreamExt;
//! use vigil::session::{Executed, Session};
//!
//! let mut session = Session::new();
//! session.execute(
//!     "CREATE STREAM events (ts TIMESTAMP, host TEXT, cpu DOUBLE,
//!        WATERMARK FOR ts AS ts) WITH (connector = 'push');
//!      CREATE ALERT hot AS SELECT ts, host, cpu FROM events
//!      ALERT BY host WHEN cpu > 90;",
//! )?;
//! let mut alerts = session.alerts();
//! session.push_json("events", r#"{"ts": 1000, "host": "a", "cpu": 95}"#).await?;
//! session.push_json("events", r#"{"ts": 2000, "host": "a", "cpu": 10}"#).await?;
//! let firing = alerts.next().await; // the alert's `firing` row
//! session.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Streams read from files are read by each query from the start; streams
//! declared with `connector = 'push'` (or registered with
//! [`Session::register_stream`]) take rows from [`Session::push`],
//! [`Session::push_json`] and [`Session::push_csv`], and give them to every
//! query reading the stream at that moment.
//!
//! # Durable state
//!
//! A session built with [`SessionBuilder::state_dir`] keeps its queries'
//! state in that folder and picks it up again when a session is built on
//! the same folder and runs the same statements (after a crash, say):
//!
//! - `checkpoints/`: each query's checkpoints, taken every
//!   [`SessionBuilder::checkpoint_interval`] (by default
//!   [`checkpoint::DEFAULT_INTERVAL`], 10 s), under its name: the alert's
//!   name, what `SET query_name` said, or else `query-<n>` for the n-th
//!   query the session started. A query started again under a name that
//!   has a checkpoint is restored from it.
//! - `wal/`: one write-ahead log per push stream. A push returns once its
//!   rows are on disk (fsynced; concurrent pushes into a stream share one
//!   fsync, so a push waits at most for the fsync in flight and its own);
//!   a restored query is given the logged rows after its checkpoint before
//!   it reads new ones, so every row whose push returned `Ok` is seen
//!   exactly once. A push that never returned (the process died) may or may
//!   not have been logged. The log is cut behind the oldest position the
//!   kept checkpoints of the queries reading it need; a log full
//!   ([`SessionBuilder::max_wal_bytes`]) refuses pushes with
//!   [`Error::Overloaded`] until then.
//! - `starts.jsonl`: where each query first read each push stream's log,
//!   for a query that crashed before its first checkpoint.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::logical_expr::LogicalPlan;
use futures::Stream;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;

use crate::connectors::{
    Decoding, Format, Replay, Sink, SourceConfig, SourceLocation, SourceStats, open_sink,
    read_bytes,
};
use crate::engine::{Dropped, Engine, Outcome, PreparedQuery};
use crate::error::{Error, Result};
use crate::plan::listing::{Listing, QUERY_COLUMNS};
use crate::plan::{AlertNode, StreamDef};
use crate::runtime::checkpoint::{self, CheckpointConfig, CheckpointStats};
pub use crate::runtime::live::QueryState;
use crate::runtime::live::{Live, QueryId, QueryInfo};
use crate::runtime::wal::{Wal, WalOptions};
use crate::sql::parse_script;
use crate::sql::{ObjectKind, Statement};
use crate::state::store::{QueryStore, SourceEntry};

mod autoscale;
mod change;
mod durable;
mod push;
pub use autoscale::{Autoscaling, DECISIONS_KEPT, Rescales, ScaleStep};
pub use change::{Changed, PendingChange};

/// Result batches a query's handle buffers before the query waits for its
/// reader.
const RESULT_BUFFER: usize = 64;
/// Alert batches kept for slow alert subscribers before they miss some.
const ALERT_BUFFER: usize = 1024;

/// An engine with running queries.
pub struct Session {
    engine: Engine,
    live: Live,
    base_dir: PathBuf,
    alerts: broadcast::Sender<RecordBatch>,
    /// The query each `CREATE ALERT` started, by alert name: stopped when
    /// the alert is dropped or replaced.
    alert_queries: std::sync::Mutex<std::collections::HashMap<String, QueryId>>,
    /// The state folder and what is kept there, for a durable session.
    durable: Option<Arc<Durable>>,
    /// What each query started was planned from, to change it while it
    /// runs.
    origins: std::sync::Mutex<std::collections::HashMap<QueryId, change::Origin>>,
}

/// Builds a [`Session`], durable if given a state folder.
#[derive(Debug, Clone, Default)]
pub struct SessionBuilder {
    state_dir: Option<PathBuf>,
    interval: Option<std::time::Duration>,
    keep: Option<usize>,
    max_wal_bytes: Option<u64>,
    from_savepoint: Option<PathBuf>,
    parallelism: Option<usize>,
    stop_after_rows: Option<u64>,
}

impl SessionBuilder {
    /// Keeps checkpoints and write-ahead logs in `dir` (see the [module
    /// docs](self)).
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// Time between two checkpoints; [`checkpoint::DEFAULT_INTERVAL`]
    /// (10 s) unless set.
    pub fn checkpoint_interval(mut self, interval: std::time::Duration) -> Self {
        self.interval = Some(interval);
        self
    }

    /// Complete checkpoints kept per query; [`checkpoint::DEFAULT_KEEP`]
    /// unless set.
    pub fn keep_checkpoints(mut self, keep: usize) -> Self {
        self.keep = Some(keep);
        self
    }

    /// Most bytes each push stream's write-ahead log may hold; pushes past
    /// it get [`Error::Overloaded`]. 1 GiB unless set.
    pub fn max_wal_bytes(mut self, bytes: u64) -> Self {
        self.max_wal_bytes = Some(bytes);
        self
    }

    /// Restores queries from the savepoint in `path` (see
    /// [`Session::savepoint`]) rather than from their newest checkpoints.
    pub fn from_savepoint(mut self, path: impl Into<PathBuf>) -> Self {
        self.from_savepoint = Some(path.into());
        self
    }

    /// Stops each query, as [`Session::shutdown`] does, with a checkpoint,
    /// once one of its sources has read `rows` rows: a later session on the
    /// same state folder goes on from there (for tests and demonstrations
    /// of restoring).
    pub fn stop_after_rows(mut self, rows: u64) -> Self {
        self.stop_after_rows = Some(rows);
        self
    }

    /// Runs each stage whose state is per key as `instances` instances
    /// (see [`Engine::set_parallelism`]); one per core unless set.
    pub fn parallelism(mut self, instances: usize) -> Self {
        self.parallelism = Some(instances);
        self
    }

    /// The session; a durable one creates its state folder.
    pub fn build(self) -> Result<Session> {
        let mut session = Session::new();
        if let Some(instances) = self.parallelism {
            session.engine.set_parallelism(instances)?;
        }
        let Some(dir) = self.state_dir else {
            if self.from_savepoint.is_some() {
                return Err(Error::Plan(
                    "restoring from a savepoint needs a state directory".into(),
                ));
            }
            if self.stop_after_rows.is_some() {
                return Err(Error::Plan(
                    "stopping with a checkpoint needs a state directory".into(),
                ));
            }
            return Ok(session);
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
        let mut config = CheckpointConfig::new(dir.join("checkpoints"));
        config.interval = self.interval.unwrap_or(checkpoint::DEFAULT_INTERVAL);
        config.keep = self.keep.unwrap_or(checkpoint::DEFAULT_KEEP).max(1);
        config.from_savepoint = self.from_savepoint.map(Into::into);
        config.stop_after_rows = self.stop_after_rows;
        let mut wal = WalOptions::default();
        if let Some(max) = self.max_wal_bytes {
            wal.max_bytes = max;
            wal.segment_bytes = wal.segment_bytes.min((max / 4).max(1));
        }
        session.durable = Some(Arc::new(Durable::open(&dir, config.clone(), wal)?));
        session.live = Live::with_checkpoints(config);
        Ok(session)
    }
}

/// What a durable session keeps in its state folder.
struct Durable {
    dir: PathBuf,
    checkpoints: CheckpointConfig,
    wal: WalOptions,
    /// Queries started so far: the unnamed ones are named by it.
    started: std::sync::atomic::AtomicU64,
    /// Where each query first read the push streams' logs, by query name.
    starts: std::sync::Mutex<std::collections::HashMap<String, Vec<SourceEntry>>>,
    /// The checkpointed queries started: name and the push streams read.
    running: std::sync::Mutex<std::collections::HashMap<QueryId, (String, Vec<String>)>>,
    /// The log-trimming task has started.
    trimming: std::sync::atomic::AtomicBool,
}

/// One line of `starts.jsonl`.
#[derive(serde::Serialize, serde::Deserialize)]
struct StartRecord {
    query: String,
    sources: Vec<SourceEntry>,
}

const STARTS_FILE: &str = "starts.jsonl";

impl Durable {
    fn open(dir: &Path, checkpoints: CheckpointConfig, wal: WalOptions) -> Result<Self> {
        let mut starts = std::collections::HashMap::new();
        let path = dir.join(STARTS_FILE);
        if path.exists() {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
            // A torn last line (a crash while writing it) is skipped: its
            // query had not been told it started.
            for line in text.lines() {
                if let Ok(record) = serde_json::from_str::<StartRecord>(line) {
                    starts.entry(record.query).or_insert(record.sources);
                }
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            checkpoints,
            wal,
            started: Default::default(),
            starts: std::sync::Mutex::new(starts),
            running: Default::default(),
            trimming: Default::default(),
        })
    }

    fn wal_dir(&self) -> PathBuf {
        self.dir.join("wal")
    }

    /// Where query `name` starts reading when it has no checkpoint: the
    /// recorded start, or else `now`, recorded (fsynced) for next time.
    fn start_of(&self, name: &str, now: Vec<SourceEntry>) -> Result<Vec<SourceEntry>> {
        let mut starts = self.starts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sources) = starts.get(name) {
            return Ok(sources.clone());
        }
        let record = StartRecord {
            query: name.to_string(),
            sources: now.clone(),
        };
        let line = serde_json::to_string(&record)
            .map_err(|e| Error::Connector(format!("cannot record the start of {name}: {e}")))?;
        append_synced(&self.dir.join(STARTS_FILE), &line)?;
        starts.insert(name.to_string(), now.clone());
        Ok(now)
    }

    /// The oldest log position of `stream` that query `name` may still
    /// need: the oldest its kept checkpoints record, or its start.
    fn needed(&self, name: &str, stream: &str) -> Result<Option<u64>> {
        let store = QueryStore::open(&self.checkpoints.dir, name, usize::MAX)?;
        let kept = store.list()?;
        let position = |sources: &[SourceEntry]| {
            sources
                .iter()
                .find(|s| s.stream == stream)
                .and_then(|s| s.position.as_ref())
                .map(|p| p.rows)
        };
        if kept.is_empty() {
            let starts = self.starts.lock().unwrap_or_else(|e| e.into_inner());
            return Ok(starts.get(name).and_then(|s| position(s)));
        }
        // A checkpoint without the stream's position restores from the
        // query's start.
        Ok(kept.iter().map(|c| position(&c.sources).unwrap_or(0)).min())
    }
}

/// Appends `line` to `path` and fsyncs it.
pub(crate) fn append_synced(path: &Path, line: &str) -> Result<()> {
    use std::io::Write;
    let context = || format!("cannot write {}", path.display());
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(context(), e))?;
    file.write_all(format!("{line}\n").as_bytes())
        .and_then(|()| file.sync_data())
        .map_err(|e| Error::io(context(), e))
}

/// What one executed statement did.
pub enum Executed {
    /// A stream, sink, view, invariant or setting was declared.
    Done,
    /// `EXPLAIN` text (`EXPLAIN ANALYZE`: with what the query measured
    /// when it ran to the end of its input).
    Explain(String),
    /// A continuous query was started.
    Query(QueryHandle),
    /// `ALTER`: a change to a running query, checked (a change that would
    /// lose state it is not allowed to was refused) and ready to make with
    /// [`PendingChange::apply`].
    Change(Box<PendingChange>),
    /// `DROP`: what was removed.
    Dropped(Vec<Dropped>),
    /// `SHOW` or `DESCRIBE`: rows of text.
    Rows(Listing),
}

/// A running query: its id, result schema and results.
pub struct QueryHandle {
    /// Its id, for [`Session::stop`].
    pub id: QueryId,
    /// The schema of its result rows.
    pub schema: SchemaRef,
    /// True for a query that ends with an alert clause.
    pub is_alert: bool,
    results: mpsc::Receiver<RecordBatch>,
}

impl QueryHandle {
    /// The next batch of results; `None` once the query has ended. A query
    /// that writes to a sink (`INSERT INTO`) yields nothing here.
    pub async fn next(&mut self) -> Option<RecordBatch> {
        self.results.recv().await
    }
}

impl Stream for QueryHandle {
    type Item = RecordBatch;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RecordBatch>> {
        self.results.poll_recv(cx)
    }
}

/// The state changes of every alert started in a session, as a stream of
/// batches of alert rows. A subscriber that falls more than a thousand
/// batches behind skips the oldest.
pub struct AlertStream {
    inner: BroadcastStream<RecordBatch>,
}

impl AlertStream {
    /// The next batch of alert rows; `None` once the session is gone.
    pub async fn recv(&mut self) -> Option<RecordBatch> {
        futures::StreamExt::next(self).await
    }
}

impl Stream for AlertStream {
    type Item = RecordBatch;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RecordBatch>> {
        loop {
            match Pin::new(&mut self.inner).poll_next(cx) {
                Poll::Ready(Some(Err(BroadcastStreamRecvError::Lagged(_)))) => continue,
                Poll::Ready(Some(Ok(batch))) => return Poll::Ready(Some(batch)),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Default for Session {
    fn default() -> Self {
        Self::new()
    }
}

impl Session {
    /// A session with no streams; relative paths resolve against the
    /// working directory.
    pub fn new() -> Self {
        Self {
            engine: Engine::new(),
            live: Live::new(),
            base_dir: PathBuf::from("."),
            alerts: broadcast::channel(ALERT_BUFFER).0,
            alert_queries: Default::default(),
            durable: None,
            origins: Default::default(),
        }
    }

    /// A builder, for a durable session (see [`SessionBuilder`]).
    pub fn builder() -> SessionBuilder {
        SessionBuilder::default()
    }

    /// The state folder of a durable session.
    pub fn state_dir(&self) -> Option<&Path> {
        self.durable.as_ref().map(|d| d.dir.as_path())
    }

    /// Resolves relative paths in later statements against `dir`.
    pub fn set_base_dir(&mut self, dir: &Path) {
        self.base_dir = dir.to_path_buf();
    }

    /// The planner, with the declared streams, views and sinks.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The planner, to change settings.
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// Runs every statement of `sql`, starting its queries. Stops at the
    /// first statement that fails; the earlier ones keep their effect.
    /// Must be called within a tokio runtime.
    pub fn execute(&mut self, sql: &str) -> Result<Vec<Executed>> {
        let statements = parse_script(sql)?;
        let mut done = Vec::with_capacity(statements.len());
        for statement in &statements {
            let label = statement_text(sql, statement.line);
            let base_dir = self.base_dir.clone();
            done.push(match self.execute_statement(statement, &base_dir)? {
                Outcome::Done => Executed::Done,
                Outcome::Explain(text) => Executed::Explain(text),
                Outcome::Query(query) => Executed::Query(self.start(*query, &label)?),
                Outcome::Dropped(dropped) => Executed::Dropped(dropped),
                Outcome::Rows(listing) => Executed::Rows(listing),
                Outcome::ShowQueries => Executed::Rows(self.show_queries()),
                Outcome::Change(change) => Executed::Change(Box::new(self.change(*change)?)),
            });
        }
        Ok(done)
    }

    /// Executes one parsed statement with the engine, and does what its
    /// outcome asks of the running queries: a dropped alert's query stops,
    /// and the queries reading a dropped or replaced push stream see it
    /// end. `SHOW QUERIES` comes back as [`Outcome::Rows`]. A query is
    /// returned, not started (see [`Session::start`]).
    pub fn execute_statement(&mut self, statement: &Statement, base_dir: &Path) -> Result<Outcome> {
        let replaced_push = match &statement.kind {
            crate::sql::StatementKind::CreateStream(create) if statement.or_replace => self
                .push_stream(&create.name)
                .ok()
                .map(|_| create.name.clone()),
            _ => None,
        };
        let undo = self
            .replaces_running_alert(statement)
            .then(|| self.engine.save_catalog());
        let outcome = self.engine.execute(statement, base_dir)?;
        if let Some(name) = replaced_push {
            self.live.retire_stream(&name);
        }
        if let crate::sql::StatementKind::CreateStream(create) = &statement.kind {
            self.open_wal(&create.name)?;
        }
        match outcome {
            Outcome::Dropped(dropped) => {
                self.dropped(&dropped);
                Ok(Outcome::Dropped(dropped))
            }
            Outcome::ShowQueries => Ok(Outcome::Rows(self.show_queries())),
            Outcome::Query(query) => Ok(match undo {
                Some(undo) => self.replacement(query, undo),
                None => Outcome::Query(query),
            }),
            other => Ok(other),
        }
    }

    /// True for a `CREATE OR REPLACE ALERT` of an alert whose query runs
    /// in this durable session: the new definition takes over the running
    /// query as `ALTER ALERT` does (see [`Session::replacement`]).
    fn replaces_running_alert(&self, statement: &Statement) -> bool {
        match &statement.kind {
            crate::sql::StatementKind::CreateAlert { name, .. } => {
                statement.or_replace
                    && self.durable.is_some()
                    && self.alert_queries().contains_key(name)
            }
            _ => false,
        }
    }

    /// A replaced alert's new query as a change of the running one, so
    /// that it goes on from the state that still fits (episodes, `FOR`
    /// timers, open windows), keeps its id and result channel, and says
    /// what it kept before it applies. What does not fit starts empty: the
    /// statement asked for a new definition. New result columns cannot go
    /// down the old channel: the old query stops and the new one starts.
    fn replacement(&self, query: Box<PreparedQuery>, undo: crate::engine::SavedCatalog) -> Outcome {
        let Some(name) = query.declares_alert.clone() else {
            return Outcome::Query(query);
        };
        let running = self
            .alert_queries()
            .get(&name)
            .copied()
            .filter(|&id| self.queries().iter().any(|q| q.id == id));
        let same_columns = running.is_some_and(|id| {
            self.origins()
                .get(&id)
                .is_some_and(|origin| origin.schema.fields() == query.graph.schema.fields())
        });
        if !same_columns {
            return Outcome::Query(query);
        }
        Outcome::Change(Box::new(crate::engine::Change {
            target: crate::engine::ChangeTarget::Alert(name.clone()),
            query: Some(query),
            parallelism: None,
            allow_state_loss: true,
            what: format!("alert {name} replaced"),
            undo: Some(undo),
        }))
    }

    /// Stops the queries of dropped alerts; ends dropped push streams.
    fn dropped(&self, dropped: &[Dropped]) {
        for entry in dropped {
            match entry.kind {
                ObjectKind::Alert => {
                    let id = self.alert_queries().remove(&entry.name);
                    if let Some(id) = id {
                        self.live.stop(id);
                    }
                }
                ObjectKind::Stream => self.live.retire_stream(&entry.name),
                _ => {}
            }
        }
    }

    fn alert_queries(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, QueryId>> {
        self.alert_queries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The running queries as rows: what `SHOW QUERIES` answers.
    pub fn show_queries(&self) -> Listing {
        let rows = self
            .queries()
            .iter()
            .map(|q| {
                let rows_in = q
                    .inputs
                    .iter()
                    .map(|(name, stats)| {
                        let rows = stats.rows.load(Ordering::Relaxed);
                        match stats.buffered_rows.load(Ordering::Relaxed) {
                            0 => format!("{name}: {rows}"),
                            buffered => format!("{name}: {rows} (buffered {buffered})"),
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                vec![
                    q.id.to_string(),
                    q.rows_out.to_string(),
                    q.late_rows.to_string(),
                    q.stats.shed_rows.load(Ordering::Relaxed).to_string(),
                    rows_in,
                    q.label.clone(),
                ]
            })
            .collect();
        Listing::new(&QUERY_COLUMNS, rows)
    }

    /// The controller of `query` when `SET autoscale = 'on'`: refused in
    /// a session without a state directory, where a rescale would start
    /// the query's state empty.
    fn scaling_for(&self, query: &PreparedQuery) -> Result<Option<autoscale::Scaling>> {
        let Some(settings) = self.engine.autoscale() else {
            return Ok(None);
        };
        if self.durable.is_none() {
            return Err(Error::Plan(
                "autoscale needs a state directory (--state-dir): a rescale carries the query's state over in a checkpoint".into(),
            ));
        }
        if query.origin.is_none() {
            return Ok(None);
        }
        Ok(Some(autoscale::Scaling::new(settings, &query.graph)))
    }

    /// Starts a planned query; its results go to its sink if it has one,
    /// else to the returned handle. Alert queries also feed
    /// [`Session::alerts`].
    pub fn start(&self, mut query: PreparedQuery, label: &str) -> Result<QueryHandle> {
        let scaling = self.scaling_for(&query)?;
        // A `CREATE ALERT` of a name that has a running query replaces it
        // (`CREATE OR REPLACE ALERT`): the old query stops.
        let declares = query.declares_alert.clone();
        if let Some(name) = &declares {
            let old = self.alert_queries().remove(name);
            if let Some(old) = old {
                self.live.stop(old);
                // The statement asked for a new definition: the old one's
                // state that does not fit it starts empty rather than
                // failing the start (see `Session::replacement`).
                if let Some(checkpoints) = &query.name {
                    self.live.allow_non_restored(checkpoints);
                }
            }
        }
        let is_alert = is_alert(&query.logical);
        let schema = query.graph.schema.clone();
        let (tx, results) = mpsc::channel(RESULT_BUFFER);
        let weak = tx.downgrade();
        let sink = self.query_sink(&query, tx)?;
        let parallelism = query.graph.parallelism();
        let origin = query.origin.take();
        let id = match &self.durable {
            Some(durable) => self.start_durable(durable, query.name, query.graph, sink, label)?,
            None => self.live.start(query.graph, sink, label)?,
        };
        if let Some(name) = declares {
            self.alert_queries().insert(name, id);
        }
        if let Some(origin) = origin {
            let origin = change::Origin {
                statement: origin.0,
                base_dir: origin.1,
                parallelism,
                schema: schema.clone(),
                results: weak,
                label: label.to_string(),
                scaling,
            };
            self.origins().insert(id, origin);
        }
        Ok(QueryHandle {
            id,
            schema,
            is_alert,
            results,
        })
    }

    /// Where query `query`'s results go: its sink, else `tx` (a handle's
    /// channel); an alert's also to [`Session::alerts`].
    fn query_sink(
        &self,
        query: &PreparedQuery,
        tx: mpsc::Sender<RecordBatch>,
    ) -> Result<Box<dyn Sink>> {
        let mut sink: Box<dyn Sink> = match &query.sink {
            Some(config) => open_sink(config, &query.graph.schema)?,
            None => Box::new(ChannelSink { tx }),
        };
        if is_alert(&query.logical) {
            sink = Box::new(AlertTee {
                inner: sink,
                alerts: self.alerts.clone(),
            });
        }
        Ok(sink)
    }

    fn origins(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<QueryId, change::Origin>> {
        self.origins.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stable name of checkpointed query `id`, in a durable session.
    pub fn query_name(&self, id: QueryId) -> Option<String> {
        let durable = self.durable.as_ref()?;
        let running = durable.running.lock().unwrap_or_else(|e| e.into_inner());
        running.get(&id).map(|(name, _)| name.clone())
    }

    /// The running query named `name`, in a durable session.
    pub fn query_by_name(&self, name: &str) -> Option<QueryId> {
        let durable = self.durable.as_ref()?;
        let running: Vec<QueryId> = self.queries().iter().map(|q| q.id).collect();
        let names = durable.running.lock().unwrap_or_else(|e| e.into_inner());
        running
            .into_iter()
            .find(|id| names.get(id).is_some_and(|(n, _)| n == name))
    }

    /// Subscribes to the state changes of every alert of the session.
    pub fn alerts(&self) -> AlertStream {
        AlertStream {
            inner: BroadcastStream::new(self.alerts.subscribe()),
        }
    }

    /// The running queries (see [`Session::all_queries`] for the ended
    /// ones).
    pub fn queries(&self) -> Vec<QueryInfo> {
        self.live.queries()
    }

    /// The running queries and the ended ones still kept (state
    /// [`QueryState::Failed`] with its error, or [`QueryState::Finished`]),
    /// by id. Failed queries stay until [`Session::forget`] removes them (at
    /// most [`KEEP_FAILED`](crate::runtime::live::KEEP_FAILED), the oldest
    /// forgotten first); the last
    /// [`KEEP_FINISHED`](crate::runtime::live::KEEP_FINISHED) finished ones
    /// are kept. Stopped queries are not listed.
    pub fn all_queries(&self) -> Vec<QueryInfo> {
        self.live.all_queries()
    }

    /// Stops a query; false if none with that id runs.
    pub fn stop(&self, id: QueryId) -> bool {
        self.live.stop(id)
    }

    /// Removes an ended (failed or finished) query from
    /// [`Session::all_queries`]; false if none with that id is kept or it
    /// still runs (stop it with [`Session::stop`]).
    pub fn forget(&self, id: QueryId) -> bool {
        self.live.forget(id)
    }

    /// Waits until query `id` has ended; its error if it failed. The query
    /// is looked up when this is called: the future borrows nothing, so it
    /// can be kept while the session is used, and it cannot miss the error
    /// of a query that ends before it is awaited.
    pub fn wait(&self, id: QueryId) -> impl Future<Output = Result<()>> + Send + 'static {
        self.live.wait(id)
    }

    /// Stops every query and ends every push stream.
    pub async fn shutdown(&self) {
        self.live.shutdown().await
    }
}

/// True if the plan's top node is an alert.
fn is_alert(plan: &LogicalPlan) -> bool {
    matches!(plan, LogicalPlan::Extension(ext)
        if ext.node.as_any().downcast_ref::<AlertNode>().is_some())
}

/// The statement's text from its line on, trimmed to one line, as a label.
fn statement_text(sql: &str, line: u64) -> String {
    let text: String = sql
        .lines()
        .skip(line.saturating_sub(1) as usize)
        .collect::<Vec<_>>()
        .join(" ");
    let text = text.split(';').next().unwrap_or("").trim();
    let mut words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if words.len() > 120 {
        words.truncate(words.floor_char_boundary(117));
        words.push_str("...");
    }
    words
}

/// Sends results to a [`QueryHandle`].
struct ChannelSink {
    tx: mpsc::Sender<RecordBatch>,
}

impl Sink for ChannelSink {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() > 0 {
            // A dropped handle means nobody reads the results: the query
            // runs on (its alerts may still be read).
            let _ = self.tx.blocking_send(batch.clone());
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Also publishes an alert query's rows to the session's alert stream.
struct AlertTee {
    inner: Box<dyn Sink>,
    alerts: broadcast::Sender<RecordBatch>,
}

impl Sink for AlertTee {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() > 0 {
            let _ = self.alerts.send(batch.clone());
        }
        self.inner.write(batch)
    }

    fn write_changes(
        &mut self,
        batch: &RecordBatch,
        kind: crate::connector::RowKind,
    ) -> Result<()> {
        if batch.num_rows() > 0 {
            let _ = self.alerts.send(batch.clone());
        }
        self.inner.write_changes(batch, kind)
    }

    fn watermark(&mut self, ms: i64) -> Result<()> {
        self.inner.watermark(ms)
    }

    fn sources_at_barrier(
        &mut self,
        positions: &[crate::connectors::SourcePosition],
    ) -> Result<()> {
        self.inner.sources_at_barrier(positions)
    }

    fn finish(&mut self) -> Result<()> {
        self.inner.finish()
    }

    fn checkpoint(&mut self) -> Result<Option<crate::connectors::SinkCommit>> {
        self.inner.checkpoint()
    }

    fn restore(&mut self, commit: &crate::connectors::SinkCommit) -> Result<()> {
        self.inner.restore(commit)
    }

    fn committed(&mut self) -> Result<()> {
        self.inner.committed()
    }

    fn stopped(&mut self) -> Result<()> {
        self.inner.stopped()
    }

    fn needs_checkpoints(&self) -> Option<String> {
        self.inner.needs_checkpoints()
    }

    fn client_errors(&self) -> Option<Arc<std::sync::atomic::AtomicU64>> {
        self.inner.client_errors()
    }
}
