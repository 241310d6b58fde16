//! The text connectors: sources `file`, `stdin` and `push` (CSV or JSON
//! lines, decoded by the text kit, [`crate::text`]), and sinks `file` and
//! `stdout` (table, CSV or JSON lines, rendered by [`sink`](super::sink)).

use std::path::Path;

use super::options::{
    DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE, MAX_RECORD_SIZE_LIMIT, Options, format_from_extension,
    parse_max_future, parse_output_format, parse_source_format,
};
use super::{
    Decoding, Format, OutputFormat, Replay, SinkConfig, SinkTarget, SourceConfig, SourceLocation,
    TsUnit,
};
use crate::connector::{OptionSpec, OptionType, SinkConnector, SourceConnector, StreamDecl};
use crate::error::{Error, Result};

const FORMATS: &[&str] = &["csv", "jsonl", "json", "ndjson"];

/// The options of a `file` source: those of every text source, then its
/// own.
const FILE_OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "path",
        ty: OptionType::Path,
        default: None,
        accepted: "a file path",
        doc: "the file to read (required), relative to the script",
    },
    TEXT_OPTIONS[0],
    TEXT_OPTIONS[1],
    TEXT_OPTIONS[2],
    TEXT_OPTIONS[3],
    TEXT_OPTIONS[4],
    TEXT_OPTIONS[5],
    TEXT_OPTIONS[6],
    TEXT_OPTIONS[7],
    TEXT_OPTIONS[8],
    OptionSpec {
        name: "follow",
        ty: OptionType::Flag,
        default: Some("false"),
        accepted: "true, false",
        doc: "keep reading the file as it grows (`tail -F`)",
    },
];

/// The options of every text source (`file`, `stdin`, `push`).
pub(super) const TEXT_OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "format",
        ty: OptionType::Choice(FORMATS),
        default: Some("from the path's extension, else csv"),
        accepted: "csv, jsonl, json, ndjson",
        doc: "how rows are encoded",
    },
    OptionSpec {
        name: "replay",
        ty: OptionType::Choice(&["fast", "realtime"]),
        default: Some("fast"),
        accepted: "fast, realtime",
        doc: "as fast as possible, or paced by event time",
    },
    OptionSpec {
        name: "speed",
        ty: OptionType::Number,
        default: Some("1"),
        accepted: "a positive number such as 1 or 10",
        doc: "speed-up of `replay = 'realtime'`",
    },
    OptionSpec {
        name: "batch_size",
        ty: OptionType::Count,
        default: Some("8192"),
        accepted: "an integer from 1 to 16777216",
        doc: "most rows per batch",
    },
    OptionSpec {
        name: "dead_letter",
        ty: OptionType::Path,
        default: None,
        accepted: "a file path",
        doc: "file that malformed rows are copied to",
    },
    OptionSpec {
        name: "multiline",
        ty: OptionType::Flag,
        default: Some("false"),
        accepted: "true, false",
        doc: "a quoted CSV field may span lines",
    },
    OptionSpec {
        name: "max_record_size",
        ty: OptionType::Count,
        default: Some("1048576"),
        accepted: "a number of bytes from 1 to 1073741824",
        doc: "most bytes of a line, or of a CSV record spanning lines; a longer one is a bad row",
    },
    OptionSpec {
        name: "ts_unit",
        ty: OptionType::Choice(&["s", "ms", "us", "ns"]),
        default: Some("ms"),
        accepted: "s, ms, us, ns",
        doc: "unit of numeric timestamps",
    },
    OptionSpec {
        name: "max_future",
        ty: OptionType::Text,
        default: Some("1 day"),
        accepted: "a duration such as '1 hour', '30 minutes', '2 days', or 'none'",
        doc: "a row further ahead of the stream than this is a bad row",
    },
];

/// `connector = 'file'`: a file on disk (or a pipe named by a path).
pub struct FileSource;

/// `connector = 'stdin'`: the process's standard input.
pub struct StdinSource;

/// `connector = 'push'`: rows pushed by the embedding program or posted
/// to `vigil serve`.
pub struct PushSource;

impl SourceConnector for FileSource {
    fn name(&self) -> &'static str {
        "file"
    }
    fn summary(&self) -> &'static str {
        "CSV or JSON lines from a file, replayable and resumable; `follow` tails it"
    }
    fn options(&self) -> &'static [OptionSpec] {
        FILE_OPTIONS
    }
    fn configure(&self, decl: &StreamDecl<'_>, opts: &Options<'_>) -> Result<SourceConfig> {
        let Some(path) = opts.path("path", decl.base_dir)? else {
            return Err(Error::Plan(format!(
                "stream {}: connector 'file' needs a 'path' option",
                decl.stream
            )));
        };
        let format = source_format(opts, Some(&path))?;
        text_source(decl, opts, SourceLocation::File(path), format)
    }
}

impl SourceConnector for StdinSource {
    fn name(&self) -> &'static str {
        "stdin"
    }
    fn summary(&self) -> &'static str {
        "CSV or JSON lines from standard input, as it comes"
    }
    fn options(&self) -> &'static [OptionSpec] {
        TEXT_OPTIONS
    }
    fn configure(&self, decl: &StreamDecl<'_>, opts: &Options<'_>) -> Result<SourceConfig> {
        let format = source_format(opts, None)?;
        text_source(decl, opts, SourceLocation::Stdin, format)
    }
}

impl SourceConnector for PushSource {
    fn name(&self) -> &'static str {
        "push"
    }
    fn summary(&self) -> &'static str {
        "rows pushed by the embedding program or posted to `vigil serve` (CSV, JSON lines)"
    }
    fn options(&self) -> &'static [OptionSpec] {
        TEXT_OPTIONS
    }
    fn configure(&self, decl: &StreamDecl<'_>, opts: &Options<'_>) -> Result<SourceConfig> {
        let format = source_format(opts, None)?;
        text_source(decl, opts, SourceLocation::Push, format)
    }
}

/// `format`, else the one `path`'s extension implies, else CSV.
fn source_format(opts: &Options<'_>, path: Option<&Path>) -> Result<Format> {
    Ok(match opts.choice("format")? {
        Some(v) => parse_source_format(v).unwrap_or(Format::Csv),
        None => path
            .and_then(format_from_extension)
            .and_then(parse_source_format)
            .unwrap_or(Format::Csv),
    })
}

/// The configuration every text source shares.
fn text_source(
    decl: &StreamDecl<'_>,
    opts: &Options<'_>,
    location: SourceLocation,
    format: Format,
) -> Result<SourceConfig> {
    let speed = opts.number("speed")?.unwrap_or(1.0);
    let replay = match opts.choice("replay")? {
        Some("realtime") => Replay::Realtime { speed },
        _ => Replay::Fast,
    };
    let batch_size = batch_size(opts)?;
    let follow = opts.flag("follow")?;
    let decode = decoding(opts, format)?;
    if let Some(i) = decl.event_time
        && i >= decl.schema.fields().len()
    {
        return Err(Error::Plan(format!(
            "stream {}: event-time column index {i} is out of range",
            decl.stream
        )));
    }
    Ok(SourceConfig {
        stream: decl.stream.to_string(),
        schema: decl.schema.clone(),
        connector: connector_of(&location),
        location,
        format,
        replay,
        event_time: decl.event_time,
        batch_size,
        dead_letter: opts.path("dead_letter", decl.base_dir)?,
        follow,
        decode_threads: super::default_decode_threads(),
        decode,
    })
}

/// The `batch_size` option, within its bounds.
pub(super) fn batch_size(opts: &Options<'_>) -> Result<usize> {
    match opts.count("batch_size")? {
        None => Ok(DEFAULT_BATCH_SIZE),
        Some(n) if (1..=MAX_BATCH_SIZE as u64).contains(&n) => Ok(n as usize),
        Some(_) => Err(opts.bad_value("batch_size", opts.get("batch_size").unwrap_or(""))),
    }
}

fn connector_of(location: &SourceLocation) -> &'static str {
    match location {
        SourceLocation::Stdin => "stdin",
        SourceLocation::Push => "push",
        _ => "file",
    }
}

/// The decoding options of a text source.
pub(super) fn decoding(opts: &Options<'_>, format: Format) -> Result<Decoding> {
    let defaults = Decoding::default();
    let multiline = opts.flag("multiline")?;
    if multiline && format != Format::Csv {
        return Err(Error::Plan(format!(
            "{}: option 'multiline' is for CSV (a JSON Lines row is always one line)",
            opts.what()
        )));
    }
    let max_record_size = match opts.count("max_record_size")? {
        None => defaults.max_record_size,
        Some(n) if (1..=MAX_RECORD_SIZE_LIMIT as u64).contains(&n) => n as usize,
        Some(_) => {
            let v = opts.get("max_record_size").unwrap_or("");
            return Err(opts.bad_value("max_record_size", v));
        }
    };
    let ts_unit = match opts.choice("ts_unit")? {
        None => defaults.ts_unit,
        Some(v) => TsUnit::parse(v).unwrap_or(defaults.ts_unit),
    };
    let max_future_ms = match opts.get("max_future") {
        None => defaults.max_future_ms,
        Some(v) => parse_max_future(v).ok_or_else(|| opts.bad_value("max_future", v))?,
    };
    Ok(Decoding {
        multiline,
        max_record_size,
        ts_unit,
        max_future_ms,
    })
}

/// The options of a `file` sink.
const FILE_SINK_OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "path",
        ty: OptionType::Path,
        default: None,
        accepted: "a file path",
        doc: "the file to write (required), relative to the script",
    },
    OUTPUT_FORMAT,
    APPEND_ONLY,
];

/// The options of the `stdout` sink.
const STDOUT_OPTIONS: &[OptionSpec] = &[OUTPUT_FORMAT, APPEND_ONLY];

const OUTPUT_FORMAT: OptionSpec = OptionSpec {
    name: "format",
    ty: OptionType::Choice(&["csv", "jsonl", "table", "json", "ndjson"]),
    default: Some("from the path's extension, else csv"),
    accepted: "csv, jsonl, table",
    doc: "how rows are written",
};

/// `append_only`, which every sink takes.
pub(super) const APPEND_ONLY: OptionSpec = OptionSpec {
    name: "append_only",
    ty: OptionType::Flag,
    default: Some("false"),
    accepted: "true, false",
    doc: "take final rows only: queries emitting updates or early results are rejected",
};

/// `connector = 'file'` in `CREATE SINK`: a file, shared by the queries
/// writing to it, rolled back to a checkpoint on restore.
pub struct FileSink;

/// `connector = 'stdout'`: standard output.
pub struct StdoutSink;

impl SinkConnector for FileSink {
    fn name(&self) -> &'static str {
        "file"
    }
    fn summary(&self) -> &'static str {
        "a file (table, CSV or JSON lines), exactly once through checkpoints"
    }
    fn options(&self) -> &'static [OptionSpec] {
        FILE_SINK_OPTIONS
    }
    fn configure(&self, name: &str, opts: &Options<'_>, base_dir: &Path) -> Result<SinkConfig> {
        let Some(path) = opts.path("path", base_dir)? else {
            return Err(Error::Plan(format!(
                "sink {name}: connector 'file' needs a 'path' option"
            )));
        };
        let format = sink_format(opts, Some(&path))?;
        Ok(SinkConfig {
            name: name.to_string(),
            target: SinkTarget::File(path),
            format,
            append_only: opts.flag("append_only")?,
        })
    }
}

impl SinkConnector for StdoutSink {
    fn name(&self) -> &'static str {
        "stdout"
    }
    fn summary(&self) -> &'static str {
        "standard output (table, CSV or JSON lines)"
    }
    fn options(&self) -> &'static [OptionSpec] {
        STDOUT_OPTIONS
    }
    fn configure(&self, name: &str, opts: &Options<'_>, _: &Path) -> Result<SinkConfig> {
        Ok(SinkConfig {
            name: name.to_string(),
            target: SinkTarget::Stdout,
            format: sink_format(opts, None)?,
            append_only: opts.flag("append_only")?,
        })
    }
}

fn sink_format(opts: &Options<'_>, path: Option<&Path>) -> Result<OutputFormat> {
    Ok(match opts.choice("format")? {
        Some(v) => parse_output_format(v)?,
        None => match path.and_then(format_from_extension) {
            Some("jsonl") => OutputFormat::Jsonl,
            _ => OutputFormat::Csv,
        },
    })
}
