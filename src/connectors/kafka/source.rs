//! `CREATE STREAM ... WITH (connector = 'kafka', ...)`: every partition of
//! a topic, decoded into the stream's rows.
//!
//! # Offsets
//!
//! The offsets read so far are the source's [`SourcePosition`]
//! (`extra.offsets`: partition -> next offset), so vigil's checkpoints are
//! the source of truth: a restored query seeks every partition to the
//! offset its checkpoint holds, whatever Kafka has. Without a checkpoint,
//! `start` says where to begin: `committed` (the group's committed offsets,
//! else the earliest), `earliest` or `latest`. Offsets are also committed
//! to Kafka under `group` every few seconds, only so that the usual tools
//! show the lag.
//!
//! # Messages and rows
//!
//! One message is one row. `format = 'json'` takes a JSON object per
//! message, `csv` one CSV record (the declared columns in order, no
//! header), `raw` the payload as the stream's one text column. Columns
//! named `_key`, `_partition`, `_offset`, `_timestamp` and `_headers` (a
//! JSON object as text) are filled from the message itself, and with
//! `ts_from = 'kafka'` so is the event-time column, from the message
//! timestamp. A message that does not decode is a bad row: counted, named
//! by partition and offset, and copied to `dead_letter` as it came.
//!
//! # Watermarks
//!
//! Each partition has its own watermark and the stream's is their
//! minimum; a partition the consumer has read to its end is idle and does
//! not hold it back (see [`align`](super::align)).
//!
//! # Brokers that cannot be reached
//!
//! librdkafka retries with back-off; its errors become warnings (see
//! [`Reporter`]) and the source waits, so a broker that comes back is read
//! from where the source stood.

mod decode;
mod message;
use message::*;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use datafusion::arrow::array::AsArray;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::datatypes::TimestampMillisecondType;
use datafusion::arrow::record_batch::RecordBatch;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use serde_json::{Value, json};

use super::super::common::{TEXT_OPTIONS, batch_size, decoding};
use super::super::options::Options;
use super::super::{
    Format, MessageOrigin, Replay, SourceConfig, SourceLocation, SourcePosition, SourceStats,
    dead_letter_line, read_messages,
};
use super::align::Alignment;
use super::{BOOTSTRAP, CALL_TIMEOUT, Endpoint, PROPERTIES, Reporter, TOPIC, kafka_error};
use crate::connector::{OptionSpec, OptionType, Reader, SourceConnector, SourceRead, StreamDecl};
use crate::error::{Error, Result};
use crate::text::{Pacer, pause};
use crate::timestamp::format_timestamp_ms;

/// How long one poll waits for a message; also the longest the source goes
/// without an empty batch while it waits.
const POLL: Duration = Duration::from_millis(100);

/// How often offsets are committed to Kafka for monitoring.
const COMMIT_EVERY: Duration = Duration::from_secs(5);

/// Rows of one partition waiting for the others beyond which it is
/// paused.
const PAUSE_ROWS: usize = 65_536;

/// The longest wait between two tries to read a topic's partitions.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

const OPTIONS: &[OptionSpec] = &[
    BOOTSTRAP,
    TOPIC,
    OptionSpec {
        name: "format",
        ty: OptionType::Choice(&["json", "jsonl", "csv", "raw"]),
        default: Some("json"),
        accepted: "json, csv, raw",
        doc: "a message is a JSON object, a CSV record, or the text of the one column",
    },
    OptionSpec {
        name: "group",
        ty: OptionType::Text,
        default: Some("vigil-<stream>"),
        accepted: "a consumer group name",
        doc: "the consumer group offsets are committed under (for monitoring lag)",
    },
    OptionSpec {
        name: "start",
        ty: OptionType::Choice(&["committed", "earliest", "latest"]),
        default: Some("committed"),
        accepted: "committed, earliest, latest",
        doc: "where to begin without a checkpoint (committed falls back to earliest)",
    },
    OptionSpec {
        name: "stop_at",
        ty: OptionType::Choice(&["never", "latest"]),
        default: Some("never"),
        accepted: "never, latest",
        doc: "`latest` ends the stream at the offsets the topic had when it started",
    },
    OptionSpec {
        name: "ts_from",
        ty: OptionType::Choice(&["column", "kafka"]),
        default: Some("column"),
        accepted: "column, kafka",
        doc: "the event time: decoded from its column, or the message timestamp",
    },
    OptionSpec {
        name: "partitions",
        ty: OptionType::Text,
        default: Some("all"),
        accepted: "partition numbers such as '0' or '0,2,5'",
        doc: "read only these partitions (`vigil run --group` sets it per pipeline)",
    },
    OptionSpec {
        name: "partitioned_by",
        ty: OptionType::Text,
        default: Some("not said (trusted to match)"),
        accepted: "column names such as 'host' or 'host, task', or 'none'",
        doc: "what the producer keyed the messages by; in a group, a query keyed otherwise re-partitions",
    },
    TEXT_OPTIONS[1],
    TEXT_OPTIONS[2],
    TEXT_OPTIONS[3],
    TEXT_OPTIONS[4],
    TEXT_OPTIONS[7],
    TEXT_OPTIONS[8],
    PROPERTIES,
];

/// The columns a message fills itself, with the types they may have.
const META: &[(&str, &[DataType])] = &[
    ("_key", &[DataType::Utf8]),
    ("_partition", &[DataType::Int64, DataType::Int32]),
    ("_offset", &[DataType::Int64]),
    (
        "_timestamp",
        &[DataType::Timestamp(
            datafusion::arrow::datatypes::TimeUnit::Millisecond,
            None,
        )],
    ),
    ("_headers", &[DataType::Utf8]),
];

/// `connector = 'kafka'` in `CREATE STREAM`.
pub struct KafkaSourceConnector;

impl SourceConnector for KafkaSourceConnector {
    fn name(&self) -> &'static str {
        "kafka"
    }
    fn summary(&self) -> &'static str {
        "every partition of a Kafka topic (JSON, CSV or raw messages); offsets live in checkpoints"
    }
    fn options(&self) -> &'static [OptionSpec] {
        OPTIONS
    }
    fn configure(&self, decl: &StreamDecl<'_>, opts: &Options<'_>) -> Result<SourceConfig> {
        let format = match opts.choice("format")? {
            Some("csv") => MessageFormat::Csv,
            Some("raw") => MessageFormat::Raw,
            _ => MessageFormat::Json,
        };
        let kafka = KafkaSource {
            endpoint: Endpoint::from_options(opts)?,
            group: opts
                .text("group")
                .map_or_else(|| format!("vigil-{}", decl.stream), str::to_string),
            start: match opts.choice("start")? {
                Some("earliest") => Start::Earliest,
                Some("latest") => Start::Latest,
                _ => Start::Committed,
            },
            stop_at_latest: opts.choice("stop_at")? == Some("latest"),
            replay_speed: match opts.choice("replay")? {
                Some("realtime") => Some(opts.number("speed")?.unwrap_or(1.0)),
                _ => None,
            },
            only: match opts.text("partitions") {
                None => None,
                Some(text) => {
                    Some(parse_partitions(text).ok_or_else(|| opts.bad_value("partitions", text))?)
                }
            },
            columns: MessageColumns::of(decl, format, opts.choice("ts_from")? == Some("kafka"))?,
            partitioned_by: partitioned_by(decl, opts)?,
        };
        let text_format = match format {
            MessageFormat::Csv => Format::Csv,
            _ => Format::Jsonl,
        };
        let batch_size = batch_size(opts)?;
        Ok(SourceConfig {
            stream: decl.stream.to_string(),
            schema: decl.schema.clone(),
            connector: "kafka",
            location: SourceLocation::Connector(Reader(Arc::new(kafka))),
            format: text_format,
            replay: Replay::Fast,
            event_time: decl.event_time,
            batch_size,
            dead_letter: opts.path("dead_letter", decl.base_dir)?,
            follow: false,
            decode_threads: 1,
            decode: decoding(opts, text_format)?,
        })
    }
}

/// How a message's payload encodes a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageFormat {
    /// A JSON object, fields matched to columns by name.
    Json,
    /// One CSV record: the stream's payload columns, in declared order.
    Csv,
    /// The payload as the text of the stream's one payload column.
    Raw,
}

/// Where a stream begins without a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The group's committed offsets; the earliest where it has none.
    Committed,
    /// The earliest offset each partition still has.
    Earliest,
    /// Only messages produced from now on.
    Latest,
}

/// Which columns come from the payload and which from the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageColumns {
    /// How payloads are decoded.
    pub format: MessageFormat,
    /// The columns the payload holds, in declared order.
    pub payload: Vec<String>,
    /// The metadata columns declared (`_key`, ...).
    pub meta: Vec<String>,
    /// With `ts_from = 'kafka'`: the event-time column, filled from the
    /// message timestamp.
    pub time_from_message: Option<String>,
}

impl MessageColumns {
    fn of(decl: &StreamDecl<'_>, format: MessageFormat, ts_from_kafka: bool) -> Result<Self> {
        let time_from_message = match (ts_from_kafka, decl.event_time) {
            (false, _) => None,
            (true, Some(i)) => Some(decl.schema.field(i).name().clone()),
            (true, None) => {
                return Err(Error::Plan(format!(
                    "stream {}: ts_from = 'kafka' needs an event-time column (WATERMARK FOR ...)",
                    decl.stream
                )));
            }
        };
        let mut payload = Vec::new();
        let mut meta = Vec::new();
        for field in decl.schema.fields() {
            let name = field.name();
            if let Some((_, types)) = META.iter().find(|(m, _)| m == name) {
                if !types.contains(field.data_type()) {
                    return Err(Error::Plan(format!(
                        "stream {}: column {name} is filled from the Kafka message and must be {}",
                        decl.stream,
                        meta_type(name)
                    )));
                }
                meta.push(name.clone());
            } else if Some(name) != time_from_message.as_ref() {
                payload.push(name.clone());
            }
        }
        if format == MessageFormat::Raw {
            let text = payload.len() == 1
                && decl
                    .schema
                    .field_with_name(&payload[0])
                    .is_ok_and(|f| f.data_type() == &DataType::Utf8);
            if !text {
                return Err(Error::Plan(format!(
                    "stream {}: format = 'raw' needs exactly one TEXT column besides the ones the message fills (_key, _partition, _offset, _timestamp, _headers{}); it has {}",
                    decl.stream,
                    if time_from_message.is_some() {
                        ", the event time"
                    } else {
                        ""
                    },
                    if payload.is_empty() {
                        "none".to_string()
                    } else {
                        payload.join(", ")
                    }
                )));
            }
        }
        Ok(MessageColumns {
            format,
            payload,
            meta,
            time_from_message,
        })
    }
}

fn meta_type(name: &str) -> &'static str {
    match name {
        "_partition" | "_offset" => "BIGINT",
        "_timestamp" => "TIMESTAMP",
        _ => "TEXT",
    }
}

/// A configured `kafka` stream.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaSource {
    /// Brokers, topic, librdkafka settings.
    pub endpoint: Endpoint,
    /// The group offsets are committed under.
    pub group: String,
    /// Where to begin without a checkpoint.
    pub start: Start,
    /// End at the offsets the topic had when reading began.
    pub stop_at_latest: bool,
    /// With `replay = 'realtime'`: the speed-up at which event-time gaps
    /// are replayed as pauses (a backtest over a topic's history at its
    /// own pace); `None` reads as fast as the brokers give.
    pub replay_speed: Option<f64>,
    /// Read only these partitions; `None` for all of them.
    pub only: Option<Vec<i32>>,
    /// How messages become rows.
    pub columns: MessageColumns,
    /// The columns the producer keyed the messages by (`Some` of none for
    /// messages not keyed by any column); `None` when not declared.
    pub partitioned_by: Option<Vec<String>>,
}

/// The `partitioned_by` option: columns of the stream, or `none`.
fn partitioned_by(decl: &StreamDecl<'_>, opts: &Options<'_>) -> Result<Option<Vec<String>>> {
    let Some(text) = opts.text("partitioned_by") else {
        return Ok(None);
    };
    if text.trim().eq_ignore_ascii_case("none") {
        return Ok(Some(Vec::new()));
    }
    let columns: Vec<String> = text.split(',').map(|c| c.trim().to_string()).collect();
    if columns
        .iter()
        .any(|c| decl.schema.field_with_name(c).is_err())
    {
        return Err(opts.bad_value("partitioned_by", text));
    }
    Ok(Some(columns))
}

impl SourceRead for KafkaSource {
    fn describe(&self) -> String {
        format!(
            "kafka topic {} at {}",
            self.endpoint.topic, self.endpoint.bootstrap
        )
    }
    fn explain(&self) -> String {
        format!("kafka, topic {}, group {}", self.endpoint.topic, self.group)
    }
    fn live_because(&self) -> &'static str {
        "connector 'kafka' reads a topic that has no end (unless stop_at = 'latest')"
    }
    fn read(
        &self,
        config: &SourceConfig,
        stats: &SourceStats,
        start: Option<&SourcePosition>,
        emit: &mut dyn FnMut(RecordBatch) -> bool,
    ) -> Result<()> {
        Reading::open(self, config, stats, start)?.run(emit)
    }
}

/// One reading of a topic.
struct Reading<'a> {
    source: &'a KafkaSource,
    config: &'a SourceConfig,
    stats: &'a SourceStats,
    consumer: BaseConsumer<Reporter>,
    progress: Progress,
    /// The rows decoded and waiting for the other partitions.
    alignment: Alignment,
    /// The partitions paused while their rows wait.
    paused: BTreeSet<i32>,
    /// The partitions read to their end, and nothing since, with the
    /// offset of their end (-1 when the brokers did not say).
    ended: BTreeMap<i32, i64>,
    /// With `stop_at = 'latest'`: per partition, the offset to stop at.
    end: Option<BTreeMap<i32, i64>>,
    last_commit: Instant,
    /// With `replay = 'realtime'`: when each decoded batch is due.
    pacer: Option<Pacer>,
}

/// What a reading has done: its position.
#[derive(Debug, Default)]
struct Progress {
    /// Per partition, the offset of the next message to read; partitions
    /// not in it yet start where `start` says.
    offsets: BTreeMap<i32, i64>,
    rows: u64,
    bad_rows: u64,
}

/// What decoding a poll's messages needs.
#[derive(Clone, Copy)]
struct Decoder<'a> {
    columns: &'a MessageColumns,
    config: &'a SourceConfig,
    stats: &'a SourceStats,
}

impl<'a> Reading<'a> {
    fn open(
        source: &'a KafkaSource,
        config: &'a SourceConfig,
        stats: &'a SourceStats,
        start: Option<&SourcePosition>,
    ) -> Result<Self> {
        let reporter = Reporter::counting(
            format!("stream {}", config.stream),
            stats.client_errors.clone(),
        );
        let reset = match source.start {
            Start::Latest => "latest",
            _ => "earliest",
        };
        let consumer: BaseConsumer<Reporter> = source
            .endpoint
            .client_config(&[
                ("group.id", &source.group),
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("auto.offset.reset", reset),
                ("isolation.level", "read_committed"),
                // Reaching a partition's end makes it idle (see `align`).
                ("enable.partition.eof", "true"),
            ])
            .create_with_context(reporter)
            .map_err(|e| kafka_error(&format!("stream {}", config.stream), e))?;
        let progress = match start {
            Some(position) => {
                stats.rows.store(position.rows, Ordering::Relaxed);
                stats.bad_rows.store(position.bad_rows, Ordering::Relaxed);
                Progress {
                    offsets: offsets_of(&config.stream, position)?,
                    rows: position.rows,
                    bad_rows: position.bad_rows,
                }
            }
            None => Progress::default(),
        };
        Ok(Reading {
            source,
            config,
            stats,
            consumer,
            progress,
            alignment: Alignment::new(config.schema.clone(), config.event_time, &[]),
            paused: BTreeSet::new(),
            ended: BTreeMap::new(),
            end: None,
            last_commit: Instant::now(),
            pacer: match (source.replay_speed, config.event_time) {
                (Some(speed), Some(column)) if speed > 0.0 => Some(Pacer::new(column, speed)),
                _ => None,
            },
        })
    }

    fn run(mut self, emit: &mut dyn FnMut(RecordBatch) -> bool) -> Result<()> {
        let Some(partitions) = self.partitions(emit) else {
            return Ok(());
        };
        self.assign(&partitions)?;
        if self.source.stop_at_latest {
            self.end = Some(self.high_watermarks(&partitions)?);
        }
        self.alignment = Alignment::new(
            self.config.schema.clone(),
            self.config.event_time,
            &partitions,
        );
        loop {
            if self.stats.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let polled = poll_batch(&self.consumer, self.config.batch_size);
            for m in &polled.messages {
                self.alignment.heard_from(m.partition());
            }
            for &p in &polled.ends {
                self.alignment.reached_end(p);
                let at = self.end_offset(p).unwrap_or(-1);
                self.ended.insert(p, at);
            }
            for m in &polled.messages {
                self.ended.remove(&m.partition());
            }
            let decoder = self.decoder();
            let (batch, origins) = self.progress.decode(decoder, &polled.messages)?;
            drop(polled);
            self.alignment.add(&batch, &origins)?;
            if !self.wait_until_due(&batch, emit)? {
                return Ok(());
            }
            let end = self.at_end();
            let released = if end {
                self.alignment.release_all()?
            } else {
                self.alignment.release()?
            };
            self.progress.released(decoder, &released);
            self.pace(&partitions);
            self.store_position();
            if !emit(released) {
                return Ok(());
            }
            self.commit_for_monitoring(end);
            if end {
                return Ok(());
            }
        }
    }

    fn decoder(&self) -> Decoder<'a> {
        Decoder {
            columns: &self.source.columns,
            config: self.config,
            stats: self.stats,
        }
    }

    /// With `replay = 'realtime'`: sleeps until the newest row of `batch`
    /// is due. Its rows wait in the alignment meanwhile, so the positions
    /// that empty batches store read them again; `Ok(false)` when the
    /// queries want no more.
    fn wait_until_due(
        &mut self,
        batch: &RecordBatch,
        emit: &mut dyn FnMut(RecordBatch) -> bool,
    ) -> Result<bool> {
        let newest = self.config.event_time.and_then(|i| {
            let times = batch
                .column(i)
                .as_primitive_opt::<TimestampMillisecondType>()?;
            datafusion::arrow::compute::max(times)
        });
        let Some(wait) = newest.and_then(|t| self.pacer.as_mut()?.delay(t)) else {
            return Ok(true);
        };
        let stats = self.stats;
        pause(wait, &stats.stop, &mut || Ok(self.idle(emit)))
    }

    /// Pauses a partition whose rows pile up waiting for the others, and
    /// resumes it once they have caught up, so the rows held stay bounded.
    fn pace(&mut self, partitions: &[i32]) {
        let topic = &self.source.endpoint.topic;
        for &p in partitions {
            let waiting = self.alignment.waiting(p);
            let change = if waiting > PAUSE_ROWS && self.paused.insert(p) {
                Some(true)
            } else if waiting < PAUSE_ROWS / 2 && self.paused.remove(&p) {
                Some(false)
            } else {
                None
            };
            let Some(pause) = change else { continue };
            let mut list = TopicPartitionList::new();
            if list
                .add_partition(topic, p)
                .set_offset(Offset::Invalid)
                .is_err()
            {
                continue;
            }
            let done = if pause {
                self.consumer.pause(&list)
            } else {
                self.consumer.resume(&list)
            };
            if let Err(e) = done {
                self.warn(&format!("pausing or resuming partition {p}: {e}"));
            }
        }
    }

    /// The topic's partitions, retried with back-off until the brokers
    /// answer (empty batches go out meanwhile); `None` when asked to stop.
    fn partitions(&self, emit: &mut dyn FnMut(RecordBatch) -> bool) -> Option<Vec<i32>> {
        let topic = &self.source.endpoint.topic;
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.consumer.fetch_metadata(Some(topic), CALL_TIMEOUT) {
                Ok(metadata) => {
                    let found = metadata.topics().iter().find(|t| t.name() == topic);
                    let wanted = |p: &i32| self.source.only.as_ref().is_none_or(|o| o.contains(p));
                    match found.map(|t| (t.error(), t.partitions())) {
                        Some((None, partitions)) if partitions.iter().any(|p| wanted(&p.id())) => {
                            return Some(
                                partitions.iter().map(|p| p.id()).filter(wanted).collect(),
                            );
                        }
                        Some((Some(e), _)) => self.warn(&format!(
                            "topic {topic}: {}; retrying",
                            rdkafka::error::RDKafkaErrorCode::from(e)
                        )),
                        _ => self.warn(&format!("topic {topic} has no partitions; retrying")),
                    }
                }
                Err(e) => self.warn(&format!(
                    "cannot read the partitions of {topic}: {e}; retrying"
                )),
            }
            let until = Instant::now() + backoff;
            while Instant::now() < until {
                if self.stats.stop.load(Ordering::Relaxed) || !self.idle(emit) {
                    return None;
                }
                std::thread::sleep(POLL.min(until.saturating_duration_since(Instant::now())));
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    fn warn(&self, message: &str) {
        self.consumer.context().warn(message);
    }

    /// Emits an empty batch, as a waiting source does.
    fn idle(&self, emit: &mut dyn FnMut(RecordBatch) -> bool) -> bool {
        self.store_position();
        emit(RecordBatch::new_empty(self.config.schema.clone()))
    }

    fn assign(&self, partitions: &[i32]) -> Result<()> {
        let topic = &self.source.endpoint.topic;
        let mut list = TopicPartitionList::new();
        for &p in partitions {
            let offset = match (self.progress.offsets.get(&p), self.source.start) {
                (Some(&next), _) => Offset::Offset(next),
                (None, Start::Committed) => Offset::Stored,
                (None, Start::Earliest) => Offset::Beginning,
                (None, Start::Latest) => Offset::End,
            };
            list.add_partition_offset(topic, p, offset)
                .map_err(|e| kafka_error(topic, e))?;
        }
        self.consumer
            .assign(&list)
            .map_err(|e| kafka_error(&format!("assigning the partitions of {topic}"), e))
    }

    fn high_watermarks(&self, partitions: &[i32]) -> Result<BTreeMap<i32, i64>> {
        let topic = &self.source.endpoint.topic;
        partitions
            .iter()
            .map(|&p| {
                let (low, high) = self
                    .consumer
                    .fetch_watermarks(topic, p, CALL_TIMEOUT)
                    .map_err(|e| kafka_error(&format!("the end of {topic} partition {p}"), e))?;
                Ok((p, low, high))
            })
            // An empty partition has nothing to wait for.
            .filter(|r| !matches!(r, Ok((_, low, high)) if low >= high))
            .map(|r| r.map(|(p, _, high)| (p, high)))
            .collect()
    }

    fn position(&self) -> SourcePosition {
        // A partition with rows still waiting is read again from its
        // first.
        let mut offsets = self.progress.offsets.clone();
        offsets.extend(self.alignment.first_waiting());
        let offsets: serde_json::Map<String, Value> = offsets
            .iter()
            .map(|(p, o)| (p.to_string(), json!(o)))
            .collect();
        let mut extra = json!({ "offsets": offsets });
        if let Some(idle) = self.idle_at() {
            extra["idle"] = idle;
        }
        SourcePosition {
            rows: self.progress.rows,
            bad_rows: self.progress.bad_rows,
            extra,
            ..SourcePosition::default()
        }
    }

    /// When every partition is read to its end and nothing waits: per
    /// partition, the offset it ended at. A group's exchange tells the
    /// processes after it that this part is idle up to there (see
    /// [`super::exchange`]).
    fn idle_at(&self) -> Option<Value> {
        if !self.alignment.all_idle() {
            return None;
        }
        let ends: Option<serde_json::Map<String, Value>> = self
            .alignment
            .partitions()
            .map(|p| Some((p.to_string(), json!(self.ended.get(&p)?))))
            .collect();
        ends.map(Value::Object)
    }

    /// The offset partition `p` ended at, just reached: where the consumer
    /// stands, or (before it fetched anything) the partition's end.
    fn end_offset(&self, p: i32) -> Option<i64> {
        let topic = &self.source.endpoint.topic;
        let fetched = self.consumer.position().ok()?;
        match fetched.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => self
                .consumer
                .fetch_watermarks(topic, p, CALL_TIMEOUT)
                .ok()
                .map(|(_, high)| high),
        }
    }

    fn store_position(&self) {
        *self
            .stats
            .position
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(self.position());
    }

    /// Commits the offsets read to the group, for `kafka-consumer-groups`
    /// and lag dashboards; restores never read them back while a
    /// checkpoint exists.
    fn commit_for_monitoring(&mut self, now: bool) {
        if self.progress.offsets.is_empty() || (!now && self.last_commit.elapsed() < COMMIT_EVERY) {
            return;
        }
        self.last_commit = Instant::now();
        let topic = &self.source.endpoint.topic;
        let mut list = TopicPartitionList::new();
        for (&p, &next) in &self.progress.offsets {
            if list
                .add_partition_offset(topic, p, Offset::Offset(next))
                .is_err()
            {
                return;
            }
        }
        let mode = if now {
            CommitMode::Sync
        } else {
            CommitMode::Async
        };
        if let Err(e) = self.consumer.commit(&list, mode) {
            self.warn(&format!("committing offsets for monitoring: {e}"));
        }
    }

    /// With `stop_at = 'latest'`: whether every partition reached its end.
    fn at_end(&self) -> bool {
        let Some(end) = &self.end else {
            return false;
        };
        let Ok(position) = self.consumer.position() else {
            return false;
        };
        end.iter().all(|(&p, &high)| {
            let read = self.progress.offsets.get(&p).copied();
            let fetched = position
                .find_partition(&self.source.endpoint.topic, p)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                });
            // A partition that started at its end has no offset read:
            // reaching the end says it.
            read.max(fetched).is_some_and(|o| o >= high) || self.ended.contains_key(&p)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use datafusion::arrow::datatypes::{Field, Schema, TimeUnit};

    use super::*;

    fn line(payload: &str, meta: &[(&str, Value)]) -> std::result::Result<String, String> {
        let meta: Vec<(String, Value)> = meta
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let mut text = Vec::new();
        json_line(payload.as_bytes(), &meta, &mut text)?;
        Ok(String::from_utf8(text).unwrap())
    }

    #[test]
    fn metadata_fields_end_the_object_and_newlines_become_spaces() {
        let meta = [("_partition", json!(2)), ("_key", json!("h1"))];
        assert_eq!(
            line("{\"cpu\": 1,\n \"host\": \"a\"}\n", &meta).unwrap(),
            "{\"cpu\": 1,  \"host\": \"a\",\"_partition\":2,\"_key\":\"h1\"}\n"
        );
        assert_eq!(
            line("{ }", &meta).unwrap(),
            "{ \"_partition\":2,\"_key\":\"h1\"}\n"
        );
        // Not an object: passed on as it is, for the decoder to reject.
        assert_eq!(line("[1, 2]", &meta).unwrap(), "[1, 2]\n");
        assert!(line("  ", &meta).is_err());
    }

    #[test]
    fn a_csv_message_is_one_record_with_the_metadata_after_it() {
        let meta = vec![
            ("_key".to_string(), json!("a,b")),
            ("_offset".to_string(), json!(7)),
            ("_headers".to_string(), Value::Null),
        ];
        let mut text = Vec::new();
        csv_line(b"1,h1,2.5\r\n", &meta, &mut text).unwrap();
        assert_eq!(String::from_utf8(text).unwrap(), "1,h1,2.5,\"a,b\",7,\n");
        let err = csv_line(b"1,\"h\n1\",2.5", &meta, &mut Vec::new()).unwrap_err();
        assert!(err.contains("one record on one line"), "{err}");
    }

    fn configure(columns: &[(&str, DataType)], options: &[(&str, &str)]) -> Result<SourceConfig> {
        let schema = Arc::new(Schema::new(
            columns
                .iter()
                .map(|(n, t)| Field::new(*n, t.clone(), true))
                .collect::<Vec<_>>(),
        ));
        let event_time = columns.iter().position(|(n, _)| *n == "ts");
        let mut opts = vec![
            ("connector".to_string(), "kafka".to_string()),
            ("bootstrap".to_string(), "localhost:9092".to_string()),
            ("topic".to_string(), "t".to_string()),
        ];
        opts.extend(options.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        SourceConfig::from_options("s", schema, event_time, &opts, Path::new("."))
    }

    fn ts() -> DataType {
        DataType::Timestamp(TimeUnit::Millisecond, None)
    }

    #[test]
    fn declared_columns_are_checked_against_what_messages_give() {
        let err = |r: Result<SourceConfig>| r.unwrap_err().to_string();
        let e = err(configure(&[("ts", ts()), ("_offset", DataType::Utf8)], &[]));
        assert!(e.contains("_offset") && e.contains("BIGINT"), "{e}");
        let e = err(configure(
            &[("line", DataType::Utf8), ("n", DataType::Int64)],
            &[("format", "raw")],
        ));
        assert!(
            e.contains("exactly one TEXT column") && e.contains("line, n"),
            "{e}"
        );
        let e = err(configure(&[("v", DataType::Utf8)], &[("ts_from", "kafka")]));
        assert!(
            e.contains("ts_from = 'kafka' needs an event-time column"),
            "{e}"
        );
        let e = err(configure(&[("v", DataType::Utf8)], &[("topic", "")]));
        assert!(e.contains("'topic'"), "{e}");
        let e = err(configure(&[("v", DataType::Utf8)], &[("start", "middle")]));
        assert!(e.contains("committed, earliest, latest"), "{e}");

        let c = configure(
            &[
                ("ts", ts()),
                ("line", DataType::Utf8),
                ("_key", DataType::Utf8),
            ],
            &[
                ("format", "raw"),
                ("ts_from", "kafka"),
                ("properties.client.id", "x"),
            ],
        )
        .unwrap();
        let reader = c.location.reader().unwrap() as &dyn std::any::Any;
        let kafka = reader.downcast_ref::<KafkaSource>().unwrap();
        assert_eq!(kafka.columns.payload, vec!["line"]);
        assert_eq!(kafka.columns.meta, vec!["_key"]);
        assert_eq!(kafka.columns.time_from_message.as_deref(), Some("ts"));
        assert_eq!(kafka.group, "vigil-s");
        assert_eq!(
            kafka.endpoint.properties,
            vec![("client.id".to_string(), "x".to_string())]
        );
    }
}
