//! Sources and sinks: where rows enter the engine and where results leave it.
//!
//! One module per connector (`file` for files, stdin and pushed rows,
//! `host`, `demo`, `webhook`), each declaring its options and columns to
//! the one list in [`registry`], which the planner, `vigil check`, the
//! shell's completion and the reference read. Shared by all: option parsing
//! ([`options`]), the decoding of text rows ([`source`]: CSV and JSON lines;
//! malformed rows are skipped, counted and reported with their line number,
//! never silently lost), timestamps ([`timestamp`]) and the rendering of
//! results ([`sink`]).

pub mod alertmanager;
pub mod catalogue;
pub mod demo;
pub mod file;
pub mod file_commit;
mod guard;
pub mod host;
pub mod influx;
pub mod kafka;
pub mod options;
pub mod otlp;
pub mod prometheus;
pub mod registry;
pub mod remote_write;
pub mod sink;
pub mod source;
pub mod table;
#[cfg(test)]
mod test_server;
pub mod webhook;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::SchemaRef;

pub use crate::state::position::{SinkCommit, SourcePosition};
pub use crate::timestamp::TsUnit;
pub use options::parse_output_format;
pub use registry::{Opener, Reader};
pub use sink::{Destination, Sink, make_labelled_sink, make_sink, make_sink_to, open_sink};
pub use source::{
    MessageOrigin, dead_letter_line, read_bytes, read_messages, read_source, read_source_from,
};

/// Where a source reads from.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceLocation {
    /// A file on disk, already resolved against the script's directory.
    File(PathBuf),
    /// The process's standard input.
    Stdin,
    /// Rows pushed by the program that embeds vigil, or posted to
    /// `vigil serve`; see [`crate::session::Session::push`].
    Push,
    /// A connector that reads by itself (`host`, `demo`, ...); see
    /// [`registry::SourceRead`].
    Connector(Reader),
}

impl SourceLocation {
    /// The reader of a connector that reads by itself, if this is one.
    pub fn reader(&self) -> Option<&dyn registry::SourceRead> {
        match self {
            SourceLocation::Connector(r) => Some(r.0.as_ref()),
            _ => None,
        }
    }
}

/// The text format of a source's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// CSV with a header row; columns are matched to the schema by name.
    Csv,
    /// One JSON object per line; fields are matched to the schema by name.
    Jsonl,
}

/// How fast a file source replays its rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Replay {
    /// As fast as the engine can take them (the default).
    Fast,
    /// Paced by event time: a gap of `d` between two rows' event times is
    /// replayed as a wall-clock pause of `d / speed`.
    Realtime {
        /// Speed-up factor; 1.0 is real time.
        speed: f64,
    },
}

/// Everything a source needs to read one stream.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceConfig {
    /// The stream's name, used in messages.
    pub stream: String,
    /// The declared schema; every batch the source emits has exactly it.
    pub schema: SchemaRef,
    /// The connector's name in [`registry::SOURCES`]: `file`, `stdin`,
    /// `push`, `host`, ... (tells apart the protocols that feed push
    /// streams).
    pub connector: &'static str,
    /// Where to read.
    pub location: SourceLocation,
    /// How rows are encoded.
    pub format: Format,
    /// Replay pacing.
    pub replay: Replay,
    /// Index in `schema` of the event-time column, used for realtime pacing.
    pub event_time: Option<usize>,
    /// Maximum rows per emitted batch.
    pub batch_size: usize,
    /// Where malformed rows are copied, if anywhere.
    pub dead_letter: Option<PathBuf>,
    /// Keep reading a regular file as it grows (`tail -f`) instead of
    /// ending at its end; `follow` in `WITH`.
    pub follow: bool,
    /// How rows are decoded: record boundaries, timestamp units and the
    /// event-time guard.
    pub decode: Decoding,
    /// Threads that decode a file source: its lines are cut into chunks
    /// that these threads decode at once, handed on in file order, so
    /// rows, bad rows, the watermark and positions are those of one
    /// thread. 1 decodes on the reading thread. Used for JSON lines, and
    /// for CSV unless `multiline` (a quoted field spanning lines ties a
    /// line to the ones before); a followed file, stdin, a pipe and pushed
    /// rows always use one. Default: [`default_decode_threads`].
    pub decode_threads: usize,
}

/// The default [`SourceConfig::decode_threads`]: the available cores, at
/// most 4 (more rarely pays off: the rows are taken in order on one), or
/// the environment variable `VIGIL_DECODE_THREADS` when it is a positive
/// number (for benchmarks).
pub fn default_decode_threads() -> usize {
    if let Some(n) = std::env::var("VIGIL_DECODE_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return n;
    }
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4)
}

/// Default bound of a CSV record that spans lines (`max_record_size`).
pub const DEFAULT_MAX_RECORD_SIZE: usize = 1 << 20;

/// Default `max_future`: one day, in milliseconds.
pub const DEFAULT_MAX_FUTURE_MS: i64 = 24 * 3600 * 1000;

/// Decoding options of a file, stdin or push source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoding {
    /// A quoted CSV field may span lines (`multiline = 'true'`); otherwise
    /// every record ends at its newline, so one bad line costs one row.
    pub multiline: bool,
    /// Most bytes a CSV record spanning lines may have before it is a bad
    /// record (`max_record_size`).
    pub max_record_size: usize,
    /// The unit of numeric timestamps (`ts_unit`).
    pub ts_unit: TsUnit,
    /// A row whose event time is more than this many milliseconds ahead of
    /// the stream (see [`source`]) is a bad row; `None` disables the guard
    /// (`max_future = 'none'`).
    pub max_future_ms: Option<i64>,
}

impl Default for Decoding {
    fn default() -> Self {
        Decoding {
            multiline: false,
            max_record_size: DEFAULT_MAX_RECORD_SIZE,
            ts_unit: TsUnit::Millis,
            max_future_ms: Some(DEFAULT_MAX_FUTURE_MS),
        }
    }
}

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

/// Output formats for results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// Aligned text tables, one per batch of results.
    Table,
    /// CSV with one header line.
    Csv,
    /// One JSON object per row.
    Jsonl,
}

/// Where a sink writes.
#[derive(Debug, Clone, PartialEq)]
pub enum SinkTarget {
    /// Standard output.
    Stdout,
    /// A file, created or truncated when the first query writing to it
    /// starts; queries writing to it at the same time share it.
    File(PathBuf),
    /// A connector that opens its destination itself (`webhook`, ...);
    /// see [`registry::SinkOpen`].
    Connector(Opener),
}

/// A sink declared with `CREATE SINK`.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkConfig {
    /// The sink's name.
    pub name: String,
    /// Where it writes.
    pub target: SinkTarget,
    /// How it writes.
    pub format: OutputFormat,
    /// Takes final rows only (`append_only = 'true'`): queries that emit
    /// updates or early results are rejected when planned.
    pub append_only: bool,
}
