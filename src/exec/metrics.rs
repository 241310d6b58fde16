//! What a running query measures about itself: the depth of the queues
//! between its tasks, each operator's rows and time, and how long results
//! take after the events they are about.
//!
//! The runtime and the operators fill these counters; the front ends
//! (`/metrics`, the progress line, `EXPLAIN ANALYZE`, `.stats`) and the
//! load shedder read them. They are plain atomics, so reading never slows
//! the query down; a reader sees each counter's latest value, not one
//! consistent snapshot of them all.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// One bounded queue between two tasks of a query.
#[derive(Debug, Default)]
pub struct QueueGauge {
    /// Names the queue in listings: the stage it feeds, and with several
    /// instances which one and from which upstream task, such as
    /// `s1 i0 from 1`.
    pub label: String,
    /// The stage it feeds, named as checkpoints name stages: `in0.s1` is
    /// stage 1 of input 0, `s2` stage 2 after the inputs meet; the one
    /// after a line's last stage feeds what comes next (the merge, or the
    /// sink).
    pub stage: String,
    /// Rows waiting in it now.
    pub queued_rows: AtomicU64,
    /// Messages (batches, watermarks, barriers) waiting in it now.
    pub queued_messages: AtomicU64,
    /// Rows taken out of it so far: its throughput, over time.
    pub received_rows: AtomicU64,
    /// Nanoseconds its sender spent waiting for room (back-pressure).
    pub blocked_ns: AtomicU64,
}

impl QueueGauge {
    /// A gauge named `label`, for a queue feeding stage `stage`.
    pub fn new(label: impl Into<String>, stage: impl Into<String>) -> Self {
        Self {
            label: label.into(),
            stage: stage.into(),
            ..Self::default()
        }
    }
}

/// One operator instance: what it took, gave and cost.
#[derive(Debug, Default)]
pub struct OperatorMetrics {
    /// What `EXPLAIN` calls it.
    pub name: String,
    /// Its stage, named as [`QueueGauge::stage`] names them.
    pub stage: String,
    /// Which instance of the stage it is.
    pub instance: usize,
    /// Its position in its chain of fused operators.
    pub index: usize,
    /// Rows it was given.
    pub rows_in: AtomicU64,
    /// Rows it emitted.
    pub rows_out: AtomicU64,
    /// Nanoseconds spent in it.
    pub busy_ns: AtomicU64,
    /// Nanoseconds its task waited to hand on what it emitted: charged to
    /// the last operator of a chain, since the whole task waits.
    pub blocked_ns: AtomicU64,
}

/// Upper bounds of the latency histogram's buckets, in milliseconds: the
/// last bucket counts everything above the highest bound.
pub const LATENCY_BUCKETS_MS: [u64; 16] = [
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 300_000,
];

/// A histogram of latencies in milliseconds, with fixed buckets
/// ([`LATENCY_BUCKETS_MS`]), as Prometheus histograms are.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Per bucket, how many observations fell in it (not cumulative); one
    /// more than the bounds, for the overflow.
    counts: [AtomicU64; LATENCY_BUCKETS_MS.len() + 1],
    /// The sum of every observation, in milliseconds.
    sum_ms: AtomicU64,
}

impl LatencyHistogram {
    /// Records one latency of `ms` milliseconds (a negative one, from a
    /// clock behind the events, counts as 0).
    pub fn observe(&self, ms: i64) {
        self.observe_n(ms, 1);
    }

    /// Records `n` observations of `ms` milliseconds.
    pub fn observe_n(&self, ms: i64, n: u64) {
        let ms = ms.max(0) as u64;
        self.counts[bucket_of(ms)].fetch_add(n, Ordering::Relaxed);
        self.sum_ms
            .fetch_add(ms.saturating_mul(n), Ordering::Relaxed);
    }

    /// Records every latency of `ms`, counting them locally first so that
    /// a large batch costs one atomic add per bucket, not per row.
    pub fn observe_all(&self, ms: impl Iterator<Item = i64>) {
        let mut counts = [0u64; LATENCY_BUCKETS_MS.len() + 1];
        let mut sum = 0u64;
        for ms in ms {
            let ms = ms.max(0) as u64;
            counts[bucket_of(ms)] += 1;
            sum = sum.saturating_add(ms);
        }
        for (bucket, n) in counts.iter().enumerate().filter(|(_, n)| **n > 0) {
            self.counts[bucket].fetch_add(*n, Ordering::Relaxed);
        }
        self.sum_ms.fetch_add(sum, Ordering::Relaxed);
    }

    /// The number of observations per bucket, cumulative (as Prometheus's
    /// `_bucket{le=...}` series are); the last is the total count.
    pub fn cumulative(&self) -> Vec<u64> {
        let mut total = 0;
        self.counts
            .iter()
            .map(|c| {
                total += c.load(Ordering::Relaxed);
                total
            })
            .collect()
    }

    /// The sum of every observation, in milliseconds.
    pub fn sum_ms(&self) -> u64 {
        self.sum_ms.load(Ordering::Relaxed)
    }

    /// The upper bound of the bucket holding quantile `q` (0 to 1), in
    /// milliseconds; `None` with no observation, and `u64::MAX` when it
    /// lies beyond the highest bound.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let cumulative = self.cumulative();
        let total = *cumulative.last()?;
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let bucket = cumulative.iter().position(|&c| c >= rank)?;
        Some(LATENCY_BUCKETS_MS.get(bucket).copied().unwrap_or(u64::MAX))
    }
}

/// The measurements of one query, shared by its tasks.
#[derive(Debug, Default)]
pub struct QueryMetrics {
    /// Every queue between its tasks, in the order they were made.
    pub queues: Mutex<Vec<Arc<QueueGauge>>>,
    /// Every operator instance, in stage, instance and chain order.
    pub operators: Mutex<Vec<Arc<OperatorMetrics>>>,
    /// Wall clock at the sink minus the event time of each result row
    /// (see [`crate::exec::QueryStats::latency`] for which column).
    pub latency: LatencyHistogram,
}

impl QueryMetrics {
    /// Adds a queue.
    pub fn add_queue(&self, gauge: Arc<QueueGauge>) {
        lock(&self.queues).push(gauge);
    }

    /// Adds an operator instance.
    pub fn add_operator(&self, metrics: Arc<OperatorMetrics>) {
        lock(&self.operators).push(metrics);
    }

    /// The queues, as they are now.
    pub fn queue_list(&self) -> Vec<Arc<QueueGauge>> {
        lock(&self.queues).clone()
    }

    /// The operator instances, as they are now.
    pub fn operator_list(&self) -> Vec<Arc<OperatorMetrics>> {
        lock(&self.operators).clone()
    }

    /// Rows waiting in all of the query's queues.
    pub fn queued_rows(&self) -> u64 {
        lock(&self.queues)
            .iter()
            .map(|q| q.queued_rows.load(Ordering::Relaxed))
            .sum()
    }
}

/// The bucket of a latency of `ms` milliseconds.
fn bucket_of(ms: u64) -> usize {
    LATENCY_BUCKETS_MS
        .iter()
        .position(|&bound| ms <= bound)
        .unwrap_or(LATENCY_BUCKETS_MS.len())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_bucket_bounds() {
        let h = LatencyHistogram::default();
        assert_eq!(h.quantile(0.5), None);
        for ms in [3, 3, 3, 40, 900] {
            h.observe(ms);
        }
        assert_eq!(h.quantile(0.5), Some(5));
        assert_eq!(h.quantile(0.8), Some(50));
        assert_eq!(h.quantile(1.0), Some(1_000));
        assert_eq!(h.sum_ms(), 949);
        h.observe_all([1_000_000].into_iter());
        assert_eq!(h.quantile(1.0), Some(u64::MAX));
        assert_eq!(*h.cumulative().last().unwrap(), 6);
    }

    #[test]
    fn negative_latency_counts_as_zero() {
        let h = LatencyHistogram::default();
        h.observe(-5);
        assert_eq!(h.quantile(0.5), Some(1));
        assert_eq!(h.sum_ms(), 0);
    }
}
