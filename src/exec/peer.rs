//! Window functions over the peers of one window: every key's result of
//! the same window (`f(...) OVER (PARTITION BY window_end [, group])`).
//!
//! A window's results are all in once the watermark reaches the window's
//! end: its aggregate fires then, and every key's row comes before that
//! watermark. In one process they all come together, just before it; in a
//! group, the rows of one window come from several processes and can
//! straddle earlier watermarks. So the operator keeps the rows of windows
//! still open and, on each watermark, evaluates the window functions over
//! the rows of the windows it closes, with DataFusion's own window
//! operator: every
//! built-in and user-defined window function (`rank`, `median`,
//! `robust_z`, `dbscan`, ...) works over peers as it does over a table.
//! The physical plan is made once; each evaluation swaps in the rows.

use std::sync::Arc;

use datafusion::arrow::array::BooleanArray;
use datafusion::arrow::compute::kernels::boolean::not;
use datafusion::arrow::compute::{concat_batches, filter_record_batch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::memory::MemorySourceConfig;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;

use super::{Message, Operator};
use crate::error::Result;
use crate::state::OperatorState;

/// Where a row of the input says when its window ends: the value of a
/// window column, plus the window's length when that column is the
/// window's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowEnd {
    /// The window column's index in the input.
    pub column: usize,
    /// Added to the column's value (milliseconds) to give the end.
    pub offset_ms: i64,
}

/// Evaluates peer window functions when each window's results are in.
pub struct PeerOp {
    /// The window plan over a placeholder input.
    plan: Arc<dyn ExecutionPlan>,
    task: Arc<TaskContext>,
    input: SchemaRef,
    output: SchemaRef,
    /// The rows of the windows not closed yet.
    rows: Vec<RecordBatch>,
    end: WindowEnd,
    description: String,
}

impl PeerOp {
    /// An operator running `plan` (whose one leaf reads rows of `input`)
    /// and producing rows of `output`, over the windows each watermark
    /// closes (`end` says where each row's window ends).
    pub fn new(
        plan: Arc<dyn ExecutionPlan>,
        task: Arc<TaskContext>,
        schemas: (SchemaRef, SchemaRef),
        end: WindowEnd,
        description: String,
    ) -> Self {
        let (input, output) = schemas;
        Self {
            plan,
            task,
            input,
            output,
            rows: Vec::new(),
            end,
            description,
        }
    }

    /// Takes the rows of the windows that end at or before `watermark`,
    /// keeping the others.
    fn take_closed(&mut self, watermark: i64) -> Result<Option<RecordBatch>> {
        if self.rows.is_empty() {
            return Ok(None);
        }
        let rows = concat_batches(&self.input, &self.rows)?;
        let ends = super::alert::event_times(rows.column(self.end.column))?;
        let closed: BooleanArray = ends
            .iter()
            .map(|&end| Some(end.saturating_add(self.end.offset_ms) <= watermark))
            .collect();
        let open = filter_record_batch(&rows, &not(&closed)?)?;
        self.rows = (open.num_rows() > 0).then_some(open).into_iter().collect();
        let closed = filter_record_batch(&rows, &closed)?;
        Ok((closed.num_rows() > 0).then_some(closed))
    }

    /// The window functions over `rows` (of closed windows).
    fn evaluate(&self, rows: RecordBatch) -> Result<RecordBatch> {
        let leaf = MemorySourceConfig::try_new_exec(&[vec![rows]], self.input.clone(), None)?;
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
        super::conform(&all, &self.output)
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
        if let Some(rows) = self.take_closed(watermark)? {
            let batch = self.evaluate(rows)?;
            if batch.num_rows() > 0 {
                out.push(Message::Batch(batch));
            }
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
