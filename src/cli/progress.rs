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

use crate::connectors::timestamp::format_timestamp_ms;
use crate::runtime::RunReport;

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
                let (lock, wake) = &*done;
                let mut finished = lock.lock().unwrap_or_else(|e| e.into_inner());
                while !*finished {
                    let text = render(&report, &mut rate);
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

/// The progress text: rows read, rows per second, how far event time has
/// got (the least advanced stream, when there are several), late rows and
/// bad rows.
fn render(report: &RunReport, rate: &mut Rate) -> String {
    // `late(...)` streams re-read rows other queries dropped: not input.
    let inputs = report
        .streams
        .iter()
        .filter(|(name, _)| !name.starts_with("late("));
    let (mut rows, mut bad, mut at) = (0, 0, None::<i64>);
    for (_, stats) in inputs {
        rows += stats.rows.load(Ordering::Relaxed);
        bad += stats.bad_rows.load(Ordering::Relaxed);
        if let Some(t) = stats.max_event_time.get() {
            at = Some(at.map_or(t, |a| a.min(t)));
        }
    }
    let late: u64 = report
        .queries
        .iter()
        .map(|q| q.late_rows.load(Ordering::Relaxed))
        .sum();
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
    text
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::SourceStats;
    use crate::exec::QueryStats;

    #[test]
    fn numbers_get_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
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
        let text = render(&report, &mut Rate::default());
        assert_eq!(
            text,
            "vigil: 2,000 rows (0/s) at 1970-01-01T00:00:10.250, late 3, bad 2"
        );
        let empty = render(&RunReport::default(), &mut Rate::default());
        assert_eq!(empty, "vigil: 0 rows (0/s), late 0, bad 0");
        let one = RunReport {
            streams: vec![("a".into(), Arc::new(SourceStats::default()))],
            queries: Vec::new(),
        };
        one.streams[0].1.rows.store(1, Ordering::Relaxed);
        assert_eq!(
            render(&one, &mut Rate::default()),
            "vigil: 1 row (0/s), late 0, bad 0"
        );
    }
}
