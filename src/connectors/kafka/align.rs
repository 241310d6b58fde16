//! Per-partition watermarks for a stream read from several partitions.
//!
//! A topic's partitions are read at once, each at its own pace: right
//! after a start, one partition's backlog may arrive an hour of event time
//! ahead of another's. A watermark taken from the largest event time of
//! every row so far would make the slower partition's rows late. The
//! semantics reference's rule is a watermark per partition, merged by the
//! minimum, with idle partitions not holding it back.
//!
//! The source keeps that rule by what it releases, not by a watermark of
//! its own: each partition's decoded rows wait in its lane, in offset
//! order, and a row goes on only once every partition that can still send
//! rows has sent one at least as late (the frontier: the minimum, over
//! those partitions, of the largest event time each has sent). The
//! stream's watermark, computed downstream from the rows released, then
//! never passes the slowest partition. A partition is idle once the
//! consumer reached its end (librdkafka's partition EOF) and until its
//! next message; idle partitions do not hold the frontier back, and when
//! every partition is idle, everything goes. A partition not heard from
//! yet holds everything back: it may have a backlog.
//!
//! Rows leave a lane as a prefix, so a partition's position (the offset to
//! read again from after a restore) is its first row still waiting. The
//! rows released together go out in event-time order, merged across
//! partitions, since operators judge lateness row by row.

use std::collections::{BTreeMap, VecDeque};

use datafusion::arrow::array::{Array, AsArray, UInt32Array};
use datafusion::arrow::compute::{concat_batches, take_record_batch};
use datafusion::arrow::datatypes::{SchemaRef, TimestampMillisecondType};
use datafusion::arrow::record_batch::RecordBatch;

use crate::error::Result;

/// The rows waiting in the lanes of a stream's partitions.
pub(super) struct Alignment {
    schema: SchemaRef,
    /// The event-time column; without one, rows go on at once.
    time_column: Option<usize>,
    lanes: BTreeMap<i32, Lane>,
}

/// One partition's waiting rows.
#[derive(Default)]
struct Lane {
    /// Rows decoded and not released, in offset order.
    queue: VecDeque<Held>,
    /// The largest event time this partition has sent.
    max_time: Option<i64>,
    /// The consumer reached the partition's end since its last message.
    idle: bool,
}

/// Some consecutive rows of one partition.
struct Held {
    batch: RecordBatch,
    /// Each row's offset and event time.
    offsets: Vec<i64>,
    times: Vec<i64>,
}

/// How far rows may go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frontier {
    /// A partition that may have rows has sent none yet.
    Nothing,
    /// Rows at or before this event time.
    Upto(i64),
    /// Every partition is idle.
    Everything,
}

impl Alignment {
    /// Lanes for `partitions` of a stream whose rows have `schema`.
    pub(super) fn new(schema: SchemaRef, time_column: Option<usize>, partitions: &[i32]) -> Self {
        Alignment {
            schema,
            time_column,
            lanes: partitions.iter().map(|&p| (p, Lane::default())).collect(),
        }
    }

    /// Takes decoded rows: row `i` of `batch` came from partition and
    /// offset `origins[i]`.
    pub(super) fn add(&mut self, batch: &RecordBatch, origins: &[(i32, i64)]) -> Result<()> {
        let times = self.times(batch);
        let mut rows: BTreeMap<i32, Vec<u32>> = BTreeMap::new();
        for (i, (p, _)) in origins.iter().enumerate() {
            rows.entry(*p).or_default().push(i as u32);
        }
        for (p, indices) in rows {
            let lane = self.lanes.entry(p).or_default();
            let held_times: Vec<i64> = indices.iter().map(|&i| times[i as usize]).collect();
            let offsets = indices.iter().map(|&i| origins[i as usize].1).collect();
            let taken = take_record_batch(batch, &UInt32Array::from(indices))?;
            lane.max_time = held_times.iter().copied().chain(lane.max_time).max();
            lane.idle = false;
            lane.queue.push_back(Held {
                batch: taken,
                offsets,
                times: held_times,
            });
        }
        Ok(())
    }

    /// A message of `partition` was read, decoded or not: it is not idle.
    pub(super) fn heard_from(&mut self, partition: i32) {
        self.lanes.entry(partition).or_default().idle = false;
    }

    /// The consumer reached the end of `partition`.
    pub(super) fn reached_end(&mut self, partition: i32) {
        self.lanes.entry(partition).or_default().idle = true;
    }

    /// Whether every partition is idle with no row waiting: the stream
    /// has handed on everything its partitions hold.
    pub(super) fn all_idle(&self) -> bool {
        !self.lanes.is_empty() && self.lanes.values().all(|l| l.idle && l.queue.is_empty())
    }

    /// The partitions it has lanes for.
    pub(super) fn partitions(&self) -> impl Iterator<Item = i32> + '_ {
        self.lanes.keys().copied()
    }

    /// Rows decoded and not released from `partition`.
    pub(super) fn waiting(&self, partition: i32) -> usize {
        self.lanes
            .get(&partition)
            .map_or(0, |l| l.queue.iter().map(|h| h.batch.num_rows()).sum())
    }

    /// Per partition with rows waiting, the offset of the first.
    pub(super) fn first_waiting(&self) -> BTreeMap<i32, i64> {
        self.lanes
            .iter()
            .filter_map(|(&p, l)| Some((p, *l.queue.front()?.offsets.first()?)))
            .collect()
    }

    /// The rows that may go on now, taken out of their lanes.
    pub(super) fn release(&mut self) -> Result<RecordBatch> {
        let frontier = self.frontier();
        self.take(frontier)
    }

    /// Every row waiting, at the end of the input.
    pub(super) fn release_all(&mut self) -> Result<RecordBatch> {
        self.take(Frontier::Everything)
    }

    fn frontier(&self) -> Frontier {
        if self.time_column.is_none() {
            return Frontier::Everything;
        }
        let mut frontier = Frontier::Everything;
        for lane in self.lanes.values().filter(|l| !l.idle) {
            let Some(t) = lane.max_time else {
                return Frontier::Nothing;
            };
            frontier = match frontier {
                Frontier::Upto(f) => Frontier::Upto(f.min(t)),
                _ => Frontier::Upto(t),
            };
        }
        frontier
    }

    fn take(&mut self, frontier: Frontier) -> Result<RecordBatch> {
        let mut out = Vec::new();
        for lane in self.lanes.values_mut() {
            while let Some(head) = lane.queue.front_mut() {
                let n = match frontier {
                    Frontier::Nothing => 0,
                    Frontier::Everything => head.times.len(),
                    Frontier::Upto(f) => head.times.iter().take_while(|&&t| t <= f).count(),
                };
                if n == head.times.len() {
                    out.push(lane.queue.pop_front().expect("a head").batch);
                    continue;
                }
                if n > 0 {
                    out.push(head.batch.slice(0, n));
                    head.batch = head.batch.slice(n, head.batch.num_rows() - n);
                    head.offsets.drain(..n);
                    head.times.drain(..n);
                }
                break;
            }
        }
        let released = concat_batches(&self.schema, &out)?;
        self.in_time_order(released)
    }

    /// `batch`'s rows by event time, ties in lane order: operators judge
    /// a row late against the largest event time before it, so the
    /// partitions' rows must go out merged.
    fn in_time_order(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let times = self.times(&batch);
        if times.is_sorted() {
            return Ok(batch);
        }
        let mut order: Vec<u32> = (0..batch.num_rows() as u32).collect();
        order.sort_by_key(|&i| times[i as usize]);
        Ok(take_record_batch(&batch, &UInt32Array::from(order))?)
    }

    /// Each row's event time (the earliest possible when it has none).
    fn times(&self, batch: &RecordBatch) -> Vec<i64> {
        let Some(i) = self.time_column else {
            return vec![i64::MIN; batch.num_rows()];
        };
        let Some(column) = batch
            .column(i)
            .as_primitive_opt::<TimestampMillisecondType>()
        else {
            return vec![i64::MIN; batch.num_rows()];
        };
        (0..column.len())
            .map(|r| {
                if column.is_valid(r) {
                    column.value(r)
                } else {
                    i64::MIN
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Int64Array, TimestampMillisecondArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
            Field::new("v", DataType::Int64, true),
        ]))
    }

    /// Rows `(partition, offset, time)`, their value the offset.
    fn rows(rows: &[(i32, i64, i64)]) -> (RecordBatch, Vec<(i32, i64)>) {
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(TimestampMillisecondArray::from(
                    rows.iter().map(|r| r.2).collect::<Vec<_>>(),
                )),
                Arc::new(Int64Array::from(
                    rows.iter().map(|r| r.1).collect::<Vec<_>>(),
                )),
            ],
        )
        .unwrap();
        (batch, rows.iter().map(|r| (r.0, r.1)).collect())
    }

    fn values(batch: &RecordBatch) -> Vec<i64> {
        batch
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
            .values()
            .to_vec()
    }

    #[test]
    fn a_partition_ahead_waits_for_the_slowest() {
        let mut a = Alignment::new(schema(), Some(0), &[0, 1]);
        let (b, o) = rows(&[(0, 10, 100), (0, 11, 200), (0, 12, 300)]);
        a.add(&b, &o).unwrap();
        // Partition 1 has sent nothing: it may have older rows.
        assert_eq!(a.release().unwrap().num_rows(), 0);
        assert_eq!(a.first_waiting(), BTreeMap::from([(0, 10)]));
        let (b, o) = rows(&[(1, 5, 150)]);
        a.add(&b, &o).unwrap();
        // The frontier is min(300, 150): rows up to 150 of both go, in
        // event-time order.
        assert_eq!(values(&a.release().unwrap()), vec![10, 5]);
        assert_eq!(a.first_waiting(), BTreeMap::from([(0, 11)]));
        assert_eq!(a.waiting(0), 2);
    }

    #[test]
    fn idle_partitions_do_not_hold_the_others_back() {
        let mut a = Alignment::new(schema(), Some(0), &[0, 1, 2]);
        let (b, o) = rows(&[(0, 0, 100), (1, 0, 500)]);
        a.add(&b, &o).unwrap();
        a.reached_end(2);
        assert_eq!(values(&a.release().unwrap()), vec![0]);
        a.reached_end(0);
        // Only partition 1 may still send rows: its own go.
        assert_eq!(values(&a.release().unwrap()), vec![0]);
        assert!(a.first_waiting().is_empty());
        // A message wakes a partition up.
        a.heard_from(2);
        let (b, o) = rows(&[(1, 1, 600)]);
        a.add(&b, &o).unwrap();
        assert_eq!(a.release().unwrap().num_rows(), 0);
        assert_eq!(values(&a.release_all().unwrap()), vec![1]);
    }

    #[test]
    fn a_lane_releases_in_offset_order_even_when_times_go_back() {
        let mut a = Alignment::new(schema(), Some(0), &[0, 1]);
        let (b, o) = rows(&[(0, 0, 100), (0, 1, 400), (0, 2, 150), (1, 0, 200)]);
        a.add(&b, &o).unwrap();
        // Offset 2 (time 150) waits behind offset 1 (time 400), so that
        // the position, offset 1, reads both again after a restore.
        let mut got = values(&a.release().unwrap());
        got.sort();
        assert_eq!(got, vec![0, 0]);
        assert_eq!(a.first_waiting(), BTreeMap::from([(0, 1)]));
    }

    #[test]
    fn without_an_event_time_rows_go_on_at_once() {
        let mut a = Alignment::new(schema(), None, &[0, 1]);
        let (b, o) = rows(&[(0, 0, 100)]);
        a.add(&b, &o).unwrap();
        assert_eq!(values(&a.release().unwrap()), vec![0]);
    }
}
