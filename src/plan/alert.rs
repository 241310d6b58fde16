//! Planning an `ALERT` clause on top of its query.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::DFSchema;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Expr, ExprSchemable, Extension, LogicalPlan, LogicalPlanBuilder};
use datafusion::sql::planner::{PlannerContext, SqlToRel};
use datafusion::sql::sqlparser::ast;

use super::alert_node::{
    AlertHold, AlertNode, AlertRule, AlertSpec, columns, key_columns, window_step_ms,
};
use super::template::MessageTemplate;
use super::{
    Catalog, Provider, SqlPlanner, StreamSource, WINDOW_END, WatermarkNode, parser_options,
    plan_error,
};
use crate::error::{Error, Result};
use crate::sql::{AlertClause, AlertCondition, Hold};

const WHEN_COLUMN: &str = "__alert_when";
const RESOLVE_COLUMN: &str = "__alert_resolve";

impl SqlPlanner {
    /// Puts an [`AlertNode`] named `name` on top of `query` (a planned
    /// query) for `clause`.
    pub fn plan_alert(
        &self,
        catalog: &Catalog,
        query: LogicalPlan,
        clause: &AlertClause,
        name: &str,
    ) -> Result<LogicalPlan> {
        let query = with_watermarks(query)?;
        let schema = query.schema().clone();
        let keys = self.alert_keys(&query, clause)?;
        let event_time = event_time_column(&query)?;
        check_names(clause)?;
        let messages = [&clause.message, &clause.resolve_message]
            .into_iter()
            .flatten()
            .map(|t| ("MESSAGE", t));
        let labels = clause.labels.iter().map(|(_, t)| ("LABELS", t));
        let annotations = clause.annotations.iter().map(|(_, t)| ("ANNOTATIONS", t));
        let templates = messages
            .chain(labels)
            .chain(annotations)
            .map(|(what, t)| Ok((what, MessageTemplate::parse(t)?)))
            .collect::<Result<Vec<_>>>()?;
        let (rule, conditions) = match &clause.condition {
            AlertCondition::When {
                when,
                hold,
                resolve,
            } => {
                let when = self.condition(catalog, when, &schema, "WHEN")?;
                let resolve = resolve
                    .as_ref()
                    .map(|r| self.condition(catalog, r, &schema, "RESOLVE WHEN"))
                    .transpose()?;
                let hold = self.hold(catalog, hold.as_ref())?;
                if hold != AlertHold::Now && keys.is_empty() {
                    return Err(no_key("FOR"));
                }
                let width = schema.fields().len();
                let rule = AlertRule::When {
                    when: width,
                    resolve: resolve.as_ref().map(|_| width + 1),
                    hold,
                };
                (rule, [Some(when), resolve])
            }
            AlertCondition::Absent { interval } => {
                let interval_ms = self.interval_ms(catalog, interval)?;
                if interval_ms <= 0 {
                    return Err(Error::Plan(format!(
                        "ALERT WHEN ABSENT FOR needs a positive interval, got {interval}"
                    )));
                }
                if keys.is_empty() {
                    return Err(no_key("WHEN ABSENT"));
                }
                (AlertRule::Absent { interval_ms }, [None, None])
            }
        };
        let read = read_columns(&conditions, &templates, &schema, &clause.condition)?;
        let values = read
            .into_iter()
            .filter(|i| !keys.contains(i) && *i != event_time)
            .collect();
        let keep_ms = match &clause.keep_firing {
            None => None,
            Some(expr) => match self.interval_ms(catalog, expr)? {
                ms if ms < 0 => {
                    return Err(Error::Plan(format!(
                        "ALERT ... KEEP FIRING FOR needs a positive interval, got {expr}"
                    )));
                }
                0 => None,
                ms => Some(ms),
            },
        };
        let spec = AlertSpec {
            name: name.to_string(),
            keys,
            event_time,
            rule,
            values,
            step_ms: window_step_ms(&query),
            severity: clause.severity.clone(),
            message: clause.message.clone(),
            resolve_message: clause.resolve_message.clone(),
            keep_ms,
            labels: clause.labels.clone(),
            annotations: clause.annotations.clone(),
        };
        let input = self.with_conditions(query, conditions)?;
        let node = AlertNode::try_new(input, spec).map_err(plan_error)?;
        for (what, template) in &templates {
            check_template(what, template, &node)?;
        }
        Ok(LogicalPlan::Extension(Extension {
            node: Arc::new(node),
        }))
    }

    /// `BY` columns if the clause names them, the query's keys otherwise.
    fn alert_keys(&self, query: &LogicalPlan, clause: &AlertClause) -> Result<Vec<usize>> {
        if clause.by.is_empty() {
            return Ok(key_columns(query));
        }
        keys_by_name(query.schema(), &clause.by, "ALERT BY")
    }

    /// Plans a condition over the query's output; it must be boolean.
    fn condition(
        &self,
        catalog: &Catalog,
        expr: &ast::Expr,
        schema: &DFSchema,
        clause: &str,
    ) -> Result<Expr> {
        let provider = Provider {
            planner: self,
            catalog,
        };
        let sql = SqlToRel::new_with_options(&provider, parser_options());
        let planned = sql
            .sql_to_expr(expr.clone(), schema, &mut PlannerContext::new())
            .map_err(|e| Error::Plan(format!("ALERT {clause} {expr}: {}", plan_error(e))))?;
        let data_type = planned.get_type(schema).map_err(plan_error)?;
        if !matches!(data_type, DataType::Boolean | DataType::Null) {
            return Err(Error::Plan(format!(
                "ALERT {clause} needs a true/false condition, but {expr} is {data_type}"
            )));
        }
        Ok(planned)
    }

    fn hold(&self, catalog: &Catalog, hold: Option<&Hold>) -> Result<AlertHold> {
        Ok(match hold {
            None => AlertHold::Now,
            Some(Hold::Windows(n)) => AlertHold::Rows(*n),
            Some(Hold::Interval(expr)) => match self.interval_ms(catalog, expr)? {
                ms if ms < 0 => {
                    return Err(Error::Plan(format!(
                        "ALERT ... FOR needs a positive interval, got {expr}"
                    )));
                }
                0 => AlertHold::Now,
                ms => AlertHold::Interval(ms),
            },
        })
    }

    /// The query with its conditions appended as columns, type-coerced.
    fn with_conditions(
        &self,
        query: LogicalPlan,
        conditions: [Option<Expr>; 2],
    ) -> Result<LogicalPlan> {
        let [when, resolve] = conditions;
        if when.is_none() {
            return Ok(query);
        }
        let mut exprs: Vec<Expr> = query
            .schema()
            .columns()
            .into_iter()
            .map(Expr::Column)
            .collect();
        exprs.extend(when.map(|e| e.alias(WHEN_COLUMN)));
        exprs.extend(resolve.map(|e| e.alias(RESOLVE_COLUMN)));
        let plan = LogicalPlanBuilder::from(query)
            .project(exprs)
            .and_then(|b| b.build())
            .map_err(plan_error)?;
        self.analyze(plan)
    }
}

/// `query` with a watermark on every stream it scans without one (a query
/// over raw rows): alerts and invariants act in event time, so they need
/// watermarks even where no window does.
pub(super) fn with_watermarks(query: LogicalPlan) -> Result<LogicalPlan> {
    if has_watermark(&query) {
        return Ok(query);
    }
    let rewritten = query
        .transform_up(|node| {
            let LogicalPlan::TableScan(scan) = &node else {
                return Ok(Transformed::no(node));
            };
            let Some(stream) = scan.source.as_ref().downcast_ref::<StreamSource>() else {
                return Ok(Transformed::no(node));
            };
            let Some(time) = stream.def.event_time else {
                return Ok(Transformed::no(node));
            };
            let name = stream.def.schema.field(time).name();
            let Some(time_column) = node.schema().fields().iter().position(|f| f.name() == name)
            else {
                return Ok(Transformed::no(node));
            };
            let delay_ms = stream.def.delay_ms;
            Ok(Transformed::yes(LogicalPlan::Extension(Extension {
                node: Arc::new(WatermarkNode {
                    input: node,
                    time_column,
                    delay_ms,
                }),
            })))
        })
        .map_err(plan_error)?;
    Ok(rewritten.data)
}

fn has_watermark(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply(|node| {
        if let LogicalPlan::Extension(ext) = node
            && ext.node.as_any().downcast_ref::<WatermarkNode>().is_some()
        {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// The positions of the columns `names` in `schema`; errors name `clause`.
pub(super) fn keys_by_name(
    schema: &DFSchema,
    names: &[String],
    clause: &str,
) -> Result<Vec<usize>> {
    names
        .iter()
        .map(|name| {
            schema
                .fields()
                .iter()
                .position(|f| f.name() == name)
                .ok_or_else(|| {
                    Error::Plan(format!(
                        "{clause} {name}: the query has no column '{name}' (columns: {})",
                        column_list(schema)
                    ))
                })
        })
        .collect()
}

/// The column that carries event time: `window_end` for window results,
/// else the stream's event-time column if the query keeps it.
pub(super) fn event_time_column(query: &LogicalPlan) -> Result<usize> {
    let schema = query.schema();
    let timestamp = |name: &str| {
        schema
            .fields()
            .iter()
            .position(|f| f.name() == name && matches!(f.data_type(), DataType::Timestamp(..)))
    };
    if let Some(i) = timestamp(WINDOW_END) {
        return Ok(i);
    }
    let mut stream_time = None;
    let _ = query.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && let Some(stream) = scan.source.as_ref().downcast_ref::<StreamSource>()
        {
            stream_time = stream
                .def
                .event_time
                .map(|i| stream.def.schema.field(i).name().clone());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    stream_time.as_deref().and_then(timestamp).ok_or_else(|| {
        let hint = match &stream_time {
            Some(column) => format!("window_end (windowed queries) or {column}"),
            None => "window_end (windowed queries) or the stream's WATERMARK column".into(),
        };
        Error::Plan(format!(
            "ALERT needs event time in the query's output: select {hint}"
        ))
    })
}

/// The query columns the conditions and the messages read, in query order.
fn read_columns(
    conditions: &[Option<Expr>; 2],
    templates: &[(&str, MessageTemplate)],
    schema: &DFSchema,
    condition: &AlertCondition,
) -> Result<Vec<usize>> {
    let mut read: Vec<usize> = conditions
        .iter()
        .flatten()
        .flat_map(|e| e.column_refs())
        .filter_map(|c| schema.index_of_column(c).ok())
        .collect();
    for (what, template) in templates {
        for name in template.columns() {
            if is_alert_column(name) {
                continue;
            }
            let Some(i) = schema.fields().iter().position(|f| f.name() == name) else {
                return Err(Error::Plan(format!(
                    "ALERT {what} reads '{{{name}}}', but the query has no column '{name}' (columns: {})",
                    column_list(schema)
                )));
            };
            read.push(i);
        }
    }
    if matches!(condition, AlertCondition::Absent { .. }) {
        read.clear();
    }
    read.sort_unstable();
    read.dedup();
    Ok(read)
}

/// `LABELS` and `ANNOTATIONS` names are Prometheus label names, and
/// `alertname` is the alert's own.
fn check_names(clause: &AlertClause) -> Result<()> {
    let lists = [
        ("LABELS", &clause.labels),
        ("ANNOTATIONS", &clause.annotations),
    ];
    for (what, pairs) in lists {
        for (name, _) in pairs {
            let mut chars = name.chars();
            let valid = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(Error::Plan(format!(
                    "ALERT {what} '{name}': a name is letters, digits and '_', not starting with a digit (as Prometheus label names are)"
                )));
            }
            if what == "LABELS" && name == "alertname" {
                return Err(Error::Plan(
                    "ALERT LABELS alertname: the alert's name is its alertname label".into(),
                ));
            }
        }
    }
    Ok(())
}

/// A deadman alert has no row to read values from: its message may only
/// use the keys and the alert's own columns.
fn check_template(what: &str, template: &MessageTemplate, node: &AlertNode) -> Result<()> {
    let schema = datafusion::logical_expr::UserDefinedLogicalNodeCore::schema(node);
    for name in template.columns() {
        if schema.fields().iter().all(|f| f.name() != name) {
            return Err(Error::Plan(format!(
                "ALERT {what} reads '{{{name}}}', which a WHEN ABSENT alert does not have (it has: {})",
                column_list(schema)
            )));
        }
    }
    Ok(())
}

fn is_alert_column(name: &str) -> bool {
    [
        columns::ALERT,
        columns::STATE,
        columns::EVENT_TIME,
        columns::SINCE,
        columns::SEVERITY,
    ]
    .contains(&name)
}

fn column_list(schema: &DFSchema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .filter(|n| !n.starts_with("__alert"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn no_key(what: &str) -> Error {
    Error::Plan(format!(
        "ALERT ... {what} keeps its state per key, but the query has none: GROUP BY a column besides the window (or PARTITION BY one), or name the key with ALERT BY col"
    ))
}
