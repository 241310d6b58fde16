use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, BooleanArray, UInt32Array};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{SchemaRef, TimestampMillisecondType};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::{GroupsAccumulatorAdapter, PhysicalExpr};
use datafusion::physical_plan::aggregates::group_values::{GroupValues, new_group_values};
use datafusion::physical_plan::aggregates::order::GroupOrdering;

use super::{Message, Operator};
use crate::error::Result;

/// Which grouping column carries the window, and how to get its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowColumn {
    /// Index among the grouping expressions.
    pub group_index: usize,
    /// Added to the column's value to get the window end: the window size
    /// when grouping by `window_start`, 0 when by `window_end`.
    pub end_offset_ms: i64,
}

/// One aggregate of the query, lowered to physical form.
#[derive(Debug, Clone)]
pub struct AggregateSpec {
    /// The aggregate function with its arguments.
    pub function: Arc<AggregateFunctionExpr>,
    /// Its `FILTER (WHERE ...)` clause, if any.
    pub filter: Option<Arc<dyn PhysicalExpr>>,
}

/// Grouped aggregation per event-time window.
///
/// State is kept per open window: DataFusion's `GroupValues` maps each key
/// to a dense group id and one `GroupsAccumulator` per aggregate holds the
/// partial results, so rows are folded in as they arrive and never buffered.
/// When the watermark reaches a window's end, the window's groups are
/// evaluated, emitted and dropped.
pub struct WindowAggregateOp {
    group_exprs: Vec<Arc<dyn PhysicalExpr>>,
    group_schema: SchemaRef,
    aggregates: Vec<AggregateSpec>,
    window: WindowColumn,
    open: BTreeMap<i64, WindowState>,
    schema: SchemaRef,
}

struct WindowState {
    groups: Box<dyn GroupValues>,
    accumulators: Vec<Box<dyn GroupsAccumulator>>,
    group_ids: Vec<usize>,
}

impl WindowAggregateOp {
    /// Groups by `group_exprs` (whose output fields are `group_schema`),
    /// computes `aggregates`, and emits rows of `schema` (groups, then
    /// aggregates) when windows close.
    pub fn new(
        group_exprs: Vec<Arc<dyn PhysicalExpr>>,
        group_schema: SchemaRef,
        aggregates: Vec<AggregateSpec>,
        window: WindowColumn,
        schema: SchemaRef,
    ) -> Self {
        Self {
            group_exprs,
            group_schema,
            aggregates,
            window,
            open: BTreeMap::new(),
            schema,
        }
    }

    fn new_window(&self) -> Result<WindowState> {
        let groups = new_group_values(self.group_schema.clone(), &GroupOrdering::None)?;
        let accumulators = self
            .aggregates
            .iter()
            .map(|a| new_accumulator(&a.function))
            .collect::<Result<_>>()?;
        Ok(WindowState {
            groups,
            accumulators,
            group_ids: Vec::new(),
        })
    }

    /// Rows of the batch split by window end; one slice covers the common
    /// case of a batch inside a single window without copying.
    fn rows_by_window(&self, groups: &[ArrayRef]) -> Vec<(i64, Option<UInt32Array>)> {
        let column = groups[self.window.group_index].as_primitive::<TimestampMillisecondType>();
        let values = column.values();
        let offset = self.window.end_offset_ms;
        if values.iter().all(|v| *v == values[0]) {
            return vec![(values[0] + offset, None)];
        }
        let mut by_end: HashMap<i64, Vec<u32>> = HashMap::new();
        for (row, v) in values.iter().enumerate() {
            by_end.entry(v + offset).or_default().push(row as u32);
        }
        by_end
            .into_iter()
            .map(|(end, rows)| (end, Some(UInt32Array::from(rows))))
            .collect()
    }

    fn emit(&self, mut state: WindowState) -> Result<RecordBatch> {
        let mut columns = state.groups.emit(EmitTo::All)?;
        for acc in &mut state.accumulators {
            columns.push(acc.evaluate(EmitTo::All)?);
        }
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }
}

fn new_accumulator(function: &Arc<AggregateFunctionExpr>) -> Result<Box<dyn GroupsAccumulator>> {
    if function.groups_accumulator_supported() {
        return Ok(function.create_groups_accumulator()?);
    }
    let function = function.clone();
    Ok(Box::new(GroupsAccumulatorAdapter::new(move || {
        function.create_accumulator()
    })))
}

fn evaluate(exprs: &[Arc<dyn PhysicalExpr>], batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    Ok(exprs
        .iter()
        .map(|e| e.evaluate(batch)?.into_array(batch.num_rows()))
        .collect::<datafusion::error::Result<_>>()?)
}

fn pick(arrays: &[ArrayRef], rows: Option<&UInt32Array>) -> Result<Vec<ArrayRef>> {
    match rows {
        None => Ok(arrays.to_vec()),
        Some(rows) => Ok(arrays
            .iter()
            .map(|a| take(a, rows, None))
            .collect::<std::result::Result<_, _>>()?),
    }
}

impl Operator for WindowAggregateOp {
    fn describe(&self) -> String {
        let groups: Vec<String> = self.group_exprs.iter().map(|e| e.to_string()).collect();
        let aggs: Vec<&str> = self.aggregates.iter().map(|a| a.function.name()).collect();
        format!(
            "window aggregate group by [{}] compute [{}]",
            groups.join(", "),
            aggs.join(", ")
        )
    }

    fn on_batch(&mut self, batch: RecordBatch, _out: &mut Vec<Message>) -> Result<()> {
        let groups = evaluate(&self.group_exprs, &batch)?;
        let args: Vec<Vec<ArrayRef>> = self
            .aggregates
            .iter()
            .map(|a| evaluate(&a.function.expressions(), &batch))
            .collect::<Result<_>>()?;
        let filters: Vec<Option<ArrayRef>> = self
            .aggregates
            .iter()
            .map(|a| {
                a.filter
                    .as_ref()
                    .map(|f| Ok(f.evaluate(&batch)?.into_array(batch.num_rows())?))
                    .transpose()
            })
            .collect::<Result<_>>()?;
        for (end, rows) in self.rows_by_window(&groups) {
            if !self.open.contains_key(&end) {
                let state = self.new_window()?;
                self.open.insert(end, state);
            }
            let state = self.open.get_mut(&end).expect("inserted above");
            let keys = pick(&groups, rows.as_ref())?;
            state.groups.intern(&keys, &mut state.group_ids)?;
            let total = state.groups.len();
            for (i, acc) in state.accumulators.iter_mut().enumerate() {
                let values = pick(&args[i], rows.as_ref())?;
                let filter = match &filters[i] {
                    Some(f) => Some(pick(std::slice::from_ref(f), rows.as_ref())?.remove(0)),
                    None => None,
                };
                let filter: Option<&BooleanArray> = filter.as_ref().map(|f| f.as_boolean());
                acc.update_batch(&values, &state.group_ids, filter, total)?;
            }
        }
        Ok(())
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        while let Some((&end, _)) = self.open.first_key_value() {
            if end > watermark {
                break;
            }
            let state = self.open.remove(&end).expect("present");
            let batch = self.emit(state)?;
            if batch.num_rows() > 0 {
                out.push(Message::Batch(batch));
            }
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }
}
