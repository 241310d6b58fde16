//! Column types of `CREATE STREAM`, nested ones included.
//!
//! sqlparser's generic dialect reads `STRUCT<...>` and `ARRAY<...>` but not
//! `MAP<K, V>` (only ClickHouse's `Map(K, V)`), and not `ROW(...)`; and a
//! nested type it reads cannot hold one it does not. So the nested
//! constructors are read here, recursively, and scalar types (with their
//! `T[]` suffixes) are left to sqlparser. The result is sqlparser's
//! [`DataType`], which `types::arrow_type` maps onto Arrow.

use datafusion::sql::sqlparser::ast::{ArrayElemTypeDef, DataType, StructBracketKind, StructField};
use datafusion::sql::sqlparser::tokenizer::Token;

use super::ScriptParser;
use crate::error::Result;

/// Whether a nested type's last token was `>>`, whose second `>` closes
/// the type around it.
type ClosesOuter = bool;

impl ScriptParser<'_> {
    /// Parses one column type.
    pub(super) fn parse_column_type(&mut self) -> Result<DataType> {
        let (data_type, closes_outer) = self.parse_type()?;
        if closes_outer {
            return Err(self.error_at("Expected: end of type, found: >", self.last_start()));
        }
        Ok(data_type)
    }

    fn parse_type(&mut self) -> Result<(DataType, ClosesOuter)> {
        let nested = |word: &str, open: Token| {
            self.peek_words(&[word]) && self.parser.peek_nth_token(1).token == open
        };
        let (mut data_type, closes_outer) = if nested("STRUCT", Token::Lt) {
            self.skip(2);
            self.parse_fields(StructBracketKind::AngleBrackets)?
        } else if nested("ROW", Token::LParen) {
            self.skip(2);
            self.parse_fields(StructBracketKind::Parentheses)?
        } else if nested("ARRAY", Token::Lt) {
            self.skip(2);
            let (item, inner_closed) = self.parse_type()?;
            let closes_outer = self.close_angle(inner_closed)?;
            let array = DataType::Array(ArrayElemTypeDef::AngleBracket(Box::new(item)));
            (array, closes_outer)
        } else if nested("MAP", Token::Lt) {
            self.skip(2);
            let (key, key_closed) = self.parse_type()?;
            if key_closed {
                return Err(self.error_at("Expected: ',' and a value type", self.last_start()));
            }
            self.expect(Token::Comma)?;
            let (value, inner_closed) = self.parse_type()?;
            let closes_outer = self.close_angle(inner_closed)?;
            (DataType::Map(Box::new(key), Box::new(value)), closes_outer)
        } else {
            return Ok((
                self.parser.parse_data_type().map_err(|e| self.wrap(e))?,
                false,
            ));
        };
        // `T[]` after a nested type (sqlparser reads it after scalar ones).
        while !closes_outer
            && self.parser.peek_token().token == Token::LBracket
            && self.parser.peek_nth_token(1).token == Token::RBracket
        {
            self.skip(2);
            data_type = DataType::Array(ArrayElemTypeDef::SquareBracket(Box::new(data_type), None));
        }
        Ok((data_type, closes_outer))
    }

    /// The fields of `STRUCT<` or `ROW(` up to and with the closing bracket.
    fn parse_fields(&mut self, kind: StructBracketKind) -> Result<(DataType, ClosesOuter)> {
        let mut fields = Vec::new();
        loop {
            let name = self.parser.parse_identifier().map_err(|e| self.wrap(e))?;
            let (field_type, inner_closed) = self.parse_type()?;
            fields.push(StructField {
                field_name: Some(name),
                field_type,
                options: None,
            });
            if inner_closed {
                if kind == StructBracketKind::Parentheses {
                    return Err(self.error_at("Expected: ')', found: >", self.last_start()));
                }
                return Ok((DataType::Struct(fields, kind), false));
            }
            if self.parser.consume_token(&Token::Comma) {
                continue;
            }
            let closes_outer = match kind {
                StructBracketKind::AngleBrackets => self.close_angle(false)?,
                StructBracketKind::Parentheses => {
                    self.expect(Token::RParen)?;
                    false
                }
            };
            return Ok((DataType::Struct(fields, kind), closes_outer));
        }
    }

    /// Reads the `>` that closes a type, unless the type inside already
    /// read it as the second half of `>>`.
    fn close_angle(&mut self, inner_closed: bool) -> Result<ClosesOuter> {
        if inner_closed {
            return Ok(false);
        }
        match self.parser.peek_token().token {
            Token::Gt => {
                self.skip(1);
                Ok(false)
            }
            Token::ShiftRight => {
                self.skip(1);
                Ok(true)
            }
            _ => Err(self.unexpected(">")),
        }
    }

    fn skip(&mut self, tokens: usize) {
        for _ in 0..tokens {
            self.parser.next_token();
        }
    }

    fn last_start(&self) -> datafusion::sql::sqlparser::tokenizer::Location {
        self.parser.get_current_token().span.start
    }
}

#[cfg(test)]
mod tests {
    use crate::sql::{StatementKind, parse_script};
    use crate::types::{arrow_type, sql_name};

    /// The SQL name of each declared column's Arrow type.
    fn declared(columns: &str) -> Result<Vec<String>, String> {
        let sql = format!("CREATE STREAM s ({columns})");
        let statements = parse_script(&sql).map_err(|e| e.to_string())?;
        let StatementKind::CreateStream(create) = &statements[0].kind else {
            panic!("not a CREATE STREAM");
        };
        create
            .columns
            .iter()
            .map(|c| arrow_type(&c.data_type).map(|t| sql_name(&t)))
            .collect()
    }

    #[test]
    fn nested_types_parse_to_any_depth() {
        let names = declared(
            "labels MAP<TEXT, TEXT>, s STRUCT<a BIGINT, b STRUCT<c TEXT, d ARRAY<DOUBLE>>>, \
             r ROW(x BOOLEAN, \"Y\" TIMESTAMP), xs TEXT[], xss BIGINT[][], \
             m MAP<VARCHAR, MAP<TEXT, ARRAY<STRUCT<v DOUBLE>>>>, ms MAP<TEXT, BIGINT>[], \
             a ARRAY<ARRAY<TEXT>>, t TEXT",
        )
        .unwrap();
        assert_eq!(
            names,
            [
                "MAP<TEXT, TEXT>",
                "STRUCT<a BIGINT, b STRUCT<c TEXT, d ARRAY<DOUBLE>>>",
                "STRUCT<x BOOLEAN, \"Y\" TIMESTAMP>",
                "ARRAY<TEXT>",
                "ARRAY<ARRAY<BIGINT>>",
                "MAP<TEXT, MAP<TEXT, ARRAY<STRUCT<v DOUBLE>>>>",
                "ARRAY<MAP<TEXT, BIGINT>>",
                "ARRAY<ARRAY<TEXT>>",
                "TEXT",
            ]
        );
    }

    #[test]
    fn sql_names_parse_back_to_the_same_type() {
        let name = "MAP<TEXT, STRUCT<a ARRAY<BIGINT>, \"B c\" MAP<TEXT, BOOLEAN>>>";
        assert_eq!(declared(&format!("x {name}")).unwrap(), [name]);
    }

    #[test]
    fn bad_nested_types_are_errors() {
        let reason = |columns: &str| declared(columns).unwrap_err();
        assert!(reason("m MAP<BIGINT, TEXT>").contains("map keys are TEXT"));
        assert!(
            reason("m MAP<TEXT>").contains("Expected: ,"),
            "{}",
            reason("m MAP<TEXT>")
        );
        assert!(reason("s STRUCT<a TEXT, a BIGINT>").contains("declared twice"));
        assert!(reason("s STRUCT<a BLOB>").contains("unsupported type BLOB"));
        assert!(reason("a ARRAY<TEXT>>").contains("found: >"));
        assert!(reason("a ARRAY<TEXT").contains("Expected: >"));
        assert!(reason("r ROW(a TEXT>").contains("Expected: )"));
        assert!(reason("a TEXT[3]").contains("without a size"));
    }
}
