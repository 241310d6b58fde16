//! The incremental planner: rewrites a logical plan into a graph of
//! streaming operators.
//!
//! It walks the plan from its stream scan upwards, turns each node into an
//! operator, fuses chains of stateless operators into one task, starts a new
//! task at each stateful operator, and rejects what cannot run on an
//! unbounded stream with an error naming the rule.

mod aggregate;
mod batch;
pub use batch::never_ends;
mod control;
mod explain;
mod graph;
pub use graph::{Merge, QueryGraph, QueryInput, Split, Stage, Stages};
mod join;
mod over;
mod peer;
mod shed;
mod window;
use window::{grid_size, remap_window};

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
