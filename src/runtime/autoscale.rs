//! Choosing a query's parallelism from what it measures: the DS2
//! controller (Kalavri et al., OSDI 2018) and a rule-based baseline.
//!
//! DS2 looks at each operator's *true* processing rate: the rows it took
//! per second of useful time (time spent in it, not waiting for input or
//! for room downstream), per instance. The rate the query must sustain is
//! the sources' *offered* rate: the rows they read per second they were
//! not held back by back-pressure, plus what piled up in their buffers.
//! Each operator gets its share of that rate (the rows it took per row
//! read) and needs `share * headroom / true rate` instances; the query
//! runs at the largest need of the operators a parallelism changes. Since
//! true rates do not depend on how many instances run (while there are
//! cores for them), one decision usually lands on the right parallelism;
//! the paper shows at most three.
//!
//! The rule-based policy is the usual "scale up above 70 % utilisation,
//! down below 30 %", one instance at a time, on the busiest scaled
//! operator: it is here to compare with.
//!
//! Everything in this module is arithmetic over [`Sample`]s; the session
//! measures, applies decisions and keeps their log.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::planner::QueryGraph;
use crate::runtime::checkpoint::{input_prefix, stage_prefix};

/// Which controller decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The DS2 model: parallelism from true rates and the offered rate.
    Ds2,
    /// Utilisation thresholds, one instance at a time.
    Rule,
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::Ds2 => "ds2",
            Policy::Rule => "rule",
        })
    }
}

/// How a query is scaled: the `autoscale*` settings it was started with.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoscaleSettings {
    /// Who decides.
    pub policy: Policy,
    /// Fewest instances.
    pub min: usize,
    /// Most instances (at most the cores, unless set higher).
    pub max: usize,
    /// Capacity kept above the offered rate: 1.25 plans for 25 % more.
    pub headroom: f64,
    /// How long each measurement runs before a decision.
    pub interval: Duration,
    /// Time after a rescale before the next measurement starts, so that
    /// the restarted query's catching up is not taken for its rate. In a
    /// group, the least time between two runs of the hook.
    pub cooldown: Duration,
    /// `autoscale.max` was set: a group's default bound is its topic's
    /// partitions, not the cores.
    pub max_set: bool,
    /// A group's command, run (`sh -c`) when the number of processes it
    /// needs changes, with `VIGIL_GROUP`, `VIGIL_GROUP_WANTED` and
    /// `VIGIL_GROUP_PROCESSES` in its environment.
    pub hook: Option<String>,
}

/// The setting names `SET` takes for autoscaling.
pub const KEYS: &[&str] = &[
    "autoscale",
    "autoscale.policy",
    "autoscale.min",
    "autoscale.max",
    "autoscale.headroom",
    "autoscale.interval",
    "autoscale.cooldown",
    "autoscale.hook",
];

impl Default for AutoscaleSettings {
    /// The defaults on this machine.
    fn default() -> Self {
        Self::defaults(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

impl AutoscaleSettings {
    /// The defaults on a machine of `cores` cores.
    pub fn defaults(cores: usize) -> Self {
        Self {
            policy: Policy::Ds2,
            min: 1,
            max: cores.max(1),
            headroom: 1.25,
            interval: Duration::from_secs(10),
            cooldown: Duration::from_secs(10),
            max_set: false,
            hook: None,
        }
    }

    /// Applies `SET name = value` for one of [`KEYS`] but `autoscale`.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let value = value.trim();
        let bad = |what: &str| Error::Plan(format!("{name} must be {what}, got '{value}'"));
        match name {
            "autoscale.policy" => {
                self.policy = match value.to_ascii_lowercase().as_str() {
                    "ds2" => Policy::Ds2,
                    "rule" => Policy::Rule,
                    _ => return Err(bad("'ds2' or 'rule'")),
                }
            }
            "autoscale.min" | "autoscale.max" => {
                let n = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=usize::from(crate::state::KEY_GROUPS)).contains(n))
                    .ok_or_else(|| bad("a whole number of instances, at least 1"))?;
                if name == "autoscale.min" {
                    self.min = n;
                } else {
                    self.max = n;
                    self.max_set = true;
                }
            }
            "autoscale.headroom" => {
                self.headroom = value
                    .parse::<f64>()
                    .ok()
                    .filter(|h| h.is_finite() && (1.0..=10.0).contains(h))
                    .ok_or_else(|| bad("a factor from 1 to 10"))?;
            }
            "autoscale.interval" | "autoscale.cooldown" => {
                let time = crate::connector::options::parse_duration(value)
                    .ok_or_else(|| bad("a duration such as '10s'"))?;
                if name == "autoscale.interval" {
                    self.interval = time.max(Duration::from_millis(100));
                } else {
                    self.cooldown = time;
                }
            }
            "autoscale.hook" => self.hook = Some(value.to_string()).filter(|h| !h.is_empty()),
            _ => return Err(Error::Plan(format!("unknown setting '{name}'"))),
        }
        Ok(())
    }

    /// Checks the bounds agree.
    pub fn check(&self) -> Result<()> {
        if self.min > self.max {
            return Err(Error::Plan(format!(
                "autoscale.min ({}) is above autoscale.max ({})",
                self.min, self.max
            )));
        }
        Ok(())
    }

    fn clamp(&self, n: usize) -> usize {
        n.clamp(self.min, self.max)
    }
}

/// One operator's measurements over a sample's time, summed over its
/// instances.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorSample {
    /// What `EXPLAIN` calls it, with its stage.
    pub name: String,
    /// Its instances run at the query's parallelism (a key-partitioned
    /// stage); the others run as one instance whatever it is.
    pub scaled: bool,
    /// Its instances.
    pub instances: usize,
    /// Rows it took.
    pub rows_in: u64,
    /// Rows that came to wait ahead of it meanwhile (negative: its queues
    /// drained), for the first operator of a stage; 0 for the others.
    /// Taken with `rows_in`, the rows that reached it: a backlog building
    /// up or being caught up on is not a change in what it is offered.
    pub queued_rows: i64,
    /// Nanoseconds spent in it, over all instances.
    pub busy_ns: u64,
}

/// What a query measured between two readings of its counters.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sample {
    /// Wall-clock nanoseconds between the readings.
    pub elapsed_ns: u64,
    /// Rows its sources read.
    pub source_rows: u64,
    /// Nanoseconds its sources waited for room (summed over sources).
    pub source_blocked_ns: u64,
    /// Rows its sources' disk buffers gained (negative: drained).
    pub buffered_rows: i64,
    /// Its sources, counted in `source_rows`.
    pub sources: usize,
    /// Its operators.
    pub operators: Vec<OperatorSample>,
}

impl Sample {
    /// Rows per second the sources would have read had nothing held them
    /// back: DS2's target rate.
    pub fn offered_rate(&self) -> f64 {
        let per_source = self.elapsed_ns.max(1) as f64;
        let waiting = self.source_blocked_ns as f64 / self.sources.max(1) as f64;
        let useful = (per_source - waiting).max(per_source * 0.01);
        let read = self.source_rows as f64 / (useful / 1e9);
        let piled = self.buffered_rows.max(0) as f64 / (per_source / 1e9);
        read + piled
    }
}

/// The names of the stages of `graph` that run one instance per unit of
/// parallelism: those partitioned by key.
pub fn scaled_stages(graph: &QueryGraph) -> Vec<String> {
    let before = graph.inputs.iter().enumerate().flat_map(|(i, input)| {
        input
            .stages
            .iter()
            .enumerate()
            .filter(|(_, s)| s.keys.is_some())
            .map(move |(j, _)| input_prefix(i, j))
    });
    let after = graph
        .stages
        .iter()
        .enumerate()
        .filter(|(_, s)| s.keys.is_some())
        .map(|(j, _)| stage_prefix(j));
    before.chain(after).collect()
}

/// What a controller concluded from one sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The parallelism it wants (within the bounds).
    pub wanted: usize,
    /// The offered rate, rows per second.
    pub offered: f64,
    /// The operator that decided, with its measure (true rate per
    /// instance for DS2, utilisation for the rule).
    pub by: Option<(String, f64)>,
    /// Why, in words.
    pub why: String,
}

/// What `policy` wants for a query running at `current` that measured
/// `sample`; `None` when the sample says nothing (no time, or rows that no
/// scaled operator worked on). An idle query (no source rows, no operator
/// took any) wants `autoscale.min`, whatever the policy.
pub fn decide(settings: &AutoscaleSettings, current: usize, sample: &Sample) -> Option<Verdict> {
    if sample.elapsed_ns > 0 && sample.source_rows == 0 {
        let idle = sample.operators.iter().all(|op| op.rows_in == 0);
        return idle.then(|| Verdict {
            wanted: settings.min,
            offered: 0.0,
            by: None,
            why: format!(
                "idle: no rows in the last {:.1} s (at {current}, down to autoscale.min)",
                sample.elapsed_ns as f64 / 1e9
            ),
        });
    }
    let scaled: Vec<&OperatorSample> = sample
        .operators
        .iter()
        .filter(|op| op.scaled && op.rows_in > 0 && op.busy_ns > 0)
        .collect();
    if sample.elapsed_ns == 0 || sample.source_rows == 0 || scaled.is_empty() {
        return None;
    }
    Some(match settings.policy {
        Policy::Ds2 => ds2(settings, sample, &scaled),
        Policy::Rule => rule(settings, current, sample, &scaled),
    })
}

fn ds2(settings: &AutoscaleSettings, sample: &Sample, scaled: &[&OperatorSample]) -> Verdict {
    let offered = sample.offered_rate();
    let need = |op: &OperatorSample| {
        let true_rate = op.rows_in as f64 / (op.busy_ns as f64 / 1e9);
        let reached = (op.rows_in as i64 + op.queued_rows).max(0);
        let share = reached as f64 / sample.source_rows as f64;
        let instances = offered * share * settings.headroom / true_rate;
        (instances, true_rate)
    };
    let (op, (instances, true_rate)) = scaled
        .iter()
        .map(|op| (op, need(op)))
        .max_by(|a, b| a.1.0.total_cmp(&b.1.0))
        .expect("at least one operator");
    let wanted = settings.clamp((instances.ceil() as usize).max(1));
    let why = format!(
        "offered {offered:.0} rows/s; {} takes {true_rate:.0} rows/s per instance of useful time, so needs {instances:.2} instances with headroom {}",
        op.name, settings.headroom
    );
    Verdict {
        wanted,
        offered,
        by: Some((op.name.clone(), true_rate)),
        why,
    }
}

/// Above this utilisation the rule adds an instance.
const RULE_UP: f64 = 0.7;
/// Below this utilisation the rule takes one away.
const RULE_DOWN: f64 = 0.3;

fn rule(
    settings: &AutoscaleSettings,
    current: usize,
    sample: &Sample,
    scaled: &[&OperatorSample],
) -> Verdict {
    let utilisation = |op: &OperatorSample| {
        op.busy_ns as f64 / op.instances.max(1) as f64 / sample.elapsed_ns as f64
    };
    let op = scaled
        .iter()
        .max_by(|a, b| utilisation(a).total_cmp(&utilisation(b)))
        .expect("at least one operator");
    let used = utilisation(op);
    let step = if used > RULE_UP {
        current + 1
    } else if used < RULE_DOWN {
        current.saturating_sub(1)
    } else {
        current
    };
    Verdict {
        wanted: settings.clamp(step.max(1)),
        offered: sample.offered_rate(),
        by: Some((op.name.clone(), used)),
        why: format!(
            "{} is busy {:.0} % of the time per instance (up above {:.0} %, down below {:.0} %)",
            op.name,
            used * 100.0,
            RULE_UP * 100.0,
            RULE_DOWN * 100.0
        ),
    }
}

/// One decision of a controller, as its log keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Wall-clock time it was made, epoch milliseconds.
    pub at_ms: i64,
    /// Who made it.
    pub policy: Policy,
    /// The parallelism before.
    pub from: usize,
    /// The parallelism after (the same when it decided to stay).
    pub to: usize,
    /// What it measured and why it chose.
    pub verdict: Verdict,
    /// Whether the rescale was made; the error when it failed.
    pub outcome: std::result::Result<(), String>,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let when = chrono::DateTime::from_timestamp_millis(self.at_ms)
            .map(|t| t.format("%H:%M:%S").to_string())
            .unwrap_or_default();
        write!(
            f,
            "{when} {}: parallelism {} -> {} ({})",
            self.policy, self.from, self.to, self.verdict.why
        )?;
        if let Err(e) = &self.outcome {
            write!(f, "; failed: {e}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A query of one scaled aggregate whose instances each take
    /// `capacity` rows per second of useful time, fed `offered` rows per
    /// second at `parallelism` for one second: what its counters show
    /// (back-pressure holds the source when the instances cannot keep up).
    fn simulate(offered: f64, capacity: f64, parallelism: usize) -> Sample {
        let can = capacity * parallelism as f64;
        let taken = offered.min(can);
        let blocked = if offered > can {
            1.0 - can / offered
        } else {
            0.0
        };
        Sample {
            elapsed_ns: 1_000_000_000,
            source_rows: taken as u64,
            source_blocked_ns: (blocked * 1e9) as u64,
            buffered_rows: 0,
            sources: 1,
            operators: vec![
                OperatorSample {
                    name: "filter".into(),
                    scaled: false,
                    instances: 1,
                    rows_in: taken as u64,
                    queued_rows: 0,
                    busy_ns: (taken / (capacity * 20.0) * 1e9) as u64,
                },
                OperatorSample {
                    name: "aggregate".into(),
                    scaled: true,
                    instances: parallelism,
                    rows_in: taken as u64,
                    queued_rows: 0,
                    busy_ns: (taken / capacity * 1e9) as u64,
                },
            ],
        }
    }

    fn settings(policy: Policy, max: usize) -> AutoscaleSettings {
        AutoscaleSettings {
            policy,
            max,
            ..AutoscaleSettings::defaults(max)
        }
    }

    /// Runs the controller on the simulated query until it stays put, and
    /// returns the parallelisms it chose in turn.
    fn converge(policy: Policy, offered: f64, start: usize) -> Vec<usize> {
        let settings = settings(policy, 16);
        let mut at = start;
        let mut steps = Vec::new();
        for _ in 0..20 {
            let verdict = decide(&settings, at, &simulate(offered, 1000.0, at)).unwrap();
            if verdict.wanted == at {
                break;
            }
            at = verdict.wanted;
            steps.push(at);
        }
        steps
    }

    #[test]
    fn ds2_lands_on_the_needed_parallelism_in_one_decision_each_way() {
        // 5,000 rows/s at 1,000 per instance with 25 % headroom: 6.25 -> 7.
        assert_eq!(converge(Policy::Ds2, 5000.0, 1), vec![7]);
        assert_eq!(converge(Policy::Ds2, 500.0, 7), vec![1]);
        assert_eq!(converge(Policy::Ds2, 5000.0, 7), Vec::<usize>::new());
    }

    #[test]
    fn a_backlog_building_or_drained_is_not_a_change_in_the_share() {
        // One instance of capacity 1000 offered 3000: it took 1000 rows,
        // 2000 more wait ahead of it. It needs three instances (with
        // headroom 1.25: 3.75, four), not one.
        let mut sample = simulate(3000.0, 1000.0, 1);
        sample.source_rows = 3000;
        sample.source_blocked_ns = 0;
        sample.operators[1].rows_in = 1000;
        sample.operators[1].queued_rows = 2000;
        let verdict = decide(&settings(Policy::Ds2, 16), 1, &sample).unwrap();
        assert_eq!(verdict.wanted, 4, "{}", verdict.why);
        // Catching up on 1000 waiting rows at two instances, offered 1000:
        // it needs two (1.25), not three.
        let mut sample = simulate(1000.0, 1000.0, 2);
        sample.operators[1].rows_in = 2000;
        sample.operators[1].busy_ns = 2_000_000_000;
        sample.operators[1].queued_rows = -1000;
        let verdict = decide(&settings(Policy::Ds2, 16), 2, &sample).unwrap();
        assert_eq!(verdict.wanted, 2, "{}", verdict.why);
    }

    #[test]
    fn the_rule_walks_one_instance_at_a_time() {
        let up = converge(Policy::Rule, 5000.0, 1);
        assert_eq!(up, vec![2, 3, 4, 5, 6, 7, 8]);
        let down = converge(Policy::Rule, 500.0, 8);
        assert_eq!(down, vec![7, 6, 5, 4, 3, 2, 1]);
    }

    #[test]
    fn the_offered_rate_counts_what_back_pressure_held_back() {
        let sample = simulate(4000.0, 1000.0, 1);
        assert_eq!(sample.source_rows, 1000);
        assert!((sample.offered_rate() - 4000.0).abs() < 1.0);
    }

    #[test]
    fn bounds_clamp_and_unscaled_operators_do_not_decide() {
        let mut s = settings(Policy::Ds2, 3);
        s.min = 2;
        let verdict = decide(&s, 2, &simulate(50_000.0, 1000.0, 2)).unwrap();
        assert_eq!(verdict.wanted, 3);
        assert_eq!(verdict.by.unwrap().0, "aggregate");
        let verdict = decide(&s, 2, &simulate(10.0, 1000.0, 2)).unwrap();
        assert_eq!(verdict.wanted, 2);
        // An idle query goes down to the minimum, under either policy;
        // one whose operators still work on rows read before does not.
        let mut draining = simulate(10.0, 1000.0, 3);
        draining.source_rows = 0;
        assert!(decide(&s, 3, &draining).is_none());
        let mut idle = draining.clone();
        for op in &mut idle.operators {
            op.rows_in = 0;
            op.busy_ns = 0;
        }
        assert_eq!(decide(&s, 3, &idle).unwrap().wanted, 2);
        let mut rule = settings(Policy::Rule, 3);
        rule.min = 1;
        assert_eq!(decide(&rule, 3, &idle).unwrap().wanted, 1);
    }

    #[test]
    fn settings_are_checked() {
        let mut s = AutoscaleSettings::defaults(2);
        s.set("autoscale.policy", "rule").unwrap();
        assert_eq!(s.policy, Policy::Rule);
        s.set("autoscale.interval", "2s").unwrap();
        assert_eq!(s.interval, Duration::from_secs(2));
        assert!(s.set("autoscale.min", "0").is_err());
        assert!(s.set("autoscale.headroom", "0.5").is_err());
        assert!(s.set("autoscale.policy", "magic").is_err());
        s.set("autoscale.min", "3").unwrap();
        assert!(
            s.check()
                .unwrap_err()
                .to_string()
                .contains("above autoscale.max")
        );
    }
}
