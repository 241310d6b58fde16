//! What the line editor asks of the REPL: where a statement ends, and which
//! words complete the one under the cursor.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rustyline::completion::{Completer, FilenameCompleter, Pair};
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::validate::{ValidationContext, ValidationResult, Validator};
use rustyline::{Context, Helper};

use super::with_options::{self, WithCompletion};

/// How far a piece of input is from a statement that can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completeness {
    /// Only whitespace and comments.
    Empty,
    /// More lines are needed: no `;` (or `&`) ends it yet, or a quote or
    /// block comment is still open.
    Incomplete,
    /// It ends with `;` or `&` outside quotes and comments.
    Complete,
}

/// Where the text ends up after a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Code,
    Single,
    Double,
    LineComment,
    BlockComment,
}

/// The result of scanning SQL text: the mode at its end and the byte
/// offsets of its significant characters (outside comments, not
/// whitespace; characters inside quotes count).
struct Scan {
    mode: Mode,
    significant: Vec<usize>,
}

fn scan(text: &str) -> Scan {
    let mut mode = Mode::Code;
    let mut significant = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match mode {
            Mode::Code => match c {
                '\'' => {
                    mode = Mode::Single;
                    significant.push(i);
                }
                '"' => {
                    mode = Mode::Double;
                    significant.push(i);
                }
                '-' if chars.peek().is_some_and(|&(_, n)| n == '-') => {
                    chars.next();
                    mode = Mode::LineComment;
                }
                '/' if chars.peek().is_some_and(|&(_, n)| n == '*') => {
                    chars.next();
                    mode = Mode::BlockComment;
                }
                c if c.is_whitespace() => {}
                _ => significant.push(i),
            },
            Mode::Single | Mode::Double => {
                significant.push(i);
                // A doubled quote inside a literal reopens it at once.
                if (mode == Mode::Single && c == '\'') || (mode == Mode::Double && c == '"') {
                    mode = Mode::Code;
                }
            }
            Mode::LineComment => {
                if c == '\n' {
                    mode = Mode::Code;
                }
            }
            Mode::BlockComment => {
                if c == '*' && chars.peek().is_some_and(|&(_, n)| n == '/') {
                    chars.next();
                    mode = Mode::Code;
                }
            }
        }
    }
    Scan { mode, significant }
}

/// Tells whether `text` holds whole statements: a `;` (or a trailing `&`)
/// outside quotes and comments ends the last one.
pub fn completeness(text: &str) -> Completeness {
    let scan = scan(text);
    if matches!(scan.mode, Mode::Single | Mode::Double | Mode::BlockComment) {
        return Completeness::Incomplete;
    }
    match scan.significant.last() {
        None => Completeness::Empty,
        Some(&i) if matches!(text.as_bytes()[i], b';' | b'&') => Completeness::Complete,
        Some(_) => Completeness::Incomplete,
    }
}

/// True if `text` ends inside a quoted literal or identifier or a block
/// comment: a next line starting with `\` belongs to it, not a command.
pub fn inside_text(text: &str) -> bool {
    matches!(
        scan(text).mode,
        Mode::Single | Mode::Double | Mode::BlockComment
    )
}

/// Splits complete input into the SQL to run (ending with one `;`) and
/// whether it ends with `&` (run in the background): `SELECT ... &`,
/// `SELECT ...; &` and `SELECT ... &;` all do.
pub fn split_background(text: &str) -> (String, bool) {
    let scan = scan(text);
    let mut end = text.len();
    let mut background = false;
    for &i in scan.significant.iter().rev() {
        match text.as_bytes()[i] {
            b';' => end = i,
            b'&' => {
                background = true;
                end = i;
            }
            _ => break,
        }
    }
    let mut sql = text[..end].trim_end().to_string();
    sql.push(';');
    (sql, background)
}

/// The names completion offers, refreshed as statements declare streams
/// and views.
#[derive(Debug, Default, Clone)]
pub struct Names {
    /// Declared streams and views.
    pub relations: Vec<String>,
    /// The columns of every stream and view.
    pub columns: Vec<String>,
    /// DataFusion's and vigil's functions.
    pub functions: Vec<String>,
}

/// State the REPL shares with the editor's helper.
#[derive(Debug, Default)]
pub struct Shared {
    /// Names to complete.
    pub names: RwLock<Names>,
    /// The lines of the statement typed so far, before the line being
    /// edited (empty at the `vigil> ` prompt).
    pub pending: Mutex<String>,
    /// True while the line being edited is empty.
    pub line_empty: AtomicBool,
}

/// Completion, validation and a view of the line for the editor.
pub struct ReplHelper {
    shared: Arc<Shared>,
    files: FilenameCompleter,
}

impl ReplHelper {
    /// A helper reading names and pending input from `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            files: FilenameCompleter::new(),
        }
    }

    fn pending(&self) -> String {
        self.shared
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// SQL keywords offered by completion: the common ones and vigil's.
pub const KEYWORDS: &[&str] = &[
    "ALERT",
    "ALL",
    "AND",
    "AS",
    "ASC",
    "BETWEEN",
    "BIGINT",
    "BOOLEAN",
    "BY",
    "CASE",
    "CAST",
    "CHANGES",
    "CLOSE",
    "CONTROLLED",
    "CREATE",
    "DESC",
    "DISTINCT",
    "DOUBLE",
    "ELSE",
    "EMIT",
    "END",
    "EVERY",
    "EXPLAIN",
    "FALSE",
    "FOR",
    "FROM",
    "FULL",
    "GROUP",
    "HAVING",
    "HOLD",
    "HOP",
    "IN",
    "INNER",
    "INSERT",
    "INTERVAL",
    "INTO",
    "INVARIANT",
    "IS",
    "JOIN",
    "LEARN",
    "LEFT",
    "LIKE",
    "LIMIT",
    "NOT",
    "NULL",
    "ON",
    "OR",
    "ORDER",
    "OVER",
    "PARAMS",
    "PARTITION",
    "PRECEDING",
    "RANGE",
    "RIGHT",
    "ROWS",
    "SECOND",
    "MINUTE",
    "HOUR",
    "DAY",
    "SELECT",
    "SESSION",
    "SET",
    "SINK",
    "STREAM",
    "TEXT",
    "THEN",
    "TIMESTAMP",
    "TRAIN",
    "TRUE",
    "TUMBLE",
    "UNION",
    "VIEW",
    "WATERMARK",
    "WHEN",
    "WHERE",
    "WINDOW",
    "WITH",
    // DROP, CREATE OR REPLACE, SHOW and DESCRIBE.
    "ALERTS",
    "CASCADE",
    "DESCRIBE",
    "DROP",
    "EXISTS",
    "IF",
    "QUERIES",
    "REPLACE",
    "SHOW",
    "SINKS",
    "STREAMS",
    "VIEWS",
    // Live changes.
    "ALLOW",
    "ALTER",
    "LOSS",
    "QUERY",
    "SEVERITY",
    "STATE",
];

/// The dot commands, for completion.
pub const DOT_COMMANDS: &[&str] = &[
    ".describe",
    ".exit",
    ".format",
    ".group",
    ".help",
    ".queries",
    ".quit",
    ".read",
    ".stats",
    ".stop",
    ".streams",
];

/// Start of the identifier-like word that ends at `pos`.
fn word_start(line: &str, pos: usize) -> usize {
    line[..pos]
        .char_indices()
        .rev()
        .take_while(|&(_, c)| c.is_alphanumeric() || c == '_')
        .last()
        .map_or(pos, |(i, _)| i)
}

fn pairs<'a>(candidates: impl Iterator<Item = &'a str>, prefix: &str) -> Vec<Pair> {
    let lower = prefix.to_lowercase();
    let mut out: Vec<Pair> = candidates
        .filter(|c| c.to_lowercase().starts_with(&lower))
        .map(|c| Pair {
            display: c.to_string(),
            replacement: c.to_string(),
        })
        .collect();
    out.sort_by(|a, b| a.display.cmp(&b.display));
    out.dedup_by(|a, b| a.display == b.display);
    out
}

impl ReplHelper {
    /// Completes the arguments of a dot command.
    fn complete_command(
        &self,
        line: &str,
        pos: usize,
        ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        let before = &line[..pos];
        let trimmed = before.trim_start();
        let Some((command, rest)) = trimmed.split_once(char::is_whitespace) else {
            let start = pos - trimmed.len();
            return Ok((start, pairs(DOT_COMMANDS.iter().copied(), trimmed)));
        };
        let start = word_start(line, pos);
        let prefix = &line[start..pos];
        match command {
            ".read" => self.files.complete(line, pos, ctx),
            // `.group NAME DIR`: after the name, a directory.
            ".group" if rest.trim_start().contains(char::is_whitespace) => {
                self.files.complete(line, pos, ctx)
            }
            ".describe" => {
                let names = self.shared.names.read().unwrap_or_else(|e| e.into_inner());
                Ok((
                    start,
                    pairs(names.relations.iter().map(String::as_str), prefix),
                ))
            }
            ".format" => Ok((start, pairs(["table", "csv", "jsonl"].into_iter(), prefix))),
            _ => Ok((pos, Vec::new())),
        }
    }
}

impl Completer for ReplHelper {
    type Candidate = Pair;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        let pending = self.pending();
        if pending.trim().is_empty() && line.trim_start().starts_with('.') {
            return self.complete_command(line, pos, ctx);
        }
        let before = format!("{pending}{}", &line[..pos]);
        let in_quotes = scan(&before).mode == Mode::Single;
        let start = word_start(line, pos);
        let prefix = &line[start..pos];
        match with_options::complete(&before, in_quotes) {
            Some(WithCompletion::Connector(names)) => {
                return Ok((start, pairs(names.into_iter(), prefix)));
            }
            Some(WithCompletion::Option(names)) => {
                return Ok((start, pairs(names.iter().map(String::as_str), prefix)));
            }
            None => {}
        }
        // Inside a string literal, complete file names: `path = 'da<TAB>`.
        if in_quotes {
            return self.files.complete_path(line, pos);
        }
        if prefix.is_empty() {
            return Ok((pos, Vec::new()));
        }
        // Keywords keep the case of what was typed: `sel` gives `select`.
        let lower_case = prefix.chars().all(|c| !c.is_uppercase());
        let keywords: Vec<String> = KEYWORDS
            .iter()
            .map(|k| {
                if lower_case {
                    k.to_lowercase()
                } else {
                    k.to_string()
                }
            })
            .collect();
        let names = self.shared.names.read().unwrap_or_else(|e| e.into_inner());
        let candidates = keywords
            .iter()
            .chain(&names.relations)
            .chain(&names.columns)
            .chain(&names.functions)
            .map(String::as_str);
        Ok((start, pairs(candidates, prefix)))
    }
}

impl Hinter for ReplHelper {
    type Hint = String;

    /// Shows no hint; notes whether the line is empty, which decides what
    /// Ctrl-C at the prompt does.
    fn hint(&self, line: &str, _pos: usize, _ctx: &Context<'_>) -> Option<String> {
        self.shared
            .line_empty
            .store(line.is_empty(), Ordering::Relaxed);
        None
    }
}

impl Highlighter for ReplHelper {
    fn highlight<'l>(&self, line: &'l str, _pos: usize) -> Cow<'l, str> {
        Cow::Borrowed(line)
    }
}

impl Validator for ReplHelper {
    /// Lines typed one by one return at once (the REPL shows the
    /// continuation prompt and reads on); a buffer of several lines, as
    /// recalled from history and edited, stays open until its statement is
    /// complete.
    fn validate(&self, ctx: &mut ValidationContext<'_>) -> rustyline::Result<ValidationResult> {
        let input = ctx.input();
        if !input.contains('\n') {
            return Ok(ValidationResult::Valid(None));
        }
        let text = format!("{}{input}", self.pending());
        Ok(match completeness(&text) {
            Completeness::Incomplete => ValidationResult::Incomplete,
            Completeness::Empty | Completeness::Complete => ValidationResult::Valid(None),
        })
    }
}

impl Helper for ReplHelper {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_semicolon_outside_quotes_and_comments_ends_a_statement() {
        use Completeness::*;
        assert_eq!(completeness(""), Empty);
        assert_eq!(completeness("  -- just a comment\n"), Empty);
        assert_eq!(completeness("SELECT 1"), Incomplete);
        assert_eq!(completeness("SELECT 1;"), Complete);
        assert_eq!(completeness("SELECT 1; -- done\n"), Complete);
        assert_eq!(completeness("SELECT ';"), Incomplete);
        assert_eq!(completeness("SELECT ';'"), Incomplete);
        assert_eq!(completeness("SELECT ';';"), Complete);
        assert_eq!(completeness("SELECT 'it''s';"), Complete);
        assert_eq!(completeness("SELECT \"a;\""), Incomplete);
        assert_eq!(completeness("SELECT 1 -- ;"), Incomplete);
        assert_eq!(completeness("SELECT 1 /* ; */"), Incomplete);
        assert_eq!(completeness("SELECT 1 /* ;"), Incomplete);
        assert_eq!(
            completeness("CREATE STREAM m (\n ts TIMESTAMP);\n"),
            Complete
        );
        assert_eq!(completeness("SELECT * FROM m &"), Complete);
    }

    #[test]
    fn a_backslash_line_is_text_only_inside_quotes_and_comments() {
        assert!(!inside_text(""));
        assert!(!inside_text("SELECT 1\n"));
        assert!(!inside_text("SELECT 1 -- it's\n"));
        assert!(inside_text("SELECT 'a\n"));
        assert!(inside_text("SELECT \"a\n"));
        assert!(inside_text("SELECT 1 /* a\n"));
    }

    #[test]
    fn a_trailing_ampersand_runs_in_the_background() {
        let cases = [
            ("SELECT * FROM m;", "SELECT * FROM m;", false),
            ("SELECT * FROM m &", "SELECT * FROM m;", true),
            ("SELECT * FROM m; &", "SELECT * FROM m;", true),
            ("SELECT * FROM m &;\n", "SELECT * FROM m;", true),
            ("SELECT a & b FROM m;", "SELECT a & b FROM m;", false),
            ("SELECT '&' FROM m; -- &", "SELECT '&' FROM m;", false),
        ];
        for (input, sql, background) in cases {
            assert_eq!(
                split_background(input),
                (sql.to_string(), background),
                "{input}"
            );
        }
    }

    #[test]
    fn words_start_after_the_last_separator() {
        assert_eq!(word_start("SELECT av", 9), 7);
        assert_eq!(word_start("SELECT ", 7), 7);
        assert_eq!(word_start("x.cp", 4), 2);
    }
}
