//! `CREATE SINK ... WITH (connector = 'kafka', ...)`: one message per
//! result row, its value the row as JSON or CSV, its key a column's text.
//!
//! # Delivery
//!
//! - `at_least_once`: rows are produced as they come; a checkpoint waits
//!   until the brokers have every row before it. After a restore, the
//!   rows since the checkpoint are produced again.
//! - `exactly_once` (the default; needs checkpoints): the rows of an epoch
//!   (between two checkpoint barriers) are held back. At the barrier they
//!   go into the checkpoint itself, so the checkpoint holds what it owes
//!   the topic; once the checkpoint is written ([`Sink::committed`]) they
//!   are produced in one Kafka transaction, which also commits the epoch's
//!   number as the offset of a marker group (`<transactional_id>.epochs`)
//!   in the same atomic step. A restore reads the marker: if the
//!   restored checkpoint's epoch is not in it, the process died between
//!   writing the checkpoint and committing the transaction, and the
//!   epoch's rows are produced again from the checkpoint, in a transaction
//!   that moves the marker. A reader with `isolation.level =
//!   read_committed` sees every result once; results reach it one
//!   checkpoint interval late. `init_transactions` at the start fences an
//!   older process with the same `transactional_id` and aborts what it had
//!   open.
//!
//! When the input ends, the rows after the last barrier are produced in a
//! last transaction with the next epoch's marker. When the query is
//! stopped before (a signal, its partition moving to another process in a
//! group), they are dropped: whoever restores the last checkpoint makes
//! them again.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use serde_json::{Value, json};

use super::super::file::APPEND_ONLY;
use super::super::options::Options;
use super::super::registry::{Opener, OptionSpec, OptionType, SinkConnector, SinkOpen};
use super::super::sink::render_rows;
use super::super::{OutputFormat, Sink, SinkCommit, SinkConfig, SinkTarget};
use super::{BOOTSTRAP, CALL_TIMEOUT, Endpoint, PROPERTIES, Reporter, TOPIC, kafka_error};
use crate::error::{Error, Result};

/// How many times a transaction or a flush is tried before the query
/// fails (each failure is reported; the waits double up to 5 s).
const ATTEMPTS: u32 = 8;

const OPTIONS: &[OptionSpec] = &[
    BOOTSTRAP,
    TOPIC,
    OptionSpec {
        name: "format",
        ty: OptionType::Choice(&["json", "jsonl", "csv"]),
        default: Some("json"),
        accepted: "json, csv",
        doc: "a message's value: the row as a JSON object, or as a CSV record",
    },
    OptionSpec {
        name: "key",
        ty: OptionType::Text,
        default: None,
        accepted: "a result column",
        doc: "the column whose text is each message's key (none: no key)",
    },
    OptionSpec {
        name: "delivery",
        ty: OptionType::Choice(&["exactly_once", "at_least_once"]),
        default: Some("exactly_once"),
        accepted: "exactly_once, at_least_once",
        doc: "exactly once through transactions tied to checkpoints (needs them), or at least once",
    },
    OptionSpec {
        name: "transactional_id",
        ty: OptionType::Text,
        default: Some("vigil-<sink>-<topic>"),
        accepted: "a Kafka transactional id, one per writing process",
        doc: "the transactional id of `exactly_once`",
    },
    PROPERTIES,
    APPEND_ONLY,
];

/// `connector = 'kafka'` in `CREATE SINK`.
pub struct KafkaSinkConnector;

impl SinkConnector for KafkaSinkConnector {
    fn name(&self) -> &'static str {
        "kafka"
    }
    fn summary(&self) -> &'static str {
        "one Kafka message per result row (JSON or CSV value, key from a column), exactly once through transactions"
    }
    fn options(&self) -> &'static [OptionSpec] {
        OPTIONS
    }
    fn configure(
        &self,
        name: &str,
        opts: &Options<'_>,
        _base_dir: &std::path::Path,
    ) -> Result<SinkConfig> {
        let endpoint = Endpoint::from_options(opts)?;
        let format = match opts.choice("format")? {
            Some("csv") => OutputFormat::Csv,
            _ => OutputFormat::Jsonl,
        };
        let exactly_once = opts.choice("delivery")? != Some("at_least_once");
        let transactional_id = opts.text("transactional_id").map_or_else(
            || default_transactional_id(name, &endpoint.topic),
            str::to_string,
        );
        let sink = KafkaSink {
            endpoint,
            format,
            key: opts.text("key").map(str::to_string),
            transactional_id: exactly_once.then_some(transactional_id),
        };
        Ok(SinkConfig {
            name: name.to_string(),
            target: SinkTarget::Connector(Opener(Arc::new(sink))),
            format,
            append_only: opts.flag("append_only")?,
        })
    }
}

/// The transactional id of sink `name` writing `topic` when its options
/// give none.
pub fn default_transactional_id(name: &str, topic: &str) -> String {
    format!("vigil-{name}-{topic}")
}

/// A configured `kafka` sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSink {
    /// Brokers, topic, librdkafka settings.
    pub endpoint: Endpoint,
    /// How a row becomes a message value.
    pub format: OutputFormat,
    /// The column whose text is the message key.
    pub key: Option<String>,
    /// `Some` for exactly-once delivery: the producer's transactional id.
    pub transactional_id: Option<String>,
}

impl SinkOpen for KafkaSink {
    fn describe(&self) -> String {
        format!(
            "kafka topic {} at {}{}",
            self.endpoint.topic,
            self.endpoint.bootstrap,
            if self.transactional_id.is_some() {
                ", exactly once"
            } else {
                ", at least once"
            }
        )
    }

    fn open(&self, name: &str, schema: &SchemaRef) -> Result<Box<dyn Sink>> {
        let key = match &self.key {
            None => None,
            Some(column) => Some(schema.index_of(column).map_err(|_| {
                Error::Plan(format!(
                    "sink {name}: key column {column} is not a result column (the results have {})",
                    schema
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?),
        };
        let reporter = || Reporter::new(format!("sink {name}"));
        let mut defaults = vec![("enable.idempotence", "true")];
        if let Some(id) = &self.transactional_id {
            defaults.push(("transactional.id", id.as_str()));
        }
        let producer: BaseProducer<Reporter> = self
            .endpoint
            .client_config(&defaults)
            .create_with_context(reporter())
            .map_err(|e| kafka_error(&format!("sink {name}"), e))?;
        let marker = match &self.transactional_id {
            None => None,
            Some(id) => Some(Marker::open(&self.endpoint, id, reporter())?),
        };
        let mut sink = TopicSink {
            name: name.to_string(),
            topic: self.endpoint.topic.clone(),
            format: self.format,
            key,
            producer,
            marker,
            pending: Vec::new(),
            staged: None,
            epoch: 0,
        };
        if sink.marker.is_some() {
            sink.retry("starting its transactions", |s| {
                s.producer.init_transactions(CALL_TIMEOUT)
            })?;
        }
        Ok(Box::new(sink))
    }
}

/// One message: its key and its value.
type Message = (Option<String>, Vec<u8>);

/// The marker group of an exactly-once sink: the last epoch whose
/// transaction committed is the group's offset for partition 0 of the
/// topic, committed inside that transaction.
struct Marker {
    consumer: BaseConsumer<Reporter>,
    topic: String,
}

impl Marker {
    fn open(endpoint: &Endpoint, transactional_id: &str, reporter: Reporter) -> Result<Self> {
        let group = format!("{transactional_id}.epochs");
        let consumer = endpoint
            .client_config(&[("group.id", &group), ("enable.auto.commit", "false")])
            .create_with_context(reporter)
            .map_err(|e| kafka_error(&format!("marker group {group}"), e))?;
        Ok(Marker {
            consumer,
            topic: endpoint.topic.clone(),
        })
    }

    fn list(&self, epoch: Option<u64>) -> TopicPartitionList {
        let mut list = TopicPartitionList::new();
        let offset = epoch.map_or(Offset::Invalid, |e| Offset::Offset(e as i64));
        // Partition 0 always exists; the offset is only a number here.
        let _ = list.add_partition_offset(&self.topic, 0, offset);
        list
    }

    /// The last epoch committed, if any.
    fn committed(&self) -> std::result::Result<Option<u64>, KafkaError> {
        let list = self
            .consumer
            .committed_offsets(self.list(None), CALL_TIMEOUT)?;
        Ok(list
            .find_partition(&self.topic, 0)
            .and_then(|e| match e.offset() {
                Offset::Offset(o) if o >= 0 => Some(o as u64),
                _ => None,
            }))
    }
}

/// An open `kafka` sink.
struct TopicSink {
    name: String,
    topic: String,
    format: OutputFormat,
    /// Index of the key column.
    key: Option<usize>,
    producer: BaseProducer<Reporter>,
    /// `Some` for exactly-once delivery.
    marker: Option<Marker>,
    /// Exactly once: the rows since the last barrier.
    pending: Vec<Message>,
    /// Exactly once: the rows of epoch `epoch`, in a checkpoint being
    /// written, to produce once it is.
    staged: Option<Vec<Message>>,
    /// Exactly once: the number of the last epoch closed by a barrier.
    epoch: u64,
}

impl TopicSink {
    fn messages(&self, batch: &RecordBatch) -> Result<Vec<Message>> {
        let values = render_rows(self.format, batch)?;
        let keys: Vec<Option<String>> = match self.key {
            None => vec![None; values.len()],
            Some(i) => {
                let text = cast(batch.column(i), &DataType::Utf8)?;
                let text = text.as_string::<i32>();
                (0..text.len())
                    .map(|r| text.is_valid(r).then(|| text.value(r).to_string()))
                    .collect()
            }
        };
        Ok(keys.into_iter().zip(values).collect())
    }

    /// Hands `messages` to the producer, waiting while its queue is full.
    fn send(&self, messages: &[Message]) -> std::result::Result<(), KafkaError> {
        for (key, value) in messages {
            loop {
                let mut record = BaseRecord::to(&self.topic).payload(value);
                if let Some(key) = key {
                    record = record.key(key);
                }
                match self.producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                        self.producer.poll(Duration::from_millis(50));
                    }
                    Err((e, _)) => return Err(e),
                }
            }
            self.producer.poll(Duration::ZERO);
        }
        Ok(())
    }

    /// Produces `messages` in one transaction that also moves the marker
    /// to `epoch`.
    fn transaction(&self, messages: &[Message], epoch: u64) -> std::result::Result<(), KafkaError> {
        let marker = self
            .marker
            .as_ref()
            .expect("exactly-once sinks have a marker");
        self.producer.begin_transaction()?;
        let sent = self.send(messages).and_then(|()| {
            let group = marker
                .consumer
                .group_metadata()
                .ok_or(KafkaError::Global(RDKafkaErrorCode::InvalidGroupId))?;
            self.producer.send_offsets_to_transaction(
                &marker.list(Some(epoch)),
                &group,
                CALL_TIMEOUT,
            )?;
            self.producer.commit_transaction(CALL_TIMEOUT)
        });
        if sent.is_err() {
            let _ = self.producer.abort_transaction(CALL_TIMEOUT);
        }
        sent
    }

    /// Produces an epoch's rows exactly once, unless the marker says they
    /// already were.
    fn publish(&mut self, messages: &[Message], epoch: u64) -> Result<()> {
        self.retry(&format!("committing epoch {epoch}"), |s| {
            let done = s
                .marker
                .as_ref()
                .map(Marker::committed)
                .transpose()?
                .flatten();
            if done.is_some_and(|d| d >= epoch) {
                return Ok(());
            }
            s.transaction(messages, epoch)
        })
    }

    /// Runs `step` until it succeeds, reporting each failure, waiting
    /// longer between tries; fails the query after [`ATTEMPTS`] or on an
    /// error Kafka calls fatal.
    fn retry(
        &mut self,
        what: &str,
        mut step: impl FnMut(&mut Self) -> std::result::Result<(), KafkaError>,
    ) -> Result<()> {
        let mut wait = Duration::from_millis(200);
        for attempt in 1..=ATTEMPTS {
            let e = match step(self) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            let fatal = matches!(&e, KafkaError::Transaction(t) if t.is_fatal());
            if fatal || attempt == ATTEMPTS {
                return Err(kafka_error(&format!("sink {}: {what}", self.name), e));
            }
            self.producer
                .context()
                .warn(&format!("{what}: {e}; trying again"));
            std::thread::sleep(wait);
            wait = (wait * 2).min(Duration::from_secs(5));
        }
        unreachable!("the last attempt returns")
    }

    fn flush(&mut self) -> Result<()> {
        self.retry("waiting for the brokers to take the results", |s| {
            s.producer.flush(CALL_TIMEOUT)
        })
    }
}

impl Sink for TopicSink {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let messages = self.messages(batch)?;
        if self.marker.is_some() {
            self.pending.extend(messages);
            return Ok(());
        }
        let name = self.name.clone();
        self.send(&messages)
            .map_err(|e| kafka_error(&format!("sink {name}"), e))
    }

    fn finish(&mut self) -> Result<()> {
        if self.marker.is_some() {
            let pending = std::mem::take(&mut self.pending);
            if !pending.is_empty() {
                self.publish(&pending, self.epoch + 1)?;
            }
            return Ok(());
        }
        self.flush()
    }

    fn stopped(&mut self) -> Result<()> {
        if self.marker.is_some() {
            // Not covered by a checkpoint: the restore makes them again.
            self.pending.clear();
            return Ok(());
        }
        self.flush()
    }

    fn checkpoint(&mut self) -> Result<Option<SinkCommit>> {
        if self.marker.is_none() {
            self.flush()?;
            return Ok(None);
        }
        self.epoch += 1;
        let rows = std::mem::take(&mut self.pending);
        let commit = json!({
            "epoch": self.epoch,
            "rows": rows.iter().map(|(k, v)| json!([k, String::from_utf8_lossy(v)])).collect::<Vec<_>>(),
        });
        self.staged = Some(rows);
        Ok(Some(commit))
    }

    fn committed(&mut self) -> Result<()> {
        if let Some(rows) = self.staged.take() {
            self.publish(&rows, self.epoch)?;
        }
        Ok(())
    }

    fn restore(&mut self, commit: &SinkCommit) -> Result<()> {
        if self.marker.is_none() {
            return Ok(());
        }
        let (epoch, rows) = epoch_of(&self.name, commit)?;
        self.epoch = epoch;
        self.publish(&rows, epoch)
    }

    fn needs_checkpoints(&self) -> Option<String> {
        self.marker.as_ref().map(|_| {
            format!(
                "sink {}: delivery = 'exactly_once' produces results when a checkpoint covers them: \
                 run with checkpoints (--checkpoint-dir), or set delivery = 'at_least_once'",
                self.name
            )
        })
    }
}

/// The epoch and rows an exactly-once sink's commit holds.
fn epoch_of(name: &str, commit: &SinkCommit) -> Result<(u64, Vec<Message>)> {
    let bad = || {
        Error::Connector(format!(
            "sink {name}: the checkpoint's kafka commit is damaged"
        ))
    };
    let epoch = commit
        .get("epoch")
        .and_then(Value::as_u64)
        .ok_or_else(bad)?;
    let rows = commit
        .get("rows")
        .and_then(Value::as_array)
        .ok_or_else(bad)?
        .iter()
        .map(|row| {
            let key = row.get(0).ok_or_else(bad)?.as_str().map(str::to_string);
            let value = row.get(1).and_then(Value::as_str).ok_or_else(bad)?;
            Ok((key, value.as_bytes().to_vec()))
        })
        .collect::<Result<_>>()?;
    Ok((epoch, rows))
}
