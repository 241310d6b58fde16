//! Prometheus remote write 1.0, both ways: the `remote_write` source takes
//! the samples Prometheus (or Grafana Agent, vmagent, ...) sends to
//! `vigil serve`'s `POST /api/v1/write`, and the `remote_write` sink writes
//! a query's results as samples to any receiver of the protocol
//! (Prometheus with `--web.enable-remote-write-receiver`, Mimir, Thanos,
//! VictoriaMetrics).
//!
//! A request is a protobuf `prometheus.WriteRequest` compressed with
//! snappy's block format. The messages are declared here with `prost`'s
//! derive (only the fields remote write 1.0 uses: metadata is ignored).
//!
//! # Source rows
//!
//! One row per sample, with the columns of [`COLUMNS`] (a stream declares
//! the ones it wants): `ts`, `job`, `instance`, `name` (the `__name__`
//! label), `labels` (every other label) and `value`. What the receiving
//! side does with a request:
//!
//! - A series without a `__name__` label, with an empty label name or with
//!   a label name twice is malformed: its samples are bad rows (counted on
//!   the stream, described in the answer), the other series are kept. A
//!   bad row's `line` is the series's position in the request (1-based).
//! - A sample whose value is Prometheus's staleness marker (the NaN with
//!   bits `0x7ff0000000000002`, sent when a series disappears) is skipped:
//!   it says a series ended, and as a value it would turn every aggregate
//!   over the series into NaN. Any other NaN is kept as a value.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float64Builder, MapArray, StringBuilder, TimestampMillisecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, Float64Type, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;

use super::catalogue::{CatalogueColumn, full_schema};
use super::common::APPEND_ONLY;
use super::common::push_config;
use super::http::{self, WebhookConfig, WebhookSink};
use super::options::Options;
use super::{BadRow, OutputFormat, Sink, SinkConfig, SinkTarget, SourceConfig};
use crate::connector::{
    Columns, Opener, OptionSpec, OptionType, SinkConnector, SinkOpen, SourceConnector, StreamDecl,
};
use crate::error::{Error, Result};
use crate::types::{LabelsBuilder, labels_type};

/// The body of a remote-write request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRequest {
    /// The series, each with its samples.
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// One series: its labels and samples.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeSeries {
    /// Its labels, `__name__` among them, sorted by name by the sender.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    /// Its samples, oldest first.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

/// A label of a series.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct Label {
    /// The label's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// One sample.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// The value.
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Epoch milliseconds.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// The bits of Prometheus's staleness marker, a NaN.
pub const STALE_NAN: u64 = 0x7ff0_0000_0000_0002;

/// The version header value of remote write 1.0.
pub const PROTOCOL_VERSION: &str = "0.1.0";

/// The columns a `remote_write` stream can declare.
pub static COLUMNS: LazyLock<Vec<CatalogueColumn>> = LazyLock::new(|| {
    vec![
        CatalogueColumn {
            name: "ts",
            data_type: DataType::Timestamp(TimeUnit::Millisecond, None),
            meaning: "the sample's timestamp",
        },
        CatalogueColumn {
            name: "job",
            data_type: DataType::Utf8,
            meaning: "the series's job label (NULL without one)",
        },
        CatalogueColumn {
            name: "instance",
            data_type: DataType::Utf8,
            meaning: "the series's instance label (NULL without one)",
        },
        CatalogueColumn {
            name: "name",
            data_type: DataType::Utf8,
            meaning: "the metric name (label __name__)",
        },
        CatalogueColumn {
            name: "labels",
            data_type: labels_type(),
            meaning: "the other labels, by name",
        },
        CatalogueColumn {
            name: "value",
            data_type: DataType::Float64,
            meaning: "the sample's value",
        },
    ]
});

/// The schema with every column of [`COLUMNS`], in that order: what
/// [`samples_batch`] builds; pushed into a stream, it keeps the stream's
/// declared columns.
pub fn full_columns() -> SchemaRef {
    full_schema(&COLUMNS)
}

/// Decodes a request body: snappy block format, then protobuf. `max_len`
/// bounds the decompressed size.
pub fn decode_request(body: &[u8], max_len: usize) -> std::result::Result<WriteRequest, String> {
    let len = snap::raw::decompress_len(body)
        .map_err(|e| format!("the body is not snappy-compressed (block format): {e}"))?;
    if len > max_len {
        return Err(format!(
            "the body decompresses to {len} bytes, more than the {max_len} taken"
        ));
    }
    let raw = snap::raw::Decoder::new()
        .decompress_vec(body)
        .map_err(|e| format!("the body is not snappy-compressed (block format): {e}"))?;
    <WriteRequest as prost::Message>::decode(raw.as_slice())
        .map_err(|e| format!("the body is not a prometheus.WriteRequest: {e}"))
}

/// Encodes a request as a sender does: protobuf, then snappy.
pub fn encode_request(request: &WriteRequest) -> Result<Vec<u8>> {
    let raw = prost::Message::encode_to_vec(request);
    snap::raw::Encoder::new()
        .compress_vec(&raw)
        .map_err(|e| Error::Connector(format!("cannot compress a remote-write request: {e}")))
}

/// What a request came to as rows.
#[derive(Debug)]
pub struct Decoded {
    /// The samples kept, with the columns of [`full_columns`].
    pub batch: RecordBatch,
    /// One per sample of a malformed series.
    pub bad: Vec<BadRow>,
    /// Staleness markers skipped.
    pub stale: u64,
}

/// The rows of `request`: see the [module docs](self).
pub fn samples_batch(request: &WriteRequest) -> Result<Decoded> {
    let samples: usize = request.timeseries.iter().map(|s| s.samples.len()).sum();
    let mut ts = TimestampMillisecondBuilder::with_capacity(samples);
    let mut job = StringBuilder::with_capacity(samples, samples * 8);
    let mut instance = StringBuilder::with_capacity(samples, samples * 16);
    let mut name = StringBuilder::with_capacity(samples, samples * 24);
    let mut labels = LabelsBuilder::default();
    let mut value = Float64Builder::with_capacity(samples);
    let mut bad = Vec::new();
    let mut stale = 0;
    for (i, series) in request.timeseries.iter().enumerate() {
        let parts = match split_labels(&series.labels) {
            Ok(parts) => parts,
            Err(why) => {
                let line = i as u64 + 1;
                bad.extend(series.samples.iter().map(|_| BadRow {
                    line,
                    reason: why.clone(),
                }));
                continue;
            }
        };
        for sample in &series.samples {
            if sample.value.to_bits() == STALE_NAN {
                stale += 1;
                continue;
            }
            ts.append_value(sample.timestamp);
            job.append_option(parts.job);
            instance.append_option(parts.instance);
            name.append_value(parts.name);
            labels.append(parts.others.iter().copied());
            value.append_value(sample.value);
        }
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(ts.finish()),
        Arc::new(job.finish()),
        Arc::new(instance.finish()),
        Arc::new(name.finish()),
        Arc::new(labels.finish()),
        Arc::new(value.finish()),
    ];
    let batch = RecordBatch::try_new(full_columns(), columns)?;
    Ok(Decoded { batch, bad, stale })
}

/// A series's labels, split into the columns.
struct Parts<'a> {
    name: &'a str,
    job: Option<&'a str>,
    instance: Option<&'a str>,
    others: Vec<(&'a str, &'a str)>,
}

/// The labels of one series as columns, or why the series is malformed.
fn split_labels(labels: &[Label]) -> std::result::Result<Parts<'_>, String> {
    let mut name = None;
    let mut parts = Parts {
        name: "",
        job: None,
        instance: None,
        others: Vec::with_capacity(labels.len()),
    };
    for (i, label) in labels.iter().enumerate() {
        if label.name.is_empty() {
            return Err(format!(
                "a label with an empty name (value '{}')",
                label.value
            ));
        }
        if labels[..i].iter().any(|l| l.name == label.name) {
            return Err(format!("label '{}' given twice", label.name));
        }
        match label.name.as_str() {
            "__name__" => name = Some(label.value.as_str()),
            "job" => parts.job = Some(&label.value),
            "instance" => parts.instance = Some(&label.value),
            other => parts.others.push((other, &label.value)),
        }
    }
    match name {
        Some(n) if !n.is_empty() => parts.name = n,
        _ => {
            let shown: Vec<String> = labels
                .iter()
                .map(|l| format!("{}=\"{}\"", l.name, l.value))
                .collect();
            return Err(format!(
                "a series without a metric name (__name__): {{{}}}",
                shown.join(", ")
            ));
        }
    }
    Ok(parts)
}

/// How the sink turns a query's result columns into series.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesLayout {
    /// The timestamp column.
    pub time: usize,
    /// Each value column and the metric name its series get.
    pub values: Vec<(usize, String)>,
    /// Text columns, each a label of its name.
    pub labels: Vec<usize>,
    /// Map columns (`MAP<TEXT, TEXT>`), whose entries are labels.
    pub label_maps: Vec<usize>,
    /// Labels every series gets (`label_<name>` options), sorted.
    pub fixed: Vec<(String, String)>,
}

/// Timestamp columns of a window, in the order the sink prefers them
/// (`window_end` ends a window's result: its samples are stamped then).
const TIME_COLUMNS: &[&str] = &["window_end", "event_time", "ts", "time", "timestamp"];

/// Columns left out of the series (the alert rows' bookkeeping, the other
/// end of a window).
const SKIPPED: &[&str] = &["window_start", "since"];

/// Works out the series of a result schema. `time` names the timestamp
/// column (default: the first of `TIME_COLUMNS` there is, else the only
/// timestamp column); `name` is the metric name of the one value column,
/// `prefix` goes before each value column's name otherwise.
pub fn layout(
    schema: &SchemaRef,
    time: Option<&str>,
    name: Option<&str>,
    prefix: &str,
    fixed: &[(String, String)],
) -> std::result::Result<SeriesLayout, String> {
    let fields = schema.fields();
    let is_time = |i: usize| matches!(fields[i].data_type(), DataType::Timestamp(..));
    let time = match time {
        Some(wanted) => {
            let i = schema
                .index_of(wanted)
                .map_err(|_| format!("the results have no column '{wanted}' (option time)"))?;
            if !is_time(i) {
                return Err(format!(
                    "column '{wanted}' (option time) is not a TIMESTAMP"
                ));
            }
            i
        }
        None => TIME_COLUMNS
            .iter()
            .find_map(|c| schema.index_of(c).ok().filter(|&i| is_time(i)))
            .or_else(|| {
                let times: Vec<usize> = (0..fields.len()).filter(|&i| is_time(i)).collect();
                (times.len() == 1).then(|| times[0])
            })
            .ok_or_else(|| {
                "the results need a timestamp column for the samples: window_end, event_time \
                 or ts, or name one with option time"
                    .to_string()
            })?,
    };
    let mut layout = SeriesLayout {
        time,
        values: Vec::new(),
        labels: Vec::new(),
        label_maps: Vec::new(),
        fixed: fixed.to_vec(),
    };
    layout.fixed.sort();
    for (i, field) in fields.iter().enumerate() {
        if i == time || SKIPPED.contains(&field.name().as_str()) {
            continue;
        }
        match field.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => layout.labels.push(i),
            t if t.is_numeric() => layout.values.push((i, format!("{prefix}{}", field.name()))),
            t if *t == labels_type() => layout.label_maps.push(i),
            _ => {}
        }
    }
    match (name, layout.values.len()) {
        (_, 0) => {
            return Err("the results have no numeric column to write as samples".to_string());
        }
        (Some(name), 1) => layout.values[0].1 = name.to_string(),
        (Some(_), n) => {
            return Err(format!(
                "option name gives one metric name, but the results have {n} numeric columns \
                 (use metric_prefix)"
            ));
        }
        (None, _) => {}
    }
    for (_, metric) in &layout.values {
        if !valid_metric_name(metric) {
            return Err(format!(
                "'{metric}' is not a valid Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)"
            ));
        }
    }
    Ok(layout)
}

/// Prometheus's metric-name rule.
fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// The write request of one result batch: a series per row and value
/// column, a row's samples sharing its timestamp. NULL values and rows
/// without a timestamp write no sample; samples of the same series are
/// grouped into one series, in row order.
pub fn batch_request(batch: &RecordBatch, layout: &SeriesLayout) -> Result<WriteRequest> {
    let time = datafusion::arrow::compute::cast(
        batch.column(layout.time),
        &DataType::Timestamp(TimeUnit::Millisecond, None),
    )?;
    let time = time.as_primitive::<datafusion::arrow::datatypes::TimestampMillisecondType>();
    let values: Vec<(ArrayRef, &str)> = layout
        .values
        .iter()
        .map(|(i, metric)| {
            let column = datafusion::arrow::compute::cast(batch.column(*i), &DataType::Float64)?;
            Ok((column, metric.as_str()))
        })
        .collect::<Result<_>>()?;
    let texts: Vec<(ArrayRef, &str)> = layout
        .labels
        .iter()
        .map(|&i| {
            let column = datafusion::arrow::compute::cast(batch.column(i), &DataType::Utf8)?;
            Ok((column, batch.schema_ref().field(i).name().as_str()))
        })
        .collect::<Result<_>>()?;
    let maps: Vec<&MapArray> = layout
        .label_maps
        .iter()
        .filter_map(|&i| batch.column(i).as_map_opt())
        .collect();
    let mut series: Vec<TimeSeries> = Vec::new();
    let mut index: HashMap<Vec<Label>, usize> = HashMap::new();
    for row in 0..batch.num_rows() {
        if time.is_null(row) {
            continue;
        }
        let row_labels = row_labels(row, &texts, &maps, &layout.fixed);
        for (column, metric) in &values {
            if column.is_null(row) {
                continue;
            }
            let value = column.as_primitive::<Float64Type>().value(row);
            let mut labels = row_labels.clone();
            labels.push(Label {
                name: "__name__".into(),
                value: (*metric).to_string(),
            });
            labels.sort_by(|a, b| a.name.cmp(&b.name));
            let at = *index.entry(labels.clone()).or_insert_with(|| {
                series.push(TimeSeries {
                    labels,
                    samples: Vec::new(),
                });
                series.len() - 1
            });
            series[at].samples.push(Sample {
                value,
                timestamp: time.value(row),
            });
        }
    }
    Ok(WriteRequest { timeseries: series })
}

/// The labels of one row, `__name__` aside: fixed ones, then map entries,
/// then text columns (a later one replaces an earlier of the same name).
/// Empty values are left out, as Prometheus treats them as absent.
fn row_labels(
    row: usize,
    texts: &[(ArrayRef, &str)],
    maps: &[&MapArray],
    fixed: &[(String, String)],
) -> Vec<Label> {
    let mut labels: Vec<Label> = Vec::new();
    let mut put = |name: &str, value: &str| {
        if value.is_empty() || name == "__name__" {
            return;
        }
        match labels.iter_mut().find(|l| l.name == name) {
            Some(label) => label.value = value.to_string(),
            None => labels.push(Label {
                name: name.to_string(),
                value: value.to_string(),
            }),
        }
    };
    for (name, value) in fixed {
        put(name, value);
    }
    for map in maps {
        if map.is_null(row) {
            continue;
        }
        let entries = map.value(row);
        let keys = entries.column(0).as_string::<i32>();
        let values = entries.column(1).as_string::<i32>();
        for j in 0..entries.len() {
            if values.is_valid(j) {
                put(keys.value(j), values.value(j));
            }
        }
    }
    for (column, name) in texts {
        if column.is_valid(row) {
            put(name, column.as_string::<i32>().value(row));
        }
    }
    labels
}

/// `connector = 'remote_write'` in `CREATE STREAM`: samples posted to
/// `vigil serve`'s `POST /api/v1/write`.
pub struct RemoteWriteSource;

impl SourceConnector for RemoteWriteSource {
    fn name(&self) -> &'static str {
        "remote_write"
    }
    fn summary(&self) -> &'static str {
        "samples Prometheus remote-writes to `vigil serve` (POST /api/v1/write)"
    }
    fn options(&self) -> &'static [OptionSpec] {
        &[]
    }
    fn columns(&self) -> Columns {
        Columns::Catalogue(COLUMNS.as_slice())
    }
    fn configure(&self, decl: &StreamDecl<'_>, _: &Options<'_>) -> Result<SourceConfig> {
        Ok(push_config(decl, "remote_write"))
    }
}

/// Option keys starting with this add a label to every series.
const LABEL_PREFIX: &str = "label_";

const SINK_OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "url",
        ty: OptionType::Url,
        default: None,
        accepted: "an http:// or https:// URL such as 'http://127.0.0.1:9090/api/v1/write'",
        doc: "the remote-write receiver (required)",
    },
    OptionSpec {
        name: "name",
        ty: OptionType::Text,
        default: None,
        accepted: "a Prometheus metric name such as 'cpu_avg'",
        doc: "the metric name of the results' one numeric column",
    },
    OptionSpec {
        name: "metric_prefix",
        ty: OptionType::Text,
        default: Some(""),
        accepted: "text that starts a Prometheus metric name, such as 'vigil_'",
        doc: "put before each numeric column's name to name its series",
    },
    OptionSpec {
        name: "time",
        ty: OptionType::Text,
        default: None,
        accepted: "the name of a TIMESTAMP column of the results",
        doc: "the samples' timestamp column (default window_end, event_time or ts)",
    },
    OptionSpec {
        name: LABEL_PREFIX,
        ty: OptionType::Prefix,
        default: None,
        accepted: "a label value",
        doc: "a label every series gets (`label_job = 'vigil'`)",
    },
    http::RETRIES,
    http::BACKOFF,
    http::TIMEOUT,
    http::HEADERS,
    APPEND_ONLY,
];

/// Headers the sink sets for the protocol.
const PROTOCOL_HEADERS: &[(&str, &str)] = &[
    ("content-type", "application/x-protobuf"),
    ("content-encoding", "snappy"),
    ("x-prometheus-remote-write-version", PROTOCOL_VERSION),
];

/// `connector = 'remote_write'` in `CREATE SINK`: results written as
/// samples to a remote-write receiver.
pub struct RemoteWriteSink;

impl SinkConnector for RemoteWriteSink {
    fn name(&self) -> &'static str {
        "remote_write"
    }
    fn summary(&self) -> &'static str {
        "results as Prometheus samples, remote-written (protobuf, snappy) with the webhook's retries"
    }
    fn options(&self) -> &'static [OptionSpec] {
        SINK_OPTIONS
    }
    fn configure(&self, name: &str, opts: &Options<'_>, _: &Path) -> Result<SinkConfig> {
        let mut delivery = http::delivery_config(name, "remote_write", opts)?;
        if let Some((header, _)) = delivery
            .headers
            .iter()
            .find(|(h, _)| PROTOCOL_HEADERS.iter().any(|(p, _)| p == h))
        {
            return Err(Error::Plan(format!(
                "sink {name}: header '{header}' is set by the remote_write sink itself"
            )));
        }
        delivery.headers.extend(
            PROTOCOL_HEADERS
                .iter()
                .map(|(h, v)| (h.to_string(), v.to_string())),
        );
        let metric_name = opts.text("name").map(str::to_string);
        if let Some(n) = &metric_name
            && !valid_metric_name(n)
        {
            return Err(opts.bad_value("name", n));
        }
        let prefix = opts.text("metric_prefix").unwrap_or("").to_string();
        if !prefix.is_empty() && !valid_metric_name(&prefix) {
            return Err(opts.bad_value("metric_prefix", &prefix));
        }
        let mut labels = Vec::new();
        for (label, value) in opts.prefixed(LABEL_PREFIX) {
            if !valid_label_name(label) {
                return Err(Error::Plan(format!(
                    "sink {name}: option '{LABEL_PREFIX}{label}': '{label}' is not a valid \
                     Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not __name__)"
                )));
            }
            labels.push((label.to_string(), value.to_string()));
        }
        let target = RemoteWriteTarget {
            delivery,
            name: metric_name,
            prefix,
            time: opts.text("time").map(str::to_string),
            labels,
        };
        Ok(SinkConfig {
            name: name.to_string(),
            target: SinkTarget::Connector(Opener(Arc::new(target))),
            format: OutputFormat::Jsonl,
            append_only: opts.flag("append_only")?,
        })
    }
}

/// A configured `remote_write` sink.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteWriteTarget {
    /// Where and how requests are delivered (the webhook sink's delivery).
    pub delivery: WebhookConfig,
    /// `name`: the metric name of the one value column.
    pub name: Option<String>,
    /// `metric_prefix`.
    pub prefix: String,
    /// `time`: the timestamp column.
    pub time: Option<String>,
    /// `label_<name>` options.
    pub labels: Vec<(String, String)>,
}

impl SinkOpen for RemoteWriteTarget {
    /// Only scheme, host and path, as for webhooks.
    fn describe(&self) -> String {
        match url::Url::parse(&self.delivery.url) {
            Ok(url) => format!(
                "remote_write {}://{}{}",
                url.scheme(),
                url.host_str().unwrap_or(""),
                url.path()
            ),
            Err(_) => "remote_write".to_string(),
        }
    }

    fn open(&self, name: &str, schema: &SchemaRef) -> Result<Box<dyn Sink>> {
        let layout = layout(
            schema,
            self.time.as_deref(),
            self.name.as_deref(),
            &self.prefix,
            &self.labels,
        )
        .map_err(|why| Error::Plan(format!("sink {name}: {why}")))?;
        let render = move |batch: &RecordBatch| {
            let request = batch_request(batch, &layout)?;
            if request.timeseries.is_empty() {
                return Ok(None);
            }
            encode_request(&request).map(Some)
        };
        Ok(Box::new(WebhookSink::open_rendering(
            name,
            &self.delivery,
            Box::new(render),
        )?))
    }
}

/// Prometheus's label-name rule; `__name__` is the sink's own.
fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    name != "__name__"
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Float64Array, StringArray, TimestampMillisecondArray};
    use datafusion::arrow::datatypes::{Field, Schema};

    use super::*;

    fn series(labels: &[(&str, &str)], samples: &[(f64, i64)]) -> TimeSeries {
        TimeSeries {
            labels: labels
                .iter()
                .map(|(n, v)| Label {
                    name: n.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            samples: samples
                .iter()
                .map(|&(value, timestamp)| Sample { value, timestamp })
                .collect(),
        }
    }

    #[test]
    fn a_request_round_trips_through_snappy_and_protobuf() {
        let request = WriteRequest {
            timeseries: vec![series(&[("__name__", "up"), ("job", "node")], &[(1.0, 5)])],
        };
        let body = encode_request(&request).unwrap();
        assert_eq!(decode_request(&body, 1 << 20).unwrap(), request);
        let e = decode_request(&body, 3).unwrap_err();
        assert!(e.contains("more than the 3"), "{e}");
        let e = decode_request(b"not snappy at all", 1 << 20).unwrap_err();
        assert!(e.contains("snappy") || e.contains("WriteRequest"), "{e}");
        let garbage = snap::raw::Encoder::new().compress_vec(&[0xff; 9]).unwrap();
        let e = decode_request(&garbage, 1 << 20).unwrap_err();
        assert!(e.contains("not a prometheus.WriteRequest"), "{e}");
    }

    #[test]
    fn samples_become_rows_with_their_labels_split() {
        let request = WriteRequest {
            timeseries: vec![
                series(
                    &[
                        ("__name__", "node_load1"),
                        ("instance", "h:9100"),
                        ("job", "node"),
                        ("zone", "a"),
                    ],
                    &[
                        (0.5, 1000),
                        (f64::from_bits(STALE_NAN), 2000),
                        (f64::NAN, 3000),
                    ],
                ),
                series(&[("job", "node")], &[(1.0, 1000), (2.0, 2000)]),
                series(&[("__name__", "x"), ("", "v")], &[(1.0, 1000)]),
                series(&[("__name__", "up")], &[(1.0, 4000)]),
            ],
        };
        let d = samples_batch(&request).unwrap();
        assert_eq!(d.stale, 1);
        assert_eq!(d.batch.num_rows(), 3);
        assert_eq!(d.bad.len(), 3);
        assert_eq!(d.bad[0].line, 2);
        assert!(
            d.bad[0].reason.contains("without a metric name"),
            "{:?}",
            d.bad
        );
        assert!(d.bad[2].reason.contains("empty name"), "{:?}", d.bad);
        let b = &d.batch;
        let ts = b
            .column(0)
            .as_any()
            .downcast_ref::<TimestampMillisecondArray>()
            .unwrap();
        assert_eq!(ts.values(), &[1000, 3000, 4000]);
        let job = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(job.value(0), "node");
        assert!(job.is_null(2));
        let name = b.column(3).as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(name.value(0), "node_load1");
        let labels = b.column(4).as_map();
        assert_eq!(labels.value_length(0), 1);
        assert_eq!(
            labels.value(0).column(0).as_string::<i32>().value(0),
            "zone"
        );
        let value = b.column(5).as_any().downcast_ref::<Float64Array>().unwrap();
        assert!(value.value(1).is_nan());
    }

    fn result_schema() -> SchemaRef {
        let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
        Arc::new(Schema::new(vec![
            Field::new("window_start", ts.clone(), true),
            Field::new("window_end", ts, true),
            Field::new("host", DataType::Utf8, true),
            Field::new("avg_cpu", DataType::Float64, true),
            Field::new("n", DataType::Int64, true),
        ]))
    }

    #[test]
    fn the_layout_takes_window_end_text_labels_and_numeric_values() {
        let fixed = vec![("job".to_string(), "vigil".to_string())];
        let l = layout(&result_schema(), None, None, "vigil_", &fixed).unwrap();
        assert_eq!(l.time, 1);
        assert_eq!(l.labels, vec![2]);
        assert_eq!(
            l.values,
            vec![(3, "vigil_avg_cpu".to_string()), (4, "vigil_n".to_string())]
        );
        let e = layout(&result_schema(), None, Some("cpu"), "", &[]).unwrap_err();
        assert!(e.contains("2 numeric columns"), "{e}");
        let e = layout(&result_schema(), Some("host"), None, "", &[]).unwrap_err();
        assert!(e.contains("not a TIMESTAMP"), "{e}");
        let e = layout(&result_schema(), None, None, "9", &[]).unwrap_err();
        assert!(e.contains("not a valid Prometheus metric name"), "{e}");
        let text_only = Arc::new(Schema::new(vec![Field::new("h", DataType::Utf8, true)]));
        let e = layout(&text_only, None, None, "", &[]).unwrap_err();
        assert!(e.contains("timestamp column"), "{e}");
    }

    #[test]
    fn a_batch_becomes_one_series_per_row_key_and_value_column() {
        let schema = result_schema();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(TimestampMillisecondArray::from(vec![0, 0, 10_000])),
                Arc::new(TimestampMillisecondArray::from(vec![
                    10_000, 10_000, 20_000,
                ])),
                Arc::new(StringArray::from(vec![Some("a"), Some("b"), Some("a")])),
                Arc::new(Float64Array::from(vec![Some(1.5), None, Some(2.5)])),
                Arc::new(datafusion::arrow::array::Int64Array::from(vec![3, 4, 5])),
            ],
        )
        .unwrap();
        let fixed = vec![("job".to_string(), "vigil".to_string())];
        let l = layout(&schema, None, None, "", &fixed).unwrap();
        let request = batch_request(&batch, &l).unwrap();
        // avg_cpu{host=a} (two samples), n{host=a} (two), n{host=b}; the NULL
        // avg_cpu of b writes nothing.
        assert_eq!(request.timeseries.len(), 3);
        let first = &request.timeseries[0];
        let names: Vec<(&str, &str)> = first
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![("__name__", "avg_cpu"), ("host", "a"), ("job", "vigil")]
        );
        assert_eq!(
            first.samples,
            vec![
                Sample {
                    value: 1.5,
                    timestamp: 10_000
                },
                Sample {
                    value: 2.5,
                    timestamp: 20_000
                }
            ]
        );
        assert_eq!(request.timeseries[2].samples.len(), 1);
        assert_eq!(request.timeseries[2].samples[0].value, 4.0);
    }

    fn sink(kv: &[(&str, &str)]) -> Result<SinkConfig> {
        let mut all = vec![("connector".to_string(), "remote_write".to_string())];
        all.extend(kv.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        SinkConfig::from_options("rec", &all, Path::new("/base"))
    }

    fn target(config: SinkConfig) -> String {
        match config.target {
            SinkTarget::Connector(opener) => format!("{opener:?}"),
            other => panic!("not a connector sink: {other:?}"),
        }
    }

    #[test]
    fn sink_options_are_checked_and_the_protocol_headers_set() {
        let url = ("url", "http://127.0.0.1:9090/api/v1/write");
        let config = sink(&[url, ("metric_prefix", "vigil_"), ("label_job", "vigil")]).unwrap();
        let shown = target(config);
        assert!(
            shown.contains("x-prometheus-remote-write-version"),
            "{shown}"
        );
        assert!(shown.contains("\"snappy\""), "{shown}");
        assert!(shown.contains("\"job\", \"vigil\""), "{shown}");
        let err = |kv: &[(&str, &str)]| sink(kv).unwrap_err().to_string();
        assert!(err(&[]).contains("needs a 'url' option"));
        assert!(err(&[url, ("name", "1x")]).contains("option 'name'"));
        assert!(err(&[url, ("metric_prefix", "a-b")]).contains("option 'metric_prefix'"));
        let e = err(&[url, ("label___name__", "x")]);
        assert!(e.contains("not a valid Prometheus label name"), "{e}");
        let e = err(&[url, ("header_content_encoding", "gzip")]);
        assert!(e.contains("set by the remote_write sink"), "{e}");
        assert!(err(&[url, ("path", "x")]).contains("path"));
    }

    #[test]
    fn a_sink_over_results_without_numbers_does_not_open() {
        let config = sink(&[("url", "http://127.0.0.1:1/api/v1/write")]).unwrap();
        let SinkTarget::Connector(opener) = config.target else {
            panic!("not a connector sink");
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
            Field::new("host", DataType::Utf8, true),
        ]));
        let e = opener.0.open("rec", &schema).err().unwrap().to_string();
        assert!(
            e.contains("sink rec: the results have no numeric column"),
            "{e}"
        );
    }
}
