//! `GET /metrics` in the Prometheus text exposition format (0.0.4).
//!
//! Stream counters are those of push streams (the rows the service took);
//! a file-backed stream is read by each query on its own, so its rows are
//! counted per query (`vigil_query_input_rows_total`). Watermark lag and
//! channel queue depths are not exported: the runtime does not expose them.
//! Per-query series cover the running queries.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use crate::connectors::SourceLocation;
use crate::runtime::live::QueryId;
use crate::session::{QueryState, Session};

/// The metrics of `session`, plus the count of alert rows seen firing and
/// the result bytes kept for each query's followers.
pub(super) fn render(
    session: &Session,
    alerts_fired: u64,
    result_buffer_bytes: impl Fn(QueryId) -> usize,
) -> String {
    let mut out = String::new();
    let streams: Vec<(String, u64, u64)> = session
        .engine()
        .catalog()
        .streams()
        .filter(|s| s.source.location == SourceLocation::Push)
        .map(|s| {
            let stats = session.push_stats(&s.name);
            (
                s.name.clone(),
                stats.rows.load(Ordering::Relaxed),
                stats.bad_rows.load(Ordering::Relaxed),
            )
        })
        .collect();
    let all_queries = session.all_queries();
    let failed = all_queries
        .iter()
        .filter(|q| q.state == QueryState::Failed)
        .count();
    let queries: Vec<_> = all_queries
        .into_iter()
        .filter(|q| q.state == QueryState::Running)
        .collect();

    header(
        &mut out,
        "vigil_stream_rows_total",
        "counter",
        "Rows pushed into a push stream.",
    );
    for (name, rows, _) in &streams {
        sample(
            &mut out,
            "vigil_stream_rows_total",
            &[("stream", name)],
            *rows,
        );
    }
    header(
        &mut out,
        "vigil_stream_bad_rows_total",
        "counter",
        "Malformed rows pushed into a push stream, skipped.",
    );
    for (name, _, bad) in &streams {
        sample(
            &mut out,
            "vigil_stream_bad_rows_total",
            &[("stream", name)],
            *bad,
        );
    }
    header(
        &mut out,
        "vigil_query_rows_out_total",
        "counter",
        "Result rows of a running query.",
    );
    for q in &queries {
        let id = q.id.to_string();
        sample(
            &mut out,
            "vigil_query_rows_out_total",
            &[("query", &id)],
            q.rows_out,
        );
    }
    header(
        &mut out,
        "vigil_query_late_rows_total",
        "counter",
        "Rows a running query dropped as late.",
    );
    for q in &queries {
        let id = q.id.to_string();
        sample(
            &mut out,
            "vigil_query_late_rows_total",
            &[("query", &id)],
            q.late_rows,
        );
    }
    header(
        &mut out,
        "vigil_query_input_rows_total",
        "counter",
        "Rows a running query read from a stream.",
    );
    for q in &queries {
        let id = q.id.to_string();
        for (stream, rows, _) in &q.sources {
            sample(
                &mut out,
                "vigil_query_input_rows_total",
                &[("query", &id), ("stream", stream)],
                *rows,
            );
        }
    }
    header(
        &mut out,
        "vigil_query_result_buffer_bytes",
        "gauge",
        "Bytes of result batches kept for the followers of a running query that have not read them.",
    );
    for q in &queries {
        let id = q.id.to_string();
        sample(
            &mut out,
            "vigil_query_result_buffer_bytes",
            &[("query", &id)],
            result_buffer_bytes(q.id) as u64,
        );
    }
    header(
        &mut out,
        "vigil_running_queries",
        "gauge",
        "Queries running now.",
    );
    sample(&mut out, "vigil_running_queries", &[], queries.len() as u64);
    header(
        &mut out,
        "vigil_failed_queries",
        "gauge",
        "Failed queries still listed (until removed with DELETE /queries/{id}).",
    );
    sample(&mut out, "vigil_failed_queries", &[], failed as u64);
    header(
        &mut out,
        "vigil_alerts_fired_total",
        "counter",
        "Alert rows with state 'firing' since the service started.",
    );
    sample(&mut out, "vigil_alerts_fired_total", &[], alerts_fired);
    durable(&mut out, session);
    out
}

/// The checkpoint and write-ahead log series of a durable session.
fn durable(out: &mut String, session: &Session) {
    let Some(stats) = session.checkpoint_stats() else {
        return;
    };
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    header(
        out,
        "vigil_checkpoint_duration_seconds",
        "gauge",
        "Time the last query checkpoint took to write.",
    );
    let seconds = load(&stats.last_duration_us) as f64 / 1e6;
    let _ = writeln!(out, "vigil_checkpoint_duration_seconds {seconds}");
    header(
        out,
        "vigil_checkpoint_size_bytes",
        "gauge",
        "Bytes of the last query checkpoint.",
    );
    sample(
        out,
        "vigil_checkpoint_size_bytes",
        &[],
        load(&stats.last_bytes),
    );
    let last_ms = stats.last_completed_ms.load(Ordering::Relaxed);
    if last_ms > 0 {
        header(
            out,
            "vigil_checkpoint_age_seconds",
            "gauge",
            "Time since the last query checkpoint completed.",
        );
        let age = (chrono::Utc::now().timestamp_millis() - last_ms).max(0) as f64 / 1e3;
        let _ = writeln!(out, "vigil_checkpoint_age_seconds {age}");
    }
    header(
        out,
        "vigil_checkpoints_completed_total",
        "counter",
        "Query checkpoints written.",
    );
    sample(
        out,
        "vigil_checkpoints_completed_total",
        &[],
        load(&stats.completed),
    );
    header(
        out,
        "vigil_checkpoints_failed_total",
        "counter",
        "Query checkpoints that could not be written.",
    );
    sample(
        out,
        "vigil_checkpoints_failed_total",
        &[],
        load(&stats.failed),
    );
    header(
        out,
        "vigil_restores_total",
        "counter",
        "Queries restored from a checkpoint or savepoint since the service started.",
    );
    sample(out, "vigil_restores_total", &[], load(&stats.restores));
    header(
        out,
        "vigil_wal_bytes",
        "gauge",
        "Bytes a push stream's write-ahead log holds on disk.",
    );
    for (stream, bytes) in session.wal_bytes() {
        sample(out, "vigil_wal_bytes", &[("stream", &stream)], bytes);
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: u64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (label, value)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{label}=\"{}\"", escape(value));
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_escape_labels() {
        let mut out = String::new();
        sample(&mut out, "m", &[("stream", "a\"b\\c\nd"), ("q", "1")], 7);
        sample(&mut out, "n", &[], 0);
        assert_eq!(out, "m{stream=\"a\\\"b\\\\c\\nd\",q=\"1\"} 7\nn 0\n");
    }
}
