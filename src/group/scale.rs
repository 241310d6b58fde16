//! How many processes a group needs for the rate its topic gets
//! (`SET autoscale = 'on'` in a group's scripts).
//!
//! Every member measures, over each `autoscale.interval`, the rows its
//! pipelines read and the time its operators were busy, and writes them in
//! its status file ([`MemberLoad`]). One member, the leader (the one whose
//! name sorts first among those whose status is fresh), then works out
//! the group's need as DS2 does for a query's instances: the offered rate
//! is how fast the topic grows (its partitions' end offsets, one row per
//! message) plus its backlog (the messages after the partitions' last
//! checkpoints, less what was read since, at most a checkpoint interval's
//! worth) spread over one `autoscale.interval`, so that a group behind
//! catches up within it; a process's capacity is the rows its members took per second
//! of busy operator time times its cores, and the group needs
//! `offered * headroom / capacity` processes, within `autoscale.min` and
//! `autoscale.max` (by default the topic's partitions: a process more has
//! nothing to read). A topic with no new messages and no backlog needs
//! `autoscale.min`.
//!
//! The leader writes the verdict ([`GroupScale`]) beside the status files,
//! where `vigil group`, `GET /groups/{name}` and the service's `/metrics`
//! read it, and runs `autoscale.hook` when the number changes, at most
//! once per `autoscale.cooldown`: vigil starts no processes itself, the
//! hook tells whatever does (a script, an orchestrator's API).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{MemberStatus, status_dir};
use crate::runtime::autoscale::AutoscaleSettings;
use crate::runtime::live::{Live, QueryId};
use crate::state::store::Location;

/// The file, beside the members' status files, that holds the verdict.
pub const VERDICT_FILE: &str = "autoscale.json";

/// Longest a hook may run before it is killed.
const HOOK_LIMIT: Duration = Duration::from_secs(60);

/// What one member measured over its last `autoscale.interval`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MemberLoad {
    /// The window's length, milliseconds.
    pub window_ms: u64,
    /// Rows its pipelines read in it.
    pub rows: u64,
    /// Nanoseconds its operators were busy in it, all tasks together.
    pub busy_ns: u64,
    /// The cores its process may use.
    pub cores: usize,
}

/// Sums a member's load from its pipelines' counters, window by window.
pub(super) struct LoadMeter {
    window: Duration,
    started: Instant,
    /// Each pipeline query's counters when last read: rows, busy ns.
    last: HashMap<QueryId, (u64, u64)>,
    rows: u64,
    busy_ns: u64,
}

impl LoadMeter {
    /// A meter of windows of `window`.
    pub(super) fn new(window: Duration) -> Self {
        LoadMeter {
            window,
            started: Instant::now(),
            last: HashMap::new(),
            rows: 0,
            busy_ns: 0,
        }
    }

    /// Reads the counters of `ids` (queries of `live`); once a window has
    /// passed, its load, and a new window starts. A query started since
    /// the last reading counts from zero; one gone since counts no more.
    pub(super) fn tick(&mut self, live: &Live, ids: &[QueryId]) -> Option<MemberLoad> {
        let mut now = HashMap::new();
        for info in live
            .all_queries()
            .into_iter()
            .filter(|q| ids.contains(&q.id))
        {
            let rows: u64 = info
                .inputs
                .iter()
                .map(|(_, s)| s.rows.load(Ordering::Relaxed))
                .sum();
            let busy: u64 = info
                .stats
                .metrics
                .operator_list()
                .iter()
                .map(|op| op.busy_ns.load(Ordering::Relaxed))
                .sum();
            let (rows0, busy0) = self.last.get(&info.id).copied().unwrap_or((0, 0));
            self.rows += rows.saturating_sub(rows0);
            self.busy_ns += busy.saturating_sub(busy0);
            now.insert(info.id, (rows, busy));
        }
        self.last = now;
        let elapsed = self.started.elapsed();
        if elapsed < self.window {
            return None;
        }
        let load = MemberLoad {
            window_ms: elapsed.as_millis() as u64,
            rows: std::mem::take(&mut self.rows),
            busy_ns: std::mem::take(&mut self.busy_ns),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        self.started = Instant::now();
        Some(load)
    }
}

/// What the group's leader concluded last.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GroupScale {
    /// The processes the group needs.
    pub wanted: usize,
    /// The processes it has (members whose status is fresh).
    pub processes: usize,
    /// Messages per second its topic grows by.
    pub offered: f64,
    /// Rows per second one process can take, if known.
    pub capacity: Option<f64>,
    /// Why, in words.
    pub why: String,
    /// When, epoch milliseconds.
    pub decided_ms: i64,
    /// The number the hook was last run with, if it ran.
    pub hooked: Option<usize>,
}

/// What the group needs for `offered` messages per second, from its
/// members' `loads`, with `partitions` partitions to share; `None` when
/// the loads say nothing yet (rows offered, none taken).
pub fn needed(
    settings: &AutoscaleSettings,
    loads: &[MemberLoad],
    offered: f64,
    partitions: usize,
) -> Option<(usize, Option<f64>, String)> {
    let most = match settings.max_set {
        true => settings.max.min(partitions.max(1)),
        false => partitions.max(1),
    };
    let fewest = settings.min.min(most);
    if offered <= 0.0 {
        return Some((fewest, None, "idle: no new messages and no backlog".into()));
    }
    let rows: u64 = loads.iter().map(|l| l.rows).sum();
    let busy_ns: u64 = loads.iter().map(|l| l.busy_ns).sum();
    if rows == 0 || busy_ns == 0 {
        return None;
    }
    let cores = loads.iter().map(|l| l.cores).sum::<usize>() as f64 / loads.len() as f64;
    let capacity = rows as f64 / (busy_ns as f64 / 1e9) * cores;
    let need = offered * settings.headroom / capacity;
    let wanted = (need.ceil() as usize).clamp(fewest, most);
    let why = format!(
        "offered {offered:.0} rows/s; a process takes {capacity:.0} rows/s ({cores:.0} cores), so the group needs {need:.2} processes with headroom {}",
        settings.headroom
    );
    Some((wanted, Some(capacity), why))
}

/// The leader's side: measures the topic's growth, decides and runs the
/// hook.
pub(super) struct Scaler {
    settings: AutoscaleSettings,
    /// How often the pipelines checkpoint: what they read since their
    /// last checkpoint is at most this much of their reading.
    checkpoint_interval: Duration,
    /// The topic's total end offset when last read.
    ends: Option<(Instant, i64)>,
    hooked: Option<usize>,
    last_hook: Option<Instant>,
    /// The client that reads the topic's end offsets, kept from step to
    /// step.
    ends_client: Option<rdkafka::consumer::BaseConsumer>,
}

impl Scaler {
    /// A scaler by `settings`.
    pub(super) fn new(settings: AutoscaleSettings, checkpoint_interval: Duration) -> Self {
        Scaler {
            settings,
            checkpoint_interval,
            ends: None,
            hooked: None,
            last_hook: None,
            ends_client: None,
        }
    }

    /// Decides for group `name` (whose status files are in
    /// `checkpoint_dir`) if `me` leads it, and writes the verdict; runs
    /// the hook if the number changed. Reads the brokers: call it off the
    /// async runtime.
    pub(super) fn step(&mut self, checkpoint_dir: &Location, name: &str, me: &str) {
        let dir = status_dir(checkpoint_dir, name);
        let fresh = super::status::fresh_members(&dir);
        if fresh.first().map(|m| m.member.as_str()) != Some(me) {
            // Not the leader (now): a later leader starts afresh.
            self.ends = None;
            return;
        }
        let loads: Vec<MemberLoad> = fresh.iter().filter_map(|m| m.load.clone()).collect();
        let Some((offered, partitions)) = self.offered(checkpoint_dir, &fresh[0], &loads) else {
            return;
        };
        let Some((wanted, capacity, why)) = needed(&self.settings, &loads, offered, partitions)
        else {
            return;
        };
        let processes = fresh.len();
        let before = self.hooked.unwrap_or(processes);
        if wanted != before && self.cooled_down() {
            self.run_hook(name, wanted, processes);
        }
        let verdict = GroupScale {
            wanted,
            processes,
            offered,
            capacity,
            why,
            decided_ms: chrono::Utc::now().timestamp_millis(),
            hooked: self.hooked,
        };
        let text = serde_json::to_vec_pretty(&verdict).unwrap_or_default();
        if let Err(e) = dir.child(VERDICT_FILE).put(text) {
            crate::diag::warning!("group {name}: cannot write its autoscale verdict: {e}");
        }
    }

    /// The offered rate (see the [module docs](self)) and the topic's
    /// partitions; `None` on the first step or when the brokers do not
    /// answer.
    fn offered(
        &mut self,
        checkpoint_dir: &Location,
        member: &MemberStatus,
        loads: &[MemberLoad],
    ) -> Option<(f64, usize)> {
        if self.ends_client.is_none() {
            self.ends_client = super::status::ends_client(member);
        }
        let ends: BTreeMap<i32, i64> =
            super::status::end_offsets(self.ends_client.as_ref()?, &member.topic);
        if ends.is_empty() {
            return None;
        }
        let total: i64 = ends.values().sum();
        let now = Instant::now();
        let before = self.ends.replace((now, total))?;
        let seconds = now.duration_since(before.0).as_secs_f64().max(1e-3);
        let arriving = (total - before.1).max(0) as f64 / seconds;
        let read_rate: f64 = loads
            .iter()
            .map(|l| l.rows as f64 / (l.window_ms.max(1) as f64 / 1e3))
            .sum();
        let backlog =
            backlog(checkpoint_dir, &ends) - read_rate * self.checkpoint_interval.as_secs_f64();
        let catching_up = backlog.max(0.0) / self.settings.interval.as_secs_f64().max(1e-3);
        Some((arriving + catching_up, ends.len()))
    }

    fn cooled_down(&self) -> bool {
        self.last_hook
            .is_none_or(|at| at.elapsed() >= self.settings.cooldown)
    }

    /// Runs the hook (if there is one) for `wanted` processes, waiting for
    /// it at most [`HOOK_LIMIT`].
    fn run_hook(&mut self, name: &str, wanted: usize, processes: usize) {
        crate::diag::note!("group {name}: needs {wanted} processes (has {processes})");
        self.hooked = Some(wanted);
        self.last_hook = Some(Instant::now());
        let Some(hook) = &self.settings.hook else {
            return;
        };
        let child = std::process::Command::new("sh")
            .arg("-c")
            .arg(hook)
            .env("VIGIL_GROUP", name)
            .env("VIGIL_GROUP_WANTED", wanted.to_string())
            .env("VIGIL_GROUP_PROCESSES", processes.to_string())
            .stdin(std::process::Stdio::null())
            .spawn();
        let outcome = match child {
            Ok(mut child) => wait_bounded(&mut child),
            Err(e) => format!("could not start: {e}"),
        };
        crate::diag::note!("group {name}: autoscale.hook for {wanted} processes: {outcome}");
    }
}

/// Messages after the last checkpoint of each partition that has one
/// (`ends` are the partitions' end offsets).
fn backlog(checkpoint_dir: &Location, ends: &BTreeMap<i32, i64>) -> f64 {
    let checkpoints = super::status::last_checkpoints(checkpoint_dir).unwrap_or_default();
    ends.iter()
        .filter_map(|(p, end)| {
            let at = checkpoints.get(p)?.offset?;
            Some((end - at).max(0) as f64)
        })
        .sum()
}

/// Waits for `child` at most [`HOOK_LIMIT`], then kills it; says how it
/// ended.
fn wait_bounded(child: &mut std::process::Child) -> String {
    let deadline = Instant::now() + HOOK_LIMIT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return format!("ended, {status}"),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return format!("killed after {} s", HOOK_LIMIT.as_secs());
            }
            Err(e) => return format!("could not be waited for: {e}"),
        }
    }
}

/// The verdict of group `name`'s leader, if it wrote one.
pub fn verdict(checkpoint_dir: &Location, name: &str) -> Option<GroupScale> {
    let bytes = status_dir(checkpoint_dir, name)
        .child(VERDICT_FILE)
        .get()
        .ok()??;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(rows: u64, busy_ms: u64) -> MemberLoad {
        MemberLoad {
            window_ms: 1000,
            rows,
            busy_ns: busy_ms * 1_000_000,
            cores: 2,
        }
    }

    fn settings() -> AutoscaleSettings {
        AutoscaleSettings::defaults(2)
    }

    #[test]
    fn the_need_is_the_offered_rate_over_a_process_capacity() {
        // 1000 rows in 500 ms busy on 2 cores: 4000 rows/s a process.
        let loads = [load(1000, 500)];
        let (wanted, capacity, why) = needed(&settings(), &loads, 10_000.0, 8).unwrap();
        assert_eq!(capacity, Some(4000.0));
        // 10000 * 1.25 / 4000 = 3.125.
        assert_eq!(wanted, 4, "{why}");
        let (wanted, _, _) = needed(&settings(), &loads, 2_000.0, 8).unwrap();
        assert_eq!(wanted, 1);
    }

    #[test]
    fn bounds_are_the_settings_and_the_partitions() {
        let loads = [load(1000, 500)];
        let (wanted, _, _) = needed(&settings(), &loads, 100_000.0, 6).unwrap();
        assert_eq!(wanted, 6, "by default, at most a process per partition");
        let mut capped = settings();
        capped.set("autoscale.max", "3").unwrap();
        let (wanted, _, _) = needed(&capped, &loads, 100_000.0, 6).unwrap();
        assert_eq!(wanted, 3);
        let mut floor = settings();
        floor.set("autoscale.min", "2").unwrap();
        let (wanted, _, why) = needed(&floor, &loads, 0.0, 6).unwrap();
        assert_eq!(wanted, 2, "{why}");
        assert!(why.starts_with("idle"), "{why}");
    }

    #[test]
    fn rows_offered_and_none_taken_say_nothing() {
        assert_eq!(needed(&settings(), &[load(0, 0)], 50.0, 4), None);
        assert_eq!(needed(&settings(), &[], 50.0, 4), None);
    }
}
