//! Exchanges between the processes of a group: a query's rows and
//! watermarks handed from its part that runs per partition to the part
//! that runs once for the group (a stage over every key), through an
//! internal topic.
//!
//! - The writer, [`ExchangeSink`], ends the per-partition part of partition
//!   `w` (the writer). Every batch of rows goes as one or more messages
//!   holding an Arrow IPC stream (the rows exactly as they were, whatever
//!   their types); every watermark goes as an empty message with the
//!   headers `vigil-writer: w` and `vigil-watermark: ms`. It produces
//!   exactly once, like the `kafka` sink: an epoch's messages in one
//!   transaction once the checkpoint holding them is written (see
//!   [`txn`](super::txn)). So the part after sees each row once, whatever
//!   process died, and rows reach it a checkpoint interval late.
//! - The reader, [`ExchangeReader`], is the source of the part after: it
//!   reads the internal topic's partitions with `read_committed`, hands
//!   the rows on, and keeps every writer's last watermark; the part after
//!   gets the minimum over all writers once each has sent one (a writer
//!   not heard from may still have rows: as within one process, the
//!   slowest input holds event time back). Rows wait only until that
//!   minimum next moves, and all go before it: each is on time against its
//!   writer's watermark before it, which the minimum has not passed. A
//!   writer read to its end says it is idle; it stops holding event time
//!   back if it never had rows, or once idle for the stream's
//!   `idle_timeout`, but not before: its part keeps its own event time, so
//!   windows it holds open would close only with its next rows, and come
//!   late. Its position in checkpoints is its offsets and the writers'
//!   watermarks, with what a restore must not repeat or hold back: rows
//!   are handed on one message at a time, so a checkpoint can fall
//!   between rows that went on ahead of an earlier message of their
//!   partition (skipped when read again), rows released but not yet gone
//!   on (they go on at once when read again) and the watermark that
//!   released them (it follows them when read again). The writers of a
//!   partition read again are stored as they stood before its first
//!   message read again, so a restore cannot let event time pass rows
//!   before they are in again.
//!
//! Watermarks cannot travel in a stream's rows as such, so the reader's
//! stream has two more columns (see [`crate::exec::remote`]) that the
//! first operator of the part after turns back into messages.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Cursor;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, UInt32Array};
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_expr::PhysicalExpr;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message as _, OwnedMessage};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use serde_json::{Value, json};

use super::super::{
    Decoding, Format, Replay, Sink, SinkCommit, SourceConfig, SourceLocation, SourcePosition,
    SourceStats,
};
use super::txn::{Producing, Record};
use super::{CALL_TIMEOUT, Endpoint, Reporter, kafka_error};
use crate::connector::RowKind;
use crate::connector::{Reader, SourceRead};
use crate::error::{Error, Result};
use crate::exec::END_OF_INPUT;
use crate::exec::remote::{kind_code, kind_of, remote_schema, result_rows, watermark_row};
use crate::state::{instance_of, key_groups_of};

/// The header naming the partition whose part wrote a message.
const WRITER_HEADER: &str = "vigil-writer";
/// The header of a watermark message.
const WATERMARK_HEADER: &str = "vigil-watermark";
/// The header saying what kind of results a message holds.
const KIND_HEADER: &str = "vigil-kind";
/// The header of a message saying its writer has read its partition of
/// the group's topic to the end, up to the offset it holds.
const IDLE_HEADER: &str = "vigil-idle";

/// A message holds at most about this many bytes of rows (Kafka's default
/// largest message is 1 MB).
const MESSAGE_BYTES: usize = 512 * 1024;

/// How long one poll of the reader waits.
const POLL: Duration = Duration::from_millis(100);

/// The reader end of an exchange (see the module documentation).
#[derive(Debug, Clone)]
pub struct ExchangeReader {
    /// Brokers and internal topic.
    pub endpoint: Endpoint,
    /// The internal topic's partitions it reads.
    pub partitions: Vec<i32>,
    /// How many writers there are (partitions `0..writers` of the group's
    /// topic): the watermark waits for all of them.
    pub writers: i32,
    /// The rows as the writers' part emitted them.
    pub boundary: SchemaRef,
    /// The group's topic (on the same brokers), whose partition `w` writer
    /// `w` reads.
    pub input_topic: String,
    /// The group's stream's `idle_timeout`: how long a writer that had rows
    /// and went idle still holds event time back (without one, until it
    /// sends again).
    pub idle_timeout: Option<Duration>,
}

impl ExchangeReader {
    /// The schema of the stream it reads: the boundary's and the two
    /// columns of [`crate::exec::remote`].
    pub fn schema(&self) -> SchemaRef {
        remote_schema(&self.boundary)
    }

    /// The source of stream `stream`, read by this reader.
    pub fn source_config(self: Arc<Self>, stream: &str) -> SourceConfig {
        SourceConfig {
            stream: stream.to_string(),
            schema: self.schema(),
            connector: "kafka",
            location: SourceLocation::Connector(Reader(self)),
            format: Format::Jsonl,
            replay: Replay::Fast,
            event_time: None,
            batch_size: 8192,
            dead_letter: None,
            follow: false,
            decode: Decoding::default(),
            decode_threads: 1,
        }
    }
}

impl SourceRead for ExchangeReader {
    fn describe(&self) -> String {
        format!(
            "internal topic {} at {}",
            self.endpoint.topic, self.endpoint.bootstrap
        )
    }
    fn explain(&self) -> String {
        format!(
            "exchange, internal topic {}, partitions {:?}, {} writers",
            self.endpoint.topic, self.partitions, self.writers
        )
    }
    fn live_because(&self) -> &'static str {
        "an exchange between the processes of a group reads a topic that has no end"
    }
    fn read(
        &self,
        config: &SourceConfig,
        stats: &SourceStats,
        start: Option<&SourcePosition>,
        emit: &mut dyn FnMut(RecordBatch) -> bool,
    ) -> Result<()> {
        ExchangeReading::open(self, config, stats, start)?.run(emit)
    }
}

/// One reading of an internal topic.
struct ExchangeReading<'a> {
    reader: &'a ExchangeReader,
    config: &'a SourceConfig,
    stats: &'a SourceStats,
    consumer: BaseConsumer<Reporter>,
    /// Per partition, the offset of the next message.
    offsets: BTreeMap<i32, i64>,
    /// Per writer, its last watermark.
    watermarks: BTreeMap<i32, i64>,
    /// The writers that said they are idle and sent nothing since, with
    /// the offset of their partition of the group's topic they had read
    /// to.
    idle: BTreeMap<i32, i64>,
    /// The merged watermark last moved to (its row may not have gone on
    /// yet: see `handed`).
    emitted: i64,
    /// The watermark row handed on last.
    handed: i64,
    /// Per partition, the offsets of messages whose rows were released
    /// but had not gone on at the checkpoint this reading resumed from:
    /// read again, they go on at once, not waiting for a move of the
    /// merged watermark that has already been.
    due: BTreeMap<i32, BTreeSet<i64>>,
    rows: u64,
    /// Rows waiting for the merged watermark to move, in arrival order.
    pending: VecDeque<Pending>,
    /// When each writer in `idle` said so (by this reader's clock).
    idle_since: BTreeMap<i32, Instant>,
    /// What goes on next, in order: rows released, then the watermark
    /// that released them. Handed on one at a time, each after the
    /// position that includes it is stored, since a checkpoint barrier
    /// can follow any of them.
    outgoing: VecDeque<Outgoing>,
    /// Per partition, the offsets of messages whose rows went on although
    /// an earlier message of the partition's has not: a restore reads the
    /// partition again from that earlier one and skips these.
    sent_ahead: BTreeMap<i32, BTreeSet<i64>>,
}

/// One thing the reader hands on.
enum Outgoing {
    /// Rows released.
    Rows(Pending),
    /// A watermark row, of this watermark.
    Watermark(i64, RecordBatch),
}

/// Rows of one message, waiting for the merged watermark to move.
struct Pending {
    partition: i32,
    offset: i64,
    writer: i32,
    rows: RecordBatch,
    /// Its writer's watermark when it came (the rows are on time against
    /// it, in the writer's part).
    since: i64,
    /// Where the writers of its partition stood just before it came: a
    /// restore reads the partition again from here, so the position says
    /// this of them (see [`ExchangeReading::store_position`]).
    before: BTreeMap<i32, WriterState>,
}

/// What the reader knew of one writer at some offset of its partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct WriterState {
    /// Its last watermark.
    watermark: Option<i64>,
    /// The offset it said it is idle at, if it has sent nothing since.
    idle: Option<i64>,
}

impl<'a> ExchangeReading<'a> {
    fn open(
        reader: &'a ExchangeReader,
        config: &'a SourceConfig,
        stats: &'a SourceStats,
        start: Option<&SourcePosition>,
    ) -> Result<Self> {
        let what = format!("stream {}", config.stream);
        let group = format!("vigil-reader-{}", reader.endpoint.topic);
        let consumer: BaseConsumer<Reporter> = reader
            .endpoint
            .client_config(&[
                ("group.id", &group),
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("auto.offset.reset", "earliest"),
                ("isolation.level", "read_committed"),
            ])
            .create_with_context(Reporter::counting(
                what.clone(),
                stats.client_errors.clone(),
            ))
            .map_err(|e| kafka_error(&what, e))?;
        let mut reading = ExchangeReading {
            reader,
            config,
            stats,
            consumer,
            offsets: BTreeMap::new(),
            watermarks: BTreeMap::new(),
            idle: BTreeMap::new(),
            emitted: i64::MIN,
            handed: i64::MIN,
            due: BTreeMap::new(),
            rows: 0,
            pending: VecDeque::new(),
            idle_since: BTreeMap::new(),
            outgoing: VecDeque::new(),
            sent_ahead: BTreeMap::new(),
        };
        if let Some(position) = start {
            reading.resume(position)?;
        }
        Ok(reading)
    }

    fn resume(&mut self, position: &SourcePosition) -> Result<()> {
        let bad = || {
            Error::Connector(format!(
                "stream {}: the checkpoint's exchange position is damaged: {}",
                self.config.stream, position.extra
            ))
        };
        let numbers = |key: &str| -> Result<BTreeMap<i32, i64>> {
            let object = position
                .extra
                .get(key)
                .and_then(Value::as_object)
                .ok_or_else(bad)?;
            object
                .iter()
                .map(|(k, v)| Ok((k.parse().map_err(|_| bad())?, v.as_i64().ok_or_else(bad)?)))
                .collect()
        };
        self.offsets = numbers("offsets")?;
        self.watermarks = numbers("writers")?;
        self.idle = numbers("idle")?;
        let offset_sets = |key: &str| -> Result<BTreeMap<i32, BTreeSet<i64>>> {
            let Some(sets) = position.extra.get(key) else {
                return Ok(BTreeMap::new());
            };
            let mut out = BTreeMap::new();
            for (partition, offsets) in sets.as_object().ok_or_else(bad)? {
                let partition: i32 = partition.parse().map_err(|_| bad())?;
                let offsets = offsets.as_array().ok_or_else(bad)?;
                let offsets = offsets.iter().map(|o| o.as_i64().ok_or_else(bad));
                out.insert(partition, offsets.collect::<Result<_>>()?);
            }
            Ok(out)
        };
        self.sent_ahead = offset_sets("sent_ahead")?;
        self.due = offset_sets("due")?;
        let now = Instant::now();
        self.idle_since = self.idle.keys().map(|&w| (w, now)).collect();
        let merged = self.merged().unwrap_or(i64::MIN);
        self.handed = match position.extra.get("handed") {
            Some(handed) => handed.as_i64().ok_or_else(bad)?,
            None => merged,
        };
        // Rows it had released go on once they are in again (see `take`);
        // the watermark that released them follows once the writers'
        // watermarks read again reach it.
        self.emitted = self.handed;
        self.rows = position.rows;
        self.stats.rows.store(position.rows, Ordering::Relaxed);
        Ok(())
    }

    fn run(mut self, emit: &mut dyn FnMut(RecordBatch) -> bool) -> Result<()> {
        self.assign()?;
        let schema = self.config.schema.clone();
        // A restore may owe the watermark of rows that went on before it.
        self.advance(&schema)?;
        loop {
            if self.stats.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            match self.consumer.poll(POLL) {
                None => self.tick(&schema)?,
                Some(Err(e)) => self.consumer.context().warn(&e.to_string()),
                Some(Ok(m)) => {
                    let m = m.detach();
                    self.take(&m, &schema)?
                }
            }
            if self.outgoing.is_empty() {
                self.store_position();
                if !emit(RecordBatch::new_empty(schema.clone())) {
                    return Ok(());
                }
            }
            while let Some(batch) = self.next_out() {
                self.store_position();
                if !emit(batch) {
                    return Ok(());
                }
            }
            if self.emitted == END_OF_INPUT {
                return Ok(());
            }
        }
    }

    fn assign(&self) -> Result<()> {
        let topic = &self.reader.endpoint.topic;
        let mut list = TopicPartitionList::new();
        for &p in &self.reader.partitions {
            let offset = self
                .offsets
                .get(&p)
                .map_or(Offset::Beginning, |&o| Offset::Offset(o));
            list.add_partition_offset(topic, p, offset)
                .map_err(|e| kafka_error(topic, e))?;
        }
        self.consumer
            .assign(&list)
            .map_err(|e| kafka_error(&format!("assigning the partitions of {topic}"), e))
    }

    /// Takes message `m` in; when the merged watermark moved, the rows
    /// waiting and then it are due to go on.
    fn take(&mut self, m: &OwnedMessage, schema: &SchemaRef) -> Result<()> {
        let partition = m.partition();
        self.offsets.insert(partition, m.offset() + 1);
        let header = |name: &str| -> Option<String> {
            let headers = m.headers()?;
            headers
                .iter()
                .find(|h| h.key == name)
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        let at = || format!("partition {partition} offset {}", m.offset());
        let Some(writer) = header(WRITER_HEADER).and_then(|w| w.parse::<i32>().ok()) else {
            self.consumer.context().warn(&format!(
                "{}: a message not written by vigil, skipped",
                at()
            ));
            return Ok(());
        };
        let number = |text: String, what: &str| -> Result<i64> {
            text.parse()
                .map_err(|_| Error::Connector(format!("{}: a damaged {what} {text}", at())))
        };
        if let Some(offset) = header(IDLE_HEADER) {
            let offset = number(offset, "idle offset")?;
            self.idle.insert(writer, offset);
            self.idle_since.insert(writer, Instant::now());
            return self.advance(schema);
        }
        let was_idle = self.idle.remove(&writer);
        self.idle_since.remove(&writer);
        if let Some(watermark) = header(WATERMARK_HEADER) {
            let watermark = number(watermark, "watermark")?;
            let slot = self.watermarks.entry(writer).or_insert(i64::MIN);
            *slot = (*slot).max(watermark);
            return self.advance(schema);
        }
        if let Some(sent) = self.sent_ahead.get_mut(&partition)
            && sent.remove(&m.offset())
        {
            // Handed on before the checkpoint this reading resumed from.
            return Ok(());
        }
        let due = self
            .due
            .get_mut(&partition)
            .is_some_and(|due| due.remove(&m.offset()));
        let code = header(KIND_HEADER).and_then(|k| k.parse::<i8>().ok());
        let kind =
            kind_of(code.unwrap_or(0)).map_err(|e| Error::Connector(format!("{}: {e}", at())))?;
        let rows = decode(m.payload().unwrap_or_default())
            .map_err(|e| Error::Connector(format!("{}: rows that do not decode: {e}", at())))?;
        let pending = Pending {
            partition,
            offset: m.offset(),
            writer,
            rows: result_rows(schema, &rows, kind)?,
            since: self.watermarks.get(&writer).copied().unwrap_or(i64::MIN),
            before: self.writers_before(partition, writer, was_idle),
        };
        if !due {
            self.pending.push_back(pending);
            return Ok(());
        }
        self.outgoing.push_back(Outgoing::Rows(pending));
        self.due.retain(|_, due| !due.is_empty());
        if self.due.is_empty() {
            self.advance(schema)?;
        }
        Ok(())
    }

    /// With nothing read: an idle writer may have just been idle long
    /// enough to stop holding event time back.
    fn tick(&mut self, schema: &SchemaRef) -> Result<()> {
        if self.reader.idle_timeout.is_none() || self.idle.is_empty() {
            return Ok(());
        }
        self.advance(schema)
    }

    /// Whether writer `w` holds the merged watermark back. Every writer
    /// does but one that said it is idle and either never sent a
    /// watermark (it has had no rows, so its part holds no state) or has
    /// been idle longer than the stream's `idle_timeout`. An idle writer
    /// that had rows holds it back at its last watermark: its part may keep
    /// windows open that only its own next rows close (its event time is
    /// its partition's alone), and their rows would come after the others'
    /// event time had passed them.
    fn holds_back(&self, w: i32, now: Instant) -> bool {
        if !self.idle.contains_key(&w) {
            return true;
        }
        if !self.watermarks.contains_key(&w) {
            return false;
        }
        let since = self.idle_since.get(&w).copied().unwrap_or(now);
        self.reader
            .idle_timeout
            .is_none_or(|limit| now.duration_since(since) < limit)
    }

    /// The minimum of the watermarks of the writers that hold it back
    /// (see [`ExchangeReading::holds_back`]), once each of them sent one
    /// (`None` while one has not); when none does, the largest watermark
    /// any sent, since all they had is in.
    fn merged(&self) -> Option<i64> {
        let now = Instant::now();
        let holding: Vec<i32> = (0..self.reader.writers)
            .filter(|&w| self.holds_back(w, now))
            .collect();
        if holding.is_empty() {
            return self.watermarks.values().copied().max();
        }
        holding
            .iter()
            .map(|w| self.watermarks.get(w).copied())
            .collect::<Option<Vec<i64>>>()?
            .into_iter()
            .min()
    }

    /// Hands on the merged watermark if it moved, after every row waiting.
    /// Before it moves past a writer that said it is idle, the writer's
    /// partition of the group's topic is checked: messages past the offset
    /// it was idle at mean it has rows to send (or its process died before
    /// it read them), so it holds event time back again.
    fn advance(&mut self, schema: &SchemaRef) -> Result<()> {
        if !self.due.is_empty() {
            // Rows released before the restore are not all in again: the
            // watermark must not pass them.
            return Ok(());
        }
        if !self.idle.is_empty() && self.merged().is_some_and(|w| w > self.emitted) {
            self.wake_idle_writers();
        }
        let Some(merged) = self.merged().filter(|&w| w > self.emitted) else {
            return Ok(());
        };
        self.emitted = merged;
        self.release();
        if merged != END_OF_INPUT {
            // At the end, the runtime sends the last watermark itself.
            let row = watermark_row(schema, merged)?;
            self.outgoing.push_back(Outgoing::Watermark(merged, row));
        }
        Ok(())
    }

    /// The writers whose messages come in partition `partition` of the
    /// internal topic: every writer when this reader reads one partition
    /// (a re-partitioning, where each writer sends to every partition),
    /// else writer `partition` alone (each writer sends to its own).
    fn writers_of(&self, partition: i32) -> Vec<i32> {
        if self.reader.partitions.len() == 1 {
            (0..self.reader.writers).collect()
        } else {
            vec![partition]
        }
    }

    /// Where the writers of `partition` stand, with `writer` as before its
    /// message that came now (it was idle at `was_idle`, if it was).
    fn writers_before(
        &self,
        partition: i32,
        writer: i32,
        was_idle: Option<i64>,
    ) -> BTreeMap<i32, WriterState> {
        self.writers_of(partition)
            .into_iter()
            .map(|w| {
                let idle = if w == writer {
                    was_idle
                } else {
                    self.idle.get(&w).copied()
                };
                let watermark = self.watermarks.get(&w).copied();
                (w, WriterState { watermark, idle })
            })
            .collect()
    }

    /// Takes out every row waiting, ordered by its writer's watermark when
    /// it came, then writer, then offset, as one process would hand them
    /// on. All of them go before the merged watermark that made them due:
    /// a row is on time against its writer's watermark before it, and the
    /// merged one was at most that, so none of them is late yet; one held
    /// past the merged watermark could be.
    fn release(&mut self) {
        let mut ready: Vec<Pending> = self.pending.drain(..).collect();
        ready.sort_by_key(|p| (p.since, p.writer, p.offset));
        self.outgoing.extend(ready.into_iter().map(Outgoing::Rows));
    }

    /// Takes out the next thing to hand on.
    fn next_out(&mut self) -> Option<RecordBatch> {
        match self.outgoing.pop_front()? {
            Outgoing::Watermark(watermark, row) => {
                self.handed = watermark;
                Some(row)
            }
            Outgoing::Rows(p) => {
                self.rows += p.rows.num_rows() as u64;
                self.stats.rows.store(self.rows, Ordering::Relaxed);
                self.sent_ahead
                    .entry(p.partition)
                    .or_default()
                    .insert(p.offset);
                Some(p.rows)
            }
        }
    }

    /// Takes out of `idle` the writers whose partition of the group's
    /// topic has messages past the offset they were idle at (or cannot be
    /// asked about): one request for them all, each time event time would
    /// move on past idle writers.
    fn wake_idle_writers(&mut self) {
        let topic = &self.reader.input_topic;
        let mut list = TopicPartitionList::new();
        for &writer in self.idle.keys() {
            // Offset::End as a time asks for the partition's end.
            let _ = list.add_partition_offset(topic, writer, Offset::End);
        }
        let ends = match self.consumer.offsets_for_times(list, CALL_TIMEOUT) {
            Ok(ends) => ends,
            Err(e) => {
                self.consumer.context().warn(&format!(
                    "the ends of {topic}'s partitions: {e}; idle partitions hold event time back"
                ));
                self.idle.clear();
                self.idle_since.clear();
                return;
            }
        };
        self.idle.retain(|&writer, &mut offset| {
            let end = ends
                .find_partition(topic, writer)
                .filter(|e| e.error().is_ok())
                .map(|e| e.offset());
            matches!(end, Some(Offset::Offset(high)) if high <= offset)
        });
        let idle = &self.idle;
        self.idle_since.retain(|w, _| idle.contains_key(w));
    }

    /// Stores where the reading stands after what it has handed on.
    fn store_position(&mut self) {
        let map = |m: &BTreeMap<i32, i64>| -> serde_json::Map<String, Value> {
            m.iter().map(|(k, v)| (k.to_string(), json!(v))).collect()
        };
        // A partition with rows still waiting is read again from its first;
        // rows of its later messages that went on already are skipped then.
        let mut offsets = self.offsets.clone();
        let waiting = self.outgoing.iter().filter_map(|o| match o {
            Outgoing::Rows(p) => Some(p),
            Outgoing::Watermark(..) => None,
        });
        // Per partition, its first message waiting: where it is read again.
        let mut first: BTreeMap<i32, &Pending> = BTreeMap::new();
        for p in self.pending.iter().chain(waiting) {
            let offset = offsets.entry(p.partition).or_insert(p.offset);
            *offset = (*offset).min(p.offset);
            let earliest = first.entry(p.partition).or_insert(p);
            if p.offset < earliest.offset {
                *earliest = p;
            }
        }
        // The writers of a partition read again stand where they stood
        // before its first message waiting: their later watermarks are
        // read again too, and kept now they would let event time pass the
        // rows read again before those are in.
        let mut watermarks = self.watermarks.clone();
        let mut idle = self.idle.clone();
        for p in first.values() {
            for (&w, state) in &p.before {
                set_or_remove(&mut watermarks, w, state.watermark);
                set_or_remove(&mut idle, w, state.idle);
            }
        }
        for (partition, sent) in &mut self.sent_ahead {
            let from = offsets.get(partition).copied().unwrap_or(i64::MAX);
            sent.retain(|&o| o >= from);
        }
        self.sent_ahead.retain(|_, sent| !sent.is_empty());
        let sets = |m: &BTreeMap<i32, BTreeSet<i64>>| -> serde_json::Map<String, Value> {
            m.iter()
                .map(|(p, set)| (p.to_string(), json!(set)))
                .collect()
        };
        // Rows released and not gone on, and those due that are not in
        // again yet, go on at once when read again.
        let mut due = self.due.clone();
        for o in &self.outgoing {
            if let Outgoing::Rows(p) = o {
                due.entry(p.partition).or_default().insert(p.offset);
            }
        }
        let position = SourcePosition {
            rows: self.rows,
            extra: json!({
                "offsets": map(&offsets),
                "writers": map(&watermarks),
                "idle": map(&idle),
                "sent_ahead": sets(&self.sent_ahead),
                "due": sets(&due),
                "handed": self.handed,
            }),
            ..SourcePosition::default()
        };
        *self
            .stats
            .position
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(position);
    }
}

/// Sets `map[key]` to `value`, or removes it when there is none.
fn set_or_remove(map: &mut BTreeMap<i32, i64>, key: i32, value: Option<i64>) {
    match value {
        Some(v) => map.insert(key, v),
        None => map.remove(&key),
    };
}

/// The rows of one message: one IPC stream.
fn decode(bytes: &[u8]) -> Result<RecordBatch> {
    let reader = StreamReader::try_new(Cursor::new(bytes), None)?;
    let schema = reader.schema();
    let batches = reader.collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(datafusion::arrow::compute::concat_batches(
        &schema, &batches,
    )?)
}

#[cfg(test)]
mod tests;
mod write;

#[cfg(test)]
use write::encode;
pub use write::{ExchangeSink, Route, ensure_topic};
