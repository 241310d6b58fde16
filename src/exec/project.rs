use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_expr::PhysicalExpr;

use super::{Message, Operator};
use crate::error::Result;

/// Computes one output column per expression.
pub struct ProjectOp {
    exprs: Vec<Arc<dyn PhysicalExpr>>,
    schema: SchemaRef,
}

impl ProjectOp {
    /// A projection producing `schema` from `exprs`, one column each.
    pub fn new(exprs: Vec<Arc<dyn PhysicalExpr>>, schema: SchemaRef) -> Self {
        Self { exprs, schema }
    }
}

impl Operator for ProjectOp {
    fn describe(&self) -> String {
        let exprs: Vec<String> = self.exprs.iter().map(|e| e.to_string()).collect();
        format!("project {}", exprs.join(", "))
    }

    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        let columns = self
            .exprs
            .iter()
            .map(|e| e.evaluate(&batch)?.into_array(batch.num_rows()))
            .collect::<datafusion::error::Result<Vec<_>>>()?;
        out.push(Message::Batch(RecordBatch::try_new(
            self.schema.clone(),
            columns,
        )?));
        Ok(())
    }
}
