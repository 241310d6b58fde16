//! Control streams: a second stream whose rows change how a query treats
//! its input while it runs, applied in event-time order with the data:
//! they block and unblock keys (a silence, a maintenance window, a list of
//! words to drop), or set parameters the query reads (a threshold).
//!
//! A control row says, for one key, from its event time on: `block` (with
//! an optional `until`, the event time the block ends at) or `unblock`. A
//! data row is dropped when the last control row of its key at or before
//! its event time blocks it. Data rows wait until the merged watermark (of
//! data and control) has passed them, so every control row that can affect
//! them is in, and the result does not depend on how the two streams'
//! rows interleave on arrival. A data row that comes later than that is
//! judged by the control rows kept then (see [`ControlFilter::prune`]).
//!
//! With parameters instead, a control row sets the parameter its `name`
//! column names to its `value` from its event time on, and every data row
//! goes on with one more column per parameter: the value set last at or
//! before its event time, or the parameter's default.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, StringArray, UInt32Array,
    UInt64Array,
};
use datafusion::arrow::compute::{cast, concat_batches, filter_record_batch, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimestampMillisecondType};
use datafusion::arrow::record_batch::RecordBatch;

use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{CastExpr, Column};

use super::{MergeOperator, Message};
use crate::error::{Error, Result};
use crate::state::OperatorState;

/// The end of a finite input, as a watermark.
const END_OF_INPUT: i64 = i64::MAX;

/// How a control stream's columns and the data's key line up.
#[derive(Debug, Clone)]
pub struct ControlSpec {
    /// The data rows' schema (the operator's output schema too).
    pub data_schema: SchemaRef,
    /// The data's event-time column.
    pub data_time: usize,
    /// The control rows' schema.
    pub control_schema: SchemaRef,
    /// The control stream's event-time column.
    pub control_time: usize,
    /// Its column of keys (blocks) or parameter names (parameters).
    pub control_key: usize,
    /// What the control rows do.
    pub mode: ControlMode,
    /// The rows going on: the data's, plus a column per parameter.
    pub output_schema: SchemaRef,
}

/// What a control stream's rows do.
#[derive(Debug, Clone)]
pub enum ControlMode {
    /// Block and unblock the keys of a data column.
    Block {
        /// The data column the control rows name keys of.
        data_key: usize,
        /// The control `action` column (`block` or `unblock`), if it has
        /// one: without one, every control row blocks.
        action: Option<usize>,
        /// The control `until` column (when a block ends), if it has one.
        until: Option<usize>,
    },
    /// Set parameters that the data rows carry as columns.
    Params {
        /// Each parameter's name and default, in the order of its column.
        params: Vec<(String, f64)>,
        /// The control `value` column.
        value: usize,
    },
}

/// One control row, decoded.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Control {
    ts: i64,
    /// Arrival order, which decides between rows of one key and one time.
    seq: u64,
    block: bool,
    until: Option<i64>,
    /// The value a parameter's row sets.
    value: Option<f64>,
}

impl Control {
    /// Whether it drops a row of its key at `ts` (at or after its own).
    fn blocks_at(&self, ts: i64) -> bool {
        self.block && self.until.is_none_or(|until| ts < until)
    }

    /// Whether rows to come still depend on it, once it is a key's last.
    fn matters_at(&self, ts: i64) -> bool {
        self.value.is_some() || self.blocks_at(ts)
    }
}

/// A batch of data rows waiting.
struct Waiting {
    rows: RecordBatch,
    earliest: i64,
    arrival: u64,
}

/// Drops the data rows whose key a control stream blocks at their event
/// time (see the [module docs](self)). Input 0 is the data, input 1 the
/// control stream.
pub struct ControlFilter {
    spec: ControlSpec,
    /// Data rows waiting for the merged watermark, in order of arrival,
    /// each batch with its earliest event time (a watermark copies only
    /// the batches it has rows of) and its arrival number.
    waiting: Vec<Waiting>,
    arrivals: u64,
    /// Per key, its control rows in order of event time and arrival: the
    /// last one at or before the watermark and every one after it.
    controls: HashMap<String, Vec<Control>>,
    next_seq: u64,
    watermark: i64,
    /// Control rows that did not decode, counted for the warning.
    bad_controls: u64,
}

impl ControlFilter {
    /// A control filter as the planner describes it.
    pub fn new(spec: ControlSpec) -> Self {
        ControlFilter {
            spec,
            waiting: Vec::new(),
            arrivals: 0,
            controls: HashMap::new(),
            next_seq: 0,
            watermark: i64::MIN,
            bad_controls: 0,
        }
    }

    fn describe(&self) -> String {
        match &self.spec.mode {
            ControlMode::Block { data_key, .. } => format!(
                "control by key {} (a control stream blocks and unblocks keys)",
                self.spec.data_schema.field(*data_key).name()
            ),
            ControlMode::Params { params, .. } => {
                let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
                format!(
                    "parameters {} (a control stream sets them)",
                    names.join(", ")
                )
            }
        }
    }

    fn on_data(&mut self, batch: RecordBatch) {
        let arrival = self.arrivals;
        self.arrivals += 1;
        self.wait(batch, arrival);
    }

    /// Keeps `rows` waiting in the place of arrival `arrival`.
    fn wait(&mut self, rows: RecordBatch, arrival: u64) {
        if rows.num_rows() == 0 {
            return;
        }
        let times = rows
            .column(self.spec.data_time)
            .as_primitive_opt::<TimestampMillisecondType>();
        let earliest = match times {
            Some(t) if t.null_count() == 0 => {
                datafusion::arrow::compute::min(t).unwrap_or(i64::MIN)
            }
            _ => i64::MIN,
        };
        let at = self.waiting.partition_point(|w| w.arrival < arrival);
        self.waiting.insert(
            at,
            Waiting {
                rows,
                earliest,
                arrival,
            },
        );
    }

    fn on_control(&mut self, batch: &RecordBatch) -> Result<()> {
        let spec = &self.spec;
        let times = batch
            .column(spec.control_time)
            .as_primitive_opt::<TimestampMillisecondType>()
            .ok_or_else(|| Error::Plan("a control stream's event time is not a TIMESTAMP".into()))?
            .clone();
        let keys = text(batch.column(spec.control_key))?;
        let (action, until, value) = match &spec.mode {
            ControlMode::Block { action, until, .. } => (*action, *until, None),
            ControlMode::Params { value, .. } => (None, None, Some(*value)),
        };
        let actions = action.map(|i| text(batch.column(i))).transpose()?;
        let values = value
            .map(|i| -> Result<_> {
                let cast = cast(batch.column(i), &DataType::Float64)?;
                Ok(cast
                    .as_primitive::<datafusion::arrow::datatypes::Float64Type>()
                    .clone())
            })
            .transpose()?;
        let until = until
            .map(|i| {
                batch
                    .column(i)
                    .as_primitive_opt::<TimestampMillisecondType>()
                    .cloned()
                    .ok_or_else(|| {
                        Error::Plan("a control stream's until is not a TIMESTAMP".into())
                    })
            })
            .transpose()?;
        for row in 0..batch.num_rows() {
            if times.is_null(row) || keys.is_null(row) {
                self.bad(format!("row {row} has no event time or no key"));
                continue;
            }
            let value = match &values {
                None => None,
                Some(v) if v.is_valid(row) => Some(v.value(row)),
                Some(_) => {
                    self.bad(format!(
                        "row {row} sets {} to no value; row skipped",
                        keys.value(row)
                    ));
                    continue;
                }
            };
            let block = match actions.as_ref().filter(|a| a.is_valid(row)) {
                None => value.is_none(),
                Some(a) => match a.value(row).trim().to_ascii_lowercase().as_str() {
                    "block" => true,
                    "unblock" => false,
                    other => {
                        self.bad(format!(
                            "action '{other}' is neither 'block' nor 'unblock'; row skipped"
                        ));
                        continue;
                    }
                },
            };
            let control = Control {
                ts: times.value(row),
                seq: self.next_seq,
                block,
                until: until
                    .as_ref()
                    .filter(|u| u.is_valid(row))
                    .map(|u| u.value(row)),
                value,
            };
            self.next_seq += 1;
            let list = self
                .controls
                .entry(keys.value(row).to_string())
                .or_default();
            let at = list.partition_point(|c| (c.ts, c.seq) <= (control.ts, control.seq));
            list.insert(at, control);
        }
        Ok(())
    }

    /// Warns of a control row that does not decode, the first few times.
    fn bad(&mut self, why: String) {
        self.bad_controls += 1;
        if self.bad_controls <= 10 {
            crate::diag::warning!("control stream: {why}");
        }
    }

    /// The control row of `key` that decides for a data row at `ts`.
    fn deciding(&self, key: &str, ts: i64) -> Option<&Control> {
        let list = self.controls.get(key)?;
        let at = list.partition_point(|c| c.ts <= ts);
        at.checked_sub(1).map(|i| &list[i])
    }

    /// Whether a data row of `key` at `ts` is dropped.
    fn blocked(&self, key: &str, ts: i64) -> bool {
        self.deciding(key, ts).is_some_and(|c| c.blocks_at(ts))
    }

    /// The waiting rows the watermark has passed, judged, in event-time
    /// order (rows of one time as they came); the others keep waiting.
    fn release(&mut self, watermark: i64) -> Result<Option<RecordBatch>> {
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| w.earliest < watermark);
        self.waiting = later;
        let mut released = Vec::new();
        for batch in due {
            if let Some(rows) = self.release_batch(batch, watermark)? {
                released.push(rows);
            }
        }
        if released.is_empty() {
            return Ok(None);
        }
        let rows = concat_batches(&self.spec.data_schema, &released)?;
        let times = rows
            .column(self.spec.data_time)
            .as_primitive::<TimestampMillisecondType>();
        let mut order: Vec<(i64, u32)> = (0..rows.num_rows())
            .map(|r| {
                let t = if times.is_null(r) {
                    i64::MIN
                } else {
                    times.value(r)
                };
                (t, r as u32)
            })
            .collect();
        // Stable: rows of one time stay in order of arrival.
        order.sort_by_key(|&(ts, _)| ts);
        let indices = UInt32Array::from_iter_values(order.into_iter().map(|(_, r)| r));
        let sorted = take_record_batch(&rows, &indices)?;
        self.with_params(sorted).map(Some)
    }

    /// The rows of one waiting batch the watermark has passed and that
    /// go on; the others wait again in its place.
    fn release_batch(&mut self, batch: Waiting, watermark: i64) -> Result<Option<RecordBatch>> {
        let rows = batch.rows;
        let times = rows
            .column(self.spec.data_time)
            .as_primitive_opt::<TimestampMillisecondType>()
            .ok_or_else(|| {
                Error::Plan("the controlled stream's event time is not a TIMESTAMP".into())
            })?
            .clone();
        let passed = |row: usize| times.is_null(row) || times.value(row) < watermark;
        let keep: BooleanArray = (0..rows.num_rows()).map(|r| Some(!passed(r))).collect();
        self.wait(filter_record_batch(&rows, &keep)?, batch.arrival);
        let go: BooleanArray = match &self.spec.mode {
            ControlMode::Block { data_key, .. } => {
                let keys = text(rows.column(*data_key))?;
                let free = |r: usize| {
                    keys.is_null(r)
                        || times.is_null(r)
                        || !self.blocked(keys.value(r), times.value(r))
                };
                (0..rows.num_rows())
                    .map(|r| Some(passed(r) && free(r)))
                    .collect()
            }
            ControlMode::Params { .. } => (0..rows.num_rows()).map(|r| Some(passed(r))).collect(),
        };
        let out = filter_record_batch(&rows, &go)?;
        Ok((out.num_rows() > 0).then_some(out))
    }

    /// `rows` with a column per parameter: its value at each row's time.
    fn with_params(&self, rows: RecordBatch) -> Result<RecordBatch> {
        let ControlMode::Params { params, .. } = &self.spec.mode else {
            return Ok(rows);
        };
        let times = rows
            .column(self.spec.data_time)
            .as_primitive::<TimestampMillisecondType>();
        let mut columns = rows.columns().to_vec();
        for (name, default) in params {
            let values = (0..rows.num_rows()).map(|r| {
                let at = if times.is_null(r) {
                    i64::MIN
                } else {
                    times.value(r)
                };
                self.deciding(name, at)
                    .and_then(|c| c.value)
                    .unwrap_or(*default)
            });
            columns.push(Arc::new(Float64Array::from_iter_values(values)));
        }
        Ok(RecordBatch::try_new(
            self.spec.output_schema.clone(),
            columns,
        )?)
    }

    /// Drops the control rows the watermark has made useless: of each
    /// key, those before its last at or before the watermark, and a key
    /// whose last one no longer blocks anything to come.
    fn prune(&mut self, watermark: i64) {
        self.controls.retain(|_, list| {
            let at = list.partition_point(|c| c.ts <= watermark);
            if at > 1 {
                list.drain(..at - 1);
            }
            // Kept while a later row may come or the last one still matters.
            let settled = list.len() == 1 && list[0].ts <= watermark;
            !settled || list[0].matters_at(watermark)
        });
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        self.watermark = self.watermark.max(watermark);
        if let Some(rows) = self.release(self.watermark)? {
            out.push(Message::Batch(rows));
        }
        if self.watermark != END_OF_INPUT {
            self.prune(self.watermark);
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    /// The type of the `controls` state table's key: the data key's for
    /// blocks, so that a restore splits both tables by the key groups the
    /// rows are routed by (see [`ControlFilter::input_keys`]).
    fn key_type(&self) -> DataType {
        match &self.spec.mode {
            ControlMode::Block { data_key, .. } => {
                self.spec.data_schema.field(*data_key).data_type().clone()
            }
            ControlMode::Params { .. } => DataType::Utf8,
        }
    }

    /// The schema of the `controls` state table.
    fn controls_schema(key: DataType) -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("key", key, false),
            Field::new("ts", DataType::Int64, false),
            Field::new("seq", DataType::UInt64, false),
            Field::new("block", DataType::Boolean, false),
            Field::new("until", DataType::Int64, true),
            Field::new("value", DataType::Float64, true),
        ]))
    }

    /// The waiting data rows (table `waiting`) and the control rows kept
    /// (table `controls`, in key order).
    fn snapshot(&mut self) -> Result<OperatorState> {
        let mut state = OperatorState::new();
        let batches: Vec<&RecordBatch> = self.waiting.iter().map(|w| &w.rows).collect();
        let waiting = concat_batches(&self.spec.data_schema, batches)?;
        let mut keys: Vec<&String> = self.controls.keys().collect();
        keys.sort();
        let rows: Vec<(&String, &Control)> = keys
            .into_iter()
            .flat_map(|k| self.controls[k].iter().map(move |c| (k, c)))
            .collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|(k, _)| k.as_str()),
            )),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|(_, c)| c.ts))),
            Arc::new(UInt64Array::from_iter_values(
                rows.iter().map(|(_, c)| c.seq),
            )),
            Arc::new(BooleanArray::from_iter(
                rows.iter().map(|(_, c)| Some(c.block)),
            )),
            Arc::new(Int64Array::from_iter(rows.iter().map(|(_, c)| c.until))),
            Arc::new(Float64Array::from_iter(rows.iter().map(|(_, c)| c.value))),
        ];
        let controls = RecordBatch::try_new(Self::controls_schema(DataType::Utf8), columns)?;
        let (waiting_keys, control_keys) = match &self.spec.mode {
            ControlMode::Block { data_key, .. } => (vec![*data_key], vec![0]),
            ControlMode::Params { .. } => (Vec::new(), Vec::new()),
        };
        let controls = keys_as(controls, self.key_type())?;
        state.add("waiting", waiting, waiting_keys);
        state.add("controls", controls, control_keys);
        state.add_scalars("meta", &[("next_seq", Some(self.next_seq as i64))]);
        Ok(state)
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        self.on_data(state.table_of("waiting", &self.spec.data_schema)?);
        let controls = state.table_of("controls", &Self::controls_schema(self.key_type()))?;
        let keys = text(controls.column(0))?;
        let ts = controls
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        let seq = controls
            .column(2)
            .as_primitive::<datafusion::arrow::datatypes::UInt64Type>();
        let block = controls.column(3).as_boolean();
        let until = controls
            .column(4)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        let value = controls
            .column(5)
            .as_primitive::<datafusion::arrow::datatypes::Float64Type>();
        for row in 0..controls.num_rows() {
            self.controls
                .entry(keys.value(row).to_string())
                .or_default()
                .push(Control {
                    ts: ts.value(row),
                    seq: seq.value(row),
                    block: block.value(row),
                    until: until.is_valid(row).then(|| until.value(row)),
                    value: value.is_valid(row).then(|| value.value(row)),
                });
        }
        let next = state.scalar("meta", "next_seq")?.unwrap_or(0);
        self.next_seq = u64::try_from(next).unwrap_or(0);
        Ok(())
    }
}

/// `column` as text, whatever its type (a key compares as its text).
fn text(column: &ArrayRef) -> Result<StringArray> {
    let cast = cast(column, &DataType::Utf8)?;
    Ok(cast.as_string::<i32>().clone())
}

/// The `controls` table (keys as text) with its keys as `key`, the data
/// key's type. A control key whose text is not the text of a value of that
/// type matches no data row: it is left out.
fn keys_as(controls: RecordBatch, key: DataType) -> Result<RecordBatch> {
    if key == DataType::Utf8 {
        return Ok(controls);
    }
    let texts = controls.column(0);
    let safe = datafusion::arrow::compute::CastOptions {
        safe: true,
        ..Default::default()
    };
    let typed = datafusion::arrow::compute::cast_with_options(texts, &key, &safe)?;
    let back = text(&typed)?;
    let texts = texts.as_string::<i32>();
    let keep: BooleanArray = (0..controls.num_rows())
        .map(|r| Some(typed.is_valid(r) && back.value(r) == texts.value(r)))
        .collect();
    let mut columns = controls.columns().to_vec();
    columns[0] = typed;
    let columns = columns
        .iter()
        .map(|c| datafusion::arrow::compute::filter(c, &keep))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(
        ControlFilter::controls_schema(key),
        columns,
    )?)
}

impl MergeOperator for ControlFilter {
    fn describe(&self) -> String {
        ControlFilter::describe(self)
    }

    /// Blocks run per key: data rows by their key column, control rows by
    /// theirs as the data key's type. Parameters apply to every row: they
    /// run as one instance.
    fn input_keys(&self) -> Option<Vec<Vec<Arc<dyn PhysicalExpr>>>> {
        let ControlMode::Block { data_key, .. } = &self.spec.mode else {
            return None;
        };
        let column = |schema: &SchemaRef, i: usize| -> Arc<dyn PhysicalExpr> {
            Arc::new(Column::new(schema.field(i).name(), i))
        };
        let data = column(&self.spec.data_schema, *data_key);
        let key = self.key_type();
        let control = column(&self.spec.control_schema, self.spec.control_key);
        let control = match self
            .spec
            .control_schema
            .field(self.spec.control_key)
            .data_type()
        {
            same if *same == key => control,
            _ => Arc::new(CastExpr::new(
                control,
                key,
                Some(datafusion::arrow::compute::CastOptions {
                    safe: true,
                    ..Default::default()
                }),
            )),
        };
        Some(vec![vec![data], vec![control]])
    }

    /// Rows go on in event-time order (see [`ControlFilter::release`]).
    fn output_time(&self) -> Option<usize> {
        Some(self.spec.data_time)
    }

    fn on_rows(&mut self, input: usize, batch: RecordBatch) -> Result<()> {
        match input {
            0 => {
                self.on_data(batch);
                Ok(())
            }
            _ => self.on_control(&batch),
        }
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        ControlFilter::on_watermark(self, watermark, out)
    }

    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        ControlFilter::snapshot(self).map(Some)
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        ControlFilter::restore(self, state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::TimestampMillisecondArray;

    fn data_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new(
                "ts",
                DataType::Timestamp(datafusion::arrow::datatypes::TimeUnit::Millisecond, None),
                true,
            ),
            Field::new("word", DataType::Utf8, true),
        ]))
    }

    fn control_schema() -> SchemaRef {
        let ts = DataType::Timestamp(datafusion::arrow::datatypes::TimeUnit::Millisecond, None);
        Arc::new(Schema::new(vec![
            Field::new("ts", ts.clone(), true),
            Field::new("key", DataType::Utf8, true),
            Field::new("action", DataType::Utf8, true),
            Field::new("until", ts, true),
        ]))
    }

    fn filter() -> ControlFilter {
        ControlFilter::new(ControlSpec {
            data_schema: data_schema(),
            data_time: 0,
            control_schema: control_schema(),
            control_time: 0,
            control_key: 1,
            mode: ControlMode::Block {
                data_key: 1,
                action: Some(2),
                until: Some(3),
            },
            output_schema: data_schema(),
        })
    }

    fn words(rows: &[(i64, &str)]) -> RecordBatch {
        RecordBatch::try_new(
            data_schema(),
            vec![
                Arc::new(TimestampMillisecondArray::from_iter_values(
                    rows.iter().map(|r| r.0),
                )),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap()
    }

    fn controls(rows: &[(i64, &str, Option<&str>, Option<i64>)]) -> RecordBatch {
        RecordBatch::try_new(
            control_schema(),
            vec![
                Arc::new(TimestampMillisecondArray::from_iter_values(
                    rows.iter().map(|r| r.0),
                )),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(StringArray::from_iter(rows.iter().map(|r| r.2))),
                Arc::new(TimestampMillisecondArray::from_iter(
                    rows.iter().map(|r| r.3),
                )),
            ],
        )
        .unwrap()
    }

    /// What comes out: `word@ts` per row, `wm:<ms>` per watermark.
    fn drive(f: &mut ControlFilter, steps: &[Step<'_>]) -> Vec<String> {
        let mut got = Vec::new();
        for step in steps {
            let mut out = Vec::new();
            match step {
                Step::Data(rows) => f.on_rows(0, words(rows)).unwrap(),
                Step::Control(rows) => f.on_rows(1, controls(rows)).unwrap(),
                Step::Watermark(w) => MergeOperator::on_watermark(f, *w, &mut out).unwrap(),
            }
            for m in out {
                match m {
                    Message::Batch(b) => {
                        let ts = b.column(0).as_primitive::<TimestampMillisecondType>();
                        let w = b.column(1).as_string::<i32>();
                        for r in 0..b.num_rows() {
                            got.push(format!("{}@{}", w.value(r), ts.value(r)));
                        }
                    }
                    Message::Watermark(w) => got.push(format!("wm:{w}")),
                    _ => {}
                }
            }
        }
        got
    }

    enum Step<'a> {
        Data(&'a [(i64, &'a str)]),
        Control(&'a [(i64, &'a str, Option<&'a str>, Option<i64>)]),
        Watermark(i64),
    }

    #[test]
    fn the_courses_words_drop_and_ignore() {
        // The control stream names the words to drop, as in the course's
        // connected-streams example.
        let got = drive(
            &mut filter(),
            &[
                Step::Control(&[(0, "DROP", None, None), (0, "IGNORE", None, None)]),
                Step::Data(&[(1, "Apache"), (2, "DROP"), (3, "Flink"), (4, "IGNORE")]),
                Step::Watermark(END_OF_INPUT),
            ],
        );
        assert_eq!(
            got,
            ["Apache@1", "Flink@3", format!("wm:{END_OF_INPUT}").as_str()]
        );
    }

    #[test]
    fn control_rows_apply_by_event_time_whatever_their_arrival() {
        let data: &[(i64, &str)] = &[(5, "h1"), (15, "h1"), (25, "h1"), (35, "h1")];
        let ctl: &[(i64, &str, Option<&str>, Option<i64>)] = &[
            (30, "h1", Some("unblock"), None),
            (10, "h1", Some("block"), None),
        ];
        let want = ["h1@5", "h1@35", "wm:100"];
        // Control after the data, out of order itself.
        let late = drive(
            &mut filter(),
            &[Step::Data(data), Step::Control(ctl), Step::Watermark(100)],
        );
        assert_eq!(late, want);
        let early = drive(
            &mut filter(),
            &[Step::Control(ctl), Step::Data(data), Step::Watermark(100)],
        );
        assert_eq!(early, want);
    }

    #[test]
    fn a_block_ends_at_its_until_and_rows_wait_for_the_watermark() {
        let mut f = filter();
        let got = drive(
            &mut f,
            &[
                Step::Control(&[(10, "h1", Some("BLOCK"), Some(20))]),
                Step::Data(&[(9, "h1"), (10, "h1"), (19, "h1"), (20, "h1"), (12, "h2")]),
                Step::Watermark(15),
                Step::Watermark(30),
            ],
        );
        assert_eq!(got, ["h1@9", "h2@12", "wm:15", "h1@20", "wm:30"]);
        assert!(f.controls.is_empty(), "an ended block is not kept");
    }

    #[test]
    fn rows_of_one_time_go_on_in_order_of_arrival_across_watermarks() {
        let got = drive(
            &mut filter(),
            &[
                Step::Data(&[(5, "x"), (15, "y")]),
                Step::Data(&[(15, "z"), (12, "w")]),
                Step::Watermark(10),
                Step::Watermark(20),
            ],
        );
        assert_eq!(got, ["x@5", "wm:10", "w@12", "y@15", "z@15", "wm:20"]);
    }

    #[test]
    fn a_bad_action_skips_its_row_only() {
        let got = drive(
            &mut filter(),
            &[
                Step::Control(&[(0, "a", Some("mute"), None), (0, "b", None, None)]),
                Step::Data(&[(1, "a"), (2, "b")]),
                Step::Watermark(10),
            ],
        );
        assert_eq!(got, ["a@1", "wm:10"]);
    }

    #[test]
    fn a_restore_anywhere_gives_what_running_straight_gives() {
        let steps = [
            Step::Control(&[(10, "h1", None, Some(40))]),
            Step::Data(&[(5, "h1"), (12, "h2"), (15, "h1")]),
            Step::Watermark(11),
            Step::Control(&[(20, "h2", None, None), (30, "h2", Some("unblock"), None)]),
            Step::Data(&[(25, "h2"), (35, "h1"), (45, "h1"), (32, "h2")]),
            Step::Watermark(33),
            Step::Watermark(END_OF_INPUT),
        ];
        let straight = drive(&mut filter(), &steps);
        assert_eq!(
            straight,
            [
                "h1@5",
                "wm:11",
                "h2@12",
                "h2@32",
                "wm:33",
                "h1@45",
                format!("wm:{END_OF_INPUT}").as_str()
            ]
        );
        for cut in 0..=steps.len() {
            let mut first = filter();
            let before = drive(&mut first, &steps[..cut]);
            let state = first.snapshot().unwrap();
            let mut restored = filter();
            restored.restore(state).unwrap();
            let after = drive(&mut restored, &steps[cut..]);
            assert_eq!([before, after].concat(), straight, "cut {cut}");
        }
    }

    #[test]
    fn parameters_go_on_as_columns_with_their_value_at_each_rows_time() {
        let ts = DataType::Timestamp(datafusion::arrow::datatypes::TimeUnit::Millisecond, None);
        let settings = Arc::new(Schema::new(vec![
            Field::new("ts", ts.clone(), true),
            Field::new("name", DataType::Utf8, true),
            Field::new("value", DataType::Float64, true),
        ]));
        let mut fields = data_schema().fields().to_vec();
        fields.push(Arc::new(Field::new("limit", DataType::Float64, false)));
        let mut f = ControlFilter::new(ControlSpec {
            data_schema: data_schema(),
            data_time: 0,
            control_schema: settings.clone(),
            control_time: 0,
            control_key: 1,
            mode: ControlMode::Params {
                params: vec![("limit".into(), 90.0)],
                value: 2,
            },
            output_schema: Arc::new(Schema::new(fields)),
        });
        let set = |rows: &[(i64, &str, Option<f64>)]| {
            RecordBatch::try_new(
                settings.clone(),
                vec![
                    Arc::new(TimestampMillisecondArray::from_iter_values(
                        rows.iter().map(|r| r.0),
                    )),
                    Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
                    Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.2))),
                ],
            )
            .unwrap()
        };
        // Set to 50 at 10 and to 80 at 30, the later row first; a row
        // without a value is skipped.
        f.on_rows(
            1,
            set(&[(30, "limit", Some(80.0)), (10, "limit", Some(50.0))]),
        )
        .unwrap();
        f.on_rows(1, set(&[(20, "limit", None)])).unwrap();
        f.on_rows(0, words(&[(5, "a"), (15, "b"), (35, "c")]))
            .unwrap();
        let mut out = Vec::new();
        MergeOperator::on_watermark(&mut f, 100, &mut out).unwrap();
        let Message::Batch(rows) = &out[0] else {
            panic!("rows first: {out:?}")
        };
        let limits = rows
            .column(2)
            .as_primitive::<datafusion::arrow::datatypes::Float64Type>();
        assert_eq!(limits.values().to_vec(), [90.0, 50.0, 80.0]);
        // After the watermark only the value in force is kept.
        assert_eq!(f.controls["limit"].len(), 1);
    }
}
