//! The dot commands: `.help`, `.streams`, `.describe`, `.queries`, `.stop`,
//! `.read`, `.format`, `.quit`; and the psql commands people type out of
//! habit: `\q`, `\d`, `\d NAME`, `\i FILE`, `\?`, `\h`.

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::logical_expr::{LogicalPlan, TableSource};

use super::helper::{Completeness, completeness, split_background};
use super::{Flow, Repl};
use crate::connectors::{
    Format, OutputFormat, SinkConfig, SinkTarget, SourceLocation, parse_output_format,
};
use crate::plan::catalog::{BUILTIN_STREAMS, builtin_stream};
use crate::plan::{AlertNode, Catalog, InvariantNode, StreamDef, ViewSource};

const HELP: &str = "\
Statements end with ';' and may span lines. A query runs in the foreground,
printing results as its windows fire, until its input ends or Ctrl-C stops
it; end it with '&' instead of ';' to run it in the background.

  .help                    this text
  .streams                 streams, views, alerts and sinks: kind, columns
                           and source (built-in streams too)
  .describe NAME           one stream, view, alert or sink: columns, types,
                           event time
  .queries                 background queries: id, rows out, statement
  .stop ID|all             stop a background query (or all of them)
  .read FILE [&]           run a script (its queries in the background
                           with '&'); its relative paths resolve against
                           its directory
  .format table|csv|jsonl  how results are printed (now: {format})
  .quit, .exit             leave (so do Ctrl-D and Ctrl-C twice)

psql's \\q, \\d, \\d NAME, \\i FILE and \\? do the same as .quit, .streams,
.describe NAME, .read FILE and .help.
";

impl Repl {
    /// Runs one dot command.
    pub(super) async fn command(&mut self, line: &str) -> Flow {
        let (name, arg) = match line.split_once(char::is_whitespace) {
            Some((name, arg)) => (name, arg.trim()),
            None => (line, ""),
        };
        match name {
            ".quit" | ".exit" => return Flow::Quit,
            ".help" => out!("{}", HELP.replace("{format}", format_name(self.format))),
            ".streams" => self.list_streams(),
            ".describe" => self.describe(arg),
            ".queries" => self.list_queries(),
            ".stop" => self.stop(arg),
            ".read" => self.read(arg).await,
            ".format" => self.set_format(arg),
            _ => self.fail(format_args!(
                "unknown command {name} (.help lists the commands)"
            )),
        }
        Flow::Continue
    }

    /// Runs a psql command: the few that have a dot command of the same
    /// meaning; any other gets a hint rather than a continuation prompt.
    pub(super) async fn backslash(&mut self, line: &str) -> Flow {
        let (name, arg) = match line.split_once(char::is_whitespace) {
            Some((name, arg)) => (name, arg.trim()),
            None => (line, ""),
        };
        match (name, arg.is_empty()) {
            ("\\q" | "\\quit", true) => Flow::Quit,
            ("\\d", true) => self.command(".streams").await,
            ("\\d", false) => self.command(&format!(".describe {arg}")).await,
            ("\\i", _) => self.command(&format!(".read {arg}")).await,
            ("\\?" | "\\h" | "\\help", _) => self.command(".help").await,
            _ => {
                self.fail(format_args!("unknown command {name}; try .help"));
                Flow::Continue
            }
        }
    }

    fn list_streams(&self) {
        let catalog = self.session.engine().catalog();
        let mut rows: Vec<[String; 4]> = all_streams(catalog)
            .map(|s| {
                let mut from = source(s);
                if is_builtin(s) {
                    from.push_str(" (built in)");
                }
                [s.name.clone(), "stream".into(), columns(&s.schema), from]
            })
            .collect();
        rows.extend(catalog.views().map(|(name, view)| {
            [
                name.to_string(),
                view_kind(view).into(),
                columns(&view.schema()),
                String::new(),
            ]
        }));
        rows.extend(catalog.sinks().map(|sink| {
            [
                sink.name.clone(),
                "sink".into(),
                String::new(),
                sink_target(sink),
            ]
        }));
        print_table(&["name", "kind", "columns", "source"], &rows);
    }

    fn describe(&self, name: &str) {
        if name.is_empty() {
            self.fail(".describe needs a stream, view, alert or sink name");
            return;
        }
        let name = name.trim_end_matches(';');
        let catalog = self.session.engine().catalog();
        let key = if name.starts_with('"') {
            name.trim_matches('"').to_string()
        } else {
            name.to_lowercase()
        };
        // A stream or view hides a built-in stream of the same name.
        if let Some(view) = catalog.view(&key) {
            outln!("{} {key}", view_kind(view));
            describe_columns(&view.schema(), None);
        } else if let Some(stream) = catalog.stream(&key) {
            outln!("stream {}: {}", stream.name, source(stream));
            if let Some(i) = stream.event_time {
                let mut timing = format!(
                    "event time: {}, watermark delay {}",
                    stream.schema.field(i).name(),
                    duration(stream.delay_ms)
                );
                if stream.lateness_ms > 0 {
                    timing.push_str(&format!(
                        ", allowed lateness {}",
                        duration(stream.lateness_ms)
                    ));
                }
                if let Some(idle) = stream.idle_timeout {
                    timing.push_str(&format!(
                        ", idle timeout {}",
                        duration(idle.as_millis() as i64)
                    ));
                }
                outln!("{timing}");
            }
            describe_columns(&stream.schema, stream.event_time);
        } else if let Some(sink) = catalog.sink(&key) {
            outln!("sink {key}: {}", sink_target(sink));
        } else {
            self.fail(format_args!(
                "no stream, view, alert or sink named '{key}' (.streams lists them)"
            ));
        }
    }

    fn list_queries(&self) {
        let queries = self.session.queries();
        if queries.is_empty() {
            outln!("no queries running");
            return;
        }
        let rows: Vec<[String; 4]> = queries
            .iter()
            .map(|q| {
                let rows_in = q
                    .sources
                    .iter()
                    .map(|(name, rows, _)| format!("{name}: {rows}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                [
                    q.id.to_string(),
                    q.rows_out.to_string(),
                    rows_in,
                    q.label.clone(),
                ]
            })
            .collect();
        print_table(&["id", "rows out", "rows in", "query"], &rows);
    }

    fn stop(&self, arg: &str) {
        if arg == "all" {
            let queries = self.session.queries();
            for q in &queries {
                self.session.stop(q.id);
            }
            match queries.len() {
                1 => outln!("stopped 1 query"),
                n => outln!("stopped {n} queries"),
            }
            return;
        }
        match arg.trim_start_matches('[').trim_end_matches(']').parse() {
            Ok(id) if self.session.stop(id) => outln!("stopped query {id}"),
            Ok(id) => self.fail(format_args!(
                "no query {id} is running (.queries lists them)"
            )),
            Err(_) => self.fail(".stop needs a query id (.queries lists them) or 'all'"),
        }
    }

    async fn read(&mut self, arg: &str) {
        let (arg, background) = match arg.strip_suffix('&') {
            Some(rest) => (rest.trim_end(), true),
            None => (arg, false),
        };
        let path = Path::new(arg.trim_matches(|c| c == '\'' || c == '"'));
        if arg.is_empty() {
            self.fail(".read needs a file name");
            return;
        }
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) => {
                self.fail(format_args!("cannot read {}: {e}", path.display()));
                return;
            }
        };
        match completeness(&text) {
            Completeness::Empty => return,
            // The last statement may lack its `;`.
            Completeness::Incomplete | Completeness::Complete => {}
        }
        let (sql, trailing) = split_background(&text);
        self.run_sql(&sql, background || trailing, Some(path)).await;
    }

    fn set_format(&mut self, arg: &str) {
        if arg.is_empty() {
            outln!("{}", format_name(self.format));
            return;
        }
        match parse_output_format(arg) {
            Ok(format) => self.format = format,
            Err(e) => self.fail(e),
        }
    }
}

/// The declared streams, then the built-in ones that no stream or view
/// hides.
pub(super) fn all_streams(catalog: &Catalog) -> impl Iterator<Item = &Arc<StreamDef>> {
    let builtin = BUILTIN_STREAMS
        .iter()
        .filter(|(name, _)| catalog.view(name).is_none())
        .filter_map(|(name, _)| catalog.stream(name))
        .filter(|s| is_builtin(s));
    catalog.streams().chain(builtin)
}

/// True for a built-in stream (not a declared one of the same name).
fn is_builtin(stream: &Arc<StreamDef>) -> bool {
    builtin_stream(&stream.name).is_some_and(|b| Arc::ptr_eq(b, stream))
}

/// What a view is: an alert (`CREATE ALERT`), an invariant, or a view.
fn view_kind(view: &ViewSource) -> &'static str {
    match view.get_logical_plan().as_deref() {
        Some(LogicalPlan::Extension(ext)) if ext.node.as_any().is::<AlertNode>() => "alert",
        Some(LogicalPlan::Extension(ext)) if ext.node.as_any().is::<InvariantNode>() => "invariant",
        _ => "view",
    }
}

/// Where a sink writes, in a few words. A webhook shows its address
/// without the query string or credentials, which may hold secrets.
fn sink_target(sink: &SinkConfig) -> String {
    let format = format_name(sink.format);
    match &sink.target {
        SinkTarget::Stdout => format!("stdout ({format})"),
        SinkTarget::File(path) => format!("file {} ({format})", path.display()),
        SinkTarget::Webhook(hook) => match url::Url::parse(&hook.url) {
            Ok(url) => format!(
                "webhook {}://{}{}",
                url.scheme(),
                url.host_str().unwrap_or(""),
                url.path()
            ),
            Err(_) => "webhook".into(),
        },
    }
}

fn format_name(format: OutputFormat) -> &'static str {
    match format {
        OutputFormat::Table => "table",
        OutputFormat::Csv => "csv",
        OutputFormat::Jsonl => "jsonl",
    }
}

/// A column type as SQL names it in `CREATE STREAM`.
fn sql_type(data_type: &DataType) -> String {
    match data_type {
        DataType::Timestamp(TimeUnit::Millisecond, None) => "TIMESTAMP".into(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "TEXT".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::Boolean => "BOOLEAN".into(),
        other => other.to_string(),
    }
}

fn columns(schema: &SchemaRef) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{} {}", f.name(), sql_type(f.data_type())))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where a stream's rows come from, in a few words.
fn source(stream: &StreamDef) -> String {
    let format = match stream.source.format {
        Format::Csv => "csv",
        Format::Jsonl => "jsonl",
    };
    match &stream.source.location {
        SourceLocation::File(path) => format!("file {} ({format})", path.display()),
        SourceLocation::Stdin => format!("stdin ({format})"),
        SourceLocation::Push => "push".into(),
        SourceLocation::Host { interval, .. } => {
            format!("this host, every {} ms", interval.as_millis())
        }
        SourceLocation::Demo { speed, .. } => format!("demo replay, {speed} rows/s"),
    }
}

fn duration(ms: i64) -> String {
    if ms % 1000 == 0 {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

fn describe_columns(schema: &SchemaRef, event_time: Option<usize>) {
    let rows: Vec<[String; 3]> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let note = if Some(i) == event_time {
                "event time"
            } else {
                ""
            };
            [f.name().clone(), sql_type(f.data_type()), note.to_string()]
        })
        .collect();
    print_table(&["column", "type", "note"], &rows);
}

/// Prints rows of text as a table like the query results.
fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let fields: Vec<Field> = header
        .iter()
        .map(|name| Field::new(*name, DataType::Utf8, false))
        .collect();
    let columns: Vec<ArrayRef> = (0..N)
        .map(|i| Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r[i]))) as ArrayRef)
        .collect();
    let table = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(crate::error::Error::from)
        .and_then(|batch| Ok(pretty_format_batches(&[batch])?));
    match table {
        Ok(table) => outln!("{table}"),
        Err(e) => errln!("error: {e}"),
    }
}
