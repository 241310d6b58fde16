//! What every vigil producer of a topic shares: at-least-once sending, or
//! exactly-once epochs published in Kafka transactions tied to
//! checkpoints (see the [`sink`](super::sink) module for the protocol).
//! The `kafka` sink and the exchanges between a group's processes (see
//! [`exchange`](super::exchange)) differ only in the records they make.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, DeliveryResult, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use serde_json::{Value, json};

use super::super::SinkCommit;
use super::{CALL_TIMEOUT, Endpoint, Reporter, kafka_error};
use crate::error::{Error, Result};

/// How many times a transaction or a flush is tried before the query
/// fails (each failure is reported; the waits double up to 5 s). At least
/// once, a flush's try sends again the records whose delivery failed.
const ATTEMPTS: u32 = 8;

/// One message to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    /// The message key.
    pub key: Option<String>,
    /// The message value.
    pub value: Vec<u8>,
    /// The partition, or `None` for the one librdkafka's partitioner picks.
    pub partition: Option<i32>,
    /// Message headers, as text.
    pub headers: Vec<(String, String)>,
}

impl Record {
    /// A record with a key and a value, partitioned by librdkafka.
    pub fn keyed(key: Option<String>, value: Vec<u8>) -> Self {
        Record {
            key,
            value,
            partition: None,
            headers: Vec::new(),
        }
    }

    /// The record `message` was made from: a message whose delivery
    /// failed, to send again (to the partition it was given, if any).
    fn of_message(message: &BorrowedMessage<'_>) -> Self {
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        let headers = message.headers().map_or_else(Vec::new, |headers| {
            headers
                .iter()
                .map(|h| (h.key.to_string(), h.value.map(text).unwrap_or_default()))
                .collect()
        });
        Record {
            key: message.key().map(text),
            value: message.payload().unwrap_or_default().to_vec(),
            partition: (message.partition() >= 0).then(|| message.partition()),
            headers,
        }
    }

    fn to_json(&self) -> Value {
        let mut object = json!({ "key": self.key });
        match std::str::from_utf8(&self.value) {
            Ok(text) => object["text"] = json!(text),
            Err(_) => {
                object["bytes"] =
                    json!(base64::engine::general_purpose::STANDARD.encode(&self.value))
            }
        }
        if let Some(p) = self.partition {
            object["partition"] = json!(p);
        }
        if !self.headers.is_empty() {
            object["headers"] = json!(self.headers);
        }
        object
    }

    fn from_json(value: &Value) -> Option<Self> {
        let key = match value.get("key")? {
            Value::Null => None,
            Value::String(text) => Some(text.clone()),
            _ => return None,
        };
        let bytes = match (value.get("text"), value.get("bytes")) {
            (Some(Value::String(text)), _) => text.as_bytes().to_vec(),
            (_, Some(Value::String(coded))) => base64::engine::general_purpose::STANDARD
                .decode(coded)
                .ok()?,
            _ => return None,
        };
        let partition = match value.get("partition") {
            None => None,
            Some(p) => Some(i32::try_from(p.as_i64()?).ok()?),
        };
        let headers = match value.get("headers") {
            None => Vec::new(),
            Some(h) => serde_json::from_value(h.clone()).ok()?,
        };
        Some(Record {
            key,
            value: bytes,
            partition,
            headers,
        })
    }
}

/// The context of a producer: reports as [`Reporter`] does, and, at least
/// once, keeps the records whose delivery failed (librdkafka gave up on
/// them: a refusal it does not retry, `message.timeout.ms` passed) until
/// they are sent again. Exactly once, a failed delivery fails the
/// transaction's commit, and the whole transaction is tried again.
struct Delivery {
    reporter: Reporter,
    /// Whether failed records are kept (at least once).
    keeps_failed: bool,
    failed: Mutex<Failed>,
}

/// The records whose delivery failed, and the last failure.
#[derive(Default)]
struct Failed {
    records: Vec<Record>,
    error: Option<KafkaError>,
}

impl Delivery {
    fn failed(&self) -> std::sync::MutexGuard<'_, Failed> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the records whose delivery failed.
    fn take_failed(&self) -> Vec<Record> {
        std::mem::take(&mut self.failed().records)
    }

    /// Keeps `records` to send again.
    fn keep_failed(&self, records: Vec<Record>) {
        let mut failed = self.failed();
        let kept = std::mem::replace(&mut failed.records, records);
        failed.records.extend(kept);
    }

    /// An error if some records wait to be sent again: why the last of
    /// them failed.
    fn undelivered(&self) -> std::result::Result<(), KafkaError> {
        let failed = self.failed();
        if failed.records.is_empty() {
            return Ok(());
        }
        Err(failed
            .error
            .clone()
            .unwrap_or(KafkaError::MessageProduction(RDKafkaErrorCode::Fail)))
    }

    fn warn(&self, message: &str) {
        self.reporter.warn(message);
    }
}

impl ClientContext for Delivery {
    fn error(&self, error: KafkaError, reason: &str) {
        self.reporter.error(error, reason);
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.reporter.log(level, fac, log_message);
    }
}

impl ProducerContext for Delivery {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {
        let Err((e, message)) = result else {
            return;
        };
        if !self.keeps_failed {
            self.warn(&format!("a result was not delivered: {e}"));
            return;
        }
        self.warn(&format!(
            "a result was not delivered: {e}; it is sent again"
        ));
        let mut failed = self.failed();
        failed.records.push(Record::of_message(message));
        failed.error = Some(e.clone());
    }
}

/// The marker group of an exactly-once producer: the last epoch whose
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

    /// Commits `epoch` as the marker again, outside the transaction that
    /// already committed it. Some brokers answer a transaction's offsets
    /// without keeping them (librdkafka's mock cluster does): there the
    /// restore would find no epoch and publish its checkpoint's again. A
    /// fenced producer cannot commit its transaction, so it never gets
    /// here; only a process stalled between the two commits could move
    /// the marker back, and a restore would then repeat one epoch. A
    /// failure is only a warning: the transaction holds the marker.
    fn remember(&self, epoch: u64, reporter: &Reporter) {
        if let Err(e) = self
            .consumer
            .commit(&self.list(Some(epoch)), CommitMode::Sync)
        {
            reporter.warn(&format!(
                "recording epoch {epoch} outside its transaction: {e}"
            ));
        }
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

/// A producer of one topic, at least once or exactly once.
pub(super) struct Producing {
    /// `sink out`, for messages.
    what: String,
    topic: String,
    producer: BaseProducer<Delivery>,
    /// The errors its clients reported (failed deliveries, transactions,
    /// unreachable brokers), each retried.
    errors: Arc<AtomicU64>,
    /// `Some` for exactly-once delivery.
    marker: Option<Marker>,
    /// Exactly once: the records since the last barrier.
    pending: Vec<Record>,
    /// Exactly once: the records of epoch `epoch`, in a checkpoint being
    /// written, to produce once it is.
    staged: Option<Vec<Record>>,
    /// Exactly once: the number of the last epoch closed by a barrier.
    epoch: u64,
}

impl Producing {
    /// A producer of `endpoint`'s topic for `what` (`sink out`): exactly
    /// once with `transactional_id`, at least once without.
    pub fn open(endpoint: &Endpoint, what: &str, transactional_id: Option<&str>) -> Result<Self> {
        let errors = Arc::new(AtomicU64::new(0));
        let reporter = || Reporter::counting(what.to_string(), errors.clone());
        let mut defaults = vec![("enable.idempotence", "true")];
        if let Some(id) = transactional_id {
            defaults.push(("transactional.id", id));
        }
        let delivery = Delivery {
            reporter: reporter(),
            keeps_failed: transactional_id.is_none(),
            failed: Mutex::new(Failed::default()),
        };
        let producer: BaseProducer<Delivery> = endpoint
            .client_config(&defaults)
            .create_with_context(delivery)
            .map_err(|e| kafka_error(what, e))?;
        let marker = match transactional_id {
            None => None,
            Some(id) => Some(Marker::open(endpoint, id, reporter())?),
        };
        let mut producing = Producing {
            what: what.to_string(),
            topic: endpoint.topic.clone(),
            producer,
            errors,
            marker,
            pending: Vec::new(),
            staged: None,
            epoch: 0,
        };
        if producing.marker.is_some() {
            producing.retry("starting its transactions", |s| {
                s.producer.init_transactions(CALL_TIMEOUT)
            })?;
        }
        Ok(producing)
    }

    /// Whether it delivers exactly once.
    pub fn exactly_once(&self) -> bool {
        self.marker.is_some()
    }

    /// The count of the errors its clients reported, live.
    pub fn errors(&self) -> Arc<AtomicU64> {
        self.errors.clone()
    }

    /// Produces `records` now (at least once), or with the epoch's
    /// transaction (exactly once). At least once, once a delivery has
    /// failed, waits until the brokers have every record (see
    /// [`Producing::flush`]): the results wait rather than pile up.
    pub fn write(&mut self, records: Vec<Record>) -> Result<()> {
        if self.marker.is_some() {
            self.pending.extend(records);
            return Ok(());
        }
        let what = self.what.clone();
        self.send(&records).map_err(|e| kafka_error(&what, e))?;
        if self.producer.context().undelivered().is_err() {
            self.flush()?;
        }
        Ok(())
    }

    /// At least once: sends again the records whose delivery failed; those
    /// it could not hand to the producer are kept for the next try.
    fn resend(&self) -> std::result::Result<(), KafkaError> {
        let failed = self.producer.context().take_failed();
        for (i, record) in failed.iter().enumerate() {
            if let Err(e) = self.send(std::slice::from_ref(record)) {
                self.producer.context().keep_failed(failed[i..].to_vec());
                return Err(e);
            }
        }
        Ok(())
    }

    /// Hands `records` to the producer, waiting while its queue is full.
    fn send(&self, records: &[Record]) -> std::result::Result<(), KafkaError> {
        for record in records {
            let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
            for (key, value) in &record.headers {
                headers = headers.insert(Header {
                    key,
                    value: Some(value.as_bytes()),
                });
            }
            loop {
                let mut message = BaseRecord::to(&self.topic)
                    .payload(&record.value)
                    .headers(headers.clone());
                if let Some(key) = &record.key {
                    message = message.key(key);
                }
                if let Some(p) = record.partition {
                    message = message.partition(p);
                }
                match self.producer.send(message) {
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

    /// Produces `records` in one transaction that also moves the marker to
    /// `epoch`.
    fn transaction(&self, records: &[Record], epoch: u64) -> std::result::Result<(), KafkaError> {
        let marker = self
            .marker
            .as_ref()
            .expect("exactly-once producers have a marker");
        self.producer.begin_transaction()?;
        let sent = self.send(records).and_then(|()| {
            let group = marker
                .consumer
                .group_metadata()
                .ok_or(KafkaError::Global(RDKafkaErrorCode::InvalidGroupId))?;
            self.producer.send_offsets_to_transaction(
                &marker.list(Some(epoch)),
                &group,
                CALL_TIMEOUT,
            )?;
            self.commit()
        });
        if sent.is_err() {
            let _ = self.producer.abort_transaction(CALL_TIMEOUT);
            return sent;
        }
        marker.remember(epoch, &self.producer.context().reporter);
        sent
    }

    /// Commits the open transaction. librdkafka's rule: a retriable
    /// failure is answered by calling commit again (a new transaction
    /// would be refused while this one is in progress); any other leaves
    /// the transaction to be aborted.
    fn commit(&self) -> std::result::Result<(), KafkaError> {
        let mut tries = 1;
        loop {
            match self.producer.commit_transaction(CALL_TIMEOUT) {
                Err(KafkaError::Transaction(e)) if e.is_retriable() && tries < ATTEMPTS => {
                    self.producer
                        .context()
                        .warn(&format!("committing a transaction: {e}; committing again"));
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    /// Produces an epoch's records exactly once, unless the marker says
    /// they already were.
    fn publish(&mut self, records: &[Record], epoch: u64) -> Result<()> {
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
            s.transaction(records, epoch)
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
        let mut first: Option<String> = None;
        for attempt in 1..=ATTEMPTS {
            let e = match step(self) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            let fatal = matches!(&e, KafkaError::Transaction(t) if t.is_fatal());
            if fatal || attempt == ATTEMPTS {
                // A failed transaction often makes every later try fail
                // otherwise: the first failure is the one that explains.
                let first = first.filter(|f| *f != e.to_string());
                let what = match first {
                    Some(f) => format!("{}: {what} (first: {f})", self.what),
                    None => format!("{}: {what}", self.what),
                };
                return Err(kafka_error(&what, e));
            }
            first.get_or_insert_with(|| e.to_string());
            self.producer
                .context()
                .warn(&format!("{what}: {e}; trying again"));
            std::thread::sleep(wait);
            wait = (wait * 2).min(Duration::from_secs(5));
        }
        unreachable!("the last attempt returns")
    }

    /// Waits until the brokers have every record produced. At least once,
    /// a record whose delivery failed is sent again, and waited for, at
    /// each try: the flush is done only once none is left undelivered, and
    /// fails the query when the tries are used up.
    fn flush(&mut self) -> Result<()> {
        let flushed = self.retry("waiting for the brokers to take the results", |s| {
            s.resend()?;
            s.producer.flush(CALL_TIMEOUT)?;
            s.producer.context().undelivered()
        });
        let left = self.producer.context().failed().records.len();
        match flushed {
            Err(e) if left > 0 => Err(Error::Connector(format!(
                "{e}; {left} results were not delivered"
            ))),
            other => other,
        }
    }

    /// The input ended: exactly once, the records after the last barrier
    /// go in a last transaction with the next epoch's marker.
    pub fn finish(&mut self) -> Result<()> {
        if self.marker.is_some() {
            let pending = std::mem::take(&mut self.pending);
            if !pending.is_empty() {
                self.publish(&pending, self.epoch + 1)?;
            }
            return Ok(());
        }
        self.flush()
    }

    /// The query stopped before its end: exactly once, the records no
    /// checkpoint covers are dropped (the restore makes them again).
    pub fn stopped(&mut self) -> Result<()> {
        if self.marker.is_some() {
            self.pending.clear();
            return Ok(());
        }
        self.flush()
    }

    /// At a barrier: at least once, waits until the brokers have every
    /// record; exactly once, closes the epoch and returns its records for
    /// the checkpoint.
    pub fn checkpoint(&mut self) -> Result<Option<SinkCommit>> {
        if self.marker.is_none() {
            self.flush()?;
            return Ok(None);
        }
        self.epoch += 1;
        let records = std::mem::take(&mut self.pending);
        let commit = json!({
            "epoch": self.epoch,
            "rows": records.iter().map(Record::to_json).collect::<Vec<_>>(),
        });
        self.staged = Some(records);
        Ok(Some(commit))
    }

    /// The checkpoint is written: the staged epoch is published.
    pub fn committed(&mut self) -> Result<()> {
        if let Some(records) = self.staged.take() {
            self.publish(&records, self.epoch)?;
        }
        Ok(())
    }

    /// Back to a checkpoint: its epoch is published unless it was.
    pub fn restore(&mut self, commit: &SinkCommit) -> Result<()> {
        if self.marker.is_none() {
            return Ok(());
        }
        let (epoch, records) = epoch_of(&self.what, commit)?;
        self.epoch = epoch;
        self.publish(&records, epoch)
    }
}

/// The epoch and records an exactly-once producer's commit holds. A
/// record is an object, or, as checkpoints of the first `kafka` sink wrote
/// it, a `[key, text]` pair.
fn epoch_of(what: &str, commit: &SinkCommit) -> Result<(u64, Vec<Record>)> {
    let bad = || Error::Connector(format!("{what}: the checkpoint's kafka commit is damaged"));
    let epoch = commit
        .get("epoch")
        .and_then(Value::as_u64)
        .ok_or_else(bad)?;
    let records = commit
        .get("rows")
        .and_then(Value::as_array)
        .ok_or_else(bad)?
        .iter()
        .map(|row| match row {
            Value::Array(pair) => {
                let key = pair.first().ok_or_else(bad)?.as_str().map(str::to_string);
                let value = pair.get(1).and_then(Value::as_str).ok_or_else(bad)?;
                Ok(Record::keyed(key, value.as_bytes().to_vec()))
            }
            other => Record::from_json(other).ok_or_else(bad),
        })
        .collect::<Result<_>>()?;
    Ok((epoch, records))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_the_checkpoint_commit() {
        let records = vec![
            Record::keyed(Some("h1".into()), b"{\"a\":1}".to_vec()),
            Record {
                key: None,
                value: vec![0xff, 0, 7],
                partition: Some(3),
                headers: vec![("vigil-watermark".into(), "42".into())],
            },
        ];
        let commit = json!({
            "epoch": 4,
            "rows": records.iter().map(Record::to_json).collect::<Vec<_>>(),
        });
        assert_eq!(epoch_of("sink s", &commit).unwrap(), (4, records));
    }

    #[test]
    fn the_first_sinks_pairs_still_read() {
        let commit = json!({"epoch": 2, "rows": [["k", "v"], [null, "w"]]});
        let (epoch, records) = epoch_of("sink s", &commit).unwrap();
        assert_eq!(epoch, 2);
        assert_eq!(records[0], Record::keyed(Some("k".into()), b"v".to_vec()));
        assert_eq!(records[1], Record::keyed(None, b"w".to_vec()));
    }

    #[test]
    fn a_damaged_commit_is_an_error() {
        let commit = json!({"epoch": 2, "rows": [{"key": 5}]});
        assert!(epoch_of("sink s", &commit).is_err());
    }
}
