//! The `Invariant` logical node: a query's rows, each judged after training
//! against what was learned of one column per key.
//!
//! Its schema is the query's columns followed by `violation` (BOOLEAN: the
//! row breaks the invariant) and `learned` (TEXT: the set or range the row
//! was judged against). Rows of the training period are learned, not
//! emitted.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use crate::sql::Learn;

/// Column that says whether a row breaks the invariant.
pub const VIOLATION_COLUMN: &str = "violation";
/// Column that shows what was learned.
pub const LEARNED_COLUMN: &str = "learned";

/// How long an invariant trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd)]
pub enum Training {
    /// This much event time from the first row the invariant sees (over
    /// all keys): a key first seen later has learned nothing.
    Interval(i64),
    /// Each key's first n rows (windows).
    Rows(u64),
}

/// An invariant, in input column indices.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct InvariantSpec {
    /// The invariant's name.
    pub name: String,
    /// Set or range.
    pub learn: Learn,
    /// The column learned.
    pub column: usize,
    /// Key columns.
    pub keys: Vec<usize>,
    /// The event-time column.
    pub event_time: usize,
    /// The training period.
    pub training: Training,
    /// Keep learning from every row after training.
    pub online: bool,
}

/// Judges a query's rows against an invariant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InvariantNode {
    /// The query.
    pub input: LogicalPlan,
    /// The invariant.
    pub spec: InvariantSpec,
    schema: DFSchemaRef,
}

impl InvariantNode {
    /// Wraps `input` with `spec`.
    pub fn try_new(input: LogicalPlan, spec: InvariantSpec) -> Result<Self> {
        let mut fields: Vec<_> = input
            .schema()
            .iter()
            .map(|(q, f)| (q.cloned(), f.clone()))
            .collect();
        fields.push((
            None,
            Arc::new(Field::new(VIOLATION_COLUMN, DataType::Boolean, false)),
        ));
        fields.push((
            None,
            Arc::new(Field::new(LEARNED_COLUMN, DataType::Utf8, false)),
        ));
        let schema = DFSchema::new_with_metadata(fields, input.schema().metadata().clone())?;
        Ok(Self {
            input,
            spec,
            schema: Arc::new(schema),
        })
    }
}

impl PartialOrd for InvariantNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.spec.partial_cmp(&other.spec)
    }
}

impl UserDefinedLogicalNodeCore for InvariantNode {
    fn name(&self) -> &str {
        "Invariant"
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
        let input = self.input.schema();
        let name = |i: usize| input.field(i).name().clone();
        let keys: Vec<_> = self.spec.keys.iter().map(|&i| name(i)).collect();
        let learn = match self.spec.learn {
            Learn::Set => "set",
            Learn::Range => "range",
        };
        write!(
            f,
            "Invariant: {} {learn} of {} by [{}], train for ",
            self.spec.name,
            name(self.spec.column),
            keys.join(", ")
        )?;
        match self.spec.training {
            Training::Interval(ms) => write!(f, "{ms} ms")?,
            Training::Rows(n) => write!(f, "{n} windows")?,
        }
        f.write_str(if self.spec.online {
            ", online"
        } else {
            ", offline"
        })
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        Self::try_new(inputs.swap_remove(0), self.spec.clone())
    }
}
