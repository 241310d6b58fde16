//! The dot commands: `.help`, `.streams` (`.tables`), `.describe`,
//! `.queries`, `.stats`, `.stop`, `.read`, `.group`, `.format`,
//! `.expanded`, `.quit`; and the psql commands people type out of habit:
//! `\q`, `\d`, `\dt`, `\d NAME`, `\x`, `\i FILE`, `\?`, `\h`.

use std::path::Path;

use super::helper::{Completeness, completeness, split_background};
use super::{Flow, Repl};
use crate::connector::OutputFormat;
use crate::connectors::parse_output_format;
use crate::connectors::table::{draw, expanded, widest_line};
use crate::engine::Dropped;
use crate::group::status::status_text;
use crate::plan::listing::Listing;
use crate::sql::Show;
use crate::state::store::Location;

const HELP: &str = "\
Statements end with ';' and may span lines. A query runs in the foreground,
printing results as its windows fire, until its input ends or Ctrl-C stops
it; end it with '&' instead of ';' to run it in the background.

  .help                    this text
  .streams                 streams, views, alerts and sinks: kind, columns
                           and source (built-in streams too)
  .describe NAME           one stream, view, alert or sink: columns, types,
                           event time
  .queries                 background queries: id, rows out, late and shed
                           rows, rows in, statement
  .stats [ID]              per running query (or query ID): each operator's
                           rows in and out, busy and blocked time, the
                           bottleneck; its queues; result latency
  .stop ID|all             stop a background query (or all of them)
  .read FILE [&]           run a script (its queries in the background
                           with '&'); its relative paths resolve against
                           its directory
  .group NAME DIR          a group of `vigil run --group NAME` processes:
                           its members, their Kafka partitions, each
                           partition's lag and checkpoint age (DIR: their
                           --checkpoint-dir, a path or a URL)
  .format table|csv|jsonl  how results are printed (now: {format})
  .expanded on|off|auto    listings one field a line, long values wrapped
                           (auto: when a table is wider than the
                           terminal; now: {expanded})
  .quit, .exit             leave (so do Ctrl-D and Ctrl-C twice)

psql's \\q, \\d (and \\dt, and DuckDB's .tables), \\d NAME, \\x, \\i FILE and \\?
do the same as .quit, .streams, .describe NAME, .expanded, .read FILE and
.help. The listings are SQL statements too: SHOW STREAMS|VIEWS|ALERTS|SINKS|
QUERIES (SHOW TABLES lists them all) and DESCRIBE NAME; DROP and CREATE OR
REPLACE undo and redo a declaration. A query that reads no stream (SELECT 1,
SELECT now()) answers once, as in any SQL shell.
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
            ".help" => out!(
                "{}",
                HELP.replace("{format}", format_name(self.format))
                    .replace("{expanded}", self.expanded.name())
            ),
            ".streams" | ".tables" => self.list_streams(),
            ".expanded" => self.set_expanded(arg),
            ".describe" => self.describe(arg),
            ".queries" => self.list_queries(),
            ".stats" => self.show_stats(arg),
            ".stop" => self.stop(arg),
            ".read" => self.read(arg).await,
            ".group" => self.show_group(arg).await,
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
            ("\\d" | "\\dt", true) => self.command(".streams").await,
            ("\\x", _) => {
                // psql's \x alone toggles.
                let arg = match (arg, self.expanded) {
                    ("", Expanded::On) => "off",
                    ("", _) => "on",
                    (arg, _) => arg,
                };
                self.command(&format!(".expanded {arg}")).await
            }
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
        let listing = self.session.engine().show(Show::Streams);
        if listing.rows.is_empty() {
            outln!("no streams or views yet (CREATE STREAM declares one)");
            return;
        }
        self.print_table(&listing);
    }

    fn describe(&self, name: &str) {
        if name.is_empty() {
            self.fail(".describe needs a stream, view, alert or sink name");
            return;
        }
        let name = name.trim_end_matches(';');
        let key = if name.starts_with('"') {
            name.trim_matches('"').to_string()
        } else {
            name.to_lowercase()
        };
        match self.session.engine().describe(&key) {
            Ok(listing) => self.print_table(&listing),
            Err(e) => self.fail(e),
        }
    }

    fn list_queries(&self) {
        let listing = self.session.show_queries();
        if listing.rows.is_empty() {
            outln!("no queries running");
            return;
        }
        self.print_table(&listing);
    }

    /// `.stats`: what each running query's operators and queues measure
    /// now (`EXPLAIN ANALYZE` prints the same table for a query it runs to
    /// its end).
    fn show_stats(&self, arg: &str) {
        let mut queries = self.session.queries();
        if !arg.is_empty() {
            let Ok(id) = arg
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<u64>()
            else {
                self.fail(".stats takes a query id (.queries lists them)");
                return;
            };
            queries.retain(|q| q.id == id);
            if queries.is_empty() {
                self.fail(format_args!(
                    "no query {id} is running (.queries lists them)"
                ));
                return;
            }
        }
        if queries.is_empty() {
            outln!("no queries running");
            return;
        }
        let scaling = self.session.autoscaling();
        for q in queries {
            outln!("[{}] {}", q.id, q.label);
            out!("{}", crate::analyze::live_text(&q.stats));
            if let Some(scaled) = scaling.iter().find(|s| s.id == q.id) {
                outln!("{}", scaled.text());
            }
        }
    }

    /// Prints the rows of `SHOW` or `DESCRIBE` in the output format of
    /// query results.
    pub(super) fn print_rows(&self, listing: &Listing) {
        if self.format == OutputFormat::Table {
            return self.print_table(listing);
        }
        for note in &listing.notes {
            outln!("{note}");
        }
        let text = listing.to_batch().and_then(|batch| {
            let mut renderer = super::output::Renderer::new(self.format, usize::MAX);
            let text = renderer.push(&batch)?;
            Ok(text + &renderer.finish())
        });
        match text {
            Ok(text) => out!("{text}"),
            Err(e) => self.fail(e),
        }
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

    /// `.group NAME DIR`: what `vigil group NAME --checkpoint-dir DIR`
    /// prints. It reads the checkpoint store and asks the brokers (a few
    /// seconds if they do not answer), so it runs on the blocking pool,
    /// leaving the background queries their threads.
    async fn show_group(&self, arg: &str) {
        let usage = ".group needs a group name and the checkpoint directory its members share: .group NAME DIR";
        let Some((name, dir)) = arg.split_once(char::is_whitespace) else {
            self.fail(usage);
            return;
        };
        let dir = dir.trim().trim_matches(|c| c == '\'' || c == '"');
        if dir.is_empty() {
            self.fail(usage);
            return;
        }
        let location = match Location::parse(dir) {
            Ok(location) => location,
            Err(e) => {
                self.fail(e);
                return;
            }
        };
        let name = name.to_string();
        match tokio::task::spawn_blocking(move || status_text(&location, &name)).await {
            Ok(Ok(text)) => out!("{text}"),
            Ok(Err(e)) => self.fail(e),
            Err(e) => self.fail(format_args!("reading the group failed: {e}")),
        }
    }

    /// Prints a listing as a table after its notes; expanded (one field a
    /// line) when `.expanded` says so, or, with `auto`, when the table is
    /// wider than the terminal.
    pub(super) fn print_table(&self, listing: &Listing) {
        for note in &listing.notes {
            outln!("{note}");
        }
        let text = listing.to_batch().and_then(|batch| {
            let table = draw(&batch)?;
            let wide = widest_line(&table) > self.columns;
            match (self.expanded, wide) {
                (Expanded::On, _) | (Expanded::Auto, true) => expanded(&batch, self.columns),
                _ => Ok(table),
            }
        });
        match text {
            Ok(text) => out!("{text}"),
            Err(e) => self.fail(e),
        }
    }

    fn set_expanded(&mut self, arg: &str) {
        match arg {
            "" => outln!("{}", self.expanded.name()),
            "on" => self.expanded = Expanded::On,
            "off" => self.expanded = Expanded::Off,
            "auto" => self.expanded = Expanded::Auto,
            other => self.fail(format_args!(
                ".expanded takes on, off or auto, not '{other}'"
            )),
        }
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

fn format_name(format: OutputFormat) -> &'static str {
    match format {
        OutputFormat::Table => "table",
        OutputFormat::Csv => "csv",
        OutputFormat::Jsonl => "jsonl",
    }
}

/// What `DROP` did, in a line.
pub(super) fn dropped_text(dropped: &[Dropped]) -> String {
    if dropped.is_empty() {
        return "nothing to drop".into();
    }
    let names: Vec<String> = dropped
        .iter()
        .map(|d| format!("{} {}", d.kind, d.name))
        .collect();
    format!("dropped {}", names.join(", "))
}

/// psql's expanded display of listings (`\x`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expanded {
    On,
    Off,
    /// Expanded when a table is wider than the terminal.
    Auto,
}

impl Expanded {
    fn name(self) -> &'static str {
        match self {
            Expanded::On => "on",
            Expanded::Off => "off",
            Expanded::Auto => "auto",
        }
    }
}
