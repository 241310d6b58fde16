//! vigil statements for translated rules: the stream of samples, an alert
//! (`CREATE ALERT ... ALERT BY ... WHEN ...`) or a recording view, and
//! Prometheus' Go templates as vigil's `{column}` templates.

use std::collections::BTreeSet;
use std::time::Duration;

use datafusion::sql::sqlparser::keywords::ALL_KEYWORDS;

use super::promql::{Keys, Table, Translated};

/// A SQL string literal.
pub fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A SQL identifier, quoted when it is not a plain lowercase name or is a
/// keyword (labels are case-sensitive).
pub fn ident(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    let keyword = ALL_KEYWORDS.contains(&name.to_ascii_uppercase().as_str());
    if plain && !keyword {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// A constant interval in the largest unit that divides it.
pub fn interval(ms: i64) -> String {
    let (n, unit) = [
        (86_400_000, "DAY"),
        (3_600_000, "HOUR"),
        (60_000, "MINUTE"),
        (1000, "SECOND"),
    ]
    .into_iter()
    .find(|(unit, _)| ms % unit == 0)
    .map(|(unit, name)| (ms / unit, name))
    .unwrap_or((ms, "MILLISECOND"));
    format!("INTERVAL '{n}' {unit}")
}

/// Indents every line of `sql` by two spaces, for a nested query.
pub fn nested(sql: &str) -> String {
    sql.lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The columns of the samples stream.
pub const SAMPLE_COLUMNS: &str =
    "ts TIMESTAMP, job TEXT, instance TEXT, name TEXT, labels MAP<TEXT, TEXT>, value DOUBLE";

/// The declaration of the samples stream, fed by `connector`.
pub fn stream_header(stream: &str, connector: &str) -> String {
    format!(
        "-- The samples, as the `remote_write` and `prometheus` sources produce them: labels other\n\
         -- than __name__ (name), job and instance in `labels`. Swap the connector to read them\n\
         -- elsewhere (e.g. connector = 'prometheus', targets = 'http://127.0.0.1:9100/metrics').\n\
         CREATE OR REPLACE STREAM {stream} (\n\
         \x20 {SAMPLE_COLUMNS},\n\
         \x20 WATERMARK FOR ts AS ts - INTERVAL '30' SECOND\n\
         ) WITH (connector = {});\n",
        quote(connector)
    )
}

/// A Prometheus template as a vigil template: the text, and the labels it
/// reads (each must be a column of the alert's query).
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    /// vigil template text.
    pub text: String,
    /// Labels read with `{{ $labels.x }}`.
    pub labels: BTreeSet<String>,
    /// Approximations made, to report.
    pub notes: Vec<String>,
}

/// Translates `{{ $labels.x }}` to `{x}`, `{{ $value }}` to `{value}`,
/// `{{ $labels }}` to `{labels}` and `{{ printf "%.2f" $value }}` (or
/// `$value | printf "%.2f"`) to `{value:.2}`; `humanize` prints 3
/// decimals. Literal braces are doubled.
pub fn template(text: &str) -> Result<Template, String> {
    let mut out = Template {
        text: String::new(),
        labels: BTreeSet::new(),
        notes: Vec::new(),
    };
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        literal(&rest[..open], &mut out.text);
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| format!("template `{text}`: `{{{{` without `}}}}`"))?;
        let action = after[..close]
            .trim_start_matches('-')
            .trim_end_matches('-')
            .trim();
        let piece = action_text(action, &mut out)?;
        out.text.push_str(&piece);
        rest = &after[close + 2..];
    }
    literal(rest, &mut out.text);
    Ok(out)
}

fn literal(text: &str, out: &mut String) {
    out.push_str(&text.replace('{', "{{").replace('}', "}}"));
}

fn action_text(action: &str, out: &mut Template) -> Result<String, String> {
    let words: Vec<&str> = action.split_whitespace().collect();
    let value = |w: &str| w == "$value" || w == ".Value";
    let decimals = |format: &str| -> Option<usize> {
        let f = format.trim_matches('"');
        f.strip_prefix("%.")?.strip_suffix('f')?.parse().ok()
    };
    match words.as_slice() {
        [v] if value(v) => Ok("{value}".into()),
        ["$labels"] | [".Labels"] => Ok("{labels}".into()),
        [l] if l.starts_with("$labels.") || l.starts_with(".Labels.") => {
            let label = l.split_once('.').map(|(_, rest)| rest).unwrap_or_default();
            let label = label.strip_prefix("Labels.").unwrap_or(label);
            out.labels.insert(label.to_string());
            Ok(format!("{{{}}}", label_column(label)))
        }
        ["printf", f, v] | [v, "|", "printf", f] if value(v) => match decimals(f) {
            Some(n) => Ok(format!("{{value:.{n}}}")),
            None => Err(format!(
                "template `{{{{ {action} }}}}`: only printf \"%.Nf\" is supported"
            )),
        },
        [v, "|", "humanize"] | ["humanize", v] if value(v) => {
            out.notes.push(format!(
                "`{{{{ {action} }}}}` printed with 3 decimals, without SI prefixes"
            ));
            Ok("{value:.3}".into())
        }
        _ => Err(format!(
            "template action `{{{{ {action} }}}}` is not supported"
        )),
    }
}

/// The column an alert's query names a label as: the label itself unless
/// it is one of the alert's own columns.
pub fn label_column(label: &str) -> String {
    const ALERT_COLUMNS: [&str; 10] = [
        "alert",
        "state",
        "event_time",
        "since",
        "severity",
        "message",
        "value",
        "window_end",
        "window_start",
        "rule",
    ];
    match label {
        "__name__" => "name".into(),
        l if ALERT_COLUMNS.contains(&l) => format!("label_{l}"),
        l => l.to_string(),
    }
}

/// An alert rule's parts, translated.
pub struct AlertParts<'a> {
    /// vigil's name for it (unique in the translation).
    pub name: &'a str,
    /// Prometheus' alert name.
    pub alert: &'a str,
    /// `for:`.
    pub hold: Duration,
    /// `keep_firing_for:`.
    pub keep_firing_for: Duration,
    /// `labels:`.
    pub labels: &'a [(String, String)],
    /// `annotations:`.
    pub annotations: &'a [(String, String)],
}

/// `CREATE OR REPLACE ALERT`: the relation's rows at each evaluation, keyed
/// by its series, firing where the condition holds. Returns the statement and
/// the notes on approximations.
pub fn alert(parts: &AlertParts, translated: &Translated) -> Result<(String, Vec<String>), String> {
    let table = &translated.table;
    let mut labels = Vec::new();
    let mut severity = None;
    let mut notes = Vec::new();
    let mut read = BTreeSet::new();
    for (k, v) in parts.labels {
        let t = template(v).map_err(|e| format!("label {k}: {e}"))?;
        read.extend(t.labels.iter().cloned());
        notes.extend(t.notes);
        if k == "severity" && t.labels.is_empty() && !t.text.contains('{') {
            severity = Some(v.clone());
        } else {
            labels.push(format!("{} = {}", ident(k), quote(&t.text)));
        }
    }
    let mut annotations = Vec::new();
    let mut message = None;
    for (k, v) in parts.annotations {
        let t = template(v).map_err(|e| format!("annotation {k}: {e}"))?;
        read.extend(t.labels.iter().cloned());
        notes.extend(t.notes);
        if k == "summary" || (message.is_none() && k == "description") {
            message = Some(t.text.clone());
        }
        annotations.push(format!("{} = {}", ident(k), quote(&t.text)));
    }
    let keys = table.keys.columns();
    let mut select = vec!["window_end".to_string()];
    select.extend(keys.iter().cloned());
    let key_list = match keys.is_empty() {
        true => {
            // One state for the whole result, keyed by a constant so that
            // `FOR` has a key.
            select.push(format!("{} AS rule", quote(parts.alert)));
            "rule".to_string()
        }
        false => keys.join(", "),
    };
    select.extend(label_columns(&table.keys, &read));
    select.push("value".into());
    let condition = match &translated.condition {
        Some(c) => c.sql.clone(),
        None => "value IS NOT NULL".into(),
    };
    let mut clause = format!("ALERT BY {key_list} WHEN {condition}");
    if !parts.hold.is_zero() {
        clause.push_str(&format!(" FOR {}", interval(parts.hold.as_millis() as i64)));
    }
    if !parts.keep_firing_for.is_zero() {
        clause.push_str(&format!(
            "\n  KEEP FIRING FOR {}",
            interval(parts.keep_firing_for.as_millis() as i64)
        ));
    }
    if let Some(s) = severity {
        clause.push_str(&format!("\n  SEVERITY {}", quote(&s)));
    }
    if let Some(m) = message {
        clause.push_str(&format!("\n  MESSAGE {}", quote(&m)));
    }
    if !labels.is_empty() {
        clause.push_str(&format!("\n  LABELS ({})", labels.join(", ")));
    }
    if !annotations.is_empty() {
        clause.push_str(&format!("\n  ANNOTATIONS ({})", annotations.join(", ")));
    }
    let sql = format!(
        "CREATE OR REPLACE ALERT {} AS\nSELECT {}\nFROM (\n{}\n)\n{clause};\n",
        ident(parts.name),
        select.join(", "),
        nested(&table.sql)
    );
    Ok((sql, notes))
}

/// `labels['x'] AS x` for each label the templates read that is not a
/// column yet; a label the result lacks renders empty.
fn label_columns(keys: &Keys, read: &BTreeSet<String>) -> Vec<String> {
    read.iter()
        .filter_map(|label| {
            let column = ident(&label_column(label));
            match keys.label(label) {
                Some(expr) if expr == column => None,
                Some(expr) => Some(format!("{expr} AS {column}")),
                None => Some(format!("'' AS {column}")),
            }
        })
        .collect()
}

/// A recording rule: a view of the new series (its `name` the recorded
/// name, its rule labels as constant columns) and a query printing it.
pub fn record(
    view: &str,
    record: &str,
    labels: &[(String, String)],
    table: &Table,
) -> Result<String, String> {
    let mut select = vec!["window_end".to_string()];
    select.extend(table.keys.columns().into_iter().filter(|c| c != "name"));
    select.push(format!("{} AS name", quote(record)));
    for (k, v) in labels {
        if v.contains("{{") {
            return Err(format!(
                "label {k}: templates in a recording rule's labels are not supported"
            ));
        }
        let column = ident(&label_column(k));
        if table.keys.label(k).is_some() {
            return Err(format!(
                "label {k}: overriding a label of the result is not supported"
            ));
        }
        select.push(format!("{} AS {column}", quote(v)));
    }
    select.push("value".into());
    Ok(format!(
        "CREATE OR REPLACE VIEW {view} AS\nSELECT {}\nFROM (\n{}\n);\nSELECT * FROM {view};\n",
        select.join(", "),
        nested(&table.sql),
    ))
}

/// A name for a vigil object: lowercase, other characters as `_`.
pub fn object_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '_' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '_',
        })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_become_column_placeholders() {
        let t = template("{{ $labels.instance }} at {{ $value }} {x}").unwrap();
        assert_eq!(t.text, "{instance} at {value} {{x}}");
        assert_eq!(t.labels, BTreeSet::from(["instance".to_string()]));
        let t =
            template("{{- printf \"%.2f\" $value -}} / {{ $value | printf \"%.1f\" }}").unwrap();
        assert_eq!(t.text, "{value:.2} / {value:.1}");
        let t = template("{{ $value | humanize }} {{ $labels.state }}").unwrap();
        assert_eq!(t.text, "{value:.3} {label_state}");
        assert_eq!(t.notes.len(), 1);
        assert!(template("{{ $labels.x").is_err());
        let e = template("{{ range $labels }}x{{ end }}").unwrap_err();
        assert!(e.contains("`{{ range $labels }}` is not supported"), "{e}");
    }

    #[test]
    fn names_and_literals() {
        assert_eq!(ident("device"), "device");
        assert_eq!(ident("Device"), "\"Device\"");
        assert_eq!(ident("mode"), "\"mode\"");
        assert_eq!(ident("user"), "\"user\"");
        assert_eq!(quote("it's"), "'it''s'");
        assert_eq!(interval(300_000), "INTERVAL '5' MINUTE");
        assert_eq!(interval(300_001), "INTERVAL '300001' MILLISECOND");
        assert_eq!(interval(90_000), "INTERVAL '90' SECOND");
        assert_eq!(
            object_name("instance:node_cpu:rate5m"),
            "instance_node_cpu_rate5m"
        );
    }
}
