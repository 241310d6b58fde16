//! Session windows: per key, rows closer than the gap form one window.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, TimestampMillisecondArray, UInt32Array,
    new_empty_array,
};
use datafusion::arrow::compute::{concat, filter, take};
use datafusion::arrow::datatypes::{DataType, Field, SchemaRef, TimestampMillisecondType};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::row::{RowConverter, SortField};

use super::aggregate::{
    self, AggregateInputs, AggregateSpec, checked_table, evaluate_all, time_scalar,
};
use super::window_aggregate::{Frozen, GroupSlot, Groups};
use super::{LateRows, Message, Operator, QueryStats, send_late};
use crate::connector::RowKind;
use crate::error::{Error, Result};
use crate::state::OperatorState;

/// Gives each row its own session `[t, t + gap)` in `window_start` and
/// `window_end`, and drops rows that are late: `t + gap + allowed lateness
/// <= watermark` at their arrival.
pub struct SessionAssignOp {
    time_column: usize,
    gap_ms: i64,
    delay_ms: i64,
    lateness_ms: i64,
    max_seen: i64,
    schema: SchemaRef,
    stats: Arc<QueryStats>,
    late_rows: Arc<LateRows>,
}

impl SessionAssignOp {
    /// Sessions on `time_column`; `schema` is the input's plus the two
    /// window columns.
    pub fn new(
        time_column: usize,
        gap_ms: i64,
        delay_ms: i64,
        lateness_ms: i64,
        schema: SchemaRef,
        stats: Arc<QueryStats>,
        late_rows: Arc<LateRows>,
    ) -> Self {
        Self {
            time_column,
            gap_ms,
            delay_ms,
            lateness_ms,
            max_seen: i64::MIN,
            schema,
            stats,
            late_rows,
        }
    }
}

impl Operator for SessionAssignOp {
    fn describe(&self) -> String {
        format!(
            "session(gap {} ms) on column {}",
            self.gap_ms, self.time_column
        )
    }

    /// Table `meta`: the largest event time seen, which the lateness of
    /// later rows is judged by.
    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        let mut state = OperatorState::new();
        state.add_scalars("meta", &[("max_seen", time_scalar(self.max_seen))]);
        Ok(Some(state))
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        self.max_seen = state.scalar("meta", "max_seen")?.unwrap_or(i64::MIN);
        Ok(())
    }

    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        if self.lateness_ms > 0 && batch.num_rows() > 1 {
            // Sessions that take late rows fire again on them, so each row
            // must meet the watermark its arrival made, as it would one by
            // one: the batch goes on a row at a time, each followed by the
            // watermark after it.
            for row in 0..batch.num_rows() {
                self.on_batch(batch.slice(row, 1), out)?;
                let watermark = self.max_seen.saturating_sub(self.delay_ms);
                out.push(Message::Watermark(watermark));
            }
            return Ok(());
        }
        let times = batch
            .column(self.time_column)
            .as_primitive::<TimestampMillisecondType>();
        let mut keep = Vec::with_capacity(times.len());
        let mut starts = Vec::with_capacity(times.len());
        for t in times.iter() {
            let on_time = t.is_some_and(|t| {
                self.max_seen = self.max_seen.max(t);
                t + self.gap_ms + self.lateness_ms > self.max_seen.saturating_sub(self.delay_ms)
            });
            keep.push(on_time);
            if let (true, Some(t)) = (on_time, t) {
                starts.push(t);
            }
        }
        let late = times.len() - starts.len();
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        if late > 0 {
            self.stats
                .late_rows
                .fetch_add(late as u64, Ordering::Relaxed);
            send_late(&self.late_rows, &batch, &keep)?;
            let mask = BooleanArray::from(keep);
            columns = columns
                .iter()
                .map(|c| filter(c, &mask))
                .collect::<std::result::Result<_, _>>()?;
        }
        if starts.is_empty() {
            return Ok(());
        }
        let ends: TimestampMillisecondArray = starts
            .iter()
            .map(|s| s + self.gap_ms)
            .collect::<Vec<_>>()
            .into();
        columns.push(Arc::new(TimestampMillisecondArray::from(starts)));
        columns.push(Arc::new(ends));
        out.push(Message::Batch(RecordBatch::try_new(
            self.schema.clone(),
            columns,
        )?));
        Ok(())
    }
}

/// The planner's description of a session aggregate.
#[derive(Debug, Clone)]
pub struct SessionAggregateSpec {
    /// Grouping expressions other than the window columns: the session key.
    pub keys: Vec<Arc<dyn datafusion::physical_expr::PhysicalExpr>>,
    /// Output fields of `keys`.
    pub key_schema: SchemaRef,
    /// The output's grouping columns, in order.
    pub layout: Vec<GroupSlot>,
    /// Evaluates to each row's own session start (its event time).
    pub start: Arc<dyn datafusion::physical_expr::PhysicalExpr>,
    /// Inactivity gap in milliseconds.
    pub gap_ms: i64,
    /// How long after firing a session still takes rows (each firing it
    /// again as an update).
    pub lateness_ms: i64,
    /// The aggregates, in output order after the grouping columns.
    pub aggregates: Vec<AggregateSpec>,
    /// Output schema: grouping columns, then aggregates.
    pub schema: SchemaRef,
}

/// Aggregates per key and session.
///
/// Each open session keeps its partial aggregates in DataFusion
/// accumulators. A row that overlaps one session extends it; a row that
/// bridges several merges them (their states are merged as Arrow arrays).
/// A session fires when the watermark reaches its last row plus the gap.
pub struct SessionAggregateOp {
    spec: SessionAggregateSpec,
    converter: RowConverter,
    sessions: HashMap<u64, Session>,
    /// Open session ids per key (the key in Arrow's row format).
    by_key: HashMap<Box<[u8]>, Vec<u64>>,
    /// Open sessions by end, for firing in order.
    by_end: BTreeSet<(i64, u64)>,
    next_id: u64,
    watermark: i64,
}

struct Session {
    key: Box<[u8]>,
    start: i64,
    end: i64,
    groups: Groups,
    /// A result has been sent for this session.
    emitted: bool,
    /// Rows came in since the last result.
    dirty: bool,
}

impl SessionAggregateOp {
    /// A session aggregate as the planner describes it.
    pub fn new(spec: SessionAggregateSpec) -> Result<Self> {
        let fields = spec
            .key_schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        Ok(Self {
            converter: RowConverter::new(fields)?,
            spec,
            sessions: HashMap::new(),
            by_key: HashMap::new(),
            by_end: BTreeSet::new(),
            next_id: 0,
            watermark: i64::MIN,
        })
    }

    /// Finds or makes the session row `[t, t + gap)` of `key` falls in,
    /// merging the sessions it bridges; returns its id.
    fn place(&mut self, key: &[u8], t: i64) -> Result<u64> {
        let end = t + self.spec.gap_ms;
        let ids = self.by_key.entry(key.into()).or_default();
        let touching: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| {
                let s = &self.sessions[id];
                s.start < end && t < s.end
            })
            .collect();
        let Some((&keep, absorbed)) = touching.split_first() else {
            let id = self.next_id;
            self.next_id += 1;
            ids.push(id);
            let groups = Groups::new(None, &self.spec.aggregates)?;
            self.sessions.insert(
                id,
                Session {
                    key: key.into(),
                    start: t,
                    end,
                    groups,
                    emitted: false,
                    dirty: true,
                },
            );
            self.by_end.insert((end, id));
            return Ok(id);
        };
        ids.retain(|id| !absorbed.contains(id));
        let (mut start, mut new_end, mut emitted) = (t, end, false);
        for id in absorbed {
            let mut gone = self.sessions.remove(id).expect("open session");
            self.by_end.remove(&(gone.end, *id));
            start = start.min(gone.start);
            new_end = new_end.max(gone.end);
            emitted |= gone.emitted;
            let frozen = gone.groups.freeze()?;
            self.sessions
                .get_mut(&keep)
                .expect("open session")
                .groups
                .merge(&frozen)?;
        }
        let session = self.sessions.get_mut(&keep).expect("open session");
        self.by_end.remove(&(session.end, keep));
        session.start = session.start.min(start);
        session.end = session.end.max(new_end);
        session.emitted |= emitted;
        session.dirty = true;
        self.by_end.insert((session.end, keep));
        Ok(keep)
    }

    /// Forgets a session.
    fn remove(&mut self, id: u64) -> Session {
        let session = self.sessions.remove(&id).expect("open session");
        self.by_end.remove(&(session.end, id));
        if let Some(open) = self.by_key.get_mut(&session.key) {
            open.retain(|other| *other != id);
            if open.is_empty() {
                self.by_key.remove(&session.key);
            }
        }
        session
    }

    /// The current result of a session, keeping its state (for sessions
    /// that may still take late rows).
    fn peek(&mut self, id: u64) -> Result<Vec<ArrayRef>> {
        let aggregates = &self.spec.aggregates;
        let session = self.sessions.get_mut(&id).expect("open session");
        let frozen = session.groups.freeze()?;
        let mut kept = Groups::new(None, aggregates)?;
        kept.merge(&frozen)?;
        let mut copy = Groups::new(None, aggregates)?;
        copy.merge(&frozen)?;
        session.groups = kept;
        Ok(copy.evaluate()?.1)
    }

    /// Result rows for the sessions `ids`; with `forget`, their state is
    /// dropped, else kept for late rows.
    fn fire(&mut self, ids: &[u64], forget: bool) -> Result<Option<RecordBatch>> {
        if ids.is_empty() {
            return Ok(None);
        }
        let mut keys = Vec::with_capacity(ids.len());
        let mut starts = Vec::with_capacity(ids.len());
        let mut ends = Vec::with_capacity(ids.len());
        let mut values: Vec<Vec<ArrayRef>> = vec![Vec::new(); self.spec.aggregates.len()];
        for &id in ids {
            let session = &self.sessions[&id];
            keys.push(session.key.clone());
            starts.push(session.start);
            ends.push(session.end);
            let evaluated = if forget {
                self.remove(id).groups.evaluate()?.1
            } else {
                let values = self.peek(id)?;
                let session = self.sessions.get_mut(&id).expect("open session");
                session.emitted = true;
                session.dirty = false;
                values
            };
            for (column, value) in values.iter_mut().zip(evaluated) {
                column.push(value);
            }
        }
        let parser = self.converter.parser();
        let key_columns = self
            .converter
            .convert_rows(keys.iter().map(|k| parser.parse(k)))?;
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.spec.schema.fields().len());
        for slot in &self.spec.layout {
            columns.push(match *slot {
                GroupSlot::Key(i) => key_columns[i].clone(),
                GroupSlot::WindowStart => Arc::new(TimestampMillisecondArray::from(starts.clone())),
                GroupSlot::WindowEnd => Arc::new(TimestampMillisecondArray::from(ends.clone())),
            });
        }
        for column in values {
            let parts: Vec<&dyn datafusion::arrow::array::Array> =
                column.iter().map(|a| a.as_ref()).collect();
            columns.push(concat(&parts)?);
        }
        Ok(Some(RecordBatch::try_new(
            self.spec.schema.clone(),
            columns,
        )?))
    }
}

impl Operator for SessionAggregateOp {
    fn describe(&self) -> String {
        let kind = format!("session aggregate (gap {} ms)", self.spec.gap_ms);
        aggregate::describe(&kind, &self.spec.keys, &self.spec.aggregates)
    }

    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        let keys = evaluate_all(&self.spec.keys, &batch)?;
        let rows = self.converter.convert_columns(&keys)?;
        // With no key columns every row has the same, empty key.
        let key = |i: usize| {
            if keys.is_empty() {
                &[][..]
            } else {
                rows.row(i).data()
            }
        };
        let starts = self
            .spec
            .start
            .evaluate(&batch)?
            .into_array(batch.num_rows())?;
        let starts = starts
            .as_primitive::<TimestampMillisecondType>()
            .values()
            .clone();
        if self.spec.lateness_ms > 0 {
            return self.on_rows_one_by_one(&batch, &key, &starts, out);
        }
        // Rows are placed one by one (a row may merge sessions); the
        // aggregates are then updated once per session.
        let mut placed: Vec<u64> = Vec::with_capacity(batch.num_rows());
        for (i, t) in starts.iter().enumerate() {
            placed.push(self.place(key(i), *t)?);
        }
        // A session absorbed later in this batch lives on under another id.
        let mut by_session: HashMap<u64, Vec<u32>> = HashMap::new();
        for (i, id) in placed.iter().enumerate() {
            let id = self.resolve(*id, key(i), starts[i]);
            by_session.entry(id).or_default().push(i as u32);
        }
        let AggregateInputs { args, filters } =
            AggregateInputs::evaluate(&self.spec.aggregates, &batch)?;
        for (id, indices) in by_session {
            let indices = UInt32Array::from(indices);
            let session_args: Vec<Vec<ArrayRef>> = args
                .iter()
                .map(|a| {
                    a.iter()
                        .map(|c| take(c, &indices, None))
                        .collect::<std::result::Result<_, _>>()
                })
                .collect::<std::result::Result<_, _>>()?;
            let session_filters: Vec<Option<BooleanArray>> = filters
                .iter()
                .map(|f| {
                    f.as_ref()
                        .map(|f| Ok(take(f, &indices, None)?.as_boolean().clone()))
                        .transpose()
                })
                .collect::<Result<_>>()?;
            let session = self.sessions.get_mut(&id).expect("placed above");
            session
                .groups
                .update(&[], indices.len(), &session_args, &session_filters)?;
        }
        Ok(())
    }

    /// Tables: `sessions` (per open session its id, bounds, whether it
    /// was emitted and changed since, its key and accumulator states;
    /// keyed by the session key) and `meta` (the next session id and the
    /// watermark).
    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        let mut state = OperatorState::new();
        let keys = self.spec.key_schema.fields().len();
        let sessions = self.session_table()?;
        let key_columns = (SESSION_COLUMNS..SESSION_COLUMNS + keys).collect();
        state.add("sessions", sessions, key_columns);
        state.add_scalars(
            "meta",
            &[
                ("next_id", Some(self.next_id as i64)),
                ("watermark", time_scalar(self.watermark)),
            ],
        );
        Ok(Some(state))
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        let table = checked_table(&state, "sessions", &self.session_fields()?)?;
        self.restore_sessions(&table)?;
        let stored = state.scalar("meta", "next_id")?.unwrap_or(0) as u64;
        self.next_id = stored.max(self.sessions.len() as u64);
        self.watermark = state.scalar("meta", "watermark")?.unwrap_or(i64::MIN);
        Ok(())
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        self.watermark = self.watermark.max(watermark);
        let lateness = self.spec.lateness_ms;
        let due: Vec<(i64, u64)> = self
            .by_end
            .iter()
            .take_while(|(end, _)| *end <= watermark)
            .copied()
            .collect();
        let (mut first, mut again, mut expired) = (Vec::new(), Vec::new(), Vec::new());
        for (end, id) in due {
            let session = &self.sessions[&id];
            match (session.dirty, session.emitted) {
                (true, false) => first.push(id),
                (true, true) => again.push(id),
                (false, _) => {}
            }
            if lateness > 0 && end.saturating_add(lateness) <= watermark {
                expired.push(id);
            }
        }
        // Without allowed lateness a session is done when it fires.
        if let Some(batch) = self.fire(&first, lateness == 0)? {
            out.push(Message::Batch(batch));
        }
        if let Some(batch) = self.fire(&again, false)? {
            out.push(Message::Changes(batch, RowKind::Update));
        }
        for id in expired {
            self.remove(id);
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }
}

impl SessionAggregateOp {
    /// With allowed lateness, rows go in one at a time, and a row that
    /// changes a session that already fired (and whose end the watermark
    /// has passed) makes it fire again at once, as an update.
    fn on_rows_one_by_one<'k>(
        &mut self,
        batch: &RecordBatch,
        key: &dyn Fn(usize) -> &'k [u8],
        starts: &[i64],
        out: &mut Vec<Message>,
    ) -> Result<()> {
        let AggregateInputs { args, filters } =
            AggregateInputs::evaluate(&self.spec.aggregates, batch)?;
        for (row, t) in starts.iter().enumerate() {
            let id = self.place(key(row), *t)?;
            let row_args: Vec<Vec<ArrayRef>> = args
                .iter()
                .map(|a| a.iter().map(|c| c.slice(row, 1)).collect())
                .collect();
            let row_filters: Vec<Option<BooleanArray>> = filters
                .iter()
                .map(|f| f.as_ref().map(|f| f.slice(row, 1).as_boolean().clone()))
                .collect();
            let session = self.sessions.get_mut(&id).expect("placed");
            session.groups.update(&[], 1, &row_args, &row_filters)?;
            if session.emitted
                && session.end <= self.watermark
                && let Some(batch) = self.fire(&[id], false)?
            {
                out.push(Message::Changes(batch, RowKind::Update));
            }
        }
        Ok(())
    }

    /// The open session of `key` that holds time `t`.
    fn resolve(&self, id: u64, key: &[u8], t: i64) -> u64 {
        if self.sessions.contains_key(&id) {
            return id;
        }
        self.by_key[key]
            .iter()
            .copied()
            .find(|other| {
                let s = &self.sessions[other];
                s.start <= t && t < s.end
            })
            .expect("a placed row lies in an open session")
    }
}

/// Leading columns of the `sessions` state table, before the key and
/// state columns: id, start, end, emitted, dirty.
const SESSION_COLUMNS: usize = 5;

impl SessionAggregateOp {
    /// Columns of the `sessions` table.
    fn session_fields(&self) -> Result<Vec<Field>> {
        let mut fields = vec![
            Field::new("session", DataType::Int64, true),
            Field::new("start", DataType::Int64, true),
            Field::new("end", DataType::Int64, true),
            Field::new("emitted", DataType::Boolean, true),
            Field::new("dirty", DataType::Boolean, true),
        ];
        fields.extend(aggregate::nullable_fields(&self.spec.key_schema));
        fields.extend(aggregate::state_fields(&self.spec.aggregates)?);
        Ok(fields)
    }

    /// Every open session as a row, in id order; each session's
    /// accumulators are drained and merged back.
    fn session_table(&mut self) -> Result<RecordBatch> {
        let fields = self.session_fields()?;
        let mut ids: Vec<u64> = self.sessions.keys().copied().collect();
        ids.sort_unstable();
        let mut states: Vec<Vec<ArrayRef>> = Vec::with_capacity(ids.len());
        for id in &ids {
            let fresh = Groups::new(None, &self.spec.aggregates)?;
            let session = self.sessions.get_mut(id).expect("listed above");
            let frozen = session.groups.snapshot(fresh)?;
            if frozen.rows() != 1 {
                return Err(Error::Plan(format!(
                    "session {id} holds {} groups, not one",
                    frozen.rows()
                )));
            }
            states.push(frozen.columns());
        }
        let sessions: Vec<&Session> = ids.iter().map(|id| &self.sessions[id]).collect();
        let ints = |f: &dyn Fn(&Session) -> i64| -> ArrayRef {
            Arc::new(Int64Array::from_iter_values(sessions.iter().map(|s| f(s))))
        };
        let flags = |f: &dyn Fn(&Session) -> bool| -> ArrayRef {
            Arc::new(BooleanArray::from_iter(sessions.iter().map(|s| Some(f(s)))))
        };
        let mut columns = vec![
            Arc::new(Int64Array::from_iter_values(
                ids.iter().map(|&id| id as i64),
            )) as ArrayRef,
            ints(&|s| s.start),
            ints(&|s| s.end),
            flags(&|s| s.emitted),
            flags(&|s| s.dirty),
        ];
        let parser = self.converter.parser();
        let keys = self
            .converter
            .convert_rows(sessions.iter().map(|s| parser.parse(&s.key)))?;
        columns.extend(keys);
        let state_columns = fields.len() - columns.len();
        for column in 0..state_columns {
            let parts: Vec<&dyn Array> = states.iter().map(|s| s[column].as_ref()).collect();
            columns.push(match parts.is_empty() {
                true => new_empty_array(fields[columns.len()].data_type()),
                false => concat(&parts)?,
            });
        }
        aggregate::state_batch(fields, columns)
    }

    /// Reopens the sessions of a `sessions` table.
    fn restore_sessions(&mut self, table: &RecordBatch) -> Result<()> {
        let table = aggregate::sorted_by(table, &[0])?;
        let keys = self.spec.key_schema.fields().len();
        let widths = aggregate::state_widths(&self.spec.aggregates)?;
        let starts = aggregate::int64s(&table, 1)?;
        let ends = aggregate::int64s(&table, 2)?;
        let emitted = aggregate::booleans(&table, 3)?;
        let dirty = aggregate::booleans(&table, 4)?;
        let key_columns = &table.columns()[SESSION_COLUMNS..SESSION_COLUMNS + keys];
        let key_rows = self.converter.convert_columns(key_columns)?;
        let states = &table.columns()[SESSION_COLUMNS + keys..];
        // Ids are renumbered in their order: a state combined from several
        // instances has the same ids more than once.
        for row in 0..table.num_rows() {
            let id = row as u64;
            let key: Box<[u8]> = match keys {
                0 => Box::new([]),
                _ => key_rows.row(row).data().into(),
            };
            let state: Vec<ArrayRef> = states.iter().map(|c| c.slice(row, 1)).collect();
            let mut groups = Groups::new(None, &self.spec.aggregates)?;
            groups.merge(&Frozen::from_columns(Vec::new(), &state, &widths, 1))?;
            let session = Session {
                key: key.clone(),
                start: starts.value(row),
                end: ends.value(row),
                groups,
                emitted: emitted.value(row),
                dirty: dirty.value(row),
            };
            self.by_key.entry(key).or_default().push(id);
            self.by_end.insert((session.end, id));
            self.sessions.insert(id, session);
        }
        Ok(())
    }
}
