//! The `otlp` source: OpenTelemetry metrics posted to `vigil serve`'s
//! `POST /v1/metrics` (OTLP/HTTP, protobuf or JSON), one row per number,
//! with the columns of [`COLUMNS`].
//!
//! The messages are `opentelemetry-proto`'s. Gauges and sums give one row
//! per data point; histograms and summaries are flattened as Prometheus
//! flattens them, so the same alerts work over either source: a histogram
//! point becomes `NAME_bucket` rows (one per bucket, `le` among the
//! attributes, the count cumulative, `+Inf` last), `NAME_sum` (when the
//! point has a sum) and `NAME_count`; a summary point becomes `NAME` rows
//! with a `quantile` attribute, `NAME_sum` and `NAME_count`.
//!
//! A data point that cannot be a row is rejected: counted on the stream as
//! a bad row and in the answer's `partialSuccess.rejectedDataPoints`, the
//! rest of the request kept. Rejected are: a number point without a value,
//! a point without a time, a histogram whose bucket counts do not match its
//! bounds, a metric without a name, and exponential histograms (not
//! supported: they have no Prometheus-style flattening). A point flagged
//! "no recorded value" (the OTLP staleness marker) is skipped, not
//! rejected. A bad row's `line` is the point's position in the request
//! (1-based, counting every data point of every metric).

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, StringBuilder, TimestampMillisecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, HistogramDataPoint, Metric, NumberDataPoint, SummaryDataPoint,
    metric::Data, number_data_point,
};

use super::catalogue::{CatalogueColumn, full_schema};
use super::common::push_config;
use super::options::Options;
use super::{BadRow, SourceConfig};
use crate::connector::{Columns, OptionSpec, SourceConnector, StreamDecl};
use crate::error::Result;
use crate::types::{LabelsBuilder, labels_type};

/// The columns an `otlp` stream can declare.
pub static COLUMNS: LazyLock<Vec<CatalogueColumn>> = LazyLock::new(|| {
    let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
    let column = |name, data_type, meaning| CatalogueColumn {
        name,
        data_type,
        meaning,
    };
    vec![
        column("ts", ts.clone(), "the point's time (time_unix_nano)"),
        column(
            "start_ts",
            ts,
            "the start of a sum's or histogram's interval (NULL when not given)",
        ),
        column(
            "job",
            DataType::Utf8,
            "service.namespace/service.name of the resource, as Prometheus names the job",
        ),
        column(
            "instance",
            DataType::Utf8,
            "service.instance.id of the resource (NULL without one)",
        ),
        column(
            "name",
            DataType::Utf8,
            "the metric name; _bucket, _sum, _count for histograms and summaries",
        ),
        column("kind", DataType::Utf8, "gauge, sum, histogram or summary"),
        column(
            "temporality",
            DataType::Utf8,
            "cumulative or delta for sums and histograms, NULL for gauges and summaries",
        ),
        column(
            "monotonic",
            DataType::Boolean,
            "whether a sum only goes up (a counter); NULL but for sums",
        ),
        column(
            "unit",
            DataType::Utf8,
            "the metric's unit, e.g. 'By' or 's'",
        ),
        column("resource", labels_type(), "the resource's attributes"),
        column("scope", DataType::Utf8, "the instrumentation scope's name"),
        column(
            "attributes",
            labels_type(),
            "the point's attributes (with le or quantile for buckets and quantiles)",
        ),
        column("value", DataType::Float64, "the number"),
    ]
});

/// The schema with every column of [`COLUMNS`]: what [`points_batch`]
/// builds.
pub fn full_columns() -> SchemaRef {
    full_schema(&COLUMNS)
}

/// How a request body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `application/x-protobuf`.
    Protobuf,
    /// `application/json` (OTLP's JSON mapping).
    Json,
}

/// Decodes an `ExportMetricsServiceRequest`, or says why it is not one.
pub fn decode_request(
    body: &[u8],
    encoding: Encoding,
) -> std::result::Result<ExportMetricsServiceRequest, String> {
    match encoding {
        Encoding::Protobuf => <ExportMetricsServiceRequest as prost::Message>::decode(body)
            .map_err(|e| format!("the body is not an OTLP ExportMetricsServiceRequest: {e}")),
        Encoding::Json => serde_json::from_slice(body)
            .map_err(|e| format!("the body is not an OTLP ExportMetricsServiceRequest: {e}")),
    }
}

/// What a request came to as rows.
#[derive(Debug)]
pub struct Decoded {
    /// The rows, with the columns of [`full_columns`].
    pub batch: RecordBatch,
    /// One per rejected data point.
    pub bad: Vec<BadRow>,
}

/// The rows of `request`: see the [module docs](self).
pub fn points_batch(request: &ExportMetricsServiceRequest) -> Result<Decoded> {
    let mut rows = Rows::default();
    let mut point = 0u64;
    for resource_metrics in &request.resource_metrics {
        let attributes = resource_metrics
            .resource
            .as_ref()
            .map_or(&[][..], |r| &r.attributes[..]);
        let resource = Resource::new(attributes);
        for scope_metrics in &resource_metrics.scope_metrics {
            let scope = scope_metrics.scope.as_ref().map_or("", |s| s.name.as_str());
            for metric in &scope_metrics.metrics {
                let at = Context {
                    resource: &resource,
                    scope,
                    metric,
                };
                rows.metric(&at, &mut point);
            }
        }
    }
    let (batch, bad) = rows.finish()?;
    Ok(Decoded { batch, bad })
}

/// A resource's attributes, rendered once for all its points.
struct Resource {
    attributes: Vec<(String, String)>,
    job: Option<String>,
    instance: Option<String>,
}

impl Resource {
    fn new(attributes: &[KeyValue]) -> Resource {
        let attributes = render_attributes(attributes);
        let get = |key: &str| {
            attributes
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let job = match (get("service.namespace"), get("service.name")) {
            (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
            (None, name) => name,
            (Some(_), None) => None,
        };
        Resource {
            job,
            instance: get("service.instance.id"),
            attributes,
        }
    }
}

/// Where a point comes from.
struct Context<'a> {
    resource: &'a Resource,
    scope: &'a str,
    metric: &'a Metric,
}

/// The columns being built.
struct Rows {
    ts: TimestampMillisecondBuilder,
    start_ts: TimestampMillisecondBuilder,
    job: StringBuilder,
    instance: StringBuilder,
    name: StringBuilder,
    kind: StringBuilder,
    temporality: StringBuilder,
    monotonic: BooleanBuilder,
    unit: StringBuilder,
    resource: LabelsBuilder,
    scope: StringBuilder,
    attributes: LabelsBuilder,
    value: Float64Builder,
    bad: Vec<BadRow>,
}

impl Default for Rows {
    fn default() -> Self {
        Rows {
            ts: TimestampMillisecondBuilder::new(),
            start_ts: TimestampMillisecondBuilder::new(),
            job: StringBuilder::new(),
            instance: StringBuilder::new(),
            name: StringBuilder::new(),
            kind: StringBuilder::new(),
            temporality: StringBuilder::new(),
            monotonic: BooleanBuilder::new(),
            unit: StringBuilder::new(),
            resource: LabelsBuilder::default(),
            scope: StringBuilder::new(),
            attributes: LabelsBuilder::default(),
            value: Float64Builder::new(),
            bad: Vec::new(),
        }
    }
}

/// What one row says besides its context.
struct Row<'a> {
    time: u64,
    start: u64,
    name: &'a str,
    kind: &'static str,
    temporality: Option<&'static str>,
    monotonic: Option<bool>,
    attributes: &'a [(String, String)],
    value: f64,
}

/// What the rows a histogram or summary point flattens into share.
struct Flattened {
    time: u64,
    start: u64,
    kind: &'static str,
    temporality: Option<&'static str>,
    /// `le` for buckets, `quantile` for quantiles.
    label: &'static str,
}

/// The flag of a point that carries no value (OTLP's staleness marker).
const NO_RECORDED_VALUE: u32 = 1;

fn temporality(code: i32) -> Option<&'static str> {
    match AggregationTemporality::try_from(code) {
        Ok(AggregationTemporality::Cumulative) => Some("cumulative"),
        Ok(AggregationTemporality::Delta) => Some("delta"),
        _ => None,
    }
}

impl Rows {
    /// Adds the rows of one metric's points; `point` counts the points.
    fn metric(&mut self, at: &Context<'_>, point: &mut u64) {
        let metric = at.metric;
        let Some(data) = &metric.data else {
            return;
        };
        let points = match data {
            Data::Gauge(g) => g.data_points.len(),
            Data::Sum(s) => s.data_points.len(),
            Data::Histogram(h) => h.data_points.len(),
            Data::ExponentialHistogram(h) => h.data_points.len(),
            Data::Summary(s) => s.data_points.len(),
        };
        let why = if metric.name.is_empty() {
            Some("a metric without a name".to_string())
        } else if matches!(data, Data::ExponentialHistogram(_)) {
            Some(format!(
                "metric {}: exponential histograms are not supported (configure the sender \
                 for explicit-bucket histograms)",
                metric.name
            ))
        } else {
            None
        };
        if let Some(why) = why {
            for _ in 0..points {
                *point += 1;
                self.reject(*point, why.clone());
            }
            return;
        }
        match data {
            Data::Gauge(g) => {
                for p in &g.data_points {
                    *point += 1;
                    self.number(at, *point, p, "gauge", None, None);
                }
            }
            Data::Sum(s) => {
                for p in &s.data_points {
                    *point += 1;
                    let t = temporality(s.aggregation_temporality);
                    self.number(at, *point, p, "sum", t, Some(s.is_monotonic));
                }
            }
            Data::Histogram(h) => {
                for p in &h.data_points {
                    *point += 1;
                    self.histogram(at, *point, p, temporality(h.aggregation_temporality));
                }
            }
            Data::Summary(s) => {
                for p in &s.data_points {
                    *point += 1;
                    self.summary(at, *point, p);
                }
            }
            Data::ExponentialHistogram(_) => {}
        }
    }

    fn reject(&mut self, point: u64, reason: String) {
        self.bad.push(BadRow {
            line: point,
            reason,
        });
    }

    /// The rejection of a point without a time, if it has none.
    fn check_time(&mut self, at: &Context<'_>, point: u64, time: u64) -> bool {
        if time == 0 {
            let why = format!("metric {}: a data point without a time", at.metric.name);
            self.reject(point, why);
            return false;
        }
        true
    }

    fn number(
        &mut self,
        at: &Context<'_>,
        point: u64,
        p: &NumberDataPoint,
        kind: &'static str,
        temporality: Option<&'static str>,
        monotonic: Option<bool>,
    ) {
        if p.flags & NO_RECORDED_VALUE != 0 || !self.check_time(at, point, p.time_unix_nano) {
            return;
        }
        let value = match p.value {
            Some(number_data_point::Value::AsDouble(v)) => v,
            Some(number_data_point::Value::AsInt(v)) => v as f64,
            None => {
                let why = format!("metric {}: a data point without a value", at.metric.name);
                return self.reject(point, why);
            }
        };
        let attributes = render_attributes(&p.attributes);
        self.push(
            at,
            &Row {
                time: p.time_unix_nano,
                start: p.start_time_unix_nano,
                name: &at.metric.name,
                kind,
                temporality,
                monotonic,
                attributes: &attributes,
                value,
            },
        );
    }

    fn histogram(
        &mut self,
        at: &Context<'_>,
        point: u64,
        p: &HistogramDataPoint,
        temporality: Option<&'static str>,
    ) {
        if p.flags & NO_RECORDED_VALUE != 0 || !self.check_time(at, point, p.time_unix_nano) {
            return;
        }
        let buckets = p.bucket_counts.len();
        if buckets != 0 && buckets != p.explicit_bounds.len() + 1 {
            let why = format!(
                "metric {}: {buckets} bucket counts for {} bounds (there must be one more count \
                 than bounds)",
                at.metric.name,
                p.explicit_bounds.len()
            );
            return self.reject(point, why);
        }
        let attributes = render_attributes(&p.attributes);
        let name = &at.metric.name;
        let mut cumulative = 0u64;
        let mut series: Vec<(String, f64, Option<String>)> = Vec::new();
        for (i, count) in p.bucket_counts.iter().enumerate() {
            cumulative = cumulative.saturating_add(*count);
            let le = p
                .explicit_bounds
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| format_bound(*b));
            series.push((format!("{name}_bucket"), cumulative as f64, Some(le)));
        }
        if let Some(sum) = p.sum {
            series.push((format!("{name}_sum"), sum, None));
        }
        series.push((format!("{name}_count"), p.count as f64, None));
        let rows = Flattened {
            time: p.time_unix_nano,
            start: p.start_time_unix_nano,
            kind: "histogram",
            temporality,
            label: "le",
        };
        self.push_flattened(at, &rows, &attributes, series);
    }

    fn summary(&mut self, at: &Context<'_>, point: u64, p: &SummaryDataPoint) {
        if p.flags & NO_RECORDED_VALUE != 0 || !self.check_time(at, point, p.time_unix_nano) {
            return;
        }
        let attributes = render_attributes(&p.attributes);
        let name = &at.metric.name;
        let mut series: Vec<(String, f64, Option<String>)> = p
            .quantile_values
            .iter()
            .map(|q| (name.clone(), q.value, Some(format_bound(q.quantile))))
            .collect();
        series.push((format!("{name}_sum"), p.sum, None));
        series.push((format!("{name}_count"), p.count as f64, None));
        let rows = Flattened {
            time: p.time_unix_nano,
            start: p.start_time_unix_nano,
            kind: "summary",
            temporality: None,
            label: "quantile",
        };
        self.push_flattened(at, &rows, &attributes, series);
    }

    /// Pushes the rows one histogram or summary point flattens into, as
    /// Prometheus names them: `series` holds each row's name, value and,
    /// for buckets and quantiles, the value of `rows.label`, which
    /// replaces an attribute of that name.
    fn push_flattened(
        &mut self,
        at: &Context<'_>,
        rows: &Flattened,
        attributes: &[(String, String)],
        series: Vec<(String, f64, Option<String>)>,
    ) {
        for (row_name, value, bound) in series {
            let mut attrs = attributes.to_vec();
            if let Some(bound) = bound {
                attrs.retain(|(k, _)| k != rows.label);
                attrs.push((rows.label.to_string(), bound));
            }
            self.push(
                at,
                &Row {
                    time: rows.time,
                    start: rows.start,
                    name: &row_name,
                    kind: rows.kind,
                    temporality: rows.temporality,
                    monotonic: None,
                    attributes: &attrs,
                    value,
                },
            );
        }
    }

    fn push(&mut self, at: &Context<'_>, row: &Row<'_>) {
        let ms = |nanos: u64| (nanos / 1_000_000).min(i64::MAX as u64) as i64;
        self.ts.append_value(ms(row.time));
        self.start_ts
            .append_option((row.start != 0).then(|| ms(row.start)));
        self.job.append_option(at.resource.job.as_deref());
        self.instance.append_option(at.resource.instance.as_deref());
        self.name.append_value(row.name);
        self.kind.append_value(row.kind);
        self.temporality.append_option(row.temporality);
        self.monotonic.append_option(row.monotonic);
        self.unit.append_value(&at.metric.unit);
        self.resource.append(
            at.resource
                .attributes
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        );
        self.scope.append_value(at.scope);
        self.attributes
            .append(row.attributes.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        self.value.append_value(row.value);
    }

    fn finish(self) -> Result<(RecordBatch, Vec<BadRow>)> {
        let rows = self;
        let columns: Vec<ArrayRef> = vec![
            Arc::new({ rows.ts }.finish()),
            Arc::new({ rows.start_ts }.finish()),
            Arc::new({ rows.job }.finish()),
            Arc::new({ rows.instance }.finish()),
            Arc::new({ rows.name }.finish()),
            Arc::new({ rows.kind }.finish()),
            Arc::new({ rows.temporality }.finish()),
            Arc::new({ rows.monotonic }.finish()),
            Arc::new({ rows.unit }.finish()),
            Arc::new(rows.resource.finish()),
            Arc::new({ rows.scope }.finish()),
            Arc::new(rows.attributes.finish()),
            Arc::new({ rows.value }.finish()),
        ];
        Ok((RecordBatch::try_new(full_columns(), columns)?, rows.bad))
    }
}

/// A bucket bound or quantile as Prometheus writes it: `0.5`, `+Inf`.
fn format_bound(b: f64) -> String {
    if b == f64::INFINITY {
        "+Inf".into()
    } else if b == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        b.to_string()
    }
}

/// Attributes as text pairs, in the order sent (a repeated key keeps its
/// last value).
fn render_attributes(attributes: &[KeyValue]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::with_capacity(attributes.len());
    for kv in attributes {
        let value = kv.value.as_ref().map(render_value).unwrap_or_default();
        match out.iter_mut().find(|(k, _)| *k == kv.key) {
            Some(slot) => slot.1 = value,
            None => out.push((kv.key.clone(), value)),
        }
    }
    out
}

/// An attribute value as text: strings as they are, numbers and booleans
/// as written, bytes in hex, arrays and key-value lists as JSON.
fn render_value(value: &AnyValue) -> String {
    use any_value::Value as V;
    match &value.value {
        None => String::new(),
        Some(V::StringValue(s)) => s.clone(),
        Some(V::BoolValue(b)) => b.to_string(),
        Some(V::IntValue(i)) => i.to_string(),
        Some(V::DoubleValue(d)) => d.to_string(),
        Some(V::BytesValue(b)) => b.iter().map(|x| format!("{x:02x}")).collect(),
        Some(V::StringValueStrindex(i)) => i.to_string(),
        Some(V::ArrayValue(_) | V::KvlistValue(_)) => json_value(value).to_string(),
    }
}

fn json_value(value: &AnyValue) -> serde_json::Value {
    use any_value::Value as V;
    match &value.value {
        None => serde_json::Value::Null,
        Some(V::StringValue(s)) => s.clone().into(),
        Some(V::BoolValue(b)) => (*b).into(),
        Some(V::IntValue(i)) => (*i).into(),
        Some(V::DoubleValue(d)) => (*d).into(),
        Some(V::ArrayValue(a)) => a.values.iter().map(json_value).collect(),
        Some(V::KvlistValue(l)) => l
            .values
            .iter()
            .map(|kv| {
                let v = kv
                    .value
                    .as_ref()
                    .map_or(serde_json::Value::Null, json_value);
                (kv.key.clone(), v)
            })
            .collect::<serde_json::Map<_, _>>()
            .into(),
        Some(V::BytesValue(_) | V::StringValueStrindex(_)) => render_value(value).into(),
    }
}

/// `connector = 'otlp'` in `CREATE STREAM`.
pub struct OtlpSource;

impl SourceConnector for OtlpSource {
    fn name(&self) -> &'static str {
        "otlp"
    }
    fn summary(&self) -> &'static str {
        "OpenTelemetry metrics posted to `vigil serve` (OTLP/HTTP POST /v1/metrics)"
    }
    fn options(&self) -> &'static [OptionSpec] {
        &[]
    }
    fn columns(&self) -> Columns {
        Columns::Catalogue(COLUMNS.as_slice())
    }
    fn configure(&self, decl: &StreamDecl<'_>, _: &Options<'_>) -> Result<SourceConfig> {
        Ok(push_config(decl, "otlp"))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::Float64Type;

    use super::*;

    /// A request as the OpenTelemetry SDKs write it in JSON: a gauge, a
    /// monotonic sum, a histogram, a point without a value and an
    /// exponential histogram.
    const REQUEST: &str = r#"{"resourceMetrics":[{
      "resource":{"attributes":[
        {"key":"service.name","value":{"stringValue":"shop"}},
        {"key":"service.instance.id","value":{"stringValue":"pod-1"}}]},
      "scopeMetrics":[{"scope":{"name":"meter"},"metrics":[
        {"name":"queue_depth","unit":"1","gauge":{"dataPoints":[
          {"attributes":[{"key":"queue","value":{"stringValue":"q1"}}],
           "timeUnixNano":"1700000000000000000","asInt":"7"}]}},
        {"name":"requests","sum":{"aggregationTemporality":2,"isMonotonic":true,"dataPoints":[
          {"startTimeUnixNano":"1699999990000000000","timeUnixNano":"1700000000000000000","asDouble":12.5},
          {"timeUnixNano":"1700000000000000000"}]}},
        {"name":"latency","unit":"s","histogram":{"aggregationTemporality":2,"dataPoints":[
          {"timeUnixNano":"1700000000000000000","count":"3","sum":0.7,
           "bucketCounts":["1","2","0"],"explicitBounds":[0.1,0.5]}]}},
        {"name":"sizes","exponentialHistogram":{"dataPoints":[
          {"timeUnixNano":"1700000000000000000","count":"1"}]}}
      ]}]}]}"#;

    #[test]
    fn json_points_become_prometheus_style_rows() {
        let request = decode_request(REQUEST.as_bytes(), Encoding::Json).unwrap();
        let d = points_batch(&request).unwrap();
        let b = &d.batch;
        let names: Vec<&str> = b.column(4).as_string::<i32>().iter().flatten().collect();
        assert_eq!(
            names,
            vec![
                "queue_depth",
                "requests",
                "latency_bucket",
                "latency_bucket",
                "latency_bucket",
                "latency_sum",
                "latency_count"
            ]
        );
        let values = b.column(12).as_primitive::<Float64Type>();
        assert_eq!(values.values(), &[7.0, 12.5, 1.0, 3.0, 3.0, 0.7, 3.0]);
        assert_eq!(b.column(2).as_string::<i32>().value(0), "shop");
        assert_eq!(b.column(3).as_string::<i32>().value(0), "pod-1");
        assert_eq!(b.column(6).as_string::<i32>().value(1), "cumulative");
        assert!(b.column(6).is_null(0));
        assert!(b.column(7).as_boolean().value(1));
        let attrs = b.column(11).as_map();
        let le: Vec<String> = (2..5)
            .map(|row| {
                let e = attrs.value(row);
                e.column(1).as_string::<i32>().value(0).to_string()
            })
            .collect();
        assert_eq!(le, vec!["0.1", "0.5", "+Inf"]);
        assert!(b.column(1).is_null(0));
        assert_eq!(
            b.column(0)
                .as_primitive::<datafusion::arrow::datatypes::TimestampMillisecondType>()
                .value(0),
            1_700_000_000_000
        );
        assert_eq!(d.bad.len(), 2);
        assert_eq!(d.bad[0].line, 3);
        assert!(d.bad[0].reason.contains("without a value"), "{:?}", d.bad);
        assert!(d.bad[1].reason.contains("exponential"), "{:?}", d.bad);
    }

    #[test]
    fn protobuf_round_trips_and_garbage_is_refused() {
        let request = decode_request(REQUEST.as_bytes(), Encoding::Json).unwrap();
        let body = prost::Message::encode_to_vec(&request);
        assert_eq!(decode_request(&body, Encoding::Protobuf).unwrap(), request);
        let e = decode_request(&[0xff, 0xff, 0xff], Encoding::Protobuf).unwrap_err();
        assert!(e.contains("ExportMetricsServiceRequest"), "{e}");
        assert!(decode_request(b"{", Encoding::Json).is_err());
    }
}
