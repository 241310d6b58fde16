//! Parsing and printing of event timestamps (UTC, millisecond precision).
//!
//! Accepted input forms:
//! - ISO-8601 / RFC 3339: `2014-02-14T14:30:00Z`, `2014-02-14T14:30:00.250+01:00`,
//!   `2014-02-14T14:30:00-0500`, `2014-02-14T14:30:00+05`;
//! - naive date-times, taken as UTC: `2014-02-14 14:30:00`, `2014-02-14T14:30:00.5`;
//! - an integer: milliseconds since the Unix epoch (`1392388200000`, `-1000`),
//!   or in another unit when the stream declares one ([`TsUnit`]); in
//!   seconds a decimal fraction is accepted too (`1392388200.25`).
//!
//! Fractions may have 1 to 9 digits; anything below a millisecond is truncated.
//! Output is always `YYYY-MM-DDTHH:MM:SS` with a `.mmm` suffix only when the
//! milliseconds are non-zero.

use chrono::{DateTime, Datelike, NaiveDate, Timelike};

/// The unit of a numeric timestamp (`ts_unit` in `WITH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TsUnit {
    /// Epoch seconds (`'s'`).
    Seconds,
    /// Epoch milliseconds (`'ms'`, the default).
    Millis,
    /// Epoch microseconds (`'us'`).
    Micros,
    /// Epoch nanoseconds (`'ns'`).
    Nanos,
}

impl TsUnit {
    /// Every unit, in the order suggestions are tried.
    pub const ALL: [TsUnit; 4] = [
        TsUnit::Seconds,
        TsUnit::Millis,
        TsUnit::Micros,
        TsUnit::Nanos,
    ];

    /// Parses `s`, `ms`, `us` or `ns` (any case).
    pub fn parse(text: &str) -> Option<TsUnit> {
        match text.trim().to_ascii_lowercase().as_str() {
            "s" => Some(TsUnit::Seconds),
            "ms" => Some(TsUnit::Millis),
            "us" => Some(TsUnit::Micros),
            "ns" => Some(TsUnit::Nanos),
            _ => None,
        }
    }

    /// The option value naming this unit.
    pub fn name(self) -> &'static str {
        match self {
            TsUnit::Seconds => "s",
            TsUnit::Millis => "ms",
            TsUnit::Micros => "us",
            TsUnit::Nanos => "ns",
        }
    }

    /// The unit spelled out, for messages.
    pub fn long_name(self) -> &'static str {
        match self {
            TsUnit::Seconds => "epoch seconds",
            TsUnit::Millis => "epoch milliseconds",
            TsUnit::Micros => "epoch microseconds",
            TsUnit::Nanos => "epoch nanoseconds",
        }
    }

    /// Milliseconds per unit, as a float (for plausibility checks only).
    fn ms_per_unit(self) -> f64 {
        match self {
            TsUnit::Seconds => 1000.0,
            TsUnit::Millis => 1.0,
            TsUnit::Micros => 1e-3,
            TsUnit::Nanos => 1e-6,
        }
    }

    /// `count` units since the epoch in milliseconds (rounded down);
    /// `None` on overflow or outside the calendar.
    pub fn to_ms(self, count: i64) -> Option<i64> {
        let ms = match self {
            TsUnit::Seconds => count.checked_mul(1000)?,
            TsUnit::Millis => count,
            TsUnit::Micros => count.div_euclid(1000),
            TsUnit::Nanos => count.div_euclid(1_000_000),
        };
        in_range(ms).then_some(ms)
    }

    /// What epoch milliseconds `ms`, decoded in this unit, would be in
    /// `other` instead (approximate).
    pub fn reinterpret(self, ms: i64, other: TsUnit) -> f64 {
        ms as f64 / self.ms_per_unit() * other.ms_per_unit()
    }
}

/// Parses a timestamp in one of the accepted forms into epoch milliseconds,
/// numbers taken as epoch milliseconds.
///
/// Leading and trailing whitespace is ignored. Returns `None` for anything
/// else (including out-of-range dates such as `2014-02-30`).
pub fn parse_timestamp_ms(s: &str) -> Option<i64> {
    parse_timestamp(s, TsUnit::Millis)
}

/// Parses a timestamp like [`parse_timestamp_ms`], numbers taken in `unit`.
pub fn parse_timestamp(s: &str, unit: TsUnit) -> Option<i64> {
    let s = s.trim();
    let b = s.as_bytes();
    if b.is_empty() {
        return None;
    }
    // The common case, an epoch number of plain digits, without the
    // general checks below (they give the same result for it).
    if b.len() <= 18 && b.iter().all(u8::is_ascii_digit) {
        let whole = b.iter().fold(0i64, |n, &d| n * 10 + i64::from(d - b'0'));
        return unit.to_ms(whole);
    }
    if is_epoch_number(s) {
        return parse_epoch(s, unit);
    }
    parse_iso(b)
}

/// Whether `s` (trimmed) is a number an epoch timestamp could be written
/// as: an optional sign, digits, and an optional fraction.
pub fn is_epoch_number(s: &str) -> bool {
    let b = s.trim().as_bytes();
    let b = match b.first() {
        Some(b'-' | b'+') => &b[1..],
        _ => b,
    };
    let (int, frac) = match b.iter().position(|&c| c == b'.') {
        Some(dot) => (&b[..dot], Some(&b[dot + 1..])),
        None => (b, None),
    };
    !int.is_empty()
        && int.iter().all(u8::is_ascii_digit)
        && frac.is_none_or(|f| !f.is_empty() && f.iter().all(u8::is_ascii_digit))
}

/// An epoch number in `unit`; a fraction only for seconds (up to 9 digits,
/// cut to the millisecond).
fn parse_epoch(s: &str, unit: TsUnit) -> Option<i64> {
    let (int, frac) = match s.split_once('.') {
        Some((int, frac)) => (int, Some(frac)),
        None => (s, None),
    };
    let whole = int.parse::<i64>().ok()?;
    let Some(frac) = frac else {
        return unit.to_ms(whole);
    };
    if unit != TsUnit::Seconds || frac.len() > 9 {
        return None;
    }
    let mut millis = 0i64;
    for (i, c) in frac.bytes().take(3).enumerate() {
        millis += i64::from(c - b'0') * [100, 10, 1][i];
    }
    let negative = int.starts_with('-');
    let ms = whole.checked_mul(1000)?;
    let ms = if negative {
        ms.checked_sub(millis)?
    } else {
        ms.checked_add(millis)?
    };
    in_range(ms).then_some(ms)
}

/// Start of the years an epoch timestamp is expected in: 1990-01-01.
const PLAUSIBLE_FROM_MS: f64 = 631_152_000_000.0;
/// End of the years an epoch timestamp is expected in: 2100-01-01.
const PLAUSIBLE_UNTIL_MS: f64 = 4_102_444_800_000.0;

/// Whether epoch milliseconds fall between 1990 and 2100, where real
/// event times written as epoch numbers are.
pub fn plausible_ms(ms: f64) -> bool {
    (PLAUSIBLE_FROM_MS..PLAUSIBLE_UNTIL_MS).contains(&ms)
}

/// Whether epoch milliseconds name a representable date (chrono's range,
/// about ±262,000 years), which keeps window arithmetic far from overflow.
pub fn in_range(ms: i64) -> bool {
    let min = chrono::DateTime::<chrono::Utc>::MIN_UTC.timestamp_millis();
    let max = chrono::DateTime::<chrono::Utc>::MAX_UTC.timestamp_millis();
    (min..=max).contains(&ms)
}

/// Reads exactly `n` ASCII digits at `pos` as a number.
fn digits_at(b: &[u8], pos: usize, n: usize) -> Option<u32> {
    let slice = b.get(pos..pos + n)?;
    let mut v = 0u32;
    for &c in slice {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u32::from(c - b'0');
    }
    Some(v)
}

/// Parses `YYYY-MM-DD[T ]HH:MM:SS[.f{1,9}][Z|±HH[:MM]|±HHMM]`.
fn parse_iso(b: &[u8]) -> Option<i64> {
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    if !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let year = digits_at(b, 0, 4)?;
    let month = digits_at(b, 5, 2)?;
    let day = digits_at(b, 8, 2)?;
    let hour = digits_at(b, 11, 2)?;
    let minute = digits_at(b, 14, 2)?;
    let second = digits_at(b, 17, 2)?;
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut pos = 19;
    let mut millis = 0u32;
    if b.get(pos) == Some(&b'.') {
        pos += 1;
        let start = pos;
        while pos < b.len() && b[pos].is_ascii_digit() {
            if pos - start < 3 {
                millis = millis * 10 + u32::from(b[pos] - b'0');
            }
            pos += 1;
        }
        let n = pos - start;
        if n == 0 || n > 9 {
            return None;
        }
        for _ in n..3 {
            millis *= 10;
        }
    }
    // Zone suffix: offset in seconds east of UTC.
    let offset_secs: i64 = match b.get(pos) {
        None => 0,
        Some(b'Z' | b'z') if pos + 1 == b.len() => 0,
        Some(&sign @ (b'+' | b'-')) => {
            let rest = &b[pos + 1..];
            let (h, m) = match rest.len() {
                2 => (digits_at(rest, 0, 2)?, 0),
                4 => (digits_at(rest, 0, 2)?, digits_at(rest, 2, 2)?),
                5 if rest[2] == b':' => (digits_at(rest, 0, 2)?, digits_at(rest, 3, 2)?),
                _ => return None,
            };
            if h > 23 || m > 59 {
                return None;
            }
            let secs = i64::from(h * 3600 + m * 60);
            if sign == b'-' { -secs } else { secs }
        }
        Some(_) => return None,
    };
    let date = NaiveDate::from_ymd_opt(year as i32, month, day)?;
    let naive = date.and_hms_milli_opt(hour, minute, second, millis)?;
    Some(naive.and_utc().timestamp_millis() - offset_secs * 1000)
}

/// Formats epoch milliseconds as `1970-01-01T00:00:10` (UTC, no zone
/// suffix), adding a three-digit fraction such as `.250` only when the
/// milliseconds are non-zero.
///
/// Values outside chrono's range (beyond about ±262,000 years) are printed
/// as the plain integer.
pub fn format_timestamp_ms(ms: i64) -> String {
    let mut out = String::with_capacity(23);
    write_timestamp_ms(&mut out, ms);
    out
}

/// Appends the [`format_timestamp_ms`] text of `ms` to `out`.
pub fn write_timestamp_ms(out: &mut String, ms: i64) {
    use std::fmt::Write;
    match DateTime::from_timestamp_millis(ms) {
        Some(dt) => {
            let year = dt.year();
            if (0..=9999).contains(&year) {
                let _ = write!(out, "{year:04}");
            } else {
                let _ = write!(out, "{year:+}");
            }
            let _ = write!(
                out,
                "-{:02}-{:02}T{:02}:{:02}:{:02}",
                dt.month(),
                dt.day(),
                dt.hour(),
                dt.minute(),
                dt.second()
            );
            let frac = ms.rem_euclid(1000);
            if frac != 0 {
                let _ = write!(out, ".{frac:03}");
            }
        }
        None => {
            let _ = write!(out, "{ms}");
        }
    }
}

#[cfg(test)]
mod range_tests {
    use super::*;

    #[test]
    fn epoch_millis_outside_the_calendar_are_rejected() {
        assert_eq!(parse_timestamp_ms("9223372036854775807"), None);
        assert_eq!(parse_timestamp_ms("-9223372036854775808"), None);
        assert_eq!(
            parse_timestamp_ms("8000000000000000"),
            Some(8_000_000_000_000_000)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_392_388_200_000; // 2014-02-14T14:30:00Z

    #[test]
    fn iso_with_zulu() {
        assert_eq!(parse_timestamp_ms("2014-02-14T14:30:00Z"), Some(T));
        assert_eq!(parse_timestamp_ms("2014-02-14t14:30:00z"), Some(T));
        assert_eq!(parse_timestamp_ms("  2014-02-14T14:30:00Z \n"), Some(T));
        assert_eq!(parse_timestamp_ms("1970-01-01T00:00:00Z"), Some(0));
    }

    #[test]
    fn iso_with_offsets() {
        assert_eq!(parse_timestamp_ms("2014-02-14T15:30:00+01:00"), Some(T));
        assert_eq!(parse_timestamp_ms("2014-02-14T09:30:00-05:00"), Some(T));
        assert_eq!(parse_timestamp_ms("2014-02-14T09:30:00-0500"), Some(T));
        assert_eq!(parse_timestamp_ms("2014-02-14T16:30:00+02"), Some(T));
        assert_eq!(parse_timestamp_ms("2014-02-14T20:00:00+05:30"), Some(T));
        assert_eq!(parse_timestamp_ms("2014-02-14T14:30:00+00:00"), Some(T));
    }

    #[test]
    fn iso_with_fractions() {
        assert_eq!(
            parse_timestamp_ms("2014-02-14T14:30:00.250Z"),
            Some(T + 250)
        );
        assert_eq!(parse_timestamp_ms("2014-02-14T14:30:00.5Z"), Some(T + 500));
        assert_eq!(parse_timestamp_ms("2014-02-14T14:30:00.25"), Some(T + 250));
        assert_eq!(
            parse_timestamp_ms("2014-02-14T14:30:00.123456789Z"),
            Some(T + 123)
        );
        assert_eq!(
            parse_timestamp_ms("2014-02-14T15:30:00.001+01:00"),
            Some(T + 1)
        );
    }

    #[test]
    fn naive_forms_are_utc() {
        assert_eq!(parse_timestamp_ms("2014-02-14 14:30:00"), Some(T));
        assert_eq!(parse_timestamp_ms("2014-02-14T14:30:00"), Some(T));
        assert_eq!(parse_timestamp_ms("2014-02-14 14:30:00.075"), Some(T + 75));
        assert_eq!(parse_timestamp_ms("2014-02-14 14:30:00Z"), Some(T));
        assert_eq!(parse_timestamp_ms("1969-12-31 23:59:59"), Some(-1000));
    }

    #[test]
    fn epoch_millis() {
        assert_eq!(parse_timestamp_ms("1392388200000"), Some(T));
        assert_eq!(parse_timestamp_ms("0"), Some(0));
        assert_eq!(parse_timestamp_ms("10000"), Some(10_000));
        assert_eq!(parse_timestamp_ms("-1500"), Some(-1500));
        assert_eq!(parse_timestamp_ms(" 42 "), Some(42));
    }

    #[test]
    fn epoch_units() {
        let secs = 1_392_388_200i64;
        assert_eq!(parse_timestamp("1392388200", TsUnit::Seconds), Some(T));
        assert_eq!(
            parse_timestamp("1392388200.25", TsUnit::Seconds),
            Some(T + 250)
        );
        assert_eq!(parse_timestamp("-1.5", TsUnit::Seconds), Some(-1500));
        assert_eq!(
            parse_timestamp(&format!("{}", secs * 1_000_000 + 7), TsUnit::Micros),
            Some(T)
        );
        assert_eq!(
            parse_timestamp(&format!("{}", secs * 1_000_000_000), TsUnit::Nanos),
            Some(T)
        );
        assert_eq!(parse_timestamp("-1", TsUnit::Micros), Some(-1));
        // Fractions are for seconds only; ISO text ignores the unit.
        assert_eq!(parse_timestamp("1000.5", TsUnit::Millis), None);
        assert_eq!(parse_timestamp("1.5", TsUnit::Nanos), None);
        assert_eq!(
            parse_timestamp("2014-02-14T14:30:00Z", TsUnit::Seconds),
            Some(T)
        );
        assert_eq!(
            parse_timestamp("9223372036854775807", TsUnit::Seconds),
            None
        );
        assert_eq!(TsUnit::parse(" US "), Some(TsUnit::Micros));
        assert_eq!(TsUnit::parse("sec"), None);
        // Seconds read as milliseconds land in 1970; as seconds, in 2014.
        assert!(!plausible_ms(secs as f64));
        assert!(plausible_ms(
            TsUnit::Millis.reinterpret(secs, TsUnit::Seconds)
        ));
        assert!(is_epoch_number(" -12.5 ") && !is_epoch_number("1e3"));
        assert!(!is_epoch_number("1.") && !is_epoch_number("."));
    }

    #[test]
    fn rejects() {
        for s in [
            "",
            "   ",
            "abc",
            "-",
            "12.5",
            "1e3",
            "99999999999999999999",
            "2014-02-14",
            "2014-02-14T14:30",
            "2014-02-14T14:30:0",
            "2014-02-30T00:00:00",
            "2014-13-01T00:00:00",
            "2014-02-14T24:00:00",
            "2014-02-14T14:60:00",
            "2014-02-14T14:30:60",
            "2014-02-14X14:30:00",
            "2014-02-14T14:30:00.",
            "2014-02-14T14:30:00.1234567890",
            "2014-02-14T14:30:00ZZ",
            "2014-02-14T14:30:00+1",
            "2014-02-14T14:30:00+01:0",
            "2014-02-14T14:30:00+25:00",
            "2014-02-14T14:30:00 UTC",
            "2014/02/14 14:30:00",
            "14-02-2014 14:30:00",
        ] {
            assert_eq!(parse_timestamp_ms(s), None, "{s:?} should be rejected");
        }
    }

    #[test]
    fn formats() {
        assert_eq!(format_timestamp_ms(10_000), "1970-01-01T00:00:10");
        assert_eq!(format_timestamp_ms(10_250), "1970-01-01T00:00:10.250");
        assert_eq!(format_timestamp_ms(10_005), "1970-01-01T00:00:10.005");
        assert_eq!(format_timestamp_ms(0), "1970-01-01T00:00:00");
        assert_eq!(format_timestamp_ms(T), "2014-02-14T14:30:00");
        assert_eq!(format_timestamp_ms(-1), "1969-12-31T23:59:59.999");
        assert_eq!(format_timestamp_ms(i64::MAX), i64::MAX.to_string());
    }

    #[test]
    fn round_trips() {
        for ms in [0, 1, 999, 10_250, T, T + 7, -1, -86_400_000] {
            assert_eq!(parse_timestamp_ms(&format_timestamp_ms(ms)), Some(ms));
        }
    }
}
