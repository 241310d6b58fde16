//! `vigil serve`: a [`Session`] behind an HTTP API.
//!
//! Clients post SQL (`POST /statements`), push rows into push streams
//! (`POST /streams/{name}/rows`), follow a query's results or every alert as
//! Server-Sent Events, list and stop queries, and scrape Prometheus metrics.
//! Monitoring senders push in their own protocols (`ingest.rs`): Prometheus
//! remote write, OTLP/HTTP metrics and InfluxDB line protocol.
//! Every request and response body is JSON (metrics and SSE aside); errors
//! are `{"error": "..."}` with a 4xx status, and a failed request leaves the
//! running queries alone.
//!
//! Each query the service starts has its results copied into a [`feed`],
//! so any number of clients can follow it and a query nobody follows still
//! runs (its results are dropped). A follower sees the rows produced after
//! it subscribed; one that falls behind by more than the result budget
//! (`--max-result-buffer`) misses the oldest. A query that fails stays
//! listed with its error, its followers get an `error` event, and the
//! failure is logged on stderr.
//!
//! With a state directory (`vigil serve --state-dir DIR`, a session built
//! with [`Session::builder`]`.state_dir(DIR)`), the service is durable:
//! pushed rows go to a write-ahead log before a request is answered (see
//! [`crate::session`]), queries are checkpointed, and every statement
//! posted (`POST /statements`: the statements of a request that ran) and
//! every query stopped (`DELETE /queries/{id}`) is appended to
//! `DIR/statements.jsonl`, fsynced, before the answer. On start the service
//! runs its startup scripts, then those statements again, in order, before
//! it listens: the same streams, sinks and alerts, the same queries under
//! the same names (their ids may differ), each restored from its
//! checkpoint and given the logged rows it had not seen. A request that got
//! no answer (the process died meanwhile) may or may not have taken effect.
//! `POST /savepoints` takes a savepoint of every running query under
//! `DIR/savepoints/`.
//!
//! A service may also be a member of a group of processes sharing a Kafka
//! topic (`vigil serve --group NAME`, see [`crate::group`]): the
//! [`Member`] given to [`serve_with`] runs beside the session for as long
//! as the service does, and leaves its group when the service shuts down.
//! `GET /groups/{name}` answers what a group's members hold.
//!
//! Statements are planned on tokio's blocking pool: a long plan holds the
//! session (other statements, pushes and listings wait for it) but not a
//! worker thread, so the server keeps accepting connections.

mod feed;
mod handlers;
mod ingest;
mod metrics;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};
use datafusion::arrow::array::AsArray;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::sql::sqlparser::tokenizer::Location;
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::{Notify, RwLock, watch};

use feed::{End, Feed};

use crate::engine::{Dropped, Outcome, script_dir};
use crate::error::{Error, Result};
use crate::plan::listing::{Listing, listing_text};
use crate::runtime::live::{Live, QueryId};
use crate::session::{QueryHandle, Session};
use crate::sql::{Statement, StatementKind, parse_script, render_error};
use crate::state::store::Location as StoreLocation;

/// Default listening address: loopback only.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8080";
/// Default largest request body: 16 MiB.
pub const DEFAULT_MAX_BODY: usize = 16 << 20;
/// Default most running queries.
pub const DEFAULT_MAX_QUERIES: usize = 64;
/// Default bytes of results kept per query for followers that fall behind:
/// 8 MiB.
pub const DEFAULT_MAX_RESULT_BUFFER: usize = 8 << 20;

/// How long a push waits for room before it gets 429, unless set.
pub const DEFAULT_INGEST_TIMEOUT: std::time::Duration =
    crate::runtime::channel::DEFAULT_INGEST_TIMEOUT;

/// How `vigil serve` runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where to listen, e.g. `127.0.0.1:8080`; port 0 picks a free port.
    pub addr: String,
    /// When set, every request but `GET /health` must carry
    /// `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Largest request body in bytes; larger ones get 413.
    pub max_body: usize,
    /// Most queries running at once; a statement that would start one more
    /// gets 429.
    pub max_queries: usize,
    /// Bytes of result batches (Arrow buffer memory) kept per query for
    /// its followers that have not read them; a follower further behind
    /// misses the oldest batches and gets a `lagged` event. The newest
    /// batch is kept even if it alone is larger.
    pub max_result_buffer: usize,
    /// Scripts executed before the service listens (streams, sinks, alerts);
    /// relative paths in them resolve against their directory.
    pub scripts: Vec<PathBuf>,
    /// Where the statements posted are recorded and replayed on start; it
    /// should be the session's state directory.
    pub state_dir: Option<PathBuf>,
    /// How long `POST /streams/{name}/rows` waits for the stream's queries
    /// to have room for its rows before it answers 429 with `Retry-After`.
    pub ingest_timeout: std::time::Duration,
    /// The checkpoint directory of the group the service is a member of
    /// (`vigil serve --group`): `GET /groups/{name}` reads it unless the
    /// request names another.
    pub group_checkpoint_dir: Option<StoreLocation>,
    /// The name of that group: `/metrics` reports the processes it needs.
    pub group: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            addr: DEFAULT_ADDR.to_string(),
            token: None,
            max_body: DEFAULT_MAX_BODY,
            max_queries: DEFAULT_MAX_QUERIES,
            max_result_buffer: DEFAULT_MAX_RESULT_BUFFER,
            scripts: Vec::new(),
            state_dir: None,
            ingest_timeout: DEFAULT_INGEST_TIMEOUT,
            group_checkpoint_dir: None,
            group: None,
        }
    }
}

/// A member of a group that the service runs besides its session
/// (`vigil serve --group`): the group's queries over the partitions it is
/// given.
pub struct Member {
    /// Runs the member until `leave` is set, then leaves the group.
    pub run: BoxFuture<'static, Result<()>>,
    /// Set when the service shuts down.
    pub leave: Arc<AtomicBool>,
    /// The runtime `run` starts the member's pipelines in: `GET /metrics`
    /// shows its running queries beside the session's, by label
    /// (`q1-p0`, `q1-global`).
    pub queries: Live,
}

/// Runs the service until Ctrl-C or SIGTERM: executes the startup scripts,
/// listens (printing `vigil: listening on http://ADDR` on stderr once
/// bound), then shuts down gracefully: open event streams end, requests in
/// flight finish, every query stops.
pub async fn serve(session: Session, config: Config) -> Result<()> {
    serve_with(session, config, None).await
}

/// [`serve`], with `member` running from when the service listens. On
/// Ctrl-C or SIGTERM the member leaves its group, handing its partitions
/// on, before the session's queries stop. A member that ends by itself
/// has failed (its pipelines fail on any process): the service shuts down
/// and answers its error, as `vigil run --group` does.
pub async fn serve_with(session: Session, config: Config, member: Option<Member>) -> Result<()> {
    let member_queries = member.as_ref().map(|m| m.queries.clone());
    let state = AppState::with_member(session, &config, member_queries);
    for script in &config.scripts {
        state.run_script(script).await?;
    }
    // Before listening: no row is pushed while restored queries replay.
    state.replay_log().await?;
    let listener = tokio::net::TcpListener::bind(&config.addr)
        .await
        .map_err(|e| Error::io(format!("cannot listen on {}", config.addr), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("cannot read the listening address", e))?;
    if config.token.is_none() && !addr.ip().is_loopback() {
        eprintln!(
            "vigil: warning: listening on {addr} without --token: anyone who can reach it can run SQL, which reads and writes files"
        );
    }
    eprintln!("vigil: listening on http://{addr}");
    let member = member.map(RunningMember::start);
    let member_ended = member.as_ref().map(|m| m.ended.clone());
    let autoscaler = tokio::spawn(autoscale(state.clone()));
    let stopping = state.clone();
    let outcome = axum::serve(listener, router(state.clone()))
        .with_graceful_shutdown(async move {
            tokio::select! {
                () = shutdown_signal() => {}
                () = notified(member_ended) => eprintln!("vigil: the group member ended"),
            }
            eprintln!("vigil: shutting down");
            stopping.begin_shutdown();
        })
        .await
        .map_err(|e| Error::io("serving HTTP", e));
    let left = match member {
        Some(member) => member.leave().await,
        None => Ok(()),
    };
    autoscaler.abort();
    state.shutdown().await;
    outcome.and(left)
}

/// How often the service runs the autoscaling controller; it decides only
/// when a query's measurement is due.
const AUTOSCALE_TICK: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs the autoscaling controller ([`Session::autoscale_step`]) until the
/// service stops: the session is locked to decide, not while a rescale is
/// made. Each rescale is logged.
async fn autoscale(state: AppState) {
    let mut tick = tokio::time::interval(AUTOSCALE_TICK);
    loop {
        tick.tick().await;
        let steps = state.inner.session.write().await.autoscale_step();
        for step in steps {
            let id = step.query();
            let decision = step.apply().await;
            eprintln!("vigil: autoscale: query {id}: {decision}");
            if decision.outcome.is_ok()
                && decision.to != decision.from
                && let Err(e) = state.record_rescale(id, decision.to).await
            {
                eprintln!("vigil: warning: query {id}: the rescale is not recorded: {e}");
            }
        }
    }
}

/// A [`Member`] running on its own task.
struct RunningMember {
    task: tokio::task::JoinHandle<Result<()>>,
    leave: Arc<AtomicBool>,
    /// Told when the member's run has ended.
    ended: Arc<Notify>,
}

impl RunningMember {
    fn start(member: Member) -> Self {
        let ended = Arc::new(Notify::new());
        let tell = ended.clone();
        let task = tokio::spawn(async move {
            let outcome = member.run.await;
            tell.notify_one();
            outcome
        });
        RunningMember {
            task,
            leave: member.leave,
            ended,
        }
    }

    /// Makes the member leave its group and waits until it has: what it
    /// ended with.
    async fn leave(self) -> Result<()> {
        self.leave.store(true, Ordering::Relaxed);
        match self.task.await {
            Ok(outcome) => outcome,
            Err(e) => Err(Error::Plan(format!("the group member failed: {e}"))),
        }
    }
}

/// Waits until `notify` is told; forever without one.
async fn notified(notify: Option<Arc<Notify>>) {
    match notify {
        Some(notify) => notify.notified().await,
        None => std::future::pending().await,
    }
}

/// Waits for Ctrl-C or, on Unix, SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

/// The routes, with the body limit and, if a token is set, authentication
/// on every route but `GET /health`.
pub fn router(state: AppState) -> Router {
    let protected = Router::new()
        .route("/statements", post(handlers::statements))
        .route("/queries", get(handlers::list_queries))
        .route(
            "/queries/{id}",
            get(handlers::get_query).delete(handlers::stop_query),
        )
        .route("/queries/{id}/results", get(handlers::follow_results))
        .route("/alerts", get(handlers::follow_alerts))
        .route("/streams/{name}/rows", post(handlers::push_rows))
        .route("/api/v1/write", post(ingest::remote_write))
        .route("/v1/metrics", post(ingest::otlp_metrics))
        .route("/api/v2/write", post(ingest::influx_v2))
        .route("/write", post(ingest::influx_v1))
        .route("/metrics", get(handlers::metrics))
        .route("/savepoints", post(handlers::savepoint))
        .route("/groups/{name}", get(handlers::group_status))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            handlers::require_token,
        ));
    Router::new()
        .route("/health", get(handlers::health))
        .merge(protected)
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(state.inner.max_body))
        .with_state(state)
}

/// What the handlers share: the session, the followers' channels, limits.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    /// Statements take it exclusively; pushes, listings and stops share it.
    /// Shared so that statements can be planned on the blocking pool.
    session: Arc<RwLock<Session>>,
    /// Result feeds of the running queries the service started, by id; an
    /// entry goes when its query ends, after its followers were told.
    feeds: Mutex<HashMap<QueryId, Arc<Feed>>>,
    token: Option<String>,
    max_body: usize,
    max_queries: usize,
    max_result_buffer: usize,
    ingest_timeout: std::time::Duration,
    /// Rows with state 'firing' seen on the session's alert stream.
    alerts_fired: Arc<AtomicU64>,
    /// Turns true when the service stops: open event streams end.
    shutdown: watch::Sender<bool>,
    /// Where posted statements and stops are recorded, when durable.
    log: Option<PathBuf>,
    /// Where savepoints go, when durable.
    state_dir: Option<PathBuf>,
    /// The checkpoint directory of the service's own group, if it is a
    /// member of one.
    group_checkpoint_dir: Option<StoreLocation>,
    /// The name of the service's own group, if it is a member of one.
    group: Option<String>,
    /// The runtime of the group member the service runs, if any: its
    /// queries are in `GET /metrics`.
    member_queries: Option<Live>,
}

/// The statement log's file in the state directory.
pub const STATEMENT_LOG: &str = "statements.jsonl";

/// How long `POST /savepoints` waits for the queries' state.
pub const SAVEPOINT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// One entry of the statement log.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum Logged {
    /// The first `ran` statements of `sql` ran, paths resolving against
    /// `base_dir`.
    Statements {
        sql: String,
        base_dir: PathBuf,
        ran: usize,
    },
    /// The query named `stop` was stopped.
    Stop { stop: String },
}

/// What to do with statements besides running them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Posted: recorded in the statement log.
    Posted,
    /// From a startup script: not recorded (scripts run on every start).
    Script,
    /// Replayed from the log: only its first so many statements.
    Replay(usize),
}

/// What one statement did, as the API reports it.
#[derive(Debug, Clone)]
pub enum StatementResult {
    /// A declaration or setting.
    Done,
    /// `EXPLAIN` text.
    Explain(String),
    /// A query was started.
    Query {
        /// Its id.
        id: QueryId,
        /// Its statement, on one line.
        label: String,
        /// Its result columns: name and type.
        columns: Vec<(String, String)>,
        /// True for an alert.
        alert: bool,
    },
    /// `DROP`: what was removed.
    Dropped(Vec<Dropped>),
    /// `SHOW` or `DESCRIBE`: rows of text.
    Rows(Listing),
    /// `ALTER`: a running query changed.
    Changed(crate::session::Changed),
}

impl StatementResult {
    fn to_json(&self) -> Value {
        match self {
            StatementResult::Done => json!({"kind": "done"}),
            StatementResult::Changed(changed) => json!({
                "kind": "changed",
                "id": changed.id,
                "what": changed.what,
                "kept": changed.kept,
                "emptied": changed.emptied,
                "text": changed.to_string(),
            }),
            StatementResult::Explain(text) => json!({"kind": "explain", "text": text}),
            StatementResult::Query {
                id,
                label,
                columns,
                alert,
            } => json!({
                "kind": "query",
                "id": id,
                "label": label,
                "columns": columns
                    .iter()
                    .map(|(name, ty)| json!({"name": name, "type": ty}))
                    .collect::<Vec<_>>(),
                "alert": alert,
            }),
            StatementResult::Dropped(dropped) => json!({
                "kind": "dropped",
                "dropped": dropped
                    .iter()
                    .map(|d| json!({"kind": d.kind.noun(), "name": d.name}))
                    .collect::<Vec<_>>(),
            }),
            StatementResult::Rows(listing) => json!({
                "kind": "rows",
                "notes": listing.notes,
                "columns": listing.columns,
                "rows": listing.rows,
            }),
        }
    }
}

/// Why a batch of statements stopped, after the results of those that ran.
#[derive(Debug)]
pub struct StatementFailure {
    /// 400 for a statement that does not parse, plan or start; 429 for one
    /// over the query limit; 500 if planning panicked.
    pub status: StatusCode,
    /// What went wrong, with line and column.
    pub message: String,
    /// What the statements before it did (they keep their effect).
    pub done: Vec<StatementResult>,
}

impl AppState {
    /// State around `session`; must be called within a tokio runtime (it
    /// starts counting alerts).
    pub fn new(session: Session, config: &Config) -> AppState {
        Self::with_member(session, config, None)
    }

    /// [`AppState::new`] for a service that is also a group member whose
    /// queries run in `member_queries`.
    fn with_member(session: Session, config: &Config, member_queries: Option<Live>) -> AppState {
        let alerts_fired = Arc::new(AtomicU64::new(0));
        let mut alerts = session.alerts();
        let counter = alerts_fired.clone();
        tokio::spawn(async move {
            while let Some(batch) = alerts.next().await {
                counter.fetch_add(firing_rows(&batch), Ordering::Relaxed);
            }
        });
        AppState {
            inner: Arc::new(Inner {
                session: Arc::new(RwLock::new(session)),
                feeds: Mutex::default(),
                token: config.token.clone(),
                max_body: config.max_body,
                max_queries: config.max_queries,
                max_result_buffer: config.max_result_buffer,
                ingest_timeout: config.ingest_timeout,
                alerts_fired,
                shutdown: watch::channel(false).0,
                log: config.state_dir.as_ref().map(|d| d.join(STATEMENT_LOG)),
                state_dir: config.state_dir.clone(),
                group_checkpoint_dir: config.group_checkpoint_dir.clone(),
                group: config.group.clone(),
                member_queries,
            }),
        }
    }

    fn feeds(&self) -> MutexGuard<'_, HashMap<QueryId, Arc<Feed>>> {
        self.inner.feeds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs every statement of `sql`, relative paths resolving against
    /// `base_dir`; stops at the first that fails. Parsing and planning run
    /// on the blocking pool, holding the session but no worker thread.
    /// With a state directory, the statements that ran are recorded.
    pub async fn execute(
        &self,
        sql: &str,
        base_dir: &Path,
    ) -> std::result::Result<Vec<StatementResult>, StatementFailure> {
        self.execute_as(sql, base_dir, Mode::Posted).await
    }

    async fn execute_as(
        &self,
        sql: &str,
        base_dir: &Path,
        mode: Mode,
    ) -> std::result::Result<Vec<StatementResult>, StatementFailure> {
        let session = self.inner.session.clone().write_owned().await;
        let state = self.clone();
        let sql = sql.to_string();
        let base_dir = base_dir.to_path_buf();
        let planned = tokio::task::spawn_blocking(move || {
            let mut session = session;
            let outcome = state.execute_locked(&mut session, &sql, &base_dir, mode);
            state.record(&sql, &base_dir, mode, outcome)
        });
        match planned.await {
            Ok(outcome) => outcome,
            Err(e) => Err(StatementFailure {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message: format!("planning the statements failed: {e}"),
                done: Vec::new(),
            }),
        }
    }

    /// Records posted statements that ran in the statement log, before
    /// they are answered; a failure to record is a 500.
    fn record(
        &self,
        sql: &str,
        base_dir: &Path,
        mode: Mode,
        outcome: std::result::Result<Vec<StatementResult>, StatementFailure>,
    ) -> std::result::Result<Vec<StatementResult>, StatementFailure> {
        let done = match &outcome {
            Ok(done) => done,
            Err(failure) => &failure.done,
        };
        let changes = done
            .iter()
            .any(|d| !matches!(d, StatementResult::Explain(_) | StatementResult::Rows(_)));
        if mode != Mode::Posted || !changes {
            return outcome;
        }
        let entry = Logged::Statements {
            sql: sql.to_string(),
            base_dir: base_dir.to_path_buf(),
            ran: done.len(),
        };
        match self.append_log(&entry) {
            Ok(()) => outcome,
            Err(e) => Err(StatementFailure {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message: format!("the statements ran but could not be recorded: {e}"),
                done: match outcome {
                    Ok(done) => done,
                    Err(failure) => failure.done,
                },
            }),
        }
    }

    /// Appends `entry` to the statement log (fsynced); nothing without a
    /// state directory.
    fn append_log(&self, entry: &Logged) -> Result<()> {
        let Some(path) = &self.inner.log else {
            return Ok(());
        };
        let line = serde_json::to_string(entry)
            .map_err(|e| Error::Connector(format!("cannot record a statement: {e}")))?;
        crate::session::append_synced(path, &line)
    }

    /// Records a rescale the controller made as the `ALTER QUERY` that
    /// makes it, so that a restarted service runs the query at the
    /// parallelism it had, not at its first. Nothing for a query without a
    /// stable name (no state directory: nothing is replayed).
    async fn record_rescale(&self, id: QueryId, to: usize) -> Result<()> {
        let Some(name) = self.inner.session.read().await.query_name(id) else {
            return Ok(());
        };
        let quoted = name.replace('"', "\"\"");
        self.append_log(&Logged::Statements {
            sql: format!("ALTER QUERY \"{quoted}\" SET parallelism = {to};"),
            base_dir: PathBuf::from("."),
            ran: 1,
        })
    }

    /// Records that query `name` was stopped, so a restart stops it too.
    pub(crate) fn record_stop(&self, name: &str) -> Result<()> {
        self.append_log(&Logged::Stop {
            stop: name.to_string(),
        })
    }

    /// Runs the statement log again, in order: what was posted before the
    /// service last stopped. A torn last line (a crash while writing it,
    /// so never answered) is skipped.
    pub async fn replay_log(&self) -> Result<()> {
        let Some(path) = &self.inner.log else {
            return Ok(());
        };
        if !path.exists() {
            return Ok(());
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let entry = match serde_json::from_str::<Logged>(line) {
                Ok(entry) => entry,
                Err(_) if i + 1 == lines.len() => {
                    eprintln!(
                        "vigil: warning: {}: skipping a torn last line",
                        path.display()
                    );
                    break;
                }
                Err(e) => {
                    return Err(Error::Plan(format!(
                        "{} line {}: {e}",
                        path.display(),
                        i + 1
                    )));
                }
            };
            self.replay_entry(entry)
                .await
                .map_err(|e| Error::Plan(format!("{} line {}: {e}", path.display(), i + 1)))?;
        }
        Ok(())
    }

    async fn replay_entry(&self, entry: Logged) -> Result<()> {
        match entry {
            Logged::Statements { sql, base_dir, ran } => {
                for result in self
                    .execute_as(&sql, &base_dir, Mode::Replay(ran))
                    .await
                    .map_err(|f| Error::Plan(f.message))?
                {
                    if let StatementResult::Query { id, label, .. } = result {
                        eprintln!("vigil: restored query {id}: {label}");
                    }
                }
            }
            Logged::Stop { stop } => {
                let session = self.inner.session.read().await;
                if let Some(id) = session.query_by_name(&stop) {
                    session.stop(id);
                }
            }
        }
        Ok(())
    }

    /// Takes a savepoint of every running checkpointed query under
    /// `DIR/savepoints/<name>`; its folder and the queries' names.
    pub async fn savepoint(&self, name: &str) -> Result<(PathBuf, Vec<String>)> {
        let Some(dir) = &self.inner.state_dir else {
            return Err(Error::Plan(
                "savepoints need a state directory (vigil serve --state-dir)".into(),
            ));
        };
        let root = dir.join("savepoints").join(name);
        if root.exists() {
            return Err(Error::Plan(format!(
                "savepoint {} exists already",
                root.display()
            )));
        }
        let session = self.inner.session.read().await;
        let queries = session.savepoint(&root, SAVEPOINT_TIMEOUT).await?;
        Ok((root, queries))
    }

    /// [`AppState::execute`] with the session held; blocks while planning.
    fn execute_locked(
        &self,
        session: &mut Session,
        sql: &str,
        base_dir: &Path,
        mode: Mode,
    ) -> std::result::Result<Vec<StatementResult>, StatementFailure> {
        let invalid = |message: String, done: Vec<StatementResult>| StatementFailure {
            status: StatusCode::BAD_REQUEST,
            message,
            done,
        };
        let mut statements = parse_script(sql).map_err(|e| invalid(e.to_string(), Vec::new()))?;
        if let Mode::Replay(ran) = mode {
            statements.truncate(ran);
        }
        let mut done = Vec::with_capacity(statements.len());
        for statement in &statements {
            let starts_query = matches!(
                statement.kind,
                StatementKind::Query { .. } | StatementKind::CreateAlert { .. }
            );
            if starts_query && session.queries().len() >= self.inner.max_queries {
                return Err(StatementFailure {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    message: locate(
                        sql,
                        statement,
                        &format!(
                            "{} queries are running, the most allowed (--max-queries); stop one first",
                            self.inner.max_queries
                        ),
                    ),
                    done,
                });
            }
            let outcome = match session.execute_statement(statement, base_dir) {
                Ok(outcome) => outcome,
                Err(e) => return Err(invalid(locate_error(sql, statement, &e), done)),
            };
            done.push(match outcome {
                Outcome::Done => StatementResult::Done,
                Outcome::Explain(text) => StatementResult::Explain(text),
                Outcome::Dropped(dropped) => StatementResult::Dropped(dropped),
                Outcome::Rows(listing) => StatementResult::Rows(listing),
                Outcome::ShowQueries => StatementResult::Rows(session.show_queries()),
                Outcome::Change(change) => {
                    // Planning runs on a blocking thread: the change waits
                    // there for the query's checkpoint.
                    let changed = session.change(*change).and_then(|pending| {
                        tokio::runtime::Handle::current().block_on(pending.apply())
                    });
                    match changed {
                        Ok(changed) => StatementResult::Changed(changed),
                        Err(e) => return Err(invalid(locate_error(sql, statement, &e), done)),
                    }
                }
                Outcome::Query(query) => {
                    let label = statement_label(sql, statement);
                    let handle = match session.start(*query, &label) {
                        Ok(handle) => handle,
                        Err(e) => return Err(invalid(locate_error(sql, statement, &e), done)),
                    };
                    let result = StatementResult::Query {
                        id: handle.id,
                        label,
                        columns: columns(&handle.schema),
                        alert: handle.is_alert,
                    };
                    let ended = session.wait(handle.id);
                    self.follow(handle, ended);
                    result
                }
            });
        }
        Ok(done)
    }

    /// Executes a startup script; its queries are listed on stderr and its
    /// `EXPLAIN`s printed on stdout.
    pub async fn run_script(&self, path: &Path) -> Result<()> {
        let name = path.display();
        let sql = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("cannot read {name}"), e))?;
        let done = self
            .execute_as(&sql, &script_dir(path), Mode::Script)
            .await
            .map_err(|f| Error::Plan(format!("{name}: {}", f.message)))?;
        for result in done {
            match result {
                StatementResult::Query { id, label, .. } => {
                    eprintln!("vigil: {name}: query {id}: {label}");
                }
                StatementResult::Explain(text) => println!("{text}"),
                StatementResult::Rows(listing) => print!("{}", listing_text(&listing)),
                StatementResult::Changed(changed) => eprintln!("vigil: {name}: {changed}"),
                StatementResult::Done | StatementResult::Dropped(_) => {}
            }
        }
        Ok(())
    }

    /// Copies a query's results into a feed its followers subscribe to;
    /// when the query ends, the feed ends with its error, if any, which is
    /// also logged on stderr.
    fn follow(
        &self,
        mut handle: QueryHandle,
        ended: impl Future<Output = Result<()>> + Send + 'static,
    ) {
        let id = handle.id;
        let feed = Arc::new(Feed::new(self.inner.max_result_buffer));
        self.feeds().insert(id, feed.clone());
        let state = self.clone();
        tokio::spawn(async move {
            while let Some(batch) = handle.next().await {
                // No follower: the rows are dropped, the query runs on.
                feed.publish(batch);
            }
            let end = match ended.await {
                Ok(()) => End::Finished,
                Err(e) => {
                    eprintln!("vigil serve: query {id} failed: {e}");
                    End::Failed(e.to_string())
                }
            };
            feed.end(end);
            state.feeds().remove(&id);
        });
    }

    /// The feed of running query `id`, if the service started it.
    fn feed(&self, id: QueryId) -> Option<Arc<Feed>> {
        self.feeds().get(&id).cloned()
    }

    /// Bytes of results kept for the followers of query `id` that have not
    /// read them yet; 0 for a query that has ended or none follows.
    pub fn result_buffer_bytes(&self, id: QueryId) -> usize {
        self.feed(id).map_or(0, |feed| feed.buffered_bytes())
    }

    /// Ends every open event stream (results and alerts), so a graceful
    /// shutdown does not wait for clients that follow forever.
    pub fn begin_shutdown(&self) {
        self.inner.shutdown.send_replace(true);
    }

    /// Ends the event streams and stops every query.
    pub async fn shutdown(&self) {
        self.begin_shutdown();
        self.inner.session.read().await.shutdown().await;
    }
}

/// `e`'s message with the statement's position, unless it carries one (a
/// parse error is rendered with its own line, column and caret).
fn locate_error(sql: &str, statement: &Statement, e: &Error) -> String {
    match e {
        Error::Parse(message) => message.clone(),
        Error::PlanAt {
            message,
            line,
            column,
        } => render_error(sql, message, Location::new(*line, *column)),
        other => locate(sql, statement, &other.to_string()),
    }
}

/// `message` at the statement's first token, with its line and a caret.
fn locate(sql: &str, statement: &Statement, message: &str) -> String {
    let at = Location {
        line: statement.line,
        column: statement.column,
    };
    render_error(sql, message, at)
}

/// The statement's text on one line, shortened, to name its query.
fn statement_label(sql: &str, statement: &Statement) -> String {
    let text: String = sql
        .lines()
        .skip(statement.line.saturating_sub(1) as usize)
        .enumerate()
        .map(|(i, line)| {
            if i == 0 {
                line.chars()
                    .skip(statement.column.saturating_sub(1) as usize)
                    .collect()
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    let text = text.split(';').next().unwrap_or("");
    let mut words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if words.len() > 120 {
        words.truncate(words.floor_char_boundary(117));
        words.push_str("...");
    }
    words
}

/// Column names and SQL type names of a result schema.
fn columns(schema: &SchemaRef) -> Vec<(String, String)> {
    schema
        .fields()
        .iter()
        .map(|f| (f.name().clone(), crate::types::sql_name(f.data_type())))
        .collect()
}

/// Rows of an alert batch whose `state` is `firing`.
fn firing_rows(batch: &RecordBatch) -> u64 {
    let Some(column) = batch.column_by_name("state") else {
        return 0;
    };
    let Ok(text) = cast(column, &DataType::Utf8) else {
        return 0;
    };
    text.as_string::<i32>()
        .iter()
        .filter(|s| *s == Some("firing"))
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_start_at_the_statement() {
        let sql = "CREATE STREAM s (ts TIMESTAMP); SELECT ts\n  FROM s;\nSELECT 1;";
        let statements = parse_script(sql).unwrap();
        assert_eq!(statement_label(sql, &statements[1]), "SELECT ts FROM s");
        assert_eq!(statement_label(sql, &statements[2]), "SELECT 1");
    }
}
