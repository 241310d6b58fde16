//! `CREATE INVARIANT`: what a query's rows normally look like, learned per
//! key during a training period.
//!
//! ```text
//! CREATE INVARIANT name AS <query>
//!   LEARN { SET | RANGE } OF column [BY col, ...]
//!   TRAIN FOR { INTERVAL '...' | n WINDOWS }
//!   [MODE { OFFLINE | ONLINE }]
//! ```

use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan};

use super::alert::clause_position;
use super::{Hold, ScriptParser, StatementKind};
use crate::error::Result;

/// What an invariant learns of its column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd)]
pub enum Learn {
    /// The set of values seen.
    Set,
    /// The smallest and largest value seen.
    Range,
}

/// The clause of `CREATE INVARIANT` after its query.
#[derive(Debug, Clone, PartialEq)]
pub struct InvariantClause {
    /// Set or range.
    pub learn: Learn,
    /// The column learned.
    pub column: String,
    /// `BY` columns; empty means the query's own keys.
    pub by: Vec<String>,
    /// How long to train.
    pub train: Hold,
    /// `MODE ONLINE`: keep learning after training.
    pub online: bool,
}

/// Index of the `LEARN` that starts a top-level invariant clause, if any.
pub(super) fn learn_position(tokens: &[TokenWithSpan]) -> Option<usize> {
    clause_position(tokens, "LEARN", &["SET", "RANGE"])
}

impl ScriptParser<'_> {
    /// `CREATE INVARIANT name AS <query>`, after `CREATE INVARIANT`; the
    /// `LEARN` clause is parsed by [`ScriptParser::parse_learn`].
    pub(super) fn parse_create_invariant(
        &mut self,
    ) -> Result<(String, Box<datafusion::sql::sqlparser::ast::Query>)> {
        let name = self.parse_name()?;
        if !self.parser.parse_keyword(Keyword::AS) {
            return Err(self.unexpected("AS"));
        }
        let query = self.parser.parse_query().map_err(|e| self.wrap(e))?;
        Ok((name, query))
    }

    /// `LEARN ... TRAIN FOR ... [MODE ...]`.
    pub(super) fn parse_learn(&mut self) -> Result<InvariantClause> {
        self.parser.next_token(); // LEARN
        let learn = if self.peek_words(&["SET"]) {
            Learn::Set
        } else if self.peek_words(&["RANGE"]) {
            Learn::Range
        } else {
            return Err(self.unexpected("SET or RANGE"));
        };
        self.parser.next_token();
        if !self.parser.parse_keyword(Keyword::OF) {
            return Err(self.unexpected("OF"));
        }
        let column = self.parse_name()?;
        let mut by = Vec::new();
        if self.parser.parse_keyword(Keyword::BY) {
            loop {
                by.push(self.parse_name()?);
                if !self.parser.consume_token(&Token::Comma) {
                    break;
                }
            }
        }
        if !self.peek_words(&["TRAIN", "FOR"]) {
            return Err(self.unexpected("TRAIN FOR INTERVAL '...' or TRAIN FOR n WINDOWS"));
        }
        self.parser.next_token();
        self.parser.next_token();
        let train = self.parse_hold()?;
        let mut online = false;
        if self.peek_words(&["MODE"]) {
            self.parser.next_token();
            online = if self.peek_words(&["ONLINE"]) {
                true
            } else if self.peek_words(&["OFFLINE"]) {
                false
            } else {
                return Err(self.unexpected("OFFLINE or ONLINE"));
            };
            self.parser.next_token();
        }
        Ok(InvariantClause {
            learn,
            column,
            by,
            train,
            online,
        })
    }
}

/// Builds the statement from its query part and its clause tokens.
pub(super) fn attach_learn(
    sql: &str,
    kind: StatementKind,
    tokens: Vec<TokenWithSpan>,
) -> Result<StatementKind> {
    let at = tokens[0].span.start;
    let mut parser = ScriptParser::new(sql, tokens);
    let clause = parser.parse_learn()?;
    parser.expect_end()?;
    match kind {
        StatementKind::CreateInvariant { name, query, .. } => Ok(StatementKind::CreateInvariant {
            name,
            query,
            clause: Some(Box::new(clause)),
        }),
        _ => Err(parser.error_at("LEARN belongs to CREATE INVARIANT", at)),
    }
}
