//! The logical plan: SQL to DataFusion `LogicalPlan`, with vigil's own
//! extension nodes for what DataFusion lacks (watermarks, windows).
//!
//! [`SqlPlanner`] is DataFusion's SQL planner with a context provider that
//! knows the declared streams, and a relation planner that turns
//! `TUMBLE(stream, ts, size)` in `FROM` into
//! `WindowAssign <- Watermark <- TableScan(stream)`.

mod alert;
pub mod alert_node;
pub mod catalog;
pub mod control_node;
pub mod emit_node;
mod invariant;
pub mod invariant_node;
pub mod listing;
mod relation;
pub mod template;
pub mod watermark_node;
pub mod window_node;

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, ScalarValue, SchemaError, TableReference};
use datafusion::config::ConfigOptions;
use datafusion::error::DataFusionError;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::planner::{ContextProvider, ExprPlanner, RelationPlanner};
use datafusion::logical_expr::{
    AggregateUDF, Expr, HigherOrderUDF, LogicalPlan, ScalarUDF, TableSource, WindowUDF,
};
use datafusion::optimizer::simplify_expressions::SimplifyExpressions;
use datafusion::optimizer::{Optimizer, OptimizerContext};
use datafusion::sql::planner::{ParserOptions, PlannerContext, SqlToRel};
use datafusion::sql::sqlparser::ast;

pub use alert_node::{AlertHold, AlertNode, AlertRule, AlertSpec, columns};
pub use catalog::{Catalog, StreamDef, StreamSource, ViewSource};
pub use control_node::{ControlKind, ControlNode};
pub use emit_node::{EmitNode, EmitPolicy, FINAL_COLUMN, OP_COLUMN};
pub use invariant_node::{InvariantNode, InvariantSpec, Training};
pub use watermark_node::WatermarkNode;
pub use window_node::{WINDOW_END, WINDOW_START, Window, WindowNode, WindowSpec};

use crate::error::{Error, Result};

/// Plans SQL against a catalog of streams.
pub struct SqlPlanner {
    state: SessionState,
    relation_planners: Vec<Arc<dyn RelationPlanner>>,
}

impl Default for SqlPlanner {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for SqlPlanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqlPlanner")
    }
}

impl SqlPlanner {
    /// A planner with DataFusion's built-in functions.
    pub fn new() -> Self {
        let mut state = SessionStateBuilder::new().with_default_features().build();
        crate::functions::register(&mut state).expect("vigil's functions register");
        Self {
            state,
            relation_planners: vec![Arc::new(relation::WindowRelationPlanner)],
        }
    }

    /// The names of the scalar, aggregate and window functions a query can
    /// call (DataFusion's and vigil's), sorted.
    pub fn function_names(&self) -> Vec<String> {
        let state = &self.state;
        let mut names: Vec<String> = state
            .scalar_functions()
            .keys()
            .chain(state.aggregate_functions().keys())
            .chain(state.window_functions().keys())
            .cloned()
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Plans a query into a logical plan as the SQL says it, before type
    /// coercion: the form a view is kept in.
    pub fn plan_raw(&self, catalog: &Catalog, query: &ast::Query) -> Result<LogicalPlan> {
        let provider = Provider {
            planner: self,
            catalog,
        };
        let sql = SqlToRel::new_with_options(&provider, parser_options());
        let statement = ast::Statement::Query(Box::new(query.clone()));
        sql.sql_statement_to_plan(statement).map_err(plan_error)
    }

    /// Plans a query into an analysed (type-coerced) logical plan.
    pub fn plan_query(&self, catalog: &Catalog, query: &ast::Query) -> Result<LogicalPlan> {
        let plan = self.plan_raw(catalog, query)?;
        self.analyze(plan)
    }

    /// Type-checks and coerces a plan, then simplifies its expressions.
    fn analyze(&self, plan: LogicalPlan) -> Result<LogicalPlan> {
        let plan = self
            .state
            .analyzer()
            .execute_and_check(plan, self.state.config_options(), |_, _| {})
            .map_err(plan_error)?;
        self.simplify(plan)
    }

    /// Runs DataFusion's expression simplifier: some functions (`coalesce`,
    /// `nvl`, ...) are only executable in their simplified form. The other
    /// optimizer rules are left out on purpose: they assume bounded inputs.
    fn simplify(&self, plan: LogicalPlan) -> Result<LogicalPlan> {
        let optimizer = Optimizer::with_rules(vec![Arc::new(SimplifyExpressions::new())]);
        let context = OptimizerContext::new().with_max_passes(1);
        optimizer
            .optimize(plan, &context, |_, _| {})
            .map_err(plan_error)
    }

    /// Plans `text`, a boolean SQL expression over the columns of `schema`
    /// (such as `shed_keep = 'severity >= 3'`), into a physical expression
    /// over rows of that schema.
    pub fn row_predicate(
        &self,
        catalog: &Catalog,
        schema: &datafusion::arrow::datatypes::SchemaRef,
        text: &str,
    ) -> Result<Arc<dyn datafusion::physical_expr::PhysicalExpr>> {
        let expr = datafusion::sql::sqlparser::parser::Parser::new(
            &datafusion::sql::sqlparser::dialect::GenericDialect {},
        )
        .try_with_sql(text)
        .and_then(|mut p| p.parse_expr())
        .map_err(|e| Error::Plan(e.to_string()))?;
        let provider = Provider {
            planner: self,
            catalog,
        };
        let df = DFSchema::try_from(schema.as_ref().clone()).map_err(plan_error)?;
        let sql = SqlToRel::new_with_options(&provider, parser_options());
        let planned = sql
            .sql_to_expr(expr, &df, &mut PlannerContext::new())
            .map_err(plan_error)?;
        let physical = self
            .state
            .create_physical_expr(planned, &df)
            .map_err(plan_error)?;
        let data_type = physical.data_type(schema).map_err(plan_error)?;
        if data_type != DataType::Boolean {
            return Err(Error::Plan(format!(
                "'{text}' is of type {data_type}, not a boolean"
            )));
        }
        Ok(physical)
    }

    /// Evaluates a constant interval such as `INTERVAL '2' SECOND` to
    /// milliseconds. Months are rejected: their length varies.
    pub fn interval_ms(&self, catalog: &Catalog, expr: &ast::Expr) -> Result<i64> {
        let provider = Provider {
            planner: self,
            catalog,
        };
        let sql = SqlToRel::new_with_options(&provider, parser_options());
        let planned = sql
            .sql_to_expr(expr.clone(), &DFSchema::empty(), &mut PlannerContext::new())
            .map_err(plan_error)?;
        literal_interval_ms(&planned)
            .ok_or_else(|| Error::Plan(format!("expected a fixed-length interval, got {expr}")))
    }
}

/// True if the plan windows a stream that has an allowed lateness, so its
/// windows can fire again as updates.
pub fn windows_take_late_rows(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply(|node| {
        if let LogicalPlan::Extension(ext) = node
            && let Some(window) = ext.node.as_any().downcast_ref::<WindowNode>()
        {
            let _ = window.input.apply(|below| {
                if let LogicalPlan::TableScan(scan) = below
                    && let Some(stream) = scan.source.as_ref().downcast_ref::<StreamSource>()
                {
                    found |= stream.def.lateness_ms > 0;
                }
                Ok(TreeNodeRecursion::Continue)
            });
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// Reads a literal interval as milliseconds; `None` if it is not a literal
/// interval of fixed length.
pub fn literal_interval_ms(expr: &Expr) -> Option<i64> {
    let Expr::Literal(value, _) = expr else {
        return None;
    };
    match value {
        ScalarValue::IntervalMonthDayNano(Some(v)) if v.months == 0 => {
            Some(v.days as i64 * 86_400_000 + v.nanoseconds / 1_000_000)
        }
        ScalarValue::IntervalDayTime(Some(v)) => {
            Some(v.days as i64 * 86_400_000 + v.milliseconds as i64)
        }
        _ => None,
    }
}

fn parser_options() -> ParserOptions {
    ParserOptions {
        map_string_types_to_utf8view: false,
        // Errors then carry the place of the name they are about.
        collect_spans: true,
        ..ParserOptions::new()
    }
}

/// Rewrites DataFusion's planning errors into vigil's words where theirs
/// would confuse (streams are not tables in a `datafusion.public` schema).
fn plan_error(err: DataFusionError) -> Error {
    let message = unknown_column(&err).unwrap_or_else(|| one_line(&err.strip_backtrace()));
    match err.diagnostic().and_then(|d| d.span) {
        Some(span) => Error::PlanAt {
            message,
            line: span.start.line,
            column: span.start.column,
        },
        None => Error::Plan(message),
    }
}

/// For a column that is not in scope: the message, with the closest name
/// that is (by edit distance, a swap of two letters counting one), if one
/// is close enough to be a typo.
fn unknown_column(err: &DataFusionError) -> Option<String> {
    let mut err = err;
    let (field, valid) = loop {
        match err {
            DataFusionError::Diagnostic(_, inner) | DataFusionError::Context(_, inner) => {
                err = inner
            }
            DataFusionError::SchemaError(inner, _) => match inner.as_ref() {
                SchemaError::FieldNotFound {
                    field,
                    valid_fields,
                } => break (field, valid_fields),
                _ => return None,
            },
            _ => return None,
        }
    };
    let wanted = field.name.to_lowercase();
    let closest = valid
        .iter()
        .map(|c| {
            (
                strsim::osa_distance(&wanted, &c.name.to_lowercase()),
                &c.name,
            )
        })
        .filter(|(distance, name)| *distance <= (name.len() / 3).max(1))
        .min_by_key(|(distance, _)| *distance);
    Some(match closest {
        Some((_, name)) => format!("unknown column '{}' (did you mean '{name}'?)", field.name),
        None => format!("unknown column '{}'", field.name),
    })
}

/// DataFusion's messages can span lines (candidate signatures, "caused by"
/// chains, a request to file a bug); the user needs the one line that says
/// what is wrong with their query.
fn one_line(text: &str) -> String {
    const NO_MATCH: &str = "No function matches the given name and argument types";
    // A function with its own coercion (vigil's) says what is wrong itself.
    const OWN_COERCION: &str = "user-defined coercion failed with: ";
    let line = if let Some(start) = text.find(OWN_COERCION) {
        let rest = &text[start + OWN_COERCION.len()..];
        let end = rest.find(NO_MATCH).unwrap_or(rest.len());
        rest[..end].trim().trim_end_matches('.')
    } else if let Some(start) = text.find(NO_MATCH) {
        let rest = &text[start..];
        rest.find("You might")
            .map_or(rest, |end| &rest[..end])
            .trim()
    } else if text.contains("\ncaused by\n") {
        text.lines().last().unwrap_or(text)
    } else {
        text.lines().next().unwrap_or(text)
    };
    line.trim_start_matches("Error during planning: ")
        .trim_start_matches("Arrow error: ")
        .replace("datafusion.public.", "")
}

struct Provider<'a> {
    planner: &'a SqlPlanner,
    catalog: &'a Catalog,
}

impl ContextProvider for Provider<'_> {
    fn get_table_source(
        &self,
        name: TableReference,
    ) -> datafusion::error::Result<Arc<dyn TableSource>> {
        if let Some(view) = self.catalog.view(name.table()) {
            return Ok(view.clone());
        }
        let def = self
            .catalog
            .stream(name.table())
            .ok_or_else(|| DataFusionError::Plan(format!("unknown stream '{}'", name.table())))?;
        Ok(Arc::new(StreamSource { def: def.clone() }))
    }

    fn get_expr_planners(&self) -> &[Arc<dyn ExprPlanner>] {
        self.planner.state.expr_planners()
    }

    fn get_relation_planners(&self) -> &[Arc<dyn RelationPlanner>] {
        &self.planner.relation_planners
    }

    fn get_function_meta(&self, name: &str) -> Option<Arc<ScalarUDF>> {
        self.planner.state.scalar_functions().get(name).cloned()
    }

    fn get_higher_order_meta(&self, name: &str) -> Option<Arc<HigherOrderUDF>> {
        self.planner
            .state
            .higher_order_functions()
            .get(name)
            .cloned()
    }

    fn get_aggregate_meta(&self, name: &str) -> Option<Arc<AggregateUDF>> {
        self.planner.state.aggregate_functions().get(name).cloned()
    }

    fn get_window_meta(&self, name: &str) -> Option<Arc<WindowUDF>> {
        self.planner.state.window_functions().get(name).cloned()
    }

    fn get_variable_type(&self, _variable_names: &[String]) -> Option<DataType> {
        None
    }

    fn options(&self) -> &ConfigOptions {
        self.planner.state.config_options()
    }

    fn udf_names(&self) -> Vec<String> {
        self.planner
            .state
            .scalar_functions()
            .keys()
            .cloned()
            .collect()
    }

    fn higher_order_function_names(&self) -> Vec<String> {
        self.planner
            .state
            .higher_order_functions()
            .keys()
            .cloned()
            .collect()
    }

    fn udaf_names(&self) -> Vec<String> {
        self.planner
            .state
            .aggregate_functions()
            .keys()
            .cloned()
            .collect()
    }

    fn udwf_names(&self) -> Vec<String> {
        self.planner
            .state
            .window_functions()
            .keys()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::{LogicalPlanBuilder, lit};
    use datafusion::sql::sqlparser::ast::Statement;
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    use super::{Catalog, SqlPlanner, one_line};

    #[test]
    fn datafusion_errors_become_one_line() {
        let no_match = "Internal error: Function 'sum' failed to match any signature, errors: x.\nThis issue was likely caused by a bug. No function matches the given name and argument types 'sum(Utf8)'. You might need to add explicit type casts.\n\tCandidate functions:\n\tsum(Int64)";
        assert_eq!(
            one_line(no_match),
            "No function matches the given name and argument types 'sum(Utf8)'."
        );
        let own = "Error during planning: Execution error: Function 'cadence' user-defined coercion failed with: Error during planning: cadence needs a TIMESTAMP argument, got Float64. No function matches the given name and argument types 'cadence(Float64)'. You might need to add explicit type casts.\n\tCandidate functions:\n\tcadence(UserDefined)";
        assert_eq!(
            one_line(own),
            "cadence needs a TIMESTAMP argument, got Float64"
        );
        let chain = "Optimizer rule 'simplify_expressions' failed\ncaused by\nArrow error: Cast error: Cannot cast string 'abc' to value of Float64 type";
        assert_eq!(
            one_line(chain),
            "Cast error: Cannot cast string 'abc' to value of Float64 type"
        );
        assert_eq!(
            one_line("Error during planning: table 'datafusion.public.x' not found"),
            "table 'x' not found"
        );
    }

    #[test]
    fn vigils_planner_knows_the_window_functions() {
        let mut catalog = Catalog::default();
        let rows = LogicalPlanBuilder::values(vec![vec![lit("a"), lit("h1"), lit(1.0)]])
            .unwrap()
            .project(vec![
                datafusion::logical_expr::col("column1").alias("g"),
                datafusion::logical_expr::col("column2").alias("host"),
                datafusion::logical_expr::col("column3").alias("v"),
            ])
            .unwrap()
            .build()
            .unwrap();
        catalog.add_view("t", rows).unwrap();
        let sql = "SELECT host, dbscan(0.5, 2, v) OVER (PARTITION BY g) AS c, \
                       robust_z(v) OVER (PARTITION BY g) AS z FROM t";
        let Statement::Query(query) = Parser::parse_sql(&GenericDialect {}, sql)
            .unwrap()
            .remove(0)
        else {
            panic!("not a query")
        };
        let plan = SqlPlanner::new().plan_query(&catalog, &query).unwrap();
        let schema = plan.schema();
        assert_eq!(
            schema.field_with_unqualified_name("c").unwrap().data_type(),
            &DataType::Int64
        );
        assert_eq!(
            schema.field_with_unqualified_name("z").unwrap().data_type(),
            &DataType::Float64
        );
        let text = plan.display_indent().to_string();
        assert!(text.contains("dbscan("), "{text}");
        assert!(text.contains("robust_z("), "{text}");
    }
}
