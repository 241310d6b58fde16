//! The HTTP delivery kit: result rows POSTed to an endpoint from a delivery
//! thread, with retries, back-off and idempotency keys, and the options that
//! set them (`url`, `retries`, `backoff`, `timeout`, `header_<name>`). The
//! webhook sink is this kit with a JSON payload ([`WebhookSink`]); the
//! Alertmanager and remote-write sinks deliver through it too.
//!
//! # Payload
//!
//! Each non-empty batch a query emits becomes one `POST` to the sink's `url`
//! with `Content-Type: application/json` and, as body, a JSON array with one
//! object per row. Rows are rendered exactly as the JSONL sink renders its
//! lines: every column present under its name, NULL as `null`, timestamps as
//! text such as `"1970-01-01T00:00:10"`:
//!
//! ```json
//! [{"window_start":"1970-01-01T00:00:10","host":"a","max_cpu":97.5},
//!  {"window_start":"1970-01-01T00:00:10","host":"b","max_cpu":null}]
//! ```
//!
//! Every request carries an `Idempotency-Key` header (see below).
//! Options `header_<name> = 'value'` add request headers; an underscore in
//! `<name>` becomes a hyphen, as header names use hyphens and SQL
//! identifiers cannot (`header_x_api_key` sends `x-api-key`).
//!
//! # Delivery
//!
//! [`Sink::write`] only renders the body; a dedicated delivery thread sends
//! it. (The Alertmanager sink shares this thread, queue and retry policy
//! through [`DeliveryThread`] and [`Schedule`], rendering its bodies on the
//! thread and resending on a timer.) The two are joined by a bounded queue, so batches go out one at a time
//! in the order they were written, and the query never waits on the network
//! unless the endpoint falls [`QUEUE_CAPACITY`] batches behind: then `write`
//! waits, and a slow endpoint slows the query the way a slow disk would,
//! instead of buffering without limit. [`Sink::finish`] waits until every
//! queued batch has been delivered or given up on, then prints one summary
//! line on stderr, `vigil: sink NAME: delivered=D failed=F retried=R` (D and
//! F count batches, R the requests sent again).
//!
//! # Idempotency keys
//!
//! Delivery is at-least-once: a retry after a lost answer, or a restore
//! from a checkpoint (which sends again what came after it), can deliver a
//! batch twice. Each POST's `Idempotency-Key` (32 hex digits, an XXH3-128
//! hash) lets the receiver drop the repeats, as it is the same for the
//! same delivery and differs between different ones:
//!
//! - A batch of alert rows (it has the columns `alert`, `state` and
//!   `event_time`, as rows from a `CREATE ALERT` do) is keyed by what
//!   identifies each state change: for every row, its alert name, state,
//!   event time and the other columns (the alert's key, and the values
//!   that fixed it), leaving out `since`, `severity`, `message` and the
//!   `LABELS` and `ANNOTATIONS` columns, which follow from the change. The same change gets the same key in any run
//!   and from any sink, however many times it is computed again.
//! - Any other batch is keyed by the sink's name, its number among the
//!   sink's non-empty batches (1, 2, ...) and its body. The number is what
//!   the sink's checkpoint records, and a restore sets it back, so the
//!   batches sent again after a restore come with the numbers, and the
//!   keys, they had the first time; the body in the key keeps two
//!   different batches from sharing a key even in runs that restore from
//!   nothing. A run started afresh over the same input sends the same
//!   keys too: for a receiver, it is the same delivery.
//!
//! [`Sink::checkpoint`] waits until the delivery thread has dealt with
//! every batch written before it (delivered or given up), so that a
//! restore never loses a batch that was still queued.
//!
//! # Retries
//!
//! A request that fails with a connection error, a timeout, HTTP 429 or any
//! 5xx status may pass later and is tried again, up to `retries` times, after
//! waiting `backoff`, then twice that, four times that, and so on, each wait
//! capped at [`MAX_BACKOFF`]. Any other answer that is not 2xx is a
//! permanent rejection and is not retried: a 4xx says the request itself is
//! wrong, and a 3xx is not followed because a POST body must not be replayed
//! to a new address behind the user's back. A batch not delivered after its
//! last attempt is given up: one line on stderr, counted as failed, and
//! delivery goes on with the next batch. Giving up never fails the run, since
//! an unreachable receiver must not stop the queries feeding other sinks.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::Schema;
use datafusion::arrow::json::writer::{JsonArray, LineDelimited};
use datafusion::arrow::record_batch::RecordBatch;
use ureq::http::{HeaderName, HeaderValue};

use super::Sink;
use super::SinkCommit;
use super::options::Options;
use super::sink::write_json_rows;
use crate::connector::{OptionSpec, OptionType};
use crate::error::{Error, Result};
use crate::plan::columns::Role;

/// Retries after the first attempt when `retries` is not given.
pub const DEFAULT_RETRIES: u32 = 5;

/// Largest accepted `retries`.
pub const MAX_RETRIES: u32 = 100;

/// First wait before a retry when `backoff` is not given.
pub const DEFAULT_BACKOFF: Duration = Duration::from_millis(200);

/// Longest wait between two attempts, however many retries came before.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Longest a single request may take when `timeout` is not given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest accepted `timeout`.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// Rendered batches waiting for the delivery thread before `write` waits.
pub const QUEUE_CAPACITY: usize = 16;

/// Option keys starting with this add a request header.
const HEADER_PREFIX: &str = "header_";

/// `retries`, shared with the other sinks that deliver over HTTP.
pub const RETRIES: OptionSpec = OptionSpec {
    name: "retries",
    ty: OptionType::Count,
    default: Some("5"),
    accepted: "an integer from 0 to 100",
    doc: "attempts after the first for a batch that failed transiently",
};

/// `backoff`, likewise.
pub const BACKOFF: OptionSpec = OptionSpec {
    name: "backoff",
    ty: OptionType::Duration,
    default: Some("200 milliseconds"),
    accepted: "a duration from 1 millisecond to 30 seconds such as '200 milliseconds'",
    doc: "wait before the first retry; it doubles with each further one",
};

/// `timeout`, likewise.
pub const TIMEOUT: OptionSpec = OptionSpec {
    name: "timeout",
    ty: OptionType::Duration,
    default: Some("10 seconds"),
    accepted: "a duration from 1 millisecond to 24 hours such as '5 seconds'",
    doc: "longest one request may take",
};

/// `header_<name>`, likewise.
pub const HEADERS: OptionSpec = OptionSpec {
    name: HEADER_PREFIX,
    ty: OptionType::Prefix,
    default: None,
    accepted: "a header value (printable ASCII text, no line breaks)",
    doc: "an extra request header; `_` in the name becomes `-`",
};

/// Headers the HTTP client sets itself from the body and the URL; one set by
/// hand would contradict them.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "idempotency-key",
];

/// Where and how a webhook sink delivers, from `CREATE SINK ... WITH
/// (connector = 'webhook', ...)`.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookConfig {
    /// The endpoint, an `http://` or `https://` URL.
    pub url: String,
    /// Attempts after the first for a batch that failed transiently.
    pub retries: u32,
    /// Wait before the first retry; it doubles with each further one.
    pub backoff: Duration,
    /// Longest one request may take, from connecting to reading the answer.
    pub timeout: Duration,
    /// Extra request headers as (lower-case name, value).
    pub headers: Vec<(String, String)>,
}

/// The delivery options `url`, [`RETRIES`], [`BACKOFF`], [`TIMEOUT`] and
/// [`HEADERS`] of a sink of `connector`, for the sinks that deliver over
/// HTTP as this one does.
pub fn delivery_config(name: &str, connector: &str, opts: &Options<'_>) -> Result<WebhookConfig> {
    let Some(url) = opts.url("url")? else {
        return Err(Error::Plan(format!(
            "sink {name}: connector '{connector}' needs a 'url' option"
        )));
    };
    let retries = match opts.count("retries")? {
        None => DEFAULT_RETRIES,
        Some(n) if n <= u64::from(MAX_RETRIES) => n as u32,
        Some(_) => return Err(opts.bad_value("retries", opts.get("retries").unwrap_or(""))),
    };
    let duration = |key: &str, default: Duration, max: Duration| match opts.duration(key)? {
        None => Ok(default),
        Some(d) if d <= max => Ok(d),
        Some(_) => Err(opts.bad_value(key, opts.get(key).unwrap_or(""))),
    };
    let backoff = duration("backoff", DEFAULT_BACKOFF, MAX_BACKOFF)?;
    let timeout = duration("timeout", DEFAULT_TIMEOUT, MAX_TIMEOUT)?;
    let headers = headers(name, opts)?;
    Ok(WebhookConfig {
        url,
        retries,
        backoff,
        timeout,
        headers,
    })
}

/// The `header_<name>` options as (lower-case name, value).
pub fn headers(name: &str, opts: &Options<'_>) -> Result<Vec<(String, String)>> {
    let mut headers: Vec<(String, String)> = Vec::new();
    for (rest, value) in opts.prefixed(HEADER_PREFIX) {
        let key = format!("{HEADER_PREFIX}{rest}");
        let header = rest.replace('_', "-");
        let bad = |why: &str| Error::Plan(format!("sink {name}: option '{key}': {why}"));
        if HeaderName::from_bytes(header.as_bytes()).is_err() {
            return Err(bad(&format!("'{header}' is not a valid header name")));
        }
        if RESERVED_HEADERS.contains(&header.as_str()) {
            return Err(bad(&format!("header '{header}' is set by the sink itself")));
        }
        if HeaderValue::from_str(value).is_err() {
            // The value is not echoed: headers often carry secrets.
            return Err(bad(
                "bad header value (printable ASCII text, no line breaks)",
            ));
        }
        if headers.iter().any(|(h, _)| *h == header) {
            return Err(bad(&format!("header '{header}' is given more than once")));
        }
        headers.push((header, value.to_string()));
    }
    Ok(headers)
}

/// The wait before retry number `retry` (1 for the first retry): `first`
/// doubled `retry - 1` times, capped at [`MAX_BACKOFF`].
pub fn backoff_delay(first: Duration, retry: u32) -> Duration {
    let factor = 1u32
        .checked_shl(retry.saturating_sub(1))
        .unwrap_or(u32::MAX);
    first.saturating_mul(factor).min(MAX_BACKOFF)
}

/// What one request came to.
#[derive(Debug, Clone, PartialEq)]
enum Attempt {
    /// The endpoint took the batch (2xx).
    Delivered,
    /// Failed in a way that may pass if tried again, with why.
    Transient(String),
    /// Rejected; trying again would get the same answer.
    Permanent(String),
}

/// What delivering one batch came to.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    /// Requests sent, the first one included.
    attempts: u32,
    /// Why the last attempt failed, if the batch was given up.
    error: Option<String>,
}

/// Sends one batch with `send` until it is delivered, permanently rejected,
/// or has been retried `retries` times, calling `sleep` with the back-off
/// before each retry. Time and the network come in as closures so that the
/// policy can be tested without either.
fn deliver(
    retries: u32,
    backoff: Duration,
    mut send: impl FnMut() -> Attempt,
    mut sleep: impl FnMut(Duration),
) -> Outcome {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let error = match send() {
            Attempt::Delivered => None,
            Attempt::Permanent(why) => Some(why),
            Attempt::Transient(why) if attempts > retries => Some(why),
            Attempt::Transient(_) => {
                sleep(backoff_delay(backoff, attempts));
                continue;
            }
        };
        return Outcome { attempts, error };
    }
}

/// Whether an HTTP status means delivered, try again, or give up.
fn classify_status(status: u16, detail: &str) -> Attempt {
    let reason = ureq::http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .map(|r| format!(" {r}"))
        .unwrap_or_default();
    let why = if detail.is_empty() {
        format!("HTTP {status}{reason}")
    } else {
        format!("HTTP {status}{reason}: {detail}")
    };
    match status {
        200..=299 => Attempt::Delivered,
        429 | 500..=599 => Attempt::Transient(why),
        300..=399 => Attempt::Permanent(format!("{why} (redirects are not followed)")),
        _ => Attempt::Permanent(why),
    }
}

/// Posts bodies to one endpoint.
struct Client {
    agent: ureq::Agent,
    config: WebhookConfig,
    /// Whether the user set a content type of their own.
    custom_content_type: bool,
}

/// Longest part of an error response's body quoted in messages.
const DETAIL_CHARS: usize = 200;

impl Client {
    fn new(config: &WebhookConfig) -> Client {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(config.timeout))
            // Statuses are classified here, not turned into errors.
            .http_status_as_error(false)
            .max_redirects(0)
            .user_agent(concat!("vigil/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        Client {
            agent,
            custom_content_type: config.headers.iter().any(|(h, _)| h == "content-type"),
            config: config.clone(),
        }
    }

    /// Sends one request and classifies the result.
    fn post(&self, body: &[u8], key: &str) -> Attempt {
        let mut request = self
            .agent
            .post(&self.config.url)
            .header("idempotency-key", key);
        if !self.custom_content_type {
            request = request.header("content-type", "application/json");
        }
        for (name, value) in &self.config.headers {
            request = request.header(name, value);
        }
        match request.send(body) {
            Ok(mut response) => {
                // Read the answer (bounded) so the connection can be reused,
                // and quote the start of it when it explains a failure.
                let text = response
                    .body_mut()
                    .with_config()
                    .limit(64 * 1024)
                    .lossy_utf8(true)
                    .read_to_string()
                    .unwrap_or_default();
                let detail: String = text
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
                    .chars()
                    .take(DETAIL_CHARS)
                    .collect();
                classify_status(response.status().as_u16(), &detail)
            }
            Err(e) => self.classify_error(e),
        }
    }

    /// Network trouble may pass; a request that cannot be built will not.
    fn classify_error(&self, error: ureq::Error) -> Attempt {
        use ureq::Error as E;
        match error {
            E::Timeout(_) => {
                Attempt::Transient(format!("no answer within {:?}", self.config.timeout))
            }
            E::Io(_) | E::HostNotFound | E::ConnectionFailed | E::Protocol(_) => {
                Attempt::Transient(error.to_string())
            }
            other => Attempt::Permanent(other.to_string()),
        }
    }
}

/// A rendered batch, as the delivery thread posts it.
pub(super) struct Batch {
    /// The request body.
    pub(super) body: Vec<u8>,
    /// Rows in it, for messages.
    pub(super) rows: usize,
    /// Its `Idempotency-Key`.
    pub(super) key: String,
}

/// What the delivery thread is given, in order.
enum Delivery<T> {
    Item(T),
    /// Answered once every item before it is dealt with.
    Flush(SyncSender<()>),
}

/// What a delivery thread posts, and when: a sink whose bodies depend on
/// the wall-clock time they are sent at, or that sends again on a schedule
/// (the Alertmanager sink), implements it; the webhook posts each batch as
/// written ([`AsWritten`]). Its methods run on the delivery thread.
pub(super) trait Schedule: Send + 'static {
    /// What the sink queues for the thread.
    type Item: Send + 'static;
    /// The batches to post for `item`, now.
    fn on_item(&mut self, item: Self::Item) -> Vec<Batch>;
    /// When [`due`](Self::due) wants calling next, if ever.
    fn next_due(&self) -> Option<Instant>;
    /// The batches to post now that the time `next_due` gave has come.
    fn due(&mut self) -> Vec<Batch>;
}

/// The webhook's schedule: each batch once, as written.
struct AsWritten;

impl Schedule for AsWritten {
    type Item = Batch;

    fn on_item(&mut self, batch: Batch) -> Vec<Batch> {
        vec![batch]
    }

    fn next_due(&self) -> Option<Instant> {
        None
    }

    fn due(&mut self) -> Vec<Batch> {
        Vec::new()
    }
}

/// Columns that make a row an alert's state change.
const ALERT_IDENTITY: &[&str] = &["alert", "state", "event_time"];

/// Columns of an alert row that follow from the change, left out of its key.
const ALERT_DERIVED: &[&str] = &["since", "severity", "message"];

/// The columns of `schema` that identify an alert row's state change, or
/// `None` when its rows are not alert rows.
fn alert_identity(schema: &Schema) -> Option<Vec<usize>> {
    let has = |name: &str| schema.fields().iter().any(|f| f.name() == name);
    if !ALERT_IDENTITY.iter().all(|c| has(c)) {
        return None;
    }
    let columns = schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| !ALERT_DERIVED.contains(&f.name().as_str()))
        .filter(|(_, f)| !matches!(Role::of(f), Some(Role::Label | Role::Annotation)))
        .map(|(i, _)| i)
        .collect();
    Some(columns)
}

/// The `Idempotency-Key` of a batch: see the [module docs](self). `number`
/// is the batch's among the sink's; `body` its rendered rows.
fn idempotency_key(sink: &str, number: u64, batch: &RecordBatch, body: &[u8]) -> Result<String> {
    let mut input = Vec::new();
    match alert_identity(&batch.schema()) {
        Some(columns) => {
            // Rendered like the body (one JSON object a line), so that
            // equal values always give equal bytes.
            input.extend_from_slice(b"alert\n");
            input = write_json_rows::<LineDelimited>(&batch.project(&columns)?, input)?;
        }
        None => {
            input.extend_from_slice(b"batch\n");
            input.extend_from_slice(&(sink.len() as u64).to_le_bytes());
            input.extend_from_slice(sink.as_bytes());
            input.extend_from_slice(&number.to_le_bytes());
            input.extend_from_slice(body);
        }
    }
    Ok(format!("{:032x}", twox_hash::XxHash3_128::oneshot(&input)))
}

/// What a webhook sink's delivery thread counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryStats {
    /// Batches the endpoint took.
    pub delivered: u64,
    /// Batches given up on.
    pub failed: u64,
    /// Requests sent again after a transient failure.
    pub retried: u64,
}

/// Delivers what `schedule` makes of every item from `queue`, in order,
/// and what it has due in between, until the queue closes.
fn run_delivery<S: Schedule>(
    name: &str,
    config: &WebhookConfig,
    queue: Receiver<Delivery<S::Item>>,
    mut schedule: S,
) -> DeliveryStats {
    let client = Client::new(config);
    let mut stats = DeliveryStats::default();
    loop {
        let next = match schedule.next_due() {
            // Checked before waiting, so that a busy queue cannot starve it.
            Some(at) if at <= Instant::now() => Err(RecvTimeoutError::Timeout),
            Some(at) => queue.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => queue.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        let batches = match next {
            Ok(Delivery::Item(item)) => schedule.on_item(item),
            Ok(Delivery::Flush(done)) => {
                let _ = done.send(());
                continue;
            }
            Err(RecvTimeoutError::Timeout) => schedule.due(),
            Err(RecvTimeoutError::Disconnected) => break,
        };
        for batch in batches {
            post_batch(name, config, &client, &batch, &mut stats);
        }
    }
    stats
}

/// Delivers one batch with retries, counting it in `stats`.
fn post_batch(
    name: &str,
    config: &WebhookConfig,
    client: &Client,
    batch: &Batch,
    stats: &mut DeliveryStats,
) {
    let outcome = deliver(
        config.retries,
        config.backoff,
        || client.post(&batch.body, &batch.key),
        std::thread::sleep,
    );
    stats.retried += u64::from(outcome.attempts - 1);
    match outcome.error {
        None => stats.delivered += 1,
        Some(why) => {
            stats.failed += 1;
            let attempts = match outcome.attempts {
                1 => "1 attempt".to_string(),
                n => format!("{n} attempts"),
            };
            crate::diag::note!(
                "sink {name}: gave up on a batch of {} rows after {attempts}: {why}",
                batch.rows
            );
        }
    }
}

/// A sink's delivery thread and the queue to it: see the [module
/// docs](self) for its order, back-pressure, retries and summary line.
pub(super) struct DeliveryThread<T> {
    name: String,
    /// Closed (`None`) by `close`, which ends the thread.
    queue: Option<SyncSender<Delivery<T>>>,
    worker: Option<JoinHandle<DeliveryStats>>,
}

impl<T: Send + 'static> DeliveryThread<T> {
    /// Starts the thread for sink `name`, posting to `config.url` what
    /// `schedule` makes of the items sent to it. If it is dropped without
    /// [`close`](Self::close) (the run failed), the thread still works
    /// through what was queued but nobody waits for it.
    pub(super) fn start<S: Schedule<Item = T>>(
        name: &str,
        config: &WebhookConfig,
        schedule: S,
    ) -> Result<Self> {
        let (tx, rx) = mpsc::sync_channel(QUEUE_CAPACITY);
        let (thread_name, config) = (name.to_string(), config.clone());
        let worker = std::thread::Builder::new()
            .name(format!("webhook-{name}"))
            .spawn(move || run_delivery(&thread_name, &config, rx, schedule))
            .map_err(|e| Error::io(format!("sink {name}: cannot start delivery"), e))?;
        Ok(Self {
            name: name.to_string(),
            queue: Some(tx),
            worker: Some(worker),
        })
    }

    /// Queues `item`, waiting while the queue is full.
    pub(super) fn send(&self, item: T) -> Result<()> {
        self.queue()?
            .send(Delivery::Item(item))
            .map_err(|_| self.thread_failed())
    }

    /// Waits until everything queued before has been dealt with.
    pub(super) fn flush(&self) -> Result<()> {
        let (done, flushed) = mpsc::sync_channel(1);
        self.queue()?
            .send(Delivery::Flush(done))
            .map_err(|_| self.thread_failed())?;
        flushed.recv().map_err(|_| self.thread_failed())
    }

    /// The queue, or the error for a sink written after `finish`.
    fn queue(&self) -> Result<&SyncSender<Delivery<T>>> {
        self.queue.as_ref().ok_or_else(|| {
            Error::Connector(format!("sink {}: written after it was finished", self.name))
        })
    }

    fn thread_failed(&self) -> Error {
        Error::Connector(format!("sink {}: the delivery thread failed", self.name))
    }

    /// Closes the queue and waits for the thread to finish it; returns
    /// what it counted, or `None` if this was done before.
    pub(super) fn close(&mut self) -> Result<Option<DeliveryStats>> {
        drop(self.queue.take());
        let Some(worker) = self.worker.take() else {
            return Ok(None);
        };
        worker.join().map(Some).map_err(|_| self.thread_failed())
    }

    /// [`close`](Self::close), then the summary line on stderr.
    pub(super) fn finish(&mut self) -> Result<()> {
        if let Some(stats) = self.close()? {
            crate::diag::note!(
                "sink {}: delivered={} failed={} retried={}",
                self.name,
                stats.delivered,
                stats.failed,
                stats.retried
            );
        }
        Ok(())
    }
}

/// Renders a batch as a request body; `None` sends nothing for it.
pub(super) type Render = Box<dyn FnMut(&RecordBatch) -> Result<Option<Vec<u8>>> + Send>;

/// A sink that POSTs each batch as a JSON array; see the [module
/// docs](self).
pub struct WebhookSink {
    name: String,
    /// The body of a batch: a JSON array, unless opened with
    /// [`WebhookSink::open_rendering`].
    render: Render,
    delivery: DeliveryThread<Batch>,
    /// Non-empty batches written (restored by a restore), numbering them
    /// for their idempotency keys.
    batches: u64,
}

impl WebhookSink {
    /// Starts the delivery thread for sink `name`. If the sink is dropped
    /// without [`finish`](Sink::finish) (the run failed), the thread still
    /// works through what was queued but nobody waits for it.
    pub fn open(name: &str, config: &WebhookConfig) -> Result<WebhookSink> {
        let json = |batch: &RecordBatch| write_json_rows::<JsonArray>(batch, Vec::new()).map(Some);
        WebhookSink::open_rendering(name, config, Box::new(json))
    }

    /// Like [`WebhookSink::open`], with the bodies rendered by `render`
    /// (its content type among `config.headers`): the same delivery,
    /// retries and idempotency keys for another payload (the
    /// `remote_write` sink's).
    pub(super) fn open_rendering(
        name: &str,
        config: &WebhookConfig,
        render: Render,
    ) -> Result<WebhookSink> {
        Ok(WebhookSink {
            name: name.to_string(),
            render,
            delivery: DeliveryThread::start(name, config, AsWritten)?,
            batches: 0,
        })
    }

    /// Closes the queue and waits for the delivery thread to finish it;
    /// returns what it counted, or `None` if this was done before.
    pub fn close(&mut self) -> Result<Option<DeliveryStats>> {
        self.delivery.close()
    }
}

impl Sink for WebhookSink {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.delivery.queue()?;
        let Some(body) = (self.render)(batch)? else {
            return Ok(());
        };
        let key = idempotency_key(&self.name, self.batches + 1, batch, &body)?;
        let batch = Batch {
            body,
            rows: batch.num_rows(),
            key,
        };
        self.delivery.send(batch)?;
        self.batches += 1;
        Ok(())
    }

    fn checkpoint(&mut self) -> Result<Option<SinkCommit>> {
        self.delivery.flush()?;
        Ok(Some(serde_json::json!({ "batches": self.batches })))
    }

    fn restore(&mut self, commit: &SinkCommit) -> Result<()> {
        self.batches = commit
            .get("batches")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| {
                Error::Connector(format!(
                    "sink {}: cannot restore from {commit}: it has no batch count",
                    self.name
                ))
            })?;
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        self.delivery.finish()
    }
}

#[cfg(test)]
mod tests;
