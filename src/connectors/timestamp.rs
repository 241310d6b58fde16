//! Parsing and printing of event timestamps (UTC, millisecond precision).
//!
//! Accepted input forms:
//! - ISO-8601 / RFC 3339: `2014-02-14T14:30:00Z`, `2014-02-14T14:30:00.250+01:00`,
//!   `2014-02-14T14:30:00-0500`, `2014-02-14T14:30:00+05`;
//! - naive date-times, taken as UTC: `2014-02-14 14:30:00`, `2014-02-14T14:30:00.5`;
//! - an integer: milliseconds since the Unix epoch (`1392388200000`, `-1000`).
//!
//! Fractions may have 1 to 9 digits; anything below a millisecond is truncated.
//! Output is always `YYYY-MM-DDTHH:MM:SS` with a `.mmm` suffix only when the
//! milliseconds are non-zero.

use chrono::{DateTime, Datelike, NaiveDate, Timelike};

/// Parses a timestamp in one of the accepted forms into epoch milliseconds.
///
/// Leading and trailing whitespace is ignored. Returns `None` for anything
/// else (including out-of-range dates such as `2014-02-30`).
pub fn parse_timestamp_ms(s: &str) -> Option<i64> {
    let s = s.trim();
    let b = s.as_bytes();
    if b.is_empty() {
        return None;
    }
    // Integer epoch milliseconds.
    let digits = if b[0] == b'-' || b[0] == b'+' {
        &b[1..]
    } else {
        b
    };
    if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) {
        return s.parse::<i64>().ok().filter(|ms| in_range(*ms));
    }
    parse_iso(b)
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
