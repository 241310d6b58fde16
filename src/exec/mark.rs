use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, StringArray};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

use super::{Message, Operator};
use crate::connector::RowKind;
use crate::error::Result;
use crate::plan::EmitPolicy;

/// Appends the emit policy's marker column (`_op` or `_final`) from the
/// kind each batch of results carries.
pub struct MarkOp {
    policy: EmitPolicy,
    schema: SchemaRef,
}

impl MarkOp {
    /// Marks rows for `policy`; `schema` is the input's plus the marker.
    pub fn new(policy: EmitPolicy, schema: SchemaRef) -> Self {
        Self { policy, schema }
    }

    fn marker(&self, kind: RowKind, rows: usize) -> ArrayRef {
        match self.policy {
            EmitPolicy::Every { .. } => {
                Arc::new(BooleanArray::from(vec![kind != RowKind::Early; rows]))
            }
            _ => {
                let op = if kind == RowKind::Update { "+U" } else { "+I" };
                Arc::new(StringArray::from(vec![op; rows]))
            }
        }
    }
}

impl Operator for MarkOp {
    fn describe(&self) -> String {
        format!("mark rows for emit {}", self.policy)
    }

    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        self.on_changes(batch, RowKind::Insert, out)
    }

    fn on_changes(
        &mut self,
        batch: RecordBatch,
        kind: RowKind,
        out: &mut Vec<Message>,
    ) -> Result<()> {
        let mut columns = batch.columns().to_vec();
        columns.push(self.marker(kind, batch.num_rows()));
        out.push(Message::Changes(
            RecordBatch::try_new(self.schema.clone(), columns)?,
            kind,
        ));
        Ok(())
    }
}
