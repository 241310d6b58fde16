//! The `WindowAssign` logical node: event-time windows for each row.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::Field;
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use super::catalog::TIME_TYPE;

/// Name of the column holding a row's window start.
pub const WINDOW_START: &str = "window_start";
/// Name of the column holding a row's window end (exclusive).
pub const WINDOW_END: &str = "window_end";

/// The kind and size of an event-time window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd)]
pub enum WindowSpec {
    /// `TUMBLE`: `[k*size + offset, (k+1)*size + offset)`.
    Tumble {
        /// Window length in milliseconds.
        size_ms: i64,
        /// Shift of the window grid from the epoch, in milliseconds.
        offset_ms: i64,
    },
}

impl WindowSpec {
    /// Start of the window holding event time `t`.
    pub fn start_of(&self, t: i64) -> i64 {
        match *self {
            WindowSpec::Tumble { size_ms, offset_ms } => {
                (t - offset_ms).div_euclid(size_ms) * size_ms + offset_ms
            }
        }
    }

    /// Length of every window.
    pub fn size_ms(&self) -> i64 {
        match *self {
            WindowSpec::Tumble { size_ms, .. } => size_ms,
        }
    }
}

impl fmt::Display for WindowSpec {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            WindowSpec::Tumble {
                size_ms,
                offset_ms: 0,
            } => write!(f, "tumble({size_ms} ms)"),
            WindowSpec::Tumble { size_ms, offset_ms } => {
                write!(f, "tumble({size_ms} ms, offset {offset_ms} ms)")
            }
        }
    }
}

/// Adds `window_start` and `window_end` to every row of its input, and drops
/// rows whose every window has already closed (late rows).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WindowNode {
    /// The watermarked stream below.
    pub input: LogicalPlan,
    /// Index of the event-time column in the input schema.
    pub time_column: usize,
    /// Window kind and size.
    pub spec: WindowSpec,
    schema: DFSchemaRef,
}

impl WindowNode {
    /// Builds the node; its schema is the input's plus the two window columns.
    pub fn try_new(input: LogicalPlan, time_column: usize, spec: WindowSpec) -> Result<Self> {
        let mut fields: Vec<_> = input
            .schema()
            .iter()
            .map(|(q, f)| (q.cloned(), f.clone()))
            .collect();
        for name in [WINDOW_START, WINDOW_END] {
            fields.push((None, Arc::new(Field::new(name, TIME_TYPE, false))));
        }
        let schema = DFSchema::new_with_metadata(fields, input.schema().metadata().clone())?;
        Ok(Self {
            input,
            time_column,
            spec,
            schema: Arc::new(schema),
        })
    }

    /// Index of `window_start` in this node's schema (`window_end` follows).
    pub fn window_start_index(&self) -> usize {
        self.input.schema().fields().len()
    }
}

impl PartialOrd for WindowNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        (self.time_column, self.spec).partial_cmp(&(other.time_column, other.spec))
    }
}

impl UserDefinedLogicalNodeCore for WindowNode {
    fn name(&self) -> &str {
        "WindowAssign"
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
        let time = self.input.schema().field(self.time_column).name();
        write!(f, "WindowAssign: {} on {time}", self.spec)
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        Self::try_new(inputs.swap_remove(0), self.time_column, self.spec)
    }
}
