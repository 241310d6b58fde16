//! Planning `CREATE INVARIANT`.

use std::sync::Arc;

use datafusion::logical_expr::{Extension, LogicalPlan};

use super::alert::{event_time_column, keys_by_name, with_watermarks};
use super::alert_node::key_columns;
use super::invariant_node::{InvariantNode, InvariantSpec, Training};
use super::{Catalog, SqlPlanner, plan_error};
use crate::error::{Error, Result};
use crate::sql::{Hold, InvariantClause, Learn};

impl SqlPlanner {
    /// Puts an [`InvariantNode`] named `name` on top of `query`.
    pub fn plan_invariant(
        &self,
        catalog: &Catalog,
        query: LogicalPlan,
        clause: &InvariantClause,
        name: &str,
    ) -> Result<LogicalPlan> {
        let query = with_watermarks(query)?;
        let schema = query.schema();
        let keys = match clause.by.is_empty() {
            true => key_columns(&query),
            false => keys_by_name(schema, &clause.by, "LEARN ... BY")?,
        };
        let column = keys_by_name(schema, std::slice::from_ref(&clause.column), "LEARN ... OF")?[0];
        let data_type = schema.field(column).data_type();
        if clause.learn == Learn::Range && !data_type.is_numeric() {
            return Err(Error::Plan(format!(
                "LEARN RANGE OF {} needs a number, but it is {data_type}; use LEARN SET OF",
                clause.column
            )));
        }
        let training = match &clause.train {
            Hold::Windows(n) => Training::Rows(*n),
            Hold::Interval(expr) => match self.interval_ms(catalog, expr)? {
                ms if ms > 0 => Training::Interval(ms),
                _ => {
                    return Err(Error::Plan(format!(
                        "TRAIN FOR needs a positive interval, got {expr}"
                    )));
                }
            },
        };
        let spec = InvariantSpec {
            name: name.to_string(),
            learn: clause.learn,
            column,
            keys,
            event_time: event_time_column(&query)?,
            training,
            online: clause.online,
        };
        let node = InvariantNode::try_new(query, spec).map_err(plan_error)?;
        Ok(LogicalPlan::Extension(Extension {
            node: Arc::new(node),
        }))
    }
}
