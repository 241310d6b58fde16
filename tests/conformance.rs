//! Conformance suite: every `tests/cases/*.case` file is a test of its own
//! (`conformance::case::NAME`), run against the real `vigil` binary in
//! every mode, parallelism and way, reporting every failing run.
//!
//! # Case file format
//!
//! ```text
//! # free comment lines at the top describe the case
//! --- file metrics.csv
//! ts,host,cpu
//! 1000,a,1.5
//! --- sql
//! CREATE STREAM ...;
//! SELECT ...;
//! --- output
//! header,line
//! row,values
//! --- stderr
//! vigil: query 1: out=3 late=1
//! --- expect-file out.csv
//! header,line
//! row,values
//! --- error
//! substring expected on stderr when the run must fail
//! ```
//!
//! Everything before the first `--- ` line is a free comment. A section runs
//! until the next line starting with `--- `; trailing blank lines of a
//! section are dropped.
//!
//! - `--- file NAME` (any number): written into a fresh temp dir (with a
//!   trailing newline).
//! - `--- sql` (exactly one): written there as `case.sql`. The harness runs
//!   `vigil run case.sql --format csv` with the temp dir as cwd, stdin empty.
//! - `--- args` (optional): replaces `--format csv`; whitespace-separated.
//! - `--- output` (optional): the expected stdout as CSV. The header line must
//!   match exactly; data rows are compared as a multiset. A field that parses
//!   as a number on both sides matches within 1e-6 relative (or 1e-9
//!   absolute) tolerance; an empty field is NULL and matches only an empty
//!   field. An output section with no data rows also accepts empty stdout.
//! - `--- expect-file NAME` (any number): after the run, file NAME in the temp
//!   dir must exist and match, with the same comparison as `--- output`.
//! - `--- stderr` (optional): each non-empty line must occur in stderr at
//!   word boundaries (see [`contains_token`]): `late=1` does not match
//!   `late=12`.
//! - `--- stop-after` (optional): the number of rows after which the
//!   restored run stops its sources (default: half the data lines of the
//!   smallest input file); for inputs whose lines are not rows (bad rows,
//!   records over several lines), so that the savepoint is really taken.
//! - `--- error` (optional): the run must exit non-zero and each non-empty
//!   line must occur in stderr, matched the same way. Without it the exit
//!   code must be 0.
//!
//! Every case runs with `--execution-mode micro-batch` and with
//! `--execution-mode per-record`, each at `--parallelism 1` and
//! `--parallelism 3`, appended to its arguments: every mode and
//! parallelism must give the same results.
//!
//! A run must never panic (`panicked at` on stderr fails the case) and is
//! killed after [`TIMEOUT`]. `cargo test --test main conformance::case::NAME`
//! (or `cargo nextest run -E 'test(NAME)'`) runs one case.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support;

/// Every case runs once in each execution mode.
const MODES: [&str; 2] = ["micro-batch", "per-record"];

/// Every case runs at each parallelism; a restored run restores at
/// another one (see [`restored_at`]), so each restore is a rescale too.
const PARALLELISMS: [usize; 2] = [1, 3];

/// The parallelism a run stopped at `parallelism` is restored at: 1 at 3
/// (every key group's state split out of one), 3 at 2 (ranges of key
/// groups that move between instances unevenly).
fn restored_at(parallelism: usize) -> usize {
    match parallelism {
        1 => 3,
        _ => 2,
    }
}

/// Longest a single case may run before it is killed and failed.
const TIMEOUT: Duration = Duration::from_secs(60);

/// One parsed `.case` file.
#[derive(Debug, Default, PartialEq)]
struct Case {
    files: Vec<(String, String)>,
    sql: String,
    args: Option<Vec<String>>,
    output: Option<String>,
    stderr: Vec<String>,
    error: Option<Vec<String>>,
    expect_files: Vec<(String, String)>,
    stop_after: Option<usize>,
}

/// Parses the text of a case file.
fn parse_case(text: &str) -> Result<Case, String> {
    let mut case = Case::default();
    let mut sql = None;
    // (section header, body lines)
    let mut sections: Vec<(String, Vec<&str>)> = Vec::new();
    for line in text.lines() {
        if let Some(header) = line.strip_prefix("--- ") {
            sections.push((header.trim().to_string(), Vec::new()));
        } else if let Some((_, body)) = sections.last_mut() {
            body.push(line);
        } // else: leading comment
    }
    for (header, mut body) in sections {
        while body.last().is_some_and(|l| l.trim().is_empty()) {
            body.pop();
        }
        let text = body.join("\n");
        let lines = || -> Vec<String> {
            body.iter()
                .filter(|l| !l.trim().is_empty())
                .map(|l| l.to_string())
                .collect()
        };
        let (kind, name) = match header.split_once(char::is_whitespace) {
            Some((k, n)) => (k, Some(n.trim().to_string())),
            None => (header.as_str(), None),
        };
        match (kind, name) {
            ("file", Some(name)) => case.files.push((name, text)),
            ("expect-file", Some(name)) => case.expect_files.push((name, text)),
            ("sql", None) if sql.is_none() => sql = Some(text),
            ("sql", None) => return Err("more than one `--- sql` section".into()),
            ("args", None) => case.args = Some(text.split_whitespace().map(String::from).collect()),
            ("output", None) => case.output = Some(text),
            ("stderr", None) => case.stderr = lines(),
            ("error", None) => case.error = Some(lines()),
            ("stop-after", None) => {
                let rows = text
                    .trim()
                    .parse()
                    .map_err(|e| format!("`--- stop-after`: {e}"))?;
                case.stop_after = Some(rows);
            }
            _ => return Err(format!("unknown section `--- {header}`")),
        }
    }
    case.sql = sql.ok_or("missing `--- sql` section")?;
    Ok(case)
}

/// Splits one CSV line into fields (RFC 4180 quoting, no embedded newlines).
fn split_csv(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut in_quotes = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if in_quotes && chars.peek() == Some(&'"') => {
                chars.next();
                fields.last_mut().unwrap().push('"');
            }
            '"' => in_quotes = !in_quotes,
            ',' if !in_quotes => fields.push(String::new()),
            c => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

/// True when two CSV fields are equal: textually, or as numbers within
/// 1e-6 relative / 1e-9 absolute tolerance. Empty (NULL) matches only empty.
fn fields_match(expected: &str, actual: &str) -> bool {
    if expected == actual {
        return true;
    }
    match (expected.trim().parse::<f64>(), actual.trim().parse::<f64>()) {
        (Ok(e), Ok(a)) if e.is_finite() && a.is_finite() => {
            let diff = (e - a).abs();
            diff <= 1e-9 || diff <= 1e-6 * e.abs().max(a.abs())
        }
        _ => false,
    }
}

fn rows_match(expected: &[String], actual: &[String]) -> bool {
    expected.len() == actual.len() && expected.iter().zip(actual).all(|(e, a)| fields_match(e, a))
}

/// Compares CSV text: exact header line, then data rows as a multiset.
/// Returns a description of every difference.
fn compare_csv(expected: &str, actual: &str) -> Result<(), String> {
    let exp: Vec<&str> = expected.lines().collect();
    let act: Vec<&str> = actual.lines().collect();
    if exp.len() <= 1 && act.is_empty() {
        return Ok(()); // no data rows expected; an engine may omit the header
    }
    let mut problems = Vec::new();
    match (exp.first(), act.first()) {
        (Some(e), Some(a)) if e == a => {}
        (e, a) => problems.push(format!(
            "header differs: expected {:?}, actual {:?}",
            e.unwrap_or(&"<none>"),
            a.unwrap_or(&"<none>")
        )),
    }
    let exp_rows: Vec<Vec<String>> = exp.iter().skip(1).map(|l| split_csv(l)).collect();
    let mut act_rows: Vec<Option<Vec<String>>> =
        act.iter().skip(1).map(|l| Some(split_csv(l))).collect();
    for (i, row) in exp_rows.iter().enumerate() {
        let found = act_rows
            .iter_mut()
            .find(|a| a.as_ref().is_some_and(|a| rows_match(row, a)));
        match found {
            Some(slot) => *slot = None,
            None => problems.push(format!("missing row: {}", exp[i + 1])),
        }
    }
    for (i, row) in act_rows.iter().enumerate() {
        if row.is_some() {
            problems.push(format!("unexpected row: {}", act[i + 1]));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Compares output: as one CSV text, or per query when the expected header
/// starts with `query` (the output several queries share, each row
/// labelled with its query's name).
fn compare_output(expected: &str, actual: &str) -> Result<(), String> {
    let labelled = expected
        .lines()
        .next()
        .is_some_and(|header| split_csv(header)[0] == "query");
    if !labelled {
        return compare_csv(expected, actual);
    }
    let (expected, actual) = (by_query(expected)?, by_query(actual)?);
    let mut problems = Vec::new();
    for (query, text) in &expected {
        let empty = String::new();
        if let Err(diff) = compare_csv(text, actual.get(query).unwrap_or(&empty)) {
            problems.push(format!("query {query}:\n{}", indent(&diff)));
        }
    }
    for query in actual.keys().filter(|q| !expected.contains_key(*q)) {
        problems.push(format!("unexpected rows of query {query}"));
    }
    match problems.is_empty() {
        true => Ok(()),
        false => Err(problems.join("\n")),
    }
}

/// Splits labelled CSV into one CSV text per query. A row belongs to the
/// query its first field names; a header line (first field `query`) to the
/// query of the row right after it, as the engine writes a query's header
/// together with its first rows.
fn by_query(text: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut queries = std::collections::BTreeMap::<String, String>::new();
    let mut header: Option<&str> = None;
    for line in text.lines() {
        let query = split_csv(line).swap_remove(0);
        if query == "query" {
            if let Some(orphan) = header.replace(line) {
                return Err(format!("header {orphan:?} is not followed by a row"));
            }
            continue;
        }
        let lines = queries.entry(query).or_default();
        if let Some(header) = header.take() {
            if !lines.is_empty() {
                return Err(format!("a second header {header:?} before {line:?}"));
            }
            lines.push_str(header);
            lines.push('\n');
        }
        lines.push_str(line);
        lines.push('\n');
    }
    match header {
        Some(orphan) => Err(format!("header {orphan:?} is not followed by a row")),
        None => Ok(queries),
    }
}

/// True when `needle` occurs in `haystack` at word boundaries: where the
/// needle starts with a letter, digit or `_`, the character before the match
/// is not one (or the match starts the text), and likewise after its end.
/// So `late=1` matches `late=1` and `late=1 bad=0` but not `late=12`, and
/// `query 1:` does not match `query 11:`. Used for expected stderr.
pub(crate) fn contains_token(haystack: &str, needle: &str) -> bool {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let starts_word = needle.chars().next().is_some_and(word);
    let ends_word = needle.chars().next_back().is_some_and(word);
    haystack.match_indices(needle).any(|(at, _)| {
        let before = haystack[..at].chars().next_back();
        let after = haystack[at + needle.len()..].chars().next();
        let glued_before = starts_word && before.is_some_and(word);
        let glued_after = ends_word && after.is_some_and(word);
        !glued_before && !glued_after
    })
}

struct RunResult {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    timed_out: bool,
}

/// Runs the binary in `dir`, capturing output, killing it after [`TIMEOUT`].
fn run_vigil(dir: &Path, args: &[String]) -> RunResult {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vigil"));
    command
        .arg("run")
        .arg("case.sql")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = support::spawn(&mut command, "vigil run case.sql");
    let (output, timed_out) = child.output_or_kill(TIMEOUT);
    RunResult {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        timed_out,
    }
}

/// How a case is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// In one run.
    Straight,
    /// Stopped with a savepoint after about half of its input (every
    /// source stops after half of the rows of the smallest input file),
    /// then restored from the savepoint, at another parallelism ([`restored_at`]), in a
    /// second run that finishes: the two runs' stdout together, and the
    /// files at the end, must be what one run gives.
    Restored,
}

/// Runs one case; `Err` carries the full failure report. `Ok(true)` if
/// the case was restored from a savepoint (a case whose sources ended
/// before the stop ran whole in the first run).
fn run_case(
    name: &str,
    text: &str,
    (mode, parallelism): (&str, usize),
    way: Way,
) -> Result<bool, String> {
    let case = parse_case(text).map_err(|e| format!("=== {name}: bad case file: {e}"))?;
    let dir = tempfile::tempdir().expect("temp dir");
    for (file, content) in &case.files {
        let path = dir.path().join(file);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create dir");
        }
        std::fs::write(&path, format!("{content}\n")).expect("write case file");
    }
    std::fs::write(dir.path().join("case.sql"), format!("{}\n", case.sql)).expect("write sql");
    let default_args = vec!["--format".to_string(), "csv".to_string()];
    let mut args = case.args.clone().unwrap_or(default_args);
    args.extend(["--execution-mode".to_string(), mode.to_string()]);
    let (run, restored) = match way {
        Way::Straight => (
            run_vigil(dir.path(), &with_parallelism(&args, parallelism)),
            false,
        ),
        Way::Restored => run_restored(&case, dir.path(), &args, parallelism),
    };

    let mut problems = Vec::new();
    if run.timed_out {
        problems.push(format!("killed after {TIMEOUT:?}"));
    }
    if run.stderr.contains("panicked at") {
        problems.push("the binary panicked".to_string());
    }
    match (&case.error, run.code) {
        (None, Some(0)) => {}
        (None, code) => problems.push(format!("expected exit code 0, got {code:?}")),
        (Some(_), Some(c)) if c != 0 => {}
        (Some(_), code) => problems.push(format!("expected a non-zero exit code, got {code:?}")),
    }
    let wanted = case.error.iter().flatten().chain(&case.stderr);
    for needle in wanted {
        if !contains_token(&run.stderr, needle) {
            problems.push(format!("stderr lacks {needle:?}"));
        }
    }
    if let Some(Err(diff)) = case.output.as_ref().map(|e| compare_output(e, &run.stdout)) {
        problems.push(format!("stdout differs:\n{}", indent(&diff)));
    }
    for (file, expected) in &case.expect_files {
        match std::fs::read_to_string(dir.path().join(file)) {
            Ok(actual) => {
                if let Err(diff) = compare_output(expected, &actual) {
                    problems.push(format!(
                        "file {file} differs:\n{}\n  expected {file}:\n{}\n  actual {file}:\n{}",
                        indent(&diff),
                        indent(expected),
                        indent(&actual)
                    ));
                }
            }
            Err(e) => problems.push(format!("file {file} not readable: {e}")),
        }
    }
    if problems.is_empty() {
        return Ok(restored);
    }
    let mut report = format!(
        "=== {name} [{mode}, parallelism {parallelism}, {way:?}]: FAILED (exit code {:?})\n",
        run.code
    );
    for p in &problems {
        report.push_str(&format!("- {p}\n"));
    }
    if let Some(expected) = &case.output {
        report.push_str(&format!("  expected stdout:\n{}\n", indent(expected)));
    }
    report.push_str(&format!("  actual stdout:\n{}\n", indent(&run.stdout)));
    report.push_str(&format!("  stderr:\n{}\n", indent(&run.stderr)));
    Err(report)
}

/// `args` with `--parallelism parallelism` appended, unless the case sets
/// its own.
fn with_parallelism(args: &[String], parallelism: usize) -> Vec<String> {
    let mut args = args.to_vec();
    if !args.iter().any(|a| a == "--parallelism") {
        args.extend(["--parallelism".to_string(), parallelism.to_string()]);
    }
    args
}

/// Whether a case can be stopped and restored: it must succeed, print CSV
/// or JSON lines (tables do not concatenate), and read files.
fn restorable(case: &Case, args: &[String]) -> bool {
    case.error.is_none()
        && !args.iter().any(|a| a == "table" || a == "--follow")
        && !case.files.is_empty()
}

/// Half the data rows of the smallest input file.
fn half_of_smallest_input(case: &Case) -> usize {
    let rows = |name: &str, text: &str| {
        let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
        match name.ends_with(".csv") {
            true => lines.saturating_sub(1),
            false => lines,
        }
    };
    let smallest = case
        .files
        .iter()
        .map(|(name, text)| rows(name, text))
        .min()
        .unwrap_or(0);
    (smallest / 2).max(1)
}

/// Runs a case stopped with a savepoint and then restored (see
/// [`Way::Restored`]); one result standing for both runs, and whether the
/// second run restored a savepoint.
fn run_restored(case: &Case, dir: &Path, args: &[String], parallelism: usize) -> (RunResult, bool) {
    if !restorable(case, args) {
        return (run_vigil(dir, &with_parallelism(args, parallelism)), false);
    }
    let stop = case
        .stop_after
        .unwrap_or_else(|| half_of_smallest_input(case))
        .to_string();
    let common = ["--checkpoint-dir", "checkpoints", "--batch-size", "1"];
    let mut first_args = with_parallelism(args, parallelism);
    first_args.extend(common.iter().map(|a| a.to_string()));
    first_args.extend(["--savepoint-on-stop", "--stop-after-rows", &stop].map(String::from));
    let first = run_vigil(dir, &first_args);
    let savepoint = first
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("vigil: savepoint written to "))
        .map(str::to_string);
    let Some(savepoint) = savepoint.filter(|_| first.code == Some(0)) else {
        return (first, false);
    };
    let other = restored_at(parallelism);
    let mut second_args = with_parallelism(args, other);
    second_args.extend(common.iter().map(|a| a.to_string()));
    second_args.extend(["--from-savepoint".to_string(), savepoint]);
    let second = run_vigil(dir, &second_args);
    let stdout = format!(
        "{}{}",
        first.stdout,
        without_repeated_headers(&first.stdout, &second.stdout)
    );
    let run = RunResult {
        code: second.code,
        stdout,
        stderr: format!("{}{}", first.stderr, second.stderr),
        timed_out: first.timed_out || second.timed_out,
    };
    (run, true)
}

/// `later` without the CSV header lines that `earlier` already printed
/// for the same query (a restored run writes its header again).
fn without_repeated_headers(earlier: &str, later: &str) -> String {
    let Some(first_header) = earlier.lines().next() else {
        return later.to_string();
    };
    let labelled = split_csv(first_header)[0] == "query";
    let lines: Vec<&str> = later.lines().collect();
    let mut kept = String::new();
    for (i, line) in lines.iter().enumerate() {
        let repeated = match labelled {
            false => *line == first_header,
            true => {
                split_csv(line)[0] == "query"
                    && lines.get(i + 1).is_some_and(|next| {
                        let query = split_csv(next).swap_remove(0);
                        earlier.lines().any(|l| split_csv(l)[0] == query)
                    })
            }
        };
        if !repeated {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

fn indent(text: &str) -> String {
    if text.is_empty() {
        return "    <empty>".to_string();
    }
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn case_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "case"))
        .collect();
    files.sort();
    files
}

/// Runs one case in every mode, parallelism and way; fails with every
/// variant's report. A case that can be restored must be restored in each
/// of its restored runs: a `--stop-after-rows` that stopped nothing would
/// otherwise leave the restore path untested in silence.
fn run_every_way(name: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/cases/{name}.case"));
    let text = std::fs::read_to_string(&path).expect("read case");
    let case = parse_case(&text).unwrap_or_else(|e| panic!("{name}: bad case file: {e}"));
    let restorable = restorable(&case, case.args.as_deref().unwrap_or(&[]));
    let runs = MODES
        .into_iter()
        .flat_map(|m| PARALLELISMS.map(|p| (m, p)))
        .flat_map(|setting| [Way::Straight, Way::Restored].map(|w| (setting, w)));
    let mut failures = Vec::new();
    for ((mode, parallelism), way) in runs {
        let variant = format!("{name} [{mode}, parallelism {parallelism}, {way:?}]");
        match run_case(name, &text, (mode, parallelism), way) {
            Ok(false) if way == Way::Restored && restorable => failures.push(format!(
                "=== {variant}: the first run wrote no savepoint, so nothing was restored\n"
            )),
            Ok(_) => {}
            Err(report) => failures.push(report),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 8 runs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// One test per case file, so cases run in parallel and are named, timed
/// and retried one by one: `cargo test --test main conformance::case::NAME`.
macro_rules! cases {
    ($($name:ident)*) => {
        /// Every case file, one test each.
        mod case {
            $(#[test] fn $name() { super::run_every_way(stringify!($name)) })*
        }
        /// The names [`cases!`] lists.
        const CASES: &[&str] = &[$(stringify!($name)),*];
    };
}

// The list of `tests/cases/*.case`, sorted; `every_case_file_has_a_test`
// prints it anew when a case is added or removed.
cases! {
    agg_all_null_is_null
    agg_approx_percentile
    agg_approx_percentile_sketch
    agg_avg_ignores_null
    agg_bigint_sum_min_max_avg
    agg_count_star_vs_count_col
    agg_mad
    agg_median_even
    agg_median_even_integers
    agg_median_odd
    agg_percentile_cont_tumble
    agg_quantiles_emit_changes
    agg_quantiles_hop
    agg_quantiles_session
    agg_stddev_sample
    agg_sum_min_max
    alert_deadman
    alert_fires_resolves_suppresses
    alert_for_interval_gap
    alert_for_windows_hysteresis
    alert_keep_firing_labels
    alert_raw_rows_event_time_order
    alert_resolve_message
    alert_resolve_message_deadman
    alert_resolve_message_errors
    alert_routed_to_sink
    alert_without_keys
    append_only_sink_final_rows
    bad_csv_field_count
    bad_csv_number
    bad_csv_stray_quote
    bad_csv_timestamp
    bad_json_broken
    bad_json_wrong_type
    bad_nested_shapes
    batch_count_star
    batch_group_by_without_window
    batch_join_two_streams
    batch_not_for_streaming_only_nodes
    batch_order_by_limit
    batch_view_and_union
    changes_only_real_changes
    changes_tumble_any_aggregate
    cli_input_override
    cli_input_unknown_stream
    cli_output_flag
    control_keyed_bigint
    control_keyed_hosts
    control_maintenance_window
    control_params_alert
    control_params_filter
    control_silence_alert
    control_words_drop_ignore
    course_hop_busy_machines
    course_session_jobs
    course_tumble_terminations
    csv_extra_reordered_columns
    csv_header_case_insensitive
    ddl_no_watermark
    ddl_quoted_identifiers_nab
    ddl_type_aliases
    ddl_watermark_interval_units
    ddl_watermark_zero_delay
    demo_source_limit
    emit_changes_per_key
    emit_changes_running_median
    emit_changes_tumble
    emit_every_final_rows
    emit_on_window_close_explicit
    empty_windows_gap
    err_alert_bad_clauses
    err_alert_by_nested_field
    err_alert_emit_changes
    err_alert_for_without_key
    err_alert_keep_firing
    err_alert_label_name
    err_alert_label_reads_message
    err_alert_label_template
    err_alert_message_column
    err_alert_parse_position
    err_alert_unknown_column
    err_all_rows_bad
    err_append_only_sink
    err_cadence_type
    err_change_score_hop
    err_change_score_n
    err_controlled
    err_cusum_h
    err_cusum_hop
    err_cusum_k
    err_cusum_type
    err_dbscan_eps
    err_emit_changes_hop
    err_emit_every_without_aggregate
    err_ewma_alpha
    err_host_unknown_column
    err_join
    err_join_without_window
    err_lateness_bad_value
    err_missing_file
    err_missing_header_column
    err_nested_types
    err_order_by
    err_over_raw_stream
    err_params
    err_parse_error_position
    err_seasonal_z_period
    err_seasonal_z_period_column
    err_type_error_arithmetic
    err_type_error_sum_text
    err_unbounded_aggregate
    err_unbounded_aggregate_global
    err_unknown_column
    err_unknown_stream
    err_view_unbounded
    filter_projection
    filter_timestamp_compare
    having_aggregate_not_selected
    having_count
    hop_all_aggregates
    hop_cascade
    hop_empty_windows
    hop_offset
    hop_out_of_order
    hop_partly_late
    hop_size_2x_slide
    hop_size_3x_slide
    hop_size_6x_slide
    hop_slide_equals_size
    hop_slide_not_dividing_size
    host_source_limit
    invariant_range_windows_alert
    invariant_set_offline_online
    join_window_results
    join_window_rows
    jsonl_format_option
    jsonl_input
    late_rows_dropped
    late_side_output
    lateness_hop_partial
    lateness_refires
    lateness_session
    multi_stdout_csv
    nested_alert_by_map_value
    nested_csv_cells
    nested_group_by_map_value
    nested_json_text_functions
    nested_struct_list_map_jsonl
    nested_unnest
    null_key
    out_of_order_not_late
    over_lag_moving_average
    over_robust_score
    over_running_max
    peer_alert_many_windows
    peer_dbscan_noise
    peer_group_robust_z
    peer_median_rank
    peer_robust_z_alert
    peer_union_straddles_watermarks
    quoted_identifiers_stateless
    scalar_arithmetic
    scalar_case_when
    scalar_upper_round
    session_aggregates
    session_end_of_input
    session_late_row
    session_merge_bridge
    session_multiple_keys
    session_no_key
    session_single
    session_split_at_gap
    shed_alert_marks_approximate
    shed_options_errors
    shed_replay_sheds_nothing
    shed_set_overrides_the_stream
    sink_and_select
    sink_file_csv
    sink_shared_file
    sink_shared_file_other_columns
    sink_stdout
    source_missing_column_null
    source_multiline_csv
    stateless_null_predicates
    stdin_source
    timeseries_cadence
    timeseries_cadence_hop
    timeseries_change_score
    timeseries_change_score_alert
    timeseries_change_score_group_by
    timeseries_cusum
    timeseries_cusum_alert
    timeseries_cusum_small_shift
    timeseries_ewma_chart
    timeseries_moving_relative_ewma
    timeseries_seasonal_z
    ts_epoch_ms_rendered_iso
    ts_future_disabled
    ts_future_outlier
    ts_iso_formats
    ts_space_format_windows
    ts_unit_seconds
    ts_unit_warning
    tumble_1_minute_iso
    tumble_1s_empty_windows
    tumble_5s_no_key
    tumble_multiple_keys
    tumble_offset
    tumble_worked_vector
    union_stateless
    union_view_paced_input
    union_view_session
    union_view_three_inputs
    union_view_window_min_watermark
    union_windowed
    view_stateless
    view_window_over_window
    where_before_window
    window_over_window_results
    window_partial_columns
}

#[test]
fn every_case_file_has_a_test() {
    let files: Vec<String> = case_files()
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(
        files == CASES,
        "tests/cases and the list in tests/conformance.rs differ; the list should read:\n{}",
        files
            .iter()
            .map(|f| format!("    {f}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn fields_match_numbers_and_nulls() {
    assert!(fields_match("a", "a"));
    assert!(!fields_match("a", "A"));
    assert!(fields_match("2", "2.0"));
    assert!(fields_match("2.138089935", "2.138089935299395"));
    assert!(fields_match("1000000", "1000000.5"));
    assert!(!fields_match("1.5", "1.6"));
    assert!(fields_match("0", "0.0000000001"));
    assert!(!fields_match("0", "0.001"));
    assert!(fields_match("", ""));
    assert!(!fields_match("", "0"));
    assert!(!fields_match("0", ""));
    assert!(!fields_match("NaN", "0"));
    assert!(!fields_match(
        "1970-01-01T00:00:10",
        "1970-01-01T00:00:10.500"
    ));
}

#[test]
fn stderr_lines_match_at_word_boundaries() {
    let stderr = "vigil: stream metrics: rows=12 bad=0\nvigil: query 1: out=3 late=12\n";
    assert!(contains_token(stderr, "vigil: query 1: out=3 late=12"));
    assert!(contains_token(stderr, "vigil: query 1: out=3"));
    assert!(contains_token(stderr, "late=12"));
    assert!(contains_token(stderr, "rows=12 bad=0"));
    assert!(!contains_token(stderr, "late=1"));
    assert!(!contains_token(stderr, "rows=1"));
    assert!(!contains_token(stderr, "ate=12"));
    assert!(!contains_token(stderr, "query 1: out=3 late=1"));
    // An edge that is not a word character needs no boundary.
    assert!(contains_token(stderr, ": query"));
    assert!(contains_token("error: unknown column 'x'", "column 'x"));
    assert!(!contains_token("vigil: query 11: out=3", "query 1"));
    assert!(contains_token("a late=1", "late=1"));
    assert!(!contains_token("", "x"));
}

#[test]
fn compare_csv_is_a_multiset_with_exact_header() {
    let expected = "h,n\na,1\nb,2\nb,2";
    assert!(compare_csv(expected, "h,n\nb,2.0\na,1\nb,2\n").is_ok());
    // Multiplicity matters.
    let err = compare_csv(expected, "h,n\na,1\nb,2\n").unwrap_err();
    assert!(err.contains("missing row: b,2"), "{err}");
    let err = compare_csv(expected, "h,n\na,1\nb,2\nb,2\nb,2\n").unwrap_err();
    assert!(err.contains("unexpected row: b,2"), "{err}");
    // Header is exact.
    let err = compare_csv("h,n\na,1", "h,N\na,1\n").unwrap_err();
    assert!(err.contains("header differs"), "{err}");
    // NULL is an empty field and is not 0; field counts must agree.
    assert!(compare_csv("h,n\na,", "h,n\na,\n").is_ok());
    assert!(compare_csv("h,n\na,", "h,n\na,0\n").is_err());
    assert!(compare_csv("h,n\na,1", "h,n\na,1,\n").is_err());
    // Quoted fields.
    assert!(compare_csv("h,n\n\"x,y\",1", "h,n\n\"x,y\",1.0\n").is_ok());
    // No data rows expected: empty output or a lone header both pass.
    assert!(compare_csv("h,n", "").is_ok());
    assert!(compare_csv("h,n", "h,n\n").is_ok());
    assert!(compare_csv("", "").is_ok());
    assert!(compare_csv("h,n", "h,n\na,1\n").is_err());
}

#[test]
fn labelled_output_is_compared_per_query() {
    let expected = "query,h\nq1,a\nq1,b\nquery,n,m\nq2,1,2";
    // Another interleaving of the same rows.
    assert!(compare_output(expected, "query,n,m\nq2,1,2.0\nquery,h\nq1,b\nq1,a\n").is_ok());
    let err = compare_output(expected, "query,h\nq1,a\nq1,b\n").unwrap_err();
    assert!(err.contains("query q2:"), "{err}");
    let err = compare_output(expected, "query,h\nq1,a\nquery,n,m\nq2,1,2\nq1,c\n").unwrap_err();
    assert!(
        err.contains("missing row: q1,b") && err.contains("unexpected row: q1,c"),
        "{err}"
    );
    let err = compare_output(expected, "query,h\nq1,a\nq1,b\nq2,1,2\nq3,x\n").unwrap_err();
    assert!(
        err.contains("header differs") && err.contains("unexpected rows of query q3"),
        "{err}"
    );
    assert!(compare_output(expected, "query,h\nquery,n,m\nq2,1,2\n").is_err());
}

#[test]
fn parse_case_sections() {
    let text = "# comment\n--- file m.csv\nts,host\n1000,a\n\n--- sql\nSELECT 1;\n--- args\n--format csv\n--- output\nh\n1\n--- stderr\nrows=1\n\n--- expect-file o.csv\nh\n--- error\nboom\n";
    let case = parse_case(text).unwrap();
    assert_eq!(
        case.files,
        vec![("m.csv".to_string(), "ts,host\n1000,a".to_string())]
    );
    assert_eq!(case.sql, "SELECT 1;");
    assert_eq!(case.args, Some(vec!["--format".into(), "csv".into()]));
    assert_eq!(case.output.as_deref(), Some("h\n1"));
    assert_eq!(case.stderr, vec!["rows=1".to_string()]);
    assert_eq!(case.expect_files, vec![("o.csv".into(), "h".into())]);
    assert_eq!(case.error, Some(vec!["boom".to_string()]));
    assert!(parse_case("--- file a\nx\n").is_err());
    assert!(parse_case("--- sql\nA\n--- sql\nB\n").is_err());
    assert!(parse_case("--- sqll\nA\n").is_err());
}
