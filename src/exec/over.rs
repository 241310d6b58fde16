//! Window functions (`OVER (PARTITION BY ... ORDER BY window_end ...)`)
//! over a stream of window results: each key's current window compared
//! with its earlier ones.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, new_empty_array, new_null_array,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Accumulator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;

use super::aggregate::evaluate_all;
use super::{Message, Operator};
use crate::error::{Error, Result};
use crate::state::OperatorState;

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

/// A partition's key and its accumulator's state, if it has one.
type TakenState = (Box<[u8]>, Option<Vec<ScalarValue>>);

/// What one partition of one `OVER` column holds, as a snapshot has it.
struct Saved<'a> {
    key: &'a [u8],
    partition: &'a Partition,
    /// The running accumulator's state, if it has one.
    state: Option<&'a Vec<ScalarValue>>,
}

impl OverOp {
    /// The columns `OVER` column `index` keeps per history row: the
    /// arguments of its function.
    fn arg_fields(&self, index: usize) -> Result<Vec<Field>> {
        let exprs = match &self.specs[index].function {
            OverFunction::Lag { arg, .. } => vec![arg.clone()],
            OverFunction::Aggregate { function, .. } => function.expressions(),
            OverFunction::RowNumber => Vec::new(),
        };
        exprs
            .iter()
            .enumerate()
            .map(|(i, e)| {
                Ok(Field::new(
                    format!("arg{i}"),
                    e.data_type(&self.schema)?,
                    true,
                ))
            })
            .collect()
    }

    /// The state columns of `OVER` column `index`'s accumulator.
    fn state_fields(&self, index: usize) -> Result<Vec<Field>> {
        let OverFunction::Aggregate { function, .. } = &self.specs[index].function else {
            return Ok(Vec::new());
        };
        Ok(function
            .state_fields()?
            .iter()
            .enumerate()
            .map(|(i, f)| Field::new(format!("state{i}"), f.data_type().clone(), true))
            .collect())
    }

    /// The partition key columns of `OVER` column `index`.
    fn key_fields(&self, index: usize) -> Result<Vec<Field>> {
        self.specs[index]
            .partition_by
            .iter()
            .enumerate()
            .map(|(i, e)| {
                Ok(Field::new(
                    format!("key{i}"),
                    e.data_type(&self.schema)?,
                    true,
                ))
            })
            .collect()
    }

    /// Schemas of the tables of `OVER` column `index`: its partitions (key,
    /// rows so far, whether it has an accumulator, the accumulator's state)
    /// and their history rows (key, arguments), oldest first.
    fn table_schemas(&self, index: usize) -> Result<(SchemaRef, SchemaRef)> {
        let keys = self.key_fields(index)?;
        let mut partitions = keys.clone();
        partitions.push(Field::new("rows", DataType::Int64, false));
        partitions.push(Field::new("running", DataType::Boolean, false));
        partitions.extend(self.state_fields(index)?);
        let mut history = keys;
        history.extend(self.arg_fields(index)?);
        Ok((
            Arc::new(Schema::new(partitions)),
            Arc::new(Schema::new(history)),
        ))
    }

    /// Takes each running accumulator's state (which consumes it) and puts
    /// back an accumulator rebuilt from that state, as a restore builds it,
    /// so the run carries on as a restored one would.
    fn take_states(&mut self, index: usize) -> Result<Vec<TakenState>> {
        let function = self.specs[index].function.clone();
        let mut states = Vec::new();
        for (key, partition) in self.partitions[index].iter_mut() {
            let state = match (&function, partition.running.as_mut()) {
                (OverFunction::Aggregate { function, .. }, Some(running)) => {
                    let state = running.state()?;
                    partition.running = Some(rebuilt(function, &state)?);
                    Some(state)
                }
                _ => None,
            };
            states.push((key.clone(), state));
        }
        states.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(states)
    }

    /// The two tables of `OVER` column `index`.
    fn tables(&mut self, index: usize) -> Result<(RecordBatch, RecordBatch)> {
        let states = self.take_states(index)?;
        let saved: Vec<Saved> = states
            .iter()
            .map(|(key, state)| Saved {
                key,
                partition: &self.partitions[index][key],
                state: state.as_ref(),
            })
            .collect();
        let (partitions_schema, history_schema) = self.table_schemas(index)?;
        let keys = self.key_arrays(index, saved.iter().map(|s| s.key))?;
        let mut columns = keys.clone();
        columns.push(Arc::new(Int64Array::from_iter_values(
            saved.iter().map(|s| s.partition.rows as i64),
        )));
        columns.push(Arc::new(BooleanArray::from_iter(
            saved.iter().map(|s| Some(s.state.is_some())),
        )));
        for (i, field) in self.state_fields(index)?.iter().enumerate() {
            let values = saved.iter().map(|s| match &s.state {
                Some(state) => Ok(state[i].clone()),
                None => Ok(ScalarValue::try_from(field.data_type())?),
            });
            columns.push(scalars_to_array(
                values.collect::<Result<Vec<_>>>()?,
                field,
            )?);
        }
        let partitions = RecordBatch::try_new(partitions_schema, columns)?;
        let history_keys = saved
            .iter()
            .flat_map(|s| std::iter::repeat_n(s.key, s.partition.history.len()));
        let mut columns = self.key_arrays(index, history_keys)?;
        for (i, field) in self.arg_fields(index)?.iter().enumerate() {
            let values = saved
                .iter()
                .flat_map(|s| s.partition.history.iter().map(|row| row[i].clone()));
            columns.push(scalars_to_array(values.collect(), field)?);
        }
        let history = RecordBatch::try_new(history_schema, columns)?;
        Ok((partitions, history))
    }

    /// The partition key columns of `keys` (row-format bytes).
    fn key_arrays<'a>(
        &self,
        index: usize,
        keys: impl Iterator<Item = &'a [u8]>,
    ) -> Result<Vec<ArrayRef>> {
        if self.specs[index].partition_by.is_empty() {
            return Ok(Vec::new());
        }
        let converter = &self.converters[index];
        let parser = converter.parser();
        let rows: Vec<_> = keys.map(|k| parser.parse(k)).collect();
        Ok(converter.convert_rows(rows)?)
    }

    /// The row-format key of each row of a state table.
    fn table_keys(&self, index: usize, table: &RecordBatch) -> Result<Vec<Box<[u8]>>> {
        let width = self.specs[index].partition_by.len();
        if width == 0 {
            return Ok(vec![Box::default(); table.num_rows()]);
        }
        let rows = self.converters[index].convert_columns(&table.columns()[..width])?;
        Ok(rows.iter().map(|r| r.data().into()).collect())
    }

    fn restore_column(&mut self, index: usize, state: &OperatorState) -> Result<()> {
        let (partitions_schema, history_schema) = self.table_schemas(index)?;
        let partitions = state.table_of(&format!("over{index}"), &partitions_schema)?;
        let history = state.table_of(&format!("over{index}_history"), &history_schema)?;
        let width = self.specs[index].partition_by.len();
        let mut restored: HashMap<Box<[u8]>, Partition> = HashMap::new();
        for (row, key) in self.table_keys(index, &history)?.into_iter().enumerate() {
            let values = history.columns()[width..]
                .iter()
                .map(|c| ScalarValue::try_from_array(c, row))
                .collect::<datafusion::error::Result<Vec<_>>>()?;
            restored.entry(key).or_default().history.push_back(values);
        }
        let rows = partitions.column(width).as_primitive::<Int64Type>();
        let running = partitions.column(width + 1).as_boolean();
        for (row, key) in self.table_keys(index, &partitions)?.into_iter().enumerate() {
            let partition = restored.entry(key).or_default();
            partition.rows = rows.value(row) as u64;
            if let (OverFunction::Aggregate { function, .. }, true) =
                (&self.specs[index].function, running.value(row))
            {
                let state = partitions.columns()[width + 2..]
                    .iter()
                    .map(|c| ScalarValue::try_from_array(c, row))
                    .collect::<datafusion::error::Result<Vec<_>>>()?;
                partition.running = Some(rebuilt(function, &state)?);
            }
        }
        if width == 0 && restored.len() > 1 {
            return Err(Error::Plan(
                "over state: several partitions without a key".into(),
            ));
        }
        self.partitions[index] = restored;
        Ok(())
    }
}

/// An accumulator in the state `state` was taken from: a fresh one that
/// merges it, as DataFusion combines partial aggregates. A sliding frame's
/// accumulator is not rebuilt from its rows: a floating-point sum that has
/// added and retracted many rows is not the fresh sum of the frame.
fn rebuilt(
    function: &AggregateFunctionExpr,
    state: &[ScalarValue],
) -> Result<Box<dyn Accumulator>> {
    let mut accumulator = function.create_accumulator()?;
    let states = state
        .iter()
        .map(|s| s.to_array())
        .collect::<datafusion::error::Result<Vec<_>>>()?;
    accumulator.merge_batch(&states)?;
    Ok(accumulator)
}

/// `values` as a column of `field`'s type.
fn scalars_to_array(values: Vec<ScalarValue>, field: &Field) -> Result<ArrayRef> {
    if values.is_empty() {
        return Ok(new_empty_array(field.data_type()));
    }
    let array = ScalarValue::iter_to_array(values)?;
    match array.data_type() == field.data_type() {
        true => Ok(array),
        false => Ok(cast(&array, field.data_type())?),
    }
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

    /// Per `OVER` column `i`, tables `over{i}` (each partition's row count
    /// and accumulator state) and `over{i}_history` (the argument values
    /// of the partition's latest rows, that `lag` and a sliding frame look
    /// back at), both keyed by the `PARTITION BY` columns.
    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        let mut state = OperatorState::new();
        for index in 0..self.specs.len() {
            let (partitions, history) = self.tables(index)?;
            let keys: Vec<usize> = (0..self.specs[index].partition_by.len()).collect();
            state.add(&format!("over{index}"), partitions, keys.clone());
            state.add(&format!("over{index}_history"), history, keys);
        }
        Ok(Some(state))
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        for index in 0..self.specs.len() {
            self.restore_column(index, &state)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, StringArray};
    use datafusion::arrow::util::display::array_value_to_string;
    use datafusion::functions_aggregate::{
        average::avg_udaf, median::median_udaf, min_max::min_udaf, stddev::stddev_udaf,
        sum::sum_udaf,
    };
    use datafusion::logical_expr::AggregateUDF;
    use datafusion::physical_expr::aggregate::AggregateExprBuilder;
    use datafusion::physical_expr::expressions::col;

    fn input_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("host", DataType::Utf8, true),
            Field::new("v", DataType::Float64, true),
        ]))
    }

    fn aggregate(udaf: Arc<AggregateUDF>, preceding: Option<usize>) -> OverSpec {
        let schema = input_schema();
        let function = AggregateExprBuilder::new(udaf, vec![col("v", &schema).unwrap()])
            .schema(schema.clone())
            .alias("f")
            .build()
            .unwrap();
        OverSpec {
            partition_by: vec![col("host", &schema).unwrap()],
            function: OverFunction::Aggregate {
                function: Arc::new(function),
                preceding,
            },
            data_type: DataType::Float64,
        }
    }

    /// Sliding averages and deviations that add and retract rows of very
    /// different sizes, a sliding median (whose state is every row of the
    /// frame), a minimum that cannot retract, a deviation and a sum from
    /// the first row, a lag of two rows; with and without a partition key.
    fn op() -> OverOp {
        let schema = input_schema();
        let lag = OverSpec {
            partition_by: Vec::new(),
            function: OverFunction::Lag {
                arg: col("v", &schema).unwrap(),
                offset: 2,
                default: ScalarValue::Float64(None),
            },
            data_type: DataType::Float64,
        };
        let specs = vec![
            aggregate(avg_udaf(), Some(2)),
            aggregate(stddev_udaf(), Some(2)),
            aggregate(median_udaf(), Some(1)),
            aggregate(min_udaf(), Some(1)),
            aggregate(stddev_udaf(), None),
            aggregate(sum_udaf(), None),
            lag,
        ];
        let mut fields = schema.fields().to_vec();
        for i in 0..specs.len() {
            fields.push(Arc::new(Field::new(
                format!("o{i}"),
                DataType::Float64,
                true,
            )));
        }
        OverOp::new(specs, Arc::new(Schema::new(fields))).unwrap()
    }

    fn rows() -> Vec<RecordBatch> {
        let values = [
            1e16, 0.1, -1e16, 0.2, 0.3, 5.0, 1e-7, 3.0, 1e15, 0.7, -2.0, 4.0,
        ];
        values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let host = if i % 3 == 0 { "a" } else { "b" };
                RecordBatch::try_new(
                    input_schema(),
                    vec![
                        Arc::new(StringArray::from(vec![host])),
                        Arc::new(Float64Array::from(vec![*v])),
                    ],
                )
                .unwrap()
            })
            .collect()
    }

    fn feed(op: &mut OverOp, batches: &[RecordBatch]) -> Vec<String> {
        let mut lines = Vec::new();
        for batch in batches {
            let mut out = Vec::new();
            op.on_batch(batch.clone(), &mut out).unwrap();
            for message in out {
                let Message::Batch(b) = message else { continue };
                let values: Vec<String> = b
                    .columns()
                    .iter()
                    .map(|c| array_value_to_string(c, 0).unwrap())
                    .collect();
                lines.push(values.join(","));
            }
        }
        lines
    }

    #[test]
    fn restores_at_every_row_exactly() {
        let rows = rows();
        let straight = feed(&mut op(), &rows);
        for cut in 0..=rows.len() {
            let mut first = op();
            let before = feed(&mut first, &rows[..cut]);
            let state = first.snapshot().unwrap().expect("a state");
            let carried_on = feed(&mut first, &rows[cut..]);
            assert_eq!([before.clone(), carried_on].concat(), straight, "cut {cut}");
            let mut restored = op();
            restored.restore(state).unwrap();
            let after = feed(&mut restored, &rows[cut..]);
            assert_eq!([before, after].concat(), straight, "cut {cut}");
        }
    }

    #[test]
    fn a_fresh_snapshot_has_every_table_empty() {
        let state = op().snapshot().unwrap().expect("a state");
        assert_eq!(state.tables.len(), 14);
        assert_eq!(state.rows(), 0);
        let mut other = op();
        other.restore(state).unwrap();
        assert!(other.partitions.iter().all(|p| p.is_empty()));
    }
}
