use std::sync::Arc;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_expr::PhysicalExpr;

use super::{Message, Operator};
use crate::error::Result;

/// Keeps the rows for which a predicate is true (NULL counts as false).
pub struct FilterOp {
    predicate: Arc<dyn PhysicalExpr>,
}

impl FilterOp {
    /// A filter on `predicate`, which must evaluate to booleans.
    pub fn new(predicate: Arc<dyn PhysicalExpr>) -> Self {
        Self { predicate }
    }
}

impl Operator for FilterOp {
    fn describe(&self) -> String {
        format!("filter {}", self.predicate)
    }

    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        let mask = self
            .predicate
            .evaluate(&batch)?
            .into_array(batch.num_rows())?;
        let filtered = filter_record_batch(&batch, mask.as_boolean())?;
        if filtered.num_rows() > 0 {
            out.push(Message::Batch(filtered));
        }
        Ok(())
    }
}
