//! The progress line `vigil run` keeps on stderr while it reads its inputs.
//!
//! One line, redrawn in place (`\r`, clear line) about four times a second
//! by a ticker thread. Results written to the same terminal would land in
//! the middle of it, so every writer of terminal stdout goes through the
//! [`StatusLine`] lock: it clears the line, writes, and lets the next tick
//! draw the line again below what was written. The line is cleared for
//! good before the summary.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::analyze::thousands;
use crate::runtime::RunReport;
use crate::timestamp::format_timestamp_ms;

/// How often the line is redrawn.
const TICK: Duration = Duration::from_millis(250);

/// The rate is taken over about this much recent time.
const RATE_SPAN: Duration = Duration::from_secs(2);

/// Clears the terminal line the cursor is on.
const CLEAR: &str = "\r\x1b[2K";

/// The progress line on stderr, and the lock that keeps writes to the same
/// terminal from garbling it.
#[derive(Debug, Default)]
pub(super) struct StatusLine {
    /// Whether the line is drawn now.
    drawn: Mutex<bool>,
}

impl StatusLine {
    /// Clears the line (if drawn) and holds it off until the guard drops;
    /// write to the terminal meanwhile.
    pub fn hold(&self) -> MutexGuard<'_, bool> {
        let mut drawn = self.drawn.lock().unwrap_or_else(|e| e.into_inner());
        if *drawn {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(CLEAR.as_bytes());
            let _ = err.flush();
            *drawn = false;
        }
        drawn
    }

    fn draw(&self, text: &str) {
        let mut drawn = self.drawn.lock().unwrap_or_else(|e| e.into_inner());
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "{CLEAR}{text}");
        let _ = err.flush();
        *drawn = true;
    }
}

/// The ticker thread drawing the line; [`Progress::finish`] stops it.
pub(super) struct Progress {
    line: Arc<StatusLine>,
    done: Arc<(Mutex<bool>, Condvar)>,
    ticker: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts drawing the progress of the run whose counters `report`
    /// holds, now and every [`TICK`].
    pub fn start(line: Arc<StatusLine>, report: &RunReport) -> Self {
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let ticker = {
            let (line, done, report) = (line.clone(), done.clone(), report.clone());
            std::thread::spawn(move || {
                let mut rate = Rate::default();
                let mut blocked = Blocked::default();
                let (lock, wake) = &*done;
                let mut finished = lock.lock().unwrap_or_else(|e| e.into_inner());
                while !*finished {
                    let text = render(&report, &mut rate, &mut blocked);
                    drop(finished);
                    line.draw(&text);
                    finished = lock.lock().unwrap_or_else(|e| e.into_inner());
                    if !*finished {
                        finished = wake
                            .wait_timeout(finished, TICK)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
            })
        };
        Self {
            line,
            done,
            ticker: Some(ticker),
        }
    }

    /// Stops the ticker and clears the line.
    pub fn finish(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let (lock, wake) = &*self.done;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        if let Some(ticker) = self.ticker.take() {
            let _ = ticker.join();
        }
        drop(self.line.hold());
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Rows per second over the last [`RATE_SPAN`].
#[derive(Default)]
struct Rate {
    samples: VecDeque<(Instant, u64)>,
}

impl Rate {
    fn update(&mut self, rows: u64) -> f64 {
        let now = Instant::now();
        self.samples.push_back((now, rows));
        while self.samples.len() > 2 && now.duration_since(self.samples[1].0) >= RATE_SPAN {
            self.samples.pop_front();
        }
        let (then, before) = self.samples[0];
        let secs = now.duration_since(then).as_secs_f64();
        if secs > 0.0 {
            rows.saturating_sub(before) as f64 / secs
        } else {
            0.0
        }
    }
}

/// The share of the time between two ticks that the sources spent waiting
/// for room downstream (back-pressure).
#[derive(Default)]
struct Blocked {
    last: Option<(Instant, u64)>,
}

impl Blocked {
    /// The share (0 to 1) of the time since the last call that `sources`
    /// sources, blocked `total_ns` in all so far, spent blocked.
    fn update(&mut self, now: Instant, total_ns: u64, sources: usize) -> f64 {
        let share = match self.last {
            Some((then, before)) if sources > 0 => {
                let span = now.duration_since(then).as_nanos() as f64 * sources as f64;
                match span > 0.0 {
                    true => (total_ns.saturating_sub(before) as f64 / span).min(1.0),
                    false => 0.0,
                }
            }
            _ => 0.0,
        };
        self.last = Some((now, total_ns));
        share
    }
}

/// The progress text: rows read, rows per second, how far event time has
/// got (the least advanced stream, when there are several), late rows and
/// bad rows; and, when there are some, shed rows, rows waiting in disk
/// buffers (and whether one is full) and the share of the last tick the
/// sources spent back-pressured.
fn render(report: &RunReport, rate: &mut Rate, blocked: &mut Blocked) -> String {
    // `late(...)` streams re-read rows other queries dropped: not input.
    let inputs: Vec<_> = report
        .streams
        .iter()
        .filter(|(name, _)| !name.starts_with("late("))
        .collect();
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    let (mut rows, mut bad, mut at) = (0, 0, None::<i64>);
    let (mut shed, mut buffered, mut full, mut blocked_ns) = (0, 0, false, 0);
    for (_, stats) in &inputs {
        rows += load(&stats.rows);
        bad += load(&stats.bad_rows);
        shed += load(&stats.shed_rows);
        buffered += load(&stats.buffered_rows);
        full |= stats.buffer_full.load(Ordering::Relaxed);
        blocked_ns += load(&stats.blocked_ns);
        if let Some(t) = stats.max_event_time.get() {
            at = Some(at.map_or(t, |a| a.min(t)));
        }
    }
    let late: u64 = report.queries.iter().map(|q| load(&q.late_rows)).sum();
    // A stream's shed rows are those of every query reading it: adding
    // the queries' would count them twice.
    let share = blocked.update(Instant::now(), blocked_ns, inputs.len());
    let per_second = rate.update(rows);
    let mut text = format!(
        "vigil: {} row{} ({}/s)",
        thousands(rows),
        if rows == 1 { "" } else { "s" },
        thousands(per_second.round() as u64)
    );
    if let Some(at) = at {
        text.push_str(&format!(" at {}", format_timestamp_ms(at)));
    }
    text.push_str(&format!(
        ", late {}, bad {}",
        thousands(late),
        thousands(bad)
    ));
    if shed > 0 {
        text.push_str(&format!(", shed {}", thousands(shed)));
    }
    if buffered > 0 {
        text.push_str(&format!(", buffered {}", thousands(buffered)));
    }
    if full {
        text.push_str(", buffer full");
    }
    let percent = (share * 100.0).round();
    if percent > 0.0 {
        text.push_str(&format!(", back-pressure {percent}%"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connector::SourceStats;
    use crate::exec::QueryStats;

    #[test]
    fn shed_buffered_and_back_pressure_show_when_there_are_some() {
        let (a, b) = (
            Arc::new(SourceStats::default()),
            Arc::new(SourceStats::default()),
        );
        a.rows.store(10, Ordering::Relaxed);
        a.shed_rows.store(4, Ordering::Relaxed);
        b.buffered_rows.store(2500, Ordering::Relaxed);
        b.buffer_full.store(true, Ordering::Relaxed);
        let query = Arc::new(QueryStats::default());
        query.shed_rows.store(4, Ordering::Relaxed);
        b.shed_rows.store(1, Ordering::Relaxed);
        let report = RunReport {
            streams: vec![("a".into(), a), ("b".into(), b.clone())],
            queries: vec![query],
        };
        let (mut rate, mut blocked) = (Rate::default(), Blocked::default());
        assert_eq!(
            render(&report, &mut rate, &mut blocked),
            "vigil: 10 rows (0/s), late 0, bad 0, shed 5, buffered 2,500, buffer full"
        );
        // Two sources over one second: 1.5 s blocked is three quarters.
        let start = Instant::now();
        let mut blocked = Blocked::default();
        assert_eq!(blocked.update(start, 0, 2), 0.0);
        let share = blocked.update(start + Duration::from_secs(1), 1_500_000_000, 2);
        assert_eq!(share, 0.75);
        assert_eq!(
            blocked.update(start + Duration::from_secs(2), 1_500_000_000, 2),
            0.0
        );
    }

    #[test]
    fn the_line_sums_inputs_and_shows_the_least_advanced_event_time() {
        let (a, b, late) = (
            Arc::new(SourceStats::default()),
            Arc::new(SourceStats::default()),
            Arc::new(SourceStats::default()),
        );
        a.rows.store(1500, Ordering::Relaxed);
        a.max_event_time.raise(20_000);
        b.rows.store(500, Ordering::Relaxed);
        b.bad_rows.store(2, Ordering::Relaxed);
        b.max_event_time.raise(10_250);
        late.rows.store(7, Ordering::Relaxed);
        let query = Arc::new(QueryStats::default());
        query.late_rows.store(3, Ordering::Relaxed);
        let report = RunReport {
            streams: vec![("a".into(), a), ("b".into(), b), ("late(a)".into(), late)],
            queries: vec![query],
        };
        let text = render(&report, &mut Rate::default(), &mut Blocked::default());
        assert_eq!(
            text,
            "vigil: 2,000 rows (0/s) at 1970-01-01T00:00:10.250, late 3, bad 2"
        );
        let empty = render(
            &RunReport::default(),
            &mut Rate::default(),
            &mut Blocked::default(),
        );
        assert_eq!(empty, "vigil: 0 rows (0/s), late 0, bad 0");
        let one = RunReport {
            streams: vec![("a".into(), Arc::new(SourceStats::default()))],
            queries: Vec::new(),
        };
        one.streams[0].1.rows.store(1, Ordering::Relaxed);
        assert_eq!(
            render(&one, &mut Rate::default(), &mut Blocked::default()),
            "vigil: 1 row (0/s), late 0, bad 0"
        );
    }
}
