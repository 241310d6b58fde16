//! `vigil check`: parse and plan scripts without running them.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use datafusion::sql::sqlparser::tokenizer::Location;

use crate::connector::{SinkTarget, SourceLocation};
use crate::connectors::sink::{check_same_columns, column_names};
use crate::engine::{Engine, Outcome, PreparedQuery, script_dir};
use crate::sql::{Statement, StatementKind, parse_statements, render_error, split_rendered};

/// What checking a set of scripts found.
#[derive(Debug, Default)]
pub(super) struct CheckReport {
    /// Files given.
    pub files: usize,
    /// Statements seen, whether they parsed or not.
    pub statements: usize,
    /// Each error as it is printed: `FILE:LINE:COLUMN: message`, then the
    /// source line with a caret when there is one.
    pub errors: Vec<String>,
    /// Each warning as it is printed: `FILE:LINE:COLUMN: warning: ...`.
    /// Warnings do not fail the check.
    pub warnings: Vec<String>,
}

impl CheckReport {
    /// The one-line summary.
    pub fn summary(&self) -> String {
        let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        let verdict = match self.errors.len() {
            0 => "ok".to_string(),
            n => plural(n, "error"),
        };
        let warnings = match self.warnings.len() {
            0 => String::new(),
            n => format!(" ({})", plural(n, "warning")),
        };
        format!(
            "vigil check: {}, {}, {verdict}{warnings}",
            plural(self.files, "file"),
            plural(self.statements, "statement")
        )
    }
}

/// Parses and plans every statement of every file, in order and against
/// one catalog (as `vigil run` would), without opening any source or sink.
/// Goes on after errors: a statement that does not parse or plan is
/// skipped, so later ones that need it may fail too.
pub(super) fn check_files(engine: &mut Engine, files: &[PathBuf]) -> CheckReport {
    let mut report = CheckReport {
        files: files.len(),
        ..CheckReport::default()
    };
    let mut sinks = SinkColumns::default();
    for file in files {
        check_file(engine, &mut sinks, file, &mut report);
    }
    report
}

/// Checks each file on its own, each with a fresh engine from `engine`:
/// independent alert files that each declare the same stream all pass.
pub(super) fn check_each(engine: impl Fn() -> Engine, files: &[PathBuf]) -> CheckReport {
    let mut report = CheckReport {
        files: files.len(),
        ..CheckReport::default()
    };
    for file in files {
        check_file(
            &mut engine(),
            &mut SinkColumns::default(),
            file,
            &mut report,
        );
    }
    report
}

/// The columns the first query writing to each file sink writes, and
/// where that query is: every later query writing to the file must write
/// the same (a run shares one writer and one CSV header between them).
#[derive(Default)]
pub(super) struct SinkColumns {
    seen: HashMap<PathBuf, (Vec<String>, String)>,
}

impl SinkColumns {
    /// Takes note of `query` (at `place`), or the message for a query
    /// writing other columns than an earlier one to the same file.
    pub fn add(&mut self, query: &PreparedQuery, place: String) -> Result<(), String> {
        let Some(sink) = &query.sink else {
            return Ok(());
        };
        let SinkTarget::File(path) = &sink.target else {
            return Ok(());
        };
        let key = std::path::absolute(path).unwrap_or_else(|_| path.clone());
        let columns = column_names(&query.graph.schema);
        match self.seen.get(&key) {
            Some((first, at)) => check_same_columns(&sink.name, path, first, &columns)
                .map_err(|e| format!("{e} (the first query is at {at})")),
            None => {
                self.seen.insert(key, (columns, place));
                Ok(())
            }
        }
    }
}

fn check_file(engine: &mut Engine, sinks: &mut SinkColumns, file: &Path, report: &mut CheckReport) {
    // Checking opens no source: `EXPLAIN ANALYZE` is planned, not run.
    engine.set_plan_only(true);
    let name = file.display();
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => {
            report.errors.push(format!("{name}: cannot read: {e}"));
            return;
        }
    };
    let statements = match parse_statements(&text) {
        Ok(statements) => statements,
        Err(e) => {
            // Not even the statements' boundaries are known.
            report.errors.push(located(&name, &e.to_string()));
            return;
        }
    };
    let base = script_dir(file);
    for statement in statements {
        report.statements += 1;
        let error = match statement {
            Err(e) => located(&name, &e.to_string()),
            Ok(statement) => match engine.execute(&statement, &base) {
                Ok(Outcome::Query(query)) => {
                    let place = format!("{name}:{}:{}", statement.line, statement.column);
                    match sinks.add(&query, place) {
                        Ok(()) => continue,
                        Err(e) => at_statement(&name, &text, &statement, &e, None),
                    }
                }
                Ok(_) => {
                    if let Some(warning) = missing_file(engine, &statement) {
                        report.warnings.push(format!(
                            "{name}:{}:{}: warning: {warning}",
                            statement.line, statement.column
                        ));
                    }
                    continue;
                }
                Err(e) => at_statement(&name, &text, &statement, &e.to_string(), e.location()),
            },
        };
        report.errors.push(error);
    }
}

/// The warning for a `CREATE STREAM` reading a file that does not exist
/// (yet: it may appear before the run, so this is no error).
fn missing_file(engine: &Engine, statement: &Statement) -> Option<String> {
    let StatementKind::CreateStream(create) = &statement.kind else {
        return None;
    };
    let stream = engine.catalog().stream(&create.name)?;
    let SourceLocation::File(path) = &stream.source.location else {
        return None;
    };
    if path.exists() {
        return None;
    }
    // `./m.csv` is shown as the script wrote it: `m.csv`.
    let shown = path.strip_prefix(".").unwrap_or(path);
    Some(format!(
        "stream '{}' reads '{}', which does not exist",
        create.name,
        shown.display()
    ))
}

/// A parse error (which carries its position) as `FILE:LINE:COLUMN: ...`.
pub(super) fn located(file: &impl std::fmt::Display, rendered: &str) -> String {
    match split_rendered(rendered) {
        Some((message, at, caret)) => {
            format!("{file}:{}:{}: {message}\n{caret}", at.line, at.column)
        }
        None => format!("{file}: {rendered}"),
    }
}

/// A planning error: at `place` (line, column) when it knows where it is,
/// else at the start of its statement.
fn at_statement(
    file: &impl std::fmt::Display,
    sql: &str,
    statement: &Statement,
    message: &str,
    place: Option<(u64, u64)>,
) -> String {
    let (line, column) = place.unwrap_or((statement.line, statement.column));
    let at = Location::new(line, column);
    let mut out = format!("{file}:{}:{}: {message}", at.line, at.column);
    if let Some((_, _, caret)) = split_rendered(&render_error(sql, "", at)) {
        let _ = write!(out, "\n{caret}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(files: &[(&str, &str)]) -> CheckReport {
        let dir = tempfile::tempdir().unwrap();
        // Every file is written; the `.sql` ones are checked.
        let paths: Vec<PathBuf> = files
            .iter()
            .map(|(name, body)| {
                let path = dir.path().join(name);
                std::fs::write(&path, body).unwrap();
                path
            })
            .filter(|path| path.extension().is_some_and(|e| e == "sql"))
            .collect();
        let mut report = check_files(&mut Engine::new(), &paths);
        let prefix = format!("{}/", dir.path().display());
        for message in report.errors.iter_mut().chain(&mut report.warnings) {
            *message = message.replace(&prefix, "");
        }
        report
    }

    #[test]
    fn a_stream_over_a_missing_file_is_a_warning() {
        let report = check(&[("a.sql", &format!("\n  {STREAM}\nSELECT host FROM m;"))]);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert_eq!(
            report.warnings,
            ["a.sql:2:3: warning: stream 'm' reads 'm.csv', which does not exist"]
        );
        assert_eq!(
            report.summary(),
            "vigil check: 1 file, 2 statements, ok (1 warning)"
        );
    }

    #[test]
    fn queries_sharing_a_file_sink_must_write_the_same_columns() {
        let sql = format!(
            "{STREAM}\nCREATE SINK out WITH (path = 'out.csv');\n\
             INSERT INTO out SELECT host, cpu FROM m;\n\
             INSERT INTO out SELECT host, cpu FROM m WHERE cpu > 1;\n\
             INSERT INTO out SELECT cpu, host FROM m;"
        );
        let report = check(&[("a.sql", &sql), ("m.csv", "")]);
        assert_eq!(report.errors.len(), 1, "{:#?}", report.errors);
        assert!(
            report.errors[0].starts_with(
                "a.sql:5:1: sink 'out': the queries writing to out.csv must write the same columns, \
                 but one writes (host, cpu) and another (cpu, host) (the first query is at a.sql:3:1)"
            ),
            "{}",
            report.errors[0]
        );
    }

    const STREAM: &str =
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE) WITH (path = 'm.csv');";

    #[test]
    fn a_good_script_is_ok() {
        let report = check(&[
            ("a.sql", STREAM),
            ("m.csv", ""),
            (
                "b.sql",
                "SELECT host FROM m;\nSELECT cpu FROM m WHERE cpu > 1;",
            ),
        ]);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert_eq!(report.summary(), "vigil check: 2 files, 3 statements, ok");
    }

    #[test]
    fn every_error_is_reported_with_its_position() {
        let report = check(&[
            (
                "a.sql",
                &format!(
                    "{STREAM}\nSELECT nosuch FROM m;\nSELECT host FROM m WHERE;\n  SELECT * FROM nope;\nSELECT host FROM m;"
                ),
            ),
            ("m.csv", ""),
        ]);
        assert_eq!(report.statements, 5);
        assert_eq!(report.errors.len(), 3, "{:#?}", report.errors);
        assert!(
            report.errors[0].starts_with("a.sql:2:8: unknown column 'nosuch'"),
            "{}",
            report.errors[0]
        );
        assert!(
            report.errors[1].starts_with("a.sql:3:25: Expected: an expression"),
            "{}",
            report.errors[1]
        );
        assert!(
            report.errors[1]
                .ends_with(" 3 | SELECT host FROM m WHERE;\n   |                         ^"),
            "{}",
            report.errors[1]
        );
        assert!(
            report.errors[2].starts_with("a.sql:4:17: unknown stream 'nope'"),
            "{}",
            report.errors[2]
        );
        assert_eq!(
            report.summary(),
            "vigil check: 1 file, 5 statements, 3 errors"
        );
    }

    #[test]
    fn unreadable_and_untokenizable_files_are_errors() {
        let report = check(&[("a.sql", "SELECT 'open")]);
        assert_eq!(report.errors.len(), 1);
        assert!(
            report.errors[0].starts_with("a.sql:1:"),
            "{:?}",
            report.errors
        );
        let mut report = check_files(&mut Engine::new(), &[PathBuf::from("/nonexistent/x.sql")]);
        assert!(
            report
                .errors
                .remove(0)
                .starts_with("/nonexistent/x.sql: cannot read: "),
        );
    }
}
