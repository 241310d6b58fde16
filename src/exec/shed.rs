//! Load shedding: dropping input rows, by a policy and at a rate a control
//! loop adjusts, so that a query's results stay within a latency bound when
//! its input comes faster than it can be processed.
//!
//! [`ShedOp`] runs on the stream's rows before anything else of the query,
//! in a task of one instance ahead of the expensive work, so dropping stays
//! cheap when the stage after it is the bottleneck. It keeps each row or
//! drops it by its [`ShedPolicy`]:
//!
//! - `random`: each row is dropped with probability `p` (a seeded PRNG),
//!   so what is kept is a uniform sample;
//! - `priority`: rows matching `shed_keep` are always kept, the others are
//!   dropped with probability `p`;
//! - `window`: each (pane, key) group is kept or dropped whole, decided the
//!   first time the group is seen by hashing (pane, key) against `p`, and
//!   remembered until the pane's windows close; so the windows that survive
//!   (for a tumbling window, a pane is its window) are exact.
//!
//! # The controller
//!
//! Every [`TICK`] it estimates the query's latency as the time its queued
//! rows take to drain: per queue, queued rows divided by the rate it drains
//! at (an average of the `received_rows` deltas per tick), the most of a
//! stage's instances, summed over the stages; plus, for live data only, the
//! event-time lag: the larger of the lag of the rows reaching the shed op
//! (wall clock minus the largest event time seen) and that of the query's
//! sink (wall clock minus `QueryStats::watermark`, less the watermark
//! delay). Data counts as live when its first event time
//! was within [`LIVE_WITHIN`] of the wall clock. Input that is not live (a
//! replay of old data) is never shed: its results are late by design, its
//! lag is one no shedding would close, and shedding would only lose rows.
//! (A stream without event time counts as live, and only its queues
//! count.)
//!
//! It aims at half of `max_latency`, leaving the other half for the time a
//! correction takes to show: above that, `p += GAIN * (estimate / aim - 1)`
//! (proportional to the overload, so 3x over the aim adds `2 * GAIN` per
//! tick), bounded by [`MAX_DROP`] so that some rows always get through;
//! below a quarter of `max_latency`, `p *= DECAY` per tick (it halves in
//! about 2.3 s) and snaps to 0 under 0.001; in between it holds, a dead band
//! that keeps it from oscillating.
//!
//! # Accounting
//!
//! Dropped rows are counted in `QueryStats::shed_rows`. For a windowed
//! aggregate, the op also records, per (pane, key), how many rows it kept
//! and dropped in a [`ShedLedger`] shared with the aggregate's instances,
//! which read it when a window fires: the watermark that fires a window
//! reaches the aggregate only after this op has handled every row before
//! it. A row the window operator after it would drop as late is neither
//! shed nor counted, so the ledger holds exactly the rows assigned to each
//! pane. Both counts are taken before the query's `WHERE`, so
//! `_shed_fraction` is the share of the stream's rows of that window and
//! key that were dropped.
//!
//! # Scaling
//!
//! With `shed_scale = 'true'`, the aggregate multiplies `count` and `sum`
//! by `1 / (1 - f)`, `f` being the row's `_shed_fraction`: the
//! Horvitz-Thompson estimator, each kept row standing for the `1 / (1 - f)`
//! rows it was sampled from, unbiased when the rows kept are a uniform
//! sample (`random`). It is not applied under `priority`, whose kept rows
//! are chosen by a predicate and are not a uniform sample. Under `window`,
//! a (pane, key) is kept or dropped whole, so a tumbling window that
//! survives has `f = 0` and is left as it is; a hopping window some of
//! whose panes were dropped is scaled from the panes it kept, as if they
//! were a sample of its panes; a window whose every pane was dropped has no
//! result at all.
//!
//! With several instances of the aggregate, each reads the ledger for its
//! own keys only; an entry is forgotten once every instance's watermark
//! has passed the last window holding it.
//!
//! The dropped rows are also added to the stream's `SourceStats::shed_rows`
//! (over every query reading it), through `QueryStats::sources`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, UInt64Array,
};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimestampMillisecondType};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_expr::PhysicalExpr;

use super::metrics::QueueGauge;
use super::{Message, Operator, QueryStats};
use crate::error::{Error, Result};
use crate::plan::WindowSpec;
use crate::state::OperatorState;

/// How often the controller runs.
pub const TICK: Duration = Duration::from_millis(100);
/// Drop fraction added per tick per unit of overload.
pub const GAIN: f64 = 0.05;
/// Factor the drop fraction decays by per tick while the load is low.
pub const DECAY: f64 = 0.97;
/// The largest drop fraction: some rows always get through.
pub const MAX_DROP: f64 = 0.99;
/// Input whose first event time is this close to the wall clock is live,
/// and its event-time lag counts as latency.
pub const LIVE_WITHIN: Duration = Duration::from_secs(60);

/// The name of the column windowed results of shed input carry.
pub const SHED_FRACTION: &str = "_shed_fraction";

/// Which rows a shedder drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedPolicy {
    /// A uniform sample.
    Random,
    /// Rows matching `shed_keep` are kept; the others are sampled.
    Priority,
    /// Whole (window, key) groups.
    Window,
}

impl ShedPolicy {
    /// Parses a `shed` setting: `Ok(None)` for `'off'`.
    pub fn parse(text: &str) -> Result<Option<Self>> {
        match text.trim().to_ascii_lowercase().as_str() {
            "random" => Ok(Some(ShedPolicy::Random)),
            "priority" => Ok(Some(ShedPolicy::Priority)),
            "window" => Ok(Some(ShedPolicy::Window)),
            "off" | "none" | "false" => Ok(None),
            _ => Err(Error::Plan(format!(
                "shed must be 'random', 'priority', 'window' or 'off', got '{text}'"
            ))),
        }
    }
}

impl fmt::Display for ShedPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShedPolicy::Random => "random",
            ShedPolicy::Priority => "priority",
            ShedPolicy::Window => "window",
        })
    }
}

/// The shedding settings as written, in a stream's `WITH (...)` or by
/// `SET`: each `None` when not given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShedSettings {
    /// `shed`: the policy, or `'off'`.
    pub policy: Option<String>,
    /// `max_latency`: an interval such as `'2 seconds'`.
    pub max_latency: Option<String>,
    /// `shed_keep`: a boolean SQL expression over the stream's columns.
    pub keep: Option<String>,
    /// `shed_scale`: `'true'` or `'false'`.
    pub scale: Option<String>,
}

impl ShedSettings {
    /// The option and setting names.
    pub const KEYS: [&'static str; 4] = ["shed", "max_latency", "shed_keep", "shed_scale"];

    /// The shedding options among a stream's `WITH` options.
    pub fn from_options(options: &[(String, String)]) -> Self {
        let mut settings = Self::default();
        for (key, value) in options {
            settings.set(key, value);
        }
        settings
    }

    /// Takes setting `name` if it is one of [`Self::KEYS`]; false if not.
    pub fn set(&mut self, name: &str, value: &str) -> bool {
        let slot = match name {
            "shed" => &mut self.policy,
            "max_latency" => &mut self.max_latency,
            "shed_keep" => &mut self.keep,
            "shed_scale" => &mut self.scale,
            _ => return false,
        };
        *slot = Some(value.to_string());
        true
    }

    /// These settings with each one `over` gives replaced.
    pub fn overridden_by(&self, over: &ShedSettings) -> ShedSettings {
        let pick = |mine: &Option<String>, theirs: &Option<String>| theirs.clone().or(mine.clone());
        ShedSettings {
            policy: pick(&self.policy, &over.policy),
            max_latency: pick(&self.max_latency, &over.max_latency),
            keep: pick(&self.keep, &over.keep),
            scale: pick(&self.scale, &over.scale),
        }
    }

    /// The `shed_scale` flag.
    pub fn scale_flag(&self) -> Result<bool> {
        match self.scale.as_deref().map(|s| s.trim().to_ascii_lowercase()) {
            None => Ok(false),
            Some(s) if s == "true" => Ok(true),
            Some(s) if s == "false" => Ok(false),
            Some(_) => Err(Error::Plan(format!(
                "shed_scale must be 'true' or 'false', got '{}'",
                self.scale.as_deref().unwrap_or_default()
            ))),
        }
    }
}

/// The default `max_latency` when shedding is on without one.
pub const DEFAULT_MAX_LATENCY: Duration = Duration::from_secs(2);

/// Shedding as a query is planned with it.
#[derive(Debug, Clone)]
pub struct ShedConfig {
    /// Which rows are dropped.
    pub policy: ShedPolicy,
    /// The latency bound the controller holds results under.
    pub max_latency: Duration,
    /// For `priority`: the rows always kept, over the stream's columns.
    pub keep: Option<Arc<dyn PhysicalExpr>>,
    /// Whether counts and sums are scaled up by the share kept.
    pub scale: bool,
}

/// A hash per row of the grouping key `columns` (0 for every row when there
/// are none), the same for equal keys wherever it is computed and across
/// runs of one build (DataFusion's hashing with a fixed seed): the
/// ledger's and the `window` policy's key.
pub fn key_hashes(columns: &[ArrayRef], rows: usize) -> Result<Vec<u64>> {
    let mut hashes = vec![0; rows];
    if !columns.is_empty() {
        datafusion::common::hash_utils::create_hashes(
            columns,
            &datafusion::common::hash_utils::HLL_RANDOM_STATE,
            &mut hashes,
        )?;
    }
    Ok(hashes)
}

/// What a shed op needs to account per window: where rows' panes and keys
/// are, and the window operator's lateness rule.
pub struct ShedWindows {
    /// The event-time column of the stream.
    pub time_column: usize,
    /// The query's windows.
    pub spec: WindowSpec,
    /// The watermark delay the window operator uses.
    pub delay_ms: i64,
    /// The allowed lateness the window operator uses.
    pub lateness_ms: i64,
    /// The stream columns holding the aggregate's grouping keys, in order.
    pub keys: Vec<usize>,
    /// Where the counts go.
    pub ledger: Arc<ShedLedger>,
}

/// The control loop: turns latency estimates into a drop fraction.
#[derive(Debug, Clone)]
pub struct Controller {
    max_latency_ms: f64,
    drop: f64,
}

impl Controller {
    /// A controller holding latency under `max_latency`.
    pub fn new(max_latency: Duration) -> Self {
        Self {
            max_latency_ms: (max_latency.as_secs_f64() * 1000.0).max(1.0),
            drop: 0.0,
        }
    }

    /// The current drop fraction.
    pub fn drop_fraction(&self) -> f64 {
        self.drop
    }

    /// One tick with latency estimated at `estimate_ms`; returns the new
    /// drop fraction.
    pub fn update(&mut self, estimate_ms: f64) -> f64 {
        self.update_over(estimate_ms, 1.0)
    }

    /// As [`Controller::update`], for `ticks` ticks' worth of time (a task
    /// blocked on back-pressure ticks late; its correction should not be
    /// smaller for it).
    pub fn update_over(&mut self, estimate_ms: f64, ticks: f64) -> f64 {
        let ticks = ticks.clamp(0.0, 10.0);
        let aim = self.max_latency_ms / 2.0;
        if estimate_ms > aim {
            self.drop = (self.drop + ticks * GAIN * (estimate_ms / aim - 1.0)).min(MAX_DROP);
        } else if estimate_ms < self.max_latency_ms / 4.0 {
            self.drop *= DECAY.powf(ticks);
            if self.drop < 0.001 {
                self.drop = 0.0;
            }
        }
        self.drop
    }
}

/// Per queue, its `received_rows` at the last tick and its drain rate.
#[derive(Debug, Default)]
struct QueueDrain {
    received: u64,
    rows_per_s: Option<f64>,
}

/// Estimates queueing delay from the query's queue gauges.
#[derive(Debug, Default)]
struct QueueWatch {
    drains: Vec<QueueDrain>,
    last: Option<Instant>,
}

impl QueueWatch {
    /// Milliseconds of work queued: per queue, rows waiting over the rate
    /// it drains at; per stage the most of its instances' queues (they
    /// drain side by side), summed over the stages (they drain one after
    /// another). A queue not yet seen draining counts for nothing.
    fn delay_ms(&mut self, queues: &[Arc<QueueGauge>], now: Instant) -> f64 {
        let elapsed = self.last.map(|t| now.duration_since(t).as_secs_f64());
        self.last = Some(now);
        self.drains.resize_with(queues.len(), QueueDrain::default);
        let mut stages: HashMap<&str, f64> = HashMap::new();
        for (queue, drain) in queues.iter().zip(&mut self.drains) {
            let received = queue.received_rows.load(Ordering::Relaxed);
            if let Some(dt) = elapsed.filter(|dt| *dt > 0.0) {
                let rate = received.saturating_sub(drain.received) as f64 / dt;
                drain.rows_per_s = Some(match drain.rows_per_s {
                    Some(r) => 0.7 * r + 0.3 * rate,
                    None => rate,
                });
            }
            drain.received = received;
            let queued = queue.queued_rows.load(Ordering::Relaxed) as f64;
            let delay = match drain.rows_per_s.filter(|r| *r > 0.0) {
                Some(rate) => queued / rate * 1000.0,
                None => 0.0,
            };
            let stage = stages.entry(queue.stage.as_str()).or_default();
            *stage = stage.max(delay);
        }
        stages.values().sum()
    }
}

/// Drops input rows by a [`ShedPolicy`] at the rate its [`Controller`]
/// sets; see the module documentation.
///
/// Contract: it hands on the rows it keeps in their order and every
/// watermark unchanged; it never drops a row the window operator after it
/// would find late; `QueryStats::shed_rows` and the ledger (when given)
/// count exactly the rows it dropped. With windows, it also sends the
/// watermark its dropped rows make when that closes a pane, so windows
/// fire on time when the latest rows were dropped.
pub struct ShedOp {
    policy: ShedPolicy,
    keep: Option<Arc<dyn PhysicalExpr>>,
    windows: Option<ShedWindows>,
    controller: Controller,
    queues: QueueWatch,
    rng: fastrand::Rng,
    /// For `window`: per pane, each key's decision (true to keep).
    decisions: BTreeMap<i64, HashMap<u64, bool>>,
    /// The largest event time the window operator after it has seen: of
    /// a row handed on, or `delay` past a watermark sent.
    max_kept: i64,
    /// The largest event time of any row.
    max_seen: i64,
    /// Whether the input is live; decided at its first row.
    live: Option<bool>,
    /// The stream's event-time column, if it has one.
    time_column: Option<usize>,
    /// Kept rows not handed on yet, gathered into batches as full as the
    /// input's: the stages after it cost per batch as well as per row.
    held: Vec<RecordBatch>,
    held_rows: usize,
    /// The most rows an input batch had.
    batch_rows: usize,
    /// The input's schema, for an empty `held` table.
    schema: SchemaRef,
    /// Rows dropped and not yet counted in the stream's `shed_rows` (the
    /// runtime tells the query its streams' counters once they start).
    unreported: u64,
    stats: Arc<QueryStats>,
}

/// The seed of the sampling PRNG: fixed, so a run can be repeated.
const SEED: u64 = 0x5eed_5eed;

impl ShedOp {
    /// A shedder of rows of `schema` by `policy`, keeping rows matching `keep` (for
    /// `priority`), accounting per window by `windows` (for a windowed
    /// aggregate; required by `window`), under `max_latency`.
    pub fn try_new(
        schema: SchemaRef,
        policy: ShedPolicy,
        max_latency: Duration,
        keep: Option<Arc<dyn PhysicalExpr>>,
        windows: Option<ShedWindows>,
        stats: Arc<QueryStats>,
    ) -> Result<Self> {
        if policy == ShedPolicy::Priority && keep.is_none() {
            return Err(Error::Plan("shed = 'priority' needs shed_keep".into()));
        }
        if policy == ShedPolicy::Window && windows.is_none() {
            return Err(Error::Plan(
                "shed = 'window' needs a windowed aggregate to drop windows of".into(),
            ));
        }
        Ok(Self {
            policy,
            keep,
            controller: Controller::new(max_latency),
            queues: QueueWatch::default(),
            rng: fastrand::Rng::with_seed(SEED),
            decisions: BTreeMap::new(),
            max_kept: i64::MIN,
            max_seen: i64::MIN,
            live: None,
            time_column: windows.as_ref().map(|w| w.time_column),
            held: Vec::new(),
            held_rows: 0,
            batch_rows: 0,
            schema,
            unreported: 0,
            windows,
            stats,
        })
    }

    /// The current drop fraction.
    pub fn drop_fraction(&self) -> f64 {
        self.controller.drop_fraction()
    }

    /// Reads event times from `column` (of a query without windows), for
    /// the event-time lag.
    pub fn with_time_column(mut self, column: Option<usize>) -> Self {
        if self.windows.is_none() {
            self.time_column = column;
        }
        self
    }

    /// Sets the drop fraction, as the controller would (for tests and
    /// benchmarks).
    pub fn set_drop_fraction(&mut self, drop: f64) {
        self.controller.drop = drop.clamp(0.0, MAX_DROP);
    }

    /// The event-time lag at this op, and at the query's sink (wall clock
    /// minus its last watermark, less the watermark's own delay); both 0
    /// unless the input is live.
    fn event_lags_ms(&self) -> (f64, f64) {
        if self.live != Some(true) || self.max_seen == i64::MIN {
            return (0.0, 0.0);
        }
        let now = now_ms();
        let here = now - self.max_seen;
        let delay = self.windows.as_ref().map_or(0, |w| w.delay_ms);
        let sink = match self.stats.watermark.load(Ordering::Relaxed) {
            i64::MIN => 0,
            w => now.saturating_sub(w).saturating_sub(delay),
        };
        (here.max(0) as f64, sink.max(0) as f64)
    }

    /// The latency estimate: the queues after the rows now arriving, plus
    /// how late they arrive, or the sink's lag if that is more.
    fn estimate_ms(&mut self, now: Instant) -> f64 {
        if self.live == Some(false) {
            return 0.0;
        }
        let queues = self.stats.metrics.queue_list();
        let queued = self.queues.delay_ms(&queues, now);
        let (here, sink) = self.event_lags_ms();
        (queued + here).max(sink)
    }

    /// Per row, whether it always passes: a late row (left for the window
    /// operator to drop and count) or, for `priority`, one matching
    /// `shed_keep`.
    fn protected(&self, batch: &RecordBatch) -> Result<Option<BooleanArray>> {
        let Some(keep) = &self.keep else {
            return Ok(None);
        };
        let mask = keep.evaluate(batch)?.into_array(batch.num_rows())?;
        Ok(Some(mask.as_boolean().clone()))
    }

    fn note_times(&mut self, batch: &RecordBatch) {
        let Some(column) = self.time_column else {
            return;
        };
        let times = batch
            .column(column)
            .as_primitive::<TimestampMillisecondType>();
        if let Some(max) = datafusion::arrow::compute::max(times) {
            if self.live.is_none() {
                let lag = (now_ms() - max).unsigned_abs();
                self.live = Some(lag <= LIVE_WITHIN.as_millis() as u64);
            }
            self.max_seen = self.max_seen.max(max);
        }
    }

    /// Decides each row: true to keep.
    fn decide(&mut self, batch: &RecordBatch) -> Result<(Vec<bool>, Counts)> {
        let rows = batch.num_rows();
        let p = self.controller.drop;
        let protected = self.protected(batch)?;
        let mut keep = Vec::with_capacity(rows);
        let mut counts: Counts = HashMap::new();
        let Some(w) = &self.windows else {
            for row in 0..rows {
                let kept = protected
                    .as_ref()
                    .is_some_and(|m| m.value(row) && m.is_valid(row))
                    || p == 0.0
                    || self.rng.f64() >= p;
                keep.push(kept);
            }
            return Ok((keep, counts));
        };
        let times = batch
            .column(w.time_column)
            .as_primitive::<TimestampMillisecondType>();
        let key_columns: Vec<ArrayRef> = w.keys.iter().map(|&i| batch.column(i).clone()).collect();
        let keys = key_hashes(&key_columns, rows)?;
        let size = w.spec.size_ms();
        for (row, &key) in keys.iter().enumerate() {
            let Some(t) = times.is_valid(row).then(|| times.value(row)) else {
                keep.push(true);
                continue;
            };
            // The window operator's rule: a new largest time is on time,
            // another is late once its last window (and lateness) closed.
            let watermark = self.max_kept.max(t).saturating_sub(w.delay_ms);
            if w.spec.last_window_start(t) + size + w.lateness_ms <= watermark {
                keep.push(true);
                continue;
            }
            let pane = w.spec.pane_start(t);
            let kept = match self.policy {
                ShedPolicy::Window => *self
                    .decisions
                    .entry(pane)
                    .or_default()
                    .entry(key)
                    .or_insert_with(|| unit(mix(pane as u64, key)) >= p),
                _ => {
                    protected
                        .as_ref()
                        .is_some_and(|m| m.is_valid(row) && m.value(row))
                        || p == 0.0
                        || self.rng.f64() >= p
                }
            };
            let tally = counts.entry((pane, key)).or_default();
            if kept {
                tally.kept += 1;
                self.max_kept = self.max_kept.max(t);
            } else {
                tally.dropped += 1;
            }
            keep.push(kept);
        }
        Ok((keep, counts))
    }
}

/// Milliseconds since the epoch, now.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A 64-bit mix of two values (splitmix64's finalizer over their xor).
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a.rotate_left(32) ^ b;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A hash as a number in [0, 1).
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

impl Operator for ShedOp {
    fn describe(&self) -> String {
        let mut text = format!(
            "shed {} under {} ms",
            self.policy, self.controller.max_latency_ms as u64
        );
        if let Some(keep) = &self.keep {
            text.push_str(&format!(", keeping {keep}"));
        }
        if let Some(w) = &self.windows {
            text.push_str(&format!(", accounting per {}", w.spec));
        }
        text
    }

    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        self.note_times(&batch);
        let (keep, counts) = self.decide(&batch)?;
        let dropped = keep.iter().filter(|k| !**k).count();
        if let Some(w) = &self.windows
            && !counts.is_empty()
        {
            w.ledger.record(&counts);
        }
        self.send_dropped_time(out)?;
        self.batch_rows = self.batch_rows.max(batch.num_rows());
        if dropped == 0 && self.held.is_empty() {
            out.push(Message::Batch(batch));
            return Ok(());
        }
        self.stats
            .shed_rows
            .fetch_add(dropped as u64, Ordering::Relaxed);
        self.unreported += dropped as u64;
        self.report_to_streams();
        let kept = match dropped {
            0 => batch,
            _ => filter_record_batch(&batch, &BooleanArray::from(keep))?,
        };
        if kept.num_rows() > 0 {
            self.held_rows += kept.num_rows();
            self.held.push(kept);
        }
        if self.held_rows >= self.batch_rows {
            self.flush(out)?;
        }
        Ok(())
    }

    fn tick_interval(&self) -> Option<Duration> {
        Some(TICK)
    }

    fn on_tick(&mut self, out: &mut Vec<Message>) -> Result<()> {
        self.flush(out)?;
        self.report_to_streams();
        let now = Instant::now();
        let ticks = match self.queues.last {
            Some(last) => now.duration_since(last).as_secs_f64() / TICK.as_secs_f64(),
            None => 1.0,
        };
        let estimate = self.estimate_ms(now);
        self.controller.update_over(estimate, ticks);
        Ok(())
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        self.flush(out)?;
        self.report_to_streams();
        if let Some(w) = &self.windows {
            let horizon = w.spec.size_ms() + w.lateness_ms;
            let spec = w.spec;
            self.decisions.retain(|&pane, _| {
                spec.last_window_start(pane).saturating_add(horizon) > watermark
            });
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    /// Tables: `meta` (the drop fraction, in millionths; the largest event
    /// times; liveness), `decisions` (for `window`: pane, key, keep),
    /// `ledger` (pane, key, kept, dropped) and `held` (kept rows not yet
    /// handed on).
    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        let seen = |v: i64| (v != i64::MIN).then_some(v);
        let mut state = OperatorState::new();
        state.add_scalars(
            "meta",
            &[
                ("drop_ppm", Some((self.controller.drop * 1e6) as i64)),
                ("max_kept", seen(self.max_kept)),
                ("max_seen", seen(self.max_seen)),
                ("live", self.live.map(i64::from)),
            ],
        );
        state.add("decisions", self.decision_table()?, Vec::new());
        let ledger = match &self.windows {
            Some(w) => w.ledger.table()?,
            None => RecordBatch::new_empty(ledger_schema()),
        };
        state.add("ledger", ledger, Vec::new());
        let held = datafusion::arrow::compute::concat_batches(&self.schema, &self.held)?;
        state.add("held", held, Vec::new());
        Ok(Some(state))
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        let drop = state.scalar("meta", "drop_ppm")?.unwrap_or(0);
        self.set_drop_fraction(drop as f64 / 1e6);
        self.max_kept = state.scalar("meta", "max_kept")?.unwrap_or(i64::MIN);
        self.max_seen = state.scalar("meta", "max_seen")?.unwrap_or(i64::MIN);
        self.live = state.scalar("meta", "live")?.map(|v| v != 0);
        self.restore_decisions(state.table("decisions")?)?;
        if let Some(w) = &self.windows {
            w.ledger.restore(state.table("ledger")?)?;
        }
        let held = state.table_of("held", &self.schema)?;
        self.held_rows = held.num_rows();
        self.held = vec![held];
        Ok(())
    }
}

impl ShedOp {
    /// Adds the rows dropped so far to the stream's `shed_rows`, once the
    /// runtime has said where that is.
    fn report_to_streams(&mut self) {
        if self.unreported == 0 {
            return;
        }
        if let Some(sources) = self.stats.sources.get() {
            for source in sources {
                source
                    .shed_rows
                    .fetch_add(self.unreported, Ordering::Relaxed);
            }
            self.unreported = 0;
        }
    }

    /// Where dropped rows are the latest, the window operator after this
    /// one would not see event time advance, and windows would wait for a
    /// kept row to fire: when the rows seen close a pane that the kept ones
    /// have not, send (after the rows held) the watermark they make.
    fn send_dropped_time(&mut self, out: &mut Vec<Message>) -> Result<()> {
        let Some(w) = &self.windows else {
            return Ok(());
        };
        if self.max_seen <= self.max_kept {
            return Ok(());
        }
        let watermark = self.max_seen.saturating_sub(w.delay_ms);
        let kept = self.max_kept.saturating_sub(w.delay_ms);
        if self.max_kept != i64::MIN
            && w.spec.closed_windows(watermark) <= w.spec.closed_windows(kept)
        {
            return Ok(());
        }
        self.max_kept = self.max_seen;
        self.flush(out)?;
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    /// Hands on the kept rows held back.
    fn flush(&mut self, out: &mut Vec<Message>) -> Result<()> {
        if self.held_rows == 0 {
            self.held.clear();
            return Ok(());
        }
        let held = std::mem::take(&mut self.held);
        self.held_rows = 0;
        out.push(Message::Batch(datafusion::arrow::compute::concat_batches(
            &self.schema,
            &held,
        )?));
        Ok(())
    }

    fn decision_table(&self) -> Result<RecordBatch> {
        let rows: Vec<(i64, u64, bool)> = self
            .decisions
            .iter()
            .flat_map(|(&p, keys)| {
                let mut keys: Vec<_> = keys.iter().map(|(&k, &d)| (p, k, d)).collect();
                keys.sort_unstable();
                keys
            })
            .collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(BooleanArray::from(
                rows.iter().map(|r| r.2).collect::<Vec<_>>(),
            )),
        ];
        Ok(RecordBatch::try_new(decision_schema(), columns)?)
    }

    fn restore_decisions(&mut self, table: &RecordBatch) -> Result<()> {
        if table.schema().fields() != decision_schema().fields() {
            return Err(Error::Plan(
                "the checkpoint's shed decisions have other columns than this version writes"
                    .into(),
            ));
        }
        let panes = table
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        let keys = table
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::UInt64Type>();
        let keep = table.column(2).as_boolean();
        self.decisions.clear();
        for i in 0..table.num_rows() {
            self.decisions
                .entry(panes.value(i))
                .or_default()
                .insert(keys.value(i), keep.value(i));
        }
        Ok(())
    }
}

fn decision_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("pane_start", DataType::Int64, false),
        Field::new("key", DataType::UInt64, false),
        Field::new("keep", DataType::Boolean, false),
    ]))
}

/// What the window aggregate does with shed input: reads the ledger for
/// `_shed_fraction` and, if asked, scales counts and sums.
#[derive(Debug, Clone)]
pub struct ShedOutput {
    /// The counts of the shed op before it.
    pub ledger: Arc<ShedLedger>,
    /// Scale `count` and `sum` by 1 / (1 - fraction).
    pub scale: bool,
}

impl ShedOutput {
    /// Per result row of the window at `start` with grouping keys `keys`,
    /// the share of its input that was dropped.
    pub fn fractions(&self, start: i64, keys: &[ArrayRef], rows: usize) -> Result<Float64Array> {
        let hashes = key_hashes(keys, rows)?;
        Ok(hashes
            .iter()
            .map(|&k| Some(self.ledger.window(start, k).fraction()))
            .collect())
    }
}

/// The Horvitz-Thompson estimate of a count or sum from a uniform sample
/// that kept `1 - fraction` of the rows: each kept row stands for
/// `1 / (1 - fraction)` rows. Integers are rounded to the nearest; other
/// types are returned unchanged.
pub fn scale_up(values: &ArrayRef, fractions: &Float64Array) -> Result<ArrayRef> {
    let factor = |i: usize| 1.0 / (1.0 - fractions.value(i)).max(1.0 - MAX_DROP);
    Ok(match values.data_type() {
        DataType::Int64 => {
            let v = values.as_primitive::<datafusion::arrow::datatypes::Int64Type>();
            Arc::new(
                (0..v.len())
                    .map(|i| {
                        v.is_valid(i)
                            .then(|| (v.value(i) as f64 * factor(i)).round() as i64)
                    })
                    .collect::<Int64Array>(),
            )
        }
        DataType::Float64 => {
            let v = values.as_primitive::<datafusion::arrow::datatypes::Float64Type>();
            Arc::new(
                (0..v.len())
                    .map(|i| v.is_valid(i).then(|| v.value(i) * factor(i)))
                    .collect::<Float64Array>(),
            )
        }
        _ => values.clone(),
    })
}

mod ledger;
#[cfg(test)]
mod tests;

use ledger::ledger_schema;
pub use ledger::{Counts, ShedLedger, Tally};
