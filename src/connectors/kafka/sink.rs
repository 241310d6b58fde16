//! `CREATE SINK ... WITH (connector = 'kafka', ...)`: one message per
//! result row, its value the row as JSON or CSV, its key a column's text.
//!
//! # Delivery
//!
//! - `at_least_once`: rows are produced as they come; a checkpoint waits
//!   until the brokers have every row before it. A row whose delivery
//!   failed (librdkafka gave up on it) is produced again, with the back-off
//!   of a failed transaction, until the brokers have it; the query fails
//!   if they still refuse it after the last try. After a restore, the rows
//!   since the checkpoint are produced again.
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

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;

use super::super::common::APPEND_ONLY;
use super::super::options::Options;
use super::super::sink::render_rows;
use super::super::{OutputFormat, Sink, SinkCommit, SinkConfig, SinkTarget};
use super::txn::{Producing, Record};
use super::{BOOTSTRAP, Endpoint, PROPERTIES, TOPIC};
use crate::connector::{Opener, OptionSpec, OptionType, SinkConnector, SinkOpen};
use crate::error::{Error, Result};

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
        let producing = Producing::open(
            &self.endpoint,
            &format!("sink {name}"),
            self.transactional_id.as_deref(),
        )?;
        Ok(Box::new(TopicSink {
            name: name.to_string(),
            format: self.format,
            key,
            producing,
        }))
    }
}

/// An open `kafka` sink.
struct TopicSink {
    name: String,
    format: OutputFormat,
    /// Index of the key column.
    key: Option<usize>,
    producing: Producing,
}

impl TopicSink {
    fn records(&self, batch: &RecordBatch) -> Result<Vec<Record>> {
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
        Ok(keys
            .into_iter()
            .zip(values)
            .map(|(k, v)| Record::keyed(k, v))
            .collect())
    }
}

impl Sink for TopicSink {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let records = self.records(batch)?;
        self.producing.write(records)
    }

    fn finish(&mut self) -> Result<()> {
        self.producing.finish()
    }

    fn stopped(&mut self) -> Result<()> {
        self.producing.stopped()
    }

    fn checkpoint(&mut self) -> Result<Option<SinkCommit>> {
        self.producing.checkpoint()
    }

    fn committed(&mut self) -> Result<()> {
        self.producing.committed()
    }

    fn restore(&mut self, commit: &SinkCommit) -> Result<()> {
        self.producing.restore(commit)
    }

    fn client_errors(&self) -> Option<Arc<std::sync::atomic::AtomicU64>> {
        Some(self.producing.errors())
    }

    fn needs_checkpoints(&self) -> Option<String> {
        self.producing.exactly_once().then(|| {
            format!(
                "sink {}: delivery = 'exactly_once' produces results when a checkpoint covers them: \
                 run with checkpoints (--checkpoint-dir), or set delivery = 'at_least_once'",
                self.name
            )
        })
    }
}
