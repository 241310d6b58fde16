//! Batch queries: a bounded question over inputs that end (`SELECT
//! count(*) FROM metrics` over a file) is answered once, at the end of its
//! input, by DataFusion's own physical plan of the query.
//!
//! The planner replaces each stream scan of the query by a scan of a
//! [`BatchInput`] placeholder. The operator collects every row of each input
//! and, when the final watermark says every input has ended, swaps each
//! placeholder for an in-memory table of the rows, plans the query with
//! DataFusion and runs it. Sorting, joins of any kind and aggregates
//! without a window all work as they do over a table; nothing is evaluated
//! here.

use std::sync::Arc;

use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::{MemTable, provider_as_source};
use datafusion::execution::{SessionState, TaskContext};
use datafusion::logical_expr::{LogicalPlan, TableScan, TableSource};
use datafusion::physical_plan::{ExecutionPlan, collect};

use super::{END_OF_INPUT, MergeOperator, Message, Operator};
use crate::error::{Error, Result};
use crate::state::OperatorState;

/// The scan of input `index` of a batch query, before its rows are in.
#[derive(Debug)]
pub struct BatchInput {
    /// Which input of the query (the order of the graph's inputs).
    pub index: usize,
    /// The schema of its rows.
    pub schema: SchemaRef,
}

impl TableSource for BatchInput {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

/// Collects a batch query's inputs and runs the query when they have all
/// ended.
pub struct BatchOp {
    /// The query, its stream scans reading [`BatchInput`]s.
    plan: LogicalPlan,
    state: SessionState,
    /// Per input, the rows so far.
    inputs: Vec<(SchemaRef, Vec<RecordBatch>)>,
    output: SchemaRef,
    description: String,
    done: bool,
}

impl BatchOp {
    /// An operator for `plan`, whose scans read [`BatchInput`]s with the
    /// schemas `inputs` (by index), producing rows of `output`. The query is
    /// planned once over empty inputs, so what DataFusion cannot run is an
    /// error now rather than at the end of the input.
    pub fn try_new(
        plan: LogicalPlan,
        state: SessionState,
        inputs: Vec<SchemaRef>,
        output: SchemaRef,
    ) -> Result<Self> {
        let mut op = Self {
            plan,
            state,
            inputs: inputs.into_iter().map(|s| (s, Vec::new())).collect(),
            output,
            description: String::new(),
            done: false,
        };
        let physical = op.physical_plan(&vec![Vec::new(); op.inputs.len()])?;
        op.description = format!(
            "batch query at the end of input [{}]",
            node_names(physical.as_ref()).join(" <- ")
        );
        Ok(op)
    }

    /// DataFusion's physical plan of the query over `rows` (per input).
    fn physical_plan(&self, rows: &[Vec<RecordBatch>]) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = self
            .plan
            .clone()
            .transform_up(|node| {
                let LogicalPlan::TableScan(scan) = &node else {
                    return Ok(Transformed::no(node));
                };
                let Some(input) = scan.source.as_ref().downcast_ref::<BatchInput>() else {
                    return Ok(Transformed::no(node));
                };
                let table =
                    MemTable::try_new(input.schema.clone(), vec![rows[input.index].clone()])?;
                Ok(Transformed::yes(LogicalPlan::TableScan(TableScan {
                    source: provider_as_source(Arc::new(table)),
                    ..scan.clone()
                })))
            })?
            .data;
        // The plan is in-memory and single-partition (the planner's session
        // has one target partition): nothing in it waits on I/O or spawns.
        Ok(futures::executor::block_on(
            self.state.create_physical_plan(&plan),
        )?)
    }

    /// Runs the query over the collected rows.
    fn run(&mut self) -> Result<Vec<RecordBatch>> {
        let rows = self
            .inputs
            .iter_mut()
            .map(|(schema, batches)| {
                let all = concat_batches(schema, &std::mem::take(batches))?;
                Ok(vec![all])
            })
            .collect::<Result<Vec<_>>>()?;
        let physical = self.physical_plan(&rows)?;
        let batches = execute(physical, self.state.task_ctx())?;
        batches
            .into_iter()
            .filter(|b| b.num_rows() > 0)
            .map(|b| super::conform(&b, &self.output))
            .collect()
    }

    fn collect_rows(&mut self, input: usize, batch: RecordBatch) -> Result<()> {
        let (_, batches) = self
            .inputs
            .get_mut(input)
            .ok_or_else(|| Error::Plan(format!("batch query: no input {input}")))?;
        batches.push(batch);
        Ok(())
    }

    fn watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        if watermark == END_OF_INPUT && !self.done {
            self.done = true;
            out.extend(self.run()?.into_iter().map(Message::Batch));
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    /// Every input's rows so far, one table each (`input0`, `input1`, ...),
    /// stored whole: the query runs over all of them at once.
    fn state(&self) -> Result<OperatorState> {
        let mut state = OperatorState::new();
        for (index, (schema, batches)) in self.inputs.iter().enumerate() {
            state.add(
                &format!("input{index}"),
                concat_batches(schema, batches)?,
                Vec::new(),
            );
        }
        state.add_scalars("meta", &[("done", Some(i64::from(self.done)))]);
        Ok(state)
    }

    fn restore_state(&mut self, state: OperatorState) -> Result<()> {
        for (index, (schema, batches)) in self.inputs.iter_mut().enumerate() {
            let rows = state.table_of(&format!("input{index}"), schema)?;
            *batches = (rows.num_rows() > 0).then_some(rows).into_iter().collect();
        }
        self.done = state.scalar("meta", "done")? == Some(1);
        Ok(())
    }
}

/// Answers a query that reads no stream (`SELECT 1`, `SELECT now()`) at
/// once, as DataFusion plans it: as in any SQL shell, it is a one-off
/// question with nothing to wait for.
pub fn answer_once(plan: &LogicalPlan) -> Result<Vec<RecordBatch>> {
    let mut state = datafusion::execution::SessionStateBuilder::new()
        .with_default_features()
        .build();
    crate::functions::register(&mut state)?;
    // Nothing in a plan without a table waits on I/O.
    let physical = futures::executor::block_on(state.create_physical_plan(plan))?;
    execute(physical, state.task_ctx())
}

/// Runs `plan` to completion on a thread of its own, with a tokio runtime
/// of its own. A plan may spawn tasks (a `UnionExec` under a
/// `CoalescePartitionsExec` reads its inputs in tasks, a large sort merges
/// its runs in buffered tasks); spawned from an operator's worker, those
/// would wait in that worker's own queue while the worker waits for them,
/// and the query would hang.
pub(crate) fn execute(
    plan: Arc<dyn ExecutionPlan>,
    task: Arc<TaskContext>,
) -> Result<Vec<RecordBatch>> {
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("vigil-batch".into())
            .spawn_scoped(scope, move || -> Result<Vec<RecordBatch>> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .map_err(|e| Error::io("starting a batch query's runtime", e))?;
                Ok(runtime.block_on(collect(plan, task))?)
            })
            .map_err(|e| Error::io("starting a batch query's thread", e))?;
        thread
            .join()
            .unwrap_or_else(|_| Err(Error::Plan("a batch query panicked".into())))
    })
}

/// The node names of `plan`, root first, down its first children.
fn node_names(plan: &dyn ExecutionPlan) -> Vec<String> {
    let mut names = vec![plan.name().to_string()];
    let children = plan.children();
    match children.as_slice() {
        [] => {}
        [only] => names.extend(node_names(only.as_ref())),
        several => {
            let inner: Vec<String> = several
                .iter()
                .map(|c| node_names(c.as_ref()).join(" <- "))
                .collect();
            names.push(format!("({})", inner.join(", ")));
        }
    }
    names
}

impl Operator for BatchOp {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn on_batch(&mut self, batch: RecordBatch, _out: &mut Vec<Message>) -> Result<()> {
        self.collect_rows(0, batch)
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        self.watermark(watermark, out)
    }

    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        Ok(Some(self.state()?))
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        self.restore_state(state)
    }
}

impl MergeOperator for BatchOp {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn on_rows(&mut self, input: usize, batch: RecordBatch) -> Result<()> {
        self.collect_rows(input, batch)
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        self.watermark(watermark, out)
    }

    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        Ok(Some(self.state()?))
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        self.restore_state(state)
    }
}
