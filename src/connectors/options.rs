//! Turning the `WITH (...)` options of `CREATE STREAM` / `CREATE SINK` into
//! source and sink configurations.
//!
//! Keys arrive lower-cased. Unknown keys, repeated keys and bad values are
//! [`Error::Plan`] errors that name the key and list what is accepted.

use std::path::{Path, PathBuf};

use datafusion::arrow::datatypes::SchemaRef;

use super::builtin::{self, match_columns};
use super::webhook::parse_duration;
use super::{
    Decoding, Format, OutputFormat, Replay, SinkConfig, SinkTarget, SourceConfig, SourceLocation,
    TsUnit,
};
use super::{demo, host};
use crate::error::{Error, Result};

/// Default number of rows per batch a source emits.
pub const DEFAULT_BATCH_SIZE: usize = 8192;

/// Largest accepted `batch_size`.
pub const MAX_BATCH_SIZE: usize = 1 << 24;

const SOURCE_KEYS: &[&str] = &[
    "connector",
    "path",
    "format",
    "replay",
    "speed",
    "batch_size",
    "dead_letter",
    "follow",
    "multiline",
    "max_record_size",
    "ts_unit",
    "max_future",
];

/// Largest accepted `max_record_size`: 1 GiB.
pub const MAX_RECORD_SIZE_LIMIT: usize = 1 << 30;

const SINK_KEYS: &[&str] = &["connector", "path", "format", "append_only"];

const HOST_KEYS: &[&str] = &["connector", "interval", "limit"];

const DEMO_KEYS: &[&str] = &["connector", "speed", "limit"];

/// Looks options up by key, rejecting unknown and repeated keys.
pub(super) struct Options<'a> {
    what: String,
    options: &'a [(String, String)],
}

impl<'a> Options<'a> {
    pub(super) fn new(
        what: String,
        options: &'a [(String, String)],
        accepted: &[&str],
    ) -> Result<Self> {
        for (i, (key, _)) in options.iter().enumerate() {
            if !accepted.contains(&key.as_str()) {
                return Err(Error::Plan(format!(
                    "{what}: unknown option '{key}' (accepted: {})",
                    accepted.join(", ")
                )));
            }
            if options[..i].iter().any(|(k, _)| k == key) {
                return Err(Error::Plan(format!(
                    "{what}: option '{key}' is given more than once"
                )));
            }
        }
        Ok(Options { what, options })
    }

    pub(super) fn get(&self, key: &str) -> Option<&'a str> {
        self.options
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn bad_value(&self, key: &str, value: &str, accepted: &str) -> Error {
        Error::Plan(format!(
            "{}: bad value '{value}' for option '{key}' (accepted: {accepted})",
            self.what
        ))
    }

    /// A `true` / `false` option (any case); absent is false.
    pub(super) fn flag(&self, key: &str) -> Result<bool> {
        match self.get(key).map(|v| (v, v.trim().to_ascii_lowercase())) {
            None => Ok(false),
            Some((_, l)) if l == "true" => Ok(true),
            Some((_, l)) if l == "false" => Ok(false),
            Some((v, _)) => Err(self.bad_value(key, v, "true, false")),
        }
    }

    /// A path option, resolved against `base_dir`; empty values are rejected.
    fn path(&self, key: &str, base_dir: &Path) -> Result<Option<PathBuf>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) if v.trim().is_empty() => Err(self.bad_value(key, v, "a file path")),
            Some(v) => Ok(Some(resolve(base_dir, v))),
        }
    }
}

/// Resolves a possibly relative path against `base_dir`.
fn resolve(base_dir: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base_dir.join(p)
    }
}

/// Parses a source format name: `csv`, or `jsonl` with aliases `json`, `ndjson`.
fn parse_source_format(s: &str) -> Option<Format> {
    match s.trim().to_ascii_lowercase().as_str() {
        "csv" => Some(Format::Csv),
        "jsonl" | "json" | "ndjson" => Some(Format::Jsonl),
        _ => None,
    }
}

/// The format implied by a path's extension, if any.
fn format_from_extension(path: &Path) -> Option<&'static str> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    match ext.as_str() {
        "csv" => Some("csv"),
        "jsonl" | "json" | "ndjson" => Some("jsonl"),
        _ => None,
    }
}

/// Parses an output format name: `table`, `csv`, or `jsonl` (aliases `json`,
/// `ndjson`), case-insensitively.
pub fn parse_output_format(s: &str) -> Result<OutputFormat> {
    match s.trim().to_ascii_lowercase().as_str() {
        "table" => Ok(OutputFormat::Table),
        "csv" => Ok(OutputFormat::Csv),
        "jsonl" | "json" | "ndjson" => Ok(OutputFormat::Jsonl),
        _ => Err(Error::Plan(format!(
            "unknown output format '{s}' (accepted: table, csv, jsonl)"
        ))),
    }
}

impl SourceConfig {
    /// Builds a source configuration from a `CREATE STREAM` statement's
    /// `WITH` options.
    ///
    /// Accepted keys: `connector` (`file` | `stdin` | `push`, default
    /// `file`), `path` (required for `file`, resolved against `base_dir`), `format` (`csv` |
    /// `jsonl` | `json` | `ndjson`; default from the path's extension, else
    /// csv), `replay` (`fast` | `realtime`), `speed` (positive number, default
    /// 1), `batch_size` (positive integer, default 8192), `dead_letter` (a
    /// path, resolved against `base_dir`), `follow` (`true` | `false`,
    /// files only), `multiline` (`true` | `false`, CSV only),
    /// `max_record_size` (bytes), `ts_unit` (`s` | `ms` | `us` | `ns`) and
    /// `max_future` (a duration, or `none`); see [`Decoding`].
    ///
    /// Connectors `host` and `demo` read no file and take keys of their own,
    /// see [`live_source`].
    pub fn from_options(
        stream: &str,
        schema: SchemaRef,
        event_time: Option<usize>,
        options: &[(String, String)],
        base_dir: &Path,
    ) -> Result<SourceConfig> {
        if let Some((_, connector)) = options.iter().find(|(k, _)| k == "connector") {
            let connector = connector.trim().to_ascii_lowercase();
            if builtin::CONNECTORS.contains(&connector.as_str()) {
                return live_source(stream, schema, event_time, options, &connector);
            }
        }
        let opts = Options::new(format!("stream {stream}"), options, SOURCE_KEYS)?;

        let connector = opts.get("connector").unwrap_or("file");
        let path = opts.path("path", base_dir)?;
        let location = match connector.trim().to_ascii_lowercase().as_str() {
            "file" => match &path {
                Some(p) => SourceLocation::File(p.clone()),
                None => {
                    return Err(Error::Plan(format!(
                        "stream {stream}: connector 'file' needs a 'path' option"
                    )));
                }
            },
            "stdin" => {
                if path.is_some() {
                    return Err(Error::Plan(format!(
                        "stream {stream}: option 'path' cannot be used with connector 'stdin'"
                    )));
                }
                SourceLocation::Stdin
            }
            "push" => {
                if path.is_some() {
                    return Err(Error::Plan(format!(
                        "stream {stream}: option 'path' cannot be used with connector 'push'"
                    )));
                }
                SourceLocation::Push
            }
            _ => {
                return Err(opts.bad_value(
                    "connector",
                    connector,
                    "file, stdin, push, host, demo",
                ));
            }
        };

        let format = match opts.get("format") {
            Some(v) => parse_source_format(v)
                .ok_or_else(|| opts.bad_value("format", v, "csv, jsonl, json, ndjson"))?,
            None => path
                .as_deref()
                .and_then(format_from_extension)
                .and_then(parse_source_format)
                .unwrap_or(Format::Csv),
        };

        let speed = match opts.get("speed") {
            None => 1.0,
            Some(v) => match v.trim().parse::<f64>() {
                Ok(x) if x.is_finite() && x > 0.0 => x,
                _ => return Err(opts.bad_value("speed", v, "a positive number such as 1 or 10")),
            },
        };
        let replay = match opts
            .get("replay")
            .map(|v| (v, v.trim().to_ascii_lowercase()))
        {
            None => Replay::Fast,
            Some((_, ref l)) if l == "fast" => Replay::Fast,
            Some((_, ref l)) if l == "realtime" => Replay::Realtime { speed },
            Some((v, _)) => return Err(opts.bad_value("replay", v, "fast, realtime")),
        };

        let batch_size = match opts.get("batch_size") {
            None => DEFAULT_BATCH_SIZE,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_BATCH_SIZE).contains(&n) => n,
                _ => {
                    return Err(opts.bad_value(
                        "batch_size",
                        v,
                        &format!("an integer from 1 to {MAX_BATCH_SIZE}"),
                    ));
                }
            },
        };

        let dead_letter = opts.path("dead_letter", base_dir)?;

        let follow = opts.flag("follow")?;
        if follow && location == SourceLocation::Stdin {
            return Err(Error::Plan(format!(
                "stream {stream}: option 'follow' is for files (stdin is always read as it comes)"
            )));
        }

        let decode = decoding(&opts, format)?;

        if let Some(i) = event_time
            && i >= schema.fields().len()
        {
            return Err(Error::Plan(format!(
                "stream {stream}: event-time column index {i} is out of range"
            )));
        }

        Ok(SourceConfig {
            stream: stream.to_string(),
            schema,
            location,
            format,
            replay,
            event_time,
            batch_size,
            dead_letter,
            follow,
            decode_threads: super::default_decode_threads(),
            decode,
        })
    }
}

/// The decoding options of a file, stdin or push stream.
fn decoding(opts: &Options<'_>, format: Format) -> Result<Decoding> {
    let defaults = Decoding::default();
    let multiline = opts.flag("multiline")?;
    if multiline && format != Format::Csv {
        return Err(Error::Plan(format!(
            "{}: option 'multiline' is for CSV (a JSON Lines row is always one line)",
            opts.what
        )));
    }
    let max_record_size = match opts.get("max_record_size") {
        None => defaults.max_record_size,
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_RECORD_SIZE_LIMIT).contains(&n) => n,
            _ => {
                return Err(opts.bad_value(
                    "max_record_size",
                    v,
                    &format!("a number of bytes from 1 to {MAX_RECORD_SIZE_LIMIT}"),
                ));
            }
        },
    };
    let ts_unit = match opts.get("ts_unit") {
        None => defaults.ts_unit,
        Some(v) => TsUnit::parse(v).ok_or_else(|| opts.bad_value("ts_unit", v, "s, ms, us, ns"))?,
    };
    let max_future_ms = match opts.get("max_future") {
        None => defaults.max_future_ms,
        Some(v) => parse_max_future(v).ok_or_else(|| {
            opts.bad_value(
                "max_future",
                v,
                "a duration such as '1 hour', '30 minutes', '2 days', or 'none'",
            )
        })?,
    };
    Ok(Decoding {
        multiline,
        max_record_size,
        ts_unit,
        max_future_ms,
    })
}

/// Parses a size: a whole number of bytes, or one with a unit: `KiB`,
/// `MiB`, `GiB` (powers of 1024; also `k`, `m`, `g`), `KB`, `MB`, `GB`
/// (powers of 1000), any case, a space allowed before the unit (`16MiB`,
/// `512 KiB`, `1048576`).
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(factor)
}

/// Parses a `max_future` value: `none` (or `off`) disables the guard,
/// else a positive duration: a number and a unit from milliseconds to
/// weeks (`'1 hour'`, `'90 s'`, `'2 days'`).
fn parse_max_future(text: &str) -> Option<Option<i64>> {
    let text = text.trim().to_ascii_lowercase();
    if text == "none" || text == "off" {
        return Some(None);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let unit_ms = match unit.trim() {
        "ms" | "millisecond" | "milliseconds" => 1.0,
        "s" | "sec" | "secs" | "second" | "seconds" => 1e3,
        "min" | "mins" | "minute" | "minutes" => 6e4,
        "h" | "hour" | "hours" => 3.6e6,
        "d" | "day" | "days" => 8.64e7,
        "w" | "week" | "weeks" => 6.048e8,
        _ => return None,
    };
    let ms = (value * unit_ms).round();
    // About 300 years at most keeps event-time arithmetic far from overflow.
    (ms.is_finite() && (1.0..=1e13).contains(&ms)).then_some(Some(ms as i64))
}

/// The configuration of a stream with connector `host` or `demo`: its
/// declared columns must come from the connector's catalogue (see
/// [`builtin`]).
///
/// `host` takes `interval` (a duration of at least 100 ms, default 1 second)
/// and `limit`; `demo` takes `speed` (rows per second, a positive number,
/// default 1000) and `limit`. `limit` is a positive integer: the source stops
/// after that many rows.
fn live_source(
    stream: &str,
    schema: SchemaRef,
    event_time: Option<usize>,
    options: &[(String, String)],
    connector: &str,
) -> Result<SourceConfig> {
    let keys = if connector == "host" {
        HOST_KEYS
    } else {
        DEMO_KEYS
    };
    let opts = Options::new(format!("stream {stream}"), options, keys)?;
    let catalogue = builtin::catalogue(connector).unwrap_or_default();
    match_columns(stream, connector, &schema, catalogue)?;

    let limit = match opts.get("limit") {
        None => None,
        Some(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Some(n),
            _ => return Err(opts.bad_value("limit", v, "a positive integer such as 10")),
        },
    };
    let location = if connector == "host" {
        let interval = match opts.get("interval") {
            None => host::DEFAULT_INTERVAL,
            Some(v) => match parse_duration(v) {
                Some(d) if d >= host::MIN_INTERVAL => d,
                _ => {
                    return Err(opts.bad_value(
                        "interval",
                        v,
                        "a duration of at least 100 milliseconds, e.g. '1 second', '500 ms'",
                    ));
                }
            },
        };
        SourceLocation::Host { interval, limit }
    } else {
        let speed = match opts.get("speed") {
            None => demo::DEFAULT_SPEED,
            Some(v) => match v.trim().parse::<f64>() {
                Ok(x) if x.is_finite() && x > 0.0 => x,
                _ => {
                    return Err(opts.bad_value(
                        "speed",
                        v,
                        "a positive number of rows per second such as 1000",
                    ));
                }
            },
        };
        SourceLocation::Demo { speed, limit }
    };

    Ok(SourceConfig {
        stream: stream.to_string(),
        schema,
        location,
        format: Format::Csv,
        replay: Replay::Fast,
        event_time,
        batch_size: DEFAULT_BATCH_SIZE,
        dead_letter: None,
        follow: false,
        decode_threads: super::default_decode_threads(),
        decode: Decoding::default(),
    })
}

impl SinkConfig {
    /// Builds a sink configuration from a `CREATE SINK` statement's `WITH`
    /// options.
    ///
    /// Accepted keys: `connector` (`file` | `stdout` | `webhook`, default
    /// `file`), `path` (required for `file`, resolved against `base_dir`),
    /// `format` (`csv` | `jsonl` | `table`, aliases `json`, `ndjson`; default
    /// from the path's extension, else csv) and `append_only` (`true` |
    /// `false`). A `webhook` sink has keys of its own, see
    /// [`webhook`](super::webhook).
    pub fn from_options(
        name: &str,
        options: &[(String, String)],
        base_dir: &Path,
    ) -> Result<SinkConfig> {
        let connector = options.iter().find(|(k, _)| k == "connector");
        if connector.is_some_and(|(_, v)| v.trim().eq_ignore_ascii_case("webhook")) {
            return super::webhook::sink_config(name, options);
        }
        let opts = Options::new(format!("sink {name}"), options, SINK_KEYS)?;

        let connector = opts.get("connector").unwrap_or("file");
        let path = opts.path("path", base_dir)?;
        let target = match connector.trim().to_ascii_lowercase().as_str() {
            "file" => match &path {
                Some(p) => SinkTarget::File(p.clone()),
                None => {
                    return Err(Error::Plan(format!(
                        "sink {name}: connector 'file' needs a 'path' option"
                    )));
                }
            },
            "stdout" => {
                if path.is_some() {
                    return Err(Error::Plan(format!(
                        "sink {name}: option 'path' cannot be used with connector 'stdout'"
                    )));
                }
                SinkTarget::Stdout
            }
            _ => return Err(opts.bad_value("connector", connector, "file, stdout, webhook")),
        };

        let format = match opts.get("format") {
            Some(v) => parse_output_format(v)
                .map_err(|_| opts.bad_value("format", v, "csv, jsonl, table"))?,
            None => match path.as_deref().and_then(format_from_extension) {
                Some("jsonl") => OutputFormat::Jsonl,
                _ => OutputFormat::Csv,
            },
        };

        let append_only = opts.flag("append_only")?;
        Ok(SinkConfig {
            name: name.to_string(),
            target,
            format,
            append_only,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
            Field::new("cpu", DataType::Float64, true),
        ]))
    }

    fn opts(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn source(kv: &[(&str, &str)]) -> Result<SourceConfig> {
        SourceConfig::from_options("m", schema(), Some(0), &opts(kv), Path::new("/base"))
    }

    fn err(r: Result<impl std::fmt::Debug>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn source_defaults() {
        let c = source(&[("path", "data/m.csv")]).unwrap();
        assert_eq!(c.stream, "m");
        assert_eq!(
            c.location,
            SourceLocation::File(PathBuf::from("/base/data/m.csv"))
        );
        assert_eq!(c.format, Format::Csv);
        assert_eq!(c.replay, Replay::Fast);
        assert_eq!(c.batch_size, DEFAULT_BATCH_SIZE);
        assert_eq!(c.dead_letter, None);
        assert_eq!(c.event_time, Some(0));
        assert!(!c.follow);
    }

    #[test]
    fn source_follow() {
        assert!(
            source(&[("path", "m.csv"), ("follow", "TRUE")])
                .unwrap()
                .follow
        );
        assert!(
            !source(&[("path", "m.csv"), ("follow", "false")])
                .unwrap()
                .follow
        );
        let e = err(source(&[("path", "m.csv"), ("follow", "yes")]));
        assert!(e.contains("'follow'") && e.contains("true, false"), "{e}");
        let e = err(source(&[("connector", "stdin"), ("follow", "true")]));
        assert!(e.contains("'follow' is for files"), "{e}");
        assert!(
            !source(&[("connector", "stdin"), ("follow", "false")])
                .unwrap()
                .follow
        );
    }

    #[test]
    fn source_all_options() {
        let c = source(&[
            ("connector", "file"),
            ("path", "/abs/m.txt"),
            ("format", "NDJSON"),
            ("replay", "realtime"),
            ("speed", "10"),
            ("batch_size", "100"),
            ("dead_letter", "bad.txt"),
        ])
        .unwrap();
        assert_eq!(
            c.location,
            SourceLocation::File(PathBuf::from("/abs/m.txt"))
        );
        assert_eq!(c.format, Format::Jsonl);
        assert_eq!(c.replay, Replay::Realtime { speed: 10.0 });
        assert_eq!(c.batch_size, 100);
        assert_eq!(c.dead_letter, Some(PathBuf::from("/base/bad.txt")));
    }

    #[test]
    fn source_format_from_extension() {
        for (p, f) in [
            ("a.jsonl", Format::Jsonl),
            ("a.JSON", Format::Jsonl),
            ("a.ndjson", Format::Jsonl),
            ("a.csv", Format::Csv),
            ("a.log", Format::Csv),
            ("a", Format::Csv),
        ] {
            assert_eq!(source(&[("path", p)]).unwrap().format, f, "{p}");
        }
        assert_eq!(
            source(&[("path", "a.jsonl"), ("format", "csv")])
                .unwrap()
                .format,
            Format::Csv
        );
    }

    #[test]
    fn source_stdin() {
        let c = source(&[("connector", "stdin"), ("format", "json")]).unwrap();
        assert_eq!(c.location, SourceLocation::Stdin);
        assert_eq!(c.format, Format::Jsonl);
        let c = source(&[("connector", "stdin")]).unwrap();
        assert_eq!(c.format, Format::Csv);
        assert!(err(source(&[("connector", "stdin"), ("path", "x.csv")])).contains("'path'"));
    }

    #[test]
    fn source_errors_name_key_and_accepted_values() {
        let e = err(source(&[("path", "a.csv"), ("colour", "red")]));
        assert!(e.contains("'colour'") && e.contains("batch_size"), "{e}");
        let e = err(source(&[("path", "a.csv"), ("format", "xml")]));
        assert!(e.contains("'format'") && e.contains("csv, jsonl"), "{e}");
        let e = err(source(&[("connector", "kafka"), ("path", "a.csv")]));
        assert!(
            e.contains("'connector'") && e.contains("file, stdin, push, host, demo"),
            "{e}"
        );
        let e = err(source(&[("path", "a.csv"), ("replay", "slow")]));
        assert!(
            e.contains("'replay'") && e.contains("fast, realtime"),
            "{e}"
        );
        for bad in ["0", "-1", "abc", "inf", "NaN"] {
            let e = err(source(&[("path", "a.csv"), ("speed", bad)]));
            assert!(e.contains("'speed'"), "{e}");
        }
        for bad in ["0", "-5", "1.5", "x", "99999999999"] {
            let e = err(source(&[("path", "a.csv"), ("batch_size", bad)]));
            assert!(e.contains("'batch_size'"), "{e}");
        }
        let e = err(source(&[]));
        assert!(e.contains("'path'"), "{e}");
        let e = err(source(&[("path", "")]));
        assert!(e.contains("'path'"), "{e}");
        let e = err(source(&[("path", "a.csv"), ("path", "b.csv")]));
        assert!(e.contains("more than once"), "{e}");
        assert!(matches!(source(&[]), Err(Error::Plan(_))));
    }

    #[test]
    fn decoding_options() {
        let c = source(&[("path", "a.csv")]).unwrap();
        assert_eq!(c.decode, Decoding::default());
        assert_eq!(c.decode.max_future_ms, Some(86_400_000));
        let c = source(&[
            ("path", "a.csv"),
            ("multiline", "TRUE"),
            ("max_record_size", "4096"),
            ("ts_unit", "us"),
            ("max_future", "1 hour"),
        ])
        .unwrap();
        assert_eq!(
            c.decode,
            Decoding {
                multiline: true,
                max_record_size: 4096,
                ts_unit: TsUnit::Micros,
                max_future_ms: Some(3_600_000),
            }
        );
        for (text, ms) in [
            ("2 days", Some(172_800_000)),
            ("90 s", Some(90_000)),
            ("none", None),
            ("OFF", None),
        ] {
            let c = source(&[("path", "a.csv"), ("max_future", text)]).unwrap();
            assert_eq!(c.decode.max_future_ms, ms, "{text}");
        }
        for bad in ["0 s", "soon", "1", "-1 hour", ""] {
            let e = err(source(&[("path", "a.csv"), ("max_future", bad)]));
            assert!(
                e.contains("'max_future'") && e.contains("'none'"),
                "{bad}: {e}"
            );
        }
        let e = err(source(&[("path", "a.csv"), ("ts_unit", "sec")]));
        assert!(
            e.contains("'ts_unit'") && e.contains("s, ms, us, ns"),
            "{e}"
        );
        for bad in ["0", "x", "2000000000"] {
            let e = err(source(&[("path", "a.csv"), ("max_record_size", bad)]));
            assert!(e.contains("'max_record_size'"), "{e}");
        }
        let e = err(source(&[("path", "a.jsonl"), ("multiline", "true")]));
        assert!(e.contains("'multiline' is for CSV"), "{e}");
    }

    fn live(
        connector: &str,
        columns: &[(&str, DataType)],
        kv: &[(&str, &str)],
    ) -> Result<SourceConfig> {
        let schema = Arc::new(Schema::new(
            columns
                .iter()
                .map(|(n, t)| Field::new(*n, t.clone(), true))
                .collect::<Vec<_>>(),
        ));
        let mut options = opts(kv);
        options.insert(0, ("connector".into(), connector.into()));
        SourceConfig::from_options("h", schema, Some(0), &options, Path::new("/base"))
    }

    const TS: DataType = DataType::Timestamp(TimeUnit::Millisecond, None);

    #[test]
    fn host_options() {
        let cols = [
            ("ts", TS),
            ("host", DataType::Utf8),
            ("cpu", DataType::Float64),
        ];
        let c = live("host", &cols, &[]).unwrap();
        assert_eq!(
            c.location,
            SourceLocation::Host {
                interval: Duration::from_secs(1),
                limit: None
            }
        );
        assert_eq!(c.event_time, Some(0));
        let c = live(
            "HOST",
            &cols,
            &[("interval", "100 milliseconds"), ("limit", "3")],
        )
        .unwrap();
        assert_eq!(
            c.location,
            SourceLocation::Host {
                interval: Duration::from_millis(100),
                limit: Some(3)
            }
        );
        for (text, ms) in [("2 minutes", 120_000), ("1.5s", 1500), ("250 ms", 250)] {
            let c = live("host", &cols, &[("interval", text)]).unwrap();
            let SourceLocation::Host { interval, .. } = c.location else {
                panic!("{text}")
            };
            assert_eq!(interval, Duration::from_millis(ms), "{text}");
        }
        for bad in ["99 ms", "0 seconds", "1", "soon", "", "-1 second"] {
            let e = err(live("host", &cols, &[("interval", bad)]));
            assert!(
                e.contains("stream h")
                    && e.contains("'interval'")
                    && e.contains("100 milliseconds"),
                "{bad}: {e}"
            );
        }
        for bad in ["0", "-1", "1.5", "many", ""] {
            let e = err(live("host", &cols, &[("limit", bad)]));
            assert!(
                e.contains("'limit'") && e.contains("positive integer"),
                "{bad}: {e}"
            );
        }
        let e = err(live("host", &cols, &[("path", "m.csv")]));
        assert!(
            e.contains("'path'") && e.contains("connector, interval, limit"),
            "{e}"
        );
        let e = err(live("host", &cols, &[("speed", "2")]));
        assert!(e.contains("unknown option 'speed'"), "{e}");
    }

    #[test]
    fn host_columns_come_from_the_catalogue() {
        let e = err(live("host", &[("ts", TS), ("gpu", DataType::Float64)], &[]));
        assert!(
            e.contains("no column 'gpu'")
                && e.contains("load_1 DOUBLE")
                && e.contains("net_rx_bytes BIGINT"),
            "{e}"
        );
        let e = err(live("host", &[("ts", TS), ("mem", DataType::Utf8)], &[]));
        assert!(
            e.contains("'mem'") && e.contains("is DOUBLE, not TEXT"),
            "{e}"
        );
        assert!(matches!(
            live("host", &[("cpu", DataType::Int64)], &[]),
            Err(Error::Plan(_))
        ));
    }

    #[test]
    fn demo_options() {
        let cols = [("ts", TS), ("value", DataType::Float64)];
        let c = live("demo", &cols, &[]).unwrap();
        assert_eq!(
            c.location,
            SourceLocation::Demo {
                speed: 1000.0,
                limit: None
            }
        );
        let c = live("demo", &cols, &[("speed", "20"), ("limit", "5")]).unwrap();
        assert_eq!(
            c.location,
            SourceLocation::Demo {
                speed: 20.0,
                limit: Some(5)
            }
        );
        for bad in ["0", "-3", "fast", "inf"] {
            let e = err(live("demo", &cols, &[("speed", bad)]));
            assert!(
                e.contains("'speed'") && e.contains("rows per second"),
                "{bad}: {e}"
            );
        }
        let e = err(live("demo", &cols, &[("interval", "1 second")]));
        assert!(
            e.contains("'interval'") && e.contains("connector, speed, limit"),
            "{e}"
        );
        let e = err(live(
            "demo",
            &[("ts", TS), ("temp", DataType::Float64)],
            &[],
        ));
        assert!(
            e.contains("no column 'temp'")
                && e.contains("ts TIMESTAMP, host TEXT, metric TEXT, value DOUBLE"),
            "{e}"
        );
    }

    #[test]
    fn sink_options() {
        let base = Path::new("/base");
        let c = SinkConfig::from_options("out", &opts(&[("path", "o.csv")]), base).unwrap();
        assert_eq!(c.name, "out");
        assert_eq!(c.target, SinkTarget::File(PathBuf::from("/base/o.csv")));
        assert_eq!(c.format, OutputFormat::Csv);
        let c = SinkConfig::from_options("out", &opts(&[("path", "o.jsonl")]), base).unwrap();
        assert_eq!(c.format, OutputFormat::Jsonl);
        let c = SinkConfig::from_options(
            "out",
            &opts(&[("connector", "stdout"), ("format", "table")]),
            base,
        )
        .unwrap();
        assert_eq!(c.target, SinkTarget::Stdout);
        assert_eq!(c.format, OutputFormat::Table);

        let e = err(SinkConfig::from_options("out", &opts(&[]), base));
        assert!(e.contains("'path'"), "{e}");
        let e = err(SinkConfig::from_options(
            "out",
            &opts(&[("path", "o"), ("format", "xml")]),
            base,
        ));
        assert!(e.contains("'format'") && e.contains("table"), "{e}");
        let e = err(SinkConfig::from_options(
            "out",
            &opts(&[("path", "o"), ("speed", "1")]),
            base,
        ));
        assert!(
            e.contains("'speed'") && e.contains("connector, path, format"),
            "{e}"
        );
    }

    #[test]
    fn output_formats() {
        assert_eq!(parse_output_format("table").unwrap(), OutputFormat::Table);
        assert_eq!(parse_output_format("CSV").unwrap(), OutputFormat::Csv);
        assert_eq!(parse_output_format("jsonl").unwrap(), OutputFormat::Jsonl);
        assert_eq!(parse_output_format("json").unwrap(), OutputFormat::Jsonl);
        assert_eq!(parse_output_format("ndjson").unwrap(), OutputFormat::Jsonl);
        let e = err(parse_output_format("yaml"));
        assert!(e.contains("yaml") && e.contains("table, csv, jsonl"), "{e}");
    }
}
