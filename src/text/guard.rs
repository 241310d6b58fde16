//! Checks on the event times a file, stdin or push source decodes, before
//! they reach the watermark: the future guard (`max_future`) and the
//! timestamp-unit check (`ts_unit`).
//!
//! A watermark only moves forward, so one row dated years ahead would fire
//! every open window and make every later row late. The guard turns such a
//! row into a bad row instead. Its reference is the largest event time
//! accepted so far, and before the first row (and always for pushed rows)
//! the wall clock. A row more than `max_future` ahead of the reference is
//! held back; a row within the bound shows the held ones were outliers,
//! and they become bad rows ("event time too far ahead"). When
//! [`JUMP_ROWS`] rows in a row are ahead and within `max_future` of each
//! other, the data itself jumped (a gap, or a file that starts later than
//! expected), and they are all accepted. Pushed rows are live data, so
//! there a row ahead of the wall clock is bad at once.

use serde::{Deserialize, Serialize};

use super::TsUnit;
use crate::timestamp::{format_timestamp_ms, plausible_ms};

/// How many consecutive rows ahead of the reference, close to each other,
/// show that the stream jumped forward rather than carried outliers.
pub(super) const JUMP_ROWS: usize = 3;

/// How many numeric event times the unit check looks at.
pub(super) const UNIT_SAMPLE: usize = 10;

/// What the guard makes of a row's event time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Admit {
    /// Within the bound.
    Accept,
    /// Too far ahead of the wall clock on live input: a bad row now.
    Reject(String),
    /// Too far ahead: hold the row until later rows show whether it is an
    /// outlier (then it is bad, for `reason`) or the start of a jump.
    Hold {
        /// The bad-row reason, if it turns out to be an outlier.
        reason: String,
        /// The row is far from the rows held before it: those are outliers
        /// whatever this one is.
        breaks_run: bool,
    },
}

/// What a [`FutureGuard`] has learnt from the rows so far: what a
/// checkpoint keeps so that a resumed read judges the next rows as the
/// uninterrupted one would.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct GuardState {
    /// The largest event time accepted so far.
    pub largest: Option<i64>,
    /// The event time of the last row held, while rows are held.
    pub held_last: Option<i64>,
}

/// The `max_future` guard of one source.
#[derive(Debug)]
pub(super) struct FutureGuard {
    max_ahead: i64,
    /// Compare with the wall clock only (pushed rows).
    wall_clock: bool,
    /// The largest event time accepted so far.
    largest: Option<i64>,
    /// The event time of the last row held, while rows are held.
    held_last: Option<i64>,
}

impl FutureGuard {
    /// A guard allowing event times up to `max_ahead` ms ahead of the
    /// reference; `wall_clock` for live pushed rows.
    pub(super) fn new(max_ahead: i64, wall_clock: bool) -> Self {
        FutureGuard {
            max_ahead,
            wall_clock,
            largest: None,
            held_last: None,
        }
    }

    /// Judges event time `t`.
    pub(super) fn admit(&mut self, t: i64) -> Admit {
        // Reading the clock for every row showed in profiles; it is only
        // needed while it is the reference.
        let now = match (self.wall_clock, self.largest) {
            (false, Some(_)) => 0,
            _ => now_ms(),
        };
        self.admit_at(t, now)
    }

    fn admit_at(&mut self, t: i64, now: i64) -> Admit {
        let (reference, what) = match (self.wall_clock, self.largest) {
            (false, Some(largest)) => (largest, "the largest event time so far"),
            _ => (now, "the wall clock"),
        };
        if t <= reference.saturating_add(self.max_ahead) {
            self.raise(t);
            return Admit::Accept;
        }
        let reason = format!(
            "event time too far ahead: {} is more than {} after {}, {what} (max_future)",
            format_timestamp_ms(t),
            describe_span(self.max_ahead),
            format_timestamp_ms(reference),
        );
        if self.wall_clock {
            return Admit::Reject(reason);
        }
        let breaks_run = self
            .held_last
            .is_some_and(|last| t.abs_diff(last) > self.max_ahead.unsigned_abs());
        self.held_last = Some(t);
        Admit::Hold { reason, breaks_run }
    }

    /// Takes an accepted event time into account; no rows are held after.
    pub(super) fn raise(&mut self, t: i64) {
        self.largest = Some(self.largest.map_or(t, |l| l.max(t)));
        self.held_last = None;
    }

    /// What the guard has learnt so far.
    pub(super) fn state(&self) -> GuardState {
        GuardState {
            largest: self.largest,
            held_last: self.held_last,
        }
    }

    /// Takes up where a guard whose state was `state` left off.
    pub(super) fn restore(&mut self, state: GuardState) {
        self.largest = state.largest;
        self.held_last = state.held_last;
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A `max_future` bound for a message: `1 day`, `2 hours`, `90 seconds`.
fn describe_span(ms: i64) -> String {
    const UNITS: [(i64, &str); 5] = [
        (7 * 86_400_000, "week"),
        (86_400_000, "day"),
        (3_600_000, "hour"),
        (60_000, "minute"),
        (1000, "second"),
    ];
    for (size, name) in UNITS {
        if ms >= size && ms % size == 0 {
            let n = ms / size;
            return format!("{n} {name}{}", if n == 1 { "" } else { "s" });
        }
    }
    format!("{ms} ms")
}

/// Watches the first numeric event times of a source for the usual unit
/// mistake (seconds or microseconds read as milliseconds), and warns once
/// on stderr. A warning, not an error: small synthetic epoch numbers are
/// common in tests, and only a reading that lands in 1990-2100 in another
/// unit is suggested.
#[derive(Debug)]
pub(super) struct UnitCheck {
    unit: TsUnit,
    samples: Vec<i64>,
    done: bool,
}

/// What a [`UnitCheck`] has seen, as a checkpoint keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct UnitState {
    /// The numeric event times sampled so far (in ms).
    pub samples: Vec<i64>,
    /// Whether the check has decided (and warned, if it had to).
    pub done: bool,
}

impl UnitCheck {
    /// What the check has seen so far.
    pub(super) fn state(&self) -> UnitState {
        UnitState {
            samples: self.samples.clone(),
            done: self.done,
        }
    }

    /// Takes up where a check whose state was `state` left off: a warning
    /// already given is not given again.
    pub(super) fn restore(&mut self, state: UnitState) {
        self.samples = state.samples;
        self.samples.truncate(UNIT_SAMPLE);
        self.done = state.done;
    }

    pub(super) fn new(unit: TsUnit) -> Self {
        UnitCheck {
            unit,
            samples: Vec::with_capacity(UNIT_SAMPLE),
            done: false,
        }
    }

    /// Takes one numeric event time (decoded in the declared unit, in ms).
    pub(super) fn observe(&mut self, ms: i64, stream: &str) {
        if self.done {
            return;
        }
        self.samples.push(ms);
        if self.samples.len() >= UNIT_SAMPLE {
            self.decide(stream);
        }
    }

    /// Decides on the samples so far (at most once), with a warning (see
    /// [`crate::diag`]).
    pub(super) fn decide(&mut self, stream: &str) {
        if self.done || self.samples.is_empty() {
            return;
        }
        self.done = true;
        if let Some(message) = self.warning(stream) {
            crate::diag::emit(crate::diag::Level::Warning, &message);
        }
    }

    fn warning(&self, stream: &str) -> Option<String> {
        let likely = likely_unit(self.unit, &self.samples)?;
        let first = self.samples[0];
        let as_likely = self.unit.reinterpret(first, likely) as i64;
        Some(format!(
            "stream {stream}: the first event times, read as {} (ts_unit = '{}'), \
             fall around {}, outside 1990-2100; as {} they would fall around {}: \
             declare ts_unit = '{}' in the stream's WITH",
            self.unit.long_name(),
            self.unit.name(),
            format_timestamp_ms(first),
            likely.long_name(),
            format_timestamp_ms(as_likely),
            likely.name(),
        ))
    }
}

/// The unit the samples were likely written in: when none of them is
/// between 1990 and 2100 as decoded in `declared`, the one other unit that
/// puts them all there.
pub(super) fn likely_unit(declared: TsUnit, samples: &[i64]) -> Option<TsUnit> {
    if samples.is_empty() || samples.iter().any(|&ms| plausible_ms(ms as f64)) {
        return None;
    }
    TsUnit::ALL.into_iter().find(|&unit| {
        unit != declared
            && samples
                .iter()
                .all(|&ms| plausible_ms(declared.reinterpret(ms, unit)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400_000;

    #[test]
    fn an_outlier_is_held_then_rejected_by_the_next_row() {
        let mut g = FutureGuard::new(DAY, false);
        let now = 2_000_000_000_000;
        assert_eq!(g.admit_at(1000, now), Admit::Accept);
        let far = 1000 + 3650 * DAY;
        let Admit::Hold { reason, breaks_run } = g.admit_at(far, now) else {
            panic!("held")
        };
        assert!(!breaks_run);
        assert!(
            reason.starts_with("event time too far ahead: 1979-12-30")
                && reason.contains("more than 1 day after 1970-01-01T00:00:01")
                && reason.contains("the largest event time so far"),
            "{reason}"
        );
        // The next row is within the bound of the reference: accepted.
        assert_eq!(g.admit_at(2000, now), Admit::Accept);
        assert_eq!(g.largest, Some(2000));
    }

    #[test]
    fn before_the_first_row_the_reference_is_the_wall_clock() {
        let now = 1_700_000_000_000;
        let mut g = FutureGuard::new(DAY, false);
        let Admit::Hold { reason, .. } = g.admit_at(now + 2 * DAY, now) else {
            panic!("held")
        };
        assert!(reason.contains("the wall clock"), "{reason}");
        // A historical file is fine.
        assert_eq!(g.admit_at(1000, now), Admit::Accept);
    }

    #[test]
    fn rows_far_apart_break_a_run() {
        let mut g = FutureGuard::new(DAY, false);
        let now = 2_000_000_000_000;
        g.admit_at(0, now);
        assert!(matches!(
            g.admit_at(10 * DAY, now),
            Admit::Hold {
                breaks_run: false,
                ..
            }
        ));
        assert!(matches!(
            g.admit_at(10 * DAY + 1000, now),
            Admit::Hold {
                breaks_run: false,
                ..
            }
        ));
        assert!(matches!(
            g.admit_at(500 * DAY, now),
            Admit::Hold {
                breaks_run: true,
                ..
            }
        ));
    }

    #[test]
    fn pushed_rows_are_judged_by_the_wall_clock_at_once() {
        let now = 1_700_000_000_000;
        let mut g = FutureGuard::new(3_600_000, true);
        assert_eq!(g.admit_at(now + 1000, now), Admit::Accept);
        let Admit::Reject(reason) = g.admit_at(now + 2 * 3_600_000, now) else {
            panic!("rejected")
        };
        assert!(reason.contains("more than 1 hour after"), "{reason}");
        // The largest so far does not move the reference for pushed rows.
        assert_eq!(g.admit_at(now + 3_000_000, now), Admit::Accept);
        assert!(matches!(
            g.admit_at(now + 3_000_000 + 3_000_000, now),
            Admit::Reject(_)
        ));
    }

    #[test]
    fn spans_are_described_in_their_largest_whole_unit() {
        assert_eq!(describe_span(DAY), "1 day");
        assert_eq!(describe_span(2 * 3_600_000), "2 hours");
        assert_eq!(describe_span(90_000), "90 seconds");
        assert_eq!(describe_span(1500), "1500 ms");
    }

    #[test]
    fn likely_units() {
        let secs: Vec<i64> = (0..10).map(|i| 1_392_388_200 + i * 60).collect();
        assert_eq!(likely_unit(TsUnit::Millis, &secs), Some(TsUnit::Seconds));
        let micros: Vec<i64> = (0..10).map(|i| 1_392_388_200_000_000i64 + i).collect();
        // Microseconds read as milliseconds: year 46000.
        assert_eq!(likely_unit(TsUnit::Millis, &micros), Some(TsUnit::Micros));
        // Plausible already, or plausible in no unit: nothing to say.
        assert_eq!(likely_unit(TsUnit::Millis, &[1_392_388_200_000]), None);
        assert_eq!(likely_unit(TsUnit::Millis, &[1000, 2000, 3000]), None);
        // Milliseconds declared as seconds.
        let ms_as_s = [1_392_388_200_000i64 * 1000];
        assert_eq!(likely_unit(TsUnit::Seconds, &ms_as_s), Some(TsUnit::Millis));
        assert_eq!(likely_unit(TsUnit::Millis, &[]), None);
    }
}
