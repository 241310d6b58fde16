//! The one list of connectors: every source and sink vigil has, each
//! behind one trait, declaring its options and columns.
//!
//! The planner builds a stream's [`SourceConfig`] and a sink's
//! [`SinkConfig`] through it ([`SourceConfig::from_options`],
//! [`SinkConfig::from_options`]); `vigil check`, the shell's completion and
//! `vigil connectors` (the reference the docs are checked against) read it.
//! Adding a connector is one module implementing [`SourceConnector`] or
//! [`SinkConnector`] and one line in [`SOURCES`] or [`SINKS`].
//!
//! # The contract
//!
//! - [`SourceConnector::options`] lists every `WITH` key the connector
//!   takes, with its [`OptionType`]: [`Options`] rejects any other key, a
//!   repeated key and a value that is not of its type before
//!   [`SourceConnector::configure`] is called, with an error naming the
//!   key, the value and the spec's `accepted` text. `configure` applies
//!   what the type cannot say (bounds, options that exclude each other)
//!   with [`Options::bad_value`], so every error reads the same.
//! - [`SourceConnector::columns`] says where the columns come from:
//!   declared freely (decoded from text by name) or picked by name from a
//!   fixed catalogue, which the registry checks before `configure`.
//! - A source that reads by itself (a sampler, a scraper) puts a
//!   [`SourceRead`] in [`SourceLocation::Connector`]; the runtime calls its
//!   `read` on a blocking thread. A source fed from outside (the service's
//!   push endpoints) is [`SourceLocation::Push`] with its connector's
//!   name in [`SourceConfig::connector`].
//! - A sink puts a [`SinkOpen`] in [`SinkTarget::Connector`], unless it is
//!   stdout or a file, which the runtime shares between queries itself.

use std::path::Path;

use datafusion::arrow::datatypes::SchemaRef;

use crate::connector::catalogue::{CatalogueColumn, match_columns};
use crate::connector::options::Options;
use crate::connector::{
    Columns, Connectors, OptionSpec, OptionType, SinkConfig, SinkConnector, SourceConfig,
    SourceConnector, StreamDecl,
};
use crate::error::{Error, Result};

/// Every source connector, in the order the reference lists them.
pub static SOURCES: &[&dyn SourceConnector] = &[
    &super::file::FileSource,
    &super::file::StdinSource,
    &super::file::PushSource,
    &super::host::HostSource,
    &super::demo::DemoSource,
    &super::prometheus::PrometheusSource,
    &super::remote_write::RemoteWriteSource,
    &super::otlp::OtlpSource,
    &super::influx::InfluxSource,
    &super::kafka::KafkaSourceConnector,
];

/// Every sink connector, in the order the reference lists them.
pub static SINKS: &[&dyn SinkConnector] = &[
    &super::file::FileSink,
    &super::file::StdoutSink,
    &super::webhook::WebhookSinkConnector,
    &super::remote_write::RemoteWriteSink,
    &super::alertmanager::AlertmanagerSinkConnector,
    &super::kafka::KafkaSinkConnector,
];

/// The source connector named `name` (any case, spaces around ignored).
pub fn source(name: &str) -> Option<&'static dyn SourceConnector> {
    let name = name.trim();
    SOURCES
        .iter()
        .copied()
        .find(|c| c.name().eq_ignore_ascii_case(name))
}

/// The sink connector named `name` (any case, spaces around ignored).
pub fn sink(name: &str) -> Option<&'static dyn SinkConnector> {
    let name = name.trim();
    SINKS
        .iter()
        .copied()
        .find(|c| c.name().eq_ignore_ascii_case(name))
}

/// The fixed columns of the source connector `name`, if it has them.
pub fn catalogue(name: &str) -> Option<&'static [CatalogueColumn]> {
    match source(name)?.columns() {
        Columns::Catalogue(columns) => Some(columns),
        Columns::Declared => None,
    }
}

/// `file, stdin, push, ...`: the names of `connectors`.
fn names<'a>(connectors: impl Iterator<Item = &'a str>) -> String {
    connectors.collect::<Vec<_>>().join(", ")
}

/// The `connector` option of `options`, or `default`.
fn connector_option<'a>(options: &'a [(String, String)], default: &'a str) -> &'a str {
    options
        .iter()
        .find(|(k, _)| k == "connector")
        .map_or(default, |(_, v)| v.as_str())
}

impl SourceConfig {
    /// Builds a source configuration from a `CREATE STREAM` statement's
    /// `WITH` options: `connector` (default `file`) picks the connector in
    /// [`SOURCES`], whose declared options the others are checked against
    /// (see the module documentation); relative paths are resolved against
    /// `base_dir`.
    pub fn from_options(
        stream: &str,
        schema: SchemaRef,
        event_time: Option<usize>,
        options: &[(String, String)],
        base_dir: &Path,
    ) -> Result<SourceConfig> {
        let what = format!("stream {stream}");
        let name = connector_option(options, "file");
        let Some(connector) = source(name) else {
            return Err(Error::Plan(format!(
                "{what}: bad value '{name}' for option 'connector' (accepted: {})",
                names(SOURCES.iter().map(|c| c.name()))
            )));
        };
        let opts = Options::new(what, options, connector.options())?;
        if let Columns::Catalogue(catalogue) = connector.columns() {
            match_columns(stream, connector.name(), &schema, catalogue)?;
        }
        let decl = StreamDecl {
            stream,
            schema,
            event_time,
            base_dir,
        };
        connector.configure(&decl, &opts)
    }
}

impl SinkConfig {
    /// Builds a sink configuration from a `CREATE SINK` statement's `WITH`
    /// options: `connector` (default `file`) picks the connector in
    /// [`SINKS`], whose declared options the others are checked against;
    /// relative paths are resolved against `base_dir`.
    pub fn from_options(
        name: &str,
        options: &[(String, String)],
        base_dir: &Path,
    ) -> Result<SinkConfig> {
        let what = format!("sink {name}");
        let connector_name = connector_option(options, "file");
        let Some(connector) = sink(connector_name) else {
            return Err(Error::Plan(format!(
                "{what}: bad value '{connector_name}' for option 'connector' (accepted: {})",
                names(SINKS.iter().map(|c| c.name()))
            )));
        };
        let opts = Options::new(what, options, connector.options())?;
        connector.configure(name, &opts, base_dir)
    }
}

/// The registry as the catalog resolves `connector = '...'` through it:
/// the engine hands it over (see [`Connectors`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Registry;

impl Connectors for Registry {
    fn source(&self, decl: &StreamDecl<'_>, options: &[(String, String)]) -> Result<SourceConfig> {
        SourceConfig::from_options(
            decl.stream,
            decl.schema.clone(),
            decl.event_time,
            options,
            decl.base_dir,
        )
    }

    fn sink(
        &self,
        name: &str,
        options: &[(String, String)],
        base_dir: &Path,
    ) -> Result<SinkConfig> {
        SinkConfig::from_options(name, options, base_dir)
    }

    fn catalogue(&self, connector: &str) -> Option<&'static [CatalogueColumn]> {
        catalogue(connector)
    }
}

/// The line before the generated reference in `grammar/README.md`.
pub const BEGIN: &str =
    "<!-- connectors: generated by `vigil connectors`; edit src/connectors, not here -->";

/// The line after it.
pub const END: &str = "<!-- end of connectors -->";

/// The reference of every connector, as Markdown: one section per
/// connector with its summary, its columns when fixed, and a table of its
/// options. `vigil connectors` prints it; a test checks that
/// `grammar/README.md` carries it.
pub fn reference() -> String {
    let mut out = String::from("### Sources\n\n");
    for c in SOURCES {
        out += &format!("#### `{}`\n\n{}\n\n", c.name(), c.summary());
        if let Columns::Catalogue(columns) = c.columns() {
            out += "| column | type | meaning |\n|---|---|---|\n";
            for col in columns {
                out += &format!(
                    "| `{}` | {} | {} |\n",
                    col.name,
                    super::catalogue::sql_type(&col.data_type),
                    col.meaning
                );
            }
            out += "\n";
        }
        out += &options_table(c.options());
    }
    out += "### Sinks\n\n";
    for c in SINKS {
        out += &format!("#### `{}`\n\n{}\n\n", c.name(), c.summary());
        out += &options_table(c.options());
    }
    out
}

fn options_table(specs: &[OptionSpec]) -> String {
    if specs.is_empty() {
        return "No options.\n\n".into();
    }
    let mut out = String::from("| option | accepted | default | meaning |\n|---|---|---|---|\n");
    for s in specs {
        let name = match s.ty {
            OptionType::Prefix => format!("{}<name>", s.name),
            _ => s.name.to_string(),
        };
        out += &format!(
            "| `{name}` | {} | {} | {} |\n",
            s.accepted.replace('|', "\\|"),
            s.default.unwrap_or("none"),
            s.doc.replace('|', "\\|")
        );
    }
    out + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_options_are_lower_case() {
        for (i, c) in SOURCES.iter().enumerate() {
            assert!(
                SOURCES[..i].iter().all(|o| o.name() != c.name()),
                "{}",
                c.name()
            );
            for o in c.options() {
                assert_eq!(o.name, o.name.to_ascii_lowercase(), "{}", c.name());
                assert_ne!(o.name, "connector");
            }
        }
        for (i, c) in SINKS.iter().enumerate() {
            assert!(
                SINKS[..i].iter().all(|o| o.name() != c.name()),
                "{}",
                c.name()
            );
        }
        assert!(source(" HOST ").is_some() && sink("WebHook").is_some());
        assert!(source("nothing").is_none());
    }

    #[test]
    fn the_grammar_reference_carries_the_registry() {
        let grammar = include_str!("../../grammar/README.md");
        let reference = format!("{BEGIN}\n\n{}{END}", reference());
        assert!(
            grammar.contains(&reference),
            "grammar/README.md's connector reference is out of date: \
             paste the output of `vigil connectors` between its markers"
        );
    }
}
