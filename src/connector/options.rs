//! The `WITH (...)` options of `CREATE STREAM` / `CREATE SINK`: checked
//! against the options a connector declares (see
//! [`SourceConnector::options`](super::SourceConnector::options)), and the value parsers every connector
//! shares (durations, sizes, URLs, formats).
//!
//! Keys arrive lower-cased. Unknown keys, repeated keys and bad values are
//! [`Error::Plan`] errors that name the key and list what is accepted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Format, OutputFormat};
use super::{OptionSpec, OptionType};
use crate::error::{Error, Result};

/// Default number of rows per batch a source emits.
pub const DEFAULT_BATCH_SIZE: usize = 8192;

/// Largest accepted `batch_size`.
pub const MAX_BATCH_SIZE: usize = 1 << 24;

/// Largest accepted `max_record_size`: 1 GiB.
pub const MAX_RECORD_SIZE_LIMIT: usize = 1 << 30;

/// The options of one statement, checked against what its connector
/// declares: every key is one of its options (or starts with one of its
/// prefixes), none is repeated, and every value is of its option's type.
pub struct Options<'a> {
    what: String,
    options: &'a [(String, String)],
    specs: &'static [OptionSpec],
}

impl<'a> Options<'a> {
    /// Checks `options` (the `connector` key included, if given) against
    /// `specs`; `what` names the statement in errors (`stream m`).
    pub fn new(
        what: String,
        options: &'a [(String, String)],
        specs: &'static [OptionSpec],
    ) -> Result<Self> {
        let opts = Options {
            what,
            options,
            specs,
        };
        for (i, (key, value)) in options.iter().enumerate() {
            if key == "connector" {
                continue;
            }
            let Some(spec) = opts.spec(key) else {
                return Err(Error::Plan(format!(
                    "{}: unknown option '{key}' (accepted: {})",
                    opts.what,
                    accepted_keys(specs)
                )));
            };
            if options[..i].iter().any(|(k, _)| k == key) {
                return Err(Error::Plan(format!(
                    "{}: option '{key}' is given more than once",
                    opts.what
                )));
            }
            opts.check_type(key, value, spec)?;
        }
        Ok(opts)
    }

    /// The statement these options belong to, as errors name it.
    pub fn what(&self) -> &str {
        &self.what
    }

    fn spec(&self, key: &str) -> Option<&'static OptionSpec> {
        self.specs.iter().find(|s| match s.ty {
            OptionType::Prefix => key.starts_with(s.name),
            _ => s.name == key,
        })
    }

    fn check_type(&self, key: &str, value: &str, spec: &OptionSpec) -> Result<()> {
        let v = value.trim();
        let ok = match spec.ty {
            OptionType::Text | OptionType::Prefix => true,
            OptionType::Path => !v.is_empty(),
            OptionType::Flag => parse_flag(v).is_some(),
            OptionType::Count => v.parse::<u64>().is_ok(),
            OptionType::Number => parse_positive(v).is_some(),
            OptionType::Duration => parse_duration(v).is_some(),
            OptionType::Size => parse_size(v).is_some(),
            OptionType::Choice(words) => words.iter().any(|w| w.eq_ignore_ascii_case(v)),
            OptionType::Url => {
                return parse_url(v).map(|_| ()).map_err(|why| {
                    Error::Plan(format!(
                        "{}: bad value '{value}' for option '{key}' ({why}; accepted: {})",
                        self.what, spec.accepted
                    ))
                });
            }
        };
        if ok {
            Ok(())
        } else {
            Err(self.bad_value(key, value))
        }
    }

    /// The raw value of `key`, if given.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.options
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The error for `value` of `key`: it names the statement, the key and
    /// what its spec accepts.
    pub fn bad_value(&self, key: &str, value: &str) -> Error {
        let accepted = self.spec(key).map_or("", |s| s.accepted);
        Error::Plan(format!(
            "{}: bad value '{value}' for option '{key}' (accepted: {accepted})",
            self.what
        ))
    }

    /// A text option, trimmed.
    pub fn text(&self, key: &str) -> Option<&'a str> {
        self.get(key).map(str::trim)
    }

    /// A [`OptionType::Flag`]; absent is false.
    pub fn flag(&self, key: &str) -> Result<bool> {
        self.typed(key, parse_flag).map(|f| f.unwrap_or(false))
    }

    /// A [`OptionType::Count`].
    pub fn count(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, |v| v.parse::<u64>().ok())
    }

    /// A [`OptionType::Number`].
    pub fn number(&self, key: &str) -> Result<Option<f64>> {
        self.typed(key, parse_positive)
    }

    /// A [`OptionType::Duration`].
    pub fn duration(&self, key: &str) -> Result<Option<Duration>> {
        self.typed(key, parse_duration)
    }

    /// A [`OptionType::Size`], in bytes.
    pub fn size(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, parse_size)
    }

    /// A [`OptionType::Url`], normalised.
    pub fn url(&self, key: &str) -> Result<Option<String>> {
        self.typed(key, |v| parse_url(v).ok())
    }

    /// A [`OptionType::Choice`], as the spec spells it.
    pub fn choice(&self, key: &str) -> Result<Option<&'static str>> {
        let words = match self.spec(key).map(|s| s.ty) {
            Some(OptionType::Choice(words)) => words,
            _ => &[],
        };
        self.typed(key, |v| {
            words.iter().copied().find(|w| w.eq_ignore_ascii_case(v))
        })
    }

    /// A [`OptionType::Path`], resolved against `base_dir`.
    pub fn path(&self, key: &str, base_dir: &Path) -> Result<Option<PathBuf>> {
        self.typed(key, |v| (!v.is_empty()).then(|| resolve(base_dir, v)))
    }

    /// The options whose keys start with `prefix`, as (rest of the key,
    /// value), in the order given.
    pub fn prefixed(&self, prefix: &str) -> Vec<(&'a str, &'a str)> {
        self.options
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(prefix)?, v.as_str())))
            .collect()
    }

    fn typed<T>(&self, key: &str, parse: impl FnOnce(&str) -> Option<T>) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => parse(v.trim())
                .map(Some)
                .ok_or_else(|| self.bad_value(key, v)),
        }
    }
}

/// `connector, path, format, ...`: the keys `specs` accept, as errors
/// list them.
pub fn accepted_keys(specs: &[OptionSpec]) -> String {
    std::iter::once("connector".to_string())
        .chain(specs.iter().map(|s| match s.ty {
            OptionType::Prefix => format!("{}<name>", s.name),
            _ => s.name.to_string(),
        }))
        .collect::<Vec<_>>()
        .join(", ")
}

fn parse_flag(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

fn parse_positive(v: &str) -> Option<f64> {
    v.parse::<f64>().ok().filter(|x| x.is_finite() && *x > 0.0)
}

/// Resolves a possibly relative path against `base_dir`.
pub fn resolve(base_dir: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base_dir.join(p)
    }
}

/// Parses a source format name: `csv`, or `jsonl` with aliases `json`, `ndjson`.
pub fn parse_source_format(s: &str) -> Option<Format> {
    match s.trim().to_ascii_lowercase().as_str() {
        "csv" => Some(Format::Csv),
        "jsonl" | "json" | "ndjson" => Some(Format::Jsonl),
        _ => None,
    }
}

/// The format implied by a path's extension, if any.
pub fn format_from_extension(path: &Path) -> Option<&'static str> {
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

/// Parses a duration written as a number and a unit from milliseconds to
/// weeks: `ms`, `millisecond(s)`, `s`, `sec(s)`, `second(s)`, `m`,
/// `min(s)`, `minute(s)`, `h`, `hour(s)`, `d`, `day(s)`, `w`, `week(s)`,
/// any case, with or without a space (`'200 milliseconds'`, `'1.5s'`,
/// `'2m'`, `'2 days'`). The one grammar for durations: `WITH` options,
/// `SET`, and the command line's `--checkpoint-interval` and the like; `m`
/// is minutes, as in Prometheus.
/// Rounded to whole milliseconds; `None` unless from one millisecond to
/// about 300 years (which keeps event-time arithmetic far from overflow).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let unit_ms = match unit.trim().to_ascii_lowercase().as_str() {
        "ms" | "millisecond" | "milliseconds" => 1.0,
        "s" | "sec" | "secs" | "second" | "seconds" => 1e3,
        "m" | "min" | "mins" | "minute" | "minutes" => 6e4,
        "h" | "hour" | "hours" => 3.6e6,
        "d" | "day" | "days" => 8.64e7,
        "w" | "week" | "weeks" => 6.048e8,
        _ => return None,
    };
    let ms = (value * unit_ms).round();
    (ms.is_finite() && (1.0..=1e13).contains(&ms)).then(|| Duration::from_millis(ms as u64))
}

/// Parses a `max_future` value: `none` (or `off`) disables the guard,
/// else a duration as [`parse_duration`] reads it, in milliseconds.
pub fn parse_max_future(text: &str) -> Option<Option<i64>> {
    let text = text.trim().to_ascii_lowercase();
    if text == "none" || text == "off" {
        return Some(None);
    }
    parse_duration(&text).map(|d| Some(d.as_millis() as i64))
}

/// Checks that `text` is an absolute http(s) URL with a host; returns it
/// normalised, or why not.
pub fn parse_url(text: &str) -> std::result::Result<String, String> {
    let url = url::Url::parse(text.trim()).map_err(|e| e.to_string())?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("scheme '{}' is not http or https", url.scheme()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("it has no host".to_string());
    }
    Ok(url.to_string())
}
