//! The interactive shell: `vigil` with no arguments, or `vigil repl`.
//!
//! Statements typed at the `vigil> ` prompt run in a [`Session`]; a
//! statement may span lines (the prompt turns into `   ...> ` until a `;`
//! ends it). A continuous query runs in the foreground, its results printed
//! as its windows fire, until its input ends or Ctrl-C stops it; one that
//! ends with `&` runs in the background, its lines tagged with its id.
//! Dot commands (`.help`) list streams and queries, stop queries, read
//! scripts, show a group's members (`.group`) and choose the output
//! format; psql's `\q`, `\d` and a few more do the same as their dot
//! commands.
//!
//! Piped input (standard input is not a terminal) runs as a script, as
//! `vigil run` runs it: it stops at its first error, with a failure exit
//! code; background queries and alerts print plain lines, one query's after
//! another (see [`turns`]); at the end of the script the shell waits for
//! the queries whose inputs end and stops those whose inputs never do.
//!
//! The line editor blocks while it reads, so it runs on a blocking thread
//! of the tokio runtime, which keeps running the queries meanwhile.

/// Writes to stdout; a closed stdout must not panic the REPL.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = write!(out, $($arg)*);
        let _ = out.flush();
    }};
}

/// Writes a line to stdout, like [`out!`].
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Writes a line to stderr; a closed stderr must not panic the REPL.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod commands;
mod helper;
mod output;
mod turns;
mod with_options;

use std::cell::Cell;
use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rustyline::config::{CompletionType, Config};
use rustyline::error::ReadlineError;
use rustyline::history::FileHistory;
use rustyline::{Editor, ExternalPrinter};

use crate::connector::{OutputFormat, SourceLocation};
use crate::engine::Outcome;
use crate::error::{Error, Result};
use crate::runtime::live::QueryId;
use crate::session::{QueryHandle, Session, SessionBuilder};
use crate::sql::{Statement, parse_script};
use helper::{Completeness, Names, ReplHelper, Shared, completeness, split_background};
use output::{Printer, Renderer, tagged};

/// The prompt of a new statement.
const PROMPT: &str = "vigil> ";
/// The prompt of the lines that continue a statement.
const CONTINUATION: &str = "   ...> ";
/// How long a foreground query may stay silent before the REPL says how to
/// stop it.
const QUIET_HINT_AFTER: Duration = Duration::from_secs(2);
/// How long the shell waits for a query stopped by Ctrl-C to wind down
/// before it shows the prompt anyway: a task blocked on its input (a quiet
/// FIFO, a webhook) must not hold the prompt.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// How often the shell runs the autoscaling controller
/// ([`Session::autoscale`]); it decides only when a measurement is due.
const AUTOSCALE_TICK: Duration = Duration::from_secs(1);
/// Table rows drawn at once when the terminal's height is not known.
const DEFAULT_SCREENFUL: usize = 40;
/// The width listings fit when the terminal's is not known.
const DEFAULT_COLUMNS: usize = 80;

/// Runs the REPL until `.quit`, Ctrl-D or two Ctrl-C in a row.
///
/// When standard input is not a terminal (a script piped in), the shell
/// stops at the first error, as `psql -v ON_ERROR_STOP=1` does, and the
/// exit code is a failure; otherwise it is a success. Statements run in
/// the session `session` builds (durable with a
/// [`state_dir`](crate::session::SessionBuilder::state_dir)).
pub async fn run(session: SessionBuilder) -> Result<ExitCode> {
    // While the line editor is not reading, the terminal sends Ctrl-C as
    // SIGINT: catch it for the life of the process (a foreground query
    // listens for it), so that it never ends the REPL.
    #[cfg(unix)]
    let _ = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
    let shared = Arc::new(Shared::default());
    let (mut reader, external) = LineReader::new(shared.clone())?;
    let interactive = std::io::stdin().is_terminal();
    let format = if std::io::stdout().is_terminal() {
        OutputFormat::Table
    } else {
        OutputFormat::Csv
    };
    let session = session.build()?;
    let printer = Printer::start(external);
    let script = (!interactive).then(|| Script::new(printer.clone()));
    let mut repl = Repl {
        session,
        format,
        shared,
        printer,
        functions: Vec::new(),
        interactive,
        failed: Cell::new(false),
        screenful: DEFAULT_SCREENFUL,
        columns: DEFAULT_COLUMNS,
        expanded: commands::Expanded::Auto,
        script,
    };
    repl.functions = repl.session.engine().function_names();
    repl.refresh_names();
    if interactive {
        outln!(
            "vigil {}: continuous SQL over streams. End statements with ';', \
             run a query in the background with '&'; .help lists the commands.",
            env!("CARGO_PKG_VERSION")
        );
    }
    repl.read_loop(&mut reader).await;
    repl.finish_script().await;
    repl.printer.close();
    repl.session.shutdown().await;
    reader.save();
    if repl.failed.get() && !interactive {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// What to do after a command.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Quit,
}

/// The REPL's state: the session, the output format and what the line
/// editor's helper sees.
struct Repl {
    session: Session,
    format: OutputFormat,
    shared: Arc<Shared>,
    printer: Printer,
    functions: Vec<String>,
    /// Standard input is a terminal: errors do not end the shell.
    interactive: bool,
    /// An error was reported.
    failed: Cell<bool>,
    /// Table rows that fill the terminal.
    screenful: usize,
    /// The terminal's width, in characters.
    columns: usize,
    /// How listings are displayed (`\x`).
    expanded: commands::Expanded,
    /// The background queries of a piped script (input not a terminal).
    script: Option<Script>,
}

/// What a piped script's background queries need: their output in turns,
/// and what the end of the script waits for.
struct Script {
    turns: turns::Turns,
    running: Vec<Background>,
    /// A background query failed: the script exits with a failure.
    failed: Arc<AtomicBool>,
}

/// A background query of a script.
struct Background {
    id: QueryId,
    /// Its inputs all end, so the script waits for it.
    finite: bool,
    task: tokio::task::JoinHandle<()>,
}

impl Script {
    fn new(printer: Printer) -> Self {
        Self {
            turns: turns::Turns::new(move |text| printer.print(text)),
            running: Vec::new(),
            failed: Arc::default(),
        }
    }
}

/// A query started by a statement.
struct Started {
    handle: QueryHandle,
    /// The sink it writes to (`INSERT INTO`), if any.
    sink: Option<String>,
    /// True for `CREATE ALERT`: it always runs in the background.
    alert: bool,
    /// Every input it reads ends.
    finite: bool,
}

impl Repl {
    /// Reads a line, running the autoscaling controller meanwhile.
    async fn read_scaling(
        &mut self,
        reader: &mut LineReader,
        prompt: &'static str,
    ) -> Result<Read> {
        let read = reader.read(prompt);
        tokio::pin!(read);
        loop {
            tokio::select! {
                read = &mut read => return read,
                _ = tokio::time::sleep(AUTOSCALE_TICK) => self.autoscale().await,
            }
        }
    }

    /// One round of the autoscaling controller; its rescales are printed.
    async fn autoscale(&mut self) {
        for (id, decision) in self.session.autoscale().await {
            self.printer
                .print(format!("autoscale: query {id}: {decision}\n"));
        }
    }

    async fn read_loop(&mut self, reader: &mut LineReader) {
        let mut pending = String::new();
        let mut interrupted = false;
        loop {
            *self
                .shared
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = pending.clone();
            self.shared.line_empty.store(true, Ordering::Relaxed);
            let prompt = if pending.is_empty() {
                PROMPT
            } else {
                CONTINUATION
            };
            let line = match self.read_scaling(reader, prompt).await {
                Ok(Read::Line(line)) => line,
                Ok(Read::Interrupted) => {
                    // Ctrl-C drops what was typed; at an empty prompt it
                    // warns once, then leaves.
                    let empty =
                        pending.is_empty() && self.shared.line_empty.load(Ordering::Relaxed);
                    pending.clear();
                    if !empty {
                        interrupted = false;
                        continue;
                    }
                    if interrupted {
                        break;
                    }
                    interrupted = true;
                    outln!("(to leave, press Ctrl-C again or Ctrl-D, or type .quit)");
                    continue;
                }
                Ok(Read::Eof) => {
                    // A script's last statement may lack its `;`, as in
                    // `.read`.
                    if !self.interactive && completeness(&pending) == Completeness::Incomplete {
                        let (sql, background) = split_background(&pending);
                        self.run_sql(&sql, background, None).await;
                    }
                    break;
                }
                Err(e) => {
                    self.fail(format_args!("reading input: {e}"));
                    break;
                }
            };
            interrupted = false;
            self.screenful = reader.screenful().unwrap_or(DEFAULT_SCREENFUL);
            self.columns = reader.columns().unwrap_or(DEFAULT_COLUMNS);
            let command = line.trim();
            // A psql command (`\q`) is taken between the lines of a
            // statement too, as psql does, unless a quote or comment is open.
            let backslash = command.starts_with('\\') && !helper::inside_text(&pending);
            if backslash || (pending.is_empty() && command.starts_with('.')) {
                reader.remember(command);
                let flow = match backslash {
                    true => self.backslash(command).await,
                    false => self.command(command).await,
                };
                if flow == Flow::Quit || self.must_stop() {
                    break;
                }
                continue;
            }
            pending.push_str(&line);
            pending.push('\n');
            match completeness(&pending) {
                Completeness::Empty => pending.clear(),
                Completeness::Incomplete => {}
                Completeness::Complete => {
                    let input = std::mem::take(&mut pending);
                    reader.remember(input.trim());
                    let (sql, background) = split_background(&input);
                    self.run_sql(&sql, background, None).await;
                    if self.must_stop() {
                        break;
                    }
                }
            }
        }
    }

    /// Prints an error; when input is not a terminal, the shell stops.
    fn fail(&self, message: impl std::fmt::Display) {
        errln!("error: {message}");
        self.failed.set(true);
    }

    /// True when an error ends the shell: its input is a script.
    fn must_stop(&self) -> bool {
        !self.interactive && self.failed.get()
    }

    /// Refreshes the names completion offers from the catalog.
    fn refresh_names(&self) {
        let catalog = self.session.engine().catalog();
        let mut relations = Vec::new();
        let mut columns = Vec::new();
        for stream in catalog.all_streams() {
            relations.push(stream.name.clone());
            columns.extend(stream.schema.fields().iter().map(|f| f.name().clone()));
        }
        for (name, view) in catalog.views() {
            relations.push(name.to_string());
            let schema = datafusion::logical_expr::TableSource::schema(view.as_ref());
            columns.extend(schema.fields().iter().map(|f| f.name().clone()));
        }
        columns.sort();
        columns.dedup();
        *self.shared.names.write().unwrap_or_else(|e| e.into_inner()) = Names {
            relations,
            columns,
            functions: self.functions.clone(),
        };
    }

    /// Runs the statements of `sql`. Queries run in the foreground unless
    /// `background`; `script` names the file they come from (`.read`), whose
    /// directory relative paths resolve against.
    ///
    /// Statements run one by one through the session's engine rather than
    /// with [`Session::execute`], so that when one fails, the queries the
    /// statements before it started are still shown (that call would drop
    /// their handles with its error).
    async fn run_sql(&mut self, sql: &str, background: bool, script: Option<&Path>) {
        let statements = match parse_script(sql) {
            Ok(statements) => statements,
            Err(e) => {
                match script {
                    Some(path) => self.fail(format_args!("{}: {e}", path.display())),
                    None => self.fail(e),
                }
                return;
            }
        };
        let base_dir = script.map_or_else(|| PathBuf::from("."), crate::engine::script_dir);
        let mut foreground = Vec::new();
        for statement in &statements {
            match self.execute(statement, sql, &base_dir).await {
                Ok(None) => {}
                Ok(Some(started)) if background || started.alert => self.detach(started),
                Ok(Some(started)) => foreground.push(started),
                Err(e) => {
                    let place = match script {
                        Some(path) => format!("{}:{}: ", path.display(), statement.line),
                        None if statements.len() > 1 => format!("line {}: ", statement.line),
                        None => String::new(),
                    };
                    match e.location() {
                        // The line typed, with a caret under the name.
                        Some((line, column)) => {
                            let at =
                                datafusion::sql::sqlparser::tokenizer::Location::new(line, column);
                            self.fail(crate::sql::render_error(sql, &format!("{place}{e}"), at));
                        }
                        None => self.fail(format_args!("{place}{e}")),
                    }
                    break;
                }
            }
        }
        self.refresh_names();
        if !foreground.is_empty() {
            self.run_foreground(foreground).await;
        }
    }

    /// Executes one statement; a query is started and returned.
    async fn execute(
        &mut self,
        statement: &Statement,
        sql: &str,
        base_dir: &Path,
    ) -> Result<Option<Started>> {
        let query = match self.session.execute_statement(statement, base_dir)? {
            Outcome::Done => return Ok(None),
            Outcome::Explain(text) => {
                outln!("{text}");
                return Ok(None);
            }
            Outcome::Dropped(dropped) => {
                outln!("{}", commands::dropped_text(&dropped));
                return Ok(None);
            }
            Outcome::Rows(listing) => {
                self.print_rows(&listing);
                return Ok(None);
            }
            Outcome::ShowQueries => {
                self.print_rows(&self.session.show_queries());
                return Ok(None);
            }
            Outcome::Change(change) => {
                let changed = self.session.change(*change)?.apply().await?;
                outln!("{changed}");
                return Ok(None);
            }
            Outcome::Query(query) => query,
        };
        if let Some(input) = query
            .graph
            .inputs
            .iter()
            .find(|input| input.stream.source.location == SourceLocation::Stdin)
        {
            return Err(Error::Plan(format!(
                "stream {} reads standard input, which is the REPL's own input; \
                 give it a file (path = '...') or connector = 'push'",
                input.stream.name
            )));
        }
        let sink = query.sink.as_ref().map(|s| s.name.clone());
        let alert = query.declares_alert.is_some();
        let finite = query
            .graph
            .inputs
            .iter()
            .all(|i| crate::planner::never_ends(&i.stream).is_none());
        let handle = self.session.start(*query, &label(sql, statement.line))?;
        Ok(Some(Started {
            handle,
            sink,
            alert,
            finite,
        }))
    }

    /// Runs queries in the foreground: prints their results as they come
    /// until they all end or Ctrl-C stops them.
    async fn run_foreground(&mut self, queries: Vec<Started>) {
        let ids: Vec<QueryId> = queries.iter().map(|q| q.handle.id).collect();
        let ended: Vec<_> = ids.iter().map(|&id| (id, self.session.wait(id))).collect();
        let sinks: Vec<String> = queries.iter().filter_map(|q| q.sink.clone()).collect();
        let tag = ids.len() > 1;
        let mut renderers: HashMap<QueryId, Renderer> = ids
            .iter()
            .map(|&id| (id, Renderer::new(self.format, self.screenful)))
            .collect();
        let mut results = futures::stream::select_all(queries.into_iter().map(|q| {
            let id = q.handle.id;
            q.handle.map(move |batch| (id, batch))
        }));
        let print = |id: QueryId, text: String| {
            if text.is_empty() {
                return;
            }
            let text = if tag { tagged(id, &text) } else { text };
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        };
        let interrupt = tokio::signal::ctrl_c();
        tokio::pin!(interrupt);
        let quiet = tokio::time::sleep(QUIET_HINT_AFTER);
        tokio::pin!(quiet);
        let mut hinted = false;
        let mut listening = true;
        let mut tick = tokio::time::interval(AUTOSCALE_TICK);
        let mut rows = 0usize;
        let stopped = loop {
            let due = renderers.values().filter_map(Renderer::due).min();
            let flush_at = tokio::time::Instant::from_std(due.unwrap_or_else(Instant::now));
            tokio::select! {
                next = results.next() => match next {
                    Some((id, batch)) => {
                        rows += batch.num_rows();
                        let renderer = renderers.get_mut(&id).expect("one renderer per query");
                        match renderer.push(&batch) {
                            Ok(text) => print(id, text),
                            Err(e) => self.fail(format_args!("query {id}: {e}")),
                        }
                    }
                    None => break false,
                },
                _ = tokio::time::sleep_until(flush_at), if due.is_some() => {
                    for (&id, renderer) in &mut renderers {
                        print(id, renderer.flush());
                    }
                }
                signal = &mut interrupt, if listening => match signal {
                    Ok(()) => break true,
                    Err(e) => {
                        listening = false;
                        errln!("warning: cannot listen for Ctrl-C: {e}");
                    }
                },
                _ = tick.tick() => self.autoscale().await,
                _ = &mut quiet, if !hinted => {
                    hinted = true;
                    if rows == 0 {
                        errln!("(query {} running: Ctrl-C stops it)", list(&ids));
                    }
                }
            }
        };
        if stopped {
            for &id in &ids {
                self.session.stop(id);
            }
            outln!();
        }
        // Nobody reads the results any more: a query's sink blocked on
        // their full channel must see that, or it never ends.
        drop(results);
        for &id in &ids {
            if let Some(renderer) = renderers.get_mut(&id) {
                print(id, renderer.finish());
            }
        }
        if stopped {
            errln!("stopped query {}", list(&ids));
        }
        let grace = tokio::time::Instant::now() + STOP_GRACE;
        for (id, ended) in ended {
            let outcome = match stopped {
                // A stopped query's error is of no interest, and a task
                // stuck on its input must not hold the prompt.
                true => tokio::time::timeout_at(grace, ended)
                    .await
                    .unwrap_or(Ok(())),
                false => ended.await,
            };
            if let Err(e) = outcome {
                self.fail(format_args!("query {id}: {e}"));
            }
        }
        if !stopped && sinks.is_empty() && self.format == OutputFormat::Table {
            outln!("({rows} {})", if rows == 1 { "row" } else { "rows" });
        }
        if !sinks.is_empty() && !stopped {
            errln!("(results went to sink {})", sinks.join(", "));
        }
    }

    /// Lets a query run in the background; its lines are printed tagged
    /// with its id as they come (table rows a little later, gathered as in
    /// the foreground).
    fn detach(&mut self, started: Started) {
        if self.script.is_some() {
            return self.detach_in_script(started);
        }
        let Started { mut handle, .. } = started;
        let id = handle.id;
        let ended = self.session.wait(id);
        let printer = self.printer.clone();
        let mut renderer = Renderer::new(self.format, self.screenful);
        printer.print(format!(
            "[{id}] running in the background (.queries lists it, .stop {id} stops it)\n"
        ));
        let print = move |text: String| {
            if !text.is_empty() {
                printer.print(tagged(id, &text));
            }
        };
        tokio::spawn(async move {
            loop {
                let due = renderer.due();
                let flush_at = tokio::time::Instant::from_std(due.unwrap_or_else(Instant::now));
                tokio::select! {
                    next = handle.next() => match next {
                        Some(batch) => match renderer.push(&batch) {
                            Ok(text) => print(text),
                            Err(e) => print(format!("error: {e}\n")),
                        },
                        None => break,
                    },
                    _ = tokio::time::sleep_until(flush_at), if due.is_some() => print(renderer.flush()),
                }
            }
            print(renderer.finish());
            match ended.await {
                Ok(()) => print("ended\n".into()),
                Err(e) => print(format!("error: {e}\n")),
            }
        });
    }
}

impl Repl {
    /// Lets a script's query run in the background: its lines, untagged,
    /// in its turn (see [`turns`]); an error fails the script.
    fn detach_in_script(&mut self, started: Started) {
        let script = self.script.as_mut().expect("a script");
        let Started {
            mut handle, finite, ..
        } = started;
        let id = handle.id;
        let ended = self.session.wait(id);
        let (turns, failed) = (script.turns.clone(), script.failed.clone());
        let place = turns.join();
        let mut renderer = Renderer::new(self.format, self.screenful);
        let task = tokio::spawn(async move {
            while let Some(batch) = handle.next().await {
                match renderer.push(&batch) {
                    Ok(text) => turns.write(place, &text),
                    Err(e) => {
                        errln!("error: query {id}: {e}");
                        failed.store(true, Ordering::Relaxed);
                    }
                }
            }
            turns.write(place, &renderer.finish());
            if let Err(e) = ended.await {
                errln!("error: query {id}: {e}");
                failed.store(true, Ordering::Relaxed);
            }
            turns.end(place);
        });
        script.running.push(Background { id, finite, task });
    }

    /// At the end of a piped script: waits for its background queries
    /// whose inputs end (Ctrl-C stops them) and stops the others, as
    /// `vigil run` would have run them to their end.
    async fn finish_script(&mut self) {
        let Some(script) = self.script.as_mut() else {
            return;
        };
        let running = std::mem::take(&mut script.running);
        let failed = script.failed.clone();
        for query in running.iter().filter(|q| !q.finite) {
            self.session.stop(query.id);
        }
        let ids: Vec<QueryId> = running.iter().map(|q| q.id).collect();
        let all = futures::future::join_all(running.into_iter().map(|q| q.task));
        tokio::pin!(all);
        tokio::select! {
            _ = &mut all => {}
            _ = tokio::signal::ctrl_c() => {
                for &id in &ids {
                    self.session.stop(id);
                }
                let grace = tokio::time::sleep(STOP_GRACE);
                tokio::select! { _ = &mut all => {}, _ = grace => {} }
            }
        }
        if failed.load(Ordering::Relaxed) {
            self.failed.set(true);
        }
    }
}

/// `1`, or `1, 2` for several ids.
fn list(ids: &[QueryId]) -> String {
    ids.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A statement's text from its line on, on one line: the label `.queries`
/// shows.
fn label(sql: &str, line: u64) -> String {
    let text: String = sql
        .lines()
        .skip(line.saturating_sub(1) as usize)
        .collect::<Vec<_>>()
        .join(" ");
    let text = text.split(';').next().unwrap_or("");
    let mut words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if words.chars().count() > 100 {
        words = words.chars().take(97).collect::<String>() + "...";
    }
    words
}

/// What one read from the line editor gave.
enum Read {
    Line(String),
    Interrupted,
    Eof,
}

/// The line editor, moved to a blocking thread for each read.
struct LineReader {
    editor: Option<Editor<ReplHelper, FileHistory>>,
    history: Option<PathBuf>,
}

impl LineReader {
    /// An editor with the REPL's helper and the saved history; and a
    /// printer that writes above the prompt, when input is a terminal.
    fn new(shared: Arc<Shared>) -> Result<(Self, Option<Box<dyn ExternalPrinter + Send>>)> {
        let config = Config::builder()
            .completion_type(CompletionType::List)
            .auto_add_history(false)
            .history_ignore_dups(true)
            .map_err(editor_error)?
            .max_history_size(5000)
            .map_err(editor_error)?
            .build();
        let mut editor = Editor::with_config(config).map_err(editor_error)?;
        editor.set_helper(Some(ReplHelper::new(shared)));
        let history = history_path();
        if let Some(path) = &history
            && path.exists()
            && let Err(e) = editor.load_history(path)
        {
            errln!("warning: cannot read history {}: {e}", path.display());
        }
        let external = editor
            .create_external_printer()
            .ok()
            .map(|p| Box::new(p) as Box<dyn ExternalPrinter + Send>);
        let reader = Self {
            editor: Some(editor),
            history,
        };
        Ok((reader, external))
    }

    async fn read(&mut self, prompt: &'static str) -> Result<Read> {
        let mut editor = self
            .editor
            .take()
            .ok_or_else(|| Error::Plan("the line editor was lost".into()))?;
        let (editor, read) = tokio::task::spawn_blocking(move || {
            let read = editor.readline(prompt);
            (editor, read)
        })
        .await
        .map_err(|e| Error::Plan(format!("the line editor failed: {e}")))?;
        self.editor = Some(editor);
        match read {
            Ok(line) => Ok(Read::Line(line)),
            Err(ReadlineError::Interrupted) => Ok(Read::Interrupted),
            Err(ReadlineError::Eof) => Ok(Read::Eof),
            Err(e) => Err(editor_error(e)),
        }
    }

    /// Table rows that fit the terminal below a header, if output is a
    /// terminal.
    /// The terminal's width, when known.
    fn columns(&mut self) -> Option<usize> {
        let (columns, _) = self.editor.as_mut()?.dimensions()?;
        Some(usize::from(columns))
    }

    fn screenful(&mut self) -> Option<usize> {
        let (_, rows) = self.editor.as_mut()?.dimensions()?;
        Some(usize::from(rows).saturating_sub(5).max(5))
    }

    /// Adds an entry to the history and appends it to the history file.
    fn remember(&mut self, entry: &str) {
        let Some(editor) = self.editor.as_mut() else {
            return;
        };
        if !matches!(editor.add_history_entry(entry), Ok(true)) {
            return;
        }
        self.save();
    }

    fn save(&mut self) {
        if let (Some(editor), Some(path)) = (self.editor.as_mut(), &self.history)
            && let Err(e) = editor.append_history(path)
        {
            errln!("warning: cannot write history {}: {e}", path.display());
            self.history = None;
        }
    }
}

/// `$VIGIL_HISTORY`, else `~/.vigil_history`; none without a home.
fn history_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("VIGIL_HISTORY").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|home| PathBuf::from(home).join(".vigil_history"))
}

fn editor_error(e: ReadlineError) -> Error {
    Error::io("line editor", std::io::Error::other(e.to_string()))
}
