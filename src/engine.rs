//! The engine: statements in, running queries out. The CLI is a thin layer
//! over this, and so is anything that embeds vigil.

use std::path::{Path, PathBuf};

use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Extension, LogicalPlan};
use datafusion::sql::sqlparser::ast::Query;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

use crate::connectors::SinkConfig;
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
    /// whoever runs it to make ([`crate::session::Session::change`]). The
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
#[derive(Debug, Default)]
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

impl Engine {
    /// An engine with no streams.
    pub fn new() -> Self {
        Self::default()
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
                self.catalog.add_sink(&create, base_dir)?;
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

    /// Records a view, alert or invariant just added to the catalog.
    fn remember(
        &mut self,
        kind: ObjectKind,
        name: &str,
        statement: &Statement,
        query: &Query,
    ) -> Result<()> {
        let raw = self.planner.plan_raw(&self.catalog, query)?;
        let reads = self.catalog.reads(&raw);
        self.derived.push(Derived {
            kind,
            name: name.to_string(),
            statement: statement.clone(),
            reads,
        });
        Ok(())
    }

    /// What kind of entry `name` is, if the script declared one (a
    /// built-in stream is none).
    fn kind_of(&self, name: &str) -> Option<ObjectKind> {
        if let Some(derived) = self.derived.iter().find(|d| d.name == name) {
            return Some(derived.kind);
        }
        if self.catalog.has_stream(name) {
            return Some(ObjectKind::Stream);
        }
        self.catalog.view(name).map(|_| ObjectKind::View)
    }

    /// Fails if `name` is taken, saying how to replace or remove what has
    /// it. Sinks have names of their own, checked by the catalog.
    fn check_new(&self, kind: ObjectKind, name: &str) -> Result<()> {
        if kind == ObjectKind::Sink {
            return Ok(());
        }
        match self.kind_of(name) {
            None => Ok(()),
            Some(existing) if existing == kind => Err(Error::Plan(format!(
                "{kind} '{name}' already exists (CREATE OR REPLACE {word} {name} replaces it, DROP {word} {name} removes it)",
                word = kind.keyword()
            ))),
            Some(existing) => Err(Error::Plan(format!(
                "{} named '{name}' already exists (DROP {} {name} removes it)",
                existing.a(),
                existing.keyword()
            ))),
        }
    }

    /// The views, alerts and invariants that read `name`, directly or
    /// through others, in declaration order.
    fn readers_of(&self, name: &str) -> Vec<Derived> {
        self.derived
            .iter()
            .filter(|d| d.reads.iter().any(|r| r == name))
            .cloned()
            .collect()
    }

    /// Removes an entry from the catalog and the record of views.
    fn forget(&mut self, kind: ObjectKind, name: &str) {
        match kind {
            ObjectKind::Sink => {
                self.catalog.remove_sink(name);
            }
            ObjectKind::Stream => {
                self.catalog.remove_stream(name);
            }
            ObjectKind::View | ObjectKind::Alert | ObjectKind::Invariant => {
                self.catalog.remove_view(name);
                self.derived.retain(|d| d.name != name);
            }
        }
    }

    /// `DROP kind name`: refused while views, alerts or invariants read
    /// the entry, unless `cascade` drops them too.
    fn drop_entry(
        &mut self,
        kind: ObjectKind,
        name: &str,
        if_exists: bool,
        cascade: bool,
    ) -> Result<Vec<Dropped>> {
        let exists = match kind {
            ObjectKind::Sink => self.catalog.sink(name).is_some(),
            _ => match self.kind_of(name) {
                Some(existing) if existing != kind => {
                    return Err(Error::Plan(format!(
                        "'{name}' is {}, not {} (DROP {} {name} drops it)",
                        existing.a(),
                        kind.a(),
                        existing.keyword()
                    )));
                }
                found => found.is_some(),
            },
        };
        if !exists {
            if kind == ObjectKind::Stream && self.catalog.stream(name).is_some() {
                return Err(Error::Plan(format!(
                    "stream '{name}' is built in and cannot be dropped"
                )));
            }
            if if_exists {
                return Ok(Vec::new());
            }
            return Err(Error::Plan(format!(
                "no {kind} named '{name}' (SHOW {}S lists them)",
                if kind == ObjectKind::Sink {
                    "SINK"
                } else {
                    "STREAM"
                }
            )));
        }
        let readers = self.readers_of(name);
        if !readers.is_empty() && !cascade {
            return Err(Error::Plan(format!(
                "cannot drop {kind} '{name}': {} {} it (DROP {} {name} CASCADE drops them too)",
                describe_all(&readers),
                if readers.len() == 1 { "reads" } else { "read" },
                kind.keyword()
            )));
        }
        let mut dropped = vec![Dropped {
            kind,
            name: name.to_string(),
        }];
        // Readers last first, so that nothing is left reading a dropped
        // entry while the others go.
        dropped.extend(readers.iter().rev().map(|d| Dropped {
            kind: d.kind,
            name: d.name.clone(),
        }));
        for entry in &dropped {
            self.forget(entry.kind, &entry.name);
        }
        Ok(dropped)
    }

    /// `CREATE OR REPLACE`: declares the entry in place of the one of the
    /// same name, then plans again, on the new definition, each view,
    /// alert and invariant that read the old one. If one of them no longer
    /// plans, nothing changes.
    fn replace(&mut self, statement: &Statement, base_dir: &Path) -> Result<Outcome> {
        let Some((kind, name)) = declared_name(&statement.kind) else {
            return Err(Error::Plan(
                "OR REPLACE belongs to CREATE STREAM, VIEW, SINK, ALERT or INVARIANT".into(),
            ));
        };
        let name = name.to_string();
        if kind != ObjectKind::Sink
            && let Some(existing) = self.kind_of(&name).filter(|k| *k != kind)
        {
            return Err(Error::Plan(format!(
                "'{name}' is {}, not {} (DROP {} {name} removes it)",
                existing.a(),
                kind.a(),
                existing.keyword()
            )));
        }
        let saved = (self.catalog.clone(), self.derived.clone());
        let replaced = self.replace_in_place(kind, &name, statement, base_dir);
        if replaced.is_err() {
            (self.catalog, self.derived) = saved;
        }
        replaced
    }

    fn replace_in_place(
        &mut self,
        kind: ObjectKind,
        name: &str,
        statement: &Statement,
        base_dir: &Path,
    ) -> Result<Outcome> {
        let readers = self.readers_of(name);
        self.forget(kind, name);
        let outcome = self.run(statement, base_dir)?;
        if let Some(new) = self.derived.last().filter(|d| d.name == name)
            && let Some(reader) = readers.iter().find(|r| new.reads.contains(&r.name))
        {
            return Err(Error::Plan(format!(
                "{kind} '{name}' cannot read {} '{}', which reads it",
                reader.kind, reader.name
            )));
        }
        for reader in readers {
            self.forget(reader.kind, &reader.name);
            // A reader is planned again only into the catalog: a query it
            // started (CREATE ALERT) goes on with its own plan.
            self.run(&reader.statement, base_dir).map_err(|e| {
                Error::Plan(format!(
                    "cannot replace {kind} '{name}': {} '{}' reads it and does not plan on the new definition ({e}); drop or replace it first",
                    reader.kind, reader.name
                ))
            })?;
        }
        Ok(outcome)
    }

    /// `ALTER ALERT name SET ...`: the alert's declaration changed and
    /// planned again into the catalog, as the change to make.
    fn alter_alert(
        &mut self,
        name: &str,
        change: &crate::sql::AlertChange,
        allow_state_loss: bool,
        base_dir: &Path,
    ) -> Result<Outcome> {
        let declared = self
            .derived
            .iter()
            .find(|d| d.kind == ObjectKind::Alert && d.name == name)
            .map(|d| d.statement.clone())
            .ok_or_else(|| {
                Error::Plan(format!("no alert named '{name}' (SHOW ALERTS lists them)"))
            })?;
        let mut changed = declared.clone();
        let StatementKind::CreateAlert { alert, .. } = &mut changed.kind else {
            return Err(Error::Plan(format!("'{name}' is not an alert")));
        };
        let clause = alert
            .as_deref()
            .ok_or_else(|| Error::Plan(format!("alert '{name}' has no ALERT clause")))?;
        *alert = Some(Box::new(change.apply(clause).map_err(Error::Plan)?));
        changed.or_replace = true;
        let undo = self.save_catalog();
        let saved_name = self.query_name.take();
        let outcome = self.replace(&changed, base_dir);
        self.query_name = saved_name;
        let Outcome::Query(query) = outcome? else {
            return Err(Error::Plan(format!("alert '{name}' plans no query")));
        };
        Ok(Outcome::Change(Box::new(Change {
            target: ChangeTarget::Alert(name.to_string()),
            query: Some(query),
            parallelism: None,
            allow_state_loss,
            what: format!("alert {name}"),
            undo: Some(undo),
        })))
    }

    /// Plans `statement` (a query, or the `CREATE ALERT` of an alert the
    /// catalog has) again, at `parallelism`: the query a running one
    /// changes into.
    pub fn replan(
        &mut self,
        statement: &Statement,
        base_dir: &Path,
        parallelism: usize,
    ) -> Result<PreparedQuery> {
        let mut statement = statement.clone();
        statement.or_replace = matches!(statement.kind, StatementKind::CreateAlert { .. });
        let before = self.parallelism;
        let saved_name = self.query_name.take();
        self.parallelism = Some(check_parallelism(parallelism)?);
        let outcome = self.execute(&statement, base_dir);
        self.parallelism = before;
        self.query_name = saved_name;
        match outcome? {
            Outcome::Query(query) => Ok(*query),
            _ => Err(Error::Plan("the statement plans no query".into())),
        }
    }

    /// How the queries started now are scaled: `None` unless `SET
    /// autoscale = 'on'`.
    pub fn autoscale(&self) -> Option<AutoscaleSettings> {
        self.autoscale_on.then(|| self.autoscale.clone())
    }

    /// The catalog and declarations as they are, for [`Engine::restore_catalog`].
    pub fn save_catalog(&self) -> SavedCatalog {
        SavedCatalog {
            catalog: self.catalog.clone(),
            derived: self.derived.clone(),
        }
    }

    /// Puts back what [`Engine::save_catalog`] saved.
    pub fn restore_catalog(&mut self, saved: SavedCatalog) {
        self.catalog = saved.catalog;
        self.derived = saved.derived;
    }

    /// What `SHOW` lists (`SHOW QUERIES` has no rows here: see
    /// [`Outcome::ShowQueries`]).
    pub fn show(&self, what: Show) -> Listing {
        let derived = |kinds: &[ObjectKind]| -> Vec<Vec<String>> {
            self.derived
                .iter()
                .filter(|d| kinds.contains(&d.kind))
                .filter_map(|d| {
                    let view = self.catalog.view(&d.name)?;
                    let schema = datafusion::logical_expr::TableSource::schema(view.as_ref());
                    Some(vec![
                        d.name.clone(),
                        d.kind.noun(),
                        listing::column_list(&schema),
                        format!("reads {}", d.reads.join(", ")),
                    ])
                })
                .collect()
        };
        const COLUMNS: [&str; 4] = ["name", "kind", "columns", "source"];
        match what {
            Show::Streams => {
                let mut rows: Vec<Vec<String>> = self
                    .catalog
                    .all_streams()
                    .map(|s| {
                        let mut source = listing::source_text(s);
                        if Catalog::is_builtin(s) {
                            source.push_str(" (built in)");
                        }
                        vec![
                            s.name.clone(),
                            "stream".into(),
                            listing::column_list(&s.schema),
                            source,
                        ]
                    })
                    .collect();
                rows.extend(derived(&[
                    ObjectKind::View,
                    ObjectKind::Alert,
                    ObjectKind::Invariant,
                ]));
                rows.extend(self.catalog.sinks().map(|s| {
                    vec![
                        s.name.clone(),
                        "sink".into(),
                        String::new(),
                        listing::sink_text(s),
                    ]
                }));
                Listing::new(&COLUMNS, rows)
            }
            Show::Views => Listing::new(&COLUMNS, derived(&[ObjectKind::View])),
            Show::Alerts => Listing::new(&COLUMNS, derived(&[ObjectKind::Alert])),
            Show::Sinks => Listing::new(
                &["name", "target"],
                self.catalog
                    .sinks()
                    .map(|s| vec![s.name.clone(), listing::sink_text(s)])
                    .collect(),
            ),
            Show::Queries => Listing::new(&listing::QUERY_COLUMNS, Vec::new()),
        }
    }

    /// What `DESCRIBE name` shows: a stream's source and event time, or
    /// what a view, alert or invariant reads; then the columns.
    pub fn describe(&self, name: &str) -> Result<Listing> {
        if let Some(stream) = self.catalog.stream(name) {
            return Ok(listing::describe_stream(stream));
        }
        let Some(view) = self.catalog.view(name) else {
            if let Some(sink) = self.catalog.sink(name) {
                let row = vec![name.to_string(), listing::sink_text(sink)];
                return Ok(Listing::new(&["sink", "target"], vec![row]));
            }
            return Err(Error::Plan(format!(
                "no stream, view, alert, invariant or sink named '{name}' (SHOW STREAMS lists them)"
            )));
        };
        let schema = datafusion::logical_expr::TableSource::schema(view.as_ref());
        let mut described = listing::describe_columns(&schema, None);
        let note = match self.derived.iter().find(|d| d.name == name) {
            Some(d) => format!("{} {name}: reads {}", d.kind, d.reads.join(", ")),
            None => format!("view {name}"),
        };
        described.notes.push(note);
        Ok(described)
    }

    fn set(&mut self, name: &str, value: &str) -> Result<()> {
        match name {
            "execution_mode" => {
                self.mode = Some(ExecutionMode::parse(value)?);
                Ok(())
            }
            "parallelism" => {
                let instances = value.trim().parse::<usize>().map_err(|_| {
                    Error::Plan(format!(
                        "parallelism must be a whole number of instances, got '{value}'"
                    ))
                })?;
                self.set_parallelism(instances)
            }
            _ if ShedSettings::KEYS.contains(&name) => {
                let mut settings = self.shed.clone();
                settings.set(name, value);
                self.check_shed_setting(&settings)?;
                self.shed = settings;
                Ok(())
            }
            BUFFER | BUFFER_MAX => self.buffer.set("SET", name, value),
            "autoscale" => {
                self.autoscale_on = match value.trim().to_ascii_lowercase().as_str() {
                    "on" | "true" => true,
                    "off" | "false" => false,
                    _ => {
                        return Err(Error::Plan(format!(
                            "autoscale must be 'on' or 'off', got '{value}'"
                        )));
                    }
                };
                Ok(())
            }
            _ if autoscale::KEYS.contains(&name) => {
                let mut settings = self.autoscale.clone();
                settings.set(name, value)?;
                settings.check()?;
                self.autoscale = settings;
                Ok(())
            }
            "query_name" => {
                let value = value.trim();
                if value.is_empty() {
                    return Err(Error::Plan("query_name cannot be empty".into()));
                }
                self.query_name = Some(value.to_string());
                Ok(())
            }
            _ => Err(Error::Plan(format!(
                "unknown setting '{name}' (settings: autoscale, autoscale.policy, autoscale.min, autoscale.max, autoscale.headroom, autoscale.interval, autoscale.cooldown, autoscale.hook, buffer, buffer_max, execution_mode, parallelism, query_name, shed, max_latency, shed_keep, shed_scale)"
            ))),
        }
    }

    fn create_stream(&mut self, create: &CreateStream, base_dir: &Path) -> Result<()> {
        let delay_ms = match create.watermark.as_ref().and_then(|w| w.delay.as_ref()) {
            Some(expr) => self.planner.interval_ms(&self.catalog, expr)?,
            None => 0,
        };
        if delay_ms < 0 {
            return Err(Error::Plan(format!(
                "stream '{}': the watermark delay must not be negative",
                create.name
            )));
        }
        let option = |key: &str| {
            create
                .options
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, text)| self.option_ms(&create.name, key, text))
                .transpose()
        };
        let timing = StreamTiming {
            delay_ms,
            lateness_ms: option(ALLOWED_LATENESS)?.unwrap_or(0),
            idle_timeout: option(IDLE_TIMEOUT)?
                .map(|ms| std::time::Duration::from_millis(ms as u64)),
        };
        let mut create = self.with_input_override(create);
        for key in ShedSettings::KEYS {
            if create.options.iter().filter(|(k, _)| k == key).count() > 1 {
                return Err(Error::Plan(format!(
                    "stream '{}': option '{key}' is given more than once",
                    create.name
                )));
            }
        }
        let shed = ShedSettings::from_options(&create.options);
        create
            .options
            .retain(|(k, _)| !ShedSettings::KEYS.contains(&k.as_str()));
        let reads_file = create
            .options
            .iter()
            .find(|(k, _)| k == "connector")
            .is_none_or(|(_, v)| v.trim().eq_ignore_ascii_case("file"));
        if let Some(rows) = self.batch_size {
            create
                .options
                .retain(|(k, _)| !k.eq_ignore_ascii_case("batch_size"));
            create.options.push(("batch_size".into(), rows.to_string()));
        }
        if let Some(follow) = self.follow.filter(|_| reads_file) {
            create.options.retain(|(k, _)| k != "follow");
            create.options.push(("follow".into(), follow.to_string()));
        }
        if let Some(partition) = self.kafka_partition {
            crate::connectors::kafka::stream_for_partition(&mut create.options, partition);
        }
        let def = stream_def(&create, timing, base_dir)?;
        self.shed_config(&def, &shed)?;
        self.catalog.add_stream(def)?;
        self.stream_shed.insert(create.name.clone(), shed);
        Ok(())
    }

    /// Checks `SET` shedding settings as far as they go without a stream:
    /// the policy, the interval and the flag.
    fn check_shed_setting(&self, settings: &ShedSettings) -> Result<()> {
        if let Some(policy) = &settings.policy {
            ShedPolicy::parse(policy)?;
        }
        if let Some(text) = &settings.max_latency {
            self.max_latency("SET", text)?;
        }
        settings.scale_flag()?;
        Ok(())
    }

    fn max_latency(&self, stream: &str, text: &str) -> Result<std::time::Duration> {
        let ms = self.option_ms(stream, "max_latency", text)?;
        if ms == 0 {
            return Err(Error::Plan(format!(
                "stream '{stream}': max_latency must be longer than 0"
            )));
        }
        Ok(std::time::Duration::from_millis(ms as u64))
    }

    /// The shedding of a query over `stream`, by its options `settings`
    /// and the `SET`s after them; `None` when off.
    fn shed_config(
        &self,
        stream: &StreamDef,
        settings: &ShedSettings,
    ) -> Result<Option<ShedConfig>> {
        let settings = settings.overridden_by(&self.shed);
        let name = &stream.name;
        let in_stream = |e: Error| Error::Plan(format!("stream '{name}': {e}"));
        let Some(policy) = settings.policy.as_deref() else {
            return Ok(None);
        };
        let Some(policy) = ShedPolicy::parse(policy).map_err(in_stream)? else {
            return Ok(None);
        };
        let max_latency = match &settings.max_latency {
            Some(text) => self.max_latency(name, text)?,
            None => crate::exec::shed::DEFAULT_MAX_LATENCY,
        };
        let keep = match settings.keep.as_deref() {
            Some(text) => Some(
                self.planner
                    .row_predicate(&self.catalog, &stream.schema, text)
                    .map_err(|e| in_stream(Error::Plan(format!("bad shed_keep '{text}': {e}"))))?,
            ),
            None => None,
        };
        if policy == ShedPolicy::Priority && keep.is_none() {
            return Err(in_stream(Error::Plan(
                "shed = 'priority' needs shed_keep, the rows always kept (e.g. shed_keep = 'severity >= 3')".into(),
            )));
        }
        let scale = settings.scale_flag().map_err(in_stream)?;
        Ok(Some(ShedConfig {
            policy,
            max_latency,
            keep,
            scale,
        }))
    }

    /// The shedding of a query reading `plan`'s streams.
    fn query_shed(&self, plan: &LogicalPlan) -> Result<Option<ShedConfig>> {
        let mut streams: Vec<Arc<StreamDef>> = Vec::new();
        plan.apply(|node| {
            if let LogicalPlan::TableScan(scan) = node
                && let Some(source) = scan
                    .source
                    .as_ref()
                    .downcast_ref::<crate::plan::StreamSource>()
            {
                streams.push(source.def.clone());
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        })?;
        let mut configs = Vec::new();
        for stream in &streams {
            let own = self
                .stream_shed
                .get(&stream.name)
                .cloned()
                .unwrap_or_default();
            if let Some(config) = self.shed_config(stream, &own)? {
                configs.push(config);
            }
        }
        Ok(configs.into_iter().next())
    }

    /// `create` reading from its override file, if it has one.
    fn with_input_override(&self, create: &CreateStream) -> CreateStream {
        let mut create = create.clone();
        if let Some((_, path)) = self.inputs.iter().rev().find(|(n, _)| *n == create.name) {
            // The file replaces the connector, with the options that
            // belong to the one it replaces.
            const REPLACED: [&str; 5] = ["path", "connector", "interval", "limit", "speed"];
            create
                .options
                .retain(|(k, _)| !REPLACED.contains(&k.as_str()));
            let absolute = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            create
                .options
                .push(("path".into(), absolute.display().to_string()));
        }
        create
    }

    /// Reads an interval option such as `allowed_lateness = '5 seconds'` as
    /// milliseconds.
    fn option_ms(&self, stream: &str, key: &str, text: &str) -> Result<i64> {
        let bad = |why: String| {
            Error::Plan(format!(
                "stream '{stream}': bad value '{text}' for option '{key}' ({why}; write e.g. '30 seconds')"
            ))
        };
        let literal = format!("INTERVAL '{}'", text.replace('\'', "''"));
        let expr = Parser::new(&GenericDialect {})
            .try_with_sql(&literal)
            .and_then(|mut p| p.parse_expr())
            .map_err(|e| bad(e.to_string()))?;
        let ms = self
            .planner
            .interval_ms(&self.catalog, &expr)
            .map_err(|e| bad(e.to_string()))?;
        if ms < 0 {
            return Err(bad("it must not be negative".into()));
        }
        Ok(ms)
    }

    /// Plans a query with its `EMIT` clause into its logical plan and
    /// operator graph.
    pub fn plan(&self, query: &Query, emit: Option<&Emit>) -> Result<(LogicalPlan, QueryGraph)> {
        let logical = self.plan_logical(query, emit)?;
        self.plan_graph(logical, emit)
    }

    /// Plans a query that ends with an `ALERT` clause; `alert` is the
    /// clause and the alert's name.
    pub fn plan_alert(
        &self,
        query: &Query,
        emit: Option<&Emit>,
        alert: (&AlertClause, &str),
    ) -> Result<(LogicalPlan, QueryGraph)> {
        let logical = self.plan_logical(query, emit)?;
        if let LogicalPlan::Extension(ext) = &logical
            && let Some(node) = ext.node.as_any().downcast_ref::<EmitNode>()
            && node.policy.marker().is_some()
        {
            return Err(Error::Plan(format!(
                "ALERT needs final rows, but the query emits {} (drop the EMIT clause, or allowed_lateness)",
                node.policy
            )));
        }
        let (clause, name) = alert;
        let logical = self
            .planner
            .plan_alert(&self.catalog, logical, clause, name)?;
        self.plan_graph(logical, emit)
    }

    /// A query that reads no stream nor view (`SELECT 1`, `SELECT now()`)
    /// is answered at once, as a one-off question; `None` for one that
    /// reads something.
    fn answer_without_streams(&self, logical: &LogicalPlan) -> Result<Option<Listing>> {
        let reads_a_table = logical
            .exists(|node| Ok(matches!(node, LogicalPlan::TableScan(_))))
            .unwrap_or(true);
        if reads_a_table {
            return Ok(None);
        }
        let batches = crate::exec::answer_once(logical)?;
        let schema = logical.schema().as_arrow().clone();
        Listing::from_batches(&schema, &batches).map(Some)
    }

    fn plan_logical(&self, query: &Query, emit: Option<&Emit>) -> Result<LogicalPlan> {
        let logical = self.planner.plan_query(&self.catalog, query)?;
        self.with_emit(logical, emit)
    }

    /// `logical`, a planned query, under its `EMIT` policy (the default
    /// one when late rows update windows).
    fn with_emit(&self, mut logical: LogicalPlan, emit: Option<&Emit>) -> Result<LogicalPlan> {
        check_plan_depth(&logical)?;
        let mut policy = emit.map(|e| self.emit_policy(e)).transpose()?;
        if windows_take_late_rows(&logical)
            && matches!(policy, None | Some(EmitPolicy::OnWindowClose { .. }))
        {
            policy = Some(EmitPolicy::OnWindowClose { late_updates: true });
        }
        if let Some(policy) = policy {
            let node = EmitNode::try_new(logical, policy)?;
            logical = LogicalPlan::Extension(Extension {
                node: Arc::new(node),
            });
        }
        Ok(logical)
    }

    fn plan_graph(
        &self,
        logical: LogicalPlan,
        emit: Option<&Emit>,
    ) -> Result<(LogicalPlan, QueryGraph)> {
        let policy = emit.map(|e| self.emit_policy(e)).transpose()?;
        let mode = self.mode.unwrap_or(match policy {
            Some(EmitPolicy::Changes) => ExecutionMode::PerRecord,
            _ => ExecutionMode::MicroBatch,
        });
        let shed = self.query_shed(&logical)?;
        let mut graph = plan_incremental_shed(&logical, mode, self.parallelism(), shed)?;
        self.apply_buffer(&mut graph);
        Ok((logical, graph))
    }

    /// Gives the inputs of `graph` the session's buffer setting where
    /// their streams' options say nothing.
    fn apply_buffer(&self, graph: &mut QueryGraph) {
        for input in &mut graph.inputs {
            let buffer = input.stream.buffer.or(self.buffer);
            if buffer != input.stream.buffer {
                let mut stream = (*input.stream).clone();
                stream.buffer = buffer;
                input.stream = Arc::new(stream);
            }
        }
    }

    fn emit_policy(&self, emit: &Emit) -> Result<EmitPolicy> {
        Ok(match emit {
            Emit::OnWindowClose => EmitPolicy::OnWindowClose {
                late_updates: false,
            },
            Emit::Changes => EmitPolicy::Changes,
            Emit::Every(interval) => {
                let interval_ms = self.planner.interval_ms(&self.catalog, interval)?;
                if interval_ms <= 0 {
                    return Err(Error::Plan(format!(
                        "EMIT EVERY needs a positive interval, got {interval}"
                    )));
                }
                EmitPolicy::Every { interval_ms }
            }
        })
    }

    /// The logical plan and the operator graph of a query, as text.
    pub fn explain(
        &self,
        query: &Query,
        emit: Option<&Emit>,
        alert: Option<(&AlertClause, String)>,
    ) -> Result<String> {
        let (logical, graph) = self.plan_explained(query, emit, alert)?;
        Ok(explain_text(&logical, &graph))
    }

    /// `EXPLAIN ANALYZE`: the text of [`Engine::explain`], then what each
    /// operator took, gave and cost when the query ran to the end of its
    /// input (see [`crate::analyze`]). Blocks until the query ends; with
    /// [`Engine::set_plan_only`], plans the query but does not run it.
    pub fn explain_analyze(
        &self,
        query: &Query,
        emit: Option<&Emit>,
        alert: Option<(&AlertClause, String)>,
    ) -> Result<String> {
        let (logical, graph) = self.plan_explained(query, emit, alert)?;
        crate::analyze::check_finite(&graph)?;
        let plan = explain_text(&logical, &graph);
        if self.plan_only {
            return Ok(plan);
        }
        Ok(format!(
            "{plan}\n{}",
            crate::analyze::run(graph, self.autoscale().as_ref())?
        ))
    }

    /// Makes `EXPLAIN ANALYZE` plan its query without running it (for
    /// `vigil check`).
    pub fn set_plan_only(&mut self, plan_only: bool) {
        self.plan_only = plan_only;
    }

    fn plan_explained(
        &self,
        query: &Query,
        emit: Option<&Emit>,
        alert: Option<(&AlertClause, String)>,
    ) -> Result<(LogicalPlan, QueryGraph)> {
        match alert {
            Some((clause, name)) => self.plan_alert(query, emit, (clause, &name)),
            None => self.plan(query, emit),
        }
    }
}

/// Most levels of operators in one query's logical plan, counting those of
/// the views it reads (and of the views they read). A view over a view
/// over ... grows the plan each time, and every layer of the planner walks
/// it recursively and in time that grows faster than its depth; real
/// queries stay far below this.
pub const MAX_PLAN_DEPTH: usize = 256;

/// Refuses a plan deeper than [`MAX_PLAN_DEPTH`]; measured with a stack
/// of its own, not by recursion.
fn check_plan_depth(plan: &LogicalPlan) -> Result<()> {
    let mut pending = vec![(plan, 1usize)];
    while let Some((node, depth)) = pending.pop() {
        if depth > MAX_PLAN_DEPTH {
            return Err(Error::Plan(format!(
                "query plan too deep: more than {MAX_PLAN_DEPTH} levels of operators \
                 (each view it reads, and each view they read, adds its own)"
            )));
        }
        pending.extend(node.inputs().into_iter().map(|input| (input, depth + 1)));
    }
    Ok(())
}

/// Rejects a query whose rows are not all final for a sink that takes
/// only final rows.
fn check_append_only(plan: &LogicalPlan, sink: &SinkConfig) -> Result<()> {
    let LogicalPlan::Extension(ext) = plan else {
        return Ok(());
    };
    let Some(emit) = ext.node.as_any().downcast_ref::<EmitNode>() else {
        return Ok(());
    };
    let what = match emit.policy {
        EmitPolicy::Changes => "a changelog (EMIT CHANGES)",
        EmitPolicy::Every { .. } => "early results (EMIT EVERY)",
        EmitPolicy::OnWindowClose { late_updates: true } => {
            "updates of windows that take late rows (allowed_lateness)"
        }
        EmitPolicy::OnWindowClose {
            late_updates: false,
        } => return Ok(()),
    };
    Err(Error::Plan(format!(
        "sink '{}' is append_only and takes final rows only, but the query emits {what}",
        sink.name
    )))
}

/// `view 'v' and alert 'a'`.
fn describe_all(entries: &[Derived]) -> String {
    let named: Vec<String> = entries
        .iter()
        .map(|d| format!("{} '{}'", d.kind, d.name))
        .collect();
    match named.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The name of an alert written inline (not with `CREATE ALERT`): after
/// the line of its statement.
fn alert_name(statement: &Statement) -> String {
    format!("alert_{}", statement.line)
}

/// What `EXPLAIN` prints: the logical plan, then the operator graph.
fn explain_text(logical: &LogicalPlan, graph: &QueryGraph) -> String {
    format!(
        "logical plan:\n{}\n{}",
        indent(&logical.display_indent().to_string()),
        graph.describe()
    )
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The directory relative paths in a script resolve against.
pub fn script_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests;
