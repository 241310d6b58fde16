//! The text connectors: sources `file`, `stdin` and `push` (CSV or JSON
//! lines, decoded by the text kit, [`crate::text`]), and sinks `file` and
//! `stdout` (table, CSV or JSON lines, rendered by [`sink`](super::sink)).

use std::path::Path;

use super::common::{APPEND_ONLY, TEXT_OPTIONS, batch_size, decoding};
use super::options::{Options, format_from_extension, parse_output_format, parse_source_format};
use super::{Format, OutputFormat, Replay, SinkConfig, SinkTarget, SourceConfig, SourceLocation};
use crate::connector::{OptionSpec, OptionType, SinkConnector, SourceConnector, StreamDecl};
use crate::error::{Error, Result};

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

fn connector_of(location: &SourceLocation) -> &'static str {
    match location {
        SourceLocation::Stdin => "stdin",
        SourceLocation::Push => "push",
        _ => "file",
    }
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
