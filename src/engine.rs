//! The engine: statements in, running queries out. The CLI is a thin layer
//! over this, and so is anything that embeds vigil.

mod catalog_changes;
mod planning;
mod settings;
mod show;
mod streams;

use catalog_changes::alert_name;
use planning::check_append_only;

use std::path::{Path, PathBuf};

use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Extension, LogicalPlan};
use datafusion::sql::sqlparser::ast::Query;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

use crate::connectors::SinkConfig;
use crate::connectors::registry::Registry;
use crate::error::{Error, Result};
use crate::exec::{ShedConfig, ShedPolicy, ShedSettings};
use crate::plan::StreamDef;
use crate::plan::catalog::{
    ALLOWED_LATENESS, BUFFER, BUFFER_MAX, BufferSetting, IDLE_TIMEOUT, StreamTiming, stream_def,
};
use crate::plan::listing::{self, Listing};
use crate::plan::{AlertNode, EmitNode, EmitPolicy, windows_take_late_rows};
use crate::plan::{Catalog, SqlPlanner};
use crate::planner::{ExecutionMode, QueryGraph, plan_incremental_shed};
use crate::runtime::autoscale::{self, AutoscaleSettings};
use crate::sql::{AlertClause, CreateStream, Emit, Statement, StatementKind};
use crate::sql::{ObjectKind, Show, declared_name};

/// A query planned and ready to run.
pub struct PreparedQuery {
    /// The logical plan it came from.
    pub logical: LogicalPlan,
    /// The operator graph to run.
    pub graph: QueryGraph,
    /// The sink named by `INSERT INTO`, if any; `None` means the default
    /// output.
    pub sink: Option<SinkConfig>,
    /// Line of the statement in its script.
    pub line: u64,
    /// The alert a `CREATE ALERT` declares: it prints its changes unless a
    /// later query reads it (see [`drop_routed_alerts`]).
    pub declares_alert: Option<String>,
    /// Its stable name, under which its checkpoints are kept: the alert's
    /// name, or what `SET query_name = '...'` said before it. `None` lets
    /// whoever runs it name it (`vigil run`: by file and position).
    pub name: Option<String>,
    /// The statement it was planned from, and the folder its relative
    /// paths resolve against: to plan it again for a change while it runs.
    pub origin: Option<Box<(Statement, PathBuf)>>,
}

impl PreparedQuery {
    /// Names of the alerts whose state changes this query reads or makes.
    pub fn alerts(&self) -> Vec<String> {
        let mut names = Vec::new();
        let _ = self.logical.apply(|node| {
            if let LogicalPlan::Extension(ext) = node
                && let Some(alert) = ext.node.as_any().downcast_ref::<AlertNode>()
            {
                names.push(alert.spec.name.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        });
        names
    }
}

/// Drops the queries of `CREATE ALERT`s that another query reads: the
/// reader (typically `INSERT INTO sink SELECT * FROM alert`) has taken over
/// where the alert's changes go.
pub fn drop_routed_alerts(queries: Vec<PreparedQuery>) -> Vec<PreparedQuery> {
    let read: Vec<String> = queries
        .iter()
        .filter(|q| q.declares_alert.is_none())
        .flat_map(|q| q.alerts())
        .chain(queries.iter().flat_map(|q| {
            let own = q.declares_alert.clone();
            q.alerts()
                .into_iter()
                .filter(move |n| Some(n) != own.as_ref())
        }))
        .collect();
    queries
        .into_iter()
        .filter(|q| q.declares_alert.as_ref().is_none_or(|n| !read.contains(n)))
        .collect()
}

/// What executing one statement produced.
pub enum Outcome {
    /// A stream or sink was declared, or a setting changed.
    Done,
    /// `EXPLAIN` text; for `EXPLAIN ANALYZE`, with the measurements of
    /// the query, which ran to the end of its input before this returned.
    Explain(String),
    /// A continuous query, ready to run.
    Query(Box<PreparedQuery>),
    /// `DROP`: what was removed (with `CASCADE`, what read it too), in the
    /// order removed; empty for `DROP ... IF EXISTS` of nothing. A dropped
    /// alert's query should be stopped by whoever runs it.
    Dropped(Vec<Dropped>),
    /// `SHOW` (but `SHOW QUERIES`) or `DESCRIBE`: rows to print.
    Rows(Listing),
    /// `SHOW QUERIES`: the engine runs no query, so whoever does lists
    /// them (with the columns of [`listing::QUERY_COLUMNS`]).
    ShowQueries,
    /// `ALTER ALERT` or `ALTER QUERY`: a change to a running query, for
    /// whoever runs it to make (a session's `change`). The
    /// catalog already has the changed alert; a change not made puts
    /// [`Change::undo`] back.
    Change(Box<Change>),
}

/// A change to a running query, as `ALTER` asks for it.
pub struct Change {
    /// The query: an alert's name, or a query's id or name.
    pub target: ChangeTarget,
    /// The changed query, planned; `None` when it is planned again from
    /// its own statement (`ALTER QUERY ... SET parallelism`).
    pub query: Option<Box<PreparedQuery>>,
    /// The parallelism it is to run at, if the change sets it.
    pub parallelism: Option<usize>,
    /// `ALLOW STATE LOSS`: operators whose state does not fit may start
    /// empty.
    pub allow_state_loss: bool,
    /// What changes, in words.
    pub what: String,
    /// The catalog before the change planned into it: what to put back
    /// ([`Engine::restore_catalog`]) if the change is refused.
    pub undo: Option<SavedCatalog>,
}

/// The running query a [`Change`] is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeTarget {
    /// The query of `CREATE ALERT name`.
    Alert(String),
    /// A query by its id (as `SHOW QUERIES` lists it) or its name.
    Query(String),
}

/// The catalog and declarations of an [`Engine`], to put back when a
/// change that already planned into them is refused.
pub struct SavedCatalog {
    catalog: Catalog,
    derived: Vec<Derived>,
}

/// One entry that `DROP` removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// What it was.
    pub kind: ObjectKind,
    /// Its name.
    pub name: String,
}

/// A view, alert or invariant, with its statement: kept to plan it again
/// when something it reads is replaced, and to know what it reads.
#[derive(Debug, Clone)]
struct Derived {
    kind: ObjectKind,
    name: String,
    statement: Statement,
    /// The streams and views it reads, directly or through views.
    reads: Vec<String>,
}

/// The instances of a key-partitioned stage unless set otherwise: one per
/// core this process may use.
pub fn default_parallelism() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(usize::from(crate::state::KEY_GROUPS))
}

/// `instances` if it is a parallelism a query can run at.
pub fn check_parallelism(instances: usize) -> Result<usize> {
    let most = usize::from(crate::state::KEY_GROUPS);
    match instances {
        1.. if instances <= most => Ok(instances),
        _ => Err(Error::Plan(format!(
            "parallelism must be between 1 and {most} (the key groups state is divided into), got {instances}"
        ))),
    }
}

/// Holds the declared streams and sinks and plans queries against them.
#[derive(Debug)]
pub struct Engine {
    planner: SqlPlanner,
    catalog: Catalog,
    /// `None` lets the planner choose: per-record for `EMIT CHANGES`,
    /// micro-batch otherwise.
    mode: Option<ExecutionMode>,
    /// Files that replace the `path` of the streams so named.
    inputs: Vec<(String, PathBuf)>,
    /// Replaces the `follow` option of every file stream, if set.
    follow: Option<bool>,
    /// Replaces the `batch_size` option of every stream, if set.
    batch_size: Option<usize>,
    /// The name `SET query_name` gave the next query.
    query_name: Option<String>,
    /// Instances of each key-partitioned stage; `None` for one per core.
    parallelism: Option<usize>,
    /// `SET autoscale = 'on'`: queries started from now on are scaled.
    autoscale_on: bool,
    /// The `autoscale.*` settings they are scaled by.
    autoscale: AutoscaleSettings,
    /// Load shedding by stream, as their `WITH (...)` options say.
    stream_shed: std::collections::BTreeMap<String, ShedSettings>,
    /// Load shedding as `SET` says, over every stream's.
    shed: ShedSettings,
    /// `SET buffer` and `SET buffer_max`: for the queries planned from now
    /// on, over streams whose own options do not say.
    buffer: BufferSetting,
    /// The declared views, alerts and invariants, in an order where each
    /// comes after what it reads.
    derived: Vec<Derived>,
    /// `EXPLAIN ANALYZE` plans but does not run (`vigil check`).
    plan_only: bool,
    /// In a group (`vigil run --group`): the one Kafka partition the
    /// streams and sinks declared from now on are for.
    kafka_partition: Option<i32>,
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl Engine {
    /// An engine with no streams but the built-in ones, whose connectors
    /// (like those of every stream and sink declared later) it resolves
    /// through the registry.
    pub fn new() -> Self {
        Engine {
            planner: Default::default(),
            catalog: Catalog::new(&Registry),
            mode: Default::default(),
            inputs: Default::default(),
            follow: Default::default(),
            batch_size: Default::default(),
            query_name: Default::default(),
            parallelism: Default::default(),
            autoscale_on: Default::default(),
            autoscale: Default::default(),
            stream_shed: Default::default(),
            shed: Default::default(),
            buffer: Default::default(),
            derived: Default::default(),
            plan_only: Default::default(),
            kafka_partition: Default::default(),
        }
    }

    /// The declared streams and sinks.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The names of the functions queries can call, sorted.
    pub fn function_names(&self) -> Vec<String> {
        self.planner.function_names()
    }

    /// Declares a stream built in Rust rather than by `CREATE STREAM`.
    pub fn add_stream(&mut self, def: crate::plan::StreamDef) -> Result<()> {
        self.catalog.add_stream(def)
    }

    /// Sets the execution mode of the queries planned from now on.
    pub fn set_execution_mode(&mut self, mode: ExecutionMode) {
        self.mode = Some(mode);
    }

    /// Runs each key-partitioned stage of the queries planned from now on
    /// as `instances` instances (1 to [`crate::state::KEY_GROUPS`]); the
    /// default is one per core.
    pub fn set_parallelism(&mut self, instances: usize) -> Result<()> {
        self.parallelism = Some(check_parallelism(instances)?);
        Ok(())
    }

    /// The instances each key-partitioned stage of the next query runs as.
    pub fn parallelism(&self) -> usize {
        self.parallelism.unwrap_or_else(default_parallelism)
    }

    /// Reads stream `name` from `path` (relative to the working directory)
    /// instead of the file its `CREATE STREAM` names: the same script runs
    /// over other data.
    pub fn override_input(&mut self, name: &str, path: PathBuf) {
        self.inputs.push((name.to_string(), path));
    }

    /// Makes every file stream declared from now on follow its file as it
    /// grows (`true`) or end at its end (`false`), whatever its `follow`
    /// option says.
    pub fn set_follow(&mut self, follow: bool) {
        self.follow = Some(follow);
    }

    /// Makes the script's Kafka streams and sinks declared from now on the
    /// ones of one partition's pipeline in a group (`vigil run --group`):
    /// every `kafka` stream reads only `partition`, and every `kafka` sink
    /// writes with a transactional id of its own for it (see
    /// [`crate::connectors::kafka::sink_for_partition`]).
    pub fn set_kafka_partition(&mut self, partition: i32) {
        self.kafka_partition = Some(partition);
    }

    /// Makes every stream declared from now on read batches of at most
    /// `rows` rows, whatever its `batch_size` option says.
    pub fn set_batch_size(&mut self, rows: usize) {
        self.batch_size = Some(rows);
    }

    /// Executes one statement; relative paths in it resolve against
    /// `base_dir`.
    ///
    /// Planning runs on a thread with a large stack: DataFusion's planner
    /// and vigil's walk expressions recursively, and an expression as deep
    /// as the parser allows ([`crate::sql::limits`]) needs more stack than
    /// a tokio worker has.
    pub fn execute(&mut self, statement: &Statement, base_dir: &Path) -> Result<Outcome> {
        crate::sql::limits::on_large_stack(|| self.execute_here(statement, base_dir))
    }

    fn execute_here(&mut self, statement: &Statement, base_dir: &Path) -> Result<Outcome> {
        if statement.or_replace {
            return self.replace(statement, base_dir);
        }
        if let Some((kind, name)) = declared_name(&statement.kind) {
            self.check_new(kind, name)?;
        }
        self.run(statement, base_dir)
    }

    /// Executes a statement whose name, if it declares one, is free.
    fn run(&mut self, statement: &Statement, base_dir: &Path) -> Result<Outcome> {
        match &statement.kind {
            StatementKind::CreateStream(create) => {
                self.create_stream(create, base_dir)?;
                Ok(Outcome::Done)
            }
            StatementKind::CreateSink(create) => {
                let mut create = create.clone();
                if let Some(partition) = self.kafka_partition {
                    crate::connectors::kafka::sink_for_partition(
                        &create.name,
                        &mut create.options,
                        partition,
                    );
                }
                self.catalog.add_sink(&create, base_dir, &Registry)?;
                Ok(Outcome::Done)
            }
            StatementKind::Explain {
                analyze,
                query,
                emit,
                alert,
            } => {
                let alert = alert.as_deref().map(|a| (a, alert_name(statement)));
                match analyze {
                    true => self.explain_analyze(query, emit.as_ref(), alert),
                    false => self.explain(query, emit.as_ref(), alert),
                }
                .map(Outcome::Explain)
            }
            StatementKind::CreateAlert {
                name,
                query,
                emit,
                alert,
            } => {
                let clause = alert.as_deref().ok_or_else(|| {
                    Error::Plan(format!("CREATE ALERT {name} has no ALERT clause"))
                })?;
                let (logical, graph) = self.plan_alert(query, emit.as_ref(), (clause, name))?;
                self.catalog.add_view(name, logical.clone())?;
                self.remember(ObjectKind::Alert, name, statement, query)?;
                Ok(Outcome::Query(Box::new(PreparedQuery {
                    logical,
                    graph,
                    sink: None,
                    line: statement.line,
                    declares_alert: Some(name.clone()),
                    name: Some(self.query_name.take().unwrap_or_else(|| name.clone())),
                    origin: Some(Box::new((statement.clone(), base_dir.to_path_buf()))),
                })))
            }
            StatementKind::CreateView { name, query } => {
                // Planned in full now, so a view that cannot run is
                // rejected where it is declared.
                self.plan(query, None)?;
                let raw = self.planner.plan_raw(&self.catalog, query)?;
                self.catalog.add_view(name, raw)?;
                self.remember(ObjectKind::View, name, statement, query)?;
                Ok(Outcome::Done)
            }
            StatementKind::CreateInvariant {
                name,
                query,
                clause,
            } => {
                let clause = clause.as_deref().ok_or_else(|| {
                    Error::Plan(format!("CREATE INVARIANT {name} has no LEARN clause"))
                })?;
                let logical = self.plan_logical(query, None)?;
                let logical = self
                    .planner
                    .plan_invariant(&self.catalog, logical, clause, name)?;
                // Planned in full now, so an invariant that cannot run is
                // rejected where it is declared.
                self.plan_graph(logical.clone(), None)?;
                self.catalog.add_view(name, logical)?;
                self.remember(ObjectKind::Invariant, name, statement, query)?;
                Ok(Outcome::Done)
            }
            StatementKind::Set { name, value } => {
                self.set(name, value)?;
                Ok(Outcome::Done)
            }
            StatementKind::AlterAlert {
                name,
                change,
                allow_state_loss,
            } => self.alter_alert(name, change, *allow_state_loss, base_dir),
            StatementKind::AlterQuery {
                query,
                parallelism,
                allow_state_loss,
            } => Ok(Outcome::Change(Box::new(Change {
                target: ChangeTarget::Query(query.clone()),
                query: None,
                parallelism: Some(check_parallelism(*parallelism)?),
                allow_state_loss: *allow_state_loss,
                what: format!("parallelism {parallelism}"),
                undo: None,
            }))),
            StatementKind::Drop {
                kind,
                name,
                if_exists,
                cascade,
            } => self
                .drop_entry(*kind, name, *if_exists, *cascade)
                .map(Outcome::Dropped),
            StatementKind::Show(Show::Queries) => Ok(Outcome::ShowQueries),
            StatementKind::Show(what) => Ok(Outcome::Rows(self.show(*what))),
            StatementKind::Describe { name } => self.describe(name).map(Outcome::Rows),
            StatementKind::Query {
                query,
                sink,
                emit,
                alert,
            } => {
                // A plain query is planned once, to see whether it reads
                // a stream and then to run it.
                let mut planned = None;
                if sink.is_none() && alert.is_none() && emit.is_none() {
                    let logical = self.planner.plan_query(&self.catalog, query)?;
                    if let Some(rows) = self.answer_without_streams(&logical)? {
                        return Ok(Outcome::Rows(rows));
                    }
                    planned = Some(logical);
                }
                let sink = match sink {
                    Some(name) => Some(
                        self.catalog
                            .sink(name)
                            .cloned()
                            .ok_or_else(|| Error::Plan(format!("unknown sink '{name}'")))?,
                    ),
                    None => None,
                };
                let (logical, graph) = match alert.as_deref() {
                    Some(clause) => {
                        self.plan_alert(query, emit.as_ref(), (clause, &alert_name(statement)))?
                    }
                    None => match planned {
                        Some(logical) => {
                            self.plan_graph(self.with_emit(logical, emit.as_ref())?, emit.as_ref())?
                        }
                        None => self.plan(query, emit.as_ref())?,
                    },
                };
                if let Some(sink) = sink.as_ref().filter(|s| s.append_only) {
                    check_append_only(&logical, sink)?;
                }
                Ok(Outcome::Query(Box::new(PreparedQuery {
                    logical,
                    graph,
                    sink,
                    line: statement.line,
                    declares_alert: None,
                    name: self.query_name.take(),
                    origin: Some(Box::new((statement.clone(), base_dir.to_path_buf()))),
                })))
            }
        }
    }
}

/// Most levels of operators in one query's logical plan, counting those of
/// the views it reads (and of the views they read). A view over a view
/// over ... grows the plan each time, and every layer of the planner walks
/// it recursively and in time that grows faster than its depth; real
/// queries stay far below this.
pub const MAX_PLAN_DEPTH: usize = 256;

/// The directory relative paths in a script resolve against.
pub fn script_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod aggregate_tests;
#[cfg(test)]
mod alert_roles_tests;
#[cfg(test)]
mod catalog_tests;
#[cfg(test)]
mod tests;
