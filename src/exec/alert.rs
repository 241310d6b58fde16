//! The alert operator: per key, inactive -> pending -> firing -> resolved,
//! in event time.
//!
//! Rows wait until the watermark passes their event time and are then
//! taken in event-time order, so an alert's changes do not depend on how
//! its input was batched or how out of order it arrived. Only changes are
//! emitted (`firing`, `resolved`); a condition that keeps holding emits
//! nothing more.
//!
//! `FOR INTERVAL` counts event time from the first row of the episode (the
//! Prometheus `for:` rule): the alert fires at the first row at least that
//! long after it. `FOR n WINDOWS` fires at the n-th consecutive row. When
//! the query's rows are windows of a grid, a key that skips a window breaks
//! a pending episode. A deadman (`WHEN ABSENT FOR`) fires at `last row +
//! interval` once the watermark passes that time with no row of the key,
//! and resolves at the key's next row; the end of a finite input is not
//! silence, so it fires nothing.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, StringArray,
    TimestampMillisecondArray, UInt32Array, new_null_array,
};
use datafusion::arrow::compute::kernels::zip::zip;
use datafusion::arrow::compute::{cast, concat_batches, take, take_record_batch};
use datafusion::arrow::datatypes::{
    DataType, Field, Int64Type, Schema, SchemaRef, TimeUnit, TimestampMillisecondType,
};
use datafusion::arrow::row::{OwnedRow, RowConverter, SortField};

use super::{END_OF_INPUT, Message, Operator};
use crate::error::{Error, Result};
use crate::plan::template::MessageTemplate;
use crate::plan::{AlertHold, AlertRule, AlertSpec};
use crate::state::OperatorState;

/// Turns a query's rows into the alert's state changes.
pub struct AlertOp {
    spec: AlertSpec,
    input: SchemaRef,
    output: SchemaRef,
    converter: RowConverter,
    template: Option<MessageTemplate>,
    /// `RESOLVE MESSAGE`, for resolved rows (which have no message without it).
    resolve_template: Option<MessageTemplate>,
    /// `LABELS` then `ANNOTATIONS` templates, in their columns' order.
    named: Vec<MessageTemplate>,
    keys: HashMap<OwnedRow, KeyState>,
    /// Rows whose event time the watermark has not passed yet.
    waiting: Vec<RecordBatch>,
    /// Over shed input: the `_shed_fraction` column of the input, and the
    /// query's counters, for the `approximate` column.
    approximate: Option<(usize, Arc<super::QueryStats>)>,
}

#[derive(Debug, Clone, Copy)]
struct KeyState {
    phase: Phase,
    /// Event time of the key's latest row.
    last: i64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Inactive,
    Pending {
        since: i64,
        rows: u64,
    },
    /// `resolving`: since when the resolve condition has held, row after
    /// row, while `KEEP FIRING FOR` keeps the alert firing.
    Firing {
        since: i64,
        resolving: Option<i64>,
    },
}

/// One state change, before it becomes an output row.
struct Change {
    key: OwnedRow,
    firing: bool,
    event_time: i64,
    since: i64,
    /// The input row it comes from (none for a deadman firing).
    row: Option<u32>,
}

impl AlertOp {
    /// An operator for `spec` over rows of `input`, producing `output`.
    pub fn try_new(spec: AlertSpec, input: SchemaRef, output: SchemaRef) -> Result<Self> {
        let mut fields: Vec<SortField> = spec
            .keys
            .iter()
            .map(|&i| SortField::new(input.field(i).data_type().clone()))
            .collect();
        if fields.is_empty() {
            // An alert without keys has one state for the whole stream: a
            // constant key column, since rows of no columns cannot be told
            // apart (or even counted) by the row format.
            fields.push(SortField::new(DataType::Boolean));
        }
        let parse = |t: &Option<String>| t.as_deref().map(MessageTemplate::parse).transpose();
        let template = parse(&spec.message)?;
        let resolve_template = parse(&spec.resolve_message)?;
        let named = spec
            .labels
            .iter()
            .chain(&spec.annotations)
            .map(|(_, t)| MessageTemplate::parse(t))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            named,
            converter: RowConverter::new(fields)?,
            spec,
            input,
            output,
            template,
            resolve_template,
            keys: HashMap::new(),
            waiting: Vec::new(),
            approximate: None,
        })
    }

    /// Marks each output row `approximate` (a last output column) when the
    /// input row it comes from had `_shed_fraction` (input column
    /// `fraction`) above 0; a change no row caused (a deadman firing, whose
    /// silence shedding may have made) is approximate once the query has
    /// shed anything (`stats`).
    pub fn with_approximate(mut self, fraction: usize, stats: Arc<super::QueryStats>) -> Self {
        self.approximate = Some((fraction, stats));
        self
    }

    /// The `approximate` column for `changes`, whose rows index `batch`.
    fn approximate_column(
        &self,
        (fraction, stats): &(usize, Arc<super::QueryStats>),
        changes: &[Change],
        batch: Option<&RecordBatch>,
    ) -> ArrayRef {
        let shed = stats.shed_rows.load(std::sync::atomic::Ordering::Relaxed) > 0;
        let fractions = batch.map(|b| {
            b.column(*fraction)
                .as_primitive::<datafusion::arrow::datatypes::Float64Type>()
                .clone()
        });
        let marks = changes.iter().map(|c| match (c.row, &fractions) {
            (Some(r), Some(f)) => f.value(r as usize) > 0.0,
            _ => shed,
        });
        Arc::new(BooleanArray::from_iter(marks.map(Some)))
    }

    /// The key columns of `batch` as the converter reads them: a constant
    /// column for an alert without keys.
    fn key_columns(&self, batch: &RecordBatch) -> Vec<ArrayRef> {
        let mut columns: Vec<ArrayRef> = self
            .spec
            .keys
            .iter()
            .map(|&i| batch.column(i).clone())
            .collect();
        if columns.is_empty() {
            columns.push(Arc::new(BooleanArray::from(vec![true; batch.num_rows()])));
        }
        columns
    }

    /// Takes the waiting rows with event time <= `watermark`, in event-time
    /// order (arrival order among equal times).
    fn take_ready(&mut self, watermark: i64) -> Result<Option<(RecordBatch, Vec<i64>)>> {
        if self.waiting.is_empty() {
            return Ok(None);
        }
        let all = concat_batches(&self.input, &std::mem::take(&mut self.waiting))?;
        let times = event_times(all.column(self.spec.event_time))?;
        let (mut ready, wait): (Vec<u32>, Vec<u32>) =
            (0..all.num_rows() as u32).partition(|&i| times[i as usize] <= watermark);
        ready.sort_by_key(|&i| times[i as usize]);
        if !wait.is_empty() {
            self.waiting
                .push(take_record_batch(&all, &UInt32Array::from(wait))?);
        }
        if ready.is_empty() {
            return Ok(None);
        }
        let ready_times = ready.iter().map(|&i| times[i as usize]).collect();
        let batch = take_record_batch(&all, &UInt32Array::from(ready))?;
        Ok(Some((batch, ready_times)))
    }

    /// Runs the ready rows through their keys' state machines.
    fn apply_rows(&mut self, batch: &RecordBatch, times: &[i64]) -> Result<Vec<Change>> {
        let rows = self.converter.convert_columns(&self.key_columns(batch))?;
        let mut changes = Vec::new();
        match self.spec.rule {
            AlertRule::When {
                when,
                resolve,
                hold,
            } => {
                let when = batch.column(when).as_boolean();
                let resolve = resolve.map(|r| batch.column(r).as_boolean());
                let step_ms = self.spec.step_ms;
                let keep_ms = self.spec.keep_ms;
                for (i, &t) in times.iter().enumerate() {
                    let holds = is_true(when, i);
                    let resolves = resolve.map_or(!holds, |r| is_true(r, i));
                    let state = self.state(rows.row(i).owned(), t);
                    let row = Row { t, holds, resolves };
                    if let Some((firing, since)) = step_when(state, row, hold, keep_ms, step_ms) {
                        changes.push(change(rows.row(i).owned(), firing, t, since, Some(i)));
                    }
                }
            }
            AlertRule::Absent { interval_ms } => {
                for (i, &t) in times.iter().enumerate() {
                    let key = rows.row(i).owned();
                    let state = self.state(key.clone(), t);
                    for (firing, at, since) in step_absent(state, t, interval_ms) {
                        changes.push(change(key.clone(), firing, at, since, Some(i)));
                    }
                }
            }
        }
        Ok(changes)
    }

    /// The state of `key`, created (as seen at `t`) on its first row.
    fn state(&mut self, key: OwnedRow, t: i64) -> &mut KeyState {
        self.keys.entry(key).or_insert(KeyState {
            phase: Phase::Inactive,
            last: t,
        })
    }

    /// Deadman firings of keys silent since before `watermark - interval`.
    fn silent_keys(&mut self, watermark: i64) -> Vec<Change> {
        let AlertRule::Absent { interval_ms } = self.spec.rule else {
            return Vec::new();
        };
        let mut changes: Vec<Change> = self
            .keys
            .iter_mut()
            .filter(|(_, s)| s.phase == Phase::Inactive && s.last + interval_ms < watermark)
            .map(|(key, s)| {
                s.phase = Phase::Firing {
                    since: s.last,
                    resolving: None,
                };
                change(key.clone(), true, s.last + interval_ms, s.last, None)
            })
            .collect();
        changes.sort_by(|a, b| (a.event_time, &a.key).cmp(&(b.event_time, &b.key)));
        changes
    }

    /// The alert rows for `changes`, whose rows index `batch`.
    fn output_batch(&self, changes: &[Change], batch: Option<&RecordBatch>) -> Result<RecordBatch> {
        let n = changes.len();
        let mut columns: Vec<ArrayRef> =
            vec![Arc::new(StringArray::from(vec![
                self.spec.name.as_str();
                n
            ]))];
        let keys = self
            .converter
            .convert_rows(changes.iter().map(|c| c.key.row()))?;
        if !self.spec.keys.is_empty() {
            columns.extend(keys);
        }
        let state = changes
            .iter()
            .map(|c| if c.firing { "firing" } else { "resolved" });
        columns.push(Arc::new(StringArray::from_iter_values(state)));
        let times = |f: fn(&Change) -> i64| {
            Arc::new(TimestampMillisecondArray::from_iter_values(
                changes.iter().map(f),
            )) as ArrayRef
        };
        columns.push(times(|c| c.event_time));
        columns.push(times(|c| c.since));
        let rows: UInt32Array = changes.iter().map(|c| c.row).collect();
        for &i in &self.spec.values {
            columns.push(match batch {
                Some(b) => take(b.column(i), &rows, None)?,
                None => new_null_array(self.input.field(i).data_type(), n),
            });
        }
        columns.push(Arc::new(StringArray::from(vec![
            self.spec
                .severity
                .as_deref();
            n
        ])));
        let fields = self.output.fields()[..columns.len()].to_vec();
        let partial = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns.clone())?;
        columns.push(self.messages(changes, &partial)?);
        for template in &self.named {
            columns.push(template.render(&partial)?);
        }
        let columns = columns
            .into_iter()
            .zip(self.output.fields())
            .map(|(c, f)| match c.data_type() == f.data_type() {
                true => Ok(c),
                false => cast(&c, f.data_type()),
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let mut columns = columns;
        if let Some(approximate) = &self.approximate {
            columns.push(self.approximate_column(approximate, changes, batch));
        }
        Ok(RecordBatch::try_new(self.output.clone(), columns)?)
    }
}

impl AlertOp {
    /// The `message` column: `MESSAGE` rendered for firing rows; for
    /// resolved rows `RESOLVE MESSAGE`, else `MESSAGE` if it reads
    /// `{state}` (written for both), else nothing: the firing text filled
    /// in with the values that resolved the alert would say what is no
    /// longer so ("44.0 outside what was learned").
    fn messages(&self, changes: &[Change], partial: &RecordBatch) -> Result<ArrayRef> {
        let render = |template: Option<&MessageTemplate>| match template {
            Some(template) => template.render(partial),
            None => Ok(new_null_array(&DataType::Utf8, changes.len())),
        };
        let message = render(self.template.as_ref())?;
        let for_both = self
            .template
            .as_ref()
            .filter(|t| t.columns().contains(&"state"));
        let resolved = render(self.resolve_template.as_ref().or(for_both))?;
        let firing: BooleanArray = changes.iter().map(|c| Some(c.firing)).collect();
        Ok(zip(&firing, &message, &resolved)?)
    }
}

fn change(key: OwnedRow, firing: bool, event_time: i64, since: i64, row: Option<usize>) -> Change {
    Change {
        key,
        firing,
        event_time,
        since,
        row: row.map(|r| r as u32),
    }
}

fn is_true(column: &BooleanArray, i: usize) -> bool {
    column.is_valid(i) && column.value(i)
}

/// One row of a `WHEN` alert's key, as its conditions read it.
#[derive(Debug, Clone, Copy)]
struct Row {
    /// Its event time.
    t: i64,
    /// The `WHEN` condition is true.
    holds: bool,
    /// The resolve condition is true.
    resolves: bool,
}

/// One row of a `WHEN` alert's key: the change it causes, as
/// `(firing, since)`, if any. `keep_ms` is `KEEP FIRING FOR`.
fn step_when(
    state: &mut KeyState,
    Row { t, holds, resolves }: Row,
    hold: AlertHold,
    keep_ms: Option<i64>,
    step_ms: Option<i64>,
) -> Option<(bool, i64)> {
    let skipped_window = step_ms.is_some_and(|step| t - state.last > step);
    state.last = state.last.max(t);
    if let Phase::Pending { .. } = state.phase
        && skipped_window
    {
        state.phase = Phase::Inactive;
    }
    match state.phase {
        Phase::Firing { since, resolving } => {
            if !resolves {
                state.phase = Phase::Firing {
                    since,
                    resolving: None,
                };
                return None;
            }
            let resolving = resolving.unwrap_or(t);
            if keep_ms.is_some_and(|keep| t - resolving < keep) {
                state.phase = Phase::Firing {
                    since,
                    resolving: Some(resolving),
                };
                return None;
            }
            state.phase = Phase::Inactive;
            Some((false, since))
        }
        _ if !holds => {
            state.phase = Phase::Inactive;
            None
        }
        Phase::Inactive => advance(state, t, t, 1, hold),
        Phase::Pending { since, rows } => advance(state, t, since, rows + 1, hold),
    }
}

/// A row at `t` where the condition holds, the episode having begun at
/// `since` with `rows` rows so far (this one included).
fn advance(
    state: &mut KeyState,
    t: i64,
    since: i64,
    rows: u64,
    hold: AlertHold,
) -> Option<(bool, i64)> {
    let fires = match hold {
        AlertHold::Now => true,
        AlertHold::Interval(ms) => t - since >= ms,
        AlertHold::Rows(n) => rows >= n,
    };
    if fires {
        state.phase = Phase::Firing {
            since,
            resolving: None,
        };
        Some((true, since))
    } else {
        state.phase = Phase::Pending { since, rows };
        None
    }
}

/// One row of a deadman alert's key: `(firing, event_time, since)` of each
/// change it causes.
fn step_absent(state: &mut KeyState, t: i64, interval_ms: i64) -> Vec<(bool, i64, i64)> {
    let last = state.last;
    state.last = last.max(t);
    match state.phase {
        Phase::Firing { since, .. } => {
            state.phase = Phase::Inactive;
            vec![(false, t, since)]
        }
        _ if t - last > interval_ms => vec![(true, last + interval_ms, last), (false, t, last)],
        _ => Vec::new(),
    }
}

/// The event times of `column` in milliseconds; NULL becomes `i64::MIN`.
pub(super) fn event_times(column: &ArrayRef) -> Result<Vec<i64>> {
    let millis = cast(column, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
    let millis = millis.as_primitive::<TimestampMillisecondType>();
    // A row without event time cannot wait for the watermark: take it now.
    Ok((0..millis.len())
        .map(|i| match millis.is_valid(i) {
            true => millis.value(i),
            false => i64::MIN,
        })
        .collect())
}

impl Operator for AlertOp {
    fn describe(&self) -> String {
        format!("alert {}", self.spec.name)
    }

    fn on_batch(&mut self, batch: RecordBatch, _out: &mut Vec<Message>) -> Result<()> {
        self.waiting.push(batch);
        Ok(())
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        if let Some((batch, times)) = self.take_ready(watermark)? {
            let changes = self.apply_rows(&batch, &times)?;
            if !changes.is_empty() {
                out.push(Message::Batch(self.output_batch(&changes, Some(&batch))?));
            }
        }
        if watermark != END_OF_INPUT {
            let changes = self.silent_keys(watermark);
            if !changes.is_empty() {
                out.push(Message::Batch(self.output_batch(&changes, None)?));
            }
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    /// Tables `keys` (each key's state machine, keyed by the alert's key
    /// columns) and `waiting` (the rows the watermark has not passed yet,
    /// in arrival order).
    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        let mut state = OperatorState::new();
        let key_columns = (0..self.spec.keys.len()).collect();
        state.add("keys", self.keys_table()?, key_columns);
        let waiting = concat_batches(&self.input, &self.waiting)?;
        state.add("waiting", waiting, self.spec.keys.clone());
        Ok(Some(state))
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        self.restore_keys(&state.table_of("keys", &self.keys_schema())?)?;
        let waiting = state.table_of("waiting", &self.input)?;
        self.waiting = (waiting.num_rows() > 0)
            .then_some(waiting)
            .into_iter()
            .collect();
        Ok(())
    }
}

/// The columns of the `keys` state table after the key columns.
const KEY_STATE_COLUMNS: [&str; 4] = ["phase", "since", "rows", "last"];

/// The column after them for an alert with `KEEP FIRING FOR`: since when a
/// firing key's resolve condition has held (alerts without it keep the
/// table they always had).
const RESOLVING_COLUMN: &str = "resolving";

impl AlertOp {
    /// The schema of the `keys` table: the alert's key columns, then each
    /// key's phase (0 inactive, 1 pending, 2 firing), the start of its
    /// episode, its pending rows and the event time of its latest row.
    fn keys_schema(&self) -> SchemaRef {
        let mut fields: Vec<Field> = self
            .spec
            .keys
            .iter()
            .map(|&i| self.input.field(i).clone().with_nullable(true))
            .collect();
        fields.extend(
            KEY_STATE_COLUMNS.map(|name| Field::new(name, DataType::Int64, name != "phase")),
        );
        if self.spec.keep_ms.is_some() {
            fields.push(Field::new(RESOLVING_COLUMN, DataType::Int64, true));
        }
        Arc::new(Schema::new(fields))
    }

    fn keys_table(&self) -> Result<RecordBatch> {
        let (keys, mut columns) =
            super::sorted_keys(&self.keys, &self.converter, !self.spec.keys.is_empty())?;
        let phases = keys.iter().map(|(_, s)| match s.phase {
            Phase::Inactive => (0, None, None),
            Phase::Pending { since, rows } => (1, Some(since), Some(rows as i64)),
            Phase::Firing { since, .. } => (2, Some(since), None),
        });
        let phases: Vec<(i64, Option<i64>, Option<i64>)> = phases.collect();
        columns.push(Arc::new(Int64Array::from_iter_values(
            phases.iter().map(|p| p.0),
        )));
        columns.push(Arc::new(phases.iter().map(|p| p.1).collect::<Int64Array>()));
        columns.push(Arc::new(phases.iter().map(|p| p.2).collect::<Int64Array>()));
        columns.push(Arc::new(Int64Array::from_iter_values(
            keys.iter().map(|(_, s)| s.last),
        )));
        if self.spec.keep_ms.is_some() {
            let resolving = keys.iter().map(|(_, s)| match s.phase {
                Phase::Firing { resolving, .. } => resolving,
                _ => None,
            });
            columns.push(Arc::new(resolving.collect::<Int64Array>()));
        }
        Ok(RecordBatch::try_new(self.keys_schema(), columns)?)
    }

    fn restore_keys(&mut self, table: &RecordBatch) -> Result<()> {
        let n = self.spec.keys.len();
        let mut key_columns = table.columns()[..n].to_vec();
        if key_columns.is_empty() {
            key_columns.push(Arc::new(BooleanArray::from(vec![true; table.num_rows()])));
        }
        let rows = self.converter.convert_columns(&key_columns)?;
        let column = |name: &str| {
            table
                .column(
                    n + KEY_STATE_COLUMNS
                        .iter()
                        .position(|c| *c == name)
                        .expect("a state column"),
                )
                .as_primitive::<Int64Type>()
        };
        let (phase, since, pending, last) = (
            column("phase"),
            column("since"),
            column("rows"),
            column("last"),
        );
        let resolving = table
            .column_by_name(RESOLVING_COLUMN)
            .map(|c| c.as_primitive::<Int64Type>().clone());
        let resolving_at = |i: usize| {
            resolving
                .as_ref()
                .filter(|r| r.is_valid(i))
                .map(|r| r.value(i))
        };
        for i in 0..table.num_rows() {
            let since_at = || match since.is_valid(i) {
                true => Ok(since.value(i)),
                false => Err(Error::Plan(
                    "alert state: an episode without its start".into(),
                )),
            };
            let phase = match phase.value(i) {
                0 => Phase::Inactive,
                1 => Phase::Pending {
                    since: since_at()?,
                    rows: pending.value(i) as u64,
                },
                2 => Phase::Firing {
                    since: since_at()?,
                    resolving: resolving_at(i),
                },
                other => return Err(Error::Plan(format!("alert state: unknown phase {other}"))),
            };
            let state = KeyState {
                phase,
                last: last.value(i),
            };
            self.keys.insert(rows.row(i).owned(), state);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_when(rows: &[(i64, bool)], hold: AlertHold, step: Option<i64>) -> Vec<(bool, i64, i64)> {
        let mut state = KeyState {
            phase: Phase::Inactive,
            last: rows[0].0,
        };
        rows.iter()
            .filter_map(|&(t, holds)| {
                let row = Row {
                    t,
                    holds,
                    resolves: !holds,
                };
                step_when(&mut state, row, hold, None, step).map(|(f, since)| (f, t, since))
            })
            .collect()
    }

    #[test]
    fn without_for_a_true_row_fires_and_repeats_are_silent() {
        let rows = [(10, true), (20, true), (30, false), (40, false), (50, true)];
        assert_eq!(
            run_when(&rows, AlertHold::Now, None),
            [(true, 10, 10), (false, 30, 10), (true, 50, 50)]
        );
    }

    #[test]
    fn for_interval_counts_from_the_first_true_row() {
        let rows = [
            (10, true),
            (20, true),
            (25, false),
            (30, true),
            (49, true),
            (50, true),
        ];
        assert_eq!(
            run_when(&rows, AlertHold::Interval(20), None),
            [(true, 50, 30)]
        );
    }

    #[test]
    fn for_rows_and_a_skipped_window() {
        let rows = [(10, true), (20, true), (40, true), (50, true), (60, true)];
        assert_eq!(
            run_when(&rows, AlertHold::Rows(3), Some(10)),
            [(true, 60, 40)],
            "the gap 20 -> 40 restarts the count"
        );
        assert_eq!(run_when(&rows, AlertHold::Rows(3), None), [(true, 40, 10)]);
    }

    #[test]
    fn a_firing_alert_waits_for_its_resolve_condition() {
        let mut state = KeyState {
            phase: Phase::Inactive,
            last: 0,
        };
        let hold = AlertHold::Now;
        let row = |t, holds, resolves| Row { t, holds, resolves };
        assert_eq!(
            step_when(&mut state, row(0, true, false), hold, None, None),
            Some((true, 0))
        );
        // Neither holding nor resolving (between the thresholds): silent.
        assert_eq!(
            step_when(&mut state, row(1, false, false), hold, None, None),
            None
        );
        assert_eq!(
            state.phase,
            Phase::Firing {
                since: 0,
                resolving: None
            }
        );
        assert_eq!(
            step_when(&mut state, row(2, false, true), hold, None, None),
            Some((false, 0))
        );
        assert_eq!(state.phase, Phase::Inactive);
    }

    #[test]
    fn keep_firing_waits_for_the_resolve_condition_to_hold_that_long() {
        let mut state = KeyState {
            phase: Phase::Inactive,
            last: 0,
        };
        let rows = [
            (0, true),
            (10, false), // stops holding: keep firing until 40
            (20, true),  // holds again: the clock starts over
            (30, false),
            (50, false),
            (59, false),
            (60, false), // 30 s after 30: resolves
            (70, true),
        ];
        let changes: Vec<(bool, i64, i64)> = rows
            .iter()
            .filter_map(|&(t, holds)| {
                let row = Row {
                    t,
                    holds,
                    resolves: !holds,
                };
                step_when(&mut state, row, AlertHold::Now, Some(30), None)
                    .map(|(f, since)| (f, t, since))
            })
            .collect();
        assert_eq!(changes, [(true, 0, 0), (false, 60, 0), (true, 70, 70)]);
    }

    #[test]
    fn deadman_gap_inside_the_rows_fires_and_resolves() {
        let mut state = KeyState {
            phase: Phase::Inactive,
            last: 0,
        };
        assert!(step_absent(&mut state, 5, 10).is_empty());
        assert!(
            step_absent(&mut state, 15, 10).is_empty(),
            "exactly the interval"
        );
        assert_eq!(
            step_absent(&mut state, 40, 10),
            [(true, 25, 15), (false, 40, 15)]
        );
        state.phase = Phase::Firing {
            since: 40,
            resolving: None,
        };
        assert_eq!(step_absent(&mut state, 70, 10), [(false, 70, 40)]);
    }

    /// Rows of windows that lost rows to shedding make approximate alert
    /// rows; rows of exact windows do not.
    #[test]
    fn alert_rows_from_shed_windows_are_approximate() {
        use datafusion::arrow::array::Float64Array;
        let input = Arc::new(Schema::new(vec![
            Field::new("t", DataType::Timestamp(TimeUnit::Millisecond, None), false),
            Field::new("hot", DataType::Boolean, false),
            Field::new("_shed_fraction", DataType::Float64, false),
        ]));
        let spec = AlertSpec {
            name: "a".into(),
            keys: Vec::new(),
            event_time: 0,
            rule: AlertRule::When {
                when: 1,
                resolve: None,
                hold: AlertHold::Now,
            },
            values: Vec::new(),
            step_ms: None,
            severity: None,
            message: None,
            resolve_message: None,
            keep_ms: None,
            labels: Vec::new(),
            annotations: Vec::new(),
        };
        let text = |name: &str| Field::new(name, DataType::Utf8, true);
        let time = |name: &str| {
            Field::new(
                name,
                DataType::Timestamp(TimeUnit::Millisecond, None),
                false,
            )
        };
        let output = Arc::new(Schema::new(vec![
            text("alert"),
            text("state"),
            time("event_time"),
            time("since"),
            text("severity"),
            text("message"),
            Field::new("approximate", DataType::Boolean, false),
        ]));
        let stats = Arc::new(super::super::QueryStats::default());
        let mut op = AlertOp::try_new(spec, input.clone(), output)
            .unwrap()
            .with_approximate(2, stats);
        let batch = RecordBatch::try_new(
            input,
            vec![
                Arc::new(TimestampMillisecondArray::from(vec![1_000, 2_000, 3_000])),
                Arc::new(BooleanArray::from(vec![true, false, true])),
                Arc::new(Float64Array::from(vec![0.25, 0.0, 0.0])),
            ],
        )
        .unwrap();
        let mut out = Vec::new();
        op.on_batch(batch, &mut out).unwrap();
        op.on_watermark(END_OF_INPUT, &mut out).unwrap();
        let Message::Batch(rows) = &out[0] else {
            panic!("{out:?}")
        };
        let marks = rows.column(6).as_boolean();
        // Fires at 1 s (shed window), resolves at 2 s, fires at 3 s.
        assert_eq!(
            marks.iter().collect::<Vec<_>>(),
            vec![Some(true), Some(false), Some(false)]
        );
    }
}
