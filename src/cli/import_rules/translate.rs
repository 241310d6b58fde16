//! A rule file to vigil SQL, rule by rule: what translates, and for what does
//! not, the reason.

use std::collections::BTreeSet;
use std::time::Duration;

use super::promql::{self, Target};
use super::rules::{self, Rule, RuleKind};
use super::sql::{self, AlertParts, object_name};

/// How to translate.
#[derive(Debug, Clone)]
pub struct Options {
    /// The stream the rules read.
    pub stream: String,
    /// Declare the stream (`CREATE STREAM ... WITH (connector = ...)`), or
    /// refer to one declared elsewhere (`None`).
    pub connector: Option<String>,
    /// The evaluation interval of groups that do not set one (Prometheus'
    /// `global.evaluation_interval`, 1m by default).
    pub default_interval: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            stream: "prom_samples".into(),
            connector: Some("remote_write".into()),
            default_interval: Duration::from_secs(60),
        }
    }
}

/// A translated rule file.
#[derive(Debug, Clone, Default)]
pub struct Translation {
    /// The stream declaration every output starts with (empty with a
    /// stream declared elsewhere).
    pub header: String,
    /// The groups, in file order.
    pub groups: Vec<GroupSql>,
    /// The rules that did not translate.
    pub problems: Vec<Problem>,
    /// Rules that translated with an approximation, and what it is.
    pub notes: Vec<Problem>,
}

/// A group's translated rules.
#[derive(Debug, Clone)]
pub struct GroupSql {
    /// The group's name.
    pub name: String,
    /// The statements, one entry per translated rule.
    pub rules: Vec<RuleSql>,
}

/// One translated rule.
#[derive(Debug, Clone)]
pub struct RuleSql {
    /// The Prometheus name (alert or recorded series).
    pub name: String,
    /// The SQL statements, with a comment naming the original.
    pub sql: String,
}

/// A rule that did not translate (or translated approximately).
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// Its group.
    pub group: String,
    /// Its alert or record name.
    pub rule: String,
    /// Its line in the file (0 if unknown).
    pub line: usize,
    /// Why.
    pub reason: String,
}

impl Translation {
    /// True if every rule translated.
    pub fn complete(&self) -> bool {
        self.problems.is_empty()
    }

    /// Every group's statements after the header, as one script.
    pub fn script(&self) -> String {
        let mut out = self.header.clone();
        for group in &self.groups {
            out.push_str(&group_sql(group));
        }
        out
    }
}

/// A group's rules as SQL.
pub fn group_sql(group: &GroupSql) -> String {
    group.rules.iter().map(|r| format!("\n{}", r.sql)).collect()
}

/// Translates the rule file `text`; an error only for a file that is not a
/// rule file (bad YAML, missing fields).
pub fn translate_file(text: &str, options: &Options) -> Result<Translation, String> {
    let file = rules::parse(text)?;
    let mut out = Translation {
        header: match &options.connector {
            Some(connector) => sql::stream_header(&options.stream, connector),
            None => String::new(),
        },
        ..Translation::default()
    };
    let mut names = BTreeSet::new();
    for group in &file.groups {
        let interval = group.interval.unwrap_or(options.default_interval);
        let target = Target {
            stream: sql::ident(&options.stream),
            interval_ms: interval.as_millis() as i64,
        };
        let mut rules = Vec::new();
        for rule in &group.rules {
            let problem = |reason: String| Problem {
                group: group.name.clone(),
                rule: rule.name.clone(),
                line: rule.line,
                reason,
            };
            match translate_rule(rule, &target, interval, &mut names) {
                Ok((sql, notes)) => {
                    out.notes.extend(notes.into_iter().map(problem));
                    rules.push(RuleSql {
                        name: rule.name.clone(),
                        sql,
                    });
                }
                Err(reason) => out.problems.push(problem(reason)),
            }
        }
        out.groups.push(GroupSql {
            name: group.name.clone(),
            rules,
        });
    }
    Ok(out)
}

fn translate_rule(
    rule: &Rule,
    target: &Target,
    interval: Duration,
    names: &mut BTreeSet<String>,
) -> Result<(String, Vec<String>), String> {
    let expr = promql_parser::parser::parse(&rule.expr)
        .map_err(|e| format!("PromQL does not parse: {}", e.trim()))?;
    let alert = matches!(rule.kind, RuleKind::Alert { .. });
    let translated = promql::translate(&expr, target, alert)?;
    let comment = format!(
        "-- {} {}: {} (evaluated every {})\n",
        if alert { "alert" } else { "record" },
        rule.name,
        one_line(&rule.expr),
        promql_parser::util::display_duration(&interval),
    );
    match &rule.kind {
        RuleKind::Alert {
            hold,
            keep_firing_for,
            annotations,
        } => {
            let name = unique(rule.name.clone(), names);
            let parts = AlertParts {
                name: &name,
                alert: &rule.name,
                hold: *hold,
                keep_firing_for: *keep_firing_for,
                labels: &rule.labels,
                annotations,
            };
            let (sql, notes) = sql::alert(&parts, &translated)?;
            Ok((comment + &sql, notes))
        }
        RuleKind::Record => {
            let view = unique(object_name(&rule.name), names);
            let sql = sql::record(&view, &rule.name, &rule.labels, &translated.table)?;
            Ok((comment + &sql, Vec::new()))
        }
    }
}

fn one_line(expr: &str) -> String {
    expr.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `name`, or `name_2`, `name_3`, ... when taken (case-insensitively, as
/// vigil's names compare).
fn unique(name: String, names: &mut BTreeSet<String>) -> String {
    let mut candidate = name.clone();
    let mut n = 1;
    while names.contains(&candidate.to_ascii_lowercase()) {
        n += 1;
        candidate = format!("{name}_{n}");
    }
    names.insert(candidate.to_ascii_lowercase());
    candidate
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alert_file(expr: &str) -> String {
        format!(
            "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: '{}'\n",
            expr.replace('\'', "''")
        )
    }

    fn translate_one(expr: &str) -> Result<String, String> {
        let t = translate_file(&alert_file(expr), &Options::default()).unwrap();
        match t.problems.first() {
            Some(p) => Err(p.reason.clone()),
            None => Ok(t.groups[0].rules[0].sql.clone()),
        }
    }

    #[test]
    fn each_unsupported_construct_says_why() {
        let cases = [
            ("up and on(instance) node_load1", "set operator `and`"),
            ("up offset 5m == 0", "`offset`"),
            ("up @ 100 == 0", "the `@` modifier"),
            (
                "absent(up{job=\"node\"})",
                "function absent() is not supported",
            ),
            (
                "max_over_time(rate(x[5m])[30m:1m]) > 1",
                "range selector such as x[5m] (subqueries are not supported)",
            ),
            (
                "histogram_quantile(0.9, rate(x_bucket[5m])) > 1",
                "function histogram_quantile() is not supported",
            ),
            ("a / on(instance) b > 1", "on()/ignoring()"),
            ("a / ignoring(mode) b > 1", "on()/ignoring()"),
            ("a > b", "comparison between two vectors"),
            (
                "rate(a[5m]) / rate(b[5m]) > 1",
                "arithmetic between two vectors",
            ),
            ("avg_over_time(a[10m]) / b > 1", "different ranges"),
            ("topk(3, a)", "aggregation topk() is not supported"),
            (
                "sum without (cpu) (a) > 1",
                "without (cpu) would drop an entry of the labels map",
            ),
            (
                "predict_linear(a[1h], 3600) < 0",
                "function predict_linear() is not supported",
            ),
            ("a{x=\"1\"} or b", "set operator `or`"),
            ("up ==", "PromQL does not parse"),
            ("1 > 2", "must use BOOL modifier"),
            ("42", "a number, not a vector"),
        ];
        for (expr, reason) in cases {
            let got = translate_one(expr).expect_err(expr);
            assert!(got.contains(reason), "{expr}: {got}");
        }
    }

    #[test]
    fn a_problem_keeps_the_other_rules() {
        let text = "groups:\n  - name: g\n    rules:\n      - alert: Bad\n        expr: absent(up)\n      - alert: Good\n        expr: up == 0\n";
        let t = translate_file(text, &Options::default()).unwrap();
        assert!(!t.complete());
        assert_eq!(t.problems.len(), 1);
        assert_eq!(
            (t.problems[0].rule.as_str(), t.problems[0].line),
            ("Bad", 4)
        );
        assert_eq!(t.groups[0].rules.len(), 1);
        assert!(t.script().contains("CREATE OR REPLACE ALERT \"Good\""));
        assert!(t.script().starts_with("-- The samples"));
    }

    #[test]
    fn instant_comparison_is_the_alert_condition() {
        let sql = translate_one("up{job=~\"node|db\", env!=\"\"} == 0").unwrap();
        assert!(
            sql.contains("last_value(value ORDER BY ts) AS value"),
            "{sql}"
        );
        assert!(
            sql.contains(
                "WHERE name = 'up' AND job ~ '^(?:node|db)$' AND coalesce(labels['env'], '') <> ''"
            ),
            "{sql}"
        );
        assert!(
            sql.contains(
                "HOP(prom_samples, ts, INTERVAL '1' MINUTE, INTERVAL '300001' MILLISECOND)"
            ),
            "{sql}"
        );
        assert!(
            sql.contains("ALERT BY job, instance, name, labels WHEN value = 0.0"),
            "{sql}"
        );
    }

    #[test]
    fn rate_extrapolates_and_aggregations_group_again() {
        let sql = translate_one(
            "100 - avg by (instance, device) (rate(c{mode=\"idle\"}[5m])) * 100 > 80",
        )
        .unwrap();
        assert!(sql.contains("counter_increase(ts, value)"), "{sql}");
        assert!(sql.contains("/ sampled / 300.0 AS value"), "{sql}");
        assert!(sql.contains("labels['device'] AS device"), "{sql}");
        assert!(
            sql.contains("GROUP BY window_start, window_end, instance, labels['device']"),
            "{sql}"
        );
        assert!(sql.contains("(value * 100.0) AS value"), "{sql}");
        assert!(sql.contains("(100.0 - value) AS value"), "{sql}");
        assert!(
            sql.contains("ALERT BY instance, device WHEN value > 80.0"),
            "{sql}"
        );
    }

    #[test]
    fn two_selectors_share_one_aggregate() {
        let sql = translate_one("a / b * 100 < 10").unwrap();
        assert!(
            sql.contains("((last_value(value ORDER BY ts) FILTER (WHERE name = 'a') / last_value(value ORDER BY ts) FILTER (WHERE name = 'b')) * 100.0) AS value"),
            "{sql}"
        );
        assert!(sql.contains("WHERE (name = 'a') OR (name = 'b')"), "{sql}");
        assert!(
            sql.contains("ALERT BY job, instance, labels WHEN value < 10.0"),
            "{sql}"
        );
    }

    #[test]
    fn intervals_offset_the_windows_onto_evaluation_times() {
        let text = "groups:\n  - name: g\n    interval: 2m\n    rules:\n      - record: r\n        expr: avg_over_time(x[5m])\n";
        let t = translate_file(text, &Options::default()).unwrap();
        let sql = &t.groups[0].rules[0].sql;
        // Windows [k*2m + 1m, k*2m + 6m + 1ms): ends on even minutes.
        assert!(sql.contains("HOP(prom_samples, ts, INTERVAL '2' MINUTE, INTERVAL '300001' MILLISECOND, INTERVAL '1' MINUTE)"), "{sql}");
        assert!(sql.contains("'r' AS name"), "{sql}");
        let text = "groups:\n  - name: g\n    interval: 10m\n    rules:\n      - alert: A\n        expr: up == 0\n";
        let t = translate_file(text, &Options::default()).unwrap();
        assert!(
            t.problems[0].reason.contains("cannot leave gaps"),
            "{:?}",
            t.problems
        );
    }
}
