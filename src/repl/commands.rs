//! The dot commands: `.help`, `.streams`, `.describe`, `.queries`, `.stop`,
//! `.read`, `.format`, `.quit`.

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::logical_expr::TableSource;

use super::helper::{Completeness, completeness, split_background};
use super::{Flow, Repl};
use crate::connectors::{Format, OutputFormat, SourceLocation, parse_output_format};
use crate::plan::StreamDef;

const HELP: &str = "\
Statements end with ';' and may span lines. A query runs in the foreground,
printing results as its windows fire, until its input ends or Ctrl-C stops
it; end it with '&' instead of ';' to run it in the background.

  .help                    this text
  .streams                 declared streams and views: columns and source
  .describe NAME           one stream or view: columns, types, event time
  .queries                 background queries: id, rows out, statement
  .stop ID|all             stop a background query (or all of them)
  .read FILE [&]           run a script (its queries in the background
                           with '&'); its relative paths resolve against
                           its directory
  .format table|csv|jsonl  how results are printed (now: {format})
  .quit, .exit             leave (so do Ctrl-D and Ctrl-C twice)
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
            _ => errln!("error: unknown command {name} (.help lists the commands)"),
        }
        Flow::Continue
    }

    fn list_streams(&self) {
        let catalog = self.session.engine().catalog();
        let mut rows: Vec<[String; 3]> = catalog
            .streams()
            .map(|s| [s.name.clone(), columns(&s.schema), source(s)])
            .collect();
        rows.extend(
            catalog
                .views()
                .map(|(name, view)| [name.to_string(), columns(&view.schema()), "view".into()]),
        );
        if rows.is_empty() {
            outln!("no streams or views yet (CREATE STREAM declares one)");
            return;
        }
        print_table(&["name", "columns", "source"], &rows);
    }

    fn describe(&self, name: &str) {
        if name.is_empty() {
            errln!("error: .describe needs a stream or view name");
            return;
        }
        let name = name.trim_end_matches(';');
        let catalog = self.session.engine().catalog();
        let key = if name.starts_with('"') {
            name.trim_matches('"').to_string()
        } else {
            name.to_lowercase()
        };
        if let Some(stream) = catalog.stream(&key) {
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
        } else if let Some(view) = catalog.view(&key) {
            outln!("view {key}");
            describe_columns(&view.schema(), None);
        } else {
            errln!("error: no stream or view named '{key}' (.streams lists them)");
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
            Ok(id) => errln!("error: no query {id} is running (.queries lists them)"),
            Err(_) => errln!("error: .stop needs a query id (.queries lists them) or 'all'"),
        }
    }

    async fn read(&mut self, arg: &str) {
        let (arg, background) = match arg.strip_suffix('&') {
            Some(rest) => (rest.trim_end(), true),
            None => (arg, false),
        };
        let path = Path::new(arg.trim_matches(|c| c == '\'' || c == '"'));
        if arg.is_empty() {
            errln!("error: .read needs a file name");
            return;
        }
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) => {
                errln!("error: cannot read {}: {e}", path.display());
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
            Err(e) => errln!("error: {e}"),
        }
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
