//! The `kafka` connector: a topic as a source, a topic as a sink.
//!
//! Both talk to the brokers through librdkafka (the `rdkafka` crate, built
//! from its bundled C source). What they share lives here: the client
//! configuration (`bootstrap`, `properties.*`) and the client context that
//! turns librdkafka's errors (an unreachable broker, a missing topic) into
//! rate-limited warnings on stderr and a counter (`GET /metrics` shows it
//! per query), instead of failing the query: librdkafka retries with
//! back-off by itself.
//!
//! - [`source`]: reads every partition of a topic, with the offsets in
//!   vigil's checkpoints (see [`KafkaSource`]).
//! - [`sink`]: writes one message per result row, at least once or exactly
//!   once through Kafka transactions tied to checkpoints (see
//!   [`KafkaSink`]).

mod align;
pub mod exchange;
pub mod sink;
pub mod source;
mod txn;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;

use super::options::Options;
use crate::connector::{OptionSpec, OptionType};
use crate::error::{Error, Result};

pub use sink::{KafkaSink, KafkaSinkConnector};
pub use source::{KafkaSource, KafkaSourceConnector};

/// How long one call that waits for the brokers (metadata, a flush, a
/// transaction) may take before it is retried or reported.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The same warning is printed at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// `bootstrap`: every Kafka stream and sink takes it.
pub(super) const BOOTSTRAP: OptionSpec = OptionSpec {
    name: "bootstrap",
    ty: OptionType::Text,
    default: None,
    accepted: "host:port[,host:port...] such as 'localhost:9092'",
    doc: "the brokers to start from (required)",
};

/// `topic`: every Kafka stream and sink takes it.
pub(super) const TOPIC: OptionSpec = OptionSpec {
    name: "topic",
    ty: OptionType::Text,
    default: None,
    accepted: "a topic name",
    doc: "the topic (required)",
};

/// `properties.<name>`: passed to librdkafka as they are.
pub(super) const PROPERTIES: OptionSpec = OptionSpec {
    name: "properties.",
    ty: OptionType::Prefix,
    default: None,
    accepted: "any librdkafka setting, e.g. properties.security.protocol = 'ssl'",
    doc: "a librdkafka setting, passed as it is",
};

/// Where a stream or sink connects: the brokers, the topic and the extra
/// librdkafka settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// The topic.
    pub topic: String,
    /// `properties.*`, in the order given.
    pub properties: Vec<(String, String)>,
}

impl Endpoint {
    /// The endpoint `opts` name: `bootstrap` and `topic` are required.
    pub(super) fn from_options(opts: &Options<'_>) -> Result<Endpoint> {
        let required = |key: &str| {
            let value = opts.text(key).map(str::trim).unwrap_or("");
            if value.is_empty() {
                return Err(Error::Plan(format!(
                    "{}: connector 'kafka' needs a '{key}' option",
                    opts.what()
                )));
            }
            Ok(value.to_string())
        };
        Ok(Endpoint {
            bootstrap: required("bootstrap")?,
            topic: required("topic")?,
            properties: opts
                .prefixed("properties.")
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        })
    }

    /// A librdkafka configuration for it: `bootstrap.servers`, then
    /// `defaults` (vigil's own settings), then `properties.*`, which win.
    pub(crate) fn client_config(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        for (k, v) in defaults {
            config.set(*k, *v);
        }
        for (k, v) in &self.properties {
            config.set(k, v);
        }
        config
    }
}

/// The client context of vigil's Kafka clients: librdkafka reports errors
/// through it while it retries; they are counted and printed once per
/// [`WARN_EVERY`] each, naming the stream or sink.
pub struct Reporter {
    /// `stream metrics` or `sink out`, for the messages.
    what: String,
    /// Errors reported so far; shared with whoever shows them (`GET
    /// /metrics`: a stream's [`SourceStats::client_errors`], a sink's
    /// [`Sink::client_errors`](super::Sink::client_errors)).
    ///
    /// [`SourceStats::client_errors`]: super::SourceStats::client_errors
    pub errors: Arc<AtomicU64>,
    /// When each message was last printed.
    printed: Mutex<HashMap<String, Instant>>,
}

impl Reporter {
    /// A reporter for `what` (`stream metrics`).
    pub fn new(what: impl Into<String>) -> Self {
        Self::counting(what, Arc::new(AtomicU64::new(0)))
    }

    /// A reporter for `what` that counts its errors in `errors`.
    pub fn counting(what: impl Into<String>, errors: Arc<AtomicU64>) -> Self {
        Reporter {
            what: what.into(),
            errors,
            printed: Mutex::new(HashMap::new()),
        }
    }

    /// Counts `message` and prints it unless it was printed lately.
    pub fn warn(&self, message: &str) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut printed = self.printed.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let due = printed
            .get(message)
            .is_none_or(|last| now.duration_since(*last) >= WARN_EVERY);
        if due {
            printed.insert(message.to_string(), now);
            crate::diag::warning!("{}: kafka: {message}", self.what);
        }
    }
}

impl ClientContext for Reporter {
    fn error(&self, error: KafkaError, reason: &str) {
        // The end of a partition is news, not an error: the source hears
        // of it from its poll too.
        if matches!(
            error,
            KafkaError::Global(rdkafka::error::RDKafkaErrorCode::PartitionEOF)
        ) {
            return;
        }
        self.warn(&format!("{error}: {reason}"));
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        if matches!(level, L::Emerg | L::Alert | L::Critical | L::Error) {
            self.warn(&format!("{fac}: {log_message}"));
        }
    }
}

impl ConsumerContext for Reporter {}

fn is_kafka(options: &[(String, String)]) -> bool {
    options
        .iter()
        .any(|(k, v)| k == "connector" && v.trim().eq_ignore_ascii_case("kafka"))
}

/// Makes a stream's `WITH` options the ones of `partition`'s pipeline in a
/// group (`vigil run --group`), if it is a `kafka` stream: it reads only
/// that partition.
pub fn stream_for_partition(options: &mut Vec<(String, String)>, partition: i32) {
    if is_kafka(options) {
        options.retain(|(k, _)| k != "partitions");
        options.push(("partitions".into(), partition.to_string()));
    }
}

/// Makes sink `name`'s `WITH` options the ones of `partition`'s pipeline
/// in a group, if it is a `kafka` sink: its transactional id becomes
/// `<its id>-p<partition>`, so that the process that takes a partition
/// over fences the one that had it (and aborts what it left open).
pub fn sink_for_partition(name: &str, options: &mut Vec<(String, String)>, partition: i32) {
    if !is_kafka(options) {
        return;
    }
    let topic = options
        .iter()
        .find(|(k, _)| k == "topic")
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let id = match options.iter().position(|(k, _)| k == "transactional_id") {
        Some(i) => options.remove(i).1,
        None => sink::default_transactional_id(name, &topic),
    };
    options.push(("transactional_id".into(), format!("{id}-p{partition}")));
}

/// A Kafka client error as vigil's, naming `what` failed.
pub(crate) fn kafka_error(what: &str, e: KafkaError) -> Error {
    Error::Connector(format!("kafka: {what}: {e}"))
}
