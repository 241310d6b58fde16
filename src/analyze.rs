//! `EXPLAIN ANALYZE` and the tables it shares with the shell's `.stats`:
//! per operator, what it took, gave and cost; per queue, what waits in it;
//! and how long results take after their events.
//!
//! `EXPLAIN ANALYZE <query>` runs the query on a runtime of its own to the
//! end of its input, throws its results away and prints the plan, the
//! operators' measurements ([`crate::exec::metrics`]) summed over the
//! instances of each stage, and the run's totals. A query that never ends
//! (a followed file, pushed rows, stdin, a live feed) is refused: `.stats`
//! shows the same table for a running query.

use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::time::Instant;

use datafusion::arrow::record_batch::RecordBatch;

use crate::connector::Sink;
use crate::error::{Error, Result};
use crate::exec::QueryStats;
use crate::exec::metrics::{LatencyHistogram, QueryMetrics};
use crate::planner::{QueryGraph, never_ends};
use crate::runtime::autoscale::{AutoscaleSettings, OperatorSample, Sample, decide, scaled_stages};
use crate::runtime::checkpoint::{input_prefix, stage_prefix};
use crate::runtime::{RunReport, RunnableQuery};

/// One operator of a query: its measurements summed over the instances of
/// its stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorRow {
    /// Its stage, as checkpoints name it (`s1`, or `in0.s0` for a stage
    /// of input 0 before the inputs meet).
    pub stage: String,
    /// Its position in its stage's chain.
    pub index: usize,
    /// What `EXPLAIN` calls it.
    pub name: String,
    /// The instances of its stage.
    pub instances: usize,
    /// Rows it was given.
    pub rows_in: u64,
    /// Rows it emitted.
    pub rows_out: u64,
    /// Nanoseconds spent in it.
    pub busy_ns: u64,
    /// Nanoseconds its tasks waited to hand on their output.
    pub blocked_ns: u64,
}

impl OperatorRow {
    /// Busy time per instance: what limits the stage, whose instances run
    /// side by side.
    fn busy_per_instance(&self) -> u64 {
        self.busy_ns / self.instances.max(1) as u64
    }
}

/// The operators of `metrics`, one row per stage and position, in the
/// order they were registered.
pub fn operator_rows(metrics: &QueryMetrics) -> Vec<OperatorRow> {
    let mut rows: Vec<OperatorRow> = Vec::new();
    for op in metrics.operator_list() {
        let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
        let row = match rows
            .iter_mut()
            .find(|r| r.stage == op.stage && r.index == op.index)
        {
            Some(row) => {
                row.instances += 1;
                row
            }
            None => {
                rows.push(OperatorRow {
                    stage: op.stage.clone(),
                    index: op.index,
                    name: op.name.clone(),
                    instances: 1,
                    rows_in: 0,
                    rows_out: 0,
                    busy_ns: 0,
                    blocked_ns: 0,
                });
                rows.last_mut().expect("just pushed")
            }
        };
        row.rows_in += load(&op.rows_in);
        row.rows_out += load(&op.rows_out);
        row.busy_ns += load(&op.busy_ns);
        row.blocked_ns += load(&op.blocked_ns);
    }
    rows
}

/// The position in `rows` of the bottleneck: the operator with the most
/// busy time per instance; `None` when none has been busy.
pub fn bottleneck(rows: &[OperatorRow]) -> Option<usize> {
    rows.iter()
        .enumerate()
        .filter(|(_, r)| r.busy_ns > 0)
        .max_by_key(|(_, r)| r.busy_per_instance())
        .map(|(i, _)| i)
}

/// Per stage name, the number of the task `EXPLAIN` shows it as: the
/// stages of each input in turn, then those after the inputs meet.
pub fn task_numbers(graph: &QueryGraph) -> Vec<(String, usize)> {
    let before = graph
        .inputs
        .iter()
        .enumerate()
        .flat_map(|(i, input)| (0..input.stages.len()).map(move |j| input_prefix(i, j)));
    let after = (0..graph.stages.len()).map(stage_prefix);
    before
        .chain(after)
        .enumerate()
        .map(|(task, stage)| (stage, task + 1))
        .collect()
}

/// The operators as a table, the bottleneck marked with `*`. With `tasks`
/// (see [`task_numbers`]) stages are shown as `EXPLAIN`'s task numbers,
/// else by name.
pub fn operator_table(rows: &[OperatorRow], tasks: &[(String, usize)]) -> String {
    if rows.is_empty() {
        return "  no operator measured\n".into();
    }
    let slowest = bottleneck(rows);
    let mut table = vec![
        [
            if tasks.is_empty() { "stage" } else { "task" },
            "op",
            "instances",
            "rows in",
            "rows out",
            "busy",
            "blocked",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for row in rows {
        let stage = match tasks.iter().find(|(name, _)| *name == row.stage) {
            Some((_, task)) => task.to_string(),
            None => row.stage.clone(),
        };
        table.push(vec![
            stage,
            (row.index + 1).to_string(),
            row.instances.to_string(),
            thousands(row.rows_in),
            thousands(row.rows_out),
            duration(row.busy_ns),
            duration(row.blocked_ns),
        ]);
    }
    let names =
        std::iter::once("operator".to_string()).chain(rows.iter().enumerate().map(|(i, r)| {
            match Some(i) == slowest {
                true => format!("* {}", r.name),
                false => format!("  {}", r.name),
            }
        }));
    let mut text = String::new();
    for (cells, name) in align(&table).into_iter().zip(names) {
        let _ = writeln!(text, "  {cells}  {name}");
    }
    if slowest.is_some() {
        text.push_str("  * the bottleneck: the most busy time per instance\n");
    }
    text
}

/// The queues of `metrics` as a table; empty when it has none.
pub fn queue_table(metrics: &QueryMetrics) -> String {
    let queues = metrics.queue_list();
    if queues.is_empty() {
        return String::new();
    }
    let mut table = vec![
        ["rows", "messages", "taken", "blocked"]
            .map(String::from)
            .to_vec(),
    ];
    let mut labels = vec!["queue".to_string()];
    for q in &queues {
        let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
        table.push(vec![
            thousands(load(&q.queued_rows)),
            thousands(load(&q.queued_messages)),
            thousands(load(&q.received_rows)),
            duration(load(&q.blocked_ns)),
        ]);
        labels.push(q.label.clone());
    }
    let mut text = String::new();
    for (cells, label) in align(&table).into_iter().zip(labels) {
        let _ = writeln!(text, "  {cells}  {label}");
    }
    text
}

/// The latency quantiles, as a line: `None` before the first result.
pub fn latency_line(histogram: &LatencyHistogram) -> Option<String> {
    let quantiles: Vec<String> = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0)]
        .into_iter()
        .map(|(name, q)| {
            let bound = histogram.quantile(q)?;
            Some(match bound {
                u64::MAX => format!("{name} > {}", duration_ms(last_bound())),
                ms => format!("{name} <= {}", duration_ms(ms)),
            })
        })
        .collect::<Option<_>>()?;
    let count = histogram.cumulative().last().copied().unwrap_or(0);
    Some(format!(
        "event-to-result latency ({} rows): {}",
        thousands(count),
        quantiles.join(", ")
    ))
}

fn last_bound() -> u64 {
    crate::exec::metrics::LATENCY_BUCKETS_MS[crate::exec::metrics::LATENCY_BUCKETS_MS.len() - 1]
}

/// Everything `.stats` shows of one running query: operators, queues and
/// latency.
pub fn live_text(stats: &QueryStats) -> String {
    let mut text = operator_table(&operator_rows(&stats.metrics), &[]);
    let queues = queue_table(&stats.metrics);
    if !queues.is_empty() {
        text.push_str("queues:\n");
        text.push_str(&queues);
    }
    if let Some(line) = latency_line(&stats.metrics.latency) {
        let _ = writeln!(text, "{line}");
    }
    text
}

/// Fails unless every input of `graph` ends: a query `EXPLAIN ANALYZE`
/// runs must reach the end of its input.
pub fn check_finite(graph: &QueryGraph) -> Result<()> {
    for input in &graph.inputs {
        if let Some(why) = never_ends(&input.stream) {
            return Err(Error::Plan(format!(
                "EXPLAIN ANALYZE runs the query to the end of its input, but stream '{}' never ends ({why}); \
                 start the query and use .stats in the shell (or GET /metrics) to see its operators as it runs",
                input.stream.name
            )));
        }
    }
    Ok(())
}

/// Runs `graph` to the end of its input on a runtime of its own, its
/// results thrown away, and returns the measurements: the operator table
/// and the run's totals. Blocks the calling thread until the query ends.
///
/// With `autoscale` (`SET autoscale = 'on'`), it also says what the
/// controller would choose at the rate the run read its input.
pub fn run(graph: QueryGraph, autoscale: Option<&AutoscaleSettings>) -> Result<String> {
    check_finite(&graph)?;
    let stats = graph.stats.clone();
    let tasks = task_numbers(&graph);
    let scaled = scaled_stages(&graph);
    let current = graph.parallelism();
    let (report, wall) = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("vigil-analyze".into())
            .spawn_scoped(scope, move || run_to_end(graph))
            .map_err(|e| Error::io("cannot start a thread for EXPLAIN ANALYZE", e))?
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })?;
    let mut text = analysis(&stats, &report, wall, &tasks);
    if let Some(settings) = autoscale {
        text.push('\n');
        text.push_str(&scaling_line(
            settings,
            current,
            &run_sample(&stats, &report, wall, &scaled),
        ));
    }
    Ok(text)
}

/// The whole run as one measurement of the autoscaling controller.
fn run_sample(
    stats: &QueryStats,
    report: &RunReport,
    wall: std::time::Duration,
    scaled: &[String],
) -> Sample {
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    let streams = report
        .streams
        .iter()
        .filter(|(name, _)| !name.starts_with("late("));
    let operators = operator_rows(&stats.metrics)
        .into_iter()
        .map(|r| OperatorSample {
            name: format!("{} ({})", r.name, r.stage),
            scaled: scaled.contains(&r.stage),
            instances: r.instances,
            rows_in: r.rows_in,
            queued_rows: 0,
            busy_ns: r.busy_ns,
        })
        .collect();
    Sample {
        elapsed_ns: wall.as_nanos() as u64,
        source_rows: streams.clone().map(|(_, s)| load(&s.rows)).sum(),
        source_blocked_ns: streams.clone().map(|(_, s)| load(&s.blocked_ns)).sum(),
        buffered_rows: 0,
        sources: streams.count(),
        operators,
    }
}

/// What the controller would choose for a query at `current` instances
/// that measured `sample`, as a line.
fn scaling_line(settings: &AutoscaleSettings, current: usize, sample: &Sample) -> String {
    match decide(settings, current, sample) {
        Some(verdict) => format!(
            "autoscale ({}): at the rate this run read, parallelism {current} -> {} ({})",
            settings.policy, verdict.wanted, verdict.why
        ),
        None => format!(
            "autoscale ({}): nothing to decide on (no rows reached an operator that scales)",
            settings.policy
        ),
    }
}

fn run_to_end(graph: QueryGraph) -> Result<(RunReport, std::time::Duration)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("cannot start a runtime for EXPLAIN ANALYZE", e))?;
    let query = RunnableQuery {
        graph,
        sink: Box::new(Discard),
    };
    let started = Instant::now();
    let report = runtime.block_on(crate::runtime::run(vec![query]))?;
    Ok((report, started.elapsed()))
}

/// The text after the plan: operators, then totals.
fn analysis(
    stats: &QueryStats,
    report: &RunReport,
    wall: std::time::Duration,
    tasks: &[(String, usize)],
) -> String {
    let rows_read: u64 = report
        .streams
        .iter()
        // `late(...)` streams re-read rows other queries dropped.
        .filter(|(name, _)| !name.starts_with("late("))
        .map(|(_, s)| s.rows.load(Ordering::Relaxed))
        .sum();
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    let mut text = String::from("analyzed (the query ran to the end of its input):\n");
    text.push_str(&operator_table(&operator_rows(&stats.metrics), tasks));
    let _ = write!(
        text,
        "totals: {} read, {}, {} late, {} shed, wall time {}",
        rows(rows_read, "row"),
        rows(load(&stats.rows_out), "result row"),
        thousands(load(&stats.late_rows)),
        thousands(load(&stats.shed_rows)),
        duration(wall.as_nanos() as u64)
    );
    text
}

/// `1 row`, `1,000 rows`.
fn rows(n: u64, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        n => format!("{} {noun}s", thousands(n)),
    }
}

/// Takes results and keeps none.
struct Discard;

impl Sink for Discard {
    fn write(&mut self, _batch: &RecordBatch) -> Result<()> {
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Pads each column of `rows` to its widest cell, numbers to the right.
fn align(rows: &[Vec<String>]) -> Vec<String> {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|row| {
            row.iter()
                .zip(&widths)
                .map(|(cell, &w)| format!("{cell:>w$}"))
                .collect::<Vec<_>>()
                .join("  ")
        })
        .collect()
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Nanoseconds as a short duration: `0 ms`, `512 us`, `3.2 ms`, `1.25 s`.
pub fn duration(ns: u64) -> String {
    match ns {
        0 => "0 ms".into(),
        1..1_000_000 => format!("{} us", ns.div_ceil(1_000)),
        1_000_000..1_000_000_000 => format!("{:.1} ms", ns as f64 / 1e6),
        _ => format!("{:.2} s", ns as f64 / 1e9),
    }
}

fn duration_ms(ms: u64) -> String {
    duration(ms.saturating_mul(1_000_000))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::exec::metrics::{OperatorMetrics, QueueGauge};

    fn op(
        stage: &str,
        instance: usize,
        index: usize,
        name: &str,
        counts: [u64; 4],
    ) -> Arc<OperatorMetrics> {
        let m = OperatorMetrics {
            name: name.into(),
            stage: stage.into(),
            instance,
            index,
            ..Default::default()
        };
        m.rows_in.store(counts[0], Ordering::Relaxed);
        m.rows_out.store(counts[1], Ordering::Relaxed);
        m.busy_ns.store(counts[2], Ordering::Relaxed);
        m.blocked_ns.store(counts[3], Ordering::Relaxed);
        Arc::new(m)
    }

    #[test]
    fn instances_are_summed_and_the_bottleneck_is_per_instance() {
        let metrics = QueryMetrics::default();
        metrics.add_operator(op("s0", 0, 0, "filter", [1000, 120, 3_000_000, 0]));
        for instance in 0..2 {
            metrics.add_operator(op(
                "s1",
                instance,
                0,
                "window aggregate",
                [60, 5, 2_000_000, 7],
            ));
        }
        let rows = operator_rows(&metrics);
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (
                rows[1].instances,
                rows[1].rows_in,
                rows[1].rows_out,
                rows[1].busy_ns,
                rows[1].blocked_ns
            ),
            (2, 120, 10, 4_000_000, 14)
        );
        // 4 ms over two instances is less than the filter's 3 ms.
        assert_eq!(bottleneck(&rows), Some(0));
        let table = operator_table(&rows, &[("s0".into(), 1), ("s1".into(), 2)]);
        assert!(table.starts_with("  task"), "{table}");
        let live = operator_table(&rows, &[]);
        assert!(live.starts_with("  stage"), "{live}");
        assert!(live.contains("\n     s1  "), "{live}");
        assert!(table.contains("* filter"), "{table}");
        assert!(table.contains("  window aggregate"), "{table}");
        assert!(table.contains("1,000"), "{table}");
    }

    #[test]
    fn nothing_busy_marks_no_bottleneck() {
        let metrics = QueryMetrics::default();
        metrics.add_operator(op("s0", 0, 0, "project", [0, 0, 0, 0]));
        let table = operator_table(&operator_rows(&metrics), &[]);
        assert!(!table.contains('*'), "{table}");
    }

    #[test]
    fn queues_and_latency_are_shown_when_there_are_some() {
        let stats = QueryStats::default();
        assert_eq!(queue_table(&stats.metrics), "");
        assert_eq!(latency_line(&stats.metrics.latency), None);
        let gauge = Arc::new(QueueGauge::new("stage 1 instance 0", "s0"));
        gauge.queued_rows.store(4096, Ordering::Relaxed);
        gauge.queued_messages.store(2, Ordering::Relaxed);
        stats.metrics.add_queue(gauge);
        stats.metrics.latency.observe_n(3, 9);
        stats.metrics.latency.observe(700);
        let text = live_text(&stats);
        assert!(text.contains("4,096"), "{text}");
        assert!(text.contains("stage 1 instance 0"), "{text}");
        assert!(
            text.contains("(10 rows): p50 <= 5.0 ms, p90 <= 5.0 ms, p99 <= 1.00 s, max <= 1.00 s"),
            "{text}"
        );
    }

    #[test]
    fn durations_are_short() {
        assert_eq!(duration(0), "0 ms");
        assert_eq!(duration(1), "1 us");
        assert_eq!(duration(3_240_000), "3.2 ms");
        assert_eq!(duration(1_250_000_000), "1.25 s");
        assert_eq!(rows(1, "result row"), "1 result row");
        assert_eq!(rows(1000, "row"), "1,000 rows");
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }
}
