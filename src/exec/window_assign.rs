use std::sync::Arc;
use std::sync::atomic::Ordering;

use datafusion::arrow::array::{ArrayRef, AsArray, BooleanArray, TimestampMillisecondArray};
use datafusion::arrow::compute::filter;
use datafusion::arrow::datatypes::{SchemaRef, TimestampMillisecondType};
use datafusion::arrow::record_batch::RecordBatch;

use super::{Message, Operator, QueryStats};
use crate::error::Result;
use crate::plan::WindowSpec;

/// Adds `window_start` and `window_end` to each row and drops late rows.
///
/// A row is late when its window has already closed at its arrival, i.e.
/// `window_end <= watermark`, where the watermark is computed row by row
/// (largest event time so far minus the delay). Computing it per row rather
/// than per batch makes the result independent of how input is cut into
/// batches.
pub struct WindowAssignOp {
    time_column: usize,
    spec: WindowSpec,
    delay_ms: i64,
    max_seen: i64,
    schema: SchemaRef,
    stats: Arc<QueryStats>,
}

impl WindowAssignOp {
    /// Windows on `time_column` of the input; `schema` is the input's plus
    /// the two window columns.
    pub fn new(
        time_column: usize,
        spec: WindowSpec,
        delay_ms: i64,
        schema: SchemaRef,
        stats: Arc<QueryStats>,
    ) -> Self {
        Self {
            time_column,
            spec,
            delay_ms,
            max_seen: i64::MIN,
            schema,
            stats,
        }
    }
}

impl Operator for WindowAssignOp {
    fn describe(&self) -> String {
        format!("window {} on column {}", self.spec, self.time_column)
    }

    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        let times = batch
            .column(self.time_column)
            .as_primitive::<TimestampMillisecondType>();
        let size = self.spec.size_ms();
        let mut keep = Vec::with_capacity(times.len());
        let mut starts = Vec::with_capacity(times.len());
        for t in times.iter() {
            let Some(t) = t else {
                keep.push(false);
                continue;
            };
            self.max_seen = self.max_seen.max(t);
            let start = self.spec.start_of(t);
            let on_time = start + size > self.max_seen.saturating_sub(self.delay_ms);
            keep.push(on_time);
            if on_time {
                starts.push(start);
            }
        }
        let late = times.len() - starts.len();
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        if late > 0 {
            self.stats
                .late_rows
                .fetch_add(late as u64, Ordering::Relaxed);
            let mask = BooleanArray::from(keep);
            columns = columns
                .iter()
                .map(|c| filter(c, &mask))
                .collect::<std::result::Result<_, _>>()?;
        }
        if starts.is_empty() {
            return Ok(());
        }
        let ends: TimestampMillisecondArray =
            starts.iter().map(|s| s + size).collect::<Vec<_>>().into();
        columns.push(Arc::new(TimestampMillisecondArray::from(starts)));
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
        let spec = WindowSpec::Tumble {
            size_ms: 10_000,
            offset_ms: 0,
        };
        WindowAssignOp::new(0, spec, 2_000, Arc::new(Schema::new(fields)), stats)
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
        let Message::Batch(batch) = &out[0] else {
            panic!("a batch")
        };
        let starts = batch.column(2).as_primitive::<TimestampMillisecondType>();
        assert_eq!(starts.values().to_vec(), vec![0, 20_000, 20_000]);
    }
}
