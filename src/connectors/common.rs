//! What several connectors share: the options every sink takes
//! (`append_only`), the text sources' options and their decoding settings,
//! `limit`, and the configuration of a source that makes its rows itself
//! or is fed by pushes. A connector imports this kit and the contract,
//! never another connector.

use crate::connector::options::{
    DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE, MAX_RECORD_SIZE_LIMIT, Options, parse_max_future,
};
use crate::connector::{
    Decoding, Format, OptionSpec, OptionType, Reader, Replay, SourceConfig, SourceLocation,
    StreamDecl, default_decode_threads,
};
use crate::error::{Error, Result};
use crate::timestamp::TsUnit;

/// The source formats `format` takes.
pub(super) const FORMATS: &[&str] = &["csv", "jsonl", "json", "ndjson"];

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

/// The `batch_size` option, within its bounds.
pub(super) fn batch_size(opts: &Options<'_>) -> Result<usize> {
    match opts.count("batch_size")? {
        None => Ok(DEFAULT_BATCH_SIZE),
        Some(n) if (1..=MAX_BATCH_SIZE as u64).contains(&n) => Ok(n as usize),
        Some(_) => Err(opts.bad_value("batch_size", opts.get("batch_size").unwrap_or(""))),
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

/// `append_only`, which every sink takes.
pub(super) const APPEND_ONLY: OptionSpec = OptionSpec {
    name: "append_only",
    ty: OptionType::Flag,
    default: Some("false"),
    accepted: "true, false",
    doc: "take final rows only: queries emitting updates or early results are rejected",
};

/// `limit`, as `host` and `demo` take it.
pub(super) const LIMIT: OptionSpec = OptionSpec {
    name: "limit",
    ty: OptionType::Count,
    default: None,
    accepted: "a positive integer such as 10",
    doc: "stop after this many rows",
};

/// The `limit` option: a positive count.
pub(super) fn limit(opts: &Options<'_>) -> Result<Option<u64>> {
    match opts.count("limit")? {
        Some(0) => Err(opts.bad_value("limit", opts.get("limit").unwrap_or(""))),
        n => Ok(n),
    }
}

/// The configuration of a source that makes its rows itself.
pub(super) fn live_config(
    decl: &StreamDecl<'_>,
    connector: &'static str,
    reader: Reader,
) -> SourceConfig {
    SourceConfig {
        decode_threads: default_decode_threads(),
        ..plain_config(
            decl,
            connector,
            SourceLocation::Connector(reader),
            Format::Csv,
        )
    }
}

/// The configuration of a stream fed by one of the service's push
/// protocols (`remote_write`, `otlp`, `influx`).
pub(super) fn push_config(decl: &StreamDecl<'_>, connector: &'static str) -> SourceConfig {
    plain_config(decl, connector, SourceLocation::Push, Format::Jsonl)
}

/// A source of `decl` at `location` with every setting at its default: no
/// dead letters, no pacing, one decoding thread.
fn plain_config(
    decl: &StreamDecl<'_>,
    connector: &'static str,
    location: SourceLocation,
    format: Format,
) -> SourceConfig {
    SourceConfig {
        stream: decl.stream.to_string(),
        schema: decl.schema.clone(),
        connector,
        location,
        format,
        replay: Replay::Fast,
        event_time: decl.event_time,
        batch_size: DEFAULT_BATCH_SIZE,
        dead_letter: None,
        follow: false,
        decode_threads: 1,
        decode: Decoding::default(),
    }
}
