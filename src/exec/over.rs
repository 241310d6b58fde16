//! Window functions (`OVER (PARTITION BY ... ORDER BY window_end ...)`)
//! over a stream of window results: each key's current window compared
//! with its earlier ones.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, new_null_array};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Accumulator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;

use super::aggregate::evaluate_all;
use super::{Message, Operator};
use crate::error::Result;

/// What one `OVER` column computes, per partition, row by row.
#[derive(Debug, Clone)]
pub enum OverFunction {
    /// `lag(x, offset, default)`: `x` of the row `offset` rows back.
    Lag {
        /// The value looked back at.
        arg: Arc<dyn PhysicalExpr>,
        /// How many rows back.
        offset: usize,
        /// The result when there is no such row.
        default: ScalarValue,
    },
    /// `row_number()`: 1 for a partition's first row, then 2, ...
    RowNumber,
    /// An aggregate over the last `preceding + 1` rows (`ROWS n PRECEDING`),
    /// or over every row so far (`preceding` is `None`).
    Aggregate {
        /// The aggregate with its arguments.
        function: Arc<AggregateFunctionExpr>,
        /// Rows before the current one in the frame.
        preceding: Option<usize>,
    },
}

/// One `OVER` column.
#[derive(Debug, Clone)]
pub struct OverSpec {
    /// `PARTITION BY` expressions.
    pub partition_by: Vec<Arc<dyn PhysicalExpr>>,
    /// The function.
    pub function: OverFunction,
    /// Type of the output column.
    pub data_type: DataType,
}

/// Appends one column per [`OverSpec`] to each row. Rows must arrive in
/// the `ORDER BY` order, which a stream of window results does: windows
/// fire in order of their end. Its input is one row per key and window,
/// so per-row work here is small next to the aggregation before it.
pub struct OverOp {
    specs: Vec<OverSpec>,
    converters: Vec<RowConverter>,
    partitions: Vec<HashMap<Box<[u8]>, Partition>>,
    schema: SchemaRef,
}

#[derive(Default)]
struct Partition {
    /// Argument values of the latest rows, newest last.
    history: VecDeque<Vec<ScalarValue>>,
    /// For an unbounded frame, the running aggregate.
    running: Option<Box<dyn Accumulator>>,
    rows: u64,
}

impl OverOp {
    /// Computes `specs`; `schema` is the input's plus one column each.
    pub fn new(specs: Vec<OverSpec>, schema: SchemaRef) -> Result<Self> {
        let mut converters = Vec::with_capacity(specs.len());
        for spec in &specs {
            let fields = spec
                .partition_by
                .iter()
                .map(|e| Ok(SortField::new(e.data_type(&schema)?)))
                .collect::<Result<Vec<_>>>()?;
            converters.push(RowConverter::new(fields)?);
        }
        let partitions = specs.iter().map(|_| HashMap::new()).collect();
        Ok(Self {
            specs,
            converters,
            partitions,
            schema,
        })
    }

    fn column(&mut self, index: usize, batch: &RecordBatch) -> Result<ArrayRef> {
        let spec = &self.specs[index];
        let keys = evaluate_all(&spec.partition_by, batch)?;
        let rows = self.converters[index].convert_columns(&keys)?;
        let args = match &spec.function {
            OverFunction::Lag { arg, .. } => evaluate_all(std::slice::from_ref(arg), batch)?,
            OverFunction::Aggregate { function, .. } => {
                evaluate_all(&function.expressions(), batch)?
            }
            OverFunction::RowNumber => Vec::new(),
        };
        let mut values = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let key: &[u8] = if keys.is_empty() {
                &[]
            } else {
                rows.row(row).data()
            };
            let current = args
                .iter()
                .map(|a| ScalarValue::try_from_array(a, row))
                .collect::<datafusion::error::Result<Vec<_>>>()?;
            let partition = self.partitions[index].entry(key.into()).or_default();
            values.push(next_value(&spec.function, partition, current)?);
        }
        if values.is_empty() {
            return Ok(new_null_array(&spec.data_type, 0));
        }
        let array = ScalarValue::iter_to_array(values)?;
        if array.data_type() == &spec.data_type {
            return Ok(array);
        }
        Ok(datafusion::arrow::compute::cast(&array, &spec.data_type)?)
    }
}

/// The function's value for the partition's next row, with `current` its
/// arguments.
fn next_value(
    function: &OverFunction,
    partition: &mut Partition,
    current: Vec<ScalarValue>,
) -> Result<ScalarValue> {
    partition.rows += 1;
    match function {
        OverFunction::RowNumber => Ok(ScalarValue::UInt64(Some(partition.rows))),
        OverFunction::Lag {
            offset, default, ..
        } => {
            let history = &mut partition.history;
            let value = match history.len().checked_sub(*offset) {
                Some(i) if *offset > 0 => history[i][0].clone(),
                _ if *offset == 0 => current[0].clone(),
                _ => default.clone(),
            };
            history.push_back(current);
            while history.len() > *offset {
                history.pop_front();
            }
            Ok(value)
        }
        OverFunction::Aggregate {
            function,
            preceding: None,
        } => {
            if partition.running.is_none() {
                partition.running = Some(function.create_accumulator()?);
            }
            let running = partition.running.as_mut().expect("created above");
            running.update_batch(&arrays_of(std::slice::from_ref(&current))?)?;
            Ok(running.evaluate()?)
        }
        OverFunction::Aggregate {
            function,
            preceding: Some(n),
        } => {
            let history = &mut partition.history;
            history.push_back(current);
            let leaving = (history.len() > n + 1)
                .then(|| history.pop_front())
                .flatten();
            if partition.running.is_none() {
                let accumulator = function.create_accumulator()?;
                // An accumulator that can retract slides along the frame:
                // each row is added once and taken out once.
                if accumulator.supports_retract_batch() {
                    partition.running = Some(accumulator);
                } else {
                    let mut accumulator = accumulator;
                    let rows: Vec<Vec<ScalarValue>> = history.iter().cloned().collect();
                    accumulator.update_batch(&arrays_of(&rows)?)?;
                    return Ok(accumulator.evaluate()?);
                }
            }
            let sliding = partition.running.as_mut().expect("created above");
            let newest = history.back().expect("just pushed").clone();
            sliding.update_batch(&arrays_of(std::slice::from_ref(&newest))?)?;
            if let Some(old) = leaving {
                sliding.retract_batch(&arrays_of(std::slice::from_ref(&old))?)?;
            }
            Ok(sliding.evaluate()?)
        }
    }
}

/// Column arrays of a few rows of argument values.
fn arrays_of(rows: &[Vec<ScalarValue>]) -> Result<Vec<ArrayRef>> {
    let width = rows.first().map_or(0, |r| r.len());
    (0..width)
        .map(|i| {
            Ok(ScalarValue::iter_to_array(
                rows.iter().map(|r| r[i].clone()),
            )?)
        })
        .collect()
}

impl Operator for OverOp {
    fn describe(&self) -> String {
        let functions: Vec<String> = self
            .specs
            .iter()
            .map(|s| match &s.function {
                OverFunction::Lag { offset, .. } => format!("lag({offset})"),
                OverFunction::RowNumber => "row_number".to_string(),
                OverFunction::Aggregate {
                    function,
                    preceding: Some(n),
                } => format!("{} over {} rows", function.name(), n + 1),
                OverFunction::Aggregate { function, .. } => {
                    format!("{} over all rows", function.name())
                }
            })
            .collect();
        format!("over [{}]", functions.join(", "))
    }

    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        let mut columns = batch.columns().to_vec();
        for index in 0..self.specs.len() {
            columns.push(self.column(index, &batch)?);
        }
        out.push(Message::Batch(RecordBatch::try_new(
            self.schema.clone(),
            columns,
        )?));
        Ok(())
    }
}
