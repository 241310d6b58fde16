//! What a running source counts and reports while it reads: rows, bad
//! rows with samples, the largest event time, its position, and the
//! controls (stop, stop after N rows) the runtime and tests use.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::state::position::SourcePosition;

/// A malformed input row that was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRow {
    /// 1-based line number in the input (the header is line 1 for CSV).
    pub line: u64,
    /// Why the row was rejected, e.g. "column cpu: cannot parse 'abc' as DOUBLE".
    pub reason: String,
}

/// Counters a source updates while it runs; read for the run summary.
#[derive(Debug, Default)]
pub struct SourceStats {
    /// Rows read and emitted.
    pub rows: AtomicU64,
    /// Rows skipped as malformed.
    pub bad_rows: AtomicU64,
    /// The first few bad rows, for the summary.
    pub bad_samples: Mutex<Vec<BadRow>>,
    /// The largest event time read so far (for progress displays).
    pub max_event_time: MaxEventTime,
    /// Set to ask the source to stop: it ends at its next row (or poll,
    /// when following a file) without sending the final watermark, so the
    /// windows still open do not fire.
    pub stop: AtomicBool,
    /// Set to a checkpoint's id to ask the source to stop right after it
    /// has sent that checkpoint's barrier (or a later one), as `stop` does
    /// otherwise: the query's state and results up to there are then
    /// checkpointed and committed, and nothing after them is sent. 0 while
    /// not asked.
    pub stop_after: AtomicU64,
    /// Where the source stands after the rows it emitted last: set before
    /// each batch goes to `emit` (the empty batches of a waiting source
    /// too), so that a checkpoint barrier sent right after the batch
    /// records it. `None` for a source that cannot be read again.
    pub position: Mutex<Option<SourcePosition>>,
    /// Nanoseconds the source waited for its queries to take its rows
    /// (back-pressure).
    pub blocked_ns: AtomicU64,
    /// Rows its load shedder dropped, over every query reading it.
    pub shed_rows: AtomicU64,
    /// Rows waiting in its disk buffers now.
    pub buffered_rows: AtomicU64,
    /// Bytes its disk buffers hold now.
    pub buffered_bytes: AtomicU64,
    /// A disk buffer of it is full, so back-pressure has resumed.
    pub buffer_full: AtomicBool,
    /// Errors its client reported while it retried (a Kafka stream: an
    /// unreachable broker, a failed fetch), shared with the client.
    pub client_errors: Arc<AtomicU64>,
}

/// The largest event time a source has read, in epoch milliseconds.
#[derive(Debug)]
pub struct MaxEventTime(AtomicI64);

impl Default for MaxEventTime {
    fn default() -> Self {
        Self(AtomicI64::new(i64::MIN))
    }
}

impl MaxEventTime {
    /// The largest event time so far; `None` before the first row (or when
    /// the stream has no event-time column).
    pub fn get(&self) -> Option<i64> {
        Some(self.0.load(Ordering::Relaxed)).filter(|&t| t != i64::MIN)
    }

    /// Takes `ms` into account.
    pub fn raise(&self, ms: i64) {
        self.0.fetch_max(ms, Ordering::Relaxed);
    }
}

/// How many bad rows are kept verbatim for the summary.
pub const BAD_ROW_SAMPLES: usize = 10;

impl SourceStats {
    /// Records one malformed row.
    pub fn record_bad(&self, row: BadRow) {
        self.bad_rows.fetch_add(1, Ordering::Relaxed);
        let mut samples = self.bad_samples.lock().unwrap_or_else(|e| e.into_inner());
        if samples.len() < BAD_ROW_SAMPLES {
            samples.push(row);
        }
    }
}
