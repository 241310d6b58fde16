//! `ALTER ALERT name SET ...` and `ALTER QUERY q SET parallelism = n`:
//! changes to running queries, each ending in an optional `ALLOW STATE
//! LOSS`.

use datafusion::sql::sqlparser::ast::{Expr, Value};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Location, Token};

use super::alert::{AlertClause, AlertCondition, Hold};
use super::{ScriptParser, StatementKind};
use crate::error::Result;

/// What `ALTER ALERT name SET ...` changes; a part not written is kept.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertChange {
    /// `SET WHEN condition [FOR ...] [RESOLVE WHEN ...]` or `SET WHEN
    /// ABSENT FOR ...`: the new condition (its `FOR` is in `hold`).
    pub condition: Option<AlertCondition>,
    /// `SET FOR ...`, or the `FOR` of a new `WHEN`.
    pub hold: Option<Hold>,
    /// `SEVERITY`, `MESSAGE`, `RESOLVE MESSAGE`, `KEEP FIRING FOR`,
    /// `LABELS` and `ANNOTATIONS`, as written (the others empty).
    pub labels: AlertClause,
}

impl AlertChange {
    /// `clause` with this change made; an error for a part the clause's
    /// condition cannot take (a `FOR` on `WHEN ABSENT`).
    pub fn apply(&self, clause: &AlertClause) -> std::result::Result<AlertClause, String> {
        let mut clause = clause.clone();
        if let Some(condition) = &self.condition {
            clause.condition = match (condition, &clause.condition) {
                // A new condition keeps the FOR and RESOLVE WHEN it does not
                // write.
                (
                    AlertCondition::When {
                        when,
                        hold,
                        resolve,
                    },
                    AlertCondition::When {
                        hold: old_hold,
                        resolve: old_resolve,
                        ..
                    },
                ) => AlertCondition::When {
                    when: when.clone(),
                    hold: hold.clone().or_else(|| old_hold.clone()),
                    resolve: resolve.clone().or_else(|| old_resolve.clone()),
                },
                (new, _) => new.clone(),
            };
        }
        if let Some(new_hold) = &self.hold {
            match &mut clause.condition {
                AlertCondition::When { hold, .. } => *hold = Some(new_hold.clone()),
                AlertCondition::Absent { .. } => {
                    return Err(
                        "SET FOR belongs to a WHEN condition; a WHEN ABSENT alert takes SET WHEN ABSENT FOR INTERVAL '...'"
                            .into(),
                    );
                }
            }
        }
        let parts = &self.labels;
        replace(&mut clause.severity, &parts.severity);
        replace(&mut clause.message, &parts.message);
        replace(&mut clause.resolve_message, &parts.resolve_message);
        replace(&mut clause.keep_firing, &parts.keep_firing);
        if !parts.labels.is_empty() {
            clause.labels = parts.labels.clone();
        }
        if !parts.annotations.is_empty() {
            clause.annotations = parts.annotations.clone();
        }
        if clause.keep_firing.is_some() && matches!(clause.condition, AlertCondition::Absent { .. })
        {
            return Err("KEEP FIRING FOR belongs to a WHEN condition, not to WHEN ABSENT".into());
        }
        Ok(clause)
    }
}

fn replace<T: Clone>(slot: &mut Option<T>, new: &Option<T>) {
    if new.is_some() {
        *slot = new.clone();
    }
}

impl ScriptParser<'_> {
    /// `ALTER ALERT ...` or `ALTER QUERY ...`, after `ALTER`.
    pub(super) fn parse_alter(&mut self) -> Result<StatementKind> {
        if self.peek_words(&["ALERT"]) {
            self.parser.next_token();
            let name = self.parse_name()?;
            self.expect_set()?;
            let change = self.parse_alert_change()?;
            let allow_state_loss = self.parse_allow_state_loss()?;
            return Ok(StatementKind::AlterAlert {
                name,
                change: Box::new(change),
                allow_state_loss,
            });
        }
        if self.peek_words(&["QUERY"]) {
            self.parser.next_token();
            let query = self.parse_query_ref()?;
            self.expect_set()?;
            let parallelism = self.parse_parallelism()?;
            let allow_state_loss = self.parse_allow_state_loss()?;
            return Ok(StatementKind::AlterQuery {
                query,
                parallelism,
                allow_state_loss,
            });
        }
        Err(self.unexpected("ALERT or QUERY"))
    }

    fn expect_set(&mut self) -> Result<()> {
        match self.parser.parse_keyword(Keyword::SET) {
            true => Ok(()),
            false => Err(self.unexpected("SET")),
        }
    }

    /// A query's id (as `SHOW QUERIES` lists it) or its name.
    fn parse_query_ref(&mut self) -> Result<String> {
        let next = self.parser.peek_token();
        if let Token::Number(n, _) = &next.token {
            self.parser.next_token();
            return Ok(n.clone());
        }
        self.parse_name()
    }

    /// `parallelism = n`, n at least 1.
    fn parse_parallelism(&mut self) -> Result<usize> {
        let at = self.parser.peek_token().span.start;
        let setting = self.parser.parse_identifier().map_err(|e| self.wrap(e))?;
        if !setting.value.eq_ignore_ascii_case("parallelism") {
            return Err(self.error_at(
                "ALTER QUERY sets parallelism = n (other changes: CREATE OR REPLACE, or ALTER ALERT)",
                at,
            ));
        }
        if !self.parser.consume_token(&Token::Eq) && !self.parser.parse_keyword(Keyword::TO) {
            return Err(self.unexpected("= or TO"));
        }
        let at = self.parser.peek_token().span.start;
        let value = self.parse_option_value()?;
        match value.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(self.error_at(
                &format!("parallelism must be a whole number of at least 1, not {value}"),
                at,
            )),
        }
    }

    /// What follows `ALTER ALERT name SET`: at least one part.
    fn parse_alert_change(&mut self) -> Result<AlertChange> {
        let mut change = AlertChange {
            condition: None,
            hold: None,
            labels: empty_clause(),
        };
        let mut parts = 0;
        loop {
            let at = self.parser.peek_token().span.start;
            if self.peek_words(&["WHEN"]) {
                if change.condition.is_some() {
                    return Err(self.error_at("SET WHEN may appear once", at));
                }
                self.parser.next_token();
                change.condition = Some(self.parse_new_condition(&mut change)?);
            } else if self.peek_words(&["FOR"]) {
                if change.hold.is_some() {
                    return Err(self.error_at("FOR may appear once", at));
                }
                self.parser.next_token();
                change.hold = Some(self.parse_hold()?);
            } else {
                let before = change.labels.clone();
                self.parse_alert_labels(&mut change.labels)?;
                if change.labels == before {
                    break;
                }
            }
            parts += 1;
        }
        if parts == 0 {
            return Err(self.unexpected(
                "WHEN, FOR, SEVERITY, MESSAGE, RESOLVE MESSAGE, KEEP FIRING FOR, LABELS or ANNOTATIONS",
            ));
        }
        Ok(change)
    }

    /// The condition after `SET WHEN`; its `FOR` and `KEEP FIRING FOR` go
    /// into `change`.
    fn parse_new_condition(&mut self, change: &mut AlertChange) -> Result<AlertCondition> {
        if self.peek_words(&["ABSENT", "FOR"]) {
            self.parser.next_token();
            self.parser.next_token();
            let interval = self.parser.parse_expr().map_err(|e| self.wrap(e))?;
            return Ok(AlertCondition::Absent {
                interval: Box::new(interval),
            });
        }
        let (condition, keep) = self.parse_when()?;
        change.labels.keep_firing = keep;
        match condition {
            AlertCondition::When {
                when,
                hold,
                resolve,
            } => {
                change.hold = hold;
                Ok(AlertCondition::When {
                    when,
                    hold: None,
                    resolve,
                })
            }
            absent => Ok(absent),
        }
    }

    /// `ALLOW STATE LOSS`, if next: the change may start operators empty.
    fn parse_allow_state_loss(&mut self) -> Result<bool> {
        if !self.peek_words(&["ALLOW"]) {
            return Ok(false);
        }
        self.parser.next_token();
        for word in ["STATE", "LOSS"] {
            if !self.peek_words(&[word]) {
                return Err(self.unexpected(word));
            }
            self.parser.next_token();
        }
        Ok(true)
    }
}

/// A clause with no parts, to collect the parts an `ALTER ALERT` writes.
fn empty_clause() -> AlertClause {
    AlertClause {
        by: Vec::new(),
        condition: AlertCondition::When {
            when: Box::new(Expr::value(Value::Null)),
            hold: None,
            resolve: None,
        },
        severity: None,
        message: None,
        resolve_message: None,
        keep_firing: None,
        labels: Vec::new(),
        annotations: Vec::new(),
        location: Location::empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{StatementKind, parse_script};

    fn kind(sql: &str) -> StatementKind {
        parse_script(sql).expect("parses").remove(0).kind
    }

    fn error(sql: &str) -> String {
        parse_script(sql).expect_err("refused").to_string()
    }

    #[test]
    fn alter_query_takes_an_id_or_a_name_and_a_parallelism() {
        let StatementKind::AlterQuery {
            query,
            parallelism,
            allow_state_loss,
        } = kind("ALTER QUERY 3 SET parallelism = 4;")
        else {
            panic!("an ALTER QUERY");
        };
        assert_eq!(
            (query.as_str(), parallelism, allow_state_loss),
            ("3", 4, false)
        );
        let StatementKind::AlterQuery {
            query,
            allow_state_loss,
            ..
        } = kind("ALTER QUERY totals SET parallelism TO 2 ALLOW STATE LOSS;")
        else {
            panic!("an ALTER QUERY");
        };
        assert_eq!((query.as_str(), allow_state_loss), ("totals", true));
    }

    #[test]
    fn alter_alert_keeps_what_it_does_not_set() {
        let StatementKind::AlterAlert { name, change, .. } =
            kind("ALTER ALERT hot SET SEVERITY 'page' MESSAGE 'on {host}';")
        else {
            panic!("an ALTER ALERT");
        };
        assert_eq!(name, "hot");
        assert!(change.condition.is_none());
        assert_eq!(change.labels.severity.as_deref(), Some("page"));
        assert_eq!(change.labels.message.as_deref(), Some("on {host}"));
    }

    #[test]
    fn bad_changes_are_refused_at_their_place() {
        let e = error("ALTER QUERY 3 SET batch = 4;");
        assert!(e.contains("ALTER QUERY sets parallelism"), "{e}");
        assert!(e.contains("line 1, column 19"), "{e}");
        let e = error("ALTER QUERY 3 SET parallelism = 0;");
        assert!(e.contains("at least 1, not 0"), "{e}");
        let e = error("ALTER QUERY 3 parallelism = 2;");
        assert!(e.contains("SET"), "{e}");
        let e = error("ALTER ALERT hot SET;");
        assert!(e.contains("line 1, column 20"), "{e}");
    }
}
