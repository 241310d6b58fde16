//! The Alertmanager sink: alert rows posted to Alertmanager's API v2
//! (`POST /api/v2/alerts`) the way Prometheus posts its alerts, so that
//! Alertmanager's grouping, silences, inhibition and routing work on
//! vigil's alerts unchanged.
//!
//! # Payload
//!
//! Each `firing` or `resolved` row of an alert (`CREATE ALERT`, read with
//! `INSERT INTO am SELECT * FROM alert`) becomes one Alertmanager alert;
//! the rows of one batch go in one request, a JSON array:
//!
//! ```json
//! [{"labels":{"alertname":"high_cpu","host":"web-01","severity":"page","team":"infra"},
//!   "annotations":{"summary":"cpu on web-01 at 97 %","runbook_url":"http://wiki/cpu"},
//!   "startsAt":"2024-05-06T09:05:00.000Z","endsAt":"2024-05-06T09:09:12.345Z",
//!   "generatorURL":"http://grafana.example/d/cpu?var-host=web-01"}]
//! ```
//!
//! - `labels`: `alertname` (the alert's name), each key column under its
//!   column name, `severity` (the `SEVERITY`, when given), then each
//!   `LABELS` entry, which wins over the others of the same name. Empty
//!   and NULL values are left out, as Prometheus leaves out empty labels.
//! - `annotations`: `summary`, the rendered `MESSAGE` (Alertmanager's and
//!   its receivers' default templates show `.Annotations.summary`), then
//!   each `ANNOTATIONS` entry, which wins over `summary`.
//! - `startsAt`: the `since` column (event time the episode began).
//! - `endsAt`: for a firing alert, the wall-clock time the request is sent
//!   plus 4 times `resend` (what Prometheus sets); for a resolved one, its
//!   `event_time`, the time it resolved.
//! - `generatorURL`: the `generator_url` option, a template with `{column}`
//!   placeholders like `MESSAGE`; left out without it.
//!
//! The sink finds these columns by the roles the alert stream's field
//! metadata gives them (see [`crate::plan::AlertNode`]), so a query that
//! passes the columns on unchanged (`SELECT *`, `WHERE`) keeps them; the
//! alert's own columns are also found by name. Rows whose `state` is
//! `pending` are not sent.
//!
//! # Resending
//!
//! Alertmanager forgets an alert at its `endsAt`, so the sink's delivery
//! thread sends every firing alert again each `resend` interval of
//! wall-clock time, with a fresh `endsAt`, until its `resolved` row: an
//! alert is resolved in Alertmanager either by that row or, if vigil stops,
//! 4 resend intervals after the last send. A resolved row is matched to
//! its firing alert by alert name and key, and sent with the labels the
//! firing one had, so a label template that reads a value cannot leave the
//! alert firing. Delivery (queue, retries, back-off, the summary line) is
//! the webhook sink's.
//!
//! # Checkpoints
//!
//! A checkpoint records the firing alerts; a restore sends them again at
//! once and goes on resending them (at-least-once: Alertmanager merges an
//! alert it already has by its labels).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::compute::{can_cast_types, cast};
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use serde::{Deserialize, Serialize};

use super::Sink;
use super::SinkCommit;
use super::http::{self, Batch, DeliveryThread, Schedule, WebhookConfig};
use super::options::Options;
use super::{OutputFormat, SinkConfig, SinkTarget};
use crate::connector::{Opener, OptionSpec, OptionType, SinkConnector, SinkOpen};
use crate::error::{Error, Result};
use crate::plan::columns::{self, Role};
use crate::plan::template::MessageTemplate;

/// The API path alerts are posted to, under the sink's `url`.
pub const ALERTS_PATH: &str = "/api/v2/alerts";

/// `resend` when not given: Prometheus's default `--rules.alert.resend-delay`.
pub const DEFAULT_RESEND: Duration = Duration::from_secs(60);

/// `endsAt` of a firing alert is this many resend intervals ahead, as
/// Prometheus sets it.
pub const ENDS_AFTER_RESENDS: u32 = 4;

/// Annotation the rendered `MESSAGE` goes to.
pub const SUMMARY: &str = "summary";

/// Where and how an Alertmanager sink delivers.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertmanagerConfig {
    /// Delivery as the webhook does it; `url` is the alerts endpoint.
    pub delivery: WebhookConfig,
    /// How often a firing alert is sent again.
    pub resend: Duration,
    /// The `generator_url` template.
    pub generator_url: Option<String>,
}

/// The endpoint for Alertmanager at `url`: its `/api/v2/alerts`, unless
/// `url` already ends with it.
pub fn alerts_url(url: &str) -> std::result::Result<String, String> {
    let mut parsed = url::Url::parse(url.trim()).map_err(|e| e.to_string())?;
    let path = parsed.path().trim_end_matches('/').to_string();
    if !path.ends_with(ALERTS_PATH) {
        parsed.set_path(&format!("{path}{ALERTS_PATH}"));
    }
    Ok(parsed.to_string())
}

/// One alert as Alertmanager's API takes it, with what the sink needs to
/// follow it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AmAlert {
    /// Alert name and key: what matches a resolved row to its firing one.
    pub identity: String,
    /// Label name to value.
    pub labels: BTreeMap<String, String>,
    /// Annotation name to value.
    pub annotations: BTreeMap<String, String>,
    /// When it began, epoch milliseconds.
    pub starts_at: i64,
    /// When it resolved, epoch milliseconds; `None` while firing.
    pub ends_at: Option<i64>,
    /// `generatorURL`.
    pub generator_url: Option<String>,
}

/// The JSON body for `alerts`, sent at `now_ms`: firing alerts end at
/// `now_ms + 4 * resend`.
pub fn payload(alerts: &[AmAlert], now_ms: i64, resend: Duration) -> Vec<u8> {
    let valid_for = resend.as_millis() as i64 * i64::from(ENDS_AFTER_RESENDS);
    let items: Vec<serde_json::Value> = alerts
        .iter()
        .map(|a| {
            let mut item = serde_json::json!({
                "labels": a.labels,
                "annotations": a.annotations,
                "startsAt": rfc3339(a.starts_at),
                "endsAt": rfc3339(a.ends_at.unwrap_or(now_ms + valid_for)),
            });
            if let Some(url) = &a.generator_url {
                item["generatorURL"] = url.clone().into();
            }
            item
        })
        .collect();
    serde_json::to_vec(&items).unwrap_or_default()
}

/// `2024-05-06T09:05:00.000Z`.
fn rfc3339(ms: i64) -> String {
    match chrono::DateTime::from_timestamp_millis(ms) {
        Some(t) => t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        None => "1970-01-01T00:00:00.000Z".to_string(),
    }
}

/// Which alerts to send when: every change at once, and each firing alert
/// again `resend` after it was last sent. Times come in as arguments so
/// that the schedule can be tested without waiting.
#[derive(Debug)]
pub struct Resends {
    resend: Duration,
    /// Firing alerts by identity, with when each was last sent.
    firing: BTreeMap<String, (AmAlert, Instant)>,
}

impl Resends {
    /// An empty schedule resending every `resend`.
    pub fn new(resend: Duration) -> Self {
        Self {
            resend,
            firing: BTreeMap::new(),
        }
    }

    /// Takes `alerts` (changes, sent at `now`): firing ones are followed,
    /// resolved ones no longer.
    pub fn update(&mut self, alerts: &[AmAlert], now: Instant) {
        for alert in alerts {
            match alert.ends_at {
                None => self
                    .firing
                    .insert(alert.identity.clone(), (alert.clone(), now)),
                Some(_) => self.firing.remove(&alert.identity),
            };
        }
    }

    /// When the next firing alert is due again.
    pub fn next_due(&self) -> Option<Instant> {
        self.firing
            .values()
            .map(|(_, sent)| *sent + self.resend)
            .min()
    }

    /// The firing alerts due again at `now`, marked sent.
    pub fn due(&mut self, now: Instant) -> Vec<AmAlert> {
        self.firing
            .values_mut()
            .filter(|(_, sent)| *sent + self.resend <= now)
            .map(|(alert, sent)| {
                *sent = now;
                alert.clone()
            })
            .collect()
    }
}

/// [`Resends`] on the delivery thread, on the wall clock.
struct ResendSchedule(Resends);

impl ResendSchedule {
    fn batch(&self, alerts: &[AmAlert]) -> Vec<Batch> {
        if alerts.is_empty() {
            return Vec::new();
        }
        let body = payload(alerts, wall_clock_ms(), self.0.resend);
        let key = format!("{:032x}", twox_hash::XxHash3_128::oneshot(&body));
        vec![Batch {
            body,
            rows: alerts.len(),
            key,
        }]
    }
}

impl Schedule for ResendSchedule {
    type Item = Vec<AmAlert>;

    fn on_item(&mut self, alerts: Vec<AmAlert>) -> Vec<Batch> {
        self.0.update(&alerts, Instant::now());
        self.batch(&alerts)
    }

    fn next_due(&self) -> Option<Instant> {
        self.0.next_due()
    }

    fn due(&mut self) -> Vec<Batch> {
        let alerts = self.0.due(Instant::now());
        self.batch(&alerts)
    }
}

fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Where the parts of an alert are in the rows a sink is given.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub(crate) alert: usize,
    pub(crate) state: usize,
    pub(crate) event_time: usize,
    pub(crate) since: usize,
    pub(crate) severity: Option<usize>,
    pub(crate) message: Option<usize>,
    /// Key columns, with their names.
    pub(crate) keys: Vec<(usize, String)>,
    /// `LABELS` columns, with the label names.
    pub(crate) labels: Vec<(usize, String)>,
    /// `ANNOTATIONS` columns, with the annotation names.
    pub(crate) annotations: Vec<(usize, String)>,
}

impl Layout {
    /// The layout of alert rows with `schema`; errors say what is missing.
    pub fn of(sink: &str, schema: &Schema) -> Result<Layout> {
        let mut found: Vec<(Role, usize, String)> = Vec::new();
        for (i, field) in schema.fields().iter().enumerate() {
            let Some(role) = Role::of(field).or_else(|| own_column(field.name())) else {
                continue;
            };
            let name = match role {
                Role::Label | Role::Annotation => field
                    .metadata()
                    .get(columns::NAME)
                    .cloned()
                    .unwrap_or_else(|| field.name().clone()),
                _ => field.name().clone(),
            };
            found.push((role, i, name));
        }
        let one = |role: Role| found.iter().find(|(r, ..)| *r == role).map(|(_, i, _)| *i);
        let all = |role: Role| -> Vec<(usize, String)> {
            found
                .iter()
                .filter(|(r, ..)| *r == role)
                .map(|(_, i, n)| (*i, n.clone()))
                .collect()
        };
        let needed = [Role::Alert, Role::State, Role::EventTime, Role::Since];
        let [alert, state, event_time, since] = needed.map(one);
        let (Some(alert), Some(state), Some(event_time), Some(since)) =
            (alert, state, event_time, since)
        else {
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            return Err(Error::Plan(format!(
                "sink {sink}: connector 'alertmanager' takes the rows of an alert (columns alert, state, event_time and since, as SELECT * FROM the alert gives them), got columns {}",
                names.join(", ")
            )));
        };
        Ok(Layout {
            alert,
            state,
            event_time,
            since,
            severity: one(Role::Severity),
            message: one(Role::Message),
            keys: all(Role::Key),
            labels: all(Role::Label),
            annotations: all(Role::Annotation),
        })
    }
}

/// The role of one of the alert's own columns, by its name.
fn own_column(name: &str) -> Option<Role> {
    Some(match name {
        columns::ALERT => Role::Alert,
        columns::STATE => Role::State,
        columns::EVENT_TIME => Role::EventTime,
        columns::SINCE => Role::Since,
        columns::SEVERITY => Role::Severity,
        columns::MESSAGE => Role::Message,
        _ => return None,
    })
}

/// The `firing` and `resolved` rows of `batch` as Alertmanager alerts, in
/// row order; `generator` renders `generatorURL`.
pub fn alerts_of(
    layout: &Layout,
    batch: &RecordBatch,
    generator: Option<&MessageTemplate>,
) -> Result<Vec<AmAlert>> {
    let texts = Texts::of(layout, batch, generator)?;
    let state = texts.state.as_string::<i32>();
    let mut out = Vec::new();
    for row in 0..batch.num_rows() {
        let resolved = match state.value(row) {
            "firing" => false,
            "resolved" => true,
            "pending" => continue,
            other => {
                return Err(Error::Connector(format!(
                    "alert row with state '{other}': the alertmanager sink takes firing, resolved and pending rows"
                )));
            }
        };
        let (identity, labels) = texts.labels(layout, row);
        out.push(AmAlert {
            identity,
            labels,
            annotations: texts.annotations(layout, row),
            starts_at: texts.since[row],
            ends_at: resolved.then_some(texts.event_time[row]),
            generator_url: texts.generator.as_ref().and_then(|g| text_at(g, row)),
        });
    }
    Ok(out)
}

/// The columns of a batch of alert rows that an alert is made of, as text
/// (times in epoch milliseconds).
struct Texts {
    alert: ArrayRef,
    state: ArrayRef,
    severity: Option<ArrayRef>,
    message: Option<ArrayRef>,
    keys: Vec<KeyColumn>,
    labels: Vec<ArrayRef>,
    annotations: Vec<ArrayRef>,
    since: Vec<i64>,
    event_time: Vec<i64>,
    generator: Option<ArrayRef>,
}

impl Texts {
    fn of(
        layout: &Layout,
        batch: &RecordBatch,
        generator: Option<&MessageTemplate>,
    ) -> Result<Self> {
        let text = |i: usize| text_column(batch.column(i));
        let texts =
            |at: &[(usize, String)]| at.iter().map(|(i, _)| text(*i)).collect::<Result<Vec<_>>>();
        Ok(Texts {
            alert: text(layout.alert)?,
            state: text(layout.state)?,
            severity: layout.severity.map(text).transpose()?,
            message: layout.message.map(text).transpose()?,
            keys: layout
                .keys
                .iter()
                .map(|(i, _)| KeyColumn::of(batch.column(*i)))
                .collect::<Result<Vec<_>>>()?,
            labels: texts(&layout.labels)?,
            annotations: texts(&layout.annotations)?,
            since: millis(batch.column(layout.since))?,
            event_time: millis(batch.column(layout.event_time))?,
            generator: generator.map(|t| t.render(batch)).transpose()?,
        })
    }

    /// The alert's identity (its name and key) and its labels: the name,
    /// the keys, severity, then `LABELS`.
    fn labels(&self, layout: &Layout, row: usize) -> (String, BTreeMap<String, String>) {
        let name = text_at(&self.alert, row).unwrap_or_default();
        let mut identity = vec![name.clone()];
        let mut labels = BTreeMap::from([("alertname".to_string(), name)]);
        for ((_, key), column) in layout.keys.iter().zip(&self.keys) {
            for (label, value) in column.labels(key, row) {
                identity.push(format!("{label}={}", value.as_deref().unwrap_or("")));
                labels.extend(value.map(|v| (label, v)));
            }
        }
        let severity = self.severity.as_ref().and_then(|s| text_at(s, row));
        labels.extend(severity.map(|v| ("severity".to_string(), v)));
        put(&mut labels, &layout.labels, &self.labels, row);
        let identity = serde_json::Value::from(identity).to_string();
        (identity, labels)
    }

    /// `summary` (the message), then `ANNOTATIONS`.
    fn annotations(&self, layout: &Layout, row: usize) -> BTreeMap<String, String> {
        let mut annotations = BTreeMap::new();
        let message = self.message.as_ref().and_then(|m| text_at(m, row));
        annotations.extend(message.map(|v| (SUMMARY.to_string(), v)));
        put(
            &mut annotations,
            &layout.annotations,
            &self.annotations,
            row,
        );
        annotations
    }
}

/// A key column of alert rows: text, or a map whose entries are labels of
/// their own (the `labels` column of the Prometheus sources, which keys a
/// series the way Prometheus's own alerts are keyed).
enum KeyColumn {
    Text(ArrayRef),
    Map {
        offsets: Vec<usize>,
        valid: Vec<bool>,
        keys: ArrayRef,
        values: ArrayRef,
    },
}

impl KeyColumn {
    fn of(column: &ArrayRef) -> Result<KeyColumn> {
        let Some(map) = column.as_map_opt() else {
            return Ok(KeyColumn::Text(text_column(column)?));
        };
        Ok(KeyColumn::Map {
            offsets: map.value_offsets().iter().map(|&o| o as usize).collect(),
            valid: (0..map.len()).map(|i| map.is_valid(i)).collect(),
            keys: text_column(map.keys())?,
            values: text_column(map.values())?,
        })
    }

    /// The labels this column gives row `row`, named `name` for text.
    fn labels(&self, name: &str, row: usize) -> Vec<(String, Option<String>)> {
        match self {
            KeyColumn::Text(column) => vec![(name.to_string(), text_at(column, row))],
            KeyColumn::Map {
                offsets,
                valid,
                keys,
                values,
            } => {
                if !valid[row] {
                    return Vec::new();
                }
                (offsets[row]..offsets[row + 1])
                    .filter_map(|i| Some((text_at(keys, i)?, text_at(values, i))))
                    .collect()
            }
        }
    }
}

/// Row `row` of a text column; `None` for NULL and empty text.
fn text_at(column: &ArrayRef, row: usize) -> Option<String> {
    let column = column.as_string::<i32>();
    (column.is_valid(row) && !column.value(row).is_empty()).then(|| column.value(row).to_string())
}

/// Sets `names[i]` to row `row` of `columns[i]`; an empty value removes
/// the name, as an empty label is no label in Prometheus.
fn put(
    into: &mut BTreeMap<String, String>,
    names: &[(usize, String)],
    columns: &[ArrayRef],
    row: usize,
) {
    for ((_, name), column) in names.iter().zip(columns) {
        match text_at(column, row) {
            Some(v) => into.insert(name.clone(), v),
            None => into.remove(name),
        };
    }
}

/// `column` as UTF-8 text, timestamps as the sinks print them.
fn text_column(column: &ArrayRef) -> Result<ArrayRef> {
    match column.data_type() {
        DataType::Utf8 => Ok(column.clone()),
        DataType::Timestamp(..) => {
            let ms = millis(column)?;
            let text: datafusion::arrow::array::StringArray = (0..column.len())
                .map(|i| {
                    column
                        .is_valid(i)
                        .then(|| crate::timestamp::format_timestamp_ms(ms[i]))
                })
                .collect();
            Ok(std::sync::Arc::new(text))
        }
        _ if can_cast_types(column.data_type(), &DataType::Utf8) => {
            Ok(cast(column, &DataType::Utf8)?)
        }
        _ => {
            let formatter = ArrayFormatter::try_new(column.as_ref(), &FormatOptions::default())?;
            let text: datafusion::arrow::array::StringArray = (0..column.len())
                .map(|i| column.is_valid(i).then(|| formatter.value(i).to_string()))
                .collect();
            Ok(std::sync::Arc::new(text))
        }
    }
}

/// A timestamp column in epoch milliseconds (NULL as 0).
fn millis(column: &ArrayRef) -> Result<Vec<i64>> {
    let ms = cast(column, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
    let ms = ms.as_primitive::<datafusion::arrow::datatypes::TimestampMillisecondType>();
    Ok((0..ms.len())
        .map(|i| if ms.is_valid(i) { ms.value(i) } else { 0 })
        .collect())
}

/// A sink posting alert rows to Alertmanager; see the [module docs](self).
pub struct AlertmanagerSink {
    name: String,
    layout: Layout,
    generator: Option<MessageTemplate>,
    delivery: DeliveryThread<Vec<AmAlert>>,
    /// The firing alerts, by identity, as the delivery thread follows them:
    /// for resolved rows' labels and for checkpoints.
    firing: BTreeMap<String, AmAlert>,
}

impl AlertmanagerSink {
    /// Opens sink `name` for alert rows of `schema`.
    pub fn open(
        name: &str,
        config: &AlertmanagerConfig,
        schema: &SchemaRef,
    ) -> Result<AlertmanagerSink> {
        let layout = Layout::of(name, schema)?;
        let generator = config
            .generator_url
            .as_deref()
            .map(MessageTemplate::parse)
            .transpose()?;
        if let Some(template) = &generator {
            for column in template.columns() {
                if schema.field_with_name(column).is_err() {
                    return Err(Error::Plan(format!(
                        "sink {name}: generator_url reads '{{{column}}}', but the rows have no column '{column}'"
                    )));
                }
            }
        }
        let schedule = ResendSchedule(Resends::new(config.resend));
        Ok(AlertmanagerSink {
            name: name.to_string(),
            layout,
            generator,
            delivery: DeliveryThread::start(name, &config.delivery, schedule)?,
            firing: BTreeMap::new(),
        })
    }

    /// Follows `alerts` as the delivery thread will: a resolved alert
    /// takes the labels its firing one was sent with.
    fn follow(&mut self, alerts: &mut [AmAlert]) {
        for alert in alerts {
            match alert.ends_at {
                None => {
                    self.firing.insert(alert.identity.clone(), alert.clone());
                }
                Some(_) => {
                    if let Some(fired) = self.firing.remove(&alert.identity) {
                        alert.labels = fired.labels;
                        alert.starts_at = fired.starts_at;
                        alert.generator_url = alert.generator_url.take().or(fired.generator_url);
                    }
                }
            }
        }
    }

    /// Closes the queue and waits for the delivery thread.
    pub fn close(&mut self) -> Result<()> {
        self.delivery.close().map(|_| ())
    }
}

impl Sink for AlertmanagerSink {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let mut alerts = alerts_of(&self.layout, batch, self.generator.as_ref())
            .map_err(|e| Error::Connector(format!("sink {}: {e}", self.name)))?;
        if alerts.is_empty() {
            return Ok(());
        }
        self.follow(&mut alerts);
        self.delivery.send(alerts)
    }

    fn finish(&mut self) -> Result<()> {
        self.delivery.finish()
    }

    fn checkpoint(&mut self) -> Result<Option<SinkCommit>> {
        self.delivery.flush()?;
        let firing: Vec<&AmAlert> = self.firing.values().collect();
        Ok(Some(serde_json::json!({ "firing": firing })))
    }

    fn restore(&mut self, commit: &SinkCommit) -> Result<()> {
        let firing: Vec<AmAlert> = commit
            .get("firing")
            .cloned()
            .and_then(|f| serde_json::from_value(f).ok())
            .ok_or_else(|| {
                Error::Connector(format!(
                    "sink {}: cannot restore from {commit}: it has no firing alerts",
                    self.name
                ))
            })?;
        if firing.is_empty() {
            return Ok(());
        }
        self.firing = firing
            .iter()
            .map(|a| (a.identity.clone(), a.clone()))
            .collect();
        // Sent again at once, then resent: Alertmanager may have let them
        // end while vigil was down.
        self.delivery.send(firing)
    }
}

/// The options of `connector = 'alertmanager'`.
const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "url",
        ty: OptionType::Url,
        default: None,
        accepted: "an http:// or https:// URL such as 'http://127.0.0.1:9093'",
        doc: "Alertmanager (required); /api/v2/alerts is added unless the URL ends with it",
    },
    OptionSpec {
        name: "resend",
        ty: OptionType::Duration,
        default: Some("1 minute"),
        accepted: "a duration from 1 second to 24 hours such as '1 minute'",
        doc: "how often a firing alert is sent again; firing alerts end 4 resends after a send",
    },
    OptionSpec {
        name: "generator_url",
        ty: OptionType::Text,
        default: None,
        accepted: "a URL template with {column} placeholders like MESSAGE",
        doc: "the alerts' generatorURL",
    },
    OptionSpec {
        name: "retries",
        ty: OptionType::Count,
        default: Some("5"),
        accepted: "an integer from 0 to 100",
        doc: "attempts after the first for a request that failed transiently",
    },
    OptionSpec {
        name: "backoff",
        ty: OptionType::Duration,
        default: Some("200 milliseconds"),
        accepted: "a duration from 1 millisecond to 30 seconds such as '200 milliseconds'",
        doc: "wait before the first retry; it doubles with each further one",
    },
    OptionSpec {
        name: "timeout",
        ty: OptionType::Duration,
        default: Some("10 seconds"),
        accepted: "a duration from 1 millisecond to 24 hours such as '5 seconds'",
        doc: "longest one request may take",
    },
    OptionSpec {
        name: "header_",
        ty: OptionType::Prefix,
        default: None,
        accepted: "a header value (printable ASCII text, no line breaks)",
        doc: "an extra request header; `_` in the name becomes `-`",
    },
];

/// Shortest accepted `resend`.
pub const MIN_RESEND: Duration = Duration::from_secs(1);

/// Longest accepted `resend`.
pub const MAX_RESEND: Duration = Duration::from_secs(24 * 60 * 60);

/// `connector = 'alertmanager'` in `CREATE SINK`.
pub struct AlertmanagerSinkConnector;

impl SinkConnector for AlertmanagerSinkConnector {
    fn name(&self) -> &'static str {
        "alertmanager"
    }

    fn summary(&self) -> &'static str {
        "alert rows posted to Alertmanager's API v2 as Prometheus posts alerts, resent while firing"
    }

    fn options(&self) -> &'static [OptionSpec] {
        OPTIONS
    }

    fn configure(&self, name: &str, opts: &Options<'_>, _: &Path) -> Result<SinkConfig> {
        let Some(url) = opts.url("url")? else {
            return Err(Error::Plan(format!(
                "sink {name}: connector 'alertmanager' needs a 'url' option, such as 'http://127.0.0.1:9093'"
            )));
        };
        let url = alerts_url(&url).map_err(|_| opts.bad_value("url", &url))?;
        let bounded = |key: &str, default: Duration, min: Duration, max: Duration| match opts
            .duration(key)?
        {
            None => Ok(default),
            Some(d) if (min..=max).contains(&d) => Ok(d),
            Some(_) => Err(opts.bad_value(key, opts.get(key).unwrap_or(""))),
        };
        let one_ms = Duration::from_millis(1);
        let resend = bounded("resend", DEFAULT_RESEND, MIN_RESEND, MAX_RESEND)?;
        let backoff = bounded("backoff", http::DEFAULT_BACKOFF, one_ms, http::MAX_BACKOFF)?;
        let timeout = bounded("timeout", http::DEFAULT_TIMEOUT, one_ms, http::MAX_TIMEOUT)?;
        let retries = match opts.count("retries")? {
            None => http::DEFAULT_RETRIES,
            Some(n) if n <= u64::from(http::MAX_RETRIES) => n as u32,
            Some(_) => return Err(opts.bad_value("retries", opts.get("retries").unwrap_or(""))),
        };
        let generator_url = opts.text("generator_url").map(str::to_string);
        if let Some(template) = &generator_url {
            MessageTemplate::parse(template)
                .map_err(|e| Error::Plan(format!("sink {name}: generator_url: {e}")))?;
        }
        let config = AlertmanagerConfig {
            delivery: WebhookConfig {
                url,
                retries,
                backoff,
                timeout,
                headers: http::headers(name, opts)?,
            },
            resend,
            generator_url,
        };
        Ok(SinkConfig {
            name: name.to_string(),
            target: SinkTarget::Connector(Opener(Arc::new(config))),
            // The payload is always JSON; the format only matters to other sinks.
            format: OutputFormat::Jsonl,
            // Alert rows are final rows.
            append_only: false,
        })
    }
}

impl SinkOpen for AlertmanagerConfig {
    /// Scheme, host and port only: the rest may hold secrets.
    fn describe(&self) -> String {
        match url::Url::parse(&self.delivery.url) {
            Ok(url) => format!(
                "alertmanager {}://{}{}",
                url.scheme(),
                url.host_str().unwrap_or(""),
                url.port().map(|p| format!(":{p}")).unwrap_or_default()
            ),
            Err(_) => "alertmanager".to_string(),
        }
    }

    fn open(&self, name: &str, schema: &SchemaRef) -> Result<Box<dyn Sink>> {
        Ok(Box::new(AlertmanagerSink::open(name, self, schema)?))
    }
}

#[cfg(test)]
mod tests;
