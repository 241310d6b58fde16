//! The configuration of a source ([`SourceConfig`]: what a `CREATE STREAM`
//! resolves to) and of a sink ([`SinkConfig`]: what a `CREATE SINK`
//! resolves to), as the planner, the runtime and the connectors share it.

use std::path::PathBuf;

use datafusion::arrow::datatypes::SchemaRef;

use super::{Opener, Reader, SourceRead};
use crate::timestamp::TsUnit;

/// Where a source reads from.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceLocation {
    /// A file on disk, already resolved against the script's directory.
    File(PathBuf),
    /// The process's standard input.
    Stdin,
    /// Rows pushed by the program that embeds vigil, or posted to
    /// `vigil serve`; see the session's `push`.
    Push,
    /// A connector that reads by itself (`host`, `demo`, ...); see
    /// [`registry::SourceRead`].
    Connector(Reader),
}

impl SourceLocation {
    /// The reader of a connector that reads by itself, if this is one.
    pub fn reader(&self) -> Option<&dyn SourceRead> {
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
