//! `GET /metrics` in the Prometheus text exposition format (0.0.4).
//!
//! Stream counters are those of push streams (the rows the service took,
//! how far their event time lags the wall clock, what their disk buffers
//! hold, what was shed, how long they waited on back-pressure); a
//! file-backed stream is read by each query on its own, so its rows and
//! back-pressure are counted per query (`vigil_query_input_*`).
//!
//! Per-query series cover the running queries: result and late rows, shed
//! rows, watermark lag, the event-to-result latency histogram, the depth
//! of every queue between its tasks (`vigil_queue_*`, labelled by the
//! queue) and each operator's rows and time (`vigil_operator_*`, summed
//! over the instances of its stage). Per input they also count the rows
//! that did not decode and the errors the source's client reported while
//! it retried (a Kafka stream's unreachable broker), and per query the
//! errors of its sink's client (a Kafka sink's failed deliveries). The
//! queries are the session's, labelled by id, and those of the group
//! member the service runs (`vigil serve --group`), labelled as the member
//! names them (`q1-p0`). Durations are in seconds, as Prometheus has them.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use crate::connector::{SourceLocation, SourceStats};
use crate::exec::metrics::{LATENCY_BUCKETS_MS, LatencyHistogram};
use crate::runtime::live::{Live, QueryId, QueryInfo};
use crate::session::{QueryState, Session};

/// A running query as the series name it: the session's by id, a group
/// member's by its label (`q1-p0`, `q1-global`).
struct Shown {
    /// The value of its `query` label.
    label: String,
    /// The session's id, for the results kept for followers (a member's
    /// query has none).
    id: Option<QueryId>,
    info: QueryInfo,
}

/// The running queries of `session`, then those of the group member's
/// runtime `member`.
fn running(all: Vec<QueryInfo>, member: Option<&Live>) -> Vec<Shown> {
    let own = all
        .into_iter()
        .filter(|q| q.state == QueryState::Running)
        .map(|info| Shown {
            label: info.id.to_string(),
            id: Some(info.id),
            info,
        });
    let members = member
        .map(Live::queries)
        .unwrap_or_default()
        .into_iter()
        .map(|info| Shown {
            label: info.label.clone(),
            id: None,
            info,
        });
    own.chain(members).collect()
}

/// The metrics of `session` and of the queries the group member's runtime
/// `member` runs, plus the count of alert rows seen firing and the result
/// bytes kept for each query's followers.
pub(super) fn render(
    session: &Session,
    member: Option<&Live>,
    alerts_fired: u64,
    result_buffer_bytes: impl Fn(QueryId) -> usize,
) -> String {
    let mut out = String::new();
    let push: Vec<(String, std::sync::Arc<SourceStats>)> = session
        .engine()
        .catalog()
        .streams()
        .filter(|s| s.source.location == SourceLocation::Push)
        .map(|s| (s.name.clone(), session.push_stats(&s.name)))
        .collect();
    let streams: Vec<(String, u64, u64)> = push
        .iter()
        .map(|(name, stats)| {
            (
                name.clone(),
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
    let queries = running(all_queries, member);

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
        sample(
            &mut out,
            "vigil_query_rows_out_total",
            &[("query", &q.label)],
            q.info.rows_out,
        );
    }
    header(
        &mut out,
        "vigil_query_late_rows_total",
        "counter",
        "Rows a running query dropped as late.",
    );
    for q in &queries {
        sample(
            &mut out,
            "vigil_query_late_rows_total",
            &[("query", &q.label)],
            q.info.late_rows,
        );
    }
    header(
        &mut out,
        "vigil_query_input_rows_total",
        "counter",
        "Rows a running query read from a stream.",
    );
    for q in &queries {
        for (stream, rows, _) in &q.info.sources {
            sample(
                &mut out,
                "vigil_query_input_rows_total",
                &[("query", &q.label), ("stream", stream)],
                *rows,
            );
        }
    }
    input_errors(&mut out, &queries);
    header(
        &mut out,
        "vigil_query_result_buffer_bytes",
        "gauge",
        "Bytes of result batches kept for the followers of a running query that have not read them.",
    );
    for q in &queries {
        let Some(id) = q.id else { continue };
        sample(
            &mut out,
            "vigil_query_result_buffer_bytes",
            &[("query", &q.label)],
            result_buffer_bytes(id) as u64,
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
    let now_ms = chrono::Utc::now().timestamp_millis();
    stream_overload(&mut out, &push, now_ms);
    query_overload(&mut out, &queries, &push, now_ms);
    queues(&mut out, &queries);
    operators(&mut out, &queries);
    durable(&mut out, session);
    autoscaling(&mut out, &session.autoscaling());
    out
}

/// Seconds from epoch milliseconds `then` to `now_ms` (0 for a time ahead
/// of the clock).
fn lag_seconds(now_ms: i64, then: i64) -> f64 {
    now_ms.saturating_sub(then).max(0) as f64 / 1e3
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Event-time lag, disk buffer, shed rows and back-pressure of each push
/// stream.
fn stream_overload(out: &mut String, push: &[(String, std::sync::Arc<SourceStats>)], now_ms: i64) {
    header(
        out,
        "vigil_stream_lag_seconds",
        "gauge",
        "Wall clock minus the largest event time pushed into a push stream.",
    );
    for (name, stats) in push {
        if let Some(t) = stats.max_event_time.get() {
            sample(
                out,
                "vigil_stream_lag_seconds",
                &[("stream", name)],
                lag_seconds(now_ms, t),
            );
        }
    }
    type Value = fn(&SourceStats) -> f64;
    let series: [(&str, &str, &str, Value); 5] = [
        (
            "vigil_stream_buffered_rows",
            "gauge",
            "Rows held in a push stream's disk buffer that its queries have not taken yet.",
            |s| load_f(&s.buffered_rows),
        ),
        (
            "vigil_stream_buffered_bytes",
            "gauge",
            "Bytes of the rows held in a push stream's disk buffer.",
            |s| load_f(&s.buffered_bytes),
        ),
        (
            "vigil_buffer_full",
            "gauge",
            "1 while a push stream's disk buffer is full (back-pressure has resumed), else 0.",
            |s| u8::from(s.buffer_full.load(Ordering::Relaxed)).into(),
        ),
        (
            "vigil_stream_shed_rows_total",
            "counter",
            "Rows of a push stream its load shedder dropped.",
            |s| load_f(&s.shed_rows),
        ),
        (
            "vigil_stream_blocked_seconds_total",
            "counter",
            "Time a push stream waited for room in its queries' queues (back-pressure).",
            |s| seconds(s.blocked_ns.load(Ordering::Relaxed)),
        ),
    ];
    for (metric, kind, help, value) in series {
        header(out, metric, kind, help);
        for (name, stats) in push {
            sample(out, metric, &[("stream", name)], value(stats));
        }
    }
}

fn load_f(n: &std::sync::atomic::AtomicU64) -> f64 {
    n.load(Ordering::Relaxed) as f64
}

/// Shed rows, watermark lag, result latency and per-input back-pressure of
/// each running query.
fn query_overload(
    out: &mut String,
    queries: &[Shown],
    push: &[(String, std::sync::Arc<SourceStats>)],
    now_ms: i64,
) {
    header(
        out,
        "vigil_query_shed_rows_total",
        "counter",
        "Input rows a running query's load shedder dropped.",
    );
    for q in queries {
        let shed = q.info.stats.shed_rows.load(Ordering::Relaxed);
        let labels = [("query", q.label.as_str())];
        sample(out, "vigil_query_shed_rows_total", &labels, shed);
    }
    header(
        out,
        "vigil_query_watermark_lag_seconds",
        "gauge",
        "Wall clock minus the last watermark a running query's sink saw.",
    );
    for q in queries {
        let watermark = q.info.stats.watermark.load(Ordering::Relaxed);
        if watermark != i64::MIN && watermark != crate::exec::END_OF_INPUT {
            let lag = lag_seconds(now_ms, watermark);
            sample(
                out,
                "vigil_query_watermark_lag_seconds",
                &[("query", &q.label)],
                lag,
            );
        }
    }
    header(
        out,
        "vigil_query_input_blocked_seconds_total",
        "counter",
        "Time a running query's reader of a file or other non-push stream waited for room in its queues (back-pressure).",
    );
    for q in queries {
        // A push stream's counters are the stream's, exported above.
        let own = q
            .info
            .inputs
            .iter()
            .filter(|(_, s)| !push.iter().any(|(_, p)| std::sync::Arc::ptr_eq(p, s)));
        for (stream, stats) in own {
            sample(
                out,
                "vigil_query_input_blocked_seconds_total",
                &[("query", &q.label), ("stream", stream)],
                seconds(stats.blocked_ns.load(Ordering::Relaxed)),
            );
        }
    }
    latency(out, queries);
}

/// The bad rows and client errors of each running query's inputs, and the
/// errors of its sink's client: what a Kafka stream or sink met while it
/// retried (an unreachable broker, a failed fetch, a failed delivery or
/// transaction), which stderr also warns of.
fn input_errors(out: &mut String, queries: &[Shown]) {
    type Value = fn(&SourceStats) -> u64;
    let series: [(&str, &str, Value); 2] = [
        (
            "vigil_query_input_bad_rows_total",
            "Rows of a stream a running query reads that did not decode, skipped (and dead-lettered, if the stream says where).",
            |s| s.bad_rows.load(Ordering::Relaxed),
        ),
        (
            "vigil_query_input_errors_total",
            "Errors the client of a stream a running query reads reported while it retried (a Kafka stream: an unreachable broker, a failed fetch).",
            |s| s.client_errors.load(Ordering::Relaxed),
        ),
    ];
    for (metric, help, value) in series {
        header(out, metric, "counter", help);
        for q in queries {
            for (stream, stats) in &q.info.inputs {
                let labels = [("query", q.label.as_str()), ("stream", stream)];
                sample(out, metric, &labels, value(stats));
            }
        }
    }
    header(
        out,
        "vigil_query_sink_errors_total",
        "counter",
        "Errors the client of a running query's sink met, each retried (a Kafka sink: an unreachable broker, a failed delivery or transaction).",
    );
    for q in queries {
        let errors = q.info.stats.sink_errors.get();
        let errors = errors.map_or(0, |e| e.load(Ordering::Relaxed));
        sample(
            out,
            "vigil_query_sink_errors_total",
            &[("query", &q.label)],
            errors,
        );
    }
}

/// Each running query's event-to-result latency, as a histogram in
/// seconds.
fn latency(out: &mut String, queries: &[Shown]) {
    const NAME: &str = "vigil_query_result_latency_seconds";
    header(
        out,
        NAME,
        "histogram",
        "Wall clock at a running query's sink minus the event time of each result row.",
    );
    for q in queries {
        let id = &q.label;
        let histogram: &LatencyHistogram = &q.info.stats.metrics.latency;
        let cumulative = histogram.cumulative();
        let bounds = LATENCY_BUCKETS_MS
            .iter()
            .map(|&ms| (ms as f64 / 1e3).to_string())
            .chain(std::iter::once("+Inf".to_string()));
        for (le, count) in bounds.zip(&cumulative) {
            sample(
                out,
                &format!("{NAME}_bucket"),
                &[("query", id), ("le", &le)],
                *count,
            );
        }
        let sum = histogram.sum_ms() as f64 / 1e3;
        sample(out, &format!("{NAME}_sum"), &[("query", id)], sum);
        let count = cumulative.last().copied().unwrap_or(0);
        sample(out, &format!("{NAME}_count"), &[("query", id)], count);
    }
}

/// The depth of every queue between the tasks of each running query.
fn queues(out: &mut String, queries: &[Shown]) {
    type Value = fn(&crate::exec::metrics::QueueGauge) -> f64;
    let series: [(&str, &str, &str, Value); 4] = [
        (
            "vigil_queue_rows",
            "gauge",
            "Rows waiting in a queue between two tasks of a running query.",
            |q| load_f(&q.queued_rows),
        ),
        (
            "vigil_queue_messages",
            "gauge",
            "Messages (batches, watermarks, barriers) waiting in a queue between two tasks of a running query.",
            |q| load_f(&q.queued_messages),
        ),
        (
            "vigil_queue_received_rows_total",
            "counter",
            "Rows taken out of a queue between two tasks of a running query.",
            |q| load_f(&q.received_rows),
        ),
        (
            "vigil_queue_blocked_seconds_total",
            "counter",
            "Time the sender into a queue of a running query waited for room (back-pressure).",
            |q| seconds(q.blocked_ns.load(Ordering::Relaxed)),
        ),
    ];
    let gauges: Vec<_> = queries
        .iter()
        .map(|q| (q.label.as_str(), q.info.stats.metrics.queue_list()))
        .collect();
    for (metric, kind, help, value) in series {
        header(out, metric, kind, help);
        for (id, list) in &gauges {
            for gauge in list {
                let labels = [("query", *id), ("queue", gauge.label.as_str())];
                sample(out, metric, &labels, value(gauge));
            }
        }
    }
}

/// Each operator's rows and time, summed over the instances of its stage.
fn operators(out: &mut String, queries: &[Shown]) {
    type Value = fn(&crate::analyze::OperatorRow) -> f64;
    let series: [(&str, &str, Value); 4] = [
        (
            "vigil_operator_rows_in_total",
            "Rows an operator of a running query was given.",
            |r| r.rows_in as f64,
        ),
        (
            "vigil_operator_rows_out_total",
            "Rows an operator of a running query emitted.",
            |r| r.rows_out as f64,
        ),
        (
            "vigil_operator_busy_seconds_total",
            "Time spent in an operator of a running query.",
            |r| seconds(r.busy_ns),
        ),
        (
            "vigil_operator_blocked_seconds_total",
            "Time the task of an operator (the last of its chain) waited to hand on its output (back-pressure).",
            |r| seconds(r.blocked_ns),
        ),
    ];
    let rows: Vec<_> = queries
        .iter()
        .map(|q| {
            let rows = crate::analyze::operator_rows(&q.info.stats.metrics);
            (q.label.as_str(), rows)
        })
        .collect();
    for (metric, help, value) in series {
        header(out, metric, "counter", help);
        for (id, list) in &rows {
            for row in list {
                let index = (row.index + 1).to_string();
                let labels = [
                    ("query", *id),
                    ("stage", row.stage.as_str()),
                    ("operator", index.as_str()),
                    ("name", row.name.as_str()),
                ];
                sample(out, metric, &labels, value(row));
            }
        }
    }
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

/// The queries scaled automatically (`SET autoscale = 'on'`): their
/// parallelism, what the last measurement wanted, the offered rate it saw,
/// and their rescales by direction.
fn autoscaling(out: &mut String, scaled: &[crate::session::Autoscaling]) {
    let series = [
        (
            "vigil_autoscale_parallelism",
            "gauge",
            "Instances a scaled query runs at.",
        ),
        (
            "vigil_autoscale_wanted_parallelism",
            "gauge",
            "Instances the last measurement of a scaled query asked for.",
        ),
        (
            "vigil_autoscale_offered_rows_per_second",
            "gauge",
            "Rows per second the sources of a scaled query offered at the last measurement.",
        ),
    ];
    for (i, (name, kind, help)) in series.iter().enumerate() {
        header(out, name, kind, help);
        for q in scaled {
            let label = q.id.to_string();
            let labels = [("query", label.as_str())];
            match (i, &q.verdict) {
                (0, _) => sample(out, name, &labels, q.parallelism),
                (1, Some(v)) => sample(out, name, &labels, v.wanted),
                (2, Some(v)) => sample(out, name, &labels, v.offered.round()),
                _ => {}
            }
        }
    }
    let name = "vigil_autoscale_rescales_total";
    header(
        out,
        name,
        "counter",
        "Rescales of a scaled query, by direction and outcome.",
    );
    for q in scaled {
        let label = q.id.to_string();
        let r = &q.rescales;
        for (direction, outcome, n) in [
            ("up", "made", r.up),
            ("down", "made", r.down),
            ("any", "failed", r.failed),
        ] {
            let labels = [
                ("query", label.as_str()),
                ("direction", direction),
                ("outcome", outcome),
            ];
            sample(out, name, &labels, n);
        }
    }
}

/// The processes group `name` needs and has, as its leader last worked
/// them out (see [`crate::group::scale`]).
pub(super) fn group_scale(out: &mut String, name: &str, verdict: &crate::group::scale::GroupScale) {
    header(
        out,
        "vigil_group_processes_wanted",
        "gauge",
        "Processes the group needs for the rate its topic gets (autoscale).",
    );
    sample(
        out,
        "vigil_group_processes_wanted",
        &[("group", name)],
        verdict.wanted,
    );
    header(
        out,
        "vigil_group_processes",
        "gauge",
        "Processes in the group when its need was last worked out.",
    );
    sample(
        out,
        "vigil_group_processes",
        &[("group", name)],
        verdict.processes,
    );
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
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
    fn a_group_shows_the_processes_it_needs_and_has() {
        let verdict = crate::group::scale::GroupScale {
            wanted: 3,
            processes: 1,
            offered: 9000.0,
            capacity: Some(4000.0),
            why: String::new(),
            decided_ms: 0,
            hooked: Some(3),
        };
        let mut out = String::new();
        group_scale(&mut out, "cpu", &verdict);
        assert!(
            out.contains("# TYPE vigil_group_processes_wanted gauge"),
            "{out}"
        );
        assert!(
            out.contains("vigil_group_processes_wanted{group=\"cpu\"} 3"),
            "{out}"
        );
        assert!(
            out.contains("vigil_group_processes{group=\"cpu\"} 1"),
            "{out}"
        );
    }

    #[test]
    fn a_scaled_query_shows_its_parallelism_wish_and_rescales() {
        use crate::runtime::autoscale::{AutoscaleSettings, Verdict};
        let scaled = crate::session::Autoscaling {
            id: 4,
            label: "q".into(),
            settings: AutoscaleSettings::defaults(2),
            parallelism: 2,
            verdict: Some(Verdict {
                wanted: 1,
                offered: 1999.6,
                by: None,
                why: String::new(),
            }),
            decisions: Vec::new(),
            rescales: crate::session::Rescales {
                up: 2,
                down: 1,
                failed: 0,
            },
        };
        let mut out = String::new();
        autoscaling(&mut out, &[scaled]);
        for line in [
            "vigil_autoscale_parallelism{query=\"4\"} 2",
            "vigil_autoscale_wanted_parallelism{query=\"4\"} 1",
            "vigil_autoscale_offered_rows_per_second{query=\"4\"} 2000",
            "vigil_autoscale_rescales_total{query=\"4\",direction=\"up\",outcome=\"made\"} 2",
            "vigil_autoscale_rescales_total{query=\"4\",direction=\"down\",outcome=\"made\"} 1",
            "# TYPE vigil_autoscale_rescales_total counter",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} in\n{out}");
        }
    }

    #[test]
    fn samples_escape_labels() {
        let mut out = String::new();
        sample(&mut out, "m", &[("stream", "a\"b\\c\nd"), ("q", "1")], 7);
        sample(&mut out, "n", &[], 0);
        assert_eq!(out, "m{stream=\"a\\\"b\\\\c\\nd\",q=\"1\"} 7\nn 0\n");
    }

    fn query(stats: crate::exec::QueryStats) -> Shown {
        let info = QueryInfo {
            id: 3,
            label: "q".into(),
            state: QueryState::Running,
            error: None,
            rows_out: 0,
            late_rows: 0,
            sources: Vec::new(),
            stats: std::sync::Arc::new(stats),
            inputs: Vec::new(),
        };
        running(vec![info], None).remove(0)
    }

    #[test]
    fn latency_is_a_histogram_in_seconds() {
        let stats = crate::exec::QueryStats::default();
        stats.metrics.latency.observe_n(4, 2);
        stats.metrics.latency.observe(400_000);
        let mut out = String::new();
        latency(&mut out, &[query(stats)]);
        for line in [
            "# TYPE vigil_query_result_latency_seconds histogram",
            "vigil_query_result_latency_seconds_bucket{query=\"3\",le=\"0.002\"} 0",
            "vigil_query_result_latency_seconds_bucket{query=\"3\",le=\"0.005\"} 2",
            "vigil_query_result_latency_seconds_bucket{query=\"3\",le=\"300\"} 2",
            "vigil_query_result_latency_seconds_bucket{query=\"3\",le=\"+Inf\"} 3",
            "vigil_query_result_latency_seconds_sum{query=\"3\"} 400.008",
            "vigil_query_result_latency_seconds_count{query=\"3\"} 3",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} in\n{out}");
        }
    }

    #[test]
    fn input_and_sink_errors_are_counted_per_query() {
        let source = std::sync::Arc::new(SourceStats::default());
        source.bad_rows.store(2, Ordering::Relaxed);
        source.client_errors.store(5, Ordering::Relaxed);
        let stats = crate::exec::QueryStats::default();
        let sink = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(7));
        stats.sink_errors.set(sink).unwrap();
        let mut shown = query(stats);
        shown.info.inputs.push(("k".into(), source));
        // A query whose sink counts no errors shows 0.
        let mut other = query(crate::exec::QueryStats::default());
        other.label = "q1-p0".into();
        let mut out = String::new();
        input_errors(&mut out, &[shown, other]);
        for line in [
            "# TYPE vigil_query_input_errors_total counter",
            "vigil_query_input_bad_rows_total{query=\"3\",stream=\"k\"} 2",
            "vigil_query_input_errors_total{query=\"3\",stream=\"k\"} 5",
            "vigil_query_sink_errors_total{query=\"3\"} 7",
            "vigil_query_sink_errors_total{query=\"q1-p0\"} 0",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} in\n{out}");
        }
    }

    #[test]
    fn queues_and_operators_are_labelled() {
        use crate::exec::metrics::{OperatorMetrics, QueueGauge};
        let stats = crate::exec::QueryStats::default();
        let gauge = QueueGauge::new("stage 1 instance 0", "s0");
        gauge.queued_rows.store(12, Ordering::Relaxed);
        gauge.blocked_ns.store(1_500_000_000, Ordering::Relaxed);
        stats.metrics.add_queue(std::sync::Arc::new(gauge));
        for instance in 0..2 {
            let op = OperatorMetrics {
                name: "filter x > 1".into(),
                stage: "s1".into(),
                instance,
                ..Default::default()
            };
            op.rows_in.store(10, Ordering::Relaxed);
            op.busy_ns.store(250_000_000, Ordering::Relaxed);
            stats.metrics.add_operator(std::sync::Arc::new(op));
        }
        let mut out = String::new();
        let queries = [query(stats)];
        queues(&mut out, &queries);
        operators(&mut out, &queries);
        let labels = "query=\"3\",stage=\"s1\",operator=\"1\",name=\"filter x > 1\"";
        for line in [
            "vigil_queue_rows{query=\"3\",queue=\"stage 1 instance 0\"} 12".to_string(),
            "vigil_queue_blocked_seconds_total{query=\"3\",queue=\"stage 1 instance 0\"} 1.5"
                .into(),
            format!("vigil_operator_rows_in_total{{{labels}}} 20"),
            format!("vigil_operator_busy_seconds_total{{{labels}}} 0.5"),
        ] {
            assert!(out.lines().any(|l| l == line), "{line} in\n{out}");
        }
    }
}
