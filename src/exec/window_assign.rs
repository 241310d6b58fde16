use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use datafusion::arrow::array::{ArrayRef, AsArray, BooleanArray, TimestampMillisecondArray};
use datafusion::arrow::compute::filter;
use datafusion::arrow::datatypes::{SchemaRef, TimestampMillisecondType};
use datafusion::arrow::record_batch::RecordBatch;

use super::{LateRows, Message, Operator, QueryStats, send_late};
use crate::error::Result;
use crate::plan::WindowSpec;
use crate::state::OperatorState;

/// Adds `window_start` and `window_end` to each row and drops late rows.
///
/// The two columns hold the row's pane, which for a tumbling window is its
/// window. A row is late when every window holding it has closed at its
/// arrival, i.e. the last one's `window_end <= watermark`, where the watermark is computed row by row
/// (largest event time so far minus the delay). Computing it per row rather
/// than per batch makes the result independent of how input is cut into
/// batches.
pub struct WindowAssignOp {
    time_column: usize,
    spec: WindowSpec,
    delay_ms: i64,
    lateness_ms: i64,
    max_seen: i64,
    /// `WindowSpec::closed_windows` at the last watermark sent.
    closed: i64,
    schema: SchemaRef,
    stats: Arc<QueryStats>,
    late_rows: Arc<LateRows>,
}

impl WindowAssignOp {
    /// Windows on `time_column` of the input; `schema` is the input's plus
    /// the two window columns.
    pub fn new(
        time_column: usize,
        spec: WindowSpec,
        delay_ms: i64,
        lateness_ms: i64,
        schema: SchemaRef,
        stats: Arc<QueryStats>,
        late_rows: Arc<LateRows>,
    ) -> Self {
        Self {
            time_column,
            spec,
            delay_ms,
            lateness_ms,
            max_seen: i64::MIN,
            closed: i64::MIN,
            schema,
            stats,
            late_rows,
        }
    }
}

impl Operator for WindowAssignOp {
    fn describe(&self) -> String {
        format!("window {} on column {}", self.spec, self.time_column)
    }

    /// Rows are judged one at a time against the watermark at their
    /// arrival; where that watermark closes a window part-way through the
    /// batch, the batch is cut there and the watermark sent between the two
    /// parts, so windows fire exactly as if rows came one by one.
    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        let times = batch
            .column(self.time_column)
            .as_primitive::<TimestampMillisecondType>();
        let size = self.spec.size_ms();
        // The pane length is a gcd: worked out once, not per row.
        let (pane_ms, WindowSpec::Aligned { offset_ms, .. }) = (self.spec.pane_ms(), self.spec);
        let mut keep = Vec::with_capacity(times.len());
        let mut panes = Vec::with_capacity(times.len());
        let mut segment_start = 0;
        let mut late = 0;
        let mut watermark = self.max_seen.saturating_sub(self.delay_ms);
        for (row, t) in times.iter().enumerate() {
            let Some(t) = t else {
                keep.push(false);
                late += 1;
                continue;
            };
            // Only a new largest event time moves the watermark.
            if t > self.max_seen {
                self.max_seen = t;
                watermark = self.max_seen.saturating_sub(self.delay_ms);
                let closed = self.spec.closed_windows(watermark);
                if closed > self.closed {
                    // The first row only starts the clock: nothing has closed.
                    let started = self.closed != i64::MIN;
                    self.closed = closed;
                    if started {
                        let segment = Segment {
                            rows: segment_start..row,
                            keep: &keep[segment_start..row],
                            panes: std::mem::take(&mut panes),
                        };
                        self.emit(&batch, segment, out)?;
                        out.push(Message::Watermark(watermark));
                        segment_start = row;
                    }
                }
            }
            let on_time = self.spec.last_window_start(t) + size + self.lateness_ms > watermark;
            keep.push(on_time);
            if on_time {
                panes.push(t - (t - offset_ms).rem_euclid(pane_ms));
            } else {
                late += 1;
            }
        }
        if late > 0 {
            self.stats.late_rows.fetch_add(late, Ordering::Relaxed);
            send_late(&self.late_rows, &batch, &keep)?;
        }
        let segment = Segment {
            rows: segment_start..times.len(),
            keep: &keep[segment_start..],
            panes,
        };
        self.emit(&batch, segment, out)
    }

    /// Table `meta`: the largest event time seen, which decides which
    /// rows are late, and the windows closed at the last watermark sent,
    /// which decides where a batch is cut.
    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        let seen = |v: i64| (v != i64::MIN).then_some(v);
        let mut state = OperatorState::new();
        state.add_scalars(
            "meta",
            &[
                ("max_seen", seen(self.max_seen)),
                ("closed", seen(self.closed)),
            ],
        );
        Ok(Some(state))
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        self.max_seen = state.scalar("meta", "max_seen")?.unwrap_or(i64::MIN);
        self.closed = state.scalar("meta", "closed")?.unwrap_or(i64::MIN);
        Ok(())
    }

    /// A watermark from upstream also judges the rows after it, as a row
    /// `delay` past it would: a shed operator before this one sends one
    /// for the event time of the rows it dropped.
    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        self.max_seen = self.max_seen.max(watermark.saturating_add(self.delay_ms));
        self.closed = self.closed.max(self.spec.closed_windows(watermark));
        out.push(Message::Watermark(watermark));
        Ok(())
    }
}

/// A run of consecutive input rows between two watermarks.
struct Segment<'a> {
    rows: Range<usize>,
    keep: &'a [bool],
    /// Pane start of each kept row.
    panes: Vec<i64>,
}

impl WindowAssignOp {
    /// Sends the segment's on-time rows with their pane columns.
    fn emit(
        &self,
        batch: &RecordBatch,
        segment: Segment<'_>,
        out: &mut Vec<Message>,
    ) -> Result<()> {
        if segment.panes.is_empty() {
            return Ok(());
        }
        let slice = batch.slice(segment.rows.start, segment.rows.len());
        let mut columns: Vec<ArrayRef> = slice.columns().to_vec();
        if segment.panes.len() < segment.rows.len() {
            let mask = BooleanArray::from(segment.keep.to_vec());
            columns = columns
                .iter()
                .map(|c| filter(c, &mask))
                .collect::<std::result::Result<_, _>>()?;
        }
        let pane = self.spec.pane_ms();
        let ends: TimestampMillisecondArray = segment
            .panes
            .iter()
            .map(|s| s + pane)
            .collect::<Vec<_>>()
            .into();
        columns.push(Arc::new(TimestampMillisecondArray::from(segment.panes)));
        columns.push(Arc::new(ends));
        out.push(Message::Batch(RecordBatch::try_new(
            self.schema.clone(),
            columns,
        )?));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::compute::concat_batches;
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};

    fn input(times: &[i64]) -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
            Field::new("v", DataType::Int64, true),
        ]);
        let ts = TimestampMillisecondArray::from(times.to_vec());
        let v = Int64Array::from_iter_values(0..times.len() as i64);
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(ts), Arc::new(v)]).unwrap()
    }

    fn op(stats: Arc<QueryStats>) -> WindowAssignOp {
        let mut fields = input(&[]).schema().fields().to_vec();
        for name in ["window_start", "window_end"] {
            fields.push(Arc::new(Field::new(
                name,
                DataType::Timestamp(TimeUnit::Millisecond, None),
                false,
            )));
        }
        let spec = WindowSpec::tumble(10_000, 0);
        WindowAssignOp::new(
            0,
            spec,
            2_000,
            0,
            Arc::new(Schema::new(fields)),
            stats,
            Arc::default(),
        )
    }

    /// A late row is judged against the watermark at its own arrival, so one
    /// batch gives the same answer as the rows one by one.
    #[test]
    fn lateness_does_not_depend_on_batching() {
        let times = [1_000, 25_000, 3_000, 21_000, 19_000];
        let whole = Arc::new(QueryStats::default());
        let mut out = Vec::new();
        op(whole.clone()).on_batch(input(&times), &mut out).unwrap();
        let split = Arc::new(QueryStats::default());
        let mut one_by_one = op(split.clone());
        for t in times {
            one_by_one.on_batch(input(&[t]), &mut Vec::new()).unwrap();
        }
        // 3_000 arrives at watermark 23_000 (window [0,10) closed): late.
        // 19_000 is in [10,20), closed at 23_000: late. 21_000 is on time.
        assert_eq!(whole.late_rows.load(Ordering::Relaxed), 2);
        assert_eq!(split.late_rows.load(Ordering::Relaxed), 2);
        let batches: Vec<&RecordBatch> = out
            .iter()
            .filter_map(|m| match m {
                Message::Batch(b) => Some(b),
                _ => None,
            })
            .collect();
        let batch = concat_batches(&batches[0].schema(), batches).unwrap();
        let starts = batch.column(2).as_primitive::<TimestampMillisecondType>();
        assert_eq!(starts.values().to_vec(), vec![0, 20_000, 20_000]);
        // The watermark 23_000 closes [0,10) and [10,20) after the row at 25_000.
        assert!(matches!(out[1], Message::Watermark(23_000)), "{out:?}");
        assert_eq!(out.len(), 3, "{out:?}");
    }
}
