//! What every aggregating operator shares: the lowered aggregates, their
//! evaluated inputs, accumulator creation, and the pieces of their
//! checkpoint state tables.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, BooleanArray, Int64Array};
use datafusion::arrow::compute::{SortColumn, cast, lexsort_to_indices, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::logical_expr::GroupsAccumulator;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::{GroupsAccumulatorAdapter, PhysicalExpr};

use crate::error::{Error, Result};
use crate::state::OperatorState;

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
        // An ordered aggregate (`last_value(x ORDER BY ts)`) reads its
        // ordering columns after its arguments, as DataFusion's own
        // aggregate operator passes them.
        let args = aggregates
            .iter()
            .map(|a| {
                let mut exprs = a.function.expressions();
                exprs.extend(a.function.order_bys().iter().map(|o| o.expr.clone()));
                evaluate_all(&exprs, batch)
            })
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

/// The state columns of `aggregates` as a state table holds them: per
/// aggregate its accumulator's state fields, named after the aggregate's
/// position so two aggregates of the same name stay apart. Every column is
/// nullable: a group may hold no value yet.
pub(super) fn state_fields(aggregates: &[AggregateSpec]) -> Result<Vec<Field>> {
    let mut fields = Vec::new();
    for (i, aggregate) in aggregates.iter().enumerate() {
        for field in aggregate.function.state_fields()? {
            let name = format!("{i}:{}", field.name());
            fields.push(Field::new(name, field.data_type().clone(), true));
        }
    }
    Ok(fields)
}

/// How many state columns each aggregate has, in order.
pub(super) fn state_widths(aggregates: &[AggregateSpec]) -> Result<Vec<usize>> {
    aggregates
        .iter()
        .map(|a| Ok(a.function.state_fields()?.len()))
        .collect()
}

/// The fields of `schema` as nullable columns of a state table.
pub(super) fn nullable_fields(schema: &Schema) -> Vec<Field> {
    schema
        .fields()
        .iter()
        .map(|f| Field::new(f.name(), f.data_type().clone(), true))
        .collect()
}

/// A state table of `columns` under `fields`, cast where an accumulator
/// typed a column (a list's item field) otherwise than it declares.
pub(super) fn state_batch(fields: Vec<Field>, columns: Vec<ArrayRef>) -> Result<RecordBatch> {
    let columns = columns
        .into_iter()
        .zip(&fields)
        .map(|(c, f)| match c.data_type() == f.data_type() {
            true => Ok(c),
            false => cast(&c, f.data_type()),
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let schema = Arc::new(Schema::new(fields));
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// Table `name` of a checkpoint, refused unless its columns are those the
/// plan expects (same names and types, in order): a changed query must
/// not read state it does not understand.
pub(super) fn checked_table(
    state: &OperatorState,
    name: &str,
    expected: &[Field],
) -> Result<RecordBatch> {
    let table = state.table(name)?;
    let found = table.schema();
    let same = found.fields().len() == expected.len()
        && found
            .fields()
            .iter()
            .zip(expected)
            .all(|(f, e)| f.name() == e.name() && f.data_type() == e.data_type());
    if !same {
        let names = |fields: Vec<String>| fields.join(", ");
        return Err(Error::Plan(format!(
            "state table '{name}' has columns [{}], the query expects [{}]",
            names(found.fields().iter().map(|f| f.to_string()).collect()),
            names(expected.iter().map(|f| f.to_string()).collect()),
        )));
    }
    Ok(table.clone())
}

/// `batch` sorted by `columns`, ascending: state rows back in the order
/// the operator held them, however the checkpoint stored them.
pub(super) fn sorted_by(batch: &RecordBatch, columns: &[usize]) -> Result<RecordBatch> {
    if batch.num_rows() < 2 {
        return Ok(batch.clone());
    }
    let sort: Vec<SortColumn> = columns
        .iter()
        .map(|&i| SortColumn {
            values: batch.column(i).clone(),
            options: None,
        })
        .collect();
    let indices = lexsort_to_indices(&sort, None)?;
    Ok(take_record_batch(batch, &indices)?)
}

/// Column `index` of a state table as 64-bit integers.
pub(super) fn int64s(batch: &RecordBatch, index: usize) -> Result<&Int64Array> {
    batch
        .column(index)
        .as_primitive_opt::<Int64Type>()
        .ok_or_else(|| bad_column(batch, index))
}

/// Column `index` of a state table as booleans.
pub(super) fn booleans(batch: &RecordBatch, index: usize) -> Result<&BooleanArray> {
    batch
        .column(index)
        .as_boolean_opt()
        .ok_or_else(|| bad_column(batch, index))
}

fn bad_column(batch: &RecordBatch, index: usize) -> Error {
    Error::Plan(format!(
        "state column '{}' has the wrong type",
        batch.schema().field(index).name()
    ))
}

/// A one-column table of window starts (or ends): a set of windows.
pub(super) fn window_set(name: &str, windows: &BTreeSet<i64>) -> Result<RecordBatch> {
    let values: ArrayRef = Arc::new(Int64Array::from_iter_values(windows.iter().copied()));
    state_batch(vec![Field::new(name, DataType::Int64, true)], vec![values])
}

/// Reads back a [`window_set`] table.
pub(super) fn read_window_set(
    state: &OperatorState,
    table: &str,
    column: &str,
) -> Result<BTreeSet<i64>> {
    let batch = checked_table(state, table, &[Field::new(column, DataType::Int64, true)])?;
    Ok(int64s(&batch, 0)?.iter().flatten().collect())
}

/// An event time as a checkpoint scalar: `None` before any.
pub(super) fn time_scalar(value: i64) -> Option<i64> {
    (value != i64::MIN).then_some(value)
}
