//! `EMIT CHANGES` aggregation: a row out for every input row that changes a
//! result.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, UInt32Array};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{SchemaRef, TimestampMillisecondType};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Accumulator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::group_values::{GroupValues, new_group_values};
use datafusion::physical_plan::aggregates::order::GroupOrdering;

use super::aggregate::{self, AggregateInputs, AggregateSpec, evaluate_all};
use super::{Message, Operator, RowKind};
use crate::error::Result;

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
