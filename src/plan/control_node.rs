//! The `Control` logical node: a stream's rows as a control stream changes
//! them while the query runs (the executor's `ControlFilter` runs it). Planned
//! from `CONTROLLED(stream, control_stream, key_column)` (blocks and
//! unblocks keys) and `PARAMS(stream, control_stream, 'name', default,
//! ...)` (parameters the rows carry as columns) in `FROM`.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::{DFSchema, DFSchemaRef, ScalarValue};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

/// What the control rows do.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub enum ControlKind {
    /// Block and unblock the keys of data column `data_key`; the control
    /// stream's `action` and `until` columns, where it has them.
    Block {
        /// The data column whose values the control rows name.
        data_key: usize,
        /// The control `action` column.
        action: Option<usize>,
        /// The control `until` column.
        until: Option<usize>,
    },
    /// Set parameters: each one's name and default (a `Float64`), and the
    /// control `value` column.
    Params {
        /// Name and default of each parameter, in column order.
        params: Vec<(String, ScalarValue)>,
        /// The control `value` column.
        value: usize,
    },
}

/// The rows of `data` as the rows of `control` change them at their
/// event time. Its schema is the data's, plus a column per parameter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ControlNode {
    /// The controlled stream, watermarked.
    pub data: LogicalPlan,
    /// The control stream, watermarked.
    pub control: LogicalPlan,
    /// The data's event-time column.
    pub data_time: usize,
    /// The control stream's event-time column.
    pub control_time: usize,
    /// Its column of keys or parameter names.
    pub control_key: usize,
    /// What its rows do.
    pub kind: ControlKind,
    schema: DFSchemaRef,
}

impl ControlNode {
    /// The node, its schema the data's and a `DOUBLE` per parameter.
    pub fn try_new(
        data: LogicalPlan,
        control: LogicalPlan,
        data_time: usize,
        control_time: usize,
        control_key: usize,
        kind: ControlKind,
    ) -> Result<Self> {
        let mut fields: Vec<_> = data
            .schema()
            .iter()
            .map(|(q, f)| (q.cloned(), f.clone()))
            .collect();
        if let ControlKind::Params { params, .. } = &kind {
            for (name, _) in params {
                fields.push((None, Arc::new(Field::new(name, DataType::Float64, false))));
            }
        }
        let schema = DFSchema::new_with_metadata(fields, data.schema().metadata().clone())?;
        Ok(Self {
            data,
            control,
            data_time,
            control_time,
            control_key,
            kind,
            schema: Arc::new(schema),
        })
    }
}

impl PartialOrd for ControlNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        let key = |n: &Self| (n.data_time, n.control_time, n.control_key, n.kind.clone());
        key(self).partial_cmp(&key(other))
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
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let by = self.control.schema().field(self.control_key).name();
        match &self.kind {
            ControlKind::Block { data_key, .. } => write!(
                f,
                "Control: key {} by {by}",
                self.data.schema().field(*data_key).name()
            ),
            ControlKind::Params { params, .. } => {
                let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
                write!(f, "Control: parameters {} by {by}", names.join(", "))
            }
        }
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
