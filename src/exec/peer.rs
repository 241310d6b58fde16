//! Window functions over the peers of one window: every key's result of
//! the same window (`f(...) OVER (PARTITION BY window_end [, group])`).
//!
//! A window's results all arrive together, when the watermark closes it,
//! and before that watermark. So the operator keeps the rows that came
//! since the last watermark and, on the watermark, evaluates the window
//! functions over them with DataFusion's own window operator: every
//! built-in and user-defined window function (`rank`, `median`,
//! `robust_z`, `dbscan`, ...) works over peers as it does over a table.
//! The physical plan is made once; each evaluation swaps in the rows.

use std::sync::Arc;

use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::memory::MemorySourceConfig;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;

use super::{Message, Operator};
use crate::error::Result;
use crate::state::OperatorState;

/// Evaluates peer window functions when each window's results are in.
pub struct PeerOp {
    /// The window plan over a placeholder input.
    plan: Arc<dyn ExecutionPlan>,
    task: Arc<TaskContext>,
    input: SchemaRef,
    output: SchemaRef,
    rows: Vec<RecordBatch>,
    description: String,
}

impl PeerOp {
    /// An operator running `plan` (whose one leaf reads rows of `input`)
    /// and producing rows of `output`.
    pub fn new(
        plan: Arc<dyn ExecutionPlan>,
        task: Arc<TaskContext>,
        input: SchemaRef,
        output: SchemaRef,
        description: String,
    ) -> Self {
        Self {
            plan,
            task,
            input,
            output,
            rows: Vec::new(),
            description,
        }
    }

    fn evaluate(&mut self) -> Result<Option<RecordBatch>> {
        if self.rows.is_empty() {
            return Ok(None);
        }
        let rows = std::mem::take(&mut self.rows);
        let leaf = MemorySourceConfig::try_new_exec(&[rows], self.input.clone(), None)?;
        let plan = self
            .plan
            .clone()
            .transform_up(|node| {
                Ok(match node.children().is_empty() {
                    true => Transformed::yes(leaf.clone() as Arc<dyn ExecutionPlan>),
                    false => Transformed::no(node),
                })
            })?
            .data;
        // Even in memory and in one partition, a plan over many rows spawns
        // tasks (its sort merges runs in buffered tasks): it runs on a
        // thread and runtime of its own, not on this operator's worker.
        let batches = super::batch::execute(plan, self.task.clone())?;
        let all = concat_batches(&self.plan.schema(), &batches)?;
        Ok(Some(super::conform(&all, &self.output)?))
    }
}

impl Operator for PeerOp {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn on_batch(&mut self, batch: RecordBatch, _out: &mut Vec<Message>) -> Result<()> {
        self.rows.push(batch);
        Ok(())
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        if let Some(batch) = self.evaluate()?
            && batch.num_rows() > 0
        {
            out.push(Message::Batch(batch));
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    /// The rows of the windows not closed yet. They are stored whole, not
    /// by key: the peers of one window are evaluated together.
    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        let mut state = OperatorState::new();
        state.add("rows", concat_batches(&self.input, &self.rows)?, Vec::new());
        Ok(Some(state))
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        let rows = state.table_of("rows", &self.input)?;
        self.rows = (rows.num_rows() > 0).then_some(rows).into_iter().collect();
        Ok(())
    }
}
