//! `EMIT CHANGES` aggregation: a row out for every input row that changes a
//! result.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, AsArray, BooleanArray, Int64Array, UInt32Array, new_empty_array,
};
use datafusion::arrow::compute::{concat_batches, take};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimestampMillisecondType};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{Accumulator, EmitTo};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::group_values::{GroupValues, new_group_values};
use datafusion::physical_plan::aggregates::order::GroupOrdering;

use super::aggregate::{
    self, AggregateInputs, AggregateSpec, checked_table, evaluate_all, int64s, sorted_by,
};
use super::{Message, Operator};
use crate::connector::RowKind;
use crate::error::Result;
use crate::state::OperatorState;

/// The planner's description of a changelog aggregate.
#[derive(Debug, Clone)]
pub struct ChangelogAggregateSpec {
    /// Grouping expressions, in output order.
    pub groups: Vec<Arc<dyn PhysicalExpr>>,
    /// Output fields of `groups`.
    pub group_schema: SchemaRef,
    /// For a windowed aggregate: which grouping column holds the window,
    /// and what to add to it to get the window end. A window's state is
    /// dropped once the watermark passes its end.
    pub window_end: Option<(usize, i64)>,
    /// How long after its end a window still takes rows.
    pub lateness_ms: i64,
    /// The aggregates, in output order after the grouping columns.
    pub aggregates: Vec<AggregateSpec>,
    /// Output schema: grouping columns, then aggregates.
    pub schema: SchemaRef,
}

/// Aggregation that emits, for every input row that changes a result, the
/// result's new value: `Insert` for a key seen for the first time, `Update`
/// after that (an upsert changelog keyed by the grouping columns). A row
/// that leaves its key's result as it was (a `max` below the maximum, a
/// NULL into `sum`) emits nothing.
///
/// Rows are folded in one at a time, so the changes do not depend on how
/// the input was cut into batches: per-record and micro-batch execution
/// emit the same rows. Each group keeps a DataFusion `Accumulator`, whose
/// `evaluate` leaves its state intact, so a result can be read after every
/// row.
pub struct ChangelogAggregateOp {
    spec: ChangelogAggregateSpec,
    /// Per window end (`i64::MAX` without a window): keys and accumulators.
    states: BTreeMap<i64, Keyed>,
}

struct Keyed {
    keys: Option<Box<dyn GroupValues>>,
    /// Per group, one accumulator per aggregate.
    accumulators: Vec<Vec<Box<dyn Accumulator>>>,
    /// Per group, the aggregate values it last emitted (`None` before its
    /// first row).
    emitted: Vec<Option<Vec<ScalarValue>>>,
    ids: Vec<usize>,
}

/// The changes of a batch: one per input row that changed its result.
struct Changed {
    /// The input row, which holds the group's key.
    key_rows: Vec<u32>,
    /// The group's new aggregate values after that row.
    values: Vec<Vec<ScalarValue>>,
    /// Whether the row created the group.
    new: Vec<bool>,
}

impl ChangelogAggregateOp {
    /// A changelog aggregate as the planner describes it.
    pub fn new(spec: ChangelogAggregateSpec) -> Self {
        Self {
            spec,
            states: BTreeMap::new(),
        }
    }

    fn new_keyed(&self) -> Result<Keyed> {
        let keys = if self.spec.group_schema.fields().is_empty() {
            None
        } else {
            Some(new_group_values(
                self.spec.group_schema.clone(),
                &GroupOrdering::None,
            )?)
        };
        Ok(Keyed {
            keys,
            accumulators: Vec::new(),
            emitted: Vec::new(),
            ids: Vec::new(),
        })
    }

    /// Rows of the batch per window end.
    fn rows_by_window(&self, groups: &[ArrayRef], rows: usize) -> HashMap<i64, Vec<u32>> {
        let mut by_end: HashMap<i64, Vec<u32>> = HashMap::new();
        match self.spec.window_end {
            None => {
                by_end.insert(i64::MAX, (0..rows as u32).collect());
            }
            Some((column, offset)) => {
                let values = groups[column]
                    .as_primitive::<TimestampMillisecondType>()
                    .values();
                for (row, v) in values.iter().enumerate() {
                    by_end.entry(v + offset).or_default().push(row as u32);
                }
            }
        }
        by_end
    }

    /// The changes as batches of consecutive rows of the same kind, in
    /// input order.
    fn output(&self, groups: &[ArrayRef], changed: &Changed, out: &mut Vec<Message>) -> Result<()> {
        let mut order: Vec<usize> = (0..changed.key_rows.len()).collect();
        order.sort_by_key(|&i| changed.key_rows[i]);
        let mut start = 0;
        while start < order.len() {
            let new = changed.new[order[start]];
            let run_len = order[start..]
                .iter()
                .take_while(|&&i| changed.new[i] == new)
                .count();
            let run = &order[start..start + run_len];
            let rows =
                UInt32Array::from(run.iter().map(|&i| changed.key_rows[i]).collect::<Vec<_>>());
            let mut columns: Vec<ArrayRef> = groups
                .iter()
                .map(|g| take(g, &rows, None))
                .collect::<std::result::Result<_, _>>()?;
            for agg in 0..self.spec.aggregates.len() {
                let values = run.iter().map(|&i| changed.values[i][agg].clone());
                columns.push(ScalarValue::iter_to_array(values)?);
            }
            let kind = if new {
                RowKind::Insert
            } else {
                RowKind::Update
            };
            out.push(Message::Changes(
                RecordBatch::try_new(self.spec.schema.clone(), columns)?,
                kind,
            ));
            start += run_len;
        }
        Ok(())
    }
}

impl Keyed {
    /// Folds the rows `rows` of the batch into their groups and records the
    /// new values of the groups whose result they changed.
    fn update(
        &mut self,
        spec: &ChangelogAggregateSpec,
        groups: &[ArrayRef],
        args: &[Vec<ArrayRef>],
        filters: &[Option<ArrayRef>],
        rows: &UInt32Array,
        changed: &mut Changed,
    ) -> Result<()> {
        let keys: Vec<ArrayRef> = groups
            .iter()
            .map(|g| take(g, rows, None))
            .collect::<std::result::Result<_, _>>()?;
        let known = self.accumulators.len();
        match &mut self.keys {
            Some(values) => values.intern(&keys, &mut self.ids)?,
            None => {
                self.ids.clear();
                self.ids.resize(rows.len(), 0);
            }
        }
        let total = self.ids.iter().max().map_or(0, |m| m + 1).max(known);
        self.emitted.resize(total, None);
        while self.accumulators.len() < total {
            let accs = spec
                .aggregates
                .iter()
                .map(|a| a.function.create_accumulator())
                .collect::<datafusion::error::Result<_>>()?;
            self.accumulators.push(accs);
        }
        // Row by row, so that every row that changes a result emits its
        // new value, however the input was cut into batches; a row that
        // leaves the result as it was emits nothing.
        for (local, &id) in self.ids.iter().enumerate() {
            let row = rows.value(local) as usize;
            let mut values = Vec::with_capacity(spec.aggregates.len());
            for (agg, accumulator) in self.accumulators[id].iter_mut().enumerate() {
                let counted = filters[agg]
                    .as_ref()
                    .is_none_or(|mask| mask.is_valid(row) && mask.as_boolean().value(row));
                if counted {
                    let inputs: Vec<ArrayRef> = args[agg].iter().map(|a| a.slice(row, 1)).collect();
                    accumulator.update_batch(&inputs)?;
                }
                values.push(accumulator.evaluate()?);
            }
            let last = &mut self.emitted[id];
            if last.as_ref() == Some(&values) {
                continue;
            }
            changed.key_rows.push(row as u32);
            changed.new.push(last.is_none());
            changed.values.push(values.clone());
            *last = Some(values);
        }
        Ok(())
    }
}

impl Operator for ChangelogAggregateOp {
    fn describe(&self) -> String {
        aggregate::describe(
            "changelog aggregate",
            &self.spec.groups,
            &self.spec.aggregates,
        )
    }

    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        let groups = evaluate_all(&self.spec.groups, &batch)?;
        let AggregateInputs { args, filters } =
            AggregateInputs::evaluate(&self.spec.aggregates, &batch)?;
        let mut changed = Changed {
            key_rows: Vec::new(),
            values: Vec::new(),
            new: Vec::new(),
        };
        let windows = self.rows_by_window(&groups, batch.num_rows());
        for (end, rows) in windows {
            if !self.states.contains_key(&end) {
                let keyed = self.new_keyed()?;
                self.states.insert(end, keyed);
            }
            let keyed = self.states.get_mut(&end).expect("inserted above");
            keyed.update(
                &self.spec,
                &groups,
                &args,
                &filters,
                &UInt32Array::from(rows),
                &mut changed,
            )?;
        }
        self.output(&groups, &changed, out)
    }

    /// Table `groups`: per window and group, its keys, accumulator states
    /// and the values it last emitted, which a change is compared with;
    /// keyed by the grouping keys other than the window.
    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        let fields = self.group_fields()?;
        let mut parts = vec![RecordBatch::new_empty(Arc::new(Schema::new(
            fields.clone(),
        )))];
        let ends: Vec<i64> = self.states.keys().copied().collect();
        for end in ends {
            let keyed = self.states.get_mut(&end).expect("listed above");
            parts.push(keyed.snapshot(&self.spec, &fields, end)?);
        }
        let groups = concat_batches(&parts[0].schema(), &parts)?;
        let window = self.spec.window_end.map(|(column, _)| column);
        let key_columns = (0..self.spec.group_schema.fields().len())
            .filter(|&c| Some(c) != window)
            .map(|c| GROUP_COLUMNS + c)
            .collect();
        let mut state = OperatorState::new();
        state.add("groups", groups, key_columns);
        Ok(Some(state))
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        let table = checked_table(&state, "groups", &self.group_fields()?)?;
        let table = sorted_by(&table, &[0, 1])?;
        let ends = int64s(&table, 0)?.clone();
        let mut row = 0;
        while row < table.num_rows() {
            let end = ends.value(row);
            let run = (row..table.num_rows())
                .take_while(|&r| ends.value(r) == end)
                .count();
            let mut keyed = self.new_keyed()?;
            keyed.restore(&self.spec, &table.slice(row, run))?;
            self.states.insert(end, keyed);
            row += run;
        }
        Ok(())
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        if self.spec.window_end.is_some() {
            let lateness = self.spec.lateness_ms;
            self.states
                .retain(|&end, _| end.saturating_add(lateness) > watermark);
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }
}

/// Leading columns of the `groups` state table, before the grouping,
/// state and emitted columns: the window end (`i64::MAX` without a window)
/// and the group id.
const GROUP_COLUMNS: usize = 2;

impl ChangelogAggregateOp {
    /// Columns of the `groups` table: window end, group id, the grouping
    /// columns, every aggregate's state, whether the group has emitted, and
    /// the values it emitted last.
    fn group_fields(&self) -> Result<Vec<Field>> {
        let mut fields = vec![
            Field::new("window_end", DataType::Int64, true),
            Field::new("group", DataType::Int64, true),
        ];
        fields.extend(aggregate::nullable_fields(&self.spec.group_schema));
        fields.extend(aggregate::state_fields(&self.spec.aggregates)?);
        fields.push(Field::new("emitted", DataType::Boolean, true));
        let values = self.spec.schema.fields().len() - self.spec.aggregates.len();
        for (i, field) in self.spec.schema.fields().iter().skip(values).enumerate() {
            let name = format!("{i}:emitted {}", field.name());
            fields.push(Field::new(name, field.data_type().clone(), true));
        }
        Ok(fields)
    }
}

impl Keyed {
    /// The groups as rows of the `groups` table. `Accumulator::state` may
    /// empty an accumulator, so each is rebuilt by merging its state into
    /// a fresh one.
    fn snapshot(
        &mut self,
        spec: &ChangelogAggregateSpec,
        fields: &[Field],
        end: i64,
    ) -> Result<RecordBatch> {
        let groups = self.accumulators.len();
        let widths = aggregate::state_widths(&spec.aggregates)?;
        let state_columns: usize = widths.iter().sum();
        let mut states: Vec<Vec<ScalarValue>> = vec![Vec::with_capacity(groups); state_columns];
        for accumulators in self.accumulators.iter_mut() {
            let mut column = 0;
            for (accumulator, aggregate) in accumulators.iter_mut().zip(&spec.aggregates) {
                let state = accumulator.state()?;
                let arrays: Vec<ArrayRef> = state
                    .iter()
                    .map(|v| v.to_array())
                    .collect::<datafusion::error::Result<_>>()?;
                let mut fresh = aggregate.function.create_accumulator()?;
                fresh.merge_batch(&arrays)?;
                *accumulator = fresh;
                for value in state {
                    states[column].push(value);
                    column += 1;
                }
            }
        }
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![end; groups])),
            Arc::new(Int64Array::from_iter_values(0..groups as i64)),
        ];
        columns.extend(self.key_columns(spec, groups)?);
        let first_state = columns.len();
        for (i, values) in states.into_iter().enumerate() {
            columns.push(scalars_to_array(values, &fields[first_state + i])?);
        }
        let emitted = self.emitted.iter().map(|e| Some(e.is_some()));
        columns.push(Arc::new(BooleanArray::from_iter(emitted)));
        for agg in 0..spec.aggregates.len() {
            let field = &fields[columns.len()];
            let values: Vec<ScalarValue> = self
                .emitted
                .iter()
                .map(|e| match e {
                    Some(values) => Ok(values[agg].clone()),
                    None => ScalarValue::try_from(field.data_type()),
                })
                .collect::<datafusion::error::Result<_>>()?;
            columns.push(scalars_to_array(values, field)?);
        }
        aggregate::state_batch(fields.to_vec(), columns)
    }

    /// The grouping columns of the groups, in group-id order, leaving the
    /// groups as they were.
    fn key_columns(
        &mut self,
        spec: &ChangelogAggregateSpec,
        groups: usize,
    ) -> Result<Vec<ArrayRef>> {
        let Some(values) = &mut self.keys else {
            return Ok(Vec::new());
        };
        let keys = values.emit(EmitTo::All)?;
        let mut fresh = new_group_values(spec.group_schema.clone(), &GroupOrdering::None)?;
        fresh.intern(&keys, &mut self.ids)?;
        *values = fresh;
        debug_assert_eq!(values.len(), groups);
        Ok(keys)
    }

    /// Takes back the groups of one window from rows of the `groups` table,
    /// sorted by group id.
    fn restore(&mut self, spec: &ChangelogAggregateSpec, table: &RecordBatch) -> Result<()> {
        let rows = table.num_rows();
        let group_count = spec.group_schema.fields().len();
        let widths = aggregate::state_widths(&spec.aggregates)?;
        let states_at = GROUP_COLUMNS + group_count;
        let emitted_at = states_at + widths.iter().sum::<usize>();
        if let Some(values) = &mut self.keys {
            values.intern(&table.columns()[GROUP_COLUMNS..states_at], &mut self.ids)?;
        }
        let emitted = aggregate::booleans(table, emitted_at)?;
        for row in 0..rows {
            let mut column = states_at;
            let mut accumulators = Vec::with_capacity(spec.aggregates.len());
            for (aggregate, width) in spec.aggregates.iter().zip(&widths) {
                let state: Vec<ArrayRef> = (column..column + width)
                    .map(|c| table.column(c).slice(row, 1))
                    .collect();
                let mut accumulator = aggregate.function.create_accumulator()?;
                accumulator.merge_batch(&state)?;
                accumulators.push(accumulator);
                column += width;
            }
            self.accumulators.push(accumulators);
            self.emitted.push(match emitted.value(row) {
                true => Some(
                    (0..spec.aggregates.len())
                        .map(|agg| {
                            ScalarValue::try_from_array(table.column(emitted_at + 1 + agg), row)
                        })
                        .collect::<datafusion::error::Result<_>>()?,
                ),
                false => None,
            });
        }
        Ok(())
    }
}

/// `values` as one column of `field`'s type.
fn scalars_to_array(values: Vec<ScalarValue>, field: &Field) -> Result<ArrayRef> {
    if values.is_empty() {
        return Ok(new_empty_array(field.data_type()));
    }
    Ok(ScalarValue::iter_to_array(values)?)
}
