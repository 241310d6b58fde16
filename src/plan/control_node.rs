//! The `Control` logical node: a stream's rows filtered by a control
//! stream that blocks and unblocks their keys while the query runs (see
//! [`crate::exec::ControlFilter`]). Planned from
//! `CONTROLLED(stream, control_stream, key_column)` in `FROM`.

use std::cmp::Ordering;
use std::fmt;

use datafusion::common::DFSchemaRef;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

/// The data rows of `data` whose key the rows of `control` do not block
/// at their event time. Its schema is the data's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ControlNode {
    /// The controlled stream, watermarked.
    pub data: LogicalPlan,
    /// The control stream, watermarked.
    pub control: LogicalPlan,
    /// The data's event-time column.
    pub data_time: usize,
    /// The data column whose values the control rows name.
    pub data_key: usize,
    /// The control stream's event-time column.
    pub control_time: usize,
    /// Its `key` column.
    pub control_key: usize,
    /// Its `action` column, if any.
    pub control_action: Option<usize>,
    /// Its `until` column, if any.
    pub control_until: Option<usize>,
}

impl ControlNode {
    fn columns(&self) -> [Option<usize>; 6] {
        [
            Some(self.data_time),
            Some(self.data_key),
            Some(self.control_time),
            Some(self.control_key),
            self.control_action,
            self.control_until,
        ]
    }
}

impl PartialOrd for ControlNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.columns().partial_cmp(&other.columns())
    }
}

impl UserDefinedLogicalNodeCore for ControlNode {
    fn name(&self) -> &str {
        "Control"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.data, &self.control]
    }

    fn schema(&self) -> &DFSchemaRef {
        self.data.schema()
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "Control: key {} by {}",
            self.data.schema().field(self.data_key).name(),
            self.control.schema().field(self.control_key).name()
        )
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, inputs: Vec<LogicalPlan>) -> Result<Self> {
        let [data, control]: [LogicalPlan; 2] = inputs.try_into().map_err(|_| {
            datafusion::error::DataFusionError::Plan("Control takes two inputs".into())
        })?;
        Ok(Self {
            data,
            control,
            ..self.clone()
        })
    }
}
