//! The parser: vigil's statements on top of sqlparser, the way DataFusion's
//! `DFParser` wraps it.
//!
//! Standard SQL (`SELECT`, `INSERT INTO`, `EXPLAIN`) is parsed by sqlparser;
//! `CREATE STREAM` (with its `WATERMARK FOR` clause) and `CREATE SINK` are
//! parsed here from the same token stream. Every error carries the line and
//! column of the offending token and renders it with a caret.

mod alert;
mod alter;
mod column_type;
mod error;
mod invariant;
pub mod limits;

use datafusion::sql::sqlparser::ast::{
    self, DataType, Expr, Ident, ObjectName, Query, TableObject, Value,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{
    Location, Span, Token, TokenWithSpan, Tokenizer, Word,
};

use crate::error::{Error, Result};
pub use alert::{AlertClause, AlertCondition, Hold};
pub use alter::AlertChange;
pub use error::{render_error, split_rendered};
pub use invariant::{InvariantClause, Learn};

/// One statement of a script, with where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    /// What the statement says.
    pub kind: StatementKind,
    /// 1-based line of its first token.
    pub line: u64,
    /// 1-based column of its first token.
    pub column: u64,
    /// `CREATE OR REPLACE`: the declaration replaces one of the same name
    /// and kind, if there is one.
    pub or_replace: bool,
}

/// The kinds of named entries that `DROP` and `CREATE OR REPLACE` act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// `CREATE STREAM`.
    Stream,
    /// `CREATE VIEW`.
    View,
    /// `CREATE SINK`.
    Sink,
    /// `CREATE ALERT`.
    Alert,
    /// `CREATE INVARIANT`.
    Invariant,
}

impl ObjectKind {
    /// Every kind, with the keyword that names it in SQL.
    pub const ALL: [(ObjectKind, &'static str); 5] = [
        (ObjectKind::Stream, "STREAM"),
        (ObjectKind::View, "VIEW"),
        (ObjectKind::Sink, "SINK"),
        (ObjectKind::Alert, "ALERT"),
        (ObjectKind::Invariant, "INVARIANT"),
    ];

    /// The SQL keyword: `STREAM`, `VIEW`, ...
    pub fn keyword(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(kind, _)| *kind == self)
            .map_or("", |(_, word)| word)
    }

    /// The word for messages: `stream`, `view`, ...
    pub fn noun(self) -> String {
        self.keyword().to_ascii_lowercase()
    }

    /// The word with its article: `a stream`, `an alert`.
    pub fn a(self) -> String {
        match self {
            ObjectKind::Alert | ObjectKind::Invariant => format!("an {self}"),
            _ => format!("a {self}"),
        }
    }
}

impl std::fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.noun())
    }
}

/// What `SHOW` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    /// `SHOW STREAMS`: the declared streams, views, alerts and invariants
    /// (everything a query can read by name).
    Streams,
    /// `SHOW VIEWS`.
    Views,
    /// `SHOW ALERTS`.
    Alerts,
    /// `SHOW SINKS`.
    Sinks,
    /// `SHOW QUERIES`: the running queries.
    Queries,
}

/// The statements vigil understands.
#[derive(Debug, Clone, PartialEq)]
pub enum StatementKind {
    /// `CREATE STREAM name (...) [WITH (...)]`.
    CreateStream(Box<CreateStream>),
    /// `CREATE SINK name WITH (...)`.
    CreateSink(CreateSink),
    /// A continuous query, optionally routed with `INSERT INTO sink`.
    Query {
        /// The query.
        query: Box<Query>,
        /// The sink named by `INSERT INTO`, if any.
        sink: Option<String>,
        /// The `EMIT` clause, if any.
        emit: Option<Emit>,
        /// The `ALERT` clause, if any.
        alert: Option<Box<AlertClause>>,
    },
    /// `EXPLAIN [ANALYZE] <query> [EMIT ...] [ALERT ...]`.
    Explain {
        /// `EXPLAIN ANALYZE`: run the query to the end of its input and
        /// show what each operator took, gave and cost.
        analyze: bool,
        /// The query.
        query: Box<Query>,
        /// The `EMIT` clause, if any.
        emit: Option<Emit>,
        /// The `ALERT` clause, if any.
        alert: Option<Box<AlertClause>>,
    },
    /// `CREATE ALERT name AS <query> [EMIT ...] ALERT ...`: an alert whose
    /// state changes later queries can read by name.
    CreateAlert {
        /// Alert name.
        name: String,
        /// The query it watches.
        query: Box<Query>,
        /// The `EMIT` clause, if any.
        emit: Option<Emit>,
        /// The `ALERT` clause (always present once parsed).
        alert: Option<Box<AlertClause>>,
    },
    /// `CREATE VIEW name AS <query>`: a named query that later queries can
    /// read like a stream.
    CreateView {
        /// View name.
        name: String,
        /// Its query.
        query: Box<Query>,
    },
    /// `CREATE INVARIANT name AS <query> LEARN ...`: a named stream of the
    /// query's rows after training, each judged against what was learned.
    CreateInvariant {
        /// Invariant name.
        name: String,
        /// The query whose rows are learned and judged.
        query: Box<Query>,
        /// The `LEARN` clause (always present once parsed).
        clause: Option<Box<InvariantClause>>,
    },
    /// `DROP STREAM|VIEW|SINK|ALERT|INVARIANT [IF EXISTS] name [CASCADE]`.
    Drop {
        /// What kind of entry is dropped.
        kind: ObjectKind,
        /// Its name.
        name: String,
        /// `IF EXISTS`: a missing entry is not an error.
        if_exists: bool,
        /// `CASCADE`: the views, alerts and invariants that read the entry
        /// are dropped too (without it, they make the statement fail).
        cascade: bool,
    },
    /// `SHOW STREAMS|VIEWS|ALERTS|SINKS|QUERIES`.
    Show(Show),
    /// `DESCRIBE name`: the columns of a stream, view, alert or invariant.
    Describe {
        /// The name described.
        name: String,
    },
    /// `ALTER ALERT name SET ... [ALLOW STATE LOSS]`: the running alert
    /// goes on with its clause changed.
    AlterAlert {
        /// The alert.
        name: String,
        /// What changes.
        change: Box<AlertChange>,
        /// `ALLOW STATE LOSS`: operators whose state does not fit the
        /// changed query may start empty (else the change is refused).
        allow_state_loss: bool,
    },
    /// `ALTER QUERY id|name SET parallelism = n [ALLOW STATE LOSS]`: the
    /// running query goes on with `n` instances of its keyed stages.
    AlterQuery {
        /// Its id as `SHOW QUERIES` lists it, or its name.
        query: String,
        /// Instances of each key-partitioned stage.
        parallelism: usize,
        /// `ALLOW STATE LOSS`, as for [`StatementKind::AlterAlert`].
        allow_state_loss: bool,
    },
    /// `SET name = value`: a setting for the statements that follow.
    Set {
        /// Setting name, lower-cased.
        name: String,
        /// Its value as written (a string, number or word).
        value: String,
    },
}

/// The `EMIT` clause: when a query's results are sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Emit {
    /// `EMIT ON WINDOW CLOSE`: one final row per window and key.
    OnWindowClose,
    /// `EMIT EVERY INTERVAL '...'`: early partial results at that period of
    /// processing time, then the final row.
    Every(Box<Expr>),
    /// `EMIT CHANGES`: a changelog, one row per change of a result.
    Changes,
}

/// `CREATE STREAM`: a named, typed, unbounded input.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateStream {
    /// Stream name, normalised like DataFusion table names.
    pub name: String,
    /// Declared columns in order.
    pub columns: Vec<ColumnDef>,
    /// The `WATERMARK FOR` clause, if any.
    pub watermark: Option<WatermarkDef>,
    /// `WITH (key = 'value')` options; keys lower-cased.
    pub options: Vec<(String, String)>,
}

/// One declared column.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnDef {
    /// Column name (unquoted names are lower-cased, quoted ones kept).
    pub name: String,
    /// Declared SQL type.
    pub data_type: DataType,
    /// Where the column was declared, for error messages.
    pub location: Location,
}

/// `WATERMARK FOR col AS col - INTERVAL '...'`.
#[derive(Debug, Clone, PartialEq)]
pub struct WatermarkDef {
    /// The event-time column.
    pub column: String,
    /// The delay expression (`INTERVAL '2' SECOND`); `None` means no delay.
    pub delay: Option<Expr>,
    /// Where the clause starts.
    pub location: Location,
}

/// `CREATE SINK name WITH (...)`.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateSink {
    /// Sink name.
    pub name: String,
    /// `WITH` options; keys lower-cased.
    pub options: Vec<(String, String)>,
}

/// Parses a whole script of `;`-separated statements; stops at the first
/// error.
pub fn parse_script(sql: &str) -> Result<Vec<Statement>> {
    parse_statements(sql)?.into_iter().collect()
}

/// Parses a script statement by statement, going on after a statement that
/// does not parse: one result per statement, in order. Fails as a whole
/// only when the text cannot be cut into tokens (an unterminated string or
/// comment), as then the statements' boundaries are unknown.
///
/// Statements past the [`limits`] are refused with an error that names
/// the limit.
pub fn parse_statements(sql: &str) -> Result<Vec<Result<Statement>>> {
    limits::on_large_stack(|| parse_statements_here(sql))
}

fn parse_statements_here(sql: &str) -> Result<Vec<Result<Statement>>> {
    let tokens = Tokenizer::new(&DIALECT, sql)
        .tokenize_with_location()
        .map_err(|e| Error::Parse(render_error(sql, &e.message, e.location)))?;
    Ok(split_statements(tokens, sql)
        .into_iter()
        .filter_map(|chunk| parse_statement(sql, chunk).transpose())
        .collect())
}

/// Parses the tokens of one statement; `None` when there are only blanks.
fn parse_statement(sql: &str, chunk: Vec<TokenWithSpan>) -> Result<Option<Statement>> {
    let Some(start) = chunk.iter().find(|t| !is_blank(&t.token)) else {
        return Ok(None);
    };
    if matches!(start.token, Token::SemiColon | Token::EOF) {
        return Ok(None);
    }
    let start = start.span.start;
    let (line, column) = (start.line, start.column);
    limits::check_tokens(sql, &chunk, start)?;
    let (chunk, or_replace) = strip_or_replace(chunk);
    if or_replace && let Some(what) = chunk.iter().filter(|t| !is_blank(&t.token)).nth(1) {
        let declares = |t: &Token| {
            matches!(t, Token::Word(w)
                if ObjectKind::ALL.iter().any(|(_, word)| is_word(w, word)))
        };
        if !declares(&what.token) {
            return Err(Error::Parse(render_error(
                sql,
                "OR REPLACE belongs to CREATE STREAM, VIEW, SINK, ALERT or INVARIANT",
                what.span.start,
            )));
        }
    }
    // The EMIT and ALERT clauses are vigil's, and sqlparser would read
    // `EMIT` or `ALERT` as a table alias: parse them apart from the
    // statement they end.
    let (body, learn) = split_at(chunk, invariant::learn_position);
    let (body, alert) = split_at(body, alert::alert_position);
    let (body, emit) = split_at(body, emit_position);
    let kind = ScriptParser::new(sql, body).parse_one()?;
    let kind = match emit {
        None => kind,
        Some(tokens) => attach_emit(sql, kind, tokens)?,
    };
    let kind = match alert {
        None => kind,
        Some(tokens) => alert::attach_alert(sql, kind, tokens)?,
    };
    let kind = match learn {
        None => kind,
        Some(tokens) => invariant::attach_learn(sql, kind, tokens)?,
    };
    limits::check_statement(sql, &kind, start)?;
    if let StatementKind::CreateInvariant { clause: None, .. } = kind {
        return Err(Error::Parse(render_error(
            sql,
            "CREATE INVARIANT needs a LEARN SET|RANGE OF ... TRAIN FOR ... clause after its query",
            start,
        )));
    }
    if let StatementKind::CreateAlert { alert: None, .. } = kind {
        return Err(Error::Parse(render_error(
            sql,
            "CREATE ALERT needs an ALERT WHEN ... clause after its query",
            start,
        )));
    }
    Ok(Some(Statement {
        kind,
        line,
        column,
        or_replace,
    }))
}

/// The kind and name of the entry a `CREATE` statement declares; `None`
/// for the other statements.
pub fn declared_name(kind: &StatementKind) -> Option<(ObjectKind, &str)> {
    Some(match kind {
        StatementKind::CreateStream(create) => (ObjectKind::Stream, create.name.as_str()),
        StatementKind::CreateSink(create) => (ObjectKind::Sink, create.name.as_str()),
        StatementKind::CreateView { name, .. } => (ObjectKind::View, name.as_str()),
        StatementKind::CreateAlert { name, .. } => (ObjectKind::Alert, name.as_str()),
        StatementKind::CreateInvariant { name, .. } => (ObjectKind::Invariant, name.as_str()),
        _ => return None,
    })
}

/// Takes `OR REPLACE` out of a statement that starts `CREATE OR REPLACE`,
/// so that the rest parses like a plain `CREATE`; true if it was there.
fn strip_or_replace(chunk: Vec<TokenWithSpan>) -> (Vec<TokenWithSpan>, bool) {
    let words: Vec<usize> = chunk
        .iter()
        .enumerate()
        .filter(|(_, t)| !is_blank(&t.token))
        .map(|(i, _)| i)
        .take(3)
        .collect();
    let is = |k: usize, text: &str| {
        words
            .get(k)
            .is_some_and(|&i| matches!(&chunk[i].token, Token::Word(w) if is_word(w, text)))
    };
    if !(is(0, "CREATE") && is(1, "OR") && is(2, "REPLACE")) {
        return (chunk, false);
    }
    let (or, replace) = (words[1], words[2]);
    let kept = chunk
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != or && *i != replace)
        .map(|(_, t)| t)
        .collect();
    (kept, true)
}

fn is_blank(token: &Token) -> bool {
    matches!(token, Token::Whitespace(_))
}

/// Cuts the tokens into statements, each ending with its `;` (or an EOF
/// token placed at the end of the text).
fn split_statements(tokens: Vec<TokenWithSpan>, sql: &str) -> Vec<Vec<TokenWithSpan>> {
    let mut chunks = vec![Vec::new()];
    for token in tokens {
        let ends = token.token == Token::SemiColon;
        chunks.last_mut().expect("never empty").push(token);
        if ends {
            chunks.push(Vec::new());
        }
    }
    let end = end_of(sql);
    let last = chunks.last_mut().expect("never empty");
    last.push(TokenWithSpan::new(Token::EOF, Span::new(end, end)));
    chunks
}

/// The location just past the last character of the text.
fn end_of(sql: &str) -> Location {
    let line = sql.lines().count().max(1) as u64;
    let column = sql.lines().last().map_or(0, |l| l.chars().count()) as u64 + 1;
    Location { line, column }
}

/// Splits a statement's tokens where `position` finds a clause of vigil's
/// (`EMIT ...`, `ALERT ...`): the statement (with the terminator) and the
/// clause (likewise).
fn split_at(
    tokens: Vec<TokenWithSpan>,
    position: fn(&[TokenWithSpan]) -> Option<usize>,
) -> (Vec<TokenWithSpan>, Option<Vec<TokenWithSpan>>) {
    match position(&tokens) {
        None => (tokens, None),
        Some(index) => {
            let mut body = tokens;
            let clause = body.split_off(index);
            body.push(clause.last().cloned().expect("a terminator"));
            (body, Some(clause))
        }
    }
}

/// Index of the `EMIT` that starts a top-level emit clause, if any.
fn emit_position(tokens: &[TokenWithSpan]) -> Option<usize> {
    let words: Vec<(usize, &Token)> = tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| !is_blank(&t.token))
        .map(|(i, t)| (i, &t.token))
        .collect();
    let mut depth = 0i32;
    for (k, (index, token)) in words.iter().enumerate() {
        match token {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            Token::Word(w) if depth == 0 && is_word(w, "EMIT") => {
                let starts_clause = matches!(words.get(k + 1), Some((_, Token::Word(n)))
                    if ["CHANGES", "ON", "EVERY"].iter().any(|kw| is_word(n, kw)));
                if starts_clause {
                    return Some(*index);
                }
            }
            _ => {}
        }
    }
    None
}

fn is_word(word: &Word, text: &str) -> bool {
    word.quote_style.is_none() && word.value.eq_ignore_ascii_case(text)
}

fn attach_emit(
    sql: &str,
    kind: StatementKind,
    tokens: Vec<TokenWithSpan>,
) -> Result<StatementKind> {
    let at = tokens[0].span.start;
    let mut parser = ScriptParser::new(sql, tokens);
    let emit = parser.parse_emit()?;
    parser.expect_end()?;
    match kind {
        StatementKind::Query { query, sink, .. } => Ok(StatementKind::Query {
            query,
            sink,
            emit,
            alert: None,
        }),
        StatementKind::Explain { analyze, query, .. } => Ok(StatementKind::Explain {
            analyze,
            query,
            emit,
            alert: None,
        }),
        StatementKind::CreateAlert { name, query, .. } => Ok(StatementKind::CreateAlert {
            name,
            query,
            emit,
            alert: None,
        }),
        _ => Err(Error::Parse(render_error(
            sql,
            "EMIT belongs to a query",
            at,
        ))),
    }
}

/// Normalises an identifier the way DataFusion does: unquoted names are
/// lower-cased, quoted names are kept as written.
pub fn normalize_ident(ident: &Ident) -> String {
    match ident.quote_style {
        Some(_) => ident.value.clone(),
        None => ident.value.to_ascii_lowercase(),
    }
}

struct ScriptParser<'a> {
    sql: &'a str,
    parser: Parser<'a>,
}

const DIALECT: GenericDialect = GenericDialect {};

impl<'a> ScriptParser<'a> {
    /// A parser over one statement's tokens (ending with its terminator).
    fn new(sql: &'a str, tokens: Vec<TokenWithSpan>) -> Self {
        let parser = Parser::new(&DIALECT).with_tokens_with_locations(tokens);
        Self { sql, parser }
    }

    /// Parses the one statement and checks nothing follows it.
    fn parse_one(mut self) -> Result<StatementKind> {
        let kind = self.parse_statement()?;
        self.expect_end()?;
        Ok(kind)
    }

    fn expect_end(&mut self) -> Result<()> {
        let next = self.parser.peek_token();
        if matches!(next.token, Token::SemiColon | Token::EOF) {
            return Ok(());
        }
        Err(self.error_at(
            &format!("Expected: end of statement (;), found: {}", next.token),
            next.span.start,
        ))
    }

    fn parse_statement(&mut self) -> Result<StatementKind> {
        if self.peek_words(&["CREATE", "STREAM"]) {
            self.parser.next_token();
            self.parser.next_token();
            return self
                .parse_create_stream()
                .map(|s| StatementKind::CreateStream(Box::new(s)));
        }
        if self.peek_words(&["SET"]) {
            self.parser.next_token();
            return self.parse_set();
        }
        if self.peek_words(&["DROP"]) {
            self.parser.next_token();
            return self.parse_drop();
        }
        if self.peek_words(&["ALTER", "ALERT"]) || self.peek_words(&["ALTER", "QUERY"]) {
            self.parser.next_token();
            return self.parse_alter();
        }
        if self.peek_words(&["SHOW"]) {
            self.parser.next_token();
            return self.parse_show();
        }
        if self.peek_words(&["DESCRIBE"]) || self.peek_words(&["DESC"]) {
            self.parser.next_token();
            let name = self.parse_name()?;
            return Ok(StatementKind::Describe { name });
        }
        if self.peek_words(&["CREATE", "INVARIANT"]) {
            self.parser.next_token();
            self.parser.next_token();
            let (name, query) = self.parse_create_invariant()?;
            return Ok(StatementKind::CreateInvariant {
                name,
                query,
                clause: None,
            });
        }
        if self.peek_words(&["CREATE", "ALERT"]) {
            self.parser.next_token();
            self.parser.next_token();
            return self.parse_create_alert();
        }
        if self.peek_words(&["CREATE", "SINK"]) {
            self.parser.next_token();
            self.parser.next_token();
            return self.parse_create_sink().map(StatementKind::CreateSink);
        }
        let start = self.parser.peek_token().span.start;
        let statement = self.parser.parse_statement().map_err(|e| self.wrap(e))?;
        self.classify(statement, start)
    }

    /// `EMIT ON WINDOW CLOSE | EMIT EVERY <interval> | EMIT CHANGES`.
    fn parse_emit(&mut self) -> Result<Option<Emit>> {
        if !self.peek_words(&["EMIT"]) {
            return Ok(None);
        }
        self.parser.next_token();
        if self.peek_words(&["CHANGES"]) {
            self.parser.next_token();
            return Ok(Some(Emit::Changes));
        }
        if self.peek_words(&["ON", "WINDOW", "CLOSE"]) {
            for _ in 0..3 {
                self.parser.next_token();
            }
            return Ok(Some(Emit::OnWindowClose));
        }
        if self.peek_words(&["EVERY"]) {
            self.parser.next_token();
            let interval = self.parser.parse_expr().map_err(|e| self.wrap(e))?;
            return Ok(Some(Emit::Every(Box::new(interval))));
        }
        Err(self.unexpected("CHANGES, ON WINDOW CLOSE or EVERY INTERVAL '...'"))
    }

    /// Maps a standard statement onto the ones vigil runs.
    fn classify(&self, statement: ast::Statement, start: Location) -> Result<StatementKind> {
        match statement {
            ast::Statement::Query(query) => Ok(StatementKind::Query {
                query,
                sink: None,
                emit: None,
                alert: None,
            }),
            ast::Statement::Insert(insert) => {
                let TableObject::TableName(name) = &insert.table else {
                    return Err(self.error_at("INSERT INTO needs a sink name", start));
                };
                let Some(source) = insert.source else {
                    return Err(self.error_at("INSERT INTO needs a SELECT", start));
                };
                Ok(StatementKind::Query {
                    query: source,
                    sink: Some(object_name(name)),
                    emit: None,
                    alert: None,
                })
            }
            ast::Statement::CreateView(view) => Ok(StatementKind::CreateView {
                name: object_name(&view.name),
                query: view.query,
            }),
            ast::Statement::Explain {
                statement, analyze, ..
            } => match *statement {
                ast::Statement::Query(query) => Ok(StatementKind::Explain {
                    analyze,
                    query,
                    emit: None,
                    alert: None,
                }),
                _ => Err(self.error_at("EXPLAIN takes a query", start)),
            },
            other => Err(self.error_at(
                &format!(
                    "unsupported statement: {}",
                    other
                        .to_string()
                        .split_whitespace()
                        .take(3)
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
                start,
            )),
        }
    }

    fn parse_create_stream(&mut self) -> Result<CreateStream> {
        let name = self.parse_name()?;
        self.expect(Token::LParen)?;
        let mut columns = Vec::new();
        let mut watermark = None;
        loop {
            let at = self.parser.peek_token().span.start;
            if self.peek_words(&["WATERMARK"]) {
                if watermark.is_some() {
                    return Err(self.error_at("a stream has at most one WATERMARK clause", at));
                }
                watermark = Some(self.parse_watermark()?);
            } else {
                let ident = self.parser.parse_identifier().map_err(|e| self.wrap(e))?;
                let data_type = self.parse_column_type()?;
                columns.push(ColumnDef {
                    name: normalize_ident(&ident),
                    data_type,
                    location: at,
                });
            }
            if self.parser.consume_token(&Token::Comma) {
                continue;
            }
            self.expect(Token::RParen)?;
            break;
        }
        let options = self.parse_with_options()?;
        Ok(CreateStream {
            name,
            columns,
            watermark,
            options,
        })
    }

    fn parse_watermark(&mut self) -> Result<WatermarkDef> {
        let location = self.parser.next_token().span.start; // WATERMARK
        if !self.parser.parse_keyword(Keyword::FOR) {
            return Err(self.unexpected("FOR"));
        }
        let column = normalize_ident(&self.parser.parse_identifier().map_err(|e| self.wrap(e))?);
        if !self.parser.parse_keyword(Keyword::AS) {
            return Err(self.unexpected("AS"));
        }
        let expr_at = self.parser.peek_token().span.start;
        let expr = self.parser.parse_expr().map_err(|e| self.wrap(e))?;
        let delay = match expr {
            Expr::Identifier(ref id) if normalize_ident(id) == column => None,
            Expr::BinaryOp {
                left,
                op: ast::BinaryOperator::Minus,
                right,
            } if matches!(&*left, Expr::Identifier(id) if normalize_ident(id) == column) => {
                Some(*right)
            }
            _ => {
                return Err(self.error_at(
                    &format!(
                        "WATERMARK expression must be `{column}` or `{column} - INTERVAL '...'`"
                    ),
                    expr_at,
                ));
            }
        };
        Ok(WatermarkDef {
            column,
            delay,
            location,
        })
    }

    fn parse_create_sink(&mut self) -> Result<CreateSink> {
        let name = self.parse_name()?;
        let options = self.parse_with_options()?;
        if options.is_empty() {
            return Err(self.unexpected("WITH (connector = ...)"));
        }
        Ok(CreateSink { name, options })
    }

    /// After `DROP`: `kind [IF EXISTS] name [CASCADE | RESTRICT]`.
    fn parse_drop(&mut self) -> Result<StatementKind> {
        let Some(kind) = ObjectKind::ALL
            .iter()
            .find(|(_, word)| self.peek_words(&[word]))
            .map(|(kind, _)| *kind)
        else {
            return Err(self.unexpected("STREAM, VIEW, SINK, ALERT or INVARIANT"));
        };
        self.parser.next_token();
        let if_exists = self.peek_words(&["IF", "EXISTS"]);
        if if_exists {
            self.parser.next_token();
            self.parser.next_token();
        }
        let name = self.parse_name()?;
        let cascade = self.peek_words(&["CASCADE"]);
        if cascade || self.peek_words(&["RESTRICT"]) {
            self.parser.next_token();
        }
        Ok(StatementKind::Drop {
            kind,
            name,
            if_exists,
            cascade,
        })
    }

    /// After `SHOW`: what to list.
    fn parse_show(&mut self) -> Result<StatementKind> {
        const WHAT: [(&str, Show); 6] = [
            ("STREAMS", Show::Streams),
            // As in MySQL and DuckDB: everything the catalog lists.
            ("TABLES", Show::Streams),
            ("VIEWS", Show::Views),
            ("ALERTS", Show::Alerts),
            ("SINKS", Show::Sinks),
            ("QUERIES", Show::Queries),
        ];
        let Some(show) = WHAT
            .iter()
            .find(|(word, _)| self.peek_words(&[word]))
            .map(|(_, show)| *show)
        else {
            return Err(self.unexpected("STREAMS, TABLES, VIEWS, ALERTS, SINKS or QUERIES"));
        };
        self.parser.next_token();
        Ok(StatementKind::Show(show))
    }

    fn parse_set(&mut self) -> Result<StatementKind> {
        let mut name = self.parser.parse_identifier().map_err(|e| self.wrap(e))?;
        // Dotted names group settings: `SET autoscale.max = 4`.
        while self.parser.consume_token(&Token::Period) {
            let part = self.parser.parse_identifier().map_err(|e| self.wrap(e))?;
            name.value = format!("{}.{}", name.value, part.value);
        }
        if !self.parser.consume_token(&Token::Eq) && !self.parser.parse_keyword(Keyword::TO) {
            return Err(self.unexpected("= or TO"));
        }
        let value = self.parse_option_value()?;
        Ok(StatementKind::Set {
            name: name.value.to_ascii_lowercase(),
            value,
        })
    }

    /// A value in `WITH (...)` or `SET`: a string, a number, a boolean or a
    /// bare word.
    fn parse_option_value(&mut self) -> Result<String> {
        let next = self.parser.peek_token();
        if let Token::Word(w) = &next.token
            && w.quote_style.is_none()
            && !matches!(w.keyword, Keyword::TRUE | Keyword::FALSE)
        {
            self.parser.next_token();
            return Ok(w.value.clone());
        }
        let value = self.parser.parse_value().map_err(|e| self.wrap(e))?;
        match value.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => Ok(s),
            Value::Number(n, _) => Ok(n.to_string()),
            Value::Boolean(b) => Ok(b.to_string()),
            other => {
                Err(self.error_at(&format!("value {other} must be a string"), next.span.start))
            }
        }
    }

    /// An option's key, lower-cased: a word, a quoted name, or words
    /// joined by dots (`properties.session.timeout.ms`).
    fn parse_option_key(&mut self) -> Result<String> {
        let mut key = self
            .parser
            .parse_identifier()
            .map_err(|e| self.wrap(e))?
            .value;
        while self.parser.consume_token(&Token::Period) {
            let part = self.parser.parse_identifier().map_err(|e| self.wrap(e))?;
            key = format!("{key}.{}", part.value);
        }
        Ok(key.to_ascii_lowercase())
    }

    fn parse_with_options(&mut self) -> Result<Vec<(String, String)>> {
        if !self.parser.parse_keyword(Keyword::WITH) {
            return Ok(Vec::new());
        }
        self.expect(Token::LParen)?;
        let mut options = Vec::new();
        loop {
            let key = self.parse_option_key()?;
            self.expect(Token::Eq)?;
            let value = self.parse_option_value()?;
            options.push((key, value));
            if !self.parser.consume_token(&Token::Comma) {
                break;
            }
        }
        self.expect(Token::RParen)?;
        Ok(options)
    }

    fn parse_name(&mut self) -> Result<String> {
        let ident = self.parser.parse_identifier().map_err(|e| self.wrap(e))?;
        Ok(normalize_ident(&ident))
    }

    fn peek_words(&self, words: &[&str]) -> bool {
        words.iter().enumerate().all(|(i, word)| {
            matches!(&self.parser.peek_nth_token(i).token,
                Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
        })
    }

    fn expect(&mut self, token: Token) -> Result<()> {
        self.parser
            .expect_token(&token)
            .map(|_| ())
            .map_err(|e| self.wrap(e))
    }

    fn unexpected(&self, expected: &str) -> Error {
        let found = self.parser.peek_token();
        self.error_at(
            &format!("Expected: {expected}, found: {}", found.token),
            found.span.start,
        )
    }

    fn error_at(&self, message: &str, at: Location) -> Error {
        Error::Parse(render_error(self.sql, message, at))
    }

    /// sqlparser puts the position inside its message; pull it out so every
    /// parse error is rendered the same way.
    fn wrap(&self, err: ParserError) -> Error {
        let text = match err {
            ParserError::TokenizerError(m) | ParserError::ParserError(m) => m,
            ParserError::RecursionLimitExceeded => "statement nests too deeply".to_string(),
        };
        match error::split_location(&text) {
            Some((message, at)) => self.error_at(message, at),
            None => self.error_at(&text, self.parser.peek_token().span.start),
        }
    }
}

fn object_name(name: &ObjectName) -> String {
    name.0
        .iter()
        .filter_map(|part| part.as_ident())
        .map(normalize_ident)
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests;
