//! The `prometheus` connector: scrapes endpoints that speak the Prometheus
//! text exposition format (version 0.0.4, what node_exporter and the
//! client libraries serve on `/metrics`) and emits one row per sample.
//!
//! Rows are what Prometheus itself would store: one per exposition line,
//! named as the line names it, so a histogram is its `_bucket` series (with
//! `le`), `_sum` and `_count`, and a summary its quantile series (with
//! `quantile`), `_sum` and `_count`. Each scrape of a target also yields
//! the series Prometheus adds for it: `up` (1 when the scrape worked, 0
//! when the target is down, timed out, answered other than 2xx or sent a
//! body that is not an exposition), `scrape_duration_seconds`,
//! `scrape_samples_scraped` (the samples of the page) and
//! `scrape_samples_post_metric_relabeling` (those left after `match`).
//!
//! Targets are scraped at once, each on its own thread, every `interval`;
//! each scrape's rows go out as soon as it is done, so a slow target delays
//! only its own rows, by at most `timeout`.
//!
//! Lines are parsed one at a time with the `prom_text_format_parser`
//! crate: a malformed line is a bad row of the stream (with its line
//! number and the target in the reason) and the rest of the page is kept.
//! Prometheus would drop the whole scrape instead.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use datafusion::arrow::array::{ArrayRef, Float64Array, StringArray, TimestampMillisecondArray};
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use regex::Regex;

use super::catalogue::{CatalogueColumn, match_columns};
use super::common::{limit, live_config};
use super::options::Options;
use super::{BadRow, SourceConfig, SourcePosition, SourceStats};
use crate::connector::{
    Columns, NOT_REPLAYABLE, OptionSpec, OptionType, Reader, SourceConnector, SourceRead,
    StreamDecl,
};
use crate::error::{Error, Result};
use crate::text::POLL;
use crate::types::{LabelsBuilder, labels_type};

/// Default time between two scrapes of a target.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);

/// Shortest interval accepted.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// Longest default timeout: Prometheus's default `scrape_timeout`. The
/// default is this or the interval, whichever is shorter.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest page read from a target; a larger one fails the scrape.
pub const MAX_BODY_BYTES: u64 = 64 << 20;

/// What is asked for: the text format, which is all this source reads.
const ACCEPT: &str = "text/plain;version=0.0.4;q=1,*/*;q=0.1";

/// Longest part of a bad line quoted in its reason.
const QUOTED_CHARS: usize = 120;

const TIMESTAMP: DataType = DataType::Timestamp(TimeUnit::Millisecond, None);

/// The columns a `prometheus` stream can declare.
pub static COLUMNS: LazyLock<Vec<CatalogueColumn>> = LazyLock::new(|| {
    vec![
        CatalogueColumn {
            name: "ts",
            data_type: TIMESTAMP,
            meaning: "the sample's timestamp if the page gives one, else the time the scrape started (UTC, ms)",
        },
        CatalogueColumn {
            name: "job",
            data_type: DataType::Utf8,
            meaning: "the `job` option (default: the stream's name)",
        },
        CatalogueColumn {
            name: "instance",
            data_type: DataType::Utf8,
            meaning: "the target's host:port, as Prometheus sets `instance`",
        },
        CatalogueColumn {
            name: "name",
            data_type: DataType::Utf8,
            meaning: "the series name, as Prometheus stores it (`x_bucket`, `x_sum`, `x_count`, `up`)",
        },
        CatalogueColumn {
            name: "labels",
            data_type: labels_type(),
            meaning: "the sample's other labels (`le`, `quantile`, ...); `job` and `instance` from the page become `exported_job` and `exported_instance`",
        },
        CatalogueColumn {
            name: "value",
            data_type: DataType::Float64,
            meaning: "the sample's value (NaN and ±Inf as given)",
        },
    ]
});

const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "targets",
        ty: OptionType::Text,
        default: None,
        accepted: "http:// or https:// URLs, or host:port for http://host:port/metrics, separated by commas, e.g. 'http://127.0.0.1:9100/metrics'",
        doc: "the pages to scrape (required)",
    },
    OptionSpec {
        name: "interval",
        ty: OptionType::Duration,
        default: Some("15 seconds"),
        accepted: "a duration of at least 100 milliseconds, e.g. '15 seconds'",
        doc: "time between two scrapes of each target",
    },
    OptionSpec {
        name: "timeout",
        ty: OptionType::Duration,
        default: Some("10 seconds, or interval if shorter"),
        accepted: "a duration no longer than interval, e.g. '5 seconds'",
        doc: "how long one scrape may take, reading the page included; a target that takes longer is down (up = 0)",
    },
    OptionSpec {
        name: "match",
        ty: OptionType::Text,
        default: None,
        accepted: "a regular expression, e.g. 'node_cpu_seconds_total|node_memory_.*'",
        doc: "keep only the samples whose metric name it matches, anchored at both ends like PromQL's =~",
    },
    OptionSpec {
        name: "job",
        ty: OptionType::Text,
        default: Some("the stream's name"),
        accepted: "any text",
        doc: "the job column",
    },
    OptionSpec {
        name: "limit",
        ty: OptionType::Count,
        default: None,
        accepted: "a positive integer such as 10",
        doc: "stop after this many rounds of scrapes (each target once per round)",
    },
];

/// `connector = 'prometheus'`: pages in the Prometheus text format,
/// scraped every `interval`.
pub struct PrometheusSource;

impl SourceConnector for PrometheusSource {
    fn name(&self) -> &'static str {
        "prometheus"
    }
    fn summary(&self) -> &'static str {
        "pages in the Prometheus text exposition format (node_exporter, /metrics endpoints), scraped live: one row per sample, plus up and scrape_* per scrape"
    }
    fn options(&self) -> &'static [OptionSpec] {
        OPTIONS
    }
    fn columns(&self) -> Columns {
        Columns::Catalogue(&COLUMNS)
    }
    fn configure(&self, decl: &StreamDecl<'_>, opts: &Options<'_>) -> Result<SourceConfig> {
        let raw = |key: &str| opts.get(key).unwrap_or("");
        let bad = |key: &str, why: String| {
            Error::Plan(format!("{}: {why}", opts.bad_value(key, raw(key))))
        };
        let targets = match opts.text("targets") {
            None => {
                return Err(Error::Plan(format!(
                    "stream {}: connector 'prometheus' needs a 'targets' option, e.g. \
                     targets = 'http://127.0.0.1:9100/metrics'",
                    decl.stream
                )));
            }
            Some(text) => parse_targets(text).map_err(|why| bad("targets", why))?,
        };
        let interval = match opts.duration("interval")? {
            None => DEFAULT_INTERVAL,
            Some(d) if d >= MIN_INTERVAL => d,
            Some(_) => return Err(opts.bad_value("interval", raw("interval"))),
        };
        let timeout = match opts.duration("timeout")? {
            None => interval.min(DEFAULT_TIMEOUT),
            Some(d) if d <= interval => d,
            Some(_) => return Err(opts.bad_value("timeout", raw("timeout"))),
        };
        let filter = match opts.get("match") {
            None => None,
            Some(text) => Some(parse_match(text).map_err(|why| bad("match", why))?),
        };
        let job = opts.get("job").unwrap_or(decl.stream).to_string();
        let scraper = Scraper {
            targets,
            interval,
            timeout,
            filter,
            job,
            limit: limit(opts)?,
        };
        Ok(live_config(decl, "prometheus", Reader(Arc::new(scraper))))
    }
}

/// What each entry of [`COLUMNS`] holds, in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Column {
    Ts,
    Job,
    Instance,
    Name,
    Labels,
    Value,
}

const KINDS: [Column; 6] = [
    Column::Ts,
    Column::Job,
    Column::Instance,
    Column::Name,
    Column::Labels,
    Column::Value,
];

/// One endpoint to scrape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL fetched.
    pub url: String,
    /// Its `instance`: host and port, the scheme's port when the URL has
    /// none (as Prometheus 2 sets it).
    pub instance: String,
}

impl Target {
    /// A target from how a user writes it: a URL (`http://host:9100/metrics`)
    /// or `host:port`, which means `http://host:port/metrics`.
    pub fn parse(text: &str) -> std::result::Result<Target, String> {
        let text = text.trim();
        let full = if text.contains("://") {
            text.to_string()
        } else {
            format!("http://{text}/metrics")
        };
        let url = url::Url::parse(&full).map_err(|e| format!("'{text}' is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("'{text}' is not an http:// or https:// URL"));
        }
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("'{text}' has no host"))?;
        let port = url
            .port_or_known_default()
            .ok_or_else(|| format!("'{text}' has no port"))?;
        Ok(Target {
            instance: format!("{host}:{port}"),
            url: url.to_string(),
        })
    }
}

/// The targets of a `targets` option: URLs or `host:port`, separated by
/// commas; at least one, none twice.
pub fn parse_targets(text: &str) -> std::result::Result<Vec<Target>, String> {
    let mut targets: Vec<Target> = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let target = Target::parse(part)?;
        if targets.iter().any(|t| t.url == target.url) {
            return Err(format!("'{part}' is listed twice"));
        }
        targets.push(target);
    }
    if targets.is_empty() {
        return Err("no target given".into());
    }
    Ok(targets)
}

/// A `match` option as a regex on the metric name, anchored at both ends
/// as PromQL anchors `=~`.
pub fn parse_match(text: &str) -> std::result::Result<Regex, String> {
    Regex::new(&format!("^(?:{text})$")).map_err(|e| format!("not a regular expression: {e}"))
}

/// A configured `prometheus` source.
#[derive(Debug, Clone)]
pub struct Scraper {
    /// What it scrapes.
    pub targets: Vec<Target>,
    /// Time between two rounds of scrapes.
    pub interval: Duration,
    /// How long one scrape may take, reading the page included.
    pub timeout: Duration,
    /// Keeps only the samples whose name it matches (the report series
    /// are always kept).
    pub filter: Option<Regex>,
    /// The `job` column's value.
    pub job: String,
    /// Stop after this many rounds (each target scraped once per round).
    pub limit: Option<u64>,
}

/// One sample as Prometheus stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series name of its line.
    pub name: String,
    /// Its labels, by name, unescaped; none with an empty value.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
    /// Its own timestamp (epoch ms), if the line gives one.
    pub timestamp: Option<i64>,
}

/// What one page held.
#[derive(Debug, Default)]
pub struct Page {
    /// The samples kept (those `match` accepts).
    pub samples: Vec<Sample>,
    /// Every sample line that parsed, kept or not.
    pub scraped: u64,
    /// The lines that did not parse.
    pub bad: Vec<BadRow>,
}

/// Parses an exposition page, line by line; samples whose name `filter`
/// does not match are counted but not kept.
pub fn parse_page(body: &[u8], filter: Option<&Regex>) -> Page {
    let mut page = Page::default();
    for (i, raw) in body.split(|&b| b == b'\n').enumerate() {
        let line = i as u64 + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let parsed = std::str::from_utf8(raw)
            .map_err(|_| "the line is not UTF-8".to_string())
            .and_then(parse_line);
        match parsed {
            Ok(None) => {}
            Ok(Some(sample)) => {
                page.scraped += 1;
                if filter.is_none_or(|f| f.is_match(&sample.name)) {
                    page.samples.push(sample);
                }
            }
            Err(reason) => page.bad.push(BadRow { line, reason }),
        }
    }
    page
}

/// One line of a page: a sample, nothing (blank, `# HELP`, `# TYPE` or
/// another comment: the series are named by their lines, so the types add
/// nothing to a row) or why it is malformed.
fn parse_line(line: &str) -> std::result::Result<Option<Sample>, String> {
    let text = line.trim_matches([' ', '\t']);
    if text.is_empty() || text.starts_with('#') {
        return Ok(None);
    }
    let (metrics, error) = prom_text_format_parser::parse_scrape(text);
    let sample = match (error, metrics.into_iter().next()) {
        (None, Some(metric)) => metric
            .samples
            .into_iter()
            .next()
            .map(|sample| (metric.name, sample)),
        _ => None,
    };
    let Some((name, sample)) = sample else {
        return Err(format!("not a sample line: {}", quote(text)));
    };
    let value_text = sample.value.value.as_str();
    let value = value_text
        .parse::<f64>()
        .map_err(|_| format!("value '{value_text}' is not a number: {}", quote(text)))?;
    let mut labels = BTreeMap::new();
    for label in sample.labels.iter() {
        let value = unescape(&label.value);
        if labels.insert(label.key.clone(), value).is_some() {
            return Err(format!("label {} given twice: {}", label.key, quote(text)));
        }
    }
    // The target's own `job` and `instance` win, as with Prometheus's
    // default `honor_labels: false`.
    for key in ["job", "instance"] {
        if let Some(value) = labels.remove(key) {
            let mut exported = format!("exported_{key}");
            while labels.contains_key(&exported) {
                exported.insert_str(0, "exported_");
            }
            labels.insert(exported, value);
        }
    }
    Ok(Some(Sample {
        name,
        labels: labels.into_iter().filter(|(_, v)| !v.is_empty()).collect(),
        value,
        timestamp: sample.value.timestamp,
    }))
}

/// A label value as the page escapes it (`\\`, `\"`, `\n`), unescaped.
fn unescape(raw: &str) -> String {
    if !raw.contains('\\') {
        return raw.to_string();
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// A line for a message, cut to [`QUOTED_CHARS`] characters.
fn quote(text: &str) -> String {
    match text.char_indices().nth(QUOTED_CHARS) {
        Some((end, _)) => format!("'{}...'", &text[..end]),
        None => format!("'{text}'"),
    }
}

/// One scrape of one target.
#[derive(Debug)]
struct Scrape {
    /// Index of the target.
    target: usize,
    /// When it started, epoch ms.
    started_ms: i64,
    /// How long it took, reading and parsing the page included.
    took: Duration,
    /// The page, or why there is none.
    outcome: std::result::Result<Page, String>,
}

/// Fetches and parses `target`'s page.
fn scrape(
    agent: &ureq::Agent,
    (index, target): (usize, &Target),
    timeout: Duration,
    filter: Option<&Regex>,
) -> Scrape {
    let started_ms = now_ms();
    let start = Instant::now();
    let outcome = fetch(agent, &target.url, timeout).map(|body| parse_page(&body, filter));
    Scrape {
        target: index,
        started_ms,
        took: start.elapsed(),
        outcome,
    }
}

/// The body of a 2xx answer from `url`, or why there is none.
fn fetch(
    agent: &ureq::Agent,
    url: &str,
    timeout: Duration,
) -> std::result::Result<Vec<u8>, String> {
    let describe = |e: ureq::Error| match e {
        ureq::Error::Timeout(_) => format!("no answer within {timeout:?}"),
        other => other.to_string(),
    };
    let mut answer = agent
        .get(url)
        .header("Accept", ACCEPT)
        .call()
        .map_err(describe)?;
    let status = answer.status();
    if !status.is_success() {
        let reason = status.canonical_reason().unwrap_or("");
        return Err(format!("HTTP {} {reason}", status.as_u16())
            .trim_end()
            .to_string());
    }
    answer
        .body_mut()
        .with_config()
        .limit(MAX_BODY_BYTES)
        .read_to_vec()
        .map_err(describe)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl SourceRead for Scraper {
    fn describe(&self) -> String {
        let targets: Vec<&str> = self.targets.iter().map(|t| t.url.as_str()).collect();
        format!(
            "{}, every {} ms",
            targets.join(", "),
            self.interval.as_millis()
        )
    }
    fn explain(&self) -> String {
        format!("prometheus {}, {NOT_REPLAYABLE}", self.describe())
    }
    fn live_because(&self) -> &'static str {
        "connector 'prometheus' scrapes its targets live"
    }
    fn read(
        &self,
        config: &SourceConfig,
        stats: &SourceStats,
        start: Option<&SourcePosition>,
        emit: &mut dyn FnMut(RecordBatch) -> bool,
    ) -> Result<()> {
        if start.is_some() {
            return Err(Error::Connector(format!(
                "stream {} scrapes its targets live (connector 'prometheus'), which cannot be \
                 read again: it cannot resume from a checkpoint",
                config.stream
            )));
        }
        self.scrape_rounds(config, stats, emit)
    }
}

impl Scraper {
    /// The HTTP client the scrapes share (connections are kept alive
    /// between rounds, as Prometheus keeps them).
    fn agent(&self) -> ureq::Agent {
        ureq::Agent::config_builder()
            .timeout_global(Some(self.timeout))
            .http_status_as_error(false)
            .user_agent(concat!("vigil/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent()
    }

    /// Scrapes every target each `interval` (the first round at once),
    /// emitting each scrape's rows when it is done, and an empty batch
    /// every 100 ms while waiting; until `limit` rounds are done and in,
    /// `stats.stop` is set or `emit` returns false.
    fn scrape_rounds(
        &self,
        config: &SourceConfig,
        stats: &SourceStats,
        emit: &mut dyn FnMut(RecordBatch) -> bool,
    ) -> Result<()> {
        let columns: Vec<Column> =
            match_columns(&config.stream, "prometheus", &config.schema, &COLUMNS)?
                .into_iter()
                .map(|i| KINDS[i])
                .collect();
        let agent = self.agent();
        let (sender, results) = mpsc::channel::<Scrape>();
        let empty = RecordBatch::new_empty(config.schema.clone());
        let mut up: Vec<Option<bool>> = vec![None; self.targets.len()];
        let mut rounds = 0u64;
        let mut pending = 0usize;
        let mut next = Instant::now();
        let mut last_emit = Instant::now();
        loop {
            if stats.stop.load(Ordering::Relaxed) {
                break;
            }
            let more = self.limit.is_none_or(|limit| rounds < limit);
            if !more && pending == 0 {
                break;
            }
            let now = Instant::now();
            if more && next <= now {
                self.start_round(&agent, &sender)?;
                rounds += 1;
                pending += self.targets.len();
                // Keep to the schedule; after a stall, start it again from now.
                next += self.interval;
                if next <= now {
                    next = now + self.interval;
                }
                continue;
            }
            let wait = if more { (next - now).min(POLL) } else { POLL };
            // The loop holds a sender, so this only ever times out.
            if let Ok(done) = results.recv_timeout(wait) {
                pending -= 1;
                self.report(config, &done, &mut up[done.target]);
                if !self.deliver(config, &columns, stats, &done, emit)? {
                    return Ok(());
                }
                last_emit = Instant::now();
            }
            if last_emit.elapsed() >= POLL {
                last_emit = Instant::now();
                if !emit(empty.clone()) {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Counts one scrape's bad lines and emits its rows; false when `emit`
    /// wants no more.
    fn deliver(
        &self,
        config: &SourceConfig,
        columns: &[Column],
        stats: &SourceStats,
        done: &Scrape,
        emit: &mut dyn FnMut(RecordBatch) -> bool,
    ) -> Result<bool> {
        if let Ok(page) = &done.outcome {
            for bad in &page.bad {
                stats.record_bad(BadRow {
                    line: bad.line,
                    reason: format!(
                        "target {}: {}",
                        self.targets[done.target].instance, bad.reason
                    ),
                });
            }
        }
        for batch in self.batches(config, columns, done)? {
            stats
                .rows
                .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
            if !emit(batch) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Starts one scrape of every target, each on a thread of its own that
    /// sends its [`Scrape`] when done (within the timeout).
    fn start_round(&self, agent: &ureq::Agent, sender: &mpsc::Sender<Scrape>) -> Result<()> {
        for (i, target) in self.targets.iter().enumerate() {
            let (agent, target, sender) = (agent.clone(), target.clone(), sender.clone());
            let (timeout, filter) = (self.timeout, self.filter.clone());
            std::thread::Builder::new()
                .name("vigil-scrape".into())
                .spawn(move || {
                    let done = scrape(&agent, (i, &target), timeout, filter.as_ref());
                    // The source may have stopped meanwhile: nobody waits then.
                    let _ = sender.send(done);
                })
                .map_err(|e| Error::io("starting a scrape thread", e))?;
        }
        Ok(())
    }

    /// Warns on stderr when a target goes down (with why) or comes back.
    fn report(&self, config: &SourceConfig, done: &Scrape, was_up: &mut Option<bool>) {
        let target = &self.targets[done.target];
        match (&done.outcome, *was_up) {
            (Err(why), None | Some(true)) => crate::diag::warning!(
                "stream {}: target {} is down: {why}",
                config.stream,
                target.url
            ),
            (Ok(_), Some(false)) => crate::diag::warning!(
                "stream {}: target {} is up again",
                config.stream,
                target.url
            ),
            _ => {}
        }
        *was_up = Some(done.outcome.is_ok());
    }

    /// The rows of one scrape: its samples, then the report series.
    fn batches(
        &self,
        config: &SourceConfig,
        columns: &[Column],
        done: &Scrape,
    ) -> Result<Vec<RecordBatch>> {
        let empty = Page::default();
        let page = done.outcome.as_ref().unwrap_or(&empty);
        let report = report_samples(done, page);
        let rows: Vec<&Sample> = page.samples.iter().chain(report.iter()).collect();
        let instance = &self.targets[done.target].instance;
        rows.chunks(config.batch_size.max(1))
            .map(|chunk| {
                build_batch(
                    &config.schema,
                    columns,
                    (&self.job, instance),
                    done.started_ms,
                    chunk,
                )
            })
            .collect()
    }
}

/// The series Prometheus adds for each scrape of a target.
fn report_samples(done: &Scrape, page: &Page) -> Vec<Sample> {
    let sample = |name: &str, value: f64| Sample {
        name: name.to_string(),
        labels: Vec::new(),
        value,
        timestamp: None,
    };
    let ok = done.outcome.is_ok();
    vec![
        sample("up", if ok { 1.0 } else { 0.0 }),
        sample("scrape_duration_seconds", done.took.as_secs_f64()),
        sample("scrape_samples_scraped", page.scraped as f64),
        sample(
            "scrape_samples_post_metric_relabeling",
            page.samples.len() as f64,
        ),
    ]
}

/// A batch of `schema` holding `rows`; `(job, instance)` for every row,
/// `scraped_ms` as the time of the rows without their own.
fn build_batch(
    schema: &SchemaRef,
    columns: &[Column],
    (job, instance): (&str, &str),
    scraped_ms: i64,
    rows: &[&Sample],
) -> Result<RecordBatch> {
    let arrays: Vec<ArrayRef> = columns
        .iter()
        .map(|column| -> ArrayRef {
            let text = |v: &str| Arc::new(StringArray::from(vec![v; rows.len()])) as ArrayRef;
            match column {
                Column::Ts => Arc::new(TimestampMillisecondArray::from_iter_values(
                    rows.iter().map(|s| s.timestamp.unwrap_or(scraped_ms)),
                )),
                Column::Job => text(job),
                Column::Instance => text(instance),
                Column::Name => Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|s| s.name.as_str()),
                )),
                Column::Labels => {
                    let mut labels = LabelsBuilder::default();
                    for s in rows {
                        labels.append(s.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                    }
                    Arc::new(labels.finish())
                }
                Column::Value => {
                    Arc::new(Float64Array::from_iter_values(rows.iter().map(|s| s.value)))
                }
            }
        })
        .collect();
    Ok(RecordBatch::try_new(schema.clone(), arrays)?)
}

#[cfg(test)]
mod tests;
