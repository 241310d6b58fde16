//! Automatic scaling of a session's queries (`SET autoscale = 'on'`):
//! the controller reads each scaled query's counters every
//! `autoscale.interval`, asks its policy
//! ([`crate::runtime::autoscale`]) for a parallelism, and when that
//! differs, rescales the query as `ALTER QUERY id SET parallelism = n`
//! does: stopped at a checkpoint and started again from it, every key
//! group's state dealt to the new instances, no result lost or repeated.
//! After a rescale it waits `autoscale.cooldown` before it measures again,
//! so that the restarted query catching up is not taken for its rate. It
//! scales up on one measurement and down on two in a row.
//!
//! The controller runs when the session's owner calls
//! [`Session::autoscale`] (the shell and the service call it every
//! second, and log what it decides); each decision is kept, the last
//! [`DECISIONS_KEPT`] per query, for [`Session::autoscaling`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::Session;
use crate::analyze::{OperatorRow, operator_rows};
use crate::engine::{Change, ChangeTarget};
use crate::planner::QueryGraph;
use crate::runtime::autoscale::{
    AutoscaleSettings, Decision, OperatorSample, Sample, Verdict, decide, scaled_stages,
};
use crate::runtime::live::{QueryId, QueryInfo};

/// Decisions kept per query.
pub const DECISIONS_KEPT: usize = 32;

/// A scaled query's decisions: the last [`DECISIONS_KEPT`], and how many
/// there were by direction and outcome.
#[derive(Debug, Default)]
pub(super) struct Log {
    kept: VecDeque<Decision>,
    /// Rescales made and failed, up then down.
    counts: Rescales,
}

/// How many rescales a query had since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rescales {
    /// Up, made.
    pub up: u64,
    /// Down, made.
    pub down: u64,
    /// Either way, planned or made with an error.
    pub failed: u64,
}

impl Log {
    fn push(&mut self, decision: Decision) {
        match (&decision.outcome, decision.to > decision.from) {
            (Err(_), _) => self.counts.failed += 1,
            (Ok(()), true) => self.counts.up += 1,
            (Ok(()), false) => self.counts.down += 1,
        }
        if self.kept.len() == DECISIONS_KEPT {
            self.kept.pop_front();
        }
        self.kept.push_back(decision);
    }
}

/// A scaled query's controller state.
pub(super) struct Scaling {
    settings: AutoscaleSettings,
    /// The stages whose instances follow the parallelism.
    scaled_stages: Vec<String>,
    /// The counters at the start of the running measurement.
    last: Option<Reading>,
    /// No measurement before this (the cool-down after a rescale).
    quiet_until: Instant,
    /// What the last measurement concluded.
    verdict: Option<Verdict>,
    /// The fewer instances the last measurement wanted, not yet acted on:
    /// a scale-down waits for a second measurement to agree.
    lower: Option<usize>,
    /// The rescales it decided, oldest first.
    decisions: Arc<Mutex<Log>>,
}

impl Scaling {
    /// Scaling by `settings` of a query planned as `graph`.
    pub(super) fn new(settings: AutoscaleSettings, graph: &QueryGraph) -> Self {
        Self {
            settings,
            scaled_stages: scaled_stages(graph),
            last: None,
            quiet_until: Instant::now(),
            verdict: None,
            lower: None,
            decisions: Arc::default(),
        }
    }

    /// The query was planned again (changed or rescaled) as `graph`.
    pub(super) fn replanned(&mut self, graph: &QueryGraph) {
        self.scaled_stages = scaled_stages(graph);
        self.last = None;
        self.lower = None;
        self.quiet_until = Instant::now() + self.settings.cooldown;
    }
}

/// A query's counters at one moment.
#[derive(Debug, Clone)]
struct Reading {
    at: Instant,
    source_rows: u64,
    source_blocked_ns: u64,
    buffered_rows: u64,
    sources: usize,
    operators: Vec<OperatorRow>,
    /// Per stage, the rows waiting in the queues that feed it.
    queued: std::collections::BTreeMap<String, u64>,
}

impl Reading {
    fn of(info: &QueryInfo) -> Self {
        let load = |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
        let operators = operator_rows(&info.stats.metrics);
        let mut queued = std::collections::BTreeMap::new();
        for queue in info.stats.metrics.queue_list() {
            *queued.entry(queue.stage.clone()).or_default() += load(&queue.queued_rows);
        }
        Self {
            at: Instant::now(),
            source_rows: info.inputs.iter().map(|(_, s)| load(&s.rows)).sum(),
            source_blocked_ns: info.inputs.iter().map(|(_, s)| load(&s.blocked_ns)).sum(),
            buffered_rows: info
                .inputs
                .iter()
                .map(|(_, s)| load(&s.buffered_rows))
                .sum(),
            sources: info.inputs.len(),
            operators,
            queued,
        }
    }

    /// What happened from `self` to `now`, with `scaled` the stages that
    /// follow the parallelism.
    fn since(&self, now: &Reading, scaled: &[String]) -> Sample {
        let operators = now
            .operators
            .iter()
            .map(|op| {
                let before = self
                    .operators
                    .iter()
                    .find(|o| o.stage == op.stage && o.index == op.index);
                let (rows, busy) = before.map_or((0, 0), |o| (o.rows_in, o.busy_ns));
                let waiting = |r: &Reading| r.queued.get(&op.stage).copied().unwrap_or(0) as i64;
                let queued_rows = match op.index {
                    0 => waiting(now) - waiting(self),
                    _ => 0,
                };
                OperatorSample {
                    name: format!("{} ({}.o{})", short(&op.name), op.stage, op.index),
                    scaled: scaled.contains(&op.stage),
                    instances: op.instances,
                    rows_in: op.rows_in.saturating_sub(rows),
                    queued_rows,
                    busy_ns: op.busy_ns.saturating_sub(busy),
                }
            })
            .collect();
        Sample {
            elapsed_ns: now.at.duration_since(self.at).as_nanos() as u64,
            source_rows: now.source_rows.saturating_sub(self.source_rows),
            source_blocked_ns: now.source_blocked_ns.saturating_sub(self.source_blocked_ns),
            buffered_rows: now.buffered_rows as i64 - self.buffered_rows as i64,
            sources: now.sources,
            operators,
        }
    }
}

/// An operator's description cut to what a log line needs.
fn short(name: &str) -> String {
    const MOST: usize = 40;
    match name.char_indices().nth(MOST) {
        Some((at, _)) => format!("{}...", &name[..at]),
        None => name.to_string(),
    }
}

/// Where a scaled query stands, for `/metrics` and `.stats`.
#[derive(Debug, Clone)]
pub struct Autoscaling {
    /// The query.
    pub id: QueryId,
    /// What listings call it.
    pub label: String,
    /// The settings it is scaled by.
    pub settings: AutoscaleSettings,
    /// The parallelism it runs at.
    pub parallelism: usize,
    /// What the last measurement concluded.
    pub verdict: Option<Verdict>,
    /// Its rescales, oldest first (the last [`DECISIONS_KEPT`]).
    pub decisions: Vec<Decision>,
    /// How many rescales it had, all told.
    pub rescales: Rescales,
}

impl Autoscaling {
    /// Lines for a person: the settings, the last verdict, the decisions.
    pub fn text(&self) -> String {
        let s = &self.settings;
        let mut text = format!(
            "autoscale ({}, {}..{} instances, headroom {}): parallelism {}",
            s.policy, s.min, s.max, s.headroom, self.parallelism
        );
        if let Some(verdict) = &self.verdict {
            text.push_str(&format!(
                "; last measured: wants {} ({})",
                verdict.wanted, verdict.why
            ));
        }
        for decision in &self.decisions {
            text.push_str(&format!("\n  {decision}"));
        }
        text
    }
}

/// A rescale the controller decided, to make with [`ScaleStep::apply`].
pub struct ScaleStep {
    id: QueryId,
    /// The change; `None` when it could not be planned (the decision's
    /// outcome says why).
    pending: Option<super::PendingChange>,
    decision: Decision,
    log: Arc<Mutex<Log>>,
}

impl ScaleStep {
    /// The query it rescales.
    pub fn query(&self) -> QueryId {
        self.id
    }

    /// Makes the rescale, keeps the decision in the query's log and
    /// returns it.
    pub async fn apply(self) -> Decision {
        let mut decision = self.decision;
        if let Some(pending) = self.pending {
            decision.outcome = pending.apply().await.map(|_| ()).map_err(|e| e.to_string());
        }
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.push(decision.clone());
        decision
    }
}

impl Session {
    /// One round of the controller: measures every scaled query whose
    /// measurement is due and returns the rescales it decided, to make
    /// with [`ScaleStep::apply`] (the session need not be held meanwhile).
    /// Call it often (every second, say): it decides at most once per
    /// `autoscale.interval` per query.
    pub fn autoscale_step(&mut self) -> Vec<ScaleStep> {
        let running = self.queries();
        let mut wanted = Vec::new();
        {
            let mut origins = self.origins();
            for (id, origin) in origins.iter_mut() {
                let Some(scaling) = origin.scaling.as_mut() else {
                    continue;
                };
                let Some(info) = running.iter().find(|q| q.id == *id) else {
                    continue;
                };
                if let Some(verdict) = measure(scaling, info, origin.parallelism) {
                    scaling.verdict = Some(verdict.clone());
                    if let Some(verdict) = settle(scaling, origin.parallelism, verdict) {
                        wanted.push((*id, origin.parallelism, verdict, scaling.decisions.clone()));
                    }
                }
            }
        }
        wanted
            .into_iter()
            .map(|(id, from, verdict, log)| self.rescale(id, from, verdict, log))
            .collect()
    }

    /// One round of the controller, its rescales made: see
    /// [`Session::autoscale_step`]. Returns each with its query.
    pub async fn autoscale(&mut self) -> Vec<(QueryId, Decision)> {
        let mut made = Vec::new();
        for step in self.autoscale_step() {
            let id = step.query();
            made.push((id, step.apply().await));
        }
        made
    }

    /// Every scaled query, where it stands.
    pub fn autoscaling(&self) -> Vec<Autoscaling> {
        let origins = self.origins();
        let mut list: Vec<Autoscaling> = origins
            .iter()
            .filter_map(|(id, origin)| {
                let scaling = origin.scaling.as_ref()?;
                let log = scaling.decisions.lock().unwrap_or_else(|e| e.into_inner());
                Some(Autoscaling {
                    id: *id,
                    label: origin.label.clone(),
                    settings: scaling.settings.clone(),
                    parallelism: origin.parallelism,
                    verdict: scaling.verdict.clone(),
                    decisions: log.kept.iter().cloned().collect(),
                    rescales: log.counts,
                })
            })
            .collect();
        list.sort_by_key(|a| a.id);
        list
    }

    /// The rescale of query `id` from `from` to what `verdict` wants, as
    /// a change (planned and checked, not yet made).
    fn rescale(
        &mut self,
        id: QueryId,
        from: usize,
        verdict: Verdict,
        log: Arc<Mutex<Log>>,
    ) -> ScaleStep {
        let policy = self
            .origins()
            .get(&id)
            .and_then(|o| o.scaling.as_ref().map(|s| s.settings.policy))
            .unwrap_or(crate::runtime::autoscale::Policy::Ds2);
        let mut decision = Decision {
            at_ms: chrono::Utc::now().timestamp_millis(),
            policy,
            from,
            to: verdict.wanted,
            verdict,
            outcome: Ok(()),
        };
        let change = Change {
            target: ChangeTarget::Query(id.to_string()),
            query: None,
            parallelism: Some(decision.to),
            allow_state_loss: false,
            what: format!("autoscale: parallelism {from} -> {}", decision.to),
            undo: None,
        };
        let pending = match self.change(change) {
            Ok(pending) => Some(pending),
            Err(e) => {
                decision.outcome = Err(e.to_string());
                // Not again before a cool-down: the log would fill with it.
                if let Some(scaling) = self.origins().get_mut(&id).and_then(|o| o.scaling.as_mut())
                {
                    scaling.quiet_until = Instant::now() + scaling.settings.cooldown;
                }
                None
            }
        };
        ScaleStep {
            id,
            pending,
            decision,
            log,
        }
    }
}

/// The verdict to act on for a query running at `current`: a rise at
/// once, a fall only when the measurement before wanted fewer instances
/// too (then the larger of the two), so that one quiet interval does not
/// take capacity away; `None` to stay.
fn settle(scaling: &mut Scaling, current: usize, mut verdict: Verdict) -> Option<Verdict> {
    if verdict.wanted >= current {
        scaling.lower = None;
        return (verdict.wanted > current).then_some(verdict);
    }
    match scaling.lower.take() {
        Some(before) => {
            verdict.wanted = verdict.wanted.max(before);
            Some(verdict)
        }
        None => {
            scaling.lower = Some(verdict.wanted);
            None
        }
    }
}

/// The verdict of `scaling`'s policy on the query `info` running at
/// `parallelism`, when a measurement is due; starts the next one.
fn measure(scaling: &mut Scaling, info: &QueryInfo, parallelism: usize) -> Option<Verdict> {
    let now = Instant::now();
    if now < scaling.quiet_until {
        return None;
    }
    let reading = Reading::of(info);
    let Some(last) = scaling.last.as_ref() else {
        scaling.last = Some(reading);
        return None;
    };
    if now.duration_since(last.at) < scaling.settings.interval {
        return None;
    }
    let sample = last.since(&reading, &scaling.scaled_stages);
    scaling.last = Some(reading);
    decide(&scaling.settings, parallelism, &sample)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scaling() -> Scaling {
        Scaling {
            settings: AutoscaleSettings::defaults(4),
            scaled_stages: Vec::new(),
            last: None,
            quiet_until: Instant::now(),
            verdict: None,
            lower: None,
            decisions: Arc::default(),
        }
    }

    fn wants(n: usize) -> Verdict {
        Verdict {
            wanted: n,
            offered: 0.0,
            by: None,
            why: String::new(),
        }
    }

    #[test]
    fn up_at_once_down_on_the_second_measurement_that_agrees() {
        let mut s = scaling();
        assert_eq!(settle(&mut s, 1, wants(3)).map(|v| v.wanted), Some(3));
        assert_eq!(settle(&mut s, 3, wants(3)), None);
        assert_eq!(settle(&mut s, 3, wants(1)), None);
        assert_eq!(settle(&mut s, 3, wants(2)).map(|v| v.wanted), Some(2));
        // A quiet interval between two busy ones takes nothing away.
        assert_eq!(settle(&mut s, 2, wants(1)), None);
        assert_eq!(settle(&mut s, 2, wants(2)), None);
        assert_eq!(settle(&mut s, 2, wants(1)), None);
        assert_eq!(s.lower, Some(1));
    }
}
