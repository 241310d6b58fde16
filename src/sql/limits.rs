//! Limits on the size of one statement, so no input can exhaust the stack
//! or keep the planner busy for long.
//!
//! sqlparser refuses deep nesting (parentheses, function calls, subqueries)
//! itself, but it parses a flat chain (`a + b + ...`, `x AND y AND ...`,
//! `... UNION ALL ...`) in a loop into a tree as deep as the chain is long,
//! and everything after it (dropping, cloning and printing the tree,
//! DataFusion's planner, vigil's planner) walks that tree recursively. So
//! a statement is checked right after it is parsed, and refused with an
//! error naming the limit, before anything else sees it:
//!
//! - at most [`MAX_STATEMENT_TOKENS`] tokens, checked before parsing, which
//!   bounds the work and the tree the parser builds;
//! - at most [`MAX_EXPR_DEPTH`] levels of expressions, however they nest
//!   (a chain of `n` operators is `n` levels);
//! - at most [`MAX_SET_OPERATIONS`] levels of `UNION`/`EXCEPT`/`INTERSECT`
//!   in one query.
//!
//! Parsing runs on a thread of its own with a large stack
//! ([`on_large_stack`]), so the refused trees, which can still be a few
//! thousand levels deep, are built and dropped safely whatever stack the
//! caller has (a tokio worker has 2 MiB).

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{Expr, Query, SetExpr, Visit, Visitor};
use datafusion::sql::sqlparser::tokenizer::{Location, TokenWithSpan};

use super::{AlertCondition, Emit, Hold, StatementKind, is_blank, render_error};
use crate::error::{Error, Result};

/// Most tokens (words, numbers, operators, punctuation; not blanks or
/// comments) in one statement: about 80 KB of SQL. With [`MAX_EXPR_DEPTH`]
/// it bounds planning time, which DataFusion spends in proportion to the
/// square of an expression's depth (it re-derives the type and the name of
/// every subexpression at each level).
pub const MAX_STATEMENT_TOKENS: usize = 20_000;

/// Most levels of expressions inside one another in a statement. Every
/// operator of a chain adds a level: `a + b + c` has two.
pub const MAX_EXPR_DEPTH: usize = 256;

/// Most levels of set operations (`UNION [ALL]`, `EXCEPT`, `INTERSECT`) in
/// one query: `a UNION ALL b UNION ALL c` has two.
pub const MAX_SET_OPERATIONS: usize = 128;

/// Stack of the thread statements are parsed (and planned) on: enough to
/// drop the deepest tree [`MAX_STATEMENT_TOKENS`] allows. Only the pages
/// used are ever backed by memory.
const LARGE_STACK: usize = 64 << 20;

/// Runs `f` on a thread with a [`LARGE_STACK`], or on this one if no
/// thread can be started.
pub(crate) fn on_large_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    // The closure waits here, so it is still at hand if no thread starts.
    let slot = std::sync::Mutex::new(Some(f));
    let take = || {
        slot.lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .expect("run once")
    };
    std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new()
            .name("vigil-planner".into())
            .stack_size(LARGE_STACK)
            .spawn_scoped(scope, || take()());
        match spawned {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => take()(),
        }
    })
}

/// Refuses a statement of more than [`MAX_STATEMENT_TOKENS`] tokens,
/// before it is parsed.
pub(super) fn check_tokens(sql: &str, tokens: &[TokenWithSpan], start: Location) -> Result<()> {
    let count = tokens.iter().filter(|t| !is_blank(&t.token)).count();
    if count <= MAX_STATEMENT_TOKENS {
        return Ok(());
    }
    Err(Error::Parse(render_error(
        sql,
        &format!(
            "statement too long: {count} tokens, more than the limit of {MAX_STATEMENT_TOKENS}"
        ),
        start,
    )))
}

/// Refuses a parsed statement whose expressions or set operations go past
/// [`MAX_EXPR_DEPTH`] or [`MAX_SET_OPERATIONS`] levels.
pub(super) fn check_statement(sql: &str, kind: &StatementKind, start: Location) -> Result<()> {
    let (queries, exprs) = parts(kind);
    let mut depth = Depth::default();
    let found = queries
        .into_iter()
        .try_for_each(|q| q.visit(&mut depth))
        .break_value()
        .or_else(|| {
            exprs
                .into_iter()
                .try_for_each(|e| e.visit(&mut depth))
                .break_value()
        });
    match found {
        None => Ok(()),
        Some(too_deep) => Err(Error::Parse(render_error(sql, &too_deep.message(), start))),
    }
}

/// The queries and the expressions outside them that a statement holds.
fn parts(kind: &StatementKind) -> (Vec<&Query>, Vec<&Expr>) {
    match kind {
        StatementKind::CreateStream(create) => {
            let delay = create.watermark.as_ref().and_then(|w| w.delay.as_ref());
            (Vec::new(), delay.into_iter().collect())
        }
        StatementKind::Query {
            query, emit, alert, ..
        }
        | StatementKind::Explain {
            query, emit, alert, ..
        }
        | StatementKind::CreateAlert {
            query, emit, alert, ..
        } => {
            let mut exprs = Vec::new();
            if let Some(Emit::Every(interval)) = emit {
                exprs.push(&**interval);
            }
            if let Some(alert) = alert {
                exprs.extend(alert_exprs(&alert.condition));
            }
            (vec![&**query], exprs)
        }
        StatementKind::CreateView { query, .. } => (vec![&**query], Vec::new()),
        StatementKind::CreateInvariant { query, clause, .. } => {
            let train = clause.as_ref().and_then(|c| match &c.train {
                Hold::Interval(e) => Some(&**e),
                Hold::Windows(_) => None,
            });
            (vec![&**query], train.into_iter().collect())
        }
        // The statements without expressions.
        _ => (Vec::new(), Vec::new()),
    }
}

fn alert_exprs(condition: &AlertCondition) -> Vec<&Expr> {
    match condition {
        AlertCondition::When {
            when,
            hold,
            resolve,
        } => {
            let mut exprs = vec![&**when];
            if let Some(Hold::Interval(e)) = hold {
                exprs.push(&**e);
            }
            exprs.extend(resolve.as_deref());
            exprs
        }
        AlertCondition::Absent { interval } => vec![&**interval],
    }
}

/// Which limit a statement goes past.
#[derive(Debug, Clone, Copy, PartialEq)]
enum TooDeep {
    Expressions,
    SetOperations,
}

impl TooDeep {
    fn message(self) -> String {
        match self {
            TooDeep::Expressions => format!(
                "expression too deep: more than {MAX_EXPR_DEPTH} levels of operators \
                 (a chain like `a + b + ...` or `x AND y AND ...` counts one level per \
                 operator; split it up, or use IN (...) for a list of values)"
            ),
            TooDeep::SetOperations => format!(
                "query too long: more than {MAX_SET_OPERATIONS} levels of \
                 UNION/EXCEPT/INTERSECT in one query"
            ),
        }
    }
}

/// Counts how deep expressions nest while sqlparser's visitor walks a
/// statement, and stops the walk as soon as a limit is passed, so the walk
/// itself never goes deeper than the limit.
#[derive(Default)]
struct Depth {
    exprs: usize,
}

impl Visitor for Depth {
    type Break = TooDeep;

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<TooDeep> {
        // The visitor walks set operations without calling back, so their
        // depth is measured here, without recursion, before it descends.
        if set_depth(&query.body) > MAX_SET_OPERATIONS {
            return ControlFlow::Break(TooDeep::SetOperations);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, _expr: &Expr) -> ControlFlow<TooDeep> {
        self.exprs += 1;
        if self.exprs > MAX_EXPR_DEPTH {
            return ControlFlow::Break(TooDeep::Expressions);
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, _expr: &Expr) -> ControlFlow<TooDeep> {
        self.exprs -= 1;
        ControlFlow::Continue(())
    }
}

/// Levels of set operations in a query body, counted with a stack of its
/// own rather than by recursion. Parenthesised queries inside it count
/// too: sqlparser already bounds how deeply they nest.
fn set_depth(body: &SetExpr) -> usize {
    let mut deepest = 0;
    let mut pending = vec![(body, 0usize)];
    while let Some((node, depth)) = pending.pop() {
        deepest = deepest.max(depth);
        match node {
            SetExpr::SetOperation { left, right, .. } => {
                pending.push((left, depth + 1));
                pending.push((right, depth + 1));
            }
            SetExpr::Query(query) => pending.push((&query.body, depth)),
            _ => {}
        }
        if deepest > MAX_SET_OPERATIONS {
            break;
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::parse_statements;

    /// `SELECT t op t op ... op t` with `terms` terms.
    fn chain(op: &str, term: &str, terms: usize) -> String {
        let body = vec![term; terms].join(&format!(" {op} "));
        format!("SELECT {body} FROM m")
    }

    /// `SELECT * FROM m UNION ALL ...` with `selects` selects.
    fn unions(selects: usize) -> String {
        vec!["SELECT * FROM m"; selects].join(" UNION ALL ")
    }

    /// Parses on a thread with tokio's worker stack (2 MiB), where the
    /// service parses: a deep recursion aborts the whole test binary.
    fn parse_on_small_stack(sql: String) -> Result<()> {
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                parse_statements(&sql)?
                    .into_iter()
                    .try_for_each(|s| s.map(drop))
            })
            .expect("a thread")
            .join()
            .expect("no panic")
    }

    fn refusal(sql: String) -> String {
        match parse_on_small_stack(sql) {
            Ok(()) => panic!("should be refused"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn long_flat_chains_are_refused_naming_the_limit() {
        for (op, term) in [
            ("+", "1"),
            ("AND", "TRUE"),
            ("OR", "x"),
            ("||", "'a'"),
            ("*", "2"),
        ] {
            let e = refusal(chain(op, term, 5_000));
            assert!(e.contains("expression too deep"), "{op}: {e}");
            assert!(
                e.contains(&format!("more than {MAX_EXPR_DEPTH} levels")),
                "{op}: {e}"
            );
            assert!(e.contains("line 1, column 1"), "{op}: {e}");
            // Longer still, the statement is refused before it is parsed.
            let e = refusal(chain(op, term, 10_000));
            assert!(e.contains("statement too long"), "{op}: {e}");
        }
    }

    #[test]
    fn chains_in_every_clause_are_refused() {
        let long = vec!["x"; 2_000].join(" AND ");
        let statements = [
            format!("SELECT host FROM m WHERE {long}"),
            format!(
                "SELECT window_end, host, max(cpu) AS x FROM TUMBLE(m, ts, INTERVAL '1' MINUTE) \
                 GROUP BY window_end, host ALERT WHEN {long}"
            ),
            format!("CREATE VIEW v AS SELECT * FROM m WHERE {long}"),
            format!("SELECT host FROM m WHERE host IN (SELECT host FROM m WHERE {long})"),
            format!(
                "CREATE STREAM s (ts TIMESTAMP, WATERMARK FOR ts AS ts - ({})) WITH (path = 'x')",
                vec!["INTERVAL '1' SECOND"; 2_000].join(" + ")
            ),
            format!(
                "SELECT count(*) FROM TUMBLE(m, ts, INTERVAL '1' SECOND) GROUP BY window_end \
                 EMIT EVERY {}",
                vec!["INTERVAL '1' SECOND"; 2_000].join(" + ")
            ),
            format!("SELECT CAST(x AS INT){} FROM m", "::INT".repeat(2_000)),
        ];
        for sql in statements {
            let e = refusal(sql.clone());
            let first = e.lines().next().unwrap_or("");
            assert!(
                first.contains("expression too deep"),
                "{}: {first}",
                &sql[..60]
            );
        }
    }

    #[test]
    fn long_union_chains_are_refused_naming_the_limit() {
        for selects in [1_000, 3_000] {
            let e = refusal(unions(selects));
            assert!(
                e.contains(&format!("more than {MAX_SET_OPERATIONS} levels of UNION")),
                "{e}"
            );
        }
        assert!(refusal(unions(5_000)).contains("statement too long"));
    }

    #[test]
    fn statements_past_the_token_limit_are_refused_before_parsing() {
        let values = vec!["1"; MAX_STATEMENT_TOKENS].join(",");
        let e = refusal(format!("SELECT host FROM m WHERE n IN ({values})"));
        assert!(
            e.contains(&format!("more than the limit of {MAX_STATEMENT_TOKENS}")),
            "{e}"
        );
        // The limit is per statement: the next one still parses.
        let ok = format!("SELECT {} FROM m; SELECT 1", vec!["1"; 1_000].join(","));
        assert!(parse_on_small_stack(ok).is_ok());
    }

    #[test]
    fn statements_within_the_limits_parse() {
        parse_on_small_stack(chain("+", "1", MAX_EXPR_DEPTH - 2)).expect("at the limit");
        parse_on_small_stack(chain("AND", "x", MAX_EXPR_DEPTH - 2)).expect("at the limit");
        parse_on_small_stack(unions(MAX_SET_OPERATIONS + 1)).expect("at the limit");
        // Many short expressions side by side are no deeper than one.
        let wide = vec!["a + b + c"; 2_000].join(", ");
        parse_on_small_stack(format!("SELECT {wide} FROM m")).expect("wide");
    }
}
