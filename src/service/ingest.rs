//! The push protocols of monitoring senders, into streams declared with
//! their connector:
//!
//! - `POST /api/v1/write`: Prometheus remote write 1.0 (protobuf, snappy)
//!   into `connector = 'remote_write'` streams;
//! - `POST /v1/metrics`: OTLP/HTTP metrics (protobuf or JSON, optionally
//!   gzip) into `connector = 'otlp'` streams;
//! - `POST /api/v2/write` and `POST /write`: InfluxDB line protocol (2.x and
//!   1.x, optionally gzip) into `connector = 'influx'` streams.
//!
//! Every stream of the connector takes every request's rows; `?stream=NAME`
//! (remote write, OTLP) sends them to that stream only, as does a `bucket`
//! (2.x) or `db` (1.x) naming an `influx` stream. With several streams, a
//! request refused by the second after the first took its rows is sent
//! again by the sender and repeats those rows in the first.
//!
//! Back-pressure answers as the senders expect, so that they retry: 429 with
//! `Retry-After` when a stream's queries had no room within
//! `--ingest-timeout`, 503 when the write-ahead log is full. A body that
//! does not decode is a 400 (senders drop it) and leaves the service as it
//! was. Malformed samples, points or lines in a body that decodes are the
//! stream's bad rows (counted, the first ones kept for `GET /queries`), and
//! the rest is kept. A compressed body may decompress to at most
//! [`INFLATE_FACTOR`] times `--max-body`.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{RawQuery, State};
use axum::http::header::{CONTENT_ENCODING, CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use datafusion::arrow::record_batch::RecordBatch;
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceResponse,
};
use serde_json::{Value, json};

use super::AppState;
use crate::connector::BadRow;
use crate::connectors::influx::{self, Precision};
use crate::connectors::otlp::{self, Encoding};
use crate::connectors::remote_write;
use crate::error::Error;
use crate::plan::catalog::StreamDef;
use crate::session::Session;

/// How many times `--max-body` a compressed body may decompress to.
pub const INFLATE_FACTOR: usize = 4;

/// How many bad rows an answer describes.
const DESCRIBED: usize = 10;

/// Why a request was not (wholly) taken.
struct Refusal {
    status: StatusCode,
    message: String,
    /// For 429 and 503: when to try again.
    retry_after: Option<std::time::Duration>,
}

impl Refusal {
    fn new(status: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    fn bad_request(message: impl Into<String>) -> Refusal {
        Refusal::new(StatusCode::BAD_REQUEST, message)
    }

    /// `Retry-After` in whole seconds, at least 1.
    fn retry_header(&self) -> Option<HeaderValue> {
        self.retry_after
            .map(|d| HeaderValue::from(d.as_secs_f64().ceil().max(1.0) as u64))
    }

    /// The service's own error answer: `{"error": "..."}`.
    fn json(self) -> Response {
        let retry = self.retry_header();
        let mut response = answer(self.status, json!({"error": self.message}));
        if let Some(retry) = retry {
            response.headers_mut().insert(RETRY_AFTER, retry);
        }
        response
    }
}

/// A JSON answer.
fn answer(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        format!("{body}\n"),
    )
        .into_response()
}

/// The body, or the refusal of one too large or unreadable.
fn body_of(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Refusal> {
    body.map_err(|rejection| {
        let (status, message) = super::handlers::rejected_body(&rejection);
        Refusal::new(status, message)
    })
}

/// The query parameters, decoded (a repeated one keeps its last value).
pub(super) fn params(query: Option<String>) -> HashMap<String, String> {
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

/// The request's `Content-Encoding`, lower case; empty when absent.
fn content_encoding(headers: &HeaderMap) -> String {
    headers
        .get(CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// The media type of the request, lower case, without parameters.
fn media_type(headers: &HeaderMap) -> String {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// The body as sent (`identity`) or gunzipped, at most `limit` bytes.
fn decoded_body(headers: &HeaderMap, body: Bytes, limit: usize) -> Result<Bytes, Refusal> {
    match content_encoding(headers).as_str() {
        "" | "identity" => Ok(body),
        "gzip" | "x-gzip" => {
            let mut out = Vec::new();
            flate2::read::MultiGzDecoder::new(&body[..])
                .take(limit as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| Refusal::bad_request(format!("the body is not valid gzip: {e}")))?;
            if out.len() > limit {
                return Err(Refusal::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the body decompresses to more than {limit} bytes"),
                ));
            }
            Ok(Bytes::from(out))
        }
        other => Err(Refusal::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Content-Encoding '{other}' is not supported (send gzip or none)"),
        )),
    }
}

/// The push streams of `connector`, or only `pick` if given (it must be
/// one of them).
fn streams_of(
    session: &Session,
    connector: &str,
    pick: Option<&str>,
) -> Result<Vec<Arc<StreamDef>>, Refusal> {
    let catalog = session.engine().catalog();
    let takes = |def: &StreamDef| {
        def.source.connector == connector
            && def.source.location == crate::connector::SourceLocation::Push
    };
    if let Some(name) = pick {
        let def = catalog
            .stream(name)
            .or_else(|| catalog.stream(&name.to_ascii_lowercase()))
            .filter(|def| takes(def))
            .ok_or_else(|| {
                Refusal::new(
                    StatusCode::NOT_FOUND,
                    format!("no stream '{name}' with connector = '{connector}'"),
                )
            })?;
        return Ok(vec![def.clone()]);
    }
    let mut streams: Vec<Arc<StreamDef>> =
        catalog.streams().filter(|d| takes(d)).cloned().collect();
    streams.sort_by(|a, b| a.name.cmp(&b.name));
    if streams.is_empty() {
        return Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("no stream takes these rows: declare one WITH (connector = '{connector}')"),
        ));
    }
    Ok(streams)
}

/// Counts `bad` on the stream.
fn record_bad(session: &Session, stream: &str, bad: &[BadRow]) {
    let stats = session.push_stats(stream);
    for row in bad {
        stats.record_bad(row.clone());
    }
}

/// Pushes `batch` into `stream`, mapping back-pressure to 429 and 503.
async fn push(
    state: &AppState,
    session: &Session,
    stream: &str,
    batch: RecordBatch,
) -> Result<(), Refusal> {
    if batch.num_rows() == 0 {
        return Ok(());
    }
    match session
        .push_within(stream, batch, state.inner.ingest_timeout)
        .await
    {
        Ok(()) => Ok(()),
        Err(Error::Overloaded {
            message,
            retry_after,
        }) => Err(Refusal {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message,
            retry_after: Some(retry_after),
        }),
        Err(Error::Busy {
            message,
            retry_after,
        }) => Err(Refusal {
            status: StatusCode::TOO_MANY_REQUESTS,
            message,
            retry_after: Some(retry_after),
        }),
        Err(e) => Err(Refusal::new(StatusCode::CONFLICT, e.to_string())),
    }
}

/// Pushes the same rows into every stream of `streams`.
async fn push_all(
    state: &AppState,
    session: &Session,
    streams: &[Arc<StreamDef>],
    batch: &RecordBatch,
    bad: &[BadRow],
) -> Result<(), Refusal> {
    for def in streams {
        record_bad(session, &def.name, bad);
        push(state, session, &def.name, batch.clone()).await?;
    }
    Ok(())
}

/// The first bad rows, as answers describe them.
fn described(bad: &[BadRow]) -> Vec<Value> {
    bad.iter()
        .take(DESCRIBED)
        .map(|r| json!({"line": r.line, "reason": r.reason}))
        .collect()
}

/// `POST /api/v1/write`: Prometheus remote write. Answers 204, or 200 with
/// `{"samples", "bad", "bad_rows"}` when some series were malformed, or
/// 400 when nothing in the body could be taken.
pub(super) async fn remote_write(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    remote_write_inner(&state, &params(query), &headers, body)
        .await
        .unwrap_or_else(Refusal::json)
}

async fn remote_write_inner(
    state: &AppState,
    params: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    let body = body_of(body)?;
    let encoding = content_encoding(headers);
    if !matches!(encoding.as_str(), "" | "snappy") {
        return Err(Refusal::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("remote write bodies are snappy-compressed, not '{encoding}'"),
        ));
    }
    let limit = state.inner.max_body.saturating_mul(INFLATE_FACTOR);
    let request = remote_write::decode_request(&body, limit).map_err(Refusal::bad_request)?;
    let decoded =
        remote_write::samples_batch(&request).map_err(|e| Refusal::bad_request(e.to_string()))?;
    let session = state.inner.session.read().await;
    let streams = streams_of(
        &session,
        "remote_write",
        params.get("stream").map(String::as_str),
    )?;
    let bad = &decoded.bad;
    let rows = decoded.batch.num_rows();
    if rows == 0 && !bad.is_empty() {
        for def in &streams {
            record_bad(&session, &def.name, bad);
        }
        return Err(Refusal::bad_request(format!(
            "no valid sample among the {} sent; first: {}",
            bad.len(),
            bad[0].reason
        )));
    }
    push_all(state, &session, &streams, &decoded.batch, bad).await?;
    if bad.is_empty() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    Ok(answer(
        StatusCode::OK,
        json!({"samples": rows, "bad": bad.len(), "bad_rows": described(bad)}),
    ))
}

/// `POST /v1/metrics`: OTLP/HTTP metrics. Answers an
/// `ExportMetricsServiceResponse` in the request's encoding, with
/// `partialSuccess` counting the rejected points; a body that does not
/// decode gets 400 with a `google.rpc.Status`.
pub(super) async fn otlp_metrics(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let encoding = match media_type(&headers).as_str() {
        "application/x-protobuf" | "application/protobuf" => Encoding::Protobuf,
        "application/json" => Encoding::Json,
        other => {
            return Refusal::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "OTLP/HTTP takes application/x-protobuf or application/json, not '{other}'"
                ),
            )
            .json();
        }
    };
    match otlp_inner(&state, &params(query), &headers, body, encoding).await {
        Ok(response) => otlp_answer(StatusCode::OK, &response, encoding),
        Err(refusal) => otlp_refusal(refusal, encoding),
    }
}

async fn otlp_inner(
    state: &AppState,
    params: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    encoding: Encoding,
) -> Result<ExportMetricsServiceResponse, Refusal> {
    let limit = state.inner.max_body.saturating_mul(INFLATE_FACTOR);
    let body = decoded_body(headers, body_of(body)?, limit)?;
    let request = otlp::decode_request(&body, encoding).map_err(Refusal::bad_request)?;
    let decoded = otlp::points_batch(&request).map_err(|e| Refusal::bad_request(e.to_string()))?;
    let session = state.inner.session.read().await;
    let streams = streams_of(&session, "otlp", params.get("stream").map(String::as_str))?;
    push_all(state, &session, &streams, &decoded.batch, &decoded.bad).await?;
    let partial_success = (!decoded.bad.is_empty()).then(|| ExportMetricsPartialSuccess {
        rejected_data_points: decoded.bad.len() as i64,
        error_message: format!(
            "{} data points rejected; first: {}",
            decoded.bad.len(),
            decoded.bad[0].reason
        ),
    });
    Ok(ExportMetricsServiceResponse { partial_success })
}

/// The body of an OTLP error answer (`google.rpc.Status`).
#[derive(Clone, PartialEq, prost::Message, serde::Serialize)]
struct Status {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

fn otlp_refusal(refusal: Refusal, encoding: Encoding) -> Response {
    let retry = refusal.retry_header();
    // gRPC codes: INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE.
    let code = match refusal.status {
        StatusCode::TOO_MANY_REQUESTS => 8,
        StatusCode::SERVICE_UNAVAILABLE => 14,
        StatusCode::NOT_FOUND => 5,
        _ => 3,
    };
    let status = Status {
        code,
        message: refusal.message,
    };
    let mut response = otlp_answer(refusal.status, &status, encoding);
    if let Some(retry) = retry {
        response.headers_mut().insert(RETRY_AFTER, retry);
    }
    response
}

fn otlp_answer<M: prost::Message + serde::Serialize>(
    status: StatusCode,
    message: &M,
    encoding: Encoding,
) -> Response {
    match encoding {
        Encoding::Protobuf => (
            status,
            [(
                CONTENT_TYPE,
                HeaderValue::from_static("application/x-protobuf"),
            )],
            message.encode_to_vec(),
        )
            .into_response(),
        Encoding::Json => (
            status,
            [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            serde_json::to_string(message).unwrap_or_else(|_| "{}".to_string()),
        )
            .into_response(),
    }
}

/// `POST /api/v2/write`: InfluxDB 2.x line protocol (`bucket`, `org`,
/// `precision` = `ns`, `us`, `ms` or `s`).
pub(super) async fn influx_v2(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    influx_write(&state, &params(query), &headers, body, false).await
}

/// `POST /write`: InfluxDB 1.x line protocol (`db`, `precision` = `n`,
/// `ns`, `u`, `us`, `ms`, `s`, `m` or `h`).
pub(super) async fn influx_v1(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    influx_write(&state, &params(query), &headers, body, true).await
}

/// InfluxDB's error answer: `{"code": "invalid", "message": "..."}` (2.x)
/// or `{"error": "..."}` (1.x), with `Retry-After` for 429 and 503.
fn influx_refusal(refusal: Refusal, v1: bool) -> Response {
    let retry = refusal.retry_header();
    let code = match refusal.status {
        StatusCode::TOO_MANY_REQUESTS => "too many requests",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        StatusCode::NOT_FOUND => "not found",
        StatusCode::PAYLOAD_TOO_LARGE => "request too large",
        StatusCode::UNAUTHORIZED => "unauthorized",
        s if s.is_server_error() => "internal error",
        _ => "invalid",
    };
    let body = if v1 {
        json!({"error": refusal.message})
    } else {
        json!({"code": code, "message": refusal.message})
    };
    let mut response = answer(refusal.status, body);
    if let Some(retry) = retry {
        response.headers_mut().insert(RETRY_AFTER, retry);
    }
    response
}

async fn influx_write(
    state: &AppState,
    params: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    v1: bool,
) -> Response {
    match influx_inner(state, params, headers, body, v1).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(refusal) => influx_refusal(refusal, v1),
    }
}

async fn influx_inner(
    state: &AppState,
    params: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    v1: bool,
) -> Result<(), Refusal> {
    let precision = match params.get("precision").map(String::as_str) {
        None | Some("") => Precision::Nanos,
        Some(p) => Precision::parse(p, v1).ok_or_else(|| {
            Refusal::bad_request(format!(
                "precision '{p}' is not one of {}",
                if v1 {
                    "n, ns, u, us, ms, s, m, h"
                } else {
                    "ns, us, ms, s"
                }
            ))
        })?,
    };
    let limit = state.inner.max_body.saturating_mul(INFLATE_FACTOR);
    let body = decoded_body(headers, body_of(body)?, limit)?;
    let text = std::str::from_utf8(&body)
        .map_err(|e| Refusal::bad_request(format!("the body is not UTF-8 text: {e}")))?;
    let session = state.inner.session.read().await;
    let target = params.get(if v1 { "db" } else { "bucket" });
    let streams = match target.map(|t| streams_of(&session, "influx", Some(t))) {
        Some(Ok(one)) => one,
        _ => streams_of(&session, "influx", None)?,
    };
    let now = chrono::Utc::now().timestamp_millis();
    let mut decoded = Vec::with_capacity(streams.len());
    for def in &streams {
        let rows = influx::lines_batch(&def.name, &def.schema, text, precision, now)
            .map_err(|e| Refusal::bad_request(e.to_string()))?;
        decoded.push(rows);
    }
    let rows: usize = decoded.iter().map(|d| d.batch.num_rows()).sum();
    let bad: usize = decoded.iter().map(|d| d.bad.len()).sum();
    if rows == 0 && bad > 0 {
        for (def, d) in streams.iter().zip(&decoded) {
            record_bad(&session, &def.name, &d.bad);
        }
        let first = decoded
            .iter()
            .find_map(|d| d.bad.first())
            .map_or_else(String::new, |b| format!("line {}: {}", b.line, b.reason));
        return Err(Refusal::bad_request(format!(
            "no line could be taken ({bad} bad); first: {first}"
        )));
    }
    for (def, d) in streams.iter().zip(decoded) {
        record_bad(&session, &def.name, &d.bad);
        push(state, &session, &def.name, d.batch).await?;
    }
    Ok(())
}
