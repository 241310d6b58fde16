//! The `Emit` logical node: when a query's results leave it.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

/// Column added by `EMIT CHANGES`: `+I` for a new result, `+U` for a
/// changed one.
pub const OP_COLUMN: &str = "_op";
/// Column added by `EMIT EVERY`: false on early partial results, true on
/// the final one.
pub const FINAL_COLUMN: &str = "_final";

/// An emit policy (trigger).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd)]
pub enum EmitPolicy {
    /// One final row per window and key, when the window closes; with
    /// `late_updates`, a window that takes late rows (allowed lateness) fires
    /// again, and rows are marked `+I` (first result) or `+U` (update).
    OnWindowClose {
        /// Whether updates can follow the first result.
        late_updates: bool,
    },
    /// Early partial results every `interval_ms` of processing time, then
    /// the final row.
    Every {
        /// Period in milliseconds.
        interval_ms: i64,
    },
    /// A changelog: a row each time a result changes.
    Changes,
}

impl EmitPolicy {
    /// The column the policy adds to each result row, if any.
    pub fn marker(&self) -> Option<Field> {
        match self {
            EmitPolicy::OnWindowClose {
                late_updates: false,
            } => None,
            EmitPolicy::Every { .. } => Some(Field::new(FINAL_COLUMN, DataType::Boolean, false)),
            EmitPolicy::Changes | EmitPolicy::OnWindowClose { late_updates: true } => {
                Some(Field::new(OP_COLUMN, DataType::Utf8, false))
            }
        }
    }
}

impl fmt::Display for EmitPolicy {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            EmitPolicy::OnWindowClose {
                late_updates: false,
            } => f.write_str("on window close"),
            EmitPolicy::OnWindowClose { late_updates: true } => {
                f.write_str("on window close, then on late rows")
            }
            EmitPolicy::Every { interval_ms } => write!(f, "every {interval_ms} ms"),
            EmitPolicy::Changes => f.write_str("changes"),
        }
    }
}

/// Sits at the top of a query and says when its results are emitted; adds
/// the policy's marker column to the schema.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EmitNode {
    /// The query.
    pub input: LogicalPlan,
    /// The policy.
    pub policy: EmitPolicy,
    schema: DFSchemaRef,
}

impl EmitNode {
    /// Wraps `input` with `policy`.
    pub fn try_new(input: LogicalPlan, policy: EmitPolicy) -> Result<Self> {
        let mut fields: Vec<_> = input
            .schema()
            .iter()
            .map(|(q, f)| (q.cloned(), f.clone()))
            .collect();
        if let Some(marker) = policy.marker() {
            fields.push((None, Arc::new(marker)));
        }
        let schema = DFSchema::new_with_metadata(fields, input.schema().metadata().clone())?;
        Ok(Self {
            input,
            policy,
            schema: Arc::new(schema),
        })
    }
}

impl PartialOrd for EmitNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.policy.partial_cmp(&other.policy)
    }
}

impl UserDefinedLogicalNodeCore for EmitNode {
    fn name(&self) -> &str {
        "Emit"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Emit: {}", self.policy)
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        Self::try_new(inputs.swap_remove(0), self.policy)
    }
}
