//! The request handlers of `vigil serve`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::Ordering;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path as UrlPath, RawQuery, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use datafusion::arrow::json::writer::LineDelimited;
use datafusion::arrow::record_batch::RecordBatch;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio::sync::watch;

use super::feed::Update;
use super::{AppState, metrics};
use crate::connector::{BadRow, Format, SourceLocation, SourceStats};
use crate::connectors::read_bytes;
use crate::connectors::sink::write_json_rows;
use crate::group::status::group_status as read_group_status;
use crate::runtime::live::{QueryId, QueryInfo};
use crate::state::store::Location;

/// A JSON response, ending with a newline for terminals.
fn reply(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        format!("{body}\n"),
    )
        .into_response()
}

/// `{"error": message}` with `status`.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    ApiError::new(status, message).into_response()
}

/// An error answer: `{"error": "..."}` with a 4xx status.
pub(super) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        reply(self.status, json!({"error": self.message}))
    }
}

/// What most handlers return.
type Answer = Result<Response, ApiError>;

/// The body, or the error for one that is too large or unreadable.
fn body_or_error(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        let (status, message) = rejected_body(&rejection);
        ApiError::new(status, message)
    })
}

/// The status and message for a body that is too large or unreadable.
pub(super) fn rejected_body(rejection: &BytesRejection) -> (StatusCode, String) {
    let status = rejection.status();
    let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
        "the request body is larger than the service takes (--max-body)".to_string()
    } else {
        rejection.body_text()
    };
    (status, message)
}

/// Lets a request through if no token is set or it carries
/// `Authorization: Bearer <token>` (or `Token <token>`); the comparison
/// takes the same time wherever the tokens differ.
pub(super) async fn require_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(token) = &state.inner.token {
        let given = request
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().split_once(' '))
            // `Token` is InfluxDB's scheme, which Telegraf sends.
            .filter(|(scheme, _)| {
                scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("token")
            })
            .map(|(_, t)| t.trim());
        let ok = given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(token.as_bytes())));
        if !ok {
            let mut response = error(
                StatusCode::UNAUTHORIZED,
                "this service needs `Authorization: Bearer <token>` with its token",
            );
            response
                .headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return response;
        }
    }
    next.run(request).await
}

/// `GET /health`.
pub(super) async fn health() -> Response {
    reply(StatusCode::OK, json!({"status": "ok"}))
}

/// Unknown paths.
pub(super) async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such endpoint")
}

/// A known path with another method.
pub(super) async fn method_not_allowed() -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "this endpoint does not take that method",
    )
}

/// `POST /statements`: the body is SQL, one or more statements.
pub(super) async fn statements(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let body = body_or_error(body)?;
    let sql = std::str::from_utf8(&body)
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, "the SQL is not UTF-8 text"))?;
    // Paths in posted statements resolve against the server's directory.
    Ok(match state.execute(sql, Path::new(".")).await {
        Ok(done) => reply(
            StatusCode::OK,
            json!({"results": done.iter().map(|d| d.to_json()).collect::<Vec<_>>()}),
        ),
        Err(failure) => reply(
            failure.status,
            json!({
                "error": failure.message,
                "results": failure.done.iter().map(|d| d.to_json()).collect::<Vec<_>>(),
            }),
        ),
    })
}

/// A query as `GET /queries` lists it.
fn query_json(q: &QueryInfo) -> Value {
    json!({
        "id": q.id,
        "label": q.label,
        "state": q.state.as_str(),
        "error": q.error,
        "rows_out": q.rows_out,
        "late_rows": q.late_rows,
        "sources": q.sources.iter().map(|(stream, rows, bad)| json!({
            "stream": stream,
            "rows": rows,
            "bad_rows": bad,
        })).collect::<Vec<_>>(),
    })
}

/// `GET /queries`: the running queries and the ended ones kept.
pub(super) async fn list_queries(State(state): State<AppState>) -> Response {
    let queries = state.inner.session.read().await.all_queries();
    let list: Vec<Value> = queries.iter().map(query_json).collect();
    reply(StatusCode::OK, json!({"queries": list}))
}

/// The query id in the path, or a 404.
fn query_id(id: Result<UrlPath<String>, PathRejection>) -> Result<QueryId, ApiError> {
    let text = id.map(|UrlPath(id)| id).unwrap_or_default();
    text.parse()
        .map_err(|_| ApiError::new(StatusCode::NOT_FOUND, format!("no query '{text}'")))
}

/// Query `id` as listed, or a 404.
async fn listed_query(state: &AppState, id: QueryId) -> Result<QueryInfo, ApiError> {
    let queries = state.inner.session.read().await.all_queries();
    queries
        .into_iter()
        .find(|q| q.id == id)
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("no query {id}")))
}

/// `GET /queries/{id}`: one query, as `GET /queries` lists it.
pub(super) async fn get_query(
    State(state): State<AppState>,
    id: Result<UrlPath<String>, PathRejection>,
) -> Answer {
    let id = query_id(id)?;
    let query = listed_query(&state, id).await?;
    Ok(reply(StatusCode::OK, query_json(&query)))
}

/// `DELETE /queries/{id}`: stops a running query, or removes an ended one
/// from the listing.
pub(super) async fn stop_query(
    State(state): State<AppState>,
    id: Result<UrlPath<String>, PathRejection>,
) -> Answer {
    let id = query_id(id)?;
    let session = state.inner.session.read().await;
    let name = session.query_name(id);
    if session.stop(id) {
        if let Some(name) = name
            && let Err(e) = state.record_stop(&name)
        {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("query {id} stopped, but the stop could not be recorded: {e}"),
            ));
        }
        Ok(reply(StatusCode::OK, json!({"stopped": id})))
    } else if session.forget(id) {
        Ok(reply(StatusCode::OK, json!({"removed": id})))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no query {id}"),
        ))
    }
}

/// `GET /queries/{id}/results`: the query's result rows from now on, one
/// event per row; ends when the query does, after an `error` event if it
/// failed. For a query that has ended: its error, if it failed, then the
/// end.
pub(super) async fn follow_results(
    State(state): State<AppState>,
    id: Result<UrlPath<String>, PathRejection>,
) -> Answer {
    let id = query_id(id)?;
    let shutdown = state.inner.shutdown.subscribe();
    if let Some(feed) = state.feed(id) {
        let updates = futures::stream::unfold(feed.subscribe(), |mut follower| async move {
            let update = follower.next().await?;
            Some((update, follower))
        });
        return Ok(row_events(Box::pin(updates), None, shutdown));
    }
    let query = listed_query(&state, id).await?;
    let updates: Vec<Update> = query.error.into_iter().map(Update::Failed).collect();
    Ok(row_events(futures::stream::iter(updates), None, shutdown))
}

/// `GET /alerts`: every alert row of the session from now on, one `alert`
/// event per row.
pub(super) async fn follow_alerts(State(state): State<AppState>) -> Response {
    let alerts = state.inner.session.read().await.alerts();
    row_events(
        alerts.map(Update::Rows),
        Some("alert"),
        state.inner.shutdown.subscribe(),
    )
}

/// Server-Sent Events of the rows of `updates` as JSON objects (timestamps
/// as text), each named `event` if given; a gap (n batches skipped by a
/// slow client) is a `lagged` event, a failure an `error` event. Ends with
/// `updates` or when the service shuts down.
fn row_events<S>(
    updates: S,
    event: Option<&'static str>,
    shutdown: watch::Receiver<bool>,
) -> Response
where
    S: Stream<Item = Update> + Send + Unpin + 'static,
{
    struct Events<S> {
        updates: S,
        pending: VecDeque<Event>,
        shutdown: watch::Receiver<bool>,
    }
    let feed = Events {
        updates,
        pending: VecDeque::new(),
        shutdown,
    };
    let events = futures::stream::unfold(feed, move |mut feed| async move {
        loop {
            if *feed.shutdown.borrow() {
                return None;
            }
            if let Some(next) = feed.pending.pop_front() {
                return Some((Ok::<Event, Infallible>(next), feed));
            }
            let item = tokio::select! {
                item = feed.updates.next() => item?,
                _ = feed.shutdown.wait_for(|stopping| *stopping) => return None,
            };
            match item {
                Update::Rows(batch) => feed.pending.extend(batch_events(&batch, event)),
                Update::Lagged(skipped) => feed.pending.push_back(
                    Event::default()
                        .event("lagged")
                        .data(json!({"skipped_batches": skipped}).to_string()),
                ),
                Update::Failed(error) => feed.pending.push_back(
                    Event::default()
                        .event("error")
                        .data(json!({"error": error}).to_string()),
                ),
            }
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// One event per row of `batch`.
fn batch_events(batch: &RecordBatch, event: Option<&'static str>) -> Vec<Event> {
    match write_json_rows::<LineDelimited>(batch, Vec::new()) {
        Ok(bytes) => String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|line| !line.is_empty())
            .map(|line| match event {
                Some(name) => Event::default().event(name).data(line),
                None => Event::default().data(line),
            })
            .collect(),
        Err(e) => vec![
            Event::default()
                .event("error")
                .data(json!({"error": e.to_string()}).to_string()),
        ],
    }
}

/// How pushed rows are written, from the request's content type: JSON
/// lines (also without a content type), a JSON array or CSV.
fn push_format(headers: &HeaderMap) -> Result<Format, ApiError> {
    let Some(value) = headers.get(CONTENT_TYPE) else {
        return Ok(Format::Jsonl);
    };
    let mime = value
        .to_str()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match mime.as_str() {
        "application/x-ndjson"
        | "application/ndjson"
        | "application/jsonl"
        | "application/x-jsonlines"
        | "application/jsonlines"
        | "application/json" => Ok(Format::Jsonl),
        "text/csv" => Ok(Format::Csv),
        other => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "rows must be sent as application/x-ndjson (JSON lines), application/json or text/csv, not '{other}'"
            ),
        )),
    }
}

/// A JSON array of objects as JSON lines; other bodies unchanged.
fn array_as_lines(body: Bytes) -> Result<Bytes, ApiError> {
    let starts_array = body
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'[');
    if !starts_array {
        return Ok(body);
    }
    let rows: Vec<Value> = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the body is not a JSON array of rows: {e}"),
        )
    })?;
    let mut lines = String::new();
    for row in rows {
        lines.push_str(&row.to_string());
        lines.push('\n');
    }
    Ok(Bytes::from(lines))
}

/// `POST /streams/{name}/rows`: rows into a push stream. Malformed rows are
/// skipped, counted and described (the first ten) in the answer.
pub(super) async fn push_rows(
    State(state): State<AppState>,
    name: Result<UrlPath<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let name = name.map(|UrlPath(n)| n).unwrap_or_default();
    let session = state.inner.session.read().await;
    let catalog = session.engine().catalog();
    let Some(def) = catalog
        .stream(&name)
        .or_else(|| catalog.stream(&name.to_ascii_lowercase()))
        .cloned()
    else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("unknown stream '{name}'"),
        ));
    };
    if def.source.location != SourceLocation::Push {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "stream {} reads its own input; only streams with connector = 'push' take pushed rows",
                def.name
            ),
        ));
    }
    let format = push_format(&headers)?;
    let mut body = body_or_error(body)?;
    if format == Format::Jsonl {
        body = array_as_lines(body)?;
    }
    let parsed = SourceStats::default();
    let mut batches = Vec::new();
    if let Err(e) = read_bytes(&def.source, format, &body, &parsed, &mut |b| {
        batches.push(b);
        true
    }) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, e.to_string()));
    }
    let bad = parsed.bad_rows.load(Ordering::Relaxed);
    let samples =
        std::mem::take(&mut *parsed.bad_samples.lock().unwrap_or_else(|e| e.into_inner()));
    let stats = session.push_stats(&def.name);
    for row in &samples {
        stats.record_bad(row.clone());
    }
    stats
        .bad_rows
        .fetch_add(bad - samples.len() as u64, Ordering::Relaxed);
    let described: Vec<Value> = samples.iter().map(describe).collect();
    if bad > 0 && batches.iter().all(|b| b.num_rows() == 0) {
        return Ok(reply(
            StatusCode::BAD_REQUEST,
            json!({
                "error": format!("stream {}: no valid row among the {bad} sent", def.name),
                "rows": 0,
                "bad": bad,
                "bad_rows": described,
            }),
        ));
    }
    let mut rows = 0;
    for batch in batches {
        let n = batch.num_rows() as u64;
        match session
            .push_within(&def.name, batch, state.inner.ingest_timeout)
            .await
        {
            Ok(()) => rows += n,
            Err(crate::error::Error::Overloaded {
                message,
                retry_after,
            }) => {
                let status = StatusCode::SERVICE_UNAVAILABLE;
                return Ok(refused(status, &message, retry_after, rows));
            }
            Err(crate::error::Error::Busy {
                message,
                retry_after,
            }) => {
                let status = StatusCode::TOO_MANY_REQUESTS;
                return Ok(refused(status, &message, retry_after, rows));
            }
            Err(e) => return Err(ApiError::new(StatusCode::CONFLICT, e.to_string())),
        }
    }
    Ok(reply(
        StatusCode::OK,
        json!({"rows": rows, "bad": bad, "bad_rows": described}),
    ))
}

/// `status` with `Retry-After` (whole seconds, at least 1): 503 when the
/// write-ahead log is full, 429 when the stream's queries had no room
/// within the ingest timeout. The rows of the request's earlier batches,
/// if any, were taken (`rows` says how many).
fn refused(
    status: StatusCode,
    message: &str,
    retry_after: std::time::Duration,
    rows: u64,
) -> Response {
    let seconds = retry_after.as_secs_f64().ceil().max(1.0) as u64;
    let mut response = reply(
        status,
        json!({"error": message, "retry_after": seconds, "rows": rows}),
    );
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(seconds));
    response
}

/// `POST /savepoints`: a savepoint of every running query, under
/// `DIR/savepoints/NAME`. The body may be `{"name": "NAME"}` (letters,
/// digits, `-`, `_`, `.`); else the name is the time. Answers its path and
/// the names of the queries it holds.
pub(super) async fn savepoint(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let body = body_or_error(body)?;
    let name = if body.iter().all(u8::is_ascii_whitespace) {
        chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ").to_string()
    } else {
        let value: Value = serde_json::from_slice(&body).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("expected {{\"name\": ...}}: {e}"),
            )
        })?;
        match value.get("name").and_then(Value::as_str) {
            Some(name) => name.to_string(),
            None => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "expected {\"name\": \"...\"}",
                ));
            }
        }
    };
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.starts_with('.') || !name.chars().all(plain) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("savepoint name '{name}': use letters, digits, '-', '_' and '.'"),
        ));
    }
    match state.savepoint(&name).await {
        Ok((path, queries)) => Ok(reply(
            StatusCode::OK,
            json!({"path": path.display().to_string(), "queries": queries}),
        )),
        Err(e @ crate::error::Error::Plan(_)) => {
            Err(ApiError::new(StatusCode::CONFLICT, e.to_string()))
        }
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            e.to_string(),
        )),
    }
}

/// `GET /groups/{name}`: what the members of group `name` hold, read from
/// the checkpoint directory they share: `?checkpoint_dir=DIR` (a path or a
/// URL, as `--checkpoint-dir` takes), else the service's own group's.
/// Answers the members, each with its partitions, their lag and
/// checkpoint age; 400 for a directory that cannot be read or is not a
/// group's.
pub(super) async fn group_status(
    State(state): State<AppState>,
    name: Result<UrlPath<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Answer {
    let UrlPath(name) = name.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let bad = |message: String| ApiError::new(StatusCode::BAD_REQUEST, message);
    let dir = match super::ingest::params(query).remove("checkpoint_dir") {
        Some(text) => Location::parse(&text).map_err(|e| bad(e.to_string()))?,
        None => state.inner.group_checkpoint_dir.clone().ok_or_else(|| {
            bad("the service is in no group: give ?checkpoint_dir=DIR, the group's checkpoint directory".into())
        })?,
    };
    // The store and the brokers may take seconds to answer.
    let status = tokio::task::spawn_blocking(move || read_group_status(&dir, &name))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| bad(e.to_string()))?;
    let body = serde_json::to_value(&status)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(reply(StatusCode::OK, body))
}

fn describe(row: &BadRow) -> Value {
    json!({"line": row.line, "reason": row.reason})
}

/// `GET /metrics`: Prometheus text format.
pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    let mut text = {
        let session = state.inner.session.read().await;
        metrics::render(
            &session,
            state.inner.member_queries.as_ref(),
            state.inner.alerts_fired.load(Ordering::Relaxed),
            |id| state.result_buffer_bytes(id),
        )
    };
    if let (Some(dir), Some(name)) = (&state.inner.group_checkpoint_dir, &state.inner.group) {
        let (dir, name) = (dir.clone(), name.clone());
        // The store may be remote.
        let verdict = tokio::task::spawn_blocking(move || {
            let verdict = crate::group::scale::verdict(&dir, &name);
            (name, verdict)
        })
        .await;
        if let Ok((name, Some(verdict))) = verdict {
            metrics::group_scale(&mut text, &name, &verdict);
        }
    }
    (
        StatusCode::OK,
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}
