//! The incremental planner: rewrites a logical plan into a graph of
//! streaming operators.
//!
//! It walks the plan from its stream scan upwards, turns each node into an
//! operator, fuses chains of stateless operators into one task, starts a new
//! task at each stateful operator, and rejects what cannot run on an
//! unbounded stream with an error naming the rule.

mod explain;

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::{Column, DFSchema};
use datafusion::execution::context::ExecutionProps;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{
    Aggregate, Expr, FetchType, Limit, LogicalPlan, SkipType, UserDefinedLogicalNode,
};
use datafusion::physical_expr::aggregate::LoweredAggregateBuilder;
use datafusion::physical_expr::{PhysicalExpr, create_physical_expr};

use crate::error::{Error, Result};
use crate::exec::{
    AggregateSpec, FilterOp, LimitOp, Operator, ProjectOp, QueryStats, WatermarkOp,
    WindowAggregateOp, WindowAssignOp, WindowColumn,
};
use crate::plan::{StreamDef, StreamSource, WatermarkNode, WindowNode};

/// How rows move through a query's operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionMode {
    /// Operators work on Arrow batches as the source cuts them.
    MicroBatch,
}

impl fmt::Display for ExecutionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecutionMode::MicroBatch => f.write_str("micro-batch"),
        }
    }
}

/// A query rewritten for incremental execution: a stream feeding a line of
/// tasks, each running a fused chain of operators.
pub struct QueryGraph {
    /// The stream the query reads.
    pub stream: Arc<StreamDef>,
    /// Tasks in data-flow order; each is a chain of fused operators.
    pub stages: Vec<Vec<Box<dyn Operator>>>,
    /// Schema of the result rows.
    pub schema: SchemaRef,
    /// The chosen execution mode.
    pub mode: ExecutionMode,
    /// Counters the operators update.
    pub stats: Arc<QueryStats>,
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
}

/// Plans `plan` for incremental execution.
pub fn plan_incremental(plan: &LogicalPlan) -> Result<QueryGraph> {
    let stats = Arc::new(QueryStats::default());
    let mut builder = Builder {
        stats: stats.clone(),
        props: ExecutionProps::new(),
        planning: PhysicalPlanningContext::default(),
    };
    let built = builder.build(plan)?;
    let schema = Arc::new(plan.schema().as_arrow().clone());
    let mut stages: Vec<Vec<Box<dyn Operator>>> = vec![Vec::new()];
    for (op, stateful) in built.ops {
        if stateful && !stages.last().is_some_and(|s| s.is_empty()) {
            stages.push(Vec::new());
        }
        stages.last_mut().expect("never empty").push(op);
    }
    stages.retain(|s| !s.is_empty());
    Ok(QueryGraph {
        stream: built.stream,
        stages,
        schema,
        mode: ExecutionMode::MicroBatch,
        stats,
    })
}

/// The operators built so far for a subtree, bottom first.
struct Built {
    stream: Arc<StreamDef>,
    /// Each operator, and whether it keeps state across batches.
    ops: Vec<(Box<dyn Operator>, bool)>,
    /// Where the window columns are in the current schema, if any.
    window: Option<WindowColumns>,
}

#[derive(Debug, Clone, Copy)]
struct WindowColumns {
    start: usize,
    end: usize,
    size_ms: i64,
}

struct Builder {
    stats: Arc<QueryStats>,
    props: ExecutionProps,
    planning: PhysicalPlanningContext,
}

fn unbounded(rule: &'static str, message: impl Into<String>) -> Error {
    Error::Unbounded {
        rule,
        message: message.into(),
    }
}

impl Builder {
    fn build(&mut self, plan: &LogicalPlan) -> Result<Built> {
        match plan {
            LogicalPlan::TableScan(scan) => self.scan(scan),
            LogicalPlan::Extension(ext) => self.extension(ext.node.as_ref()),
            LogicalPlan::Filter(filter) => {
                let mut built = self.build(&filter.input)?;
                let predicate = self.physical(&filter.predicate, filter.input.schema())?;
                built.ops.push((Box::new(FilterOp::new(predicate)), false));
                Ok(built)
            }
            LogicalPlan::Projection(projection) => {
                let mut built = self.build(&projection.input)?;
                let exprs = projection
                    .expr
                    .iter()
                    .map(|e| self.physical(e, projection.input.schema()))
                    .collect::<Result<Vec<_>>>()?;
                let schema = Arc::new(projection.schema.as_arrow().clone());
                built.window = built
                    .window
                    .and_then(|w| remap_window(w, &projection.expr, projection.input.schema()));
                built
                    .ops
                    .push((Box::new(ProjectOp::new(exprs, schema)), false));
                Ok(built)
            }
            LogicalPlan::SubqueryAlias(alias) => self.build(&alias.input),
            LogicalPlan::Aggregate(aggregate) => self.aggregate(aggregate),
            LogicalPlan::Limit(limit) => self.limit(limit),
            LogicalPlan::Sort(_) => Err(unbounded(
                "ORDER BY",
                "ORDER BY over an unbounded stream would never produce a row; results come in event-time order of their windows",
            )),
            LogicalPlan::Join(_) => {
                Err(unbounded("join", "joins of streams are not supported yet"))
            }
            LogicalPlan::Union(_) => {
                Err(unbounded("union", "UNION of streams is not supported yet"))
            }
            LogicalPlan::Window(_) => Err(unbounded(
                "window function",
                "OVER (...) window functions over a stream are not supported yet",
            )),
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

    fn scan(&mut self, scan: &datafusion::logical_expr::TableScan) -> Result<Built> {
        let Some(source) = scan.source.as_ref().downcast_ref::<StreamSource>() else {
            return Err(Error::Plan(format!(
                "'{}' is not a stream",
                scan.table_name
            )));
        };
        let mut built = Built {
            stream: source.def.clone(),
            ops: Vec::new(),
            window: None,
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
                .push((Box::new(ProjectOp::new(exprs, schema)), false));
        }
        Ok(built)
    }

    fn extension(&mut self, node: &dyn UserDefinedLogicalNode) -> Result<Built> {
        if let Some(watermark) = node.as_any().downcast_ref::<WatermarkNode>() {
            let mut built = self.build(&watermark.input)?;
            let op = WatermarkOp::new(watermark.time_column, watermark.delay_ms);
            built.ops.push((Box::new(op), false));
            return Ok(built);
        }
        if let Some(window) = node.as_any().downcast_ref::<WindowNode>() {
            let mut built = self.build(&window.input)?;
            let schema = Arc::new(node.schema().as_arrow().clone());
            let op = WindowAssignOp::new(
                window.time_column,
                window.spec,
                built.stream.delay_ms,
                schema,
                self.stats.clone(),
            );
            built.ops.push((Box::new(op), false));
            let start = window.window_start_index();
            built.window = Some(WindowColumns {
                start,
                end: start + 1,
                size_ms: window.spec.size_ms(),
            });
            return Ok(built);
        }
        Err(Error::Plan(format!("unknown plan node {}", node.name())))
    }

    fn aggregate(&mut self, aggregate: &Aggregate) -> Result<Built> {
        let mut built = self.build(&aggregate.input)?;
        let input_schema = aggregate.input.schema();
        let Some(window) = built.window else {
            return Err(unbounded(
                "unbounded aggregate",
                "an aggregate over a stream needs a window: FROM TUMBLE(stream, ts, INTERVAL '1' MINUTE) ... GROUP BY window_start, window_end, ...",
            ));
        };
        let group_exprs = aggregate.group_expr.clone();
        let window_column = group_exprs
            .iter()
            .enumerate()
            .find_map(|(i, e)| window_group(e, input_schema, window).map(|offset| (i, offset)))
            .map(|(group_index, end_offset_ms)| WindowColumn {
                group_index,
                end_offset_ms,
            })
            .ok_or_else(|| {
                unbounded(
                    "unbounded aggregate",
                    "a windowed aggregate must GROUP BY window_start or window_end",
                )
            })?;
        let physical_groups = group_exprs
            .iter()
            .map(|e| self.physical(e, input_schema))
            .collect::<Result<Vec<_>>>()?;
        let output = aggregate.schema.as_arrow();
        let group_schema = Arc::new(Schema::new(output.fields()[..group_exprs.len()].to_vec()));
        let physical_input = input_schema.as_arrow();
        let aggregates = aggregate
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
            .collect::<Result<Vec<_>>>()?;
        let op = WindowAggregateOp::new(
            physical_groups,
            group_schema,
            aggregates,
            window_column,
            Arc::new(output.clone()),
        );
        built.ops.push((Box::new(op), true));
        built.window = None;
        Ok(built)
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
        built.ops.push((Box::new(LimitOp::new(skip, fetch)), false));
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

/// If `expr` is one of the window columns, how far its value is from the
/// window end.
fn window_group(expr: &Expr, schema: &DFSchema, window: WindowColumns) -> Option<i64> {
    let index = column_index(expr, schema)?;
    if index == window.start {
        Some(window.size_ms)
    } else if index == window.end {
        Some(0)
    } else {
        None
    }
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

/// Follows the window columns through a projection that passes them on.
fn remap_window(window: WindowColumns, exprs: &[Expr], input: &DFSchema) -> Option<WindowColumns> {
    let position = |target: usize| {
        exprs
            .iter()
            .position(|e| column_index(e, input) == Some(target))
    };
    Some(WindowColumns {
        start: position(window.start).unwrap_or(usize::MAX),
        end: position(window.end).unwrap_or(usize::MAX),
        size_ms: window.size_ms,
    })
    .filter(|w| w.start != usize::MAX || w.end != usize::MAX)
}
