//! Completion inside `WITH (...)` of `CREATE STREAM` and `CREATE SINK`,
//! from the connector registry: connector names after `connector = '`,
//! and elsewhere the options of the statement's connector.

use crate::connector::OptionSpec;
use crate::connectors::registry;

/// What to complete at the end of `before` (the statement typed so far),
/// if it is inside a `WITH (...)` list.
#[derive(Debug, PartialEq, Eq)]
pub enum WithCompletion {
    /// A connector name: the cursor is in the quotes after `connector =`.
    Connector(Vec<&'static str>),
    /// An option name of the statement's connector (all of them when it
    /// names none yet).
    Option(Vec<String>),
}

/// The candidates at the end of `before`; `in_quotes` says whether the
/// cursor is inside a single-quoted string.
pub fn complete(before: &str, in_quotes: bool) -> Option<WithCompletion> {
    let lower = before.to_ascii_lowercase();
    let sink = lower.contains("create sink");
    if !sink && !lower.contains("create stream") && !lower.contains("create or replace stream") {
        return None;
    }
    let with = lower.rfind("with")?;
    let open = with + lower[with..].find('(')?;
    let list = &lower[open + 1..];
    if !in_quotes && list.contains(')') {
        return None;
    }
    if in_quotes {
        let quote = list.rfind('\'')?;
        let key = list[..quote].trim_end().strip_suffix('=')?.trim_end();
        if !key.ends_with("connector") {
            return None;
        }
        return Some(WithCompletion::Connector(connector_names(sink)));
    }
    let named = connector_named(list);
    Some(WithCompletion::Option(option_names(sink, named.as_deref())))
}

fn connector_names(sink: bool) -> Vec<&'static str> {
    if sink {
        registry::SINKS.iter().map(|c| c.name()).collect()
    } else {
        registry::SOURCES.iter().map(|c| c.name()).collect()
    }
}

/// The value of `connector = '...'` in a `WITH` list, if given.
fn connector_named(list: &str) -> Option<String> {
    let at = list.find("connector")?;
    let rest = list[at + "connector".len()..]
        .trim_start()
        .strip_prefix('=')?;
    let rest = rest.trim_start().strip_prefix('\'')?;
    Some(rest[..rest.find('\'')?].trim().to_string())
}

fn option_names(sink: bool, connector: Option<&str>) -> Vec<String> {
    let specs: Vec<&'static [OptionSpec]> = match (sink, connector) {
        (true, Some(name)) => registry::sink(name)
            .map(|c| c.options())
            .into_iter()
            .collect(),
        (false, Some(name)) => registry::source(name)
            .map(|c| c.options())
            .into_iter()
            .collect(),
        (true, None) => registry::SINKS.iter().map(|c| c.options()).collect(),
        (false, None) => registry::SOURCES.iter().map(|c| c.options()).collect(),
    };
    let mut names: Vec<String> = std::iter::once("connector".to_string())
        .chain(
            specs
                .iter()
                .flat_map(|s| s.iter())
                .map(|s| s.name.to_string()),
        )
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(before: &str) -> Vec<String> {
        match complete(before, false) {
            Some(WithCompletion::Option(names)) => names,
            other => panic!("{before}: {other:?}"),
        }
    }

    #[test]
    fn connector_names_come_from_the_registry() {
        let Some(WithCompletion::Connector(names)) =
            complete("CREATE STREAM m (ts TIMESTAMP) WITH (connector = '", true)
        else {
            panic!("no connector completion")
        };
        assert!(
            names.contains(&"host") && names.contains(&"file"),
            "{names:?}"
        );
        assert!(!names.contains(&"webhook"));
        let Some(WithCompletion::Connector(names)) =
            complete("create sink s with (format = 'csv', connector='", true)
        else {
            panic!("no connector completion")
        };
        assert!(names.contains(&"webhook") && !names.contains(&"host"));
    }

    #[test]
    fn option_names_are_those_of_the_named_connector() {
        let host = options("CREATE STREAM h (ts TIMESTAMP) WITH (connector = 'host', ");
        assert_eq!(host, ["connector", "interval", "limit"]);
        let any = options("CREATE STREAM m (ts TIMESTAMP) WITH (");
        assert!(any.contains(&"path".to_string()) && any.contains(&"interval".to_string()));
        let webhook = options("CREATE SINK p WITH (connector = 'webhook', ");
        assert!(webhook.contains(&"header_".to_string()) && webhook.contains(&"url".to_string()));
    }

    #[test]
    fn nothing_outside_a_with_list() {
        assert_eq!(complete("SELECT * FROM m WHERE ", false), None);
        assert_eq!(
            complete(
                "CREATE STREAM m (ts TIMESTAMP) WITH (path = 'm.csv') ",
                false
            ),
            None
        );
        assert_eq!(complete("CREATE STREAM m WITH (path = '", true), None);
    }
}
