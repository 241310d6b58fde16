//! Prometheus rule files (`groups:` of alerting and recording rules), read
//! with `yaml-rust2`.

use std::time::Duration;

use yaml_rust2::{Yaml, YamlLoader};

/// A rule file.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleFile {
    /// Its groups, in file order.
    pub groups: Vec<Group>,
}

/// A rule group.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// The group's `name`.
    pub name: String,
    /// Its `interval`, if it sets one.
    pub interval: Option<Duration>,
    /// Its rules, in order.
    pub rules: Vec<Rule>,
}

/// What a rule produces.
#[derive(Debug, Clone, PartialEq)]
pub enum RuleKind {
    /// `alert: NAME`.
    Alert {
        /// `for:`.
        hold: Duration,
        /// `keep_firing_for:`.
        keep_firing_for: Duration,
        /// `annotations:`, in file order.
        annotations: Vec<(String, String)>,
    },
    /// `record: NAME`.
    Record,
}

/// One rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The alert's or the recorded series' name.
    pub name: String,
    /// The PromQL expression.
    pub expr: String,
    /// Alert or recording.
    pub kind: RuleKind,
    /// `labels:`, in file order.
    pub labels: Vec<(String, String)>,
    /// The line of the rule in the file (1-based).
    pub line: usize,
}

/// Reads a rule file; the error names the group and rule at fault.
pub fn parse(text: &str) -> Result<RuleFile, String> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| format!("not valid YAML: {e}"))?;
    let Some(doc) = docs.first() else {
        return Ok(RuleFile { groups: Vec::new() });
    };
    let groups = match &doc["groups"] {
        Yaml::Array(groups) => groups,
        Yaml::BadValue | Yaml::Null => return Err("the file has no `groups:` list".into()),
        _ => return Err("`groups:` must be a list".into()),
    };
    let lines = RuleLines::of(text);
    let mut seen = 0;
    let groups = groups
        .iter()
        .enumerate()
        .map(|(i, g)| group(g, i, &lines, &mut seen))
        .collect::<Result<_, _>>()?;
    Ok(RuleFile { groups })
}

fn group(yaml: &Yaml, index: usize, lines: &RuleLines, seen: &mut usize) -> Result<Group, String> {
    let name = match &yaml["name"] {
        Yaml::String(s) => s.clone(),
        _ => return Err(format!("group {} has no `name:`", index + 1)),
    };
    let at = |what: &str| format!("group '{name}': {what}");
    known_keys(
        yaml,
        &["name", "interval", "rules", "limit", "query_offset"],
    )
    .map_err(|e| at(&e))?;
    let interval =
        optional_duration(&yaml["interval"]).map_err(|e| at(&format!("interval: {e}")))?;
    let rules = match &yaml["rules"] {
        Yaml::Array(rules) => rules,
        Yaml::BadValue | Yaml::Null => {
            return Ok(Group {
                name,
                interval,
                rules: Vec::new(),
            });
        }
        _ => return Err(at("`rules:` must be a list")),
    };
    let rules = rules
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let line = lines.next(seen);
            rule(r, line).map_err(|e| at(&format!("rule {}: {e}", i + 1)))
        })
        .collect::<Result<_, _>>()?;
    Ok(Group {
        name,
        interval,
        rules,
    })
}

fn rule(yaml: &Yaml, line: usize) -> Result<Rule, String> {
    known_keys(
        yaml,
        &[
            "alert",
            "record",
            "expr",
            "for",
            "keep_firing_for",
            "labels",
            "annotations",
        ],
    )?;
    let expr = match &yaml["expr"] {
        Yaml::String(s) => s.clone(),
        Yaml::Integer(n) => n.to_string(),
        Yaml::Real(r) => r.clone(),
        _ => return Err("no `expr:`".into()),
    };
    let labels = string_map(&yaml["labels"]).map_err(|e| format!("labels: {e}"))?;
    let (name, kind) = match (text(&yaml["alert"]), text(&yaml["record"])) {
        (Some(name), None) => {
            let hold = optional_duration(&yaml["for"]).map_err(|e| format!("for: {e}"))?;
            let keep = optional_duration(&yaml["keep_firing_for"])
                .map_err(|e| format!("keep_firing_for: {e}"))?;
            let annotations =
                string_map(&yaml["annotations"]).map_err(|e| format!("annotations: {e}"))?;
            let kind = RuleKind::Alert {
                hold: hold.unwrap_or_default(),
                keep_firing_for: keep.unwrap_or_default(),
                annotations,
            };
            (name, kind)
        }
        (None, Some(name)) => {
            for key in ["for", "keep_firing_for", "annotations"] {
                if !yaml[key].is_badvalue() {
                    return Err(format!("recording rule '{name}' cannot have `{key}:`"));
                }
            }
            (name, RuleKind::Record)
        }
        (Some(_), Some(_)) => {
            return Err("a rule has either `alert:` or `record:`, not both".into());
        }
        (None, None) => return Err("a rule needs `alert:` or `record:`".into()),
    };
    Ok(Rule {
        name,
        expr,
        kind,
        labels,
        line,
    })
}

fn text(yaml: &Yaml) -> Option<String> {
    match yaml {
        Yaml::String(s) => Some(s.clone()),
        _ => None,
    }
}

fn known_keys(yaml: &Yaml, known: &[&str]) -> Result<(), String> {
    let Yaml::Hash(map) = yaml else {
        return Err("expected a mapping".into());
    };
    for key in map.keys() {
        match key {
            Yaml::String(k) if known.contains(&k.as_str()) => {}
            other => return Err(format!("unknown field {}", scalar_text(other))),
        }
    }
    Ok(())
}

fn scalar_text(yaml: &Yaml) -> String {
    match yaml {
        Yaml::String(s) => format!("`{s}`"),
        Yaml::Integer(n) => n.to_string(),
        Yaml::Real(r) => r.clone(),
        Yaml::Boolean(b) => b.to_string(),
        _ => "(not a string)".into(),
    }
}

/// A `labels:` or `annotations:` mapping of strings (numbers and booleans
/// read as their text, as Prometheus' YAML decoder does).
fn string_map(yaml: &Yaml) -> Result<Vec<(String, String)>, String> {
    match yaml {
        Yaml::BadValue | Yaml::Null => Ok(Vec::new()),
        Yaml::Hash(map) => map
            .iter()
            .map(|(k, v)| {
                let Yaml::String(k) = k else {
                    return Err(format!("the name {} is not a string", scalar_text(k)));
                };
                let v = match v {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(n) => n.to_string(),
                    Yaml::Real(r) => r.clone(),
                    Yaml::Boolean(b) => b.to_string(),
                    _ => return Err(format!("the value of `{k}` is not a string")),
                };
                Ok((k.clone(), v))
            })
            .collect(),
        _ => Err("expected a mapping of names to strings".into()),
    }
}

/// A Prometheus duration (`5m`, `1h30m`, `0s`), if given.
fn optional_duration(yaml: &Yaml) -> Result<Option<Duration>, String> {
    match yaml {
        Yaml::BadValue | Yaml::Null => Ok(None),
        Yaml::String(s) => duration(s).map(Some),
        Yaml::Integer(0) => Ok(Some(Duration::ZERO)),
        other => Err(format!(
            "{} is not a duration such as 5m",
            scalar_text(other)
        )),
    }
}

/// Parses a Prometheus duration; zero (`0s`, `0m`) is allowed.
pub fn duration(text: &str) -> Result<Duration, String> {
    let digits_zero = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if !digits_zero.is_empty() && digits_zero.chars().all(|c| c == '0') {
        return Ok(Duration::ZERO);
    }
    promql_parser::util::parse_duration(text).map_err(|e| format!("'{text}': {e}"))
}

/// The lines where rules start (`- alert:` / `- record:` items), so that
/// problems can point at them; YAML's loader keeps no positions.
struct RuleLines(Vec<usize>);

impl RuleLines {
    fn of(text: &str) -> Self {
        let starts = text
            .lines()
            .enumerate()
            .filter(|(_, line)| {
                let item = line.trim_start().trim_start_matches('-').trim_start();
                line.trim_start().starts_with('-')
                    && (item.starts_with("alert:")
                        || item.starts_with("record:")
                        || item.starts_with("expr:"))
            })
            .map(|(i, _)| i + 1)
            .collect();
        RuleLines(starts)
    }

    /// The line of the next rule, 0 when unknown.
    fn next(&self, seen: &mut usize) -> usize {
        let line = self.0.get(*seen).copied().unwrap_or(0);
        *seen += 1;
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
groups:
  - name: node
    interval: 30s
    rules:
      - record: instance:up:sum
        expr: sum by (instance) (up)
        labels:
          team: infra
      - alert: Down
        expr: up == 0
        for: 5m
        keep_firing_for: 1m
        labels: {severity: critical}
        annotations:
          summary: "{{ $labels.instance }} down"
  - name: empty
"#;

    #[test]
    fn reads_groups_and_rules() {
        let file = parse(FILE).unwrap();
        assert_eq!(file.groups.len(), 2);
        let node = &file.groups[0];
        assert_eq!(node.interval, Some(Duration::from_secs(30)));
        assert_eq!(node.rules[0].kind, RuleKind::Record);
        assert_eq!(node.rules[0].labels, vec![("team".into(), "infra".into())]);
        assert_eq!(node.rules[0].line, 6);
        let down = &node.rules[1];
        assert_eq!(down.line, 10);
        assert_eq!(
            down.kind,
            RuleKind::Alert {
                hold: Duration::from_secs(300),
                keep_firing_for: Duration::from_secs(60),
                annotations: vec![("summary".into(), "{{ $labels.instance }} down".into())],
            }
        );
        assert!(file.groups[1].rules.is_empty());
    }

    #[test]
    fn bad_files_say_where() {
        let e = parse("groups: [{name: g, rules: [{alert: A}]}]").unwrap_err();
        assert_eq!(e, "group 'g': rule 1: no `expr:`");
        let e = parse("groups: [{name: g, rules: [{alert: A, expr: up, for: soon}]}]").unwrap_err();
        assert!(e.starts_with("group 'g': rule 1: for: 'soon'"), "{e}");
        let e = parse("groups: [{name: g, rules: [{record: r, expr: up, for: 1m}]}]").unwrap_err();
        assert!(e.contains("cannot have `for:`"), "{e}");
        let e = parse("groups: [{name: g, rules: [{alert: A, expr: up, fore: 1m}]}]").unwrap_err();
        assert!(e.contains("unknown field `fore`"), "{e}");
        assert!(
            parse("groups: [")
                .unwrap_err()
                .starts_with("not valid YAML")
        );
        assert!(parse("rules: []").is_err());
        assert_eq!(duration("0s").unwrap(), Duration::ZERO);
    }
}
