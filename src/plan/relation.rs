//! Plans the window table functions in `FROM`:
//! `TUMBLE(stream, time_column, size [, offset])` and
//! `HOP(stream, time_column, slide, size [, offset])`, and
//! `CONTROLLED(stream, control_stream, key_column)` and
//! `PARAMS(stream, control_stream, 'name', default, ...)`.

use std::sync::Arc;

use datafusion::common::Column;
use datafusion::common::{DFSchema, ScalarValue, TableReference, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::planner::{
    PlannedRelation, RelationPlanner, RelationPlannerContext, RelationPlanning,
};
use datafusion::logical_expr::{
    Expr, Extension, LogicalPlan, LogicalPlanBuilder, UserDefinedLogicalNodeCore,
};
use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, FunctionArg, FunctionArgExpr, TableFactor};

use super::catalog::{StreamSource, TIME_TYPE, ViewSource};
use super::control_node::{ControlKind, ControlNode};
use super::literal_interval_ms;
use super::watermark_node::WatermarkNode;
use super::window_node::{WINDOW_END, WINDOW_START, Window, WindowNode, WindowSpec};

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
        let function = name.to_string().to_ascii_uppercase();
        if function == "CONTROLLED" || function == "PARAMS" {
            let plan = match function.as_str() {
                "PARAMS" => plan_params(&args.args, context)?,
                _ => plan_controlled(&args.args, context)?,
            };
            return Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(
                plan,
                alias.clone(),
            ))));
        }
        if function == "LATE" {
            let plan = plan_late(&args.args, context)?;
            return Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(
                plan,
                alias.clone(),
            ))));
        }
        let kind = match function.as_str() {
            "TUMBLE" => WindowKind::Tumble,
            "HOP" => WindowKind::Hop,
            "SESSION" => WindowKind::Session,
            _ => return Ok(RelationPlanning::Original(Box::new(relation))),
        };
        let args: Vec<SqlExpr> = args
            .args
            .iter()
            .map(|a| unnamed_arg(a, kind))
            .collect::<Result<_>>()?;
        let plan = plan_window(kind, &args, context)?;
        Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(
            plan,
            alias.clone(),
        ))))
    }
}

/// The most windows a HOP may put one row in: each pane registers its
/// windows, so a huge size/slide ratio would cost memory per pane.
const MAX_WINDOWS_PER_ROW: i64 = 10_000;

/// The window table functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WindowKind {
    Tumble,
    Hop,
    Session,
}

impl WindowKind {
    fn name(self) -> &'static str {
        match self {
            WindowKind::Tumble => "TUMBLE",
            WindowKind::Hop => "HOP",
            WindowKind::Session => "SESSION",
        }
    }

    fn signature(self) -> &'static str {
        match self {
            WindowKind::Tumble => "TUMBLE(stream, time_column, size [, offset])",
            WindowKind::Hop => "HOP(stream, time_column, slide, size [, offset])",
            WindowKind::Session => "SESSION(stream, time_column, gap)",
        }
    }

    /// Interval arguments after the time column, without the offset.
    fn intervals(self) -> usize {
        match self {
            WindowKind::Tumble | WindowKind::Session => 1,
            WindowKind::Hop => 2,
        }
    }

    /// Whether an offset may follow the intervals.
    fn takes_offset(self) -> bool {
        self != WindowKind::Session
    }
}

fn unnamed_arg(arg: &FunctionArg, kind: WindowKind) -> Result<SqlExpr> {
    match arg {
        FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e.clone()),
        other => plan_err!("{} takes positional arguments, got {other}", kind.name()),
    }
}

fn plan_window(
    kind: WindowKind,
    args: &[SqlExpr],
    context: &mut dyn RelationPlannerContext,
) -> Result<LogicalPlan> {
    let intervals = kind.intervals();
    let most = 2 + intervals + usize::from(kind.takes_offset());
    if !(2 + intervals..=most).contains(&args.len()) {
        return plan_err!(
            "{} takes {}, got {} arguments",
            kind.name(),
            kind.signature(),
            args.len()
        );
    }
    let scan = watermarked_scan(&args[0], context)?;
    let time_column = time_column(&args[1], &scan, context)?;
    let mut lengths = Vec::with_capacity(intervals);
    for arg in &args[2..2 + intervals] {
        let ms = interval_arg(arg, kind, context)?;
        if ms <= 0 {
            return plan_err!("{} window lengths must be positive, got {arg}", kind.name());
        }
        lengths.push(ms);
    }
    let offset_ms = match args.get(2 + intervals) {
        Some(arg) => interval_arg(arg, kind, context)?,
        None => 0,
    };
    let window = match kind {
        WindowKind::Tumble => Window::Aligned(WindowSpec::tumble(lengths[0], offset_ms)),
        WindowKind::Session => Window::Session { gap_ms: lengths[0] },
        WindowKind::Hop => {
            let (slide, size) = (lengths[0], lengths[1]);
            if slide > size {
                return plan_err!("HOP slide ({slide} ms) must not exceed its size ({size} ms)");
            }
            if size / slide > MAX_WINDOWS_PER_ROW {
                return plan_err!(
                    "HOP puts each row in {} windows (size / slide); at most {MAX_WINDOWS_PER_ROW} are supported",
                    size / slide
                );
            }
            Window::Aligned(WindowSpec::hop(slide, size, offset_ms))
        }
    };
    let node = WindowNode::try_new(scan, time_column, window)?;
    Ok(extension(node))
}

/// `CONTROLLED(stream, control_stream, key_column)`: the rows of `stream`
/// whose `key_column` the control stream does not block at their event
/// time (the executor's `ControlFilter` applies it). The control stream has an
/// event time, a `key` column, and optionally `action` (`block` or
/// `unblock`; without it every row blocks) and `until` (a TIMESTAMP at
/// which a block ends).
fn plan_controlled(
    args: &[FunctionArg],
    context: &mut dyn RelationPlannerContext,
) -> Result<LogicalPlan> {
    const USAGE: &str = "CONTROLLED(stream_or_view, control_stream, key_column [, time_column])";
    let args = plain_args(args, USAGE)?;
    let (data, control, key, time) = match args[..] {
        [data, control, key] => (data, control, key, None),
        [data, control, key, time] => (data, control, key, Some(time)),
        _ => return plan_err!("{USAGE} takes 3 or 4 arguments, got {}", args.len()),
    };
    let (data, data_time, control, control_time) =
        two_streams(data, control, time, USAGE, context)?;
    let SqlExpr::Identifier(id) = key else {
        return plan_err!("{USAGE}: the key must be a column name, got {key}");
    };
    let key = context.normalize_ident(id.clone());
    let Some(data_key) = data.schema().index_of_column_by_name(None, &key) else {
        return plan_err!("{USAGE}: the controlled stream has no column '{key}'");
    };
    let find = |name: &str| control.schema().index_of_column_by_name(None, name);
    let Some(control_key) = find("key") else {
        return plan_err!(
            "{USAGE}: the control stream needs a column 'key' (the key it blocks or unblocks)"
        );
    };
    let action = find("action");
    if let Some(i) = action
        && !is_text(control.schema().field(i).data_type())
    {
        return plan_err!(
            "{USAGE}: the control stream's 'action' must be TEXT ('block' or 'unblock')"
        );
    }
    let until = find("until");
    if let Some(i) = until
        && control.schema().field(i).data_type() != &TIME_TYPE
    {
        return plan_err!("{USAGE}: the control stream's 'until' must be a TIMESTAMP");
    }
    let kind = ControlKind::Block {
        data_key,
        action,
        until,
    };
    let node = ControlNode::try_new(data, control, data_time, control_time, control_key, kind)?;
    Ok(extension(node))
}

/// `PARAMS(stream, control_stream, 'name', default [, 'name', default ...])`:
/// the rows of `stream`, each with a `DOUBLE` column per parameter, its
/// value at the row's event time: the `value` of the control stream's last
/// row of that `name` at or before it, or the default.
fn plan_params(
    args: &[FunctionArg],
    context: &mut dyn RelationPlannerContext,
) -> Result<LogicalPlan> {
    const USAGE: &str = "PARAMS(stream, control_stream, 'name', default [, 'name', default ...])";
    let args = plain_args(args, USAGE)?;
    if args.len() < 4 || args.len() % 2 != 0 {
        return plan_err!("{USAGE}: got {} arguments", args.len());
    }
    let (data, data_time, control, control_time) =
        two_streams(args[0], args[1], None, USAGE, context)?;
    let mut params = Vec::new();
    for pair in args[2..].chunks(2) {
        let SqlExpr::Value(v) = pair[0] else {
            return plan_err!(
                "{USAGE}: a parameter's name is a quoted text, got {}",
                pair[0]
            );
        };
        let Some(name) = v.value.clone().into_string() else {
            return plan_err!(
                "{USAGE}: a parameter's name is a quoted text, got {}",
                pair[0]
            );
        };
        if data.schema().index_of_column_by_name(None, &name).is_some()
            || params.iter().any(|(n, _)| n == &name)
        {
            return plan_err!("{USAGE}: parameter '{name}' is already a column of the rows");
        }
        let Some(default) = number(pair[1]) else {
            return plan_err!(
                "{USAGE}: parameter '{name}' needs a number as its default, got {}",
                pair[1]
            );
        };
        params.push((name, ScalarValue::Float64(Some(default))));
    }
    let find = |name: &str| control.schema().index_of_column_by_name(None, name);
    let (Some(control_key), Some(value)) = (find("name"), find("value")) else {
        return plan_err!(
            "{USAGE}: the control stream needs columns 'name' (the parameter) and 'value' (a number)"
        );
    };
    if !control.schema().field(value).data_type().is_numeric() {
        return plan_err!("{USAGE}: the control stream's 'value' must be a number");
    }
    let kind = ControlKind::Params { params, value };
    let node = ControlNode::try_new(data, control, data_time, control_time, control_key, kind)?;
    Ok(extension(node))
}

/// The arguments of a table function, each a plain expression.
fn plain_args<'a>(args: &'a [FunctionArg], usage: &str) -> Result<Vec<&'a SqlExpr>> {
    args.iter()
        .map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e),
            other => plan_err!("{usage}: unexpected argument {other}"),
        })
        .collect()
}

/// The controlled input and the control stream, with their event-time
/// columns. The control stream is a declared stream, watermarked; the
/// input is one too, or a view (window results, an alert's rows) with
/// `time`, the TIMESTAMP column its rows are judged at.
fn two_streams(
    data: &SqlExpr,
    control: &SqlExpr,
    time: Option<&SqlExpr>,
    usage: &str,
    context: &mut dyn RelationPlannerContext,
) -> Result<(LogicalPlan, usize, LogicalPlan, usize)> {
    let stream_of = |plan: LogicalPlan, what: &str| -> Result<(LogicalPlan, usize)> {
        let time = match &plan {
            LogicalPlan::Extension(e) => e
                .node
                .as_any()
                .downcast_ref::<WatermarkNode>()
                .map(|w| w.time_column),
            _ => None,
        };
        match time {
            Some(time) => Ok((plan, time)),
            None => plan_err!("{usage}: the {what} must be a declared stream, not a view"),
        }
    };
    let (data, data_time) = match time {
        None => stream_of(
            watermarked_scan(data, context)?,
            "controlled input (without a time column)",
        )?,
        Some(time) => input_at(data, time, usage, context)?,
    };
    let (control, control_time) = stream_of(watermarked_scan(control, context)?, "control stream")?;
    Ok((data, data_time, control, control_time))
}

/// A stream or view named by `input`, and the index of its TIMESTAMP
/// column `time`: a stream's must be its event time.
fn input_at(
    input: &SqlExpr,
    time: &SqlExpr,
    usage: &str,
    context: &mut dyn RelationPlannerContext,
) -> Result<(LogicalPlan, usize)> {
    let (SqlExpr::Identifier(name), SqlExpr::Identifier(time)) = (input, time) else {
        return plan_err!(
            "{usage}: the input and its time column are names, got {input} and {time}"
        );
    };
    let name = context.normalize_ident(name.clone());
    let time = context.normalize_ident(time.clone());
    let source = context
        .context_provider()
        .get_table_source(TableReference::bare(name.as_str()))?;
    let is_view = source.as_ref().downcast_ref::<ViewSource>().is_some();
    let plan = if is_view {
        LogicalPlanBuilder::scan(name.as_str(), source, None)?.build()?
    } else {
        watermarked_scan(input, context)?
    };
    let Some(index) = plan.schema().index_of_column_by_name(None, &time) else {
        return plan_err!("{usage}: '{name}' has no column '{time}'");
    };
    if plan.schema().field(index).data_type() != &TIME_TYPE {
        return plan_err!("{usage}: column '{time}' is not a TIMESTAMP");
    }
    if let LogicalPlan::Extension(e) = &plan
        && let Some(w) = e.node.as_any().downcast_ref::<WatermarkNode>()
        && w.time_column != index
    {
        return plan_err!(
            "{usage}: '{time}' is not the stream's event-time column '{}'",
            w.time_column_name()
        );
    }
    Ok((plan, index))
}

fn is_text(t: &datafusion::arrow::datatypes::DataType) -> bool {
    use datafusion::arrow::datatypes::DataType;
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// A number literal, with its sign.
fn number(expr: &SqlExpr) -> Option<f64> {
    match expr {
        SqlExpr::Value(v) => match &v.value {
            datafusion::sql::sqlparser::ast::Value::Number(text, _) => text.parse().ok(),
            _ => None,
        },
        SqlExpr::UnaryOp { op, expr } => {
            let n = number(expr)?;
            match op {
                datafusion::sql::sqlparser::ast::UnaryOperator::Minus => Some(-n),
                datafusion::sql::sqlparser::ast::UnaryOperator::Plus => Some(n),
                _ => None,
            }
        }
        _ => None,
    }
}

/// `late(stream)`: the rows that the other queries' windows over `stream`
/// drop as late, as a stream of their own.
fn plan_late(
    args: &[FunctionArg],
    context: &mut dyn RelationPlannerContext,
) -> Result<LogicalPlan> {
    let [FunctionArg::Unnamed(FunctionArgExpr::Expr(SqlExpr::Identifier(id)))] = args else {
        return plan_err!("late takes one stream name: late(stream)");
    };
    let name = context.normalize_ident(id.clone());
    let source = context
        .context_provider()
        .get_table_source(TableReference::bare(name.as_str()))?;
    let Some(stream) = source.as_ref().downcast_ref::<StreamSource>() else {
        return plan_err!("late needs a stream, '{name}' is not one");
    };
    if stream.def.late_of.is_some() {
        return plan_err!("late(late(...)) is not a stream");
    }
    let late = StreamSource {
        def: Arc::new(stream.def.late_rows()),
    };
    LogicalPlanBuilder::scan(format!("late_{name}"), Arc::new(late), None)?.build()
}

/// `node` as a plan.
fn extension(node: impl UserDefinedLogicalNodeCore) -> LogicalPlan {
    LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    })
}

/// `TableScan(stream)` under a `Watermark` on the stream's event time.
fn watermarked_scan(
    arg: &SqlExpr,
    context: &mut dyn RelationPlannerContext,
) -> Result<LogicalPlan> {
    let name = match arg {
        SqlExpr::Identifier(id) => context.normalize_ident(id.clone()),
        other => return plan_err!("a window's first argument must be a stream name, got {other}"),
    };
    let source = context
        .context_provider()
        .get_table_source(TableReference::bare(name.as_str()))?;
    if source.as_ref().downcast_ref::<ViewSource>().is_some() {
        return view_input(&name, source);
    }
    let Some(stream) = source.as_ref().downcast_ref::<StreamSource>() else {
        return plan_err!("a window needs a stream, '{name}' is not one");
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
    Ok(extension(node))
}

/// A view as a window's input, for windows over window results. The view's
/// own `window_start`/`window_end` are renamed `inner_window_start` and
/// `inner_window_end`, so that the new window's columns keep their names.
fn view_input(
    name: &str,
    source: Arc<dyn datafusion::logical_expr::TableSource>,
) -> Result<LogicalPlan> {
    let view = LogicalPlanBuilder::scan(name, source, None)?.build()?;
    let columns: Vec<Expr> = view
        .schema()
        .iter()
        .map(|(qualifier, field)| {
            let column = Expr::Column(Column::from((qualifier, field.as_ref())));
            match inner_name(field.name()) {
                Some(renamed) => column.alias(renamed),
                None => column,
            }
        })
        .collect();
    LogicalPlanBuilder::from(view).project(columns)?.build()
}

fn inner_name(name: &str) -> Option<String> {
    [WINDOW_START, WINDOW_END]
        .contains(&name)
        .then(|| format!("inner_{name}"))
}

/// Checks that the named column is the stream's event time, and returns it.
fn time_column(
    arg: &SqlExpr,
    scan: &LogicalPlan,
    context: &mut dyn RelationPlannerContext,
) -> Result<usize> {
    let name = match arg {
        SqlExpr::Identifier(id) => context.normalize_ident(id.clone()),
        other => return plan_err!("a window's second argument must be a column name, got {other}"),
    };
    let schema = scan.schema();
    let watermark = match scan {
        LogicalPlan::Extension(ext) => ext.node.as_any().downcast_ref::<WatermarkNode>(),
        _ => None,
    };
    let Some(watermark) = watermark else {
        // A view: any TIMESTAMP column, its window columns by their new names.
        let wanted = inner_name(&name).unwrap_or(name.clone());
        let Some(index) = schema.fields().iter().position(|f| f.name() == &wanted) else {
            return plan_err!("window: unknown column '{name}'");
        };
        if schema.field(index).data_type() != &TIME_TYPE {
            return plan_err!("window: column '{name}' is not a TIMESTAMP");
        }
        return Ok(index);
    };
    let Some(index) = schema.index_of_column_by_name(None, &name) else {
        return plan_err!("window: unknown column '{name}'");
    };
    if schema.field(index).data_type() != &TIME_TYPE {
        return plan_err!("window: column '{name}' is not a TIMESTAMP");
    }
    if index != watermark.time_column {
        return plan_err!(
            "window: '{name}' is not the stream's event-time column '{}' (declared with WATERMARK FOR)",
            watermark.time_column_name()
        );
    }
    Ok(index)
}

fn interval_arg(
    arg: &SqlExpr,
    kind: WindowKind,
    context: &mut dyn RelationPlannerContext,
) -> Result<i64> {
    let expr = context.sql_to_expr(arg.clone(), &DFSchema::empty())?;
    match literal_interval_ms(&expr) {
        Some(ms) => Ok(ms),
        None => plan_err!(
            "{} lengths must be fixed-length INTERVALs, got {arg}",
            kind.name()
        ),
    }
}
