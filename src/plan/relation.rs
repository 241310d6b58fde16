//! Plans `TUMBLE(stream, time_column, size [, offset])` in `FROM`.

use std::sync::Arc;

use datafusion::common::{DFSchema, TableReference, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::planner::{
    PlannedRelation, RelationPlanner, RelationPlannerContext, RelationPlanning,
};
use datafusion::logical_expr::{Extension, LogicalPlan, LogicalPlanBuilder};
use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, FunctionArg, FunctionArgExpr, TableFactor};

use super::catalog::{StreamSource, TIME_TYPE};
use super::literal_interval_ms;
use super::watermark_node::WatermarkNode;
use super::window_node::{WindowNode, WindowSpec};

/// Turns window table functions into window nodes over a watermarked scan.
#[derive(Debug)]
pub struct WindowRelationPlanner;

impl RelationPlanner for WindowRelationPlanner {
    fn plan_relation(
        &self,
        relation: TableFactor,
        context: &mut dyn RelationPlannerContext,
    ) -> Result<RelationPlanning> {
        let TableFactor::Table {
            name,
            alias,
            args: Some(args),
            ..
        } = &relation
        else {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        };
        let function = name.to_string().to_ascii_lowercase();
        if function != "tumble" {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        }
        let args: Vec<SqlExpr> = args.args.iter().map(unnamed_arg).collect::<Result<_>>()?;
        let plan = plan_tumble(&args, context)?;
        Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(
            plan,
            alias.clone(),
        ))))
    }
}

fn unnamed_arg(arg: &FunctionArg) -> Result<SqlExpr> {
    match arg {
        FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e.clone()),
        other => plan_err!("TUMBLE takes positional arguments, got {other}"),
    }
}

fn plan_tumble(args: &[SqlExpr], context: &mut dyn RelationPlannerContext) -> Result<LogicalPlan> {
    if !(3..=4).contains(&args.len()) {
        return plan_err!(
            "TUMBLE takes (stream, time_column, size [, offset]), got {} arguments",
            args.len()
        );
    }
    let scan = watermarked_scan(&args[0], context)?;
    let time_column = time_column(&args[1], &scan, context)?;
    let size_ms = interval_arg(&args[2], "size", context)?;
    if size_ms <= 0 {
        return plan_err!("TUMBLE size must be positive, got {}", args[2]);
    }
    let offset_ms = match args.get(3) {
        Some(arg) => interval_arg(arg, "offset", context)?.rem_euclid(size_ms),
        None => 0,
    };
    let spec = WindowSpec::Tumble { size_ms, offset_ms };
    let node = WindowNode::try_new(scan, time_column, spec)?;
    Ok(LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    }))
}

/// `TableScan(stream)` under a `Watermark` on the stream's event time.
fn watermarked_scan(
    arg: &SqlExpr,
    context: &mut dyn RelationPlannerContext,
) -> Result<LogicalPlan> {
    let name = match arg {
        SqlExpr::Identifier(id) => context.normalize_ident(id.clone()),
        other => return plan_err!("TUMBLE's first argument must be a stream name, got {other}"),
    };
    let source = context
        .context_provider()
        .get_table_source(TableReference::bare(name.as_str()))?;
    let Some(stream) = source.as_ref().downcast_ref::<StreamSource>() else {
        return plan_err!("TUMBLE needs a stream, '{name}' is not one");
    };
    let Some(time_column) = stream.def.event_time else {
        return plan_err!("stream '{name}' has no TIMESTAMP column to window on");
    };
    let delay_ms = stream.def.delay_ms;
    let scan = LogicalPlanBuilder::scan(name.as_str(), source, None)?.build()?;
    let node = WatermarkNode {
        input: scan,
        time_column,
        delay_ms,
    };
    Ok(LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    }))
}

/// Checks that the named column is the stream's event time, and returns it.
fn time_column(
    arg: &SqlExpr,
    scan: &LogicalPlan,
    context: &mut dyn RelationPlannerContext,
) -> Result<usize> {
    let LogicalPlan::Extension(ext) = scan else {
        unreachable!("watermarked_scan returns an extension node")
    };
    let watermark = ext
        .node
        .as_any()
        .downcast_ref::<WatermarkNode>()
        .expect("watermarked_scan returns a Watermark node");
    let name = match arg {
        SqlExpr::Identifier(id) => context.normalize_ident(id.clone()),
        other => return plan_err!("TUMBLE's second argument must be a column name, got {other}"),
    };
    let schema = scan.schema();
    let Some(index) = schema.index_of_column_by_name(None, &name) else {
        return plan_err!("TUMBLE: unknown column '{name}'");
    };
    if schema.field(index).data_type() != &TIME_TYPE {
        return plan_err!("TUMBLE: column '{name}' is not a TIMESTAMP");
    }
    if index != watermark.time_column {
        return plan_err!(
            "TUMBLE: '{name}' is not the stream's event-time column '{}' (declared with WATERMARK FOR)",
            watermark.time_column_name()
        );
    }
    Ok(index)
}

fn interval_arg(
    arg: &SqlExpr,
    what: &str,
    context: &mut dyn RelationPlannerContext,
) -> Result<i64> {
    let expr = context.sql_to_expr(arg.clone(), &DFSchema::empty())?;
    match literal_interval_ms(&expr) {
        Some(ms) => Ok(ms),
        None => plan_err!("TUMBLE {what} must be a fixed-length INTERVAL, got {arg}"),
    }
}
