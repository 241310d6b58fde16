//! PromQL expressions to vigil SQL relations.
//!
//! Prometheus evaluates a rule at times `T = k * interval`; a range selector
//! `x[r]` then reads the samples with `T - r <= ts <= T` (Prometheus 2's
//! closed range) and an instant selector the latest sample of the lookback
//! `[T - 5m, T]`. vigil reads the same samples with
//! `HOP(stream, ts, interval, r + 1 ms, offset)`: windows
//! `[T - r, T + 1 ms)` whose `window_end` is the evaluation time plus one
//! millisecond. Every relation built here has the columns `window_start,
//! window_end`, its keys (see [`Keys`]) and `value`, one row per series and
//! evaluation time.

use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::{
    AggregateExpr, BinaryExpr, Call, Expr, LabelModifier, MatrixSelector, VectorSelector,
};

use super::sql::{ident, interval, nested, quote};

/// Prometheus' default lookback of an instant selector.
const LOOKBACK_MS: i64 = 5 * 60 * 1000;

/// Where and how often the translated rules read the samples.
#[derive(Debug, Clone)]
pub struct Target {
    /// The stream of samples (`ts, job, instance, name, labels, value`).
    pub stream: String,
    /// The rule group's evaluation interval, in milliseconds.
    pub interval_ms: i64,
}

/// The label columns of a relation.
#[derive(Debug, Clone, PartialEq)]
pub enum Keys {
    /// Whole series: `job, instance, labels` and, when `name` is true, the
    /// metric `name`.
    Series {
        /// Whether the metric name is part of the result (Prometheus drops it
        /// from arithmetic and functions).
        name: bool,
    },
    /// The labels an aggregation kept, one column each (`__name__` as
    /// `name`).
    Labels(Vec<String>),
}

impl Keys {
    /// The SQL columns of the keys, in order.
    pub fn columns(&self) -> Vec<String> {
        match self {
            Keys::Series { name: true } => ["job", "instance", "name", "labels"]
                .map(String::from)
                .to_vec(),
            Keys::Series { name: false } => {
                ["job", "instance", "labels"].map(String::from).to_vec()
            }
            Keys::Labels(labels) => labels.iter().map(|l| ident(&column_of(l))).collect(),
        }
    }

    /// The SQL expression of `label` over a relation with these keys, `None`
    /// when the relation does not hold it (Prometheus renders it empty).
    pub fn label(&self, label: &str) -> Option<String> {
        match self {
            Keys::Series { name } => match label {
                "__name__" if *name => Some("name".into()),
                "__name__" => None,
                other => Some(series_label(other)),
            },
            Keys::Labels(labels) if labels.iter().any(|l| l == label) => {
                Some(ident(&column_of(label)))
            }
            // `without (...)` over whole series keeps the labels map.
            Keys::Labels(labels) if labels.iter().any(|l| l == "labels") => {
                (!matches!(label, "job" | "instance" | "__name__")).then(|| series_label(label))
            }
            Keys::Labels(_) => None,
        }
    }
}

/// The column a kept label is named as.
fn column_of(label: &str) -> String {
    match label {
        "__name__" => "name".into(),
        other => other.into(),
    }
}

/// Columns of every relation that a label may not be named as.
const RESERVED: [&str; 5] = ["window_start", "window_end", "value", "labels", "ts"];

/// A label of a sample row: its own column, or an entry of `labels`.
fn series_label(label: &str) -> String {
    match label {
        "job" | "instance" => label.into(),
        "__name__" => "name".into(),
        other => format!("labels[{}]", quote(other)),
    }
}

/// A relation of values per key and evaluation time.
#[derive(Debug, Clone)]
pub struct Table {
    /// A SQL query with the columns `window_start, window_end`, the keys'
    /// columns and `value`.
    pub sql: String,
    /// Its keys.
    pub keys: Keys,
}

/// One aggregate of the samples of one selector.
#[derive(Debug, Clone)]
struct Leaf {
    /// The aggregate call over `ts` and `value`.
    call: String,
    /// Which of the series' selections it reads.
    selection: usize,
}

/// A per-series value computed from its window's aggregates.
#[derive(Debug, Clone)]
enum Calc {
    Leaf(Leaf),
    Number(f64),
    Binary(String, Box<Calc>, Box<Calc>),
    Function(&'static str, Vec<Calc>),
}

/// Values computed per series by one windowed aggregate over the samples:
/// instant selectors, the `*_over_time` functions, `irate`, and arithmetic
/// between them when they share a window.
#[derive(Debug, Clone)]
pub struct Series {
    /// The window: the range (or the lookback), in milliseconds.
    range_ms: i64,
    /// Per selector, the SQL condition selecting its samples.
    selections: Vec<String>,
    /// Whether the metric name is kept.
    name: bool,
    /// Whether each selection selects one metric by name (what binary
    /// operations between vectors need).
    named: bool,
    value: Calc,
}

/// What an expression translates to.
#[derive(Debug, Clone)]
pub enum Value {
    /// A number.
    Scalar(f64),
    /// One windowed aggregate.
    Series(Series),
    /// Any relation.
    Table(Table),
}

/// A PromQL comparison kept for the alert condition.
#[derive(Debug, Clone)]
pub struct Condition {
    /// SQL over the column `value`, e.g. `value > 0.9`.
    pub sql: String,
}

/// The translation of a rule's expression: a relation, and for an alert the
/// comparison at its top (Prometheus keeps the series for which it holds).
#[derive(Debug, Clone)]
pub struct Translated {
    /// The values per key and evaluation time.
    pub table: Table,
    /// The top comparison, if the rule asked for one (alerts only).
    pub condition: Option<Condition>,
}

/// Translates `expr`; for an alert (`top_condition`), a comparison with a
/// scalar at the top becomes the condition instead of a filter.
pub fn translate(expr: &Expr, target: &Target, top_condition: bool) -> Result<Translated, String> {
    let expr = unparen(expr);
    if top_condition
        && let Expr::Binary(b) = expr
        && is_comparison(b)
        && !returns_bool(b)
    {
        let (lhs, rhs) = (
            translate_value(&b.lhs, target)?,
            translate_value(&b.rhs, target)?,
        );
        let op = sql_operator(&b.op.to_string())?;
        let (vector, sql) = match (lhs, rhs) {
            (v, Value::Scalar(s)) if !matches!(v, Value::Scalar(_)) => {
                (v, format!("value {op} {}", number(s)))
            }
            (Value::Scalar(s), v) if !matches!(v, Value::Scalar(_)) => {
                (v, format!("{} {op} value", number(s)))
            }
            _ => return Err(not_scalar_comparison(b)),
        };
        let table = to_table(vector, target)?;
        return Ok(Translated {
            table,
            condition: Some(Condition { sql }),
        });
    }
    match translate_value(expr, target)? {
        Value::Scalar(_) => Err("the expression is a number, not a vector of series".into()),
        value => Ok(Translated {
            table: to_table(value, target)?,
            condition: None,
        }),
    }
}

fn not_scalar_comparison(b: &BinaryExpr) -> String {
    format!("comparison between two vectors (`{b}`): only comparisons with a number are supported")
}

fn unparen(expr: &Expr) -> &Expr {
    match expr {
        Expr::Paren(p) => unparen(&p.expr),
        other => other,
    }
}

fn translate_value(expr: &Expr, target: &Target) -> Result<Value, String> {
    match expr {
        Expr::Paren(p) => translate_value(&p.expr, target),
        Expr::NumberLiteral(n) => Ok(Value::Scalar(n.val)),
        Expr::StringLiteral(s) => Err(format!("string literal \"{}\" outside a function", s.val)),
        Expr::VectorSelector(vs) => Ok(Value::Series(instant(vs)?)),
        Expr::MatrixSelector(ms) => Err(format!(
            "range selector `{ms}` outside a function: a rule must give a vector"
        )),
        Expr::Unary(u) => match translate_value(&u.expr, target)? {
            Value::Scalar(s) => Ok(Value::Scalar(-s)),
            v => arithmetic_with_scalar(v, "-", 0.0, true, target),
        },
        Expr::Binary(b) => binary(b, target),
        Expr::Aggregate(a) => aggregate(a, target),
        Expr::Call(c) => call(c, target),
        Expr::Subquery(s) => Err(format!("subquery `{s}` is not supported")),
        Expr::Extension(_) => Err("extension expressions are not supported".into()),
    }
}

/// The SQL condition of a selector's matchers (metric name included).
fn selection(vs: &VectorSelector) -> Result<String, String> {
    if vs.offset.is_some() {
        return Err(format!("`offset` (in `{vs}`) is not supported"));
    }
    if vs.at.is_some() {
        return Err(format!("the `@` modifier (in `{vs}`) is not supported"));
    }
    if !vs.matchers.or_matchers.is_empty() {
        return Err(format!(
            "`or` between label matchers (in `{vs}`) is not supported"
        ));
    }
    let mut conditions = Vec::new();
    if let Some(name) = &vs.name {
        conditions.push(format!("name = {}", quote(name)));
    }
    for m in &vs.matchers.matchers {
        conditions.push(matcher(m));
    }
    if conditions.is_empty() {
        return Err(format!("selector `{vs}` has no matcher"));
    }
    Ok(conditions.join(" AND "))
}

/// One label matcher; a label a series lacks matches as the empty string,
/// as in Prometheus, and regular expressions are anchored.
fn matcher(m: &Matcher) -> String {
    let label = match m.name.as_str() {
        "job" | "instance" | "__name__" => series_label(&m.name),
        other => format!("coalesce({}, '')", series_label(other)),
    };
    match &m.op {
        MatchOp::Equal => format!("{label} = {}", quote(&m.value)),
        MatchOp::NotEqual => format!("{label} <> {}", quote(&m.value)),
        MatchOp::Re(re) => format!("{label} ~ {}", quote(re.as_str())),
        MatchOp::NotRe(re) => format!("{label} !~ {}", quote(re.as_str())),
    }
}

/// True if the selector can only select one metric name.
fn one_name(vs: &VectorSelector) -> bool {
    vs.name.is_some()
        || vs
            .matchers
            .matchers
            .iter()
            .any(|m| m.name == "__name__" && m.op == MatchOp::Equal)
}

fn instant(vs: &VectorSelector) -> Result<Series, String> {
    Ok(Series {
        range_ms: LOOKBACK_MS,
        selections: vec![selection(vs)?],
        name: one_name(vs),
        named: one_name(vs),
        value: Calc::Leaf(Leaf {
            call: "last_value(value ORDER BY ts)".into(),
            selection: 0,
        }),
    })
}

fn range_of(ms: &MatrixSelector) -> Result<i64, String> {
    let range = ms.range.as_millis() as i64;
    if range <= 0 {
        return Err(format!("range of `{ms}` must be positive"));
    }
    Ok(range)
}

fn matrix_arg(c: &Call, i: usize) -> Result<&MatrixSelector, String> {
    match c.args.args.get(i).map(|a| unparen(a)) {
        Some(Expr::MatrixSelector(ms)) => Ok(ms),
        _ => Err(format!(
            "`{c}`: the argument of {} must be a range selector such as x[5m] (subqueries are not supported)",
            c.func.name
        )),
    }
}

fn call(c: &Call, target: &Target) -> Result<Value, String> {
    let over_time = |aggregate: &str, c: &Call, i: usize| -> Result<Value, String> {
        let ms = matrix_arg(c, i)?;
        Ok(Value::Series(Series {
            range_ms: range_of(ms)?,
            selections: vec![selection(&ms.vs)?],
            name: false,
            named: one_name(&ms.vs),
            value: Calc::Leaf(Leaf {
                call: aggregate.into(),
                selection: 0,
            }),
        }))
    };
    match c.func.name {
        "rate" => counter_rate(matrix_arg(c, 0)?, true, target),
        "increase" => counter_rate(matrix_arg(c, 0)?, false, target),
        "irate" => over_time("counter_irate(ts, value)", c, 0),
        "avg_over_time" => over_time("avg(value)", c, 0),
        "min_over_time" => over_time("min(value)", c, 0),
        "max_over_time" => over_time("max(value)", c, 0),
        "sum_over_time" => over_time("sum(value)", c, 0),
        "count_over_time" => over_time("CAST(count(value) AS DOUBLE)", c, 0),
        "last_over_time" => over_time("last_value(value ORDER BY ts)", c, 0),
        "quantile_over_time" => {
            let q = quantile_arg(c)?;
            over_time(&format!("percentile_cont(value, {})", number(q)), c, 1)
        }
        other => Err(format!("function {other}() is not supported")),
    }
}

/// The literal φ of `quantile_over_time(φ, ...)` or `quantile(φ, ...)`.
fn quantile_arg(c: &Call) -> Result<f64, String> {
    match c.args.args.first().map(|a| unparen(a)) {
        Some(Expr::NumberLiteral(n)) if (0.0..=1.0).contains(&n.val) => Ok(n.val),
        _ => Err(format!(
            "`{c}`: the quantile must be a number between 0 and 1"
        )),
    }
}

/// `rate(x[r])` (`per_second`) or `increase(x[r])`, extrapolated to the
/// range's edges as Prometheus does (`extrapolatedRate`), in three steps:
/// the samples' aggregates per series and window; the distances of the
/// first and last sample to the window's edges (the start clamped at the
/// counter's extrapolated zero); the extrapolated growth.
fn counter_rate(ms: &MatrixSelector, per_second: bool, target: &Target) -> Result<Value, String> {
    let range_ms = range_of(ms)?;
    let selection = selection(&ms.vs)?;
    let hop = hop(target, range_ms)?;
    let samples = format!(
        "SELECT window_start, window_end, job, instance, name, labels,\n\
         \x20      counter_increase(ts, value) AS increase, first_value(value ORDER BY ts) AS first_value,\n\
         \x20      count(value) AS samples, min(ts) AS first_ts, max(ts) AS last_ts\n\
         FROM {hop}\n\
         WHERE {selection}\n\
         GROUP BY window_start, window_end, job, instance, name, labels"
    );
    let ms_of = |column: &str| format!("CAST({column} AS BIGINT)");
    let edges = format!(
        "SELECT window_start, window_end, job, instance, labels, increase, samples,\n\
         \x20      ({last} - {first}) / 1000.0 AS sampled,\n\
         \x20      ({last} - {first}) / 1000.0 / (samples - 1) AS spacing,\n\
         \x20      CASE WHEN increase > 0 AND first_value >= 0\n\
         \x20           THEN least(({first} - {start}) / 1000.0, ({last} - {first}) / 1000.0 * first_value / increase)\n\
         \x20           ELSE ({first} - {start}) / 1000.0 END AS to_start,\n\
         \x20      ({end} - 1 - {last}) / 1000.0 AS to_end\n\
         FROM (\n{}\n)\n\
         WHERE samples >= 2 AND last_ts > first_ts",
        nested(&samples),
        first = ms_of("first_ts"),
        last = ms_of("last_ts"),
        start = ms_of("window_start"),
        end = ms_of("window_end"),
    );
    let per = if per_second {
        format!(" / {}", number(range_ms as f64 / 1000.0))
    } else {
        String::new()
    };
    let sql = format!(
        "SELECT window_start, window_end, job, instance, labels,\n\
         \x20      increase * (sampled\n\
         \x20        + CASE WHEN to_start < spacing * 1.1 THEN to_start ELSE spacing / 2 END\n\
         \x20        + CASE WHEN to_end < spacing * 1.1 THEN to_end ELSE spacing / 2 END) / sampled{per} AS value\n\
         FROM (\n{}\n)",
        nested(&edges)
    );
    Ok(Value::Table(Table {
        sql,
        keys: Keys::Series { name: false },
    }))
}

/// The windows of a range of `range_ms` evaluated every `interval`: see the
/// module documentation.
fn hop(target: &Target, range_ms: i64) -> Result<String, String> {
    let slide = target.interval_ms;
    if slide > range_ms + 1 {
        return Err(format!(
            "the evaluation interval ({}) is longer than the range or lookback ({}): vigil's HOP windows cannot leave gaps",
            human(slide),
            human(range_ms)
        ));
    }
    let offset = (-range_ms).rem_euclid(slide);
    let offset = match offset {
        0 => String::new(),
        o => format!(", {}", interval(o)),
    };
    Ok(format!(
        "HOP({}, ts, {}, {}{offset})",
        target.stream,
        interval(slide),
        interval(range_ms + 1)
    ))
}

fn human(ms: i64) -> String {
    promql_parser::util::display_duration(&std::time::Duration::from_millis(ms as u64))
}

/// A series' relation: one aggregate over its windows, grouped by series.
fn series_table(series: &Series, target: &Target) -> Result<Table, String> {
    let hop = hop(target, series.range_ms)?;
    let combined = series.selections.len() > 1;
    let value = render(&series.value, &series.selections, combined);
    let keys = Keys::Series { name: series.name };
    let group = keys.columns().join(", ");
    let selection = match combined {
        false => series.selections[0].clone(),
        true => series
            .selections
            .iter()
            .map(|s| format!("({s})"))
            .collect::<Vec<_>>()
            .join(" OR "),
    };
    let sql = format!(
        "SELECT window_start, window_end, {group}, {value} AS value\n\
         FROM {hop}\n\
         WHERE {selection}\n\
         GROUP BY window_start, window_end, {group}"
    );
    // Both sides of a binary operation must have a sample, as Prometheus
    // matches them one to one.
    let sql = match combined {
        true => format!(
            "SELECT window_start, window_end, {group}, value\nFROM (\n{}\n)\nWHERE value IS NOT NULL",
            nested(&sql)
        ),
        false => sql,
    };
    Ok(Table { sql, keys })
}

fn render(calc: &Calc, selections: &[String], filtered: bool) -> String {
    match calc {
        Calc::Leaf(leaf) if filtered => {
            format!(
                "{} FILTER (WHERE {})",
                leaf.call, selections[leaf.selection]
            )
        }
        Calc::Leaf(leaf) => leaf.call.clone(),
        Calc::Number(n) => number(*n),
        Calc::Binary(op, l, r) => format!(
            "({} {op} {})",
            render(l, selections, filtered),
            render(r, selections, filtered)
        ),
        Calc::Function(f, args) => {
            let args: Vec<String> = args
                .iter()
                .map(|a| render(a, selections, filtered))
                .collect();
            format!("{f}({})", args.join(", "))
        }
    }
}

/// Turns any vector value into a relation.
pub fn to_table(value: Value, target: &Target) -> Result<Table, String> {
    match value {
        Value::Table(t) => Ok(t),
        Value::Series(s) => series_table(&s, target),
        Value::Scalar(_) => Err("a number is not a vector".into()),
    }
}

/// A number as SQL (always a DOUBLE).
pub fn number(n: f64) -> String {
    if n.is_nan() {
        "CAST('NaN' AS DOUBLE)".into()
    } else if n.is_infinite() {
        let sign = if n > 0.0 { "" } else { "-" };
        format!("CAST('{sign}inf' AS DOUBLE)")
    } else if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{n:.1}")
    } else {
        format!("{n}")
    }
}

fn is_comparison(b: &BinaryExpr) -> bool {
    b.op.is_comparison_operator()
}

fn returns_bool(b: &BinaryExpr) -> bool {
    b.modifier.as_ref().is_some_and(|m| m.return_bool)
}

fn sql_operator(op: &str) -> Result<&'static str, String> {
    Ok(match op {
        "+" => "+",
        "-" => "-",
        "*" => "*",
        "/" => "/",
        "%" => "%",
        "==" => "=",
        "!=" => "<>",
        ">" => ">",
        "<" => "<",
        ">=" => ">=",
        "<=" => "<=",
        "^" => "^",
        "and" | "or" | "unless" => {
            return Err(format!(
                "set operator `{op}` between two vectors is not supported"
            ));
        }
        "atan2" => return Err("operator `atan2` is not supported".into()),
        other => return Err(format!("operator `{other}` is not supported")),
    })
}

/// `lhs op rhs` as SQL over two numbers (`^` is `power`).
fn apply(op: &str, lhs: String, rhs: String) -> String {
    match op {
        "^" => format!("power({lhs}, {rhs})"),
        op => format!("({lhs} {op} {rhs})"),
    }
}

fn binary(b: &BinaryExpr, target: &Target) -> Result<Value, String> {
    let op = sql_operator(&b.op.to_string())?;
    if let Some(m) = &b.modifier
        && m.matching.is_some()
    {
        return Err(format!(
            "vector matching with on()/ignoring() (in `{b}`) is not supported"
        ));
    }
    let (lhs, rhs) = (
        translate_value(&b.lhs, target)?,
        translate_value(&b.rhs, target)?,
    );
    let comparison = is_comparison(b);
    match (lhs, rhs) {
        (Value::Scalar(l), Value::Scalar(r)) => {
            scalar_binary(op, l, r, comparison, returns_bool(b))
        }
        (v, Value::Scalar(s)) if comparison => {
            compare_with_scalar(v, op, s, false, returns_bool(b), target)
        }
        (Value::Scalar(s), v) if comparison => {
            compare_with_scalar(v, op, s, true, returns_bool(b), target)
        }
        (v, Value::Scalar(s)) => arithmetic_with_scalar(v, op, s, false, target),
        (Value::Scalar(s), v) => arithmetic_with_scalar(v, op, s, true, target),
        (_, _) if comparison => Err(not_scalar_comparison(b)),
        (Value::Series(l), Value::Series(r)) => vector_arithmetic(b, op, l, r),
        _ => Err(format!(
            "arithmetic between two vectors (`{b}`) is supported only between instant selectors or *_over_time/irate calls of the same range"
        )),
    }
}

fn scalar_binary(op: &str, l: f64, r: f64, comparison: bool, bool_: bool) -> Result<Value, String> {
    let truth = |t: bool| if t { 1.0 } else { 0.0 };
    Ok(Value::Scalar(match op {
        "+" => l + r,
        "-" => l - r,
        "*" => l * r,
        "/" => l / r,
        "%" => l % r,
        "^" => l.powf(r),
        "=" => truth(l == r),
        "<>" => truth(l != r),
        ">" => truth(l > r),
        "<" => truth(l < r),
        ">=" => truth(l >= r),
        "<=" => truth(l <= r),
        _ => return Err(format!("operator {op} between numbers is not supported")),
    }))
    .and_then(|v| match comparison && !bool_ {
        true => Err("a comparison between two numbers needs `bool`".into()),
        false => Ok(v),
    })
}

/// `v op s` (or `s op v` when `scalar_first`); drops the metric name, as
/// Prometheus does.
fn arithmetic_with_scalar(
    v: Value,
    op: &str,
    s: f64,
    scalar_first: bool,
    target: &Target,
) -> Result<Value, String> {
    let order = |value: String| match scalar_first {
        true => apply(op, number(s), value),
        false => apply(op, value, number(s)),
    };
    match v {
        Value::Series(mut series) => {
            let value = Calc::Number(s);
            let old = std::mem::replace(&mut series.value, Calc::Number(0.0));
            series.value = match (scalar_first, op) {
                (f, "^") => {
                    let (a, b) = if f { (value, old) } else { (old, value) };
                    Calc::Function("power", vec![a, b])
                }
                (true, _) => Calc::Binary(op.into(), Box::new(value), Box::new(old)),
                (false, _) => Calc::Binary(op.into(), Box::new(old), Box::new(value)),
            };
            series.name = false;
            Ok(Value::Series(series))
        }
        Value::Table(table) => {
            let keys = drop_name(&table.keys);
            Ok(Value::Table(project(
                &table,
                &keys,
                &order("value".into()),
                None,
            )))
        }
        Value::Scalar(_) => unreachable_scalar(target),
    }
}

fn unreachable_scalar<T>(_target: &Target) -> Result<T, String> {
    Err("internal: a number where a vector was expected".into())
}

fn drop_name(keys: &Keys) -> Keys {
    match keys {
        Keys::Series { .. } => Keys::Series { name: false },
        other => other.clone(),
    }
}

/// `SELECT window_start, window_end, <keys>, <value> AS value FROM (t) [WHERE ...]`.
fn project(table: &Table, keys: &Keys, value: &str, filter: Option<&str>) -> Table {
    let columns = keys.columns().join(", ");
    let filter = filter.map(|f| format!("\nWHERE {f}")).unwrap_or_default();
    Table {
        sql: format!(
            "SELECT window_start, window_end, {columns}, {value} AS value\nFROM (\n{}\n){filter}",
            nested(&table.sql)
        ),
        keys: keys.clone(),
    }
}

/// A comparison with a number: keeps the series where it holds, or with
/// `bool` gives 1 or 0 for every series.
fn compare_with_scalar(
    v: Value,
    op: &str,
    s: f64,
    scalar_first: bool,
    bool_: bool,
    target: &Target,
) -> Result<Value, String> {
    let table = to_table(v, target)?;
    let condition = match scalar_first {
        true => format!("{} {op} value", number(s)),
        false => format!("value {op} {}", number(s)),
    };
    Ok(Value::Table(match bool_ {
        true => project(
            &table,
            &drop_name(&table.keys),
            &format!("CASE WHEN {condition} THEN 1.0 ELSE 0.0 END"),
            None,
        ),
        false => project(&table, &table.keys, "value", Some(&condition)),
    }))
}

/// Arithmetic between two selections of one window: one aggregate over
/// both, each side's aggregates filtered to its own samples, grouped by the
/// series without its name (Prometheus' one-to-one matching on all labels
/// but the name).
fn vector_arithmetic(b: &BinaryExpr, op: &str, l: Series, r: Series) -> Result<Value, String> {
    if l.range_ms != r.range_ms {
        return Err(format!(
            "arithmetic between two vectors of different ranges (`{b}`) is not supported"
        ));
    }
    if !l.named || !r.named {
        return Err(format!(
            "arithmetic between two vectors (`{b}`): each side must select one metric by name"
        ));
    }
    let shift = l.selections.len();
    let r_value = reselect(r.value, shift);
    let mut selections = l.selections;
    selections.extend(r.selections);
    let value = match op {
        "^" => Calc::Function("power", vec![l.value, r_value]),
        op => Calc::Binary(op.into(), Box::new(l.value), Box::new(r_value)),
    };
    Ok(Value::Series(Series {
        range_ms: l.range_ms,
        selections,
        name: false,
        named: true,
        value,
    }))
}

fn reselect(calc: Calc, shift: usize) -> Calc {
    match calc {
        Calc::Leaf(mut leaf) => {
            leaf.selection += shift;
            Calc::Leaf(leaf)
        }
        Calc::Number(n) => Calc::Number(n),
        Calc::Binary(op, a, b) => Calc::Binary(
            op,
            Box::new(reselect(*a, shift)),
            Box::new(reselect(*b, shift)),
        ),
        Calc::Function(f, args) => {
            Calc::Function(f, args.into_iter().map(|a| reselect(a, shift)).collect())
        }
    }
}

fn aggregate(a: &AggregateExpr, target: &Target) -> Result<Value, String> {
    let op = a.op.to_string();
    let function = match op.as_str() {
        "sum" => "sum(value)".to_string(),
        "avg" => "avg(value)".into(),
        "min" => "min(value)".into(),
        "max" => "max(value)".into(),
        "count" => "CAST(count(value) AS DOUBLE)".into(),
        "stddev" => "stddev_pop(value)".into(),
        "stdvar" => "var_pop(value)".into(),
        "quantile" => match a.param.as_deref().map(unparen) {
            Some(Expr::NumberLiteral(n)) if (0.0..=1.0).contains(&n.val) => {
                format!("percentile_cont(value, {})", number(n.val))
            }
            _ => {
                return Err(format!(
                    "`{a}`: the quantile must be a number between 0 and 1"
                ));
            }
        },
        other => return Err(format!("aggregation {other}() is not supported")),
    };
    let inner = match translate_value(&a.expr, target)? {
        Value::Scalar(_) => return Err(format!("`{a}` aggregates a number, not a vector")),
        v => to_table(v, target)?,
    };
    let keys = grouping(&inner.keys, a.modifier.as_ref(), a)?;
    let (exprs, names) = key_exprs(&inner.keys, &keys);
    let select: Vec<String> = exprs
        .iter()
        .zip(&names)
        .map(|(e, n)| {
            if e == n {
                e.clone()
            } else {
                format!("{e} AS {n}")
            }
        })
        .collect();
    let select = select.iter().map(|s| format!("{s}, ")).collect::<String>();
    let group = exprs.iter().map(|e| format!(", {e}")).collect::<String>();
    Ok(Value::Table(Table {
        sql: format!(
            "SELECT window_start, window_end, {select}{function} AS value\n\
             FROM (\n{}\n)\n\
             GROUP BY window_start, window_end{group}",
            nested(&inner.sql)
        ),
        keys,
    }))
}

/// The keys after `by (...)` / `without (...)` over a relation keyed by
/// `inner`.
fn grouping(
    inner: &Keys,
    modifier: Option<&LabelModifier>,
    a: &AggregateExpr,
) -> Result<Keys, String> {
    let check = |labels: &[String]| -> Result<(), String> {
        match labels
            .iter()
            .find(|l| RESERVED.contains(&l.as_str()) || l.as_str() == "name")
        {
            Some(l) => Err(format!(
                "`{a}`: grouping by a label named '{l}' is not supported (it is a column of the samples)"
            )),
            None => Ok(()),
        }
    };
    match modifier {
        None => Ok(Keys::Labels(Vec::new())),
        Some(LabelModifier::Include(labels)) => {
            check(&labels.labels)?;
            // Labels the input does not have group nothing.
            Ok(Keys::Labels(
                labels
                    .labels
                    .iter()
                    .filter(|l| inner.label(l).is_some())
                    .cloned()
                    .collect(),
            ))
        }
        Some(LabelModifier::Exclude(labels)) => match inner {
            Keys::Labels(kept) => Ok(Keys::Labels(
                kept.iter()
                    .filter(|k| !labels.labels.contains(k))
                    .cloned()
                    .collect(),
            )),
            Keys::Series { .. } => {
                let in_map = labels
                    .labels
                    .iter()
                    .find(|l| !matches!(l.as_str(), "job" | "instance" | "__name__"));
                if let Some(l) = in_map {
                    return Err(format!(
                        "`{a}`: without ({l}) would drop an entry of the labels map, which vigil cannot do yet; use by (...)"
                    ));
                }
                let kept: Vec<String> = ["job", "instance"]
                    .into_iter()
                    .filter(|k| !labels.labels.iter().any(|l| l == k))
                    .map(String::from)
                    .collect();
                Ok(Keys::Labels(
                    kept.into_iter().chain(["labels".into()]).collect(),
                ))
            }
        },
    }
}

/// The SQL expressions and column names of `keys` over a relation keyed by
/// `inner`.
fn key_exprs(inner: &Keys, keys: &Keys) -> (Vec<String>, Vec<String>) {
    let Keys::Labels(labels) = keys else {
        let columns = keys.columns();
        return (columns.clone(), columns);
    };
    labels
        .iter()
        .map(|l| match l.as_str() {
            "labels" => ("labels".to_string(), "labels".to_string()),
            l => (
                inner.label(l).unwrap_or_else(|| "NULL".into()),
                ident(&column_of(l)),
            ),
        })
        .unzip()
}
