//! The `ALERT` clause that ends a query, and `CREATE ALERT`.
//!
//! ```text
//! ALERT [BY col, ...]
//!   WHEN condition [FOR INTERVAL '...' | FOR n WINDOWS] [RESOLVE WHEN condition]
//!   | WHEN ABSENT FOR INTERVAL '...'
//!   [KEEP FIRING FOR INTERVAL '...']
//!   [SEVERITY 'text'] [MESSAGE 'template'] [RESOLVE MESSAGE 'template']
//!   [LABELS (name = 'template', ...)] [ANNOTATIONS (name = 'template', ...)]
//! ```
//!
//! Like `EMIT`, the clause is cut from the statement's tokens before
//! sqlparser sees them and parsed here.

use datafusion::sql::sqlparser::ast::{Expr, Value};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Location, Token, TokenWithSpan};

use super::{ScriptParser, StatementKind, is_blank, is_word, render_error};
use crate::error::{Error, Result};

/// An `ALERT` clause.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertClause {
    /// `BY` columns: the keys the alert's state is kept per. Empty means the
    /// query's own keys (its GROUP BY or PARTITION BY columns).
    pub by: Vec<String>,
    /// What makes the alert fire.
    pub condition: AlertCondition,
    /// `SEVERITY 'text'`.
    pub severity: Option<String>,
    /// `MESSAGE 'template'`, with `{column}` placeholders.
    pub message: Option<String>,
    /// `RESOLVE MESSAGE 'template'`: the message of `resolved` rows, which
    /// use `message` without it.
    pub resolve_message: Option<String>,
    /// `KEEP FIRING FOR INTERVAL '...'`: how long a firing alert stays
    /// firing after its resolve condition starts holding.
    pub keep_firing: Option<Box<Expr>>,
    /// `LABELS (name = 'template', ...)`, in the order written.
    pub labels: Vec<(String, String)>,
    /// `ANNOTATIONS (name = 'template', ...)`, in the order written.
    pub annotations: Vec<(String, String)>,
    /// Where the clause starts.
    pub location: Location,
}

/// What makes an alert fire.
#[derive(Debug, Clone, PartialEq)]
pub enum AlertCondition {
    /// `WHEN condition [FOR ...] [RESOLVE WHEN condition]`.
    When {
        /// The condition, over the query's output columns.
        when: Box<Expr>,
        /// How long the condition must hold before the alert fires.
        hold: Option<Hold>,
        /// When a firing alert resolves; `None` means when `when` is not
        /// true.
        resolve: Option<Box<Expr>>,
    },
    /// `WHEN ABSENT FOR INTERVAL '...'`: a key that has been seen sends no
    /// row for that long.
    Absent {
        /// The interval.
        interval: Box<Expr>,
    },
}

/// The `FOR` of an alert.
#[derive(Debug, Clone, PartialEq)]
pub enum Hold {
    /// `FOR INTERVAL '...'`: event time since the condition became true.
    Interval(Box<Expr>),
    /// `FOR n WINDOWS`: consecutive rows (windows) of the key.
    Windows(u64),
}

/// Index of the `ALERT` that starts a top-level alert clause, if any.
pub(super) fn alert_position(tokens: &[TokenWithSpan]) -> Option<usize> {
    clause_position(tokens, "ALERT", &["WHEN", "BY"])
}

/// Index of a top-level (not parenthesised) `word` followed by one of
/// `next`: where one of vigil's clauses starts.
pub(super) fn clause_position(
    tokens: &[TokenWithSpan],
    word: &str,
    next: &[&str],
) -> Option<usize> {
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
            Token::Word(w) if depth == 0 && is_word(w, word) => {
                let starts_clause = matches!(words.get(k + 1), Some((_, Token::Word(n)))
                    if next.iter().any(|kw| is_word(n, kw)));
                if starts_clause {
                    return Some(*index);
                }
            }
            _ => {}
        }
    }
    None
}

/// Attaches a parsed `ALERT` clause to the statement it ends.
pub(super) fn attach_alert(
    sql: &str,
    kind: StatementKind,
    tokens: Vec<TokenWithSpan>,
) -> Result<StatementKind> {
    let at = tokens[0].span.start;
    let mut parser = ScriptParser::new(sql, tokens);
    let clause = Some(Box::new(parser.parse_alert()?));
    parser.expect_end()?;
    match kind {
        StatementKind::Query {
            query, sink, emit, ..
        } => Ok(StatementKind::Query {
            query,
            sink,
            emit,
            alert: clause,
        }),
        StatementKind::Explain {
            analyze,
            query,
            emit,
            ..
        } => Ok(StatementKind::Explain {
            analyze,
            query,
            emit,
            alert: clause,
        }),
        StatementKind::CreateAlert {
            name, query, emit, ..
        } => Ok(StatementKind::CreateAlert {
            name,
            query,
            emit,
            alert: clause,
        }),
        _ => Err(Error::Parse(render_error(
            sql,
            "ALERT belongs to a query",
            at,
        ))),
    }
}

impl ScriptParser<'_> {
    /// `CREATE ALERT name AS <query>`, after `CREATE ALERT`; the clause
    /// itself is attached by [`attach_alert`].
    pub(super) fn parse_create_alert(&mut self) -> Result<StatementKind> {
        let name = self.parse_name()?;
        if !self.parser.parse_keyword(Keyword::AS) {
            return Err(self.unexpected("AS"));
        }
        let query = self.parser.parse_query().map_err(|e| self.wrap(e))?;
        Ok(StatementKind::CreateAlert {
            name,
            query,
            emit: None,
            alert: None,
        })
    }

    fn parse_alert(&mut self) -> Result<AlertClause> {
        let location = self.parser.next_token().span.start; // ALERT
        let mut by = Vec::new();
        if self.parser.parse_keyword(Keyword::BY) {
            loop {
                by.push(self.parse_name()?);
                let next = self.parser.peek_token();
                if matches!(next.token, Token::LBracket | Token::Period) {
                    return Err(self.error_at(
                        "ALERT BY names columns of the query: select the field with an alias \
                         (labels['instance'] AS instance) and write ALERT BY instance",
                        next.span.start,
                    ));
                }
                if !self.parser.consume_token(&Token::Comma) {
                    break;
                }
            }
        }
        if !self.parser.parse_keyword(Keyword::WHEN) {
            return Err(self.unexpected("WHEN"));
        }
        let mut keep_firing = None;
        let condition = if self.peek_words(&["ABSENT", "FOR"]) {
            self.parser.next_token();
            self.parser.next_token();
            let interval = self.parser.parse_expr().map_err(|e| self.wrap(e))?;
            AlertCondition::Absent {
                interval: Box::new(interval),
            }
        } else {
            let (condition, keep) = self.parse_when()?;
            keep_firing = keep;
            condition
        };
        let mut clause = AlertClause {
            by,
            condition,
            severity: None,
            message: None,
            resolve_message: None,
            keep_firing,
            labels: Vec::new(),
            annotations: Vec::new(),
            location,
        };
        self.parse_alert_labels(&mut clause)?;
        Ok(clause)
    }

    /// The condition, and a `KEEP FIRING FOR` written before `RESOLVE
    /// WHEN` (after it, it is parsed with the labels).
    pub(super) fn parse_when(&mut self) -> Result<(AlertCondition, Option<Box<Expr>>)> {
        let when = Box::new(self.parser.parse_expr().map_err(|e| self.wrap(e))?);
        let mut hold = None;
        if self.parser.parse_keyword(Keyword::FOR) {
            hold = Some(self.parse_hold()?);
        }
        let keep = self.parse_keep_firing()?;
        let mut resolve = None;
        // `RESOLVE MESSAGE` is a label, parsed with the others.
        if self.peek_words(&["RESOLVE"]) && !self.peek_words(&["RESOLVE", "MESSAGE"]) {
            self.parser.next_token();
            if !self.parser.parse_keyword(Keyword::WHEN) {
                return Err(self.unexpected("WHEN"));
            }
            resolve = Some(Box::new(
                self.parser.parse_expr().map_err(|e| self.wrap(e))?,
            ));
        }
        let condition = AlertCondition::When {
            when,
            hold,
            resolve,
        };
        Ok((condition, keep))
    }

    /// `KEEP FIRING FOR <interval>`, if next.
    fn parse_keep_firing(&mut self) -> Result<Option<Box<Expr>>> {
        if !self.peek_words(&["KEEP", "FIRING", "FOR"]) {
            return Ok(None);
        }
        for _ in 0..3 {
            self.parser.next_token();
        }
        let interval = self.parser.parse_expr().map_err(|e| self.wrap(e))?;
        Ok(Some(Box::new(interval)))
    }

    /// `INTERVAL '...'` or `n WINDOWS`.
    pub(super) fn parse_hold(&mut self) -> Result<Hold> {
        let next = self.parser.peek_token();
        if let Token::Number(n, _) = &next.token
            && matches!(&self.parser.peek_nth_token(1).token,
                Token::Word(w) if is_word(w, "WINDOWS") || is_word(w, "WINDOW"))
        {
            let count: u64 = n.parse().ok().filter(|&c| c > 0).ok_or_else(|| {
                self.error_at(
                    &format!("FOR n WINDOWS needs a positive whole number, got {n}"),
                    next.span.start,
                )
            })?;
            self.parser.next_token();
            self.parser.next_token();
            return Ok(Hold::Windows(count));
        }
        let interval = self.parser.parse_expr().map_err(|e| self.wrap(e))?;
        Ok(Hold::Interval(Box::new(interval)))
    }

    /// `SEVERITY '...'`, `MESSAGE '...'`, `RESOLVE MESSAGE '...'`,
    /// `LABELS (...)`, `ANNOTATIONS (...)` and `KEEP FIRING FOR ...`, in any
    /// order, each at most once.
    pub(super) fn parse_alert_labels(&mut self, clause: &mut AlertClause) -> Result<()> {
        const ONCE: &str = "SEVERITY, MESSAGE, RESOLVE MESSAGE, LABELS, ANNOTATIONS and KEEP FIRING FOR may each appear once";
        loop {
            let at = self.parser.peek_token().span.start;
            if self.peek_words(&["KEEP", "FIRING", "FOR"]) {
                if clause.keep_firing.is_some() {
                    return Err(self.error_at(ONCE, at));
                }
                if matches!(clause.condition, AlertCondition::Absent { .. }) {
                    return Err(self.error_at(
                        "KEEP FIRING FOR belongs to a WHEN condition, not to WHEN ABSENT (a deadman resolves at the key's next row)",
                        at,
                    ));
                }
                clause.keep_firing = self.parse_keep_firing()?;
                continue;
            }
            let pairs = if self.peek_words(&["LABELS"]) {
                Some(&mut clause.labels)
            } else if self.peek_words(&["ANNOTATIONS"]) {
                Some(&mut clause.annotations)
            } else {
                None
            };
            if let Some(pairs) = pairs {
                if !pairs.is_empty() {
                    return Err(self.error_at(ONCE, at));
                }
                self.parser.next_token();
                *pairs = self.parse_templates()?;
                continue;
            }
            let (slot, words) = if self.peek_words(&["SEVERITY"]) {
                (&mut clause.severity, 1)
            } else if self.peek_words(&["MESSAGE"]) {
                (&mut clause.message, 1)
            } else if self.peek_words(&["RESOLVE", "MESSAGE"]) {
                (&mut clause.resolve_message, 2)
            } else {
                return Ok(());
            };
            if slot.is_some() {
                return Err(self.error_at(ONCE, at));
            }
            for _ in 0..words {
                self.parser.next_token();
            }
            *slot = Some(self.parse_string()?);
        }
    }

    /// `(name = 'template', ...)`: at least one pair, names unique.
    fn parse_templates(&mut self) -> Result<Vec<(String, String)>> {
        self.expect(Token::LParen)?;
        let mut pairs: Vec<(String, String)> = Vec::new();
        loop {
            let at = self.parser.peek_token().span.start;
            let name = self.parse_name()?;
            if pairs.iter().any(|(n, _)| *n == name) {
                return Err(self.error_at(&format!("'{name}' is given more than once"), at));
            }
            self.expect(Token::Eq)?;
            pairs.push((name, self.parse_string()?));
            if !self.parser.consume_token(&Token::Comma) {
                break;
            }
        }
        self.expect(Token::RParen)?;
        Ok(pairs)
    }

    fn parse_string(&mut self) -> Result<String> {
        let next = self.parser.peek_token();
        let value = self.parser.parse_value().map_err(|e| self.wrap(e))?;
        match value.value {
            Value::SingleQuotedString(s) => Ok(s),
            other => Err(self.error_at(
                &format!("expected a 'quoted string', found {other}"),
                next.span.start,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::sql::{StatementKind, parse_script};

    fn alert(sql: &str) -> super::AlertClause {
        let mut statements = parse_script(sql).unwrap();
        match statements.remove(0).kind {
            StatementKind::Query { alert: Some(a), .. } => *a,
            _ => panic!("a query with an alert: {sql}"),
        }
    }

    #[test]
    fn resolve_message_is_a_label_in_any_order() {
        let a = alert(
            "SELECT * FROM m ALERT BY host WHEN cpu > 90 RESOLVE WHEN cpu < 70
             RESOLVE MESSAGE '{host} back' MESSAGE '{host} hot' SEVERITY 'page'",
        );
        assert_eq!(a.message.as_deref(), Some("{host} hot"));
        assert_eq!(a.resolve_message.as_deref(), Some("{host} back"));
        assert_eq!(a.severity.as_deref(), Some("page"));
        let a = alert("SELECT * FROM m ALERT WHEN cpu > 90 RESOLVE MESSAGE 'ok'");
        assert_eq!(a.resolve_message.as_deref(), Some("ok"));
        assert!(matches!(
            a.condition,
            super::AlertCondition::When { resolve: None, .. }
        ));
        let a = alert("SELECT * FROM m ALERT BY h WHEN ABSENT FOR x RESOLVE MESSAGE '{h} back'");
        assert_eq!(a.resolve_message.as_deref(), Some("{h} back"));
    }

    #[test]
    fn resolve_message_twice_or_without_text_says_where() {
        let e =
            parse_script("SELECT * FROM m ALERT WHEN x RESOLVE MESSAGE 'a' RESOLVE MESSAGE 'b';")
                .unwrap_err()
                .to_string();
        assert!(
            e.contains("may each appear once") && e.contains("column 50"),
            "{e}"
        );
        let e = parse_script("SELECT * FROM m ALERT WHEN x RESOLVE MESSAGE 5;")
            .unwrap_err()
            .to_string();
        assert!(e.contains("quoted string"), "{e}");
    }

    #[test]
    fn labels_annotations_and_keep_firing_in_any_order() {
        let a = alert(
            "SELECT * FROM m ALERT BY host WHEN cpu > 90 FOR INTERVAL '5' MINUTE
             KEEP FIRING FOR INTERVAL '10' MINUTE RESOLVE WHEN cpu < 70
             LABELS (team = 'infra', \"instance\" = '{host}') SEVERITY 'page'
             ANNOTATIONS (summary = 'hot {host}', runbook_url = 'http://r/{host}')",
        );
        assert_eq!(
            a.labels,
            [
                ("team".to_string(), "infra".to_string()),
                ("instance".to_string(), "{host}".to_string())
            ]
        );
        assert_eq!(a.annotations.len(), 2);
        assert_eq!(a.annotations[1].1, "http://r/{host}");
        assert_eq!(a.keep_firing.unwrap().to_string(), "INTERVAL '10' MINUTE");
        assert!(matches!(
            a.condition,
            super::AlertCondition::When {
                resolve: Some(_),
                hold: Some(_),
                ..
            }
        ));
        // After the condition's other parts, among the labels.
        let a = alert(
            "SELECT * FROM m ALERT WHEN cpu > 90 RESOLVE WHEN cpu < 70 MESSAGE 'm'
             KEEP FIRING FOR INTERVAL '1' MINUTE",
        );
        assert!(a.keep_firing.is_some() && a.message.is_some());
        let a = alert("SELECT * FROM m ALERT WHEN cpu > 90");
        assert!(a.labels.is_empty() && a.annotations.is_empty() && a.keep_firing.is_none());
    }

    #[test]
    fn bad_labels_and_keep_firing_say_why() {
        let err = |sql: &str| parse_script(sql).unwrap_err().to_string();
        let e = err("SELECT * FROM m ALERT WHEN x LABELS (a = 'x', a = 'y');");
        assert!(e.contains("'a' is given more than once"), "{e}");
        let e = err("SELECT * FROM m ALERT WHEN x LABELS (a = 'x') LABELS (b = 'y');");
        assert!(e.contains("may each appear once"), "{e}");
        let e = err("SELECT * FROM m ALERT WHEN x LABELS ();");
        assert!(e.contains("Expected"), "{e}");
        let e = err("SELECT * FROM m ALERT WHEN x ANNOTATIONS (a = 5);");
        assert!(e.contains("quoted string"), "{e}");
        let e = err("SELECT * FROM m ALERT WHEN x ANNOTATIONS (a 'x');");
        assert!(e.contains("Expected"), "{e}");
        let e = err(
            "SELECT * FROM m ALERT WHEN x KEEP FIRING FOR INTERVAL '1' MINUTE KEEP FIRING FOR INTERVAL '2' MINUTE;",
        );
        assert!(e.contains("may each appear once"), "{e}");
        let e = err(
            "SELECT * FROM m ALERT BY h WHEN ABSENT FOR INTERVAL '1' MINUTE KEEP FIRING FOR INTERVAL '1' MINUTE;",
        );
        assert!(e.contains("not to WHEN ABSENT"), "{e}");
    }
}
