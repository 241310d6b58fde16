//! Documentation and example checks.
//!
//! - Every `queries/*.sql` runs with the real binary, produces output, and gives what its
//!   header comment claims (see [`header_claims`]: row counts, window times, stderr lines).
//! - Replays of the real NAB machine-temperature series (which goes back in time at data
//!   row 10149) give the figures computed independently by `tests/nab_expected.py`.
//! - The flagship example matches aggregates recomputed here from `queries/data/metrics.csv`.
//! - Every `queries/pack/*.sql` alert file raises exactly the alerts that
//!   `queries/data/make_fleet.py --summary` derives for it over `queries/data/fleet.csv`,
//!   and runs over another CSV given with `--input metrics=...`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::support;

/// How long one `vigil run` may take before the test gives up (debug build, 2 cores).
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// Relative tolerance for floats, as in the semantics reference.
const REL_TOL: f64 = 1e-6;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------------------

/// Runs the `vigil` binary with `args`, stdin closed, killing it after `RUN_TIMEOUT`.
fn run_vigil(args: &[&str]) -> Output {
    run_vigil_within(args, RUN_TIMEOUT)
}

/// Runs the `vigil` binary with `args`, stdin closed, killing it after `timeout`.
fn run_vigil_within(args: &[&str], timeout: Duration) -> Output {
    support::run_within(
        Command::new(env!("CARGO_BIN_EXE_vigil")).args(args),
        timeout,
        &format!("vigil {args:?}"),
    )
}

/// Fails with the command, status and both streams unless the run succeeded cleanly.
fn assert_clean_run(what: &str, output: &Output) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && !stderr.contains("error:"),
        "{what}: status {:?}\n--- stderr ---\n{stderr}\n--- stdout (first 2000 chars) ---\n{}",
        output.status.code(),
        stdout.chars().take(2000).collect::<String>()
    );
}

/// Parsed CSV output: a header and rows of strings.
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn parse(text: &str) -> Table {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .from_reader(text.as_bytes());
        let header = reader
            .headers()
            .expect("CSV header")
            .iter()
            .map(str::to_string)
            .collect();
        let rows = reader
            .records()
            .map(|r| r.expect("CSV row").iter().map(str::to_string).collect())
            .collect();
        Table { header, rows }
    }

    fn col(&self, name: &str) -> usize {
        self.header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name:?} in output header {:?}", self.header))
    }

    /// Rows sorted by the given column (ISO timestamps sort as strings).
    fn sorted_by(mut self, name: &str) -> Table {
        let i = self.col(name);
        self.rows.sort_by(|a, b| a[i].cmp(&b[i]));
        self
    }
}

fn close(actual: f64, expected: f64) -> bool {
    actual == expected || (actual - expected).abs() <= REL_TOL * actual.abs().max(expected.abs())
}

fn num(s: &str, what: &str) -> f64 {
    s.parse::<f64>()
        .unwrap_or_else(|e| panic!("{what}: {s:?} is not a number: {e}"))
}

fn assert_close(actual: &str, expected: f64, what: &str) {
    let a = num(actual, what);
    assert!(
        close(a, expected),
        "{what}: got {a}, expected {expected} (relative tolerance {REL_TOL})"
    );
}

/// Quotes a path as an SQL string literal.
fn sql_string(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "''"))
}

/// Copies a directory tree (regular files and directories only).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("dir entry");
        let kind = entry.file_type().expect("file type");
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target);
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}

// ---------------------------------------------------------------------------------------
// (b) every queries/*.sql runs
// ---------------------------------------------------------------------------------------

/// What the header comment of a `queries/*.sql` example claims about its run, in the forms
/// `queries/README.md` describes:
///
/// - `rows`: the `Output:` paragraph (from a line `-- Output:` up to a blank comment line or
///   the next `Label:` line) says `N rows` or `N <word> rows` (`300 rows`, `4 alert rows`,
///   `1891 hourly rows`): stdout holds exactly N result rows.
/// - `times`: every `YYYY-MM-DD HH:MM` in the `Output:` paragraph appears in stdout (as
///   `YYYY-MM-DDTHH:MM`, the way timestamps print).
/// - `stderr`: every backquoted `` `vigil: ...` `` anywhere in the header occurs in stderr at
///   word boundaries (`out=1891` does not match `out=18910`).
#[derive(Debug, Default, PartialEq)]
struct HeaderClaims {
    rows: Option<usize>,
    times: Vec<String>,
    stderr: Vec<String>,
}

/// The leading `--` comment of a script, one entry per line, without the `--` and the
/// space after it.
fn header_lines(text: &str) -> Vec<&str> {
    text.lines()
        .map_while(|l| l.strip_prefix("--"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect()
}

/// True for a line that starts a new labelled paragraph, such as `Run:` or `Stderr:`.
fn starts_label(line: &str) -> bool {
    let word = line.split_whitespace().next().unwrap_or("");
    word.len() > 1
        && word.ends_with(':')
        && word.starts_with(|c: char| c.is_ascii_uppercase())
        && word[..word.len() - 1]
            .chars()
            .all(|c| c.is_ascii_alphabetic())
}

/// Parses the claims of an example's header; `Err` when a claim is ambiguous.
fn header_claims(text: &str) -> Result<HeaderClaims, String> {
    let lines = header_lines(text);
    let mut claims = HeaderClaims::default();
    for part in lines.join("\n").split('`').skip(1).step_by(2) {
        if part.starts_with("vigil: ") {
            claims.stderr.push(part.to_string());
        }
    }
    let Some(start) = lines.iter().position(|l| l.starts_with("Output:")) else {
        return Ok(claims);
    };
    let mut paragraph = lines[start].to_string();
    for line in &lines[start + 1..] {
        if line.trim().is_empty() || starts_label(line) {
            break;
        }
        paragraph.push(' ');
        paragraph.push_str(line.trim());
    }
    let words: Vec<&str> = paragraph.split_whitespace().collect();
    let count = |w: &str| w.replace(',', "").parse::<usize>().ok();
    let mut counts = Vec::new();
    for (i, w) in words.iter().enumerate() {
        if w.trim_end_matches([',', '.', ';', ')']) != "rows" {
            continue;
        }
        let n = i
            .checked_sub(1)
            .and_then(|j| count(words[j]))
            .or_else(|| i.checked_sub(2).and_then(|j| count(words[j])));
        counts.extend(n);
    }
    counts.dedup();
    match counts[..] {
        [] => {}
        [n] => claims.rows = Some(n),
        _ => {
            return Err(format!(
                "the Output: paragraph states several row counts: {counts:?}"
            ));
        }
    }
    for pair in words.windows(2) {
        let date = pair[0].trim_start_matches('(');
        let time = pair[1].trim_end_matches([',', '.', ';', ')']);
        let is_date = date.len() == 10
            && date.char_indices().all(|(k, c)| {
                if k == 4 || k == 7 {
                    c == '-'
                } else {
                    c.is_ascii_digit()
                }
            });
        let is_time = time.len() == 5
            && time
                .char_indices()
                .all(|(k, c)| if k == 2 { c == ':' } else { c.is_ascii_digit() });
        if is_date && is_time {
            claims.times.push(format!("{date}T{time}"));
        }
    }
    Ok(claims)
}

/// Checks one example's run against its header's claims; pushes every broken claim.
fn check_claims(
    name: &str,
    claims: &HeaderClaims,
    stdout: &str,
    stderr: &str,
    failures: &mut Vec<String>,
) {
    if let Some(n) = claims.rows {
        let rows = stdout.lines().filter(|l| !l.trim().is_empty()).count();
        if rows != n {
            failures.push(format!(
                "queries/{name}: the header says {n} rows, stdout has {rows}"
            ));
        }
    }
    for time in &claims.times {
        if !stdout.contains(time.as_str()) {
            failures.push(format!(
                "queries/{name}: the header names {time}, which stdout lacks"
            ));
        }
    }
    for line in &claims.stderr {
        if !crate::conformance::contains_token(stderr, line) {
            failures.push(format!(
                "queries/{name}: the header says `{line}`, stderr lacks it:\n{stderr}"
            ));
        }
    }
}

#[test]
fn header_claims_are_parsed() {
    let text = "-- x.sql: demo.\n--\n-- Run:   vigil run queries/x.sql\n-- Output: 1,891 hourly rows; the first\n-- fires at 2013-12-10\n-- 08:00), then\n--\n-- Stderr: `vigil: query 1: out=1891 late=0` and (2014-01-01 00:00) `nothing`.\nSELECT 1;\n-- Output: 5 rows\n";
    let claims = header_claims(text).unwrap();
    assert_eq!(
        claims,
        HeaderClaims {
            rows: Some(1891),
            times: vec!["2013-12-10T08:00".into()],
            stderr: vec!["vigil: query 1: out=1891 late=0".into()],
        }
    );
    // A label ends the paragraph; `N word rows` and `= N rows` both count.
    let claims =
        header_claims("-- Output: 60 windows x 5 hosts = 300 rows.\n-- Run: 7 rows\n").unwrap();
    assert_eq!(claims.rows, Some(300));
    assert!(header_claims("-- Output: 3 rows, then 4 rows\n").is_err());
    assert_eq!(
        header_claims("SELECT 1;\n").unwrap(),
        HeaderClaims::default()
    );
}

/// Examples that write to a file sink instead of stdout: (file, sink path relative to the
/// example). They run in a temporary copy of `queries/`, so nothing lands in the repository.
const FILE_SINK_EXAMPLES: &[(&str, &str)] = &[("cpu_alerts_file_sink.sql", "out/cpu_alerts.csv")];

/// Examples the documentation promises.
const REQUIRED_EXAMPLES: &[&str] = &[
    "tumble_avg_per_host.sql",
    "nab_machine_temperature.sql",
    "high_cpu_rows.sql",
    "cpu_alerts_file_sink.sql",
    "cpu_alerts_stdout_sink.sql",
    "demo_alert.sql",
    "live_cpu_alert.sql",
];

#[test]
fn every_example_query_runs() {
    let queries = repo().join("queries");
    let mut names: Vec<String> = std::fs::read_dir(&queries)
        .expect("read queries/")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".sql"))
        .collect();
    names.sort();
    for required in REQUIRED_EXAMPLES {
        assert!(
            names.iter().any(|n| n == required),
            "queries/{required} is missing"
        );
    }

    // Run from a scratch copy: relative paths (data and sinks) resolve against the
    // directory of the .sql file, so file sinks write into the scratch directory.
    let scratch = tempfile::tempdir().expect("temp dir");
    copy_tree(&queries.join("data"), &scratch.path().join("data"));
    std::fs::create_dir_all(scratch.path().join("out")).expect("create out/");

    let mut failures = Vec::new();
    for name in &names {
        let text = std::fs::read_to_string(queries.join(name)).expect("read example");
        let header_ok =
            text.starts_with("--") && text.contains(&format!("vigil run queries/{name}"));
        if !header_ok {
            failures.push(format!(
                "queries/{name}: must start with a comment that says `vigil run queries/{name}`"
            ));
        }
        let copy = scratch.path().join(name);
        std::fs::write(&copy, &text).expect("write example copy");

        let claims = match header_claims(&text) {
            Ok(claims) => claims,
            Err(e) => {
                failures.push(format!("queries/{name}: {e}"));
                HeaderClaims::default()
            }
        };
        // JSON Lines: one line per result row, whatever the number of queries.
        let output = run_vigil(&[
            "run",
            copy.to_str().expect("utf-8 path"),
            "--format",
            "jsonl",
        ]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() || stderr.contains("error:") {
            failures.push(format!(
                "queries/{name}: status {:?}\n{stderr}",
                output.status.code()
            ));
            continue;
        }
        match FILE_SINK_EXAMPLES.iter().find(|(n, _)| *n == name.as_str()) {
            Some((_, sink)) => {
                let written =
                    std::fs::read_to_string(scratch.path().join(sink)).unwrap_or_default();
                if written.trim().is_empty() {
                    failures.push(format!(
                        "queries/{name}: file sink {sink} is missing or empty"
                    ));
                }
            }
            None if stdout.trim().is_empty() => {
                failures.push(format!("queries/{name}: empty stdout; stderr:\n{stderr}"));
            }
            None => {}
        }
        check_claims(name, &claims, &stdout, &stderr, &mut failures);
    }
    assert!(
        failures.is_empty(),
        "{} of {} examples failed:\n{}",
        failures.len(),
        names.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// (c) NAB replay against independently computed figures
// ---------------------------------------------------------------------------------------

/// One expected output window: start, end, count, avg, min, max, median.
type Window = (&'static str, &'static str, u64, f64, f64, f64, f64);

/// Runs a TUMBLE of `size` over the NAB machine-temperature file, delay 0, and returns
/// the CSV output sorted by window_start, with stderr.
fn nab_tumble(size: &str) -> (Table, String) {
    let data = repo().join("queries/data/nab/machine_temperature_system_failure.csv");
    let sql = format!(
        "CREATE STREAM machine_temperature (\n\
         \x20 \"timestamp\" TIMESTAMP,\n\
         \x20 \"value\" DOUBLE,\n\
         \x20 WATERMARK FOR \"timestamp\" AS \"timestamp\"\n\
         ) WITH (connector = 'file', path = {path}, format = 'csv');\n\
         \n\
         SELECT window_start, window_end, count(*) AS n, avg(\"value\") AS avg_v,\n\
         \x20      min(\"value\") AS min_v, max(\"value\") AS max_v, median(\"value\") AS median_v\n\
         FROM TUMBLE(machine_temperature, \"timestamp\", {size})\n\
         GROUP BY window_start, window_end;\n",
        path = sql_string(&data),
    );
    let scratch = tempfile::tempdir().expect("temp dir");
    let script = scratch.path().join("nab.sql");
    std::fs::write(&script, sql).expect("write script");
    let output = run_vigil(&[
        "run",
        script.to_str().expect("utf-8 path"),
        "--format",
        "csv",
    ]);
    assert_clean_run(&format!("NAB TUMBLE {size}"), &output);
    let table = Table::parse(&String::from_utf8_lossy(&output.stdout)).sorted_by("window_start");
    (table, String::from_utf8_lossy(&output.stderr).into_owned())
}

fn check_window(table: &Table, expected: &Window) {
    let (start, end, n, avg, min, max, median) = *expected;
    let ws = table.col("window_start");
    let row = table
        .rows
        .iter()
        .find(|r| r[ws] == start)
        .unwrap_or_else(|| panic!("no output window starting at {start}"));
    let what = |c: &str| format!("window {start} {c}");
    assert_eq!(row[table.col("window_end")], end, "{}", what("window_end"));
    assert_eq!(row[table.col("n")], n.to_string(), "{}", what("count"));
    assert_close(&row[table.col("avg_v")], avg, &what("avg"));
    assert_close(&row[table.col("min_v")], min, &what("min"));
    assert_close(&row[table.col("max_v")], max, &what("max"));
    assert_close(&row[table.col("median_v")], median, &what("median"));
}

fn total_count(table: &Table) -> u64 {
    let n = table.col("n");
    table.rows.iter().map(|r| num(&r[n], "count") as u64).sum()
}

fn assert_stderr_has(stderr: &str, needle: &str) {
    assert!(
        crate::conformance::contains_token(stderr, needle),
        "stderr lacks {needle:?}:\n{stderr}"
    );
}

// Figures from `python3 tests/nab_expected.py` (see that file):
//
// == hourly (size 3600 s)
// rows=22695 late=0 windows=1891 rows_in_windows=22695
// first: 2013-12-02T21:00:00 n=9 avg=78.01159600333332 min=73.96732207 max=80.35342468 median=78.71041827
// last:  2014-02-19T15:00:00 n=6 avg=97.57444492833334 min=96.90386085 max=98.18541493 median=97.58253665999999
// probe: 2014-01-07T02:00:00 n=24 avg=93.93972404041666 min=92.78472036 max=95.33282414 median=93.929059975
// probe: 2014-01-07T03:00:00 n=12 avg=90.16660447666668 min=87.35805304 max=92.90193837 median=89.85138723
const NAB_HOURLY_WINDOWS: usize = 1891;
const NAB_ROWS: u64 = 22695;
const NAB_HOURLY: &[Window] = &[
    (
        "2013-12-02T21:00:00",
        "2013-12-02T22:00:00",
        9,
        78.01159600333332,
        73.96732207,
        80.35342468,
        78.71041827,
    ),
    (
        "2014-02-19T15:00:00",
        "2014-02-19T16:00:00",
        6,
        97.57444492833334,
        96.90386085,
        98.18541493,
        97.58253665999999,
    ),
    // The replayed hour: 12 readings, then the same 12 timestamps again, all on time.
    (
        "2014-01-07T02:00:00",
        "2014-01-07T03:00:00",
        24,
        93.93972404041666,
        92.78472036,
        95.33282414,
        93.929059975,
    ),
    (
        "2014-01-07T03:00:00",
        "2014-01-07T04:00:00",
        12,
        90.16660447666668,
        87.35805304,
        92.90193837,
        89.85138723,
    ),
];

#[test]
fn nab_hourly_replay_matches_independent_computation() {
    let (table, stderr) = nab_tumble("INTERVAL '1' HOUR");
    assert_eq!(
        table.rows.len(),
        NAB_HOURLY_WINDOWS,
        "number of hourly windows"
    );
    assert_eq!(total_count(&table), NAB_ROWS, "readings counted in windows");
    let ws = table.col("window_start");
    assert_eq!(table.rows[0][ws], NAB_HOURLY[0].0, "first window");
    assert_eq!(
        table.rows[table.rows.len() - 1][ws],
        NAB_HOURLY[1].0,
        "last window"
    );
    for expected in NAB_HOURLY {
        check_window(&table, expected);
    }
    assert_stderr_has(
        &stderr,
        "vigil: stream machine_temperature: rows=22695 bad=0",
    );
    assert_stderr_has(&stderr, "vigil: query 1: out=1891 late=0");
}

// == 10 minutes (size 600 s)
// rows=22695 late=10 windows=11342 rows_in_windows=22685
// first: 2013-12-02T21:10:00 n=1 avg=73.96732207 min=73.96732207 max=73.96732207 median=73.96732207
// last:  2014-02-19T15:20:00 n=2 avg=97.480356485 min=96.90386085 max=98.05685212 median=97.480356485
// probe: 2014-01-07T02:00:00 n=2 avg=94.56106787499999 min=94.42340604 max=94.69872971 median=94.56106787499999
// probe: 2014-01-07T02:40:00 n=2 avg=93.58042931 min=93.19298719 max=93.96787143 median=93.58042931
// probe: 2014-01-07T02:50:00 n=4 avg=93.29103449 min=92.85599879 max=93.65604154 median=93.32604881500001
const NAB_10MIN_WINDOWS: usize = 11342;
const NAB_10MIN_LATE: u64 = 10;
const NAB_10MIN: &[Window] = &[
    (
        "2013-12-02T21:10:00",
        "2013-12-02T21:20:00",
        1,
        73.96732207,
        73.96732207,
        73.96732207,
        73.96732207,
    ),
    (
        "2014-02-19T15:20:00",
        "2014-02-19T15:30:00",
        2,
        97.480356485,
        96.90386085,
        98.05685212,
        97.480356485,
    ),
    // Closed (watermark 02:55) when its replayed rows 02:00 and 02:05 arrive: they are late.
    (
        "2014-01-07T02:00:00",
        "2014-01-07T02:10:00",
        2,
        94.56106787499999,
        94.42340604,
        94.69872971,
        94.56106787499999,
    ),
    (
        "2014-01-07T02:40:00",
        "2014-01-07T02:50:00",
        2,
        93.58042931,
        93.19298719,
        93.96787143,
        93.58042931,
    ),
    // Still open (ends 03:00 > 02:55): the replayed 02:50 and 02:55 are counted, twice.
    (
        "2014-01-07T02:50:00",
        "2014-01-07T03:00:00",
        4,
        93.29103449,
        92.85599879,
        93.65604154,
        93.32604881500001,
    ),
];

#[test]
fn nab_ten_minute_replay_counts_late_rows() {
    let (table, stderr) = nab_tumble("INTERVAL '10' MINUTE");
    assert_eq!(
        table.rows.len(),
        NAB_10MIN_WINDOWS,
        "number of 10-minute windows"
    );
    assert_eq!(
        total_count(&table),
        NAB_ROWS - NAB_10MIN_LATE,
        "readings counted in windows (late rows excluded)"
    );
    let ws = table.col("window_start");
    assert_eq!(table.rows[0][ws], NAB_10MIN[0].0, "first window");
    assert_eq!(
        table.rows[table.rows.len() - 1][ws],
        NAB_10MIN[1].0,
        "last window"
    );
    for expected in NAB_10MIN {
        check_window(&table, expected);
    }
    assert_stderr_has(
        &stderr,
        "vigil: stream machine_temperature: rows=22695 bad=0",
    );
    assert_stderr_has(&stderr, "vigil: query 1: out=11342 late=10");
}

// ---------------------------------------------------------------------------------------
// (d) the flagship example against aggregates recomputed from the CSV
// ---------------------------------------------------------------------------------------

/// `2024-05-06T09:05:41Z` -> seconds since midnight (the bundled file covers one morning).
fn seconds_of_day(ts: &str) -> u64 {
    assert!(
        ts.starts_with("2024-05-06T") && ts.ends_with('Z') && ts.len() == 20,
        "unexpected timestamp {ts:?} in metrics.csv"
    );
    let part = |r: std::ops::Range<usize>| ts[r].parse::<u64>().expect("time field");
    part(11..13) * 3600 + part(14..16) * 60 + part(17..19)
}

fn iso_of_day(secs: u64) -> String {
    format!(
        "2024-05-06T{:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[test]
fn flagship_tumble_avg_per_host_matches_the_data() {
    // Expected: every (10-second window, host) of the file; no row is late because the
    // file is at most 2 s out of order and the stream declares a 2-second delay.
    let text =
        std::fs::read_to_string(repo().join("queries/data/metrics.csv")).expect("read metrics.csv");
    let data = Table::parse(&text);
    let (ts, host, cpu) = (data.col("ts"), data.col("host"), data.col("cpu"));
    let mut expected: BTreeMap<(String, String), (f64, f64, u64)> = BTreeMap::new();
    for row in &data.rows {
        let start = seconds_of_day(&row[ts]) / 10 * 10;
        let value = num(&row[cpu], "cpu");
        let entry = expected
            .entry((iso_of_day(start), row[host].clone()))
            .or_insert((0.0, f64::NEG_INFINITY, 0));
        entry.0 += value;
        entry.1 = entry.1.max(value);
        entry.2 += 1;
    }
    assert_eq!(data.rows.len(), 3000);
    assert_eq!(expected.len(), 300);

    let output = run_vigil(&[
        "run",
        repo()
            .join("queries/tumble_avg_per_host.sql")
            .to_str()
            .expect("utf-8 path"),
        "--format",
        "csv",
    ]);
    assert_clean_run("queries/tumble_avg_per_host.sql", &output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_stderr_has(&stderr, "vigil: stream metrics: rows=3000 bad=0");
    assert_stderr_has(&stderr, "vigil: query 1: out=300 late=0");

    let table = Table::parse(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(
        table.rows.len(),
        expected.len(),
        "one row per (window, host)"
    );
    let (ws, we, h) = (
        table.col("window_start"),
        table.col("window_end"),
        table.col("host"),
    );
    let (avg, max, n) = (
        table.col("avg_cpu"),
        table.col("max_cpu"),
        table.col("samples"),
    );
    let mut seen = std::collections::BTreeSet::new();
    for row in &table.rows {
        let key = (row[ws].clone(), row[h].clone());
        let &(sum, peak, count) = expected
            .get(&key)
            .unwrap_or_else(|| panic!("unexpected output row {row:?}"));
        assert!(seen.insert(key.clone()), "duplicate output row for {key:?}");
        let start = seconds_of_day(&format!("{}Z", row[ws]));
        assert_eq!(row[we], iso_of_day(start + 10), "window_end of {key:?}");
        assert_eq!(row[n], count.to_string(), "samples of {key:?}");
        assert_close(
            &row[avg],
            sum / count as f64,
            &format!("avg_cpu of {key:?}"),
        );
        assert_close(&row[max], peak, &format!("max_cpu of {key:?}"));
    }

    // The incident: only web-02 peaks above 90, in the six windows of 09:05.
    let spikes: Vec<&str> = table
        .rows
        .iter()
        .filter(|r| num(&r[max], "max_cpu") > 90.0)
        .map(|r| {
            assert_eq!(r[h], "web-02", "only web-02 spikes");
            r[ws].as_str()
        })
        .collect();
    assert_eq!(spikes.len(), 6, "windows with max_cpu > 90: {spikes:?}");
    assert!(spikes.iter().all(|s| s.starts_with("2024-05-06T09:05:")));
}

// ---------------------------------------------------------------------------------------
// (e) the query pack: each queries/pack/*.sql raises exactly its expected alerts
// ---------------------------------------------------------------------------------------

/// One alert change: (host, state, event_time).
type Change = (&'static str, &'static str, &'static str);

/// Every pack file, the name of its one `CREATE ALERT`, and every change it must emit over
/// `queries/data/fleet.csv`, in event-time order.
///
/// The changes come from `python3 queries/data/make_fleet.py --summary` ("expected alert
/// changes"), which injects the incidents and replays each rule in plain Python, written
/// from the rule's SQL and the alert semantics the conformance cases state
/// (`tests/cases/alert_*.case`), independently of vigil. Any
/// missing change, any other host firing, or any extra flap fails the test. After changing
/// the generator or a rule, rerun the script and update this table (and the file's
/// header, which states the same facts).
const PACK: &[(&str, &str, &[Change])] = &[
    (
        "high_cpu_sustained.sql",
        "high_cpu_sustained",
        &[
            ("batch-02", "firing", "2024-06-03T11:01:00"),
            ("batch-02", "resolved", "2024-06-03T11:16:00"),
        ],
    ),
    (
        "memory_creep.sql",
        "memory_creep",
        &[
            ("web-03", "firing", "2024-06-03T12:05:00"),
            ("web-03", "resolved", "2024-06-03T12:35:00"),
        ],
    ),
    (
        "spike_vs_moving_average.sql",
        "cpu_spike",
        &[
            ("web-01", "firing", "2024-06-03T10:21:00"),
            ("web-01", "resolved", "2024-06-03T10:23:00"),
        ],
    ),
    (
        "mad_own_history.sql",
        "cpu_unusual_for_host",
        &[
            ("web-01", "firing", "2024-06-03T10:21:00"),
            ("web-01", "resolved", "2024-06-03T10:24:00"),
        ],
    ),
    (
        "peer_outlier.sql",
        "peer_outlier",
        &[
            ("web-05", "firing", "2024-06-03T11:54:00"),
            ("web-05", "resolved", "2024-06-03T13:08:00"),
        ],
    ),
    (
        "dbscan_outlier.sql",
        "dbscan_outlier",
        // web-06 is still down when the file ends: no resolve.
        &[("web-06", "firing", "2024-06-03T13:30:00")],
    ),
    (
        "learned_range.sql",
        "disk_io_out_of_range",
        &[
            ("web-02", "firing", "2024-06-03T12:15:00"),
            ("web-02", "resolved", "2024-06-03T12:36:00"),
        ],
    ),
    (
        "no_data.sql",
        "no_data",
        // Last row 12:59:53, silent until its next row at 13:15:03.
        &[
            ("web-04", "firing", "2024-06-03T13:04:53"),
            ("web-04", "resolved", "2024-06-03T13:15:03"),
        ],
    ),
];

/// `make_fleet.py --summary`: rows=19350, of which 35 out of order by at most 19 s; the
/// pack's 30 s watermark delay loses none.
const FLEET_STDERR: &[&str] = &["vigil: stream metrics: rows=19350 bad=0", "late=0"];

/// A pack run must finish well within this (a few seconds in a debug build); the limit
/// turns a hang into a quick failure.
const PACK_TIMEOUT: Duration = Duration::from_secs(120);

fn pack_dir() -> PathBuf {
    repo().join("queries/pack")
}

/// The `.sql` file names of `queries/pack/`, sorted.
fn pack_files() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(pack_dir())
        .expect("read queries/pack/")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".sql"))
        .collect();
    names.sort();
    names
}

/// The SQL of a script without its `--` comment lines.
fn without_comments(sql: &str) -> String {
    sql.lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What a pack file must say and declare, besides its results.
fn check_pack_text(name: &str, alert: &str, failures: &mut Vec<String>) {
    let text = std::fs::read_to_string(pack_dir().join(name)).expect("read pack file");
    let header: String = text
        .lines()
        .take_while(|l| l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    let sql = without_comments(&text).to_uppercase();
    let mut problems = Vec::new();
    for needle in [
        format!("vigil run queries/pack/{name}"),
        "--input metrics=".to_string(),
        "Detects:".to_string(),
        "Why:".to_string(),
        "Your data:".to_string(),
        "On data/fleet.csv:".to_string(),
    ] {
        if !header.contains(&needle) {
            problems.push(format!("its header comment lacks {needle:?}"));
        }
    }
    for needle in [
        // OR REPLACE: the file can be read again in the shell.
        "CREATE OR REPLACE STREAM METRICS (",
        "WATERMARK FOR TS AS TS - INTERVAL '30' SECOND",
        "PATH = '../DATA/FLEET.CSV'",
        &format!("CREATE OR REPLACE ALERT {} AS", alert.to_uppercase()),
    ] {
        if !sql.contains(needle) {
            problems.push(format!("its SQL lacks {needle:?}"));
        }
    }
    // A resolved row must not read like a firing one ("CPU above 90 % since ...").
    if !sql.contains("RESOLVE MESSAGE '") {
        problems.push("its alert has no RESOLVE MESSAGE for resolved rows".to_string());
    }
    let alerts = sql.matches("CREATE OR REPLACE ALERT").count();
    if alerts != 1 {
        problems.push(format!("it has {alerts} CREATE ALERT statements, not 1"));
    }
    for problem in problems {
        failures.push(format!("queries/pack/{name}: {problem}"));
    }
}

/// The (host, state, event_time) changes of a pack run's CSV output, checking the alert
/// columns on the way.
fn alert_changes(
    name: &str,
    alert: &str,
    stdout: &str,
) -> Result<Vec<(String, String, String)>, String> {
    if stdout.trim().is_empty() {
        return Ok(Vec::new());
    }
    let table = Table::parse(stdout);
    let fixed = ["alert", "host", "state", "event_time", "since"];
    if table.header.len() < fixed.len() + 2
        || table.header[..fixed.len()] != fixed
        || table.header[table.header.len() - 2..] != ["severity", "message"]
    {
        return Err(format!(
            "queries/pack/{name}: unexpected output columns {:?}",
            table.header
        ));
    }
    let (a, h, st, t) = (
        table.col("alert"),
        table.col("host"),
        table.col("state"),
        table.col("event_time"),
    );
    let (severity, message) = (table.col("severity"), table.col("message"));
    let mut changes = Vec::new();
    for row in &table.rows {
        if row[a] != alert || row[severity].is_empty() || !row[message].contains(&row[h]) {
            return Err(format!(
                "queries/pack/{name}: row {row:?} should be alert {alert:?} with a severity and a message naming its host"
            ));
        }
        changes.push((row[h].clone(), row[st].clone(), row[t].clone()));
    }
    Ok(changes)
}

/// The resolved rows of a pack run's CSV output carry a message starting with `start`.
fn check_resolved_message(stdout: &str, start: &str, failures: &mut Vec<String>) {
    let table = Table::parse(stdout);
    let (state, message) = (table.col("state"), table.col("message"));
    for row in table.rows.iter().filter(|r| r[state] == "resolved") {
        if !row[message].starts_with(start) {
            failures.push(format!(
                "resolved row {row:?}: its message should start with {start:?}"
            ));
        }
    }
}

#[test]
fn query_pack_raises_exactly_the_expected_alerts_on_fleet_csv() {
    let names = pack_files();
    let listed: Vec<String> = {
        let mut v: Vec<String> = PACK.iter().map(|(n, _, _)| n.to_string()).collect();
        v.sort();
        v
    };
    assert_eq!(
        names, listed,
        "queries/pack/*.sql and the PACK table of tests/examples.rs must list the same files"
    );

    let mut failures = Vec::new();
    for &(name, alert, expected) in PACK {
        check_pack_text(name, alert, &mut failures);
        let path = pack_dir().join(name);
        let started = Instant::now();
        let output = run_vigil_within(
            &["run", path.to_str().expect("utf-8 path"), "--format", "csv"],
            PACK_TIMEOUT,
        );
        let elapsed = started.elapsed();
        eprintln!("queries/pack/{name}: {elapsed:.2?}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() || stderr.contains("error:") {
            failures.push(format!(
                "queries/pack/{name}: status {:?}\n{stderr}",
                output.status.code()
            ));
            continue;
        }
        for needle in FLEET_STDERR {
            if !stderr.contains(needle) {
                failures.push(format!(
                    "queries/pack/{name}: stderr lacks {needle:?}:\n{stderr}"
                ));
            }
        }
        let actual = match alert_changes(name, alert, &stdout) {
            Ok(changes) => changes,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        // Compared in event-time order (then host, state): the order of changes of
        // different hosts at the same instant is not part of the contract.
        if name == "high_cpu_sustained.sql" {
            check_resolved_message(&stdout, "batch-02: CPU down to ", &mut failures);
        }
        let by_time = |c: &(String, String, String)| (c.2.clone(), c.0.clone(), c.1.clone());
        let mut actual = actual;
        actual.sort_by_key(by_time);
        let mut expected: Vec<(String, String, String)> = expected
            .iter()
            .map(|&(h, s, t)| (h.to_string(), s.to_string(), t.to_string()))
            .collect();
        expected.sort_by_key(by_time);
        if actual != expected {
            let missing: Vec<_> = expected.iter().filter(|c| !actual.contains(c)).collect();
            let unexpected: Vec<_> = actual.iter().filter(|c| !expected.contains(c)).collect();
            failures.push(format!(
                "queries/pack/{name}: alert changes differ\n  expected:   {expected:?}\n  actual:     {actual:?}\n  missing:    {missing:?}\n  unexpected: {unexpected:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} problem(s) in the query pack:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The pack as a whole: `vigil check` and `vigil run` over all its files agree
/// (the files share one catalog; a view one file declares is not redefined
/// otherwise by another), and the run raises what each file raises alone. Its
/// output holds one section per alert, labelled with a leading `query` column.
#[test]
fn the_whole_pack_checks_and_runs_together() {
    let paths: Vec<String> = pack_files()
        .iter()
        .map(|n| pack_dir().join(n).to_string_lossy().into_owned())
        .collect();
    let files: Vec<&str> = paths.iter().map(String::as_str).collect();
    let check = run_vigil_within(&[&["check"], files.as_slice()].concat(), PACK_TIMEOUT);
    let check_err = String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "{check_err}");
    let args = [&["run", "--format", "csv"], files.as_slice()].concat();
    let output = run_vigil_within(&args, PACK_TIMEOUT);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in stdout.lines() {
        let (label, rest) = line.split_once(',').expect("a labelled line");
        if label == "query" {
            sections.push((String::new(), format!("{rest}\n")));
        } else {
            let section = sections.last_mut().expect("a header first");
            section.0 = label.to_string();
            section.1.push_str(&format!("{rest}\n"));
        }
    }
    let mut failures = Vec::new();
    for &(name, alert, expected) in PACK {
        let Some((_, text)) = sections.iter().find(|(label, _)| label == alert) else {
            if !expected.is_empty() {
                failures.push(format!("{name}: no rows of alert {alert}"));
            }
            continue;
        };
        match alert_changes(name, alert, text) {
            Ok(changes) => {
                let mut actual: Vec<(String, String, String)> = changes;
                let mut wanted: Vec<(String, String, String)> = expected
                    .iter()
                    .map(|&(h, s, t)| (h.to_string(), s.to_string(), t.to_string()))
                    .collect();
                actual.sort();
                wanted.sort();
                if actual != wanted {
                    failures.push(format!("{name}: {actual:?}, expected {wanted:?}"));
                }
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}\n{stderr}", failures.join("\n"));
}

/// The documented way to use a pack file: point it at another CSV with `--input`. Over
/// `queries/data/metrics.csv` (five hosts, one row per second, 10 minutes) every file
/// runs; the spike detector reports web-02's spike, which make_metrics.py puts at
/// 09:05:00-09:05:59: its one-minute window ending 09:06 averages above 90 against a
/// baseline of about 40 over the five minutes before.
#[test]
fn query_pack_runs_on_another_csv_with_input() {
    let metrics = repo().join("queries/data/metrics.csv");
    let input = format!("metrics={}", metrics.display());
    let mut failures = Vec::new();
    for &(name, alert, _) in PACK {
        let path = pack_dir().join(name);
        let output = run_vigil_within(
            &[
                "run",
                path.to_str().expect("utf-8 path"),
                "--input",
                &input,
                "--format",
                "csv",
            ],
            PACK_TIMEOUT,
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success()
            || stderr.contains("error:")
            || !stderr.contains("vigil: stream metrics: rows=3000 bad=0")
        {
            failures.push(format!(
                "queries/pack/{name} --input {input}: status {:?}\n{stderr}",
                output.status.code()
            ));
            continue;
        }
        if name == "spike_vs_moving_average.sql" {
            match alert_changes(name, alert, &stdout) {
                Ok(changes) => {
                    let firing: Vec<_> = changes.iter().filter(|c| c.1 == "firing").collect();
                    let expected = (
                        "web-02".to_string(),
                        "firing".to_string(),
                        "2024-05-06T09:06:00".to_string(),
                    );
                    if firing != [&expected] {
                        failures.push(format!(
                            "queries/pack/{name} over metrics.csv: firing {firing:?}, expected [{expected:?}]"
                        ));
                    }
                }
                Err(e) => failures.push(e),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} pack file(s) failed over metrics.csv:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
