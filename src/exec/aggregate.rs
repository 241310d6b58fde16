//! What every aggregating operator shares: the lowered aggregates, their
//! evaluated inputs, and accumulator creation.

use std::sync::Arc;

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::logical_expr::GroupsAccumulator;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::{GroupsAccumulatorAdapter, PhysicalExpr};

use crate::error::Result;

/// One aggregate of the query, lowered to physical form.
#[derive(Debug, Clone)]
pub struct AggregateSpec {
    /// The aggregate function with its arguments.
    pub function: Arc<AggregateFunctionExpr>,
    /// Its `FILTER (WHERE ...)` clause, if any.
    pub filter: Option<Arc<dyn PhysicalExpr>>,
}

/// The aggregates' arguments and filters, evaluated over one batch.
pub(super) struct AggregateInputs {
    /// Per aggregate, its argument columns.
    pub args: Vec<Vec<ArrayRef>>,
    /// Per aggregate, its filter column, if it has a filter.
    pub filters: Vec<Option<ArrayRef>>,
}

impl AggregateInputs {
    /// Evaluates every aggregate's arguments and filter over `batch`.
    pub fn evaluate(aggregates: &[AggregateSpec], batch: &RecordBatch) -> Result<Self> {
        let args = aggregates
            .iter()
            .map(|a| evaluate_all(&a.function.expressions(), batch))
            .collect::<Result<_>>()?;
        let filters = aggregates
            .iter()
            .map(|a| {
                a.filter
                    .as_ref()
                    .map(|f| Ok(evaluate_all(std::slice::from_ref(f), batch)?.remove(0)))
                    .transpose()
            })
            .collect::<Result<_>>()?;
        Ok(Self { args, filters })
    }
}

/// Evaluates every expression over the batch.
pub(super) fn evaluate_all(
    exprs: &[Arc<dyn PhysicalExpr>],
    batch: &RecordBatch,
) -> Result<Vec<ArrayRef>> {
    Ok(exprs
        .iter()
        .map(|e| e.evaluate(batch)?.into_array(batch.num_rows()))
        .collect::<datafusion::error::Result<_>>()?)
}

/// A groups accumulator for `function`, adapting a per-group accumulator
/// where DataFusion has no grouped one (median, percentiles).
pub(super) fn new_accumulator(
    function: &Arc<AggregateFunctionExpr>,
) -> Result<Box<dyn GroupsAccumulator>> {
    if function.groups_accumulator_supported() {
        return Ok(function.create_groups_accumulator()?);
    }
    let function = function.clone();
    Ok(Box::new(GroupsAccumulatorAdapter::new(move || {
        function.create_accumulator()
    })))
}

/// `EXPLAIN` text for an aggregating operator: its kind, grouping
/// expressions and aggregates.
pub(super) fn describe(
    kind: &str,
    groups: &[Arc<dyn PhysicalExpr>],
    aggregates: &[AggregateSpec],
) -> String {
    let groups: Vec<String> = groups.iter().map(|e| e.to_string()).collect();
    let aggregates: Vec<&str> = aggregates.iter().map(|a| a.function.name()).collect();
    format!(
        "{kind} group by [{}] compute [{}]",
        groups.join(", "),
        aggregates.join(", ")
    )
}
