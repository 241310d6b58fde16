//! The incremental planner: rewrites a logical plan into a graph of
//! streaming operators.
//!
//! It walks the plan from its stream scan upwards, turns each node into an
//! operator, fuses chains of stateless operators into one task, starts a new
//! task at each stateful operator, and rejects what cannot run on an
//! unbounded stream with an error naming the rule.

mod batch;
pub use batch::never_ends;
mod explain;
mod peer;
mod shed;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::tree_node::TreeNode;
use datafusion::common::{Column, DFSchema};
use datafusion::common::{JoinType, ScalarValue};
use datafusion::execution::context::ExecutionProps;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{
    Aggregate, Expr, FetchType, Limit, LogicalPlan, SkipType, UserDefinedLogicalNode,
};
use datafusion::logical_expr::{
    WindowFrame, WindowFrameBound, WindowFrameUnits, WindowFunctionDefinition,
};
use datafusion::physical_expr::aggregate::{AggregateExprBuilder, LoweredAggregateBuilder};
use datafusion::physical_expr::{PhysicalExpr, create_physical_expr};

use crate::error::{Error, Result};
use datafusion::physical_plan::unnest::ListUnnest;

use crate::exec::{
    AggregateSpec, AlertOp, ChangelogAggregateOp, ChangelogAggregateSpec, ControlFilter,
    ControlMode, ControlSpec, FilterOp, GroupSlot, InvariantOp, LateRows, LimitOp, MarkOp,
    MergeOperator, Operator, OverFunction, OverOp, OverSpec, ProjectOp, QueryStats,
    SessionAggregateOp, SessionAggregateSpec, SessionAssignOp, ShedConfig, UnnestOp, WatermarkOp,
    WindowAggregateOp, WindowAggregateSpec, WindowAssignOp, WindowGrid, WindowInput, WindowJoin,
    WindowJoinSpec,
};
use crate::plan::{
    AlertNode, ControlKind, ControlNode, EmitNode, EmitPolicy, InvariantNode, StreamDef,
    StreamSource, WatermarkNode, Window, WindowNode,
};

/// How rows move through a query's operators. Both modes give the same
/// results; they trade throughput against latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecutionMode {
    /// Operators work on Arrow batches as the source cuts them: the most
    /// rows per second.
    #[default]
    MicroBatch,
    /// Each row flows through the whole operator chain as it arrives: the
    /// lowest latency.
    PerRecord,
}

impl ExecutionMode {
    /// Parses `'micro_batch'` or `'per_record'` (dashes work too).
    pub fn parse(value: &str) -> Result<Self> {
        match value.to_ascii_lowercase().replace('-', "_").as_str() {
            "micro_batch" => Ok(ExecutionMode::MicroBatch),
            "per_record" => Ok(ExecutionMode::PerRecord),
            _ => Err(Error::Plan(format!(
                "execution_mode must be 'micro_batch' or 'per_record', got '{value}'"
            ))),
        }
    }
}

impl fmt::Display for ExecutionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecutionMode::MicroBatch => f.write_str("micro-batch"),
            ExecutionMode::PerRecord => f.write_str("per-record"),
        }
    }
}

/// Tasks in data-flow order; each runs a chain of fused operators.
pub type Stages = Vec<Stage>;

/// One task of a query, run as one instance or, when it starts with an
/// operator whose state is per key, as several instances that each own a
/// share of the keys.
pub struct Stage {
    /// One chain of fused operators per instance, all alike.
    pub instances: Vec<Vec<Box<dyn Operator>>>,
    /// What rows are routed to an instance by (the key of the operator the
    /// stage starts with): `None` for a stage that runs as one instance.
    pub keys: Option<Vec<Arc<dyn PhysicalExpr>>>,
    /// It keeps state over the rows of every key as one instance (an
    /// aggregate without keys, peers, an invariant, early results): what it
    /// computes needs every row of the stream, not one key's.
    pub global: bool,
    /// The rows its first operator takes, for a stage that starts at an
    /// operator keeping state (`None` for a chain of stateless ones).
    pub input: Option<SchemaRef>,
}

impl Stage {
    /// A stage of one instance.
    pub fn single(ops: Vec<Box<dyn Operator>>) -> Self {
        Self {
            instances: vec![ops],
            keys: None,
            global: false,
            input: None,
        }
    }

    /// The names of the columns its key reads: each key that is a column,
    /// by name, and each other one as its expression.
    pub fn key_names(&self) -> Vec<String> {
        self.keys
            .iter()
            .flatten()
            .map(|k| {
                (k.as_ref() as &dyn std::any::Any)
                    .downcast_ref::<datafusion::physical_expr::expressions::Column>()
                    .map_or_else(|| k.to_string(), |c| c.name().to_string())
            })
            .collect()
    }

    /// The operators of its first instance (every instance has the same).
    pub fn ops(&self) -> &[Box<dyn Operator>] {
        &self.instances[0]
    }

    /// Its first instance's operators, for running the stage as one.
    pub fn into_ops(self) -> Vec<Box<dyn Operator>> {
        self.instances.into_iter().next().unwrap_or_default()
    }
}

/// Where a query's inputs meet in a merge operator: as one instance, or,
/// for an operator whose state is per key (see
/// [`MergeOperator::input_keys`]), as several that each own a share of the
/// keys.
pub struct Merge {
    /// One operator per instance, all alike.
    pub instances: Vec<Box<dyn MergeOperator>>,
}

impl Merge {
    /// A merge of one instance.
    pub fn single(op: Box<dyn MergeOperator>) -> Self {
        Merge {
            instances: vec![op],
        }
    }

    /// Per input, what its rows are routed to an instance by; `None` for
    /// a merge that runs as one instance.
    pub fn keys(&self) -> Option<Vec<Vec<Arc<dyn PhysicalExpr>>>> {
        self.instances.first().and_then(|op| op.input_keys())
    }

    /// Its first instance's description (every instance has the same).
    pub fn describe(&self) -> String {
        self.instances
            .first()
            .map(|op| op.describe())
            .unwrap_or_default()
    }
}

/// A query rewritten for incremental execution: one or more streams, each
/// feeding a line of tasks; where there are several, their rows merge (with
/// the minimum of their watermarks) into the tasks that follow.
pub struct QueryGraph {
    /// The streams the query reads, each with the tasks before the merge.
    pub inputs: Vec<QueryInput>,
    /// How the inputs merge: `None` for a union, or a window join, control
    /// stream or batch query that takes each input's rows.
    pub join: Option<Merge>,
    /// Tasks after the inputs merge (every task when there is one input).
    pub stages: Stages,
    /// Schema of the result rows.
    pub schema: SchemaRef,
    /// The chosen execution mode.
    pub mode: ExecutionMode,
    /// Counters the operators update.
    pub stats: Arc<QueryStats>,
    /// Where each window operator sends its late rows, by stream.
    pub late_outputs: Vec<(String, Arc<LateRows>)>,
}

/// One stream a query reads and the tasks its rows pass before they meet
/// the other inputs.
pub struct QueryInput {
    /// The stream.
    pub stream: Arc<StreamDef>,
    /// Its own tasks.
    pub stages: Stages,
}

impl QueryGraph {
    /// Instances of its widest stage: the parallelism it was planned at
    /// (1 for a query with no key-partitioned stage).
    pub fn parallelism(&self) -> usize {
        self.inputs
            .iter()
            .flat_map(|i| &i.stages)
            .chain(&self.stages)
            .map(|s| s.instances.len())
            .chain(self.join.iter().map(|j| j.instances.len()))
            .max()
            .unwrap_or(1)
    }

    /// The first operator that keeps state over every key (see
    /// [`Stage::global`]), described; `None` when all state is per key.
    pub fn global_stage(&self) -> Option<String> {
        self.inputs
            .iter()
            .flat_map(|i| &i.stages)
            .chain(&self.stages)
            .find(|s| s.global)
            .and_then(|s| s.ops().first())
            .map(|op| op.describe())
    }
}

/// A query cut in two before one of its stages (see [`QueryGraph::split`]).
pub struct Split {
    /// The stages before.
    pub head: QueryGraph,
    /// The stages from the cut on.
    pub tail: Stages,
    /// The rows the head emits and the tail takes.
    pub boundary: SchemaRef,
}

impl QueryGraph {
    /// Where a query of one stream would be cut before its first stage
    /// over every key: that stage's index, or `None` when all its state is
    /// per key. An error says why it cannot be cut: it merges several
    /// streams, or its very first operator needs every key.
    pub fn global_split_point(&self) -> Result<Option<usize>> {
        let Some(operator) = self.global_stage() else {
            return Ok(None);
        };
        if self.inputs.len() != 1 || self.join.is_some() || !self.inputs[0].stages.is_empty() {
            return Err(Error::Plan(format!(
                "it keeps state over every key ({operator}) after merging several streams, which a group cannot split between its processes yet"
            )));
        }
        let at = self.stages.iter().position(|s| s.global);
        match at {
            Some(at) if at > 0 && self.stages[at].input.is_some() => Ok(Some(at)),
            _ => Err(Error::Plan(format!(
                "it keeps state over every key ({operator}) from its first operator on, so no part of it runs per partition"
            ))),
        }
    }

    /// Where a query of one stream would be cut to re-partition its rows
    /// by key, when its input is partitioned by the columns
    /// `partitioned_by` (none: not by any column): the index of its first
    /// key-partitioned stage whose key does not include them all, or
    /// `None` when every key does (the rows of each key are then in one
    /// partition already). An error says why it cannot be cut there: it
    /// merges several streams, keeps state over every key too, or keys
    /// its state afterwards by something the cut's key does not decide.
    pub fn repartition_point(&self, partitioned_by: &[String]) -> Result<Option<usize>> {
        let covered = |stage: &Stage| {
            let names = stage.key_names();
            !partitioned_by.is_empty() && partitioned_by.iter().all(|c| names.contains(c))
        };
        let uncovered =
            |stages: &Stages| stages.iter().position(|s| s.keys.is_some() && !covered(s));
        let merges = self.inputs.len() != 1 || self.join.is_some();
        if merges && self.inputs.iter().any(|i| uncovered(&i.stages).is_some()) {
            return Err(Error::Plan(
                "its rows must be re-partitioned by key before it merges several streams, which a group cannot do yet".into(),
            ));
        }
        let Some(at) = uncovered(&self.stages) else {
            return Ok(None);
        };
        let key = self.stages[at].key_names().join(", ");
        if merges || !self.inputs[0].stages.is_empty() {
            return Err(Error::Plan(format!(
                "its rows must be re-partitioned by {key} after it merges several streams, which a group cannot do yet"
            )));
        }
        if let Some(operator) = self.global_stage() {
            return Err(Error::Plan(format!(
                "its rows must be re-partitioned by {key} and it keeps state over every key ({operator}), which a group cannot do both of yet"
            )));
        }
        if at == 0 || self.stages[at].input.is_none() {
            return Err(Error::Plan(format!(
                "it keeps state by {key} from its first operator on, so no part of it runs per partition"
            )));
        }
        let names = self.stages[at].key_names();
        let rekeyed = self.stages[at + 1..]
            .iter()
            .filter(|s| s.keys.is_some())
            .find(|s| !names.iter().all(|n| s.key_names().contains(n)));
        if let Some(later) = rekeyed {
            return Err(Error::Plan(format!(
                "its rows would be re-partitioned by {key} and again by {}, which a group cannot do yet",
                later.key_names().join(", ")
            )));
        }
        Ok(Some(at))
    }

    /// Cuts the query before stage `at` (from
    /// [`QueryGraph::global_split_point`] or
    /// [`QueryGraph::repartition_point`]), which must know its input. The
    /// head keeps the query's input, counters and late rows; it emits the
    /// boundary rows.
    pub fn split(mut self, at: usize) -> Split {
        let tail = self.stages.split_off(at);
        let boundary = tail[0]
            .input
            .clone()
            .expect("a split point's stage knows its input");
        self.schema = boundary.clone();
        Split {
            head: self,
            tail,
            boundary,
        }
    }

    /// The tail of a split query, reading the head's rows and watermarks
    /// from `stream` (whose rows are [`crate::exec::remote::remote_schema`]
    /// of `boundary`): a [`RemoteInOp`](crate::exec::RemoteInOp) turns them
    /// back into messages ahead of the tail's first operator.
    pub fn remote_tail(
        stream: Arc<StreamDef>,
        boundary: SchemaRef,
        mut tail: Stages,
        schema: SchemaRef,
        mode: ExecutionMode,
    ) -> QueryGraph {
        let remote: Box<dyn Operator> = Box::new(crate::exec::RemoteInOp::new(boundary));
        match tail.first_mut() {
            // A global stage runs as one instance: its chain starts with
            // the turning back.
            Some(first) if first.keys.is_none() => first.instances[0].insert(0, remote),
            // A keyed one routes rows to its instances by key: they are
            // turned back before.
            _ => tail.insert(0, Stage::single(vec![remote])),
        }
        QueryGraph {
            inputs: vec![QueryInput {
                stream,
                stages: Vec::new(),
            }],
            join: None,
            stages: tail,
            schema,
            mode,
            stats: Arc::new(QueryStats::default()),
            late_outputs: Vec::new(),
        }
    }
}

impl fmt::Debug for QueryGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", explain::describe(self))
    }
}

impl QueryGraph {
    /// A readable description of the operator graph, for `EXPLAIN`.
    pub fn describe(&self) -> String {
        explain::describe(self)
    }

    /// How many of its stages are key-partitioned (whatever their
    /// instances).
    pub fn keyed_stages(&self) -> usize {
        self.inputs
            .iter()
            .flat_map(|i| &i.stages)
            .chain(&self.stages)
            .filter(|s| s.keys.is_some())
            .count()
    }
}

/// Plans `plan` for incremental execution in `mode`, with each
/// key-partitioned stage run as `parallelism` instances (at least 1, at
/// most [`crate::state::KEY_GROUPS`]).
pub fn plan_incremental(
    plan: &LogicalPlan,
    mode: ExecutionMode,
    parallelism: usize,
) -> Result<QueryGraph> {
    plan_incremental_shed(plan, mode, parallelism, None)
}

/// As [`plan_incremental`], with the query's input shed by `shed` (see
/// [`crate::exec::shed`]): a shed operator ahead of everything else and,
/// on a windowed aggregate's results, a `_shed_fraction` column.
pub fn plan_incremental_shed(
    plan: &LogicalPlan,
    mode: ExecutionMode,
    parallelism: usize,
    shed: Option<ShedConfig>,
) -> Result<QueryGraph> {
    let stats = Arc::new(QueryStats::default());
    let shed = shed.map(shed::ShedPlan::new);
    let mut builder = Builder::new(stats.clone(), Vec::new());
    builder.shed = shed.clone();
    let built = match builder.build(plan) {
        Ok(built) => built,
        // A query the streaming rules reject may still be a bounded
        // question, answered once its inputs end.
        Err(rejected @ Error::Unbounded { .. }) => {
            return batch::plan_batch(plan, mode, rejected);
        }
        Err(e) => return Err(e),
    };
    if built.window.is_some_and(|w| w.holds_panes()) {
        return Err(window_without_aggregate());
    }
    let mut built = built;
    let schema = match &shed {
        Some(shed) => builder.finish_shed(shed, plan, &mut built)?,
        None => Arc::new(plan.schema().as_arrow().clone()),
    };
    let mut graph = QueryGraph {
        inputs: Vec::new(),
        join: built.join.map(Merge::single),
        stages: fuse(built.ops),
        schema,
        mode,
        stats,
        late_outputs: builder.late_outputs.clone(),
    };
    graph.inputs = built
        .inputs
        .into_iter()
        .map(|(stream, ops)| QueryInput {
            stream,
            stages: fuse(ops),
        })
        .collect();
    let instances = parallelism.clamp(1, usize::from(crate::state::KEY_GROUPS));
    let keyed_merge = graph.join.as_ref().is_some_and(|j| j.keys().is_some());
    if instances > 1 && (graph.keyed_stages() > 0 || keyed_merge) {
        for _ in 1..instances {
            let mut again = Builder::new(graph.stats.clone(), builder.late_pool());
            again.shed = shed.as_ref().map(|s| s.for_build());
            add_instances(&mut graph, again.build(plan)?);
        }
    }
    if let Some(shed) = &shed {
        shed.set_readers(&graph);
    }
    Ok(graph)
}

/// Adds the keyed stages of `built`, another build of the same plan, to
/// `graph`'s as one more instance each.
fn add_instances(graph: &mut QueryGraph, built: Built) {
    let inputs = graph.inputs.iter_mut().zip(built.inputs);
    for (input, (_, ops)) in inputs {
        add_instance(&mut input.stages, fuse(ops));
    }
    if let (Some(merge), Some(again)) = (&mut graph.join, built.join)
        && again.input_keys().is_some()
    {
        merge.instances.push(again);
    }
    add_instance(&mut graph.stages, fuse(built.ops));
}

fn add_instance(stages: &mut Stages, again: Stages) {
    for (stage, other) in stages.iter_mut().zip(again) {
        if stage.keys.is_some() {
            stage.instances.push(other.into_ops());
        }
    }
}

/// Fuses operators into tasks: a new task starts at each operator that
/// keeps state, and at a serial one after a key-partitioned task.
fn fuse(ops: Ops) -> Stages {
    let mut stages: Stages = Vec::new();
    for (op, placement) in ops {
        let new_stage = match (&placement, stages.last()) {
            (_, None) => true,
            (Placement::Fused, Some(_)) => false,
            (Placement::Serial, Some(last)) => last.keys.is_some(),
            (Placement::Stage(..), Some(last)) => !last.ops().is_empty(),
        };
        if new_stage {
            stages.push(Stage::single(Vec::new()));
        }
        let stage = stages.last_mut().expect("just pushed");
        if let Placement::Stage(keys, input) = placement {
            stage.keys = keys.filter(|k| !k.is_empty());
            stage.global = stage.keys.is_none();
            stage.input = Some(input);
        }
        stage.instances[0].push(op);
    }
    stages
}

/// A plan schema as Arrow's.
fn arrow_schema(schema: &DFSchema) -> SchemaRef {
    Arc::new(schema.as_arrow().clone())
}

/// Column expressions for columns `indices` of `schema`.
fn columns(schema: &SchemaRef, indices: &[usize]) -> Vec<Arc<dyn PhysicalExpr>> {
    indices
        .iter()
        .map(|&i| {
            Arc::new(datafusion::physical_expr::expressions::Column::new(
                schema.field(i).name(),
                i,
            )) as Arc<dyn PhysicalExpr>
        })
        .collect()
}

/// The `PARTITION BY` of OVER functions that all partition alike, to route
/// their rows by; `None` (one instance) when they differ.
fn shared_partition(specs: &[OverSpec]) -> Option<Vec<Arc<dyn PhysicalExpr>>> {
    let text = |spec: &OverSpec| -> Vec<String> {
        spec.partition_by.iter().map(|e| e.to_string()).collect()
    };
    let first = specs.first()?;
    specs
        .iter()
        .all(|s| text(s) == text(first))
        .then(|| first.partition_by.clone())
}

/// Where an operator may run.
enum Placement {
    /// Anywhere: it keeps nothing between batches.
    Fused,
    /// In a task of one instance: what it does depends on every row before
    /// it (a watermark generator, a limit), but it needs no task of its own.
    Serial,
    /// At the start of a task of its own, since it keeps state: run as
    /// several instances routed by the key given, or as one (`None`); it
    /// takes rows of the schema given.
    Stage(Option<Vec<Arc<dyn PhysicalExpr>>>, SchemaRef),
}

/// Operators, each with where it may run.
type Ops = Vec<(Box<dyn Operator>, Placement)>;

/// The operators built so far for a subtree, bottom first.
struct Built {
    /// The streams read, each with the operators before the merge.
    inputs: Vec<(Arc<StreamDef>, Ops)>,
    /// How the inputs merge, when they are joined.
    join: Option<Box<dyn MergeOperator>>,
    /// Operators after the inputs merge.
    ops: Ops,
    /// Where the window columns are in the current schema, if any.
    window: Option<WindowColumns>,
    /// True when rows carry a `_shed_fraction` column after the plan's.
    shed_fraction: bool,
}

impl Built {
    /// The stream of a single-input subtree (where windows are assigned).
    fn stream(&self) -> &Arc<StreamDef> {
        &self.inputs[0].0
    }

    /// True for a union with nothing after its merge yet: stateless
    /// operators then go into each of its inputs, so that a window after
    /// them can too (see [`Builder::window`]).
    fn is_open_union(&self) -> bool {
        self.inputs.len() > 1 && self.join.is_none() && self.ops.is_empty()
    }

    /// Adds a stateless operator made by `make`: to each input of an open
    /// union, otherwise after what was built.
    fn push_fused(&mut self, make: impl Fn() -> Box<dyn Operator>) {
        if self.is_open_union() {
            for (_, ops) in &mut self.inputs {
                ops.push((make(), Placement::Fused));
            }
        } else {
            self.ops.push((make(), Placement::Fused));
        }
    }

    /// The largest allowed lateness of the streams read.
    fn lateness_ms(&self) -> i64 {
        self.inputs
            .iter()
            .map(|(s, _)| s.lateness_ms)
            .max()
            .unwrap_or(0)
    }
}

/// Where the window columns are in the current schema, and what they hold.
#[derive(Debug, Clone, Copy)]
struct WindowColumns {
    start: Option<usize>,
    end: Option<usize>,
    kind: Windowing,
}

/// How the rows' window columns become windows.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Windowing {
    /// Panes or exact windows on a fixed grid.
    Grid(WindowGrid),
    /// Each row's own session, merged per key by the aggregate.
    Session { gap_ms: i64 },
}

impl WindowColumns {
    /// True while the columns hold something other than the final windows
    /// (a hopping window's panes, a row's own session): nothing may read
    /// them until the aggregate turns them into windows.
    fn holds_panes(&self) -> bool {
        match self.kind {
            Windowing::Grid(WindowGrid::Panes(spec)) => !spec.is_tumbling(),
            Windowing::Grid(WindowGrid::Exact { .. }) => false,
            Windowing::Session { .. } => true,
        }
    }

    /// Where a row's window ends: its end column, or its start column and
    /// the windows' length; `None` for sessions, whose end no column holds.
    fn row_end(&self) -> Option<crate::exec::WindowEnd> {
        let end = |column, offset_ms| crate::exec::WindowEnd { column, offset_ms };
        match (self.end, self.start, self.kind) {
            (Some(column), _, _) => Some(end(column, 0)),
            (None, Some(column), Windowing::Grid(grid)) => Some(end(column, grid_size(grid))),
            _ => None,
        }
    }

    fn slot(&self, index: usize) -> Option<GroupSlot> {
        if Some(index) == self.start {
            Some(GroupSlot::WindowStart)
        } else if Some(index) == self.end {
            Some(GroupSlot::WindowEnd)
        } else {
            None
        }
    }

    /// Rejects an expression that reads pane columns as if they were windows.
    fn check_reads(&self, expr: &Expr, schema: &DFSchema) -> Result<()> {
        let reads_window = expr
            .column_refs()
            .iter()
            .any(|c| index_of(c, schema).and_then(|i| self.slot(i)).is_some());
        if self.holds_panes() && reads_window {
            return Err(unbounded(
                "window columns before the aggregate",
                format!(
                    "{expr} reads window_start/window_end of a HOP before the aggregate; use them in GROUP BY and after it"
                ),
            ));
        }
        Ok(())
    }
}

struct Builder {
    /// Late-row outputs of the window operators built, by stream.
    late_outputs: Vec<(String, Arc<LateRows>)>,
    /// Late-row outputs of an earlier build of the same plan, to share.
    late_pool: Vec<(String, Arc<LateRows>)>,
    /// The emit policy, until the outermost aggregate takes it.
    emit: Option<EmitPolicy>,
    stats: Arc<QueryStats>,
    props: ExecutionProps,
    planning: PhysicalPlanningContext,
    /// The query's shedding, if its input sheds.
    shed: Option<shed::ShedPlan>,
}

fn late_updates_unsupported(what: &str) -> Error {
    unbounded(
        "allowed lateness",
        format!("{what} over a stream with allowed_lateness is not supported yet"),
    )
}

fn window_without_aggregate() -> Error {
    unbounded(
        "window without aggregate",
        "HOP and SESSION windows are only known to an aggregate; use them with one that groups by window_start or window_end",
    )
}

fn unbounded(rule: &'static str, message: impl Into<String>) -> Error {
    Error::Unbounded {
        rule,
        message: message.into(),
    }
}

impl Builder {
    /// A builder whose operators count into `stats`; its window operators
    /// send late rows to `late_pool`'s receivers, in order, before any new
    /// one (so every build of one plan shares them).
    fn new(stats: Arc<QueryStats>, late_pool: Vec<(String, Arc<LateRows>)>) -> Self {
        Self {
            late_outputs: Vec::new(),
            late_pool,
            emit: None,
            stats,
            props: ExecutionProps::new(),
            planning: PhysicalPlanningContext::default(),
            shed: None,
        }
    }

    /// The late-row receivers this builder made or took from its pool.
    fn late_pool(&self) -> Vec<(String, Arc<LateRows>)> {
        self.late_outputs.clone()
    }

    /// Where the next window operator over `stream` sends its late rows.
    fn late_rows(&mut self, stream: &str) -> Arc<LateRows> {
        let next = self.late_outputs.len();
        let late = match self.late_pool.get(next) {
            Some((_, late)) => late.clone(),
            None => Arc::new(LateRows::default()),
        };
        self.late_outputs.push((stream.to_string(), late.clone()));
        late
    }

    fn build(&mut self, plan: &LogicalPlan) -> Result<Built> {
        match plan {
            LogicalPlan::TableScan(scan) => self.scan(scan),
            LogicalPlan::Extension(ext) => self.extension(ext.node.as_ref()),
            LogicalPlan::Filter(filter) => {
                let mut built = self.build(&filter.input)?;
                if let Some(window) = built.window {
                    window.check_reads(&filter.predicate, filter.input.schema())?;
                }
                let predicate = self.physical(&filter.predicate, filter.input.schema())?;
                built.push_fused(|| Box::new(FilterOp::new(predicate.clone())));
                Ok(built)
            }
            LogicalPlan::Projection(projection) => {
                let mut built = self.build(&projection.input)?;
                if let Some(window) = built.window {
                    for e in projection
                        .expr
                        .iter()
                        .filter(|e| column_index(e, projection.input.schema()).is_none())
                    {
                        window.check_reads(e, projection.input.schema())?;
                    }
                }
                let exprs = projection
                    .expr
                    .iter()
                    .map(|e| self.physical(e, projection.input.schema()))
                    .collect::<Result<Vec<_>>>()?;
                let (exprs, schema) = shed::carry(
                    built.shed_fraction,
                    exprs,
                    projection.input.schema().fields().len(),
                    projection.schema.as_arrow(),
                );
                let before = built.window;
                built.window = before
                    .and_then(|w| remap_window(w, &projection.expr, projection.input.schema()));
                if before.is_some_and(|w| w.holds_panes()) && built.window.is_none() {
                    return Err(window_without_aggregate());
                }
                built.push_fused(|| Box::new(ProjectOp::new(exprs.clone(), schema.clone())));
                Ok(built)
            }
            LogicalPlan::SubqueryAlias(alias) => self.build(&alias.input),
            LogicalPlan::Aggregate(aggregate) => self.aggregate(aggregate),
            LogicalPlan::Limit(limit) => self.limit(limit),
            LogicalPlan::Sort(_) => Err(unbounded(
                "ORDER BY",
                "ORDER BY over an unbounded stream would never produce a row; results come in event-time order of their windows",
            )),
            LogicalPlan::Join(join) => self.join(join),
            LogicalPlan::Union(union) => self.union(union),
            LogicalPlan::Window(window) => self.over(window),
            LogicalPlan::Unnest(unnest) => self.unnest(unnest),
            LogicalPlan::Distinct(_) => Err(unbounded(
                "unbounded aggregate",
                "DISTINCT over a stream never completes; group by a window instead",
            )),
            LogicalPlan::EmptyRelation(_) | LogicalPlan::Values(_) => Err(Error::Plan(
                "a continuous query must read from a stream (FROM stream or FROM TUMBLE(...))"
                    .into(),
            )),
            other => Err(Error::Plan(format!(
                "{} is not supported in a continuous query",
                other.display()
            ))),
        }
    }

    /// `UNNEST`: stateless, one row per list element. Where window columns
    /// or shed fractions ride along, only an unnest that keeps every
    /// column in its place (lists, no structs) is taken.
    fn unnest(&mut self, unnest: &datafusion::logical_expr::Unnest) -> Result<Built> {
        let mut built = self.build(&unnest.input)?;
        let input = unnest.input.schema();
        let in_place = unnest.struct_type_columns.is_empty()
            && unnest.schema.fields().len() == input.fields().len();
        if built.shed_fraction || (built.window.is_some() && !in_place) {
            return Err(Error::Plan(
                "UNNEST here is not supported: unnest a list column in a stateless query, \
                 or in a subquery before the window and aggregate"
                    .into(),
            ));
        }
        let lists = unnest
            .list_type_columns
            .iter()
            .map(|(index, list)| ListUnnest {
                index_in_input_schema: *index,
                depth: list.depth,
            })
            .collect();
        let op = UnnestOp::new(
            Arc::new(input.as_arrow().clone()),
            lists,
            unnest.struct_type_columns.clone(),
            Arc::new(unnest.schema.as_arrow().clone()),
            unnest.options.clone(),
        );
        built.ops.push((Box::new(op), Placement::Fused));
        Ok(built)
    }

    fn scan(&mut self, scan: &datafusion::logical_expr::TableScan) -> Result<Built> {
        let Some(source) = scan.source.as_ref().downcast_ref::<StreamSource>() else {
            return Err(Error::Plan(format!(
                "'{}' is not a stream",
                scan.table_name
            )));
        };
        let mut built = Built {
            inputs: vec![(source.def.clone(), Vec::new())],
            join: None,
            ops: Vec::new(),
            window: None,
            shed_fraction: false,
        };
        if let Some(columns) = &scan.projection {
            let schema = Arc::new(scan.projected_schema.as_arrow().clone());
            let input = source.def.schema.clone();
            let exprs = columns
                .iter()
                .map(|&i| {
                    Arc::new(datafusion::physical_expr::expressions::Column::new(
                        input.field(i).name(),
                        i,
                    )) as Arc<dyn PhysicalExpr>
                })
                .collect();
            built
                .ops
                .push((Box::new(ProjectOp::new(exprs, schema)), Placement::Fused));
        }
        Ok(built)
    }

    fn extension(&mut self, node: &dyn UserDefinedLogicalNode) -> Result<Built> {
        if let Some(emit) = node.as_any().downcast_ref::<EmitNode>() {
            self.emit = Some(emit.policy);
            let mut built = self.build(&emit.input)?;
            if matches!(self.emit.take(), Some(EmitPolicy::Every { .. })) {
                return Err(unbounded(
                    "EMIT EVERY",
                    "EMIT EVERY needs a windowed aggregate: a query without one has no partial results",
                ));
            }
            if emit.policy.marker().is_some() {
                if let Some(shed) = self.shed.as_ref().filter(|_| built.shed_fraction) {
                    shed.mark();
                }
                let schema = shed::before_last(built.shed_fraction, node.schema().as_arrow());
                built
                    .ops
                    .push((Box::new(MarkOp::new(emit.policy, schema)), Placement::Fused));
            }
            return Ok(built);
        }
        if let Some(alert) = node.as_any().downcast_ref::<AlertNode>() {
            let mut built = self.build(&alert.input)?;
            let mut input = Arc::new(alert.input.schema().as_arrow().clone());
            let mut output = Arc::new(node.schema().as_arrow().clone());
            let approximate = built.shed_fraction.then_some(input.fields().len());
            if let (Some(plan), true) = (&self.shed, built.shed_fraction) {
                input = shed::with_fraction(&input);
                output = shed::with_approximate(&output);
                plan.alert();
                built.shed_fraction = false;
            }
            let keys = columns(&input, &alert.spec.keys);
            let mut op = AlertOp::try_new(alert.spec.clone(), input.clone(), output)?;
            if let Some(fraction) = approximate {
                op = op.with_approximate(fraction, self.stats.clone());
            }
            built
                .ops
                .push((Box::new(op), Placement::Stage(Some(keys), input)));
            built.window = None;
            return Ok(built);
        }
        if let Some(invariant) = node.as_any().downcast_ref::<InvariantNode>() {
            let mut built = self.build(&invariant.input)?;
            shed::refuse(&built, "CREATE INVARIANT")?;
            let input = Arc::new(invariant.input.schema().as_arrow().clone());
            let output = Arc::new(node.schema().as_arrow().clone());
            let op = InvariantOp::try_new(invariant.spec.clone(), input.clone(), output)?;
            // One instance: its training period starts at the first row of
            // any key.
            built
                .ops
                .push((Box::new(op), Placement::Stage(None, input)));
            return Ok(built);
        }
        if let Some(watermark) = node.as_any().downcast_ref::<WatermarkNode>() {
            let mut built = self.build(&watermark.input)?;
            let op = WatermarkOp::new(watermark.time_column, watermark.delay_ms);
            built.ops.push((Box::new(op), Placement::Serial));
            return Ok(built);
        }
        if let Some(control) = node.as_any().downcast_ref::<ControlNode>() {
            return self.control(control);
        }
        if let Some(window) = node.as_any().downcast_ref::<WindowNode>() {
            return self.window(window);
        }
        Err(Error::Plan(format!("unknown plan node {}", node.name())))
    }

    fn aggregate(&mut self, aggregate: &Aggregate) -> Result<Built> {
        // The emit policy belongs to the outermost aggregate only.
        let policy = self.emit.take();
        let mut built = self.build(&aggregate.input)?;
        shed::refuse(&built, "an aggregate over windowed results")?;
        let input_schema = aggregate.input.schema();
        if policy == Some(EmitPolicy::Changes) {
            return self.changelog_aggregate(aggregate, built);
        }
        let Some(window) = built.window else {
            return Err(unbounded(
                "unbounded aggregate",
                "an aggregate over a stream needs a window (FROM TUMBLE(stream, ts, INTERVAL '1' MINUTE) ... GROUP BY window_start, window_end, ...) or EMIT CHANGES",
            ));
        };
        let early_every = match policy {
            Some(EmitPolicy::Every { interval_ms }) => {
                if matches!(window.kind, Windowing::Session { .. }) {
                    return Err(unbounded(
                        "EMIT EVERY",
                        "EMIT EVERY over SESSION windows is not supported yet",
                    ));
                }
                Some(Duration::from_millis(interval_ms as u64))
            }
            _ => None,
        };
        let mut layout = Vec::with_capacity(aggregate.group_expr.len());
        let mut keys = Vec::new();
        let mut key_fields = Vec::new();
        let mut window_input = None;
        let mut key_exprs = Vec::new();
        let output = aggregate.schema.as_arrow();
        for (i, expr) in aggregate.group_expr.iter().enumerate() {
            let slot = column_index(expr, input_schema).and_then(|c| window.slot(c));
            match slot {
                Some(slot) => {
                    if window_input.is_none() {
                        window_input = Some(WindowInput {
                            expr: self.physical(expr, input_schema)?,
                            is_end: slot == GroupSlot::WindowEnd,
                        });
                    }
                    layout.push(slot);
                }
                None => {
                    window.check_reads(expr, input_schema)?;
                    layout.push(GroupSlot::Key(keys.len()));
                    key_exprs.push((i, expr));
                    keys.push(self.physical(expr, input_schema)?);
                    key_fields.push(output.field(i).clone());
                }
            }
        }
        let Some(window_input) = window_input else {
            return Err(unbounded(
                "unbounded aggregate",
                "a windowed aggregate must GROUP BY window_start or window_end",
            ));
        };
        for e in &aggregate.aggr_expr {
            window.check_reads(e, input_schema)?;
        }
        let aggregates = self.lower_aggregates(aggregate)?;
        let key_schema = Arc::new(Schema::new(key_fields));
        let mut schema = Arc::new(output.clone());
        let grid = match window.kind {
            Windowing::Grid(grid) => grid,
            Windowing::Session { gap_ms } => {
                let start = window.start.ok_or_else(|| {
                    Error::Plan("SESSION's window_start is not available to the aggregate".into())
                })?;
                let placement = Placement::Stage(Some(keys.clone()), arrow_schema(input_schema));
                let op = SessionAggregateOp::new(SessionAggregateSpec {
                    keys,
                    key_schema,
                    layout,
                    start: Arc::new(datafusion::physical_expr::expressions::Column::new(
                        input_schema.field(start).name(),
                        start,
                    )),
                    gap_ms,
                    lateness_ms: built.lateness_ms(),
                    aggregates,
                    schema,
                })?;
                built.ops.push((Box::new(op), placement));
                // Sessions differ in length: their results are not windows
                // a later aggregate could group again.
                built.window = None;
                return Ok(built);
            }
        };
        let size_ms = match grid {
            WindowGrid::Panes(spec) => spec.size_ms(),
            WindowGrid::Exact { size_ms } => size_ms,
        };
        let lateness_ms = match grid {
            WindowGrid::Panes(_) => built.lateness_ms(),
            WindowGrid::Exact { .. } => 0,
        };
        if matches!(grid, WindowGrid::Exact { .. }) && built.lateness_ms() > 0 {
            return Err(late_updates_unsupported("grouping window results again"));
        }
        built.window = Some(WindowColumns {
            start: layout.iter().position(|s| *s == GroupSlot::WindowStart),
            end: layout.iter().position(|s| *s == GroupSlot::WindowEnd),
            kind: Windowing::Grid(WindowGrid::Exact { size_ms }),
        });
        // Early results come on processing-time ticks, which no epoch of
        // the input orders: such an aggregate runs as one instance, so they
        // are handed on as they come.
        let placement = match early_every {
            Some(_) => Placement::Stage(None, arrow_schema(input_schema)),
            None => Placement::Stage(Some(keys.clone()), arrow_schema(input_schema)),
        };
        let shed = match (&self.shed, grid) {
            (Some(plan), WindowGrid::Panes(spec)) if !plan.placed() => {
                let keyed = early_every.is_none() && !keys.is_empty();
                let output = plan.place(self, &mut built, aggregate, spec, &key_exprs, keyed)?;
                schema = shed::with_fraction(&schema);
                built.shed_fraction = true;
                Some(output)
            }
            _ => None,
        };
        let op = WindowAggregateOp::new(WindowAggregateSpec {
            keys,
            key_schema,
            layout,
            window: window_input,
            grid,
            aggregates,
            schema,
            early_every,
            lateness_ms,
            shed,
        });
        built.ops.push((Box::new(op), placement));
        Ok(built)
    }

    fn lower_aggregates(&self, aggregate: &Aggregate) -> Result<Vec<AggregateSpec>> {
        let input_schema = aggregate.input.schema();
        let physical_input = input_schema.as_arrow();
        aggregate
            .aggr_expr
            .iter()
            .map(|e| {
                let lowered = LoweredAggregateBuilder::new(
                    e,
                    input_schema,
                    physical_input,
                    &self.props,
                    &self.planning,
                )
                .build()?;
                Ok(AggregateSpec {
                    function: lowered.aggregate,
                    filter: lowered.filter,
                })
            })
            .collect()
    }

    /// `EMIT CHANGES`: a changelog of results, with or without a window.
    fn changelog_aggregate(&mut self, aggregate: &Aggregate, mut built: Built) -> Result<Built> {
        let input_schema = aggregate.input.schema();
        let window_end =
            match built.window {
                None => None,
                Some(w) if w.holds_panes() => {
                    return Err(unbounded(
                        "EMIT CHANGES",
                        "EMIT CHANGES over HOP or SESSION windows is not supported yet; use TUMBLE",
                    ));
                }
                Some(w) => {
                    let size_ms = match w.kind {
                        Windowing::Grid(WindowGrid::Panes(spec)) => spec.size_ms(),
                        Windowing::Grid(WindowGrid::Exact { size_ms }) => size_ms,
                        Windowing::Session { .. } => unreachable!("sessions hold panes"),
                    };
                    let found = aggregate.group_expr.iter().enumerate().find_map(|(i, e)| {
                        match column_index(e, input_schema).and_then(|c| w.slot(c)) {
                            Some(GroupSlot::WindowStart) => Some((i, size_ms)),
                            Some(GroupSlot::WindowEnd) => Some((i, 0)),
                            _ => None,
                        }
                    });
                    Some(found.ok_or_else(|| {
                        unbounded(
                            "unbounded aggregate",
                            "a windowed aggregate must GROUP BY window_start or window_end",
                        )
                    })?)
                }
            };
        let groups = aggregate
            .group_expr
            .iter()
            .map(|e| self.physical(e, input_schema))
            .collect::<Result<Vec<_>>>()?;
        let output = aggregate.schema.as_arrow();
        let group_schema = Arc::new(Schema::new(output.fields()[..groups.len()].to_vec()));
        let placement = Placement::Stage(Some(groups.clone()), arrow_schema(input_schema));
        let op = ChangelogAggregateOp::new(ChangelogAggregateSpec {
            groups,
            group_schema,
            window_end,
            lateness_ms: built.lateness_ms(),
            aggregates: self.lower_aggregates(aggregate)?,
            schema: Arc::new(output.clone()),
        });
        built.ops.push((Box::new(op), placement));
        built.window = None;
        Ok(built)
    }

    /// `OVER (...)` functions over a stream of window results, ordered by
    /// window.
    fn over(&mut self, window: &datafusion::logical_expr::Window) -> Result<Built> {
        let built = self.build(&window.input)?;
        shed::refuse(&built, "OVER (...)")?;
        let input = window.input.schema();
        let windows = built
            .window
            .filter(|w| !w.holds_panes())
            .ok_or_else(|| {
                unbounded(
                    "window function",
                    "OVER (...) needs a stream of window results, ordered by window_start or window_end: apply it to a windowed aggregate",
                )
            })?;
        if built.lateness_ms() > 0 {
            return Err(late_updates_unsupported("OVER (...)"));
        }
        if self.over_peers(window, windows)? {
            let mut built = built;
            // Peers are the rows of one window, of every key: one instance.
            let end = windows.row_end().ok_or_else(|| {
                unbounded(
                    "window function",
                    "OVER (PARTITION BY window ...) needs windows of a fixed length or a window_end column",
                )
            })?;
            let op = peer::peer_op(window, end)?;
            built
                .ops
                .push((Box::new(op), Placement::Stage(None, arrow_schema(input))));
            return Ok(built);
        }
        let specs = window
            .window_expr
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let field = window.schema.field(input.fields().len() + i);
                self.over_spec(e, input, windows, field.data_type().clone())
            })
            .collect::<Result<Vec<_>>>()?;
        let schema = Arc::new(window.schema.as_arrow().clone());
        let placement = Placement::Stage(shared_partition(&specs), arrow_schema(input));
        let mut built = built;
        built
            .ops
            .push((Box::new(OverOp::new(specs, schema)?), placement));
        Ok(built)
    }

    /// True if the window functions compare the rows of one window (they
    /// partition by a window column); an error if only some do.
    fn over_peers(
        &self,
        window: &datafusion::logical_expr::Window,
        windows: WindowColumns,
    ) -> Result<bool> {
        let input = window.input.schema();
        let peers: Vec<bool> = window
            .window_expr
            .iter()
            .map(|e| match e.clone().unalias() {
                Expr::WindowFunction(f) => f.params.partition_by.iter().any(|p| {
                    column_index(p, input)
                        .and_then(|i| windows.slot(i))
                        .is_some()
                }),
                _ => false,
            })
            .collect();
        for expr in &window.window_expr {
            crate::functions::check_window_call(expr)?;
        }
        if peers.iter().all(|p| *p) {
            return Ok(true);
        }
        if peers.iter().any(|p| *p) {
            return Err(unbounded(
                "window function",
                "a query mixes window functions over peers (PARTITION BY window_end) with ones over a key's history; compute one kind in a view and the other over it",
            ));
        }
        Ok(false)
    }

    fn over_spec(
        &self,
        expr: &Expr,
        input: &DFSchema,
        windows: WindowColumns,
        data_type: datafusion::arrow::datatypes::DataType,
    ) -> Result<OverSpec> {
        let expr = match expr {
            Expr::Alias(alias) => alias.expr.as_ref(),
            other => other,
        };
        let Expr::WindowFunction(function) = expr else {
            return Err(Error::Plan(format!("unsupported window expression {expr}")));
        };
        let params = &function.params;
        let ordered_by_window = matches!(params.order_by.as_slice(),
            [sort] if sort.asc && column_index(&sort.expr, input).and_then(|i| windows.slot(i)).is_some());
        if !ordered_by_window {
            return Err(unbounded(
                "window function",
                format!(
                    "{expr} must be ORDER BY window_start or window_end (ascending): window results arrive in that order"
                ),
            ));
        }
        let partition_by = params
            .partition_by
            .iter()
            .map(|e| self.physical(e, input))
            .collect::<Result<Vec<_>>>()?;
        let function = match &function.fun {
            WindowFunctionDefinition::WindowUDF(udf) => match udf.name() {
                "lag" => self.lag(&params.args, input, &data_type)?,
                "row_number" => OverFunction::RowNumber,
                other => {
                    return Err(unbounded(
                        "window function",
                        format!(
                            "{other}() over a stream is not supported; use lag, row_number or an aggregate"
                        ),
                    ));
                }
            },
            WindowFunctionDefinition::AggregateUDF(udaf) => {
                let args = params
                    .args
                    .iter()
                    .map(|e| self.physical(e, input))
                    .collect::<Result<Vec<_>>>()?;
                let aggregate = AggregateExprBuilder::new(udaf.clone(), args)
                    .schema(Arc::new(input.as_arrow().clone()))
                    .alias(expr.schema_name().to_string())
                    .build()?;
                OverFunction::Aggregate {
                    function: Arc::new(aggregate),
                    preceding: rows_preceding(&params.window_frame)?,
                }
            }
        };
        Ok(OverSpec {
            partition_by,
            function,
            data_type,
        })
    }

    fn lag(
        &self,
        args: &[Expr],
        input: &DFSchema,
        data_type: &datafusion::arrow::datatypes::DataType,
    ) -> Result<OverFunction> {
        let Some(arg) = args.first() else {
            return Err(Error::Plan("lag needs an argument".into()));
        };
        let offset = match args.get(1) {
            None => 1,
            Some(Expr::Literal(value, _)) => value
                .cast_to(&datafusion::arrow::datatypes::DataType::UInt64)
                .ok()
                .and_then(|v| match v {
                    ScalarValue::UInt64(Some(n)) => Some(n as usize),
                    _ => None,
                })
                .ok_or_else(|| {
                    Error::Plan(format!(
                        "lag offset must be a non-negative integer, got {value}"
                    ))
                })?,
            Some(other) => {
                return Err(Error::Plan(format!(
                    "lag offset must be a constant, got {other}"
                )));
            }
        };
        let default = match args.get(2) {
            None => ScalarValue::try_from(data_type)?,
            Some(Expr::Literal(value, _)) => value.cast_to(data_type)?,
            Some(other) => {
                return Err(Error::Plan(format!(
                    "lag default must be a constant, got {other}"
                )));
            }
        };
        Ok(OverFunction::Lag {
            arg: self.physical(arg, input)?,
            offset,
            default,
        })
    }

    /// A window's assignment: after its input, or, over a union, in each
    /// of the union's inputs, so that each stream's rows are judged by its
    /// own clock and the merge takes the least of the inputs' watermarks
    /// (a clock after the merge would run at the fastest input's pace and
    /// drop the others' rows as late).
    fn window(&mut self, window: &WindowNode) -> Result<Built> {
        let mut built = self.build(&window.input)?;
        // Over a stream, the watermark's delay and the stream's lateness;
        // over window results (a view), neither: they come in order.
        let over_stream = matches!(&window.input, LogicalPlan::Extension(e)
            if e.node.as_any().downcast_ref::<WatermarkNode>().is_some());
        let of_results = built.window.is_some();
        let clock = |stream: &StreamDef| match (over_stream, of_results) {
            (true, _) => (stream.delay_ms, stream.lateness_ms),
            (false, true) => (0, 0),
            (false, false) => (stream.delay_ms, 0),
        };
        let kind = match window.window {
            Window::Aligned(spec) => Windowing::Grid(WindowGrid::Panes(spec)),
            Window::Session { gap_ms } => Windowing::Session { gap_ms },
        };
        if built.is_open_union() {
            for (stream, ops) in &mut built.inputs {
                let (delay, lateness) = clock(stream);
                let late_rows = self.late_rows(&stream.name);
                ops.push((
                    self.assign(window, delay, lateness, late_rows),
                    Placement::Serial,
                ));
            }
        } else {
            let (delay, lateness) = clock(built.stream());
            let late_rows = self.late_rows(&built.stream().name.clone());
            let op = self.assign(window, delay, lateness, late_rows);
            built.ops.push((op, Placement::Serial));
        }
        let start = window.window_start_index();
        built.window = Some(WindowColumns {
            start: Some(start),
            end: Some(start + 1),
            kind,
        });
        Ok(built)
    }

    /// The operator that gives rows their window (or pane, or session).
    fn assign(
        &self,
        window: &WindowNode,
        delay: i64,
        lateness: i64,
        late_rows: Arc<LateRows>,
    ) -> Box<dyn Operator> {
        let schema = Arc::new(UserDefinedLogicalNode::schema(window).as_arrow().clone());
        let (time, stats) = (window.time_column, self.stats.clone());
        match window.window {
            Window::Aligned(spec) => Box::new(WindowAssignOp::new(
                time, spec, delay, lateness, schema, stats, late_rows,
            )),
            Window::Session { gap_ms } => Box::new(SessionAssignOp::new(
                time, gap_ms, delay, lateness, schema, stats, late_rows,
            )),
        }
    }

    /// `UNION ALL` of streams: each input keeps its own operators, and the
    /// rows meet in a merge that forwards the minimum of their watermarks.
    fn union(&mut self, union: &datafusion::logical_expr::Union) -> Result<Built> {
        let mut inputs = Vec::new();
        let mut windows = Vec::new();
        for input in &union.inputs {
            let built = self.build(input)?;
            if built.lateness_ms() > 0 {
                return Err(late_updates_unsupported("UNION ALL"));
            }
            if built.join.is_some() {
                return Err(unbounded("union", "a UNION ALL of a join is not supported"));
            }
            windows.push(built.window);
            if built.inputs.len() == 1 {
                let (stream, mut ops) = built.inputs.into_iter().next().expect("one input");
                ops.extend(built.ops);
                inputs.push((stream, ops));
            } else if built.ops.is_empty() {
                inputs.extend(built.inputs);
            } else {
                return Err(unbounded(
                    "union",
                    "a UNION ALL whose input is itself a UNION ALL with operators after it is not supported",
                ));
            }
        }
        // The union is windowed when every input carries the same windows in
        // the same columns.
        let window = windows[0].filter(|first| {
            windows.iter().all(|w| {
                w.is_some_and(|w| {
                    w.start == first.start && w.end == first.end && w.kind == first.kind
                })
            })
        });
        Ok(Built {
            inputs,
            join: None,
            ops: Vec::new(),
            window,
            shed_fraction: false,
        })
    }

    /// `CONTROLLED(...)`: the data and the control stream meet in a
    /// [`ControlFilter`], each read with its own watermark.
    fn control(&mut self, control: &ControlNode) -> Result<Built> {
        let mut inputs = Vec::with_capacity(2);
        let sides = [
            (&control.data, control.data_time),
            (&control.control, control.control_time),
        ];
        for (side, time) in sides {
            let built = self.build(side)?;
            if built.inputs.len() != 1 || built.join.is_some() {
                return Err(Error::Plan("CONTROLLED reads two declared streams".into()));
            }
            let (stream, mut ops) = built.inputs.into_iter().next().expect("one input");
            ops.extend(built.ops);
            // A plain view of a stream has no clock of its own: without one
            // its rows would wait for the end of input.
            if !has_clock(side) {
                let clock = WatermarkOp::new(time, stream.delay_ms);
                ops.push((Box::new(clock), Placement::Serial));
            }
            inputs.push((stream, ops));
        }
        let schema = |plan: &LogicalPlan| Arc::new(plan.schema().as_arrow().clone());
        let mode = match &control.kind {
            ControlKind::Block {
                data_key,
                action,
                until,
            } => ControlMode::Block {
                data_key: *data_key,
                action: *action,
                until: *until,
            },
            ControlKind::Params { params, value } => ControlMode::Params {
                params: params
                    .iter()
                    .map(|(name, default)| match default {
                        ScalarValue::Float64(Some(v)) => Ok((name.clone(), *v)),
                        other => Err(Error::Plan(format!(
                            "parameter '{name}': its default {other} is not a DOUBLE"
                        ))),
                    })
                    .collect::<Result<_>>()?,
                value: *value,
            },
        };
        let spec = ControlSpec {
            data_schema: schema(&control.data),
            data_time: control.data_time,
            control_schema: schema(&control.control),
            control_time: control.control_time,
            control_key: control.control_key,
            mode,
            output_schema: Arc::new(control.schema().as_arrow().clone()),
        };
        Ok(Built {
            inputs,
            join: Some(Box::new(ControlFilter::new(spec))),
            ops: Vec::new(),
            window: None,
            shed_fraction: false,
        })
    }

    /// An inner join of two windowed streams on key and window.
    fn join(&mut self, join: &datafusion::logical_expr::Join) -> Result<Built> {
        let not_windowed = || {
            unbounded(
                "join",
                "a join of streams must be an inner join of windowed inputs on their keys and the same window (e.g. ON a.host = b.host AND a.window_start = b.window_start)",
            )
        };
        if join.join_type != JoinType::Inner {
            return Err(not_windowed());
        }
        let left = self.build(&join.left)?;
        let right = self.build(&join.right)?;
        let mut windows = Vec::new();
        let mut inputs = Vec::new();
        for side in [left, right] {
            let window = side
                .window
                .filter(|w| !w.holds_panes())
                .ok_or_else(not_windowed)?;
            if side.inputs.len() != 1 || side.join.is_some() || side.lateness_ms() > 0 {
                return Err(unbounded(
                    "join",
                    "each side of a join must read one stream, without allowed lateness",
                ));
            }
            let (stream, mut ops) = side.inputs.into_iter().next().expect("one input");
            ops.extend(side.ops);
            inputs.push((stream, ops));
            windows.push(window);
        }
        let (lw, rw) = (windows[0], windows[1]);
        let size_ms = match (lw.kind, rw.kind) {
            (Windowing::Grid(l), Windowing::Grid(r)) if grid_size(l) == grid_size(r) => {
                grid_size(l)
            }
            _ => return Err(not_windowed()),
        };
        let (left_schema, right_schema) = (join.left.schema(), join.right.schema());
        let mut pairs: Vec<(Expr, Expr)> = join.on.clone();
        let mut residual = Vec::new();
        if let Some(filter) = &join.filter {
            for conjunct in split_conjunction(filter) {
                match equi_pair(conjunct, left_schema, right_schema) {
                    Some(pair) => pairs.push(pair),
                    None => residual.push(conjunct.clone()),
                }
            }
        }
        let same_window = pairs.iter().any(|(l, r)| {
            let l = column_index(l, left_schema).and_then(|i| lw.slot(i));
            let r = column_index(r, right_schema).and_then(|i| rw.slot(i));
            l.is_some() && l == r
        });
        if !same_window {
            return Err(not_windowed());
        }
        let window_end = |w: WindowColumns| match (w.end, w.start) {
            (Some(end), _) => Ok((end, 0)),
            (None, Some(start)) => Ok((start, size_ms)),
            _ => Err(not_windowed()),
        };
        let spec = WindowJoinSpec {
            left_keys: pairs
                .iter()
                .map(|(l, _)| self.physical(l, left_schema))
                .collect::<Result<_>>()?,
            right_keys: pairs
                .iter()
                .map(|(_, r)| self.physical(r, right_schema))
                .collect::<Result<_>>()?,
            left_window_end: window_end(lw)?,
            right_window_end: window_end(rw)?,
            filter: conjunction(residual)
                .map(|f| self.physical(&f, &join.schema))
                .transpose()?,
            left_schema: Arc::new(left_schema.as_arrow().clone()),
            right_schema: Arc::new(right_schema.as_arrow().clone()),
            schema: Arc::new(join.schema.as_arrow().clone()),
        };
        Ok(Built {
            inputs,
            join: Some(Box::new(WindowJoin::new(spec)?)),
            ops: Vec::new(),
            window: Some(WindowColumns {
                start: lw.start,
                end: lw.end,
                kind: Windowing::Grid(WindowGrid::Exact { size_ms }),
            }),
            shed_fraction: false,
        })
    }

    fn limit(&mut self, limit: &Limit) -> Result<Built> {
        let mut built = self.build(&limit.input)?;
        let skip = match limit.get_skip_type()? {
            SkipType::Literal(n) => n,
            SkipType::UnsupportedExpr => {
                return Err(Error::Plan("OFFSET must be a constant".into()));
            }
        };
        let fetch = match limit.get_fetch_type()? {
            FetchType::Literal(Some(n)) => n,
            FetchType::Literal(None) => usize::MAX,
            FetchType::UnsupportedExpr => {
                return Err(Error::Plan("LIMIT must be a constant".into()));
            }
        };
        built
            .ops
            .push((Box::new(LimitOp::new(skip, fetch)), Placement::Serial));
        Ok(built)
    }

    fn physical(&self, expr: &Expr, schema: &DFSchema) -> Result<Arc<dyn PhysicalExpr>> {
        Ok(create_physical_expr(
            expr,
            schema,
            &self.props,
            &self.planning,
        )?)
    }
}

/// True when `plan` makes watermarks of its own: it reads a stream through
/// a watermark or a window.
fn has_clock(plan: &LogicalPlan) -> bool {
    plan.exists(|node| {
        Ok(matches!(node, LogicalPlan::Extension(e)
            if e.node.as_any().is::<WatermarkNode>() || e.node.as_any().is::<WindowNode>()))
    })
    .unwrap_or(false)
}

fn column_index(expr: &Expr, schema: &DFSchema) -> Option<usize> {
    match expr {
        Expr::Column(column) => index_of(column, schema),
        Expr::Alias(alias) => column_index(&alias.expr, schema),
        _ => None,
    }
}

fn index_of(column: &Column, schema: &DFSchema) -> Option<usize> {
    schema.index_of_column(column).ok()
}

/// Rows before the current one in a frame ending at the current row:
/// `Some(n)` for `ROWS n PRECEDING`, `None` for everything so far.
fn rows_preceding(frame: &WindowFrame) -> Result<Option<usize>> {
    let unsupported = || {
        unbounded(
            "window frame",
            format!(
                "frame {frame} over a stream is not supported; use ROWS BETWEEN n PRECEDING AND CURRENT ROW or UNBOUNDED PRECEDING"
            ),
        )
    };
    if !matches!(frame.end_bound, WindowFrameBound::CurrentRow) {
        return Err(unsupported());
    }
    match (&frame.units, &frame.start_bound) {
        (_, WindowFrameBound::Preceding(n)) if n.is_null() => Ok(None),
        (WindowFrameUnits::Rows, WindowFrameBound::Preceding(n)) => {
            match n.cast_to(&datafusion::arrow::datatypes::DataType::UInt64)? {
                ScalarValue::UInt64(Some(n)) => Ok(Some(n as usize)),
                _ => Err(unsupported()),
            }
        }
        (WindowFrameUnits::Rows, WindowFrameBound::CurrentRow) => Ok(Some(0)),
        _ => Err(unsupported()),
    }
}

fn grid_size(grid: WindowGrid) -> i64 {
    match grid {
        WindowGrid::Panes(spec) => spec.size_ms(),
        WindowGrid::Exact { size_ms } => size_ms,
    }
}

/// `l = r` with `l` over the left input and `r` over the right (either
/// way round), as a (left, right) pair.
fn equi_pair(expr: &Expr, left: &DFSchema, right: &DFSchema) -> Option<(Expr, Expr)> {
    let Expr::BinaryExpr(binary) = expr else {
        return None;
    };
    if binary.op != datafusion::logical_expr::Operator::Eq {
        return None;
    }
    let over = |e: &Expr, schema: &DFSchema| {
        let columns = e.column_refs();
        !columns.is_empty() && columns.iter().all(|c| schema.has_column(c))
    };
    let (a, b) = (binary.left.as_ref(), binary.right.as_ref());
    if over(a, left) && over(b, right) {
        Some((a.clone(), b.clone()))
    } else if over(b, left) && over(a, right) {
        Some((b.clone(), a.clone()))
    } else {
        None
    }
}

/// Follows the window columns through a projection that passes them on.
fn remap_window(window: WindowColumns, exprs: &[Expr], input: &DFSchema) -> Option<WindowColumns> {
    let position = |target: Option<usize>| {
        target.and_then(|t| exprs.iter().position(|e| column_index(e, input) == Some(t)))
    };
    let remapped = WindowColumns {
        start: position(window.start),
        end: position(window.end),
        kind: window.kind,
    };
    (remapped.start.is_some() || remapped.end.is_some()).then_some(remapped)
}
