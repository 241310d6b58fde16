//! The `Watermark` logical node: where a stream's event-time clock starts.

use std::cmp::Ordering;
use std::fmt;

use datafusion::common::DFSchemaRef;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

/// Marks the rows below it with a watermark: the largest event time seen so
/// far minus `delay_ms`. It passes rows through unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WatermarkNode {
    /// The stream scan it sits on.
    pub input: LogicalPlan,
    /// Index of the event-time column in the input schema.
    pub time_column: usize,
    /// Declared bounded out-of-orderness.
    pub delay_ms: i64,
}

impl WatermarkNode {
    /// Name of the event-time column.
    pub fn time_column_name(&self) -> &str {
        self.input.schema().field(self.time_column).name()
    }
}

impl PartialOrd for WatermarkNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        (self.time_column, self.delay_ms).partial_cmp(&(other.time_column, other.delay_ms))
    }
}

impl UserDefinedLogicalNodeCore for WatermarkNode {
    fn name(&self) -> &str {
        "Watermark"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        self.input.schema()
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "Watermark: {} - {} ms",
            self.time_column_name(),
            self.delay_ms
        )
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        Ok(Self {
            input: inputs.swap_remove(0),
            time_column: self.time_column,
            delay_ms: self.delay_ms,
        })
    }
}
