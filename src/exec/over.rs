//! Window functions (`OVER (PARTITION BY ... ORDER BY window_end ...)`)
//! over a stream of window results: each key's current window compared
//! with its earlier ones.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, ListArray, UInt64Array,
    new_empty_array, new_null_array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::{cast, interleave};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema, SchemaRef};
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
/// fire in order of their end.
///
/// A partition's history (the rows `lag` and a sliding frame look back at)
/// points into the argument columns of the batches they came in, kept as
/// Arrow arrays ([`History`]), so no row is converted to a `ScalarValue`
/// on the way in. `median` and `mad` of `DOUBLE` keep their frame as a
/// sorted vector ([`Ordered`]): a row is inserted and the leaving one
/// removed by binary search, and both statistics read it without sorting.
pub struct OverOp {
    specs: Vec<OverSpec>,
    converters: Vec<RowConverter>,
    /// Per `OVER` column, its order statistic if it has one.
    statistics: Vec<Option<Statistic>>,
    partitions: Vec<HashMap<Box<[u8]>, Partition>>,
    histories: Vec<History>,
    schema: SchemaRef,
}

#[derive(Default)]
struct Partition {
    /// Where the argument values of the latest rows are, newest last.
    history: VecDeque<Entry>,
    /// For an unbounded frame, or a sliding one that can retract, the
    /// running aggregate.
    running: Option<Box<dyn Accumulator>>,
    /// For `median` and `mad`, the frame's non-NULL values in order.
    ordered: Ordered,
    rows: u64,
}

/// One row of a [`History`]: which kept batch, which row of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    slot: u32,
    row: u32,
}

/// The argument columns of the batches an `OVER` column's histories point
/// into. Batches are kept whole; once they hold more than twice the rows
/// still pointed at, the live rows are copied into one batch
/// ([`OverOp::compact`]), so memory stays within twice the histories' size
/// plus a batch, whatever the key churn.
#[derive(Default)]
struct History {
    batches: Vec<Vec<ArrayRef>>,
    rows: usize,
    /// Rows pointed at when last counted: counting visits every
    /// partition, so it is done only once `rows` has doubled past it.
    counted: usize,
}

impl History {
    /// Keeps `columns` and returns its slot.
    fn keep(&mut self, columns: Vec<ArrayRef>, rows: usize) -> u32 {
        self.batches.push(columns);
        self.rows += rows;
        (self.batches.len() - 1) as u32
    }

    /// Argument `arg` of `entry`, as a one-row array (zero-copy).
    fn value(&self, entry: Entry, arg: usize) -> ArrayRef {
        self.batches[entry.slot as usize][arg].slice(entry.row as usize, 1)
    }

    /// Every argument of `entry`, as one-row arrays.
    fn row(&self, entry: Entry) -> Vec<ArrayRef> {
        let columns = self.batches[entry.slot as usize].len();
        (0..columns).map(|arg| self.value(entry, arg)).collect()
    }

    /// Argument `arg` of `entry` as a DOUBLE, `None` when NULL.
    fn float(&self, entry: Entry, arg: usize) -> Option<f64> {
        let column = self.batches[entry.slot as usize][arg].as_primitive::<Float64Type>();
        let row = entry.row as usize;
        column.is_valid(row).then(|| column.value(row))
    }

    /// Argument `arg` of `entries`, in order, as one array; `extra` is
    /// appended to the sources as slot `batches.len()` (a default value).
    fn gather(
        &self,
        arg: usize,
        entries: impl Iterator<Item = Entry>,
        extra: Option<&ArrayRef>,
        data_type: &DataType,
    ) -> Result<ArrayRef> {
        let mut sources: Vec<&dyn Array> = self.batches.iter().map(|b| b[arg].as_ref()).collect();
        sources.extend(extra.map(|a| a.as_ref()));
        let indices: Vec<(usize, usize)> =
            entries.map(|e| (e.slot as usize, e.row as usize)).collect();
        if indices.is_empty() || sources.is_empty() {
            return Ok(new_empty_array(data_type));
        }
        Ok(interleave(&sources, &indices)?)
    }
}

/// An aggregate kept as an order statistic of its frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Statistic {
    Median,
    Mad,
}

impl Statistic {
    /// The statistic `function` computes, if it is one kept in order:
    /// `median` or `mad` of one `DOUBLE` argument, not `DISTINCT`.
    fn of(function: &AggregateFunctionExpr, schema: &Schema) -> Result<Option<Self>> {
        let statistic = match function.fun().name() {
            "median" => Statistic::Median,
            "mad" => Statistic::Mad,
            _ => return Ok(None),
        };
        let args = function.expressions();
        let double = args.len() == 1
            && args[0].data_type(schema)? == DataType::Float64
            && function.field().data_type() == &DataType::Float64;
        Ok((double && !function.is_distinct()).then_some(statistic))
    }

    fn evaluate(self, ordered: &Ordered) -> Option<f64> {
        match self {
            Statistic::Median => ordered.median(),
            Statistic::Mad => ordered.mad(),
        }
    }
}

/// A multiset of DOUBLEs kept sorted by `f64::total_cmp`.
///
/// Its `median` and `mad` are those of `median(x)` and `mad(x)` over the
/// same values, to the bit: the even case averages the two middle values
/// as both do, and `mad` finds the middle deviations by a selection over
/// the deviations left and right of the center, which are each sorted
/// since rounding is monotonic.
#[derive(Debug, Default, Clone)]
struct Ordered(Vec<f64>);

impl Ordered {
    fn position(&self, value: f64) -> usize {
        self.0.partition_point(|x| x.total_cmp(&value).is_lt())
    }

    fn insert(&mut self, value: f64) {
        let at = self.position(value);
        self.0.insert(at, value);
    }

    /// Removes one occurrence of `value`, if there is one.
    fn remove(&mut self, value: f64) {
        let at = self.position(value);
        if self.0.get(at).is_some_and(|x| x.total_cmp(&value).is_eq()) {
            self.0.remove(at);
        }
    }

    fn median(&self) -> Option<f64> {
        let values = &self.0;
        let mid = values.len() / 2;
        match values.len() {
            0 => None,
            n if n % 2 == 0 => Some((values[mid - 1] + values[mid]) / 2.0),
            _ => Some(values[mid]),
        }
    }

    fn mad(&self) -> Option<f64> {
        let center = self.median()?;
        let values = &self.0;
        let split = self.position(center);
        // Deviations of the values below the center, nearest first, and
        // of the rest, nearest first: two ascending sequences.
        let below = |i: usize| (values[split - 1 - i] - center).abs();
        let above = |i: usize| (values[split + i] - center).abs();
        let sides = (split, values.len() - split);
        let n = values.len();
        let kth = |k: usize| kth_of_two(&below, &above, sides, k);
        Some(match n % 2 {
            0 => (kth(n / 2 - 1) + kth(n / 2)) / 2.0,
            _ => kth(n / 2),
        })
    }

    /// The values as a one-row list, a median or mad accumulator's state.
    fn state(&self) -> ScalarValue {
        let values: ArrayRef = Arc::new(Float64Array::from(self.0.clone()));
        ScalarValue::List(Arc::new(ListArray::new(
            Arc::new(Field::new_list_field(DataType::Float64, true)),
            OffsetBuffer::from_lengths([values.len()]),
            values,
            None,
        )))
    }

    /// The values of a [`Ordered::state`] (or of the state of DataFusion's
    /// median accumulator).
    fn from_state(state: &ScalarValue) -> Result<Self> {
        let mut ordered = Ordered::default();
        if let ScalarValue::List(list) = state {
            for values in list.iter().flatten() {
                let values = values.as_primitive_opt::<Float64Type>().ok_or_else(|| {
                    Error::Plan("over state: a median state that is not DOUBLE".into())
                })?;
                ordered.0.extend(values.iter().flatten());
            }
        }
        ordered.0.sort_by(f64::total_cmp);
        Ok(ordered)
    }
}

/// The `k`-th smallest (from 0) of two ascending sequences of `lengths`,
/// read through `a` and `b`, in logarithmic time: the number `i` of the
/// `k + 1` smallest taken from `a` is the least with `a(i) >= b(k - i)`.
fn kth_of_two(
    a: &impl Fn(usize) -> f64,
    b: &impl Fn(usize) -> f64,
    (a_len, b_len): (usize, usize),
    k: usize,
) -> f64 {
    let take = k + 1;
    let (mut lo, mut hi) = (take.saturating_sub(b_len), take.min(a_len));
    while lo < hi {
        let i = (lo + hi) / 2;
        if a(i).total_cmp(&b(take - i - 1)).is_lt() {
            lo = i + 1;
        } else {
            hi = i;
        }
    }
    let j = take - lo;
    match (lo.checked_sub(1).map(a), j.checked_sub(1).map(b)) {
        (Some(x), Some(y)) => match x.total_cmp(&y) {
            std::cmp::Ordering::Less => y,
            _ => x,
        },
        (Some(x), None) => x,
        (None, Some(y)) => y,
        (None, None) => unreachable!("k is below the total length"),
    }
}

/// One `OVER` column's values for a batch, built as it goes.
enum Output {
    /// `row_number()`.
    Numbers(Vec<u64>),
    /// `lag`: the history entries looked back at.
    Picks(Vec<Entry>),
    /// An order statistic.
    Floats(Vec<Option<f64>>),
    /// Any other aggregate, as its accumulator evaluates.
    Scalars(Vec<ScalarValue>),
}

impl OverOp {
    /// Computes `specs`; `schema` is the input's plus one column each.
    pub fn new(specs: Vec<OverSpec>, schema: SchemaRef) -> Result<Self> {
        let mut converters = Vec::with_capacity(specs.len());
        let mut statistics = Vec::with_capacity(specs.len());
        for spec in &specs {
            let fields = spec
                .partition_by
                .iter()
                .map(|e| Ok(SortField::new(e.data_type(&schema)?)))
                .collect::<Result<Vec<_>>>()?;
            converters.push(RowConverter::new(fields)?);
            statistics.push(match &spec.function {
                OverFunction::Aggregate { function, .. } => Statistic::of(function, &schema)?,
                _ => None,
            });
        }
        let partitions = specs.iter().map(|_| HashMap::new()).collect();
        let histories = specs.iter().map(|_| History::default()).collect();
        Ok(Self {
            specs,
            converters,
            statistics,
            partitions,
            histories,
            schema,
        })
    }

    fn column(&mut self, index: usize, batch: &RecordBatch) -> Result<ArrayRef> {
        self.compact(index)?;
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
        let history = &mut self.histories[index];
        let slot = history.keep(args, batch.num_rows());
        let mut output = match (&spec.function, self.statistics[index]) {
            (OverFunction::RowNumber, _) => Output::Numbers(Vec::new()),
            (OverFunction::Lag { .. }, _) => Output::Picks(Vec::new()),
            (_, Some(_)) => Output::Floats(Vec::new()),
            _ => Output::Scalars(Vec::new()),
        };
        let partitions = &mut self.partitions[index];
        let step = Step {
            function: &spec.function,
            statistic: self.statistics[index],
            history,
        };
        for row in 0..batch.num_rows() {
            let key: &[u8] = if keys.is_empty() {
                &[]
            } else {
                rows.row(row).data()
            };
            if !partitions.contains_key(key) {
                partitions.insert(key.into(), Partition::default());
            }
            let partition = partitions.get_mut(key).expect("inserted above");
            let entry = Entry {
                slot,
                row: row as u32,
            };
            step.next(partition, entry, &mut output)?;
        }
        self.finish(index, output)
    }

    /// The column of `output`, of the `OVER` column's type.
    fn finish(&self, index: usize, output: Output) -> Result<ArrayRef> {
        let spec = &self.specs[index];
        let array: ArrayRef = match output {
            Output::Numbers(numbers) => Arc::new(UInt64Array::from(numbers)),
            Output::Floats(floats) => Arc::new(Float64Array::from(floats)),
            Output::Scalars(values) if values.is_empty() => {
                return Ok(new_null_array(&spec.data_type, 0));
            }
            Output::Scalars(values) => ScalarValue::iter_to_array(values)?,
            Output::Picks(picks) => {
                let OverFunction::Lag { default, .. } = &spec.function else {
                    unreachable!("picks are lag's");
                };
                let history = &self.histories[index];
                let arg_type = self.arg_fields(index)?[0].data_type().clone();
                let mut default = default.to_array_of_size(1)?;
                if default.data_type() != &arg_type {
                    default = cast(&default, &arg_type)?;
                }
                history.gather(0, picks.into_iter(), Some(&default), &arg_type)?
            }
        };
        if array.data_type() == &spec.data_type {
            return Ok(array);
        }
        Ok(cast(&array, &spec.data_type)?)
    }

    /// Copies the history rows still pointed at into one batch once the
    /// kept batches hold more than twice as many rows (and more than a
    /// few thousand).
    fn compact(&mut self, index: usize) -> Result<()> {
        let limit = |live: usize| (2 * live).max(4096);
        if self.histories[index].rows <= limit(self.histories[index].counted) {
            return Ok(());
        }
        let live: usize = self.partitions[index]
            .values()
            .map(|p| p.history.len())
            .sum();
        self.histories[index].counted = live;
        let history = &self.histories[index];
        if history.rows <= limit(live) {
            return Ok(());
        }
        let fields = self.arg_fields(index)?;
        let partitions = &mut self.partitions[index];
        let entries = || partitions.values().flat_map(|p| p.history.iter().copied());
        let columns = fields
            .iter()
            .enumerate()
            .map(|(arg, f)| history.gather(arg, entries(), None, f.data_type()))
            .collect::<Result<Vec<_>>>()?;
        let mut row = 0;
        for partition in partitions.values_mut() {
            for entry in partition.history.iter_mut() {
                *entry = Entry { slot: 0, row };
                row += 1;
            }
        }
        let history = &mut self.histories[index];
        *history = History::default();
        history.keep(columns, live);
        history.counted = live;
        Ok(())
    }
}

/// What the rows of one `OVER` column share as each is computed.
struct Step<'a> {
    function: &'a OverFunction,
    statistic: Option<Statistic>,
    history: &'a History,
}

impl Step<'_> {
    /// Computes the function for the partition's next row, `entry` holding
    /// its arguments, and appends the value to `output`.
    fn next(&self, partition: &mut Partition, entry: Entry, output: &mut Output) -> Result<()> {
        partition.rows += 1;
        match (self.function, output) {
            (OverFunction::RowNumber, Output::Numbers(numbers)) => numbers.push(partition.rows),
            (OverFunction::Lag { offset, .. }, Output::Picks(picks)) => {
                picks.push(self.lag(partition, entry, *offset));
            }
            (OverFunction::Aggregate { preceding, .. }, Output::Floats(floats)) => {
                let statistic = self.statistic.expect("floats are order statistics'");
                floats.push(self.ordered(partition, entry, *preceding, statistic));
            }
            (
                OverFunction::Aggregate {
                    function,
                    preceding,
                },
                Output::Scalars(values),
            ) => values.push(self.aggregate(partition, entry, function, *preceding)?),
            _ => unreachable!("the output is made for the function"),
        }
        Ok(())
    }

    /// The entry `offset` rows back (the default's when there is none).
    fn lag(&self, partition: &mut Partition, entry: Entry, offset: usize) -> Entry {
        if offset == 0 {
            return entry;
        }
        let history = &mut partition.history;
        let default = Entry {
            slot: self.history.batches.len() as u32,
            row: 0,
        };
        let value = match history.len().checked_sub(offset) {
            Some(i) => history[i],
            None => default,
        };
        history.push_back(entry);
        while history.len() > offset {
            history.pop_front();
        }
        value
    }

    /// An order statistic of the frame after `entry` joins it.
    fn ordered(
        &self,
        partition: &mut Partition,
        entry: Entry,
        preceding: Option<usize>,
        statistic: Statistic,
    ) -> Option<f64> {
        if let Some(value) = self.history.float(entry, 0) {
            partition.ordered.insert(value);
        }
        if let Some(n) = preceding {
            partition.history.push_back(entry);
            if partition.history.len() > n + 1 {
                let old = partition.history.pop_front().expect("longer than n + 1");
                if let Some(value) = self.history.float(old, 0) {
                    partition.ordered.remove(value);
                }
            }
        }
        statistic.evaluate(&partition.ordered)
    }

    /// Any other aggregate of the frame after `entry` joins it.
    fn aggregate(
        &self,
        partition: &mut Partition,
        entry: Entry,
        function: &AggregateFunctionExpr,
        preceding: Option<usize>,
    ) -> Result<ScalarValue> {
        let Some(n) = preceding else {
            if partition.running.is_none() {
                partition.running = Some(function.create_accumulator()?);
            }
            let running = partition.running.as_mut().expect("created above");
            running.update_batch(&self.history.row(entry))?;
            return Ok(running.evaluate()?);
        };
        let history = &mut partition.history;
        history.push_back(entry);
        let leaving = (history.len() > n + 1)
            .then(|| history.pop_front())
            .flatten();
        if partition.running.is_none() {
            let mut accumulator = function.create_accumulator()?;
            // An accumulator that can retract slides along the frame:
            // each row is added once and taken out once.
            if accumulator.supports_retract_batch() {
                partition.running = Some(accumulator);
            } else {
                let arity = self.history.batches[entry.slot as usize].len();
                let frame = (0..arity)
                    .map(|arg| {
                        let data_type = self.history.batches[entry.slot as usize][arg].data_type();
                        self.history
                            .gather(arg, history.iter().copied(), None, data_type)
                    })
                    .collect::<Result<Vec<_>>>()?;
                accumulator.update_batch(&frame)?;
                return Ok(accumulator.evaluate()?);
            }
        }
        let sliding = partition.running.as_mut().expect("created above");
        sliding.update_batch(&self.history.row(entry))?;
        if let Some(old) = leaving {
            sliding.retract_batch(&self.history.row(old))?;
        }
        Ok(sliding.evaluate()?)
    }
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
                // An unbounded order statistic keeps every value, as the
                // accumulator's state does; a sliding one is rebuilt from
                // the history.
                (
                    OverFunction::Aggregate {
                        preceding: None, ..
                    },
                    None,
                ) if self.statistics[index].is_some() => Some(vec![partition.ordered.state()]),
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
        let history = &self.histories[index];
        for (i, field) in self.arg_fields(index)?.iter().enumerate() {
            let entries = saved
                .iter()
                .flat_map(|s| s.partition.history.iter().copied());
            let column = history.gather(i, entries, None, field.data_type())?;
            columns.push(column);
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
        let mut kept = History::default();
        let slot = kept.keep(history.columns()[width..].to_vec(), history.num_rows());
        let statistic = self.statistics[index];
        for (row, key) in self.table_keys(index, &history)?.into_iter().enumerate() {
            let entry = Entry {
                slot,
                row: row as u32,
            };
            let partition = restored.entry(key).or_default();
            partition.history.push_back(entry);
            // Only an order statistic's argument is a DOUBLE to read.
            if let Some(value) = statistic.and_then(|_| kept.float(entry, 0)) {
                partition.ordered.insert(value);
            }
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
                match statistic {
                    Some(_) => partition.ordered = Ordered::from_state(&state[0])?,
                    None => partition.running = Some(rebuilt(function, &state)?),
                }
            }
        }
        if width == 0 && restored.len() > 1 {
            return Err(Error::Plan(
                "over state: several partitions without a key".into(),
            ));
        }
        self.partitions[index] = restored;
        self.histories[index] = kept;
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
mod tests;
