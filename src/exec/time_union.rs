//! Where the instances of a merge operator that runs per key meet again.
//!
//! A control filter hands its rows on in event-time order, once the
//! watermark has passed them, and what follows relies on it (a window's
//! own clock is the largest event time it has seen). Run as several
//! instances, each releases its keys' rows in order, but one instance's
//! rows up to a watermark may reach the union before another's earlier
//! ones. So the union keeps what the instances send until the merged
//! watermark (the minimum of theirs) passes it, then hands it on sorted by
//! event time, ties in order of instance and arrival: the order one
//! instance would give, up to rows of one time.

use datafusion::arrow::array::{Array, AsArray, BooleanArray, UInt32Array};
use datafusion::arrow::compute::{concat_batches, filter_record_batch, take_record_batch};
use datafusion::arrow::datatypes::TimestampMillisecondType;
use datafusion::arrow::record_batch::RecordBatch;

use super::{END_OF_INPUT, MergeOperator, Message};
use crate::error::Result;

/// The union of a keyed merge's instances, in event-time order (see the
/// [module docs](self)). Its input `i` is instance `i`.
pub struct TimeOrderedUnion {
    /// The event-time column of the instances' rows.
    time: usize,
    /// Rows not yet passed by the merged watermark, with their instance.
    waiting: Vec<(usize, RecordBatch)>,
}

impl TimeOrderedUnion {
    /// A union of rows whose event time is column `time`.
    pub fn new(time: usize) -> Self {
        TimeOrderedUnion {
            time,
            waiting: Vec::new(),
        }
    }

    /// Every waiting row before `watermark`, sorted; the others wait on.
    fn release(&mut self, watermark: i64) -> Result<Option<RecordBatch>> {
        let mut due = Vec::new();
        for (instance, rows) in std::mem::take(&mut self.waiting) {
            let before: BooleanArray = self
                .times(&rows)
                .iter()
                .map(|t| Some(watermark == END_OF_INPUT || t.is_none_or(|t| t < watermark)))
                .collect();
            let now = filter_record_batch(&rows, &before)?;
            let later = filter_record_batch(&rows, &datafusion::arrow::compute::not(&before)?)?;
            if now.num_rows() > 0 {
                due.push((instance, now));
            }
            if later.num_rows() > 0 {
                self.waiting.push((instance, later));
            }
        }
        self.sorted(due)
    }

    /// `parts` as one batch in order of event time, then instance, then
    /// arrival.
    fn sorted(&self, mut parts: Vec<(usize, RecordBatch)>) -> Result<Option<RecordBatch>> {
        let Some(schema) = parts.first().map(|(_, rows)| rows.schema()) else {
            return Ok(None);
        };
        // Stable: within an instance, arrival order stays.
        parts.sort_by_key(|(instance, _)| *instance);
        let batches: Vec<&RecordBatch> = parts.iter().map(|(_, rows)| rows).collect();
        let rows = concat_batches(&schema, batches)?;
        let times = self.times(&rows);
        let mut order: Vec<(i64, u32)> = (0..rows.num_rows())
            .map(|r| {
                (
                    if times.is_valid(r) {
                        times.value(r)
                    } else {
                        i64::MIN
                    },
                    r as u32,
                )
            })
            .collect();
        order.sort_by_key(|&(ts, _)| ts);
        let indices = UInt32Array::from_iter_values(order.into_iter().map(|(_, r)| r));
        Ok(Some(take_record_batch(&rows, &indices)?))
    }

    fn times<'a>(
        &self,
        rows: &'a RecordBatch,
    ) -> &'a datafusion::arrow::array::PrimitiveArray<TimestampMillisecondType> {
        rows.column(self.time)
            .as_primitive::<TimestampMillisecondType>()
    }
}

impl MergeOperator for TimeOrderedUnion {
    fn describe(&self) -> String {
        "the instances' rows in event-time order".into()
    }

    fn on_rows(&mut self, input: usize, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() > 0 {
            self.waiting.push((input, batch));
        }
        Ok(())
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        if let Some(rows) = self.release(watermark)? {
            out.push(Message::Batch(rows));
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    /// Keeps nothing in checkpoints: at an aligned barrier every instance
    /// has sent the same watermark (they read the same watermarks and
    /// barriers), so nothing waits here but in the rare case of an input
    /// that one instance took for idle and another not. What waits then
    /// goes on now, in order, rather than be lost.
    fn on_barrier(&mut self, out: &mut Vec<Message>) -> Result<()> {
        let waiting = std::mem::take(&mut self.waiting);
        if let Some(rows) = self.sorted(waiting)? {
            out.push(Message::Batch(rows));
        }
        Ok(())
    }

    fn snapshot(&mut self) -> Result<Option<crate::state::OperatorState>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{StringArray, TimestampMillisecondArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};

    use super::*;

    fn rows(rows: &[(i64, &str)]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
            Field::new("host", DataType::Utf8, false),
        ]));
        let ts = TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| r.0));
        let hosts = StringArray::from_iter_values(rows.iter().map(|r| r.1));
        RecordBatch::try_new(schema, vec![Arc::new(ts), Arc::new(hosts)]).unwrap()
    }

    fn seen(out: &[Message]) -> Vec<String> {
        let mut seen = Vec::new();
        for message in out {
            match message {
                Message::Batch(b) => {
                    let ts = b.column(0).as_primitive::<TimestampMillisecondType>();
                    let hosts = b.column(1).as_string::<i32>();
                    for r in 0..b.num_rows() {
                        seen.push(format!("{}{}", hosts.value(r), ts.value(r)));
                    }
                }
                Message::Watermark(w) => seen.push(format!("wm{w}")),
                _ => {}
            }
        }
        seen
    }

    #[test]
    fn rows_go_on_in_event_time_order_once_the_watermark_passes_them() {
        let mut union = TimeOrderedUnion::new(0);
        let mut out = Vec::new();
        union.on_rows(1, rows(&[(1, "b"), (5, "b")])).unwrap();
        union
            .on_rows(0, rows(&[(2, "a"), (1, "a"), (7, "a")]))
            .unwrap();
        union.on_watermark(5, &mut out).unwrap();
        union.on_rows(2, rows(&[(6, "c")])).unwrap();
        union.on_watermark(END_OF_INPUT, &mut out).unwrap();
        assert_eq!(
            seen(&out),
            [
                "a1",
                "b1",
                "a2",
                "wm5",
                "b5",
                "c6",
                "a7",
                &format!("wm{END_OF_INPUT}")
            ]
        );
    }

    #[test]
    fn a_barrier_hands_on_what_waits_instead_of_losing_it() {
        let mut union = TimeOrderedUnion::new(0);
        let mut out = Vec::new();
        union.on_rows(0, rows(&[(9, "a"), (3, "a")])).unwrap();
        union.on_barrier(&mut out).unwrap();
        assert_eq!(seen(&out), ["a3", "a9"]);
        assert!(union.snapshot().unwrap().is_none());
    }
}
