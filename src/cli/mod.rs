//! The `vigil` command line.

mod check;
mod checkpoints;
mod group;
pub mod import_rules;
mod output;
mod progress;
mod serve;
mod stop;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use clap::{Parser, Subcommand, ValueEnum};

use crate::connector::{OutputFormat, Sink, SinkTarget};
use crate::connectors::{Destination, make_sink_to, open_sink};
use crate::engine::{Engine, Outcome, PreparedQuery, drop_routed_alerts, script_dir};
use crate::error::{Error, Result};
use crate::plan::listing::{Listing, QUERY_COLUMNS, listing_text};
use crate::planner::{ExecutionMode, never_ends};
use crate::runtime::autoscale::AutoscaleSettings;
use crate::runtime::checkpoint::CheckpointConfig;
use crate::runtime::live::{Live, NamedQuery};
use crate::runtime::{self, RunReport, RunnableQuery};
use crate::sql::parse_script;
use crate::state::store::Location;
use output::{SharedOutput, StdoutClosed, Turns};
use progress::{Progress, StatusLine};
use stop::Stopper;

/// vigil: continuous SQL over streams of system metrics and events.
#[derive(Debug, Parser)]
#[command(name = "vigil", version, about)]
pub struct Cli {
    /// Without a command, vigil starts the interactive shell (`vigil repl`).
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run every statement of the given .sql files; exits when finite inputs
    /// end and every window has fired (with --follow: on Ctrl-C / SIGTERM).
    Run(RunArgs),
    /// Parse and plan every statement of the given .sql files without
    /// running anything; report every error as FILE:LINE:COLUMN.
    Check(CheckArgs),
    /// Serve an HTTP API: post statements, push rows, follow results and
    /// alerts as Server-Sent Events, scrape metrics.
    Serve(serve::ServeArgs),
    /// The interactive shell: type statements, see results as windows fire
    /// (the default without a command).
    Repl(ReplArgs),
    /// List the checkpoints of a checkpoint directory, or inspect one.
    Checkpoints(checkpoints::CheckpointsArgs),
    /// Show a group of `vigil run --group` processes: its members, their
    /// Kafka partitions, each partition's lag and checkpoint age.
    Group(group::GroupArgs),
    /// Translate a Prometheus rule file (alerting and recording rules) into
    /// vigil SQL; rules outside the supported PromQL are reported.
    ImportRules(import_rules::ImportRulesArgs),
    /// Print the reference of every source and sink connector (options,
    /// types, defaults, fixed columns) as Markdown.
    Connectors,
}

/// `vigil repl` options.
#[derive(Debug, Default, clap::Args)]
struct ReplArgs {
    /// Keep the shell's query state (checkpoints, push-stream logs) in DIR:
    /// queries keep their state when changed (`ALTER`) and are restored when
    /// a shell on DIR runs them again.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Stop each query, with a checkpoint in DIR, once a source has read
    /// ROWS rows; a shell on DIR that runs the query again goes on from
    /// there (for tests and demonstrations of restoring).
    #[arg(long, value_name = "ROWS", requires = "state_dir")]
    stop_after_rows: Option<u64>,
}

/// The session a shell with `args` runs its statements in.
fn shell_session(args: ReplArgs) -> crate::session::SessionBuilder {
    let mut builder = crate::session::Session::builder();
    if let Some(dir) = args.state_dir {
        builder = builder.state_dir(dir);
    }
    if let Some(rows) = args.stop_after_rows {
        builder = builder.stop_after_rows(rows);
    }
    builder
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    /// Script files, checked in order with one catalog, as `vigil run`
    /// runs them (later files see the streams and sinks of earlier ones).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Check each file on its own instead (like `promtool check rules`): a
    /// directory of independent alert files that each declare their stream.
    #[arg(long, conflicts_with = "together")]
    each: bool,
    /// The default; kept for scripts written when checking each file on
    /// its own was.
    #[arg(long, hide = true)]
    together: bool,
    /// Plan queries in this execution mode until a `SET execution_mode`
    /// says otherwise.
    #[arg(long, value_enum)]
    execution_mode: Option<ModeArg>,
}

#[derive(Debug, Clone, clap::Args)]
struct RunArgs {
    /// Script files, run in order.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Result format (default: table on a terminal, csv otherwise).
    #[arg(long, value_enum)]
    format: Option<FormatArg>,
    /// Write results here instead of stdout (queries without INSERT INTO).
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Execution mode of queries until a `SET execution_mode` says otherwise
    /// (default: per-record for EMIT CHANGES, micro-batch otherwise).
    #[arg(long, value_enum)]
    execution_mode: Option<ModeArg>,
    /// Read stream NAME from PATH instead of the file its CREATE STREAM
    /// names (repeatable), e.g. `--input metrics=my_metrics.csv`.
    #[arg(long, value_name = "NAME=PATH", value_parser = parse_input)]
    input: Vec<(String, PathBuf)>,
    /// Keep reading file sources as they grow, like `tail -f`, until
    /// Ctrl-C or SIGTERM (sets `follow = 'true'` on every file stream).
    #[arg(long, conflicts_with = "until_end")]
    follow: bool,
    /// End every file source at its end, whatever its `follow` option says
    /// (what streams without the option do).
    #[arg(long)]
    until_end: bool,
    /// A progress line on stderr while the run reads its inputs: rows,
    /// rows/s, event time, late and bad rows (auto: when stderr is a
    /// terminal).
    #[arg(long, value_enum, default_value_t = ProgressArg::Auto)]
    progress: ProgressArg,
    #[command(flatten)]
    checkpoints: CheckpointArgs,
    /// Rows per batch read from every source, whatever its `batch_size`
    /// says (smaller batches: finer checkpoint positions, less throughput).
    #[arg(long, value_name = "ROWS", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    batch_size: Option<u64>,
    /// Instances of each stage whose state is per key (a GROUP BY, an
    /// alert's keys), rows routed to them by key, until a `SET
    /// parallelism` says otherwise (default: one per core).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=128))]
    parallelism: Option<u64>,
    /// Share the script's Kafka topic with every process started with the
    /// same NAME (a Kafka consumer group): each runs the queries over the
    /// partitions it is given, with their state in the shared
    /// --checkpoint-dir, and partitions move when a process joins, leaves
    /// or dies. See docs/kafka.md, "Scaling out".
    #[arg(long, value_name = "NAME", requires = "checkpoint_dir")]
    group: Option<String>,
}

/// Checkpoint options of `vigil run`.
#[derive(Debug, Clone, clap::Args)]
struct CheckpointArgs {
    /// Checkpoint every query's state into DIR (one folder per query) and,
    /// on start, restore each query from its newest complete checkpoint
    /// there and read its sources on from where it stood. DIR is a path,
    /// or an object store: `file:///abs/path`, `s3://bucket/prefix` (set
    /// up by the AWS_* environment variables).
    #[arg(long, value_name = "DIR", value_parser = Location::parse)]
    checkpoint_dir: Option<Location>,
    /// Time between two checkpoints, e.g. `10s`, `500ms`, `1m`.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration, requires = "checkpoint_dir")]
    checkpoint_interval: std::time::Duration,
    /// Complete checkpoints kept per query (savepoints are never deleted).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=1000), requires = "checkpoint_dir")]
    keep_checkpoints: u64,
    /// Restore from the savepoint in PATH instead of the newest checkpoint.
    #[arg(long, value_name = "PATH", requires = "checkpoint_dir", value_parser = Location::parse)]
    from_savepoint: Option<Location>,
    /// On Ctrl-C or SIGTERM, take a savepoint (under DIR/savepoints/) with
    /// every window still open, then stop.
    #[arg(long, requires = "checkpoint_dir")]
    savepoint_on_stop: bool,
    /// Start stateful operators that changed since the checkpoint empty
    /// instead of refusing to restore (the others are restored).
    #[arg(long, requires = "checkpoint_dir")]
    allow_non_restored_state: bool,
    /// Stop, as on a signal, once a source has read ROWS rows (for tests
    /// and demonstrations of restoring; with --savepoint-on-stop a
    /// savepoint is taken there).
    #[arg(long, value_name = "ROWS", requires = "checkpoint_dir")]
    stop_after_rows: Option<u64>,
}

/// The checkpoint settings of a run writing into `dir`.
fn checkpoint_config(dir: &Location, args: &CheckpointArgs) -> CheckpointConfig {
    let mut config = CheckpointConfig::new(dir.clone());
    config.interval = args.checkpoint_interval;
    config.keep = args.keep_checkpoints as usize;
    config.allow_non_restored = args.allow_non_restored_state;
    config.from_savepoint = args.from_savepoint.clone();
    config.stop_after_rows = args.stop_after_rows;
    if args.savepoint_on_stop {
        let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ");
        config.savepoint_on_stop = Some(dir.child("savepoints").child(&format!("sp-{stamp}")));
    }
    config
}

/// Parses a duration the way `WITH` options and `SET` read one (`10s`,
/// `500ms`, `2m`, `1.5 hours`: see [`crate::connector::options::parse_duration`]).
fn parse_duration(text: &str) -> std::result::Result<std::time::Duration, String> {
    crate::connector::options::parse_duration(text).ok_or_else(|| {
        format!(
            "'{text}' is not a duration such as 10s, 500ms or 2m (a number and a unit from ms to w)"
        )
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ProgressArg {
    Auto,
    Always,
    Never,
}

fn parse_input(text: &str) -> std::result::Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, path)) if !name.trim().is_empty() && !path.is_empty() => {
            Ok((name.trim().to_ascii_lowercase(), PathBuf::from(path)))
        }
        _ => Err(format!("expected NAME=PATH, got '{text}'")),
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ModeArg {
    MicroBatch,
    PerRecord,
}

impl From<ModeArg> for ExecutionMode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::MicroBatch => ExecutionMode::MicroBatch,
            ModeArg::PerRecord => ExecutionMode::PerRecord,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FormatArg {
    Table,
    Csv,
    Jsonl,
}

impl From<FormatArg> for OutputFormat {
    fn from(f: FormatArg) -> Self {
        match f {
            FormatArg::Table => OutputFormat::Table,
            FormatArg::Csv => OutputFormat::Csv,
            FormatArg::Jsonl => OutputFormat::Jsonl,
        }
    }
}

/// Parses the command line, runs it, and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = match cli.command {
        Some(Command::Run(args)) => runtime.block_on(run(args)),
        command @ (None | Some(Command::Repl(_))) => {
            let args = match command {
                Some(Command::Repl(args)) => args,
                _ => ReplArgs::default(),
            };
            let outcome = runtime.block_on(crate::repl::run(shell_session(args)));
            // A source blocked on a read (a FIFO) must not hold the exit.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            // The shell has reported its errors itself; a script piped in
            // that failed exits with a failure.
            match outcome {
                Ok(code) => return code,
                Err(e) => Err(e),
            }
        }
        Some(Command::Check(args)) => return check(args),
        Some(Command::ImportRules(args)) => return import_rules::run(args),
        Some(Command::Checkpoints(args)) => checkpoints::run(args),
        Some(Command::Group(args)) => group::show(args),
        Some(Command::Connectors) => {
            print!("{}", crate::connectors::registry::reference());
            Ok(())
        }
        Some(Command::Serve(args)) => {
            let outcome = runtime.block_on(serve::serve(args));
            // A query's blocking tasks may still be winding down.
            runtime.shutdown_timeout(std::time::Duration::from_secs(5));
            outcome
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn check(args: CheckArgs) -> ExitCode {
    let engine = || {
        let mut engine = Engine::new();
        if let Some(mode) = args.execution_mode {
            engine.set_execution_mode(mode.into());
        }
        engine
    };
    let report = match args.each {
        false => check::check_files(&mut engine(), &args.files),
        true => check::check_each(engine, &args.files),
    };
    for message in report.warnings.iter().chain(&report.errors) {
        eprintln!("{message}");
    }
    eprintln!("{}", report.summary());
    if report.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Plans the queries of `args`' scripts; with `partition`, the pipeline
/// of that Kafka partition in a group (see [`Engine::set_kafka_partition`]).
fn prepare_queries(args: &RunArgs, partition: Option<i32>) -> Result<Vec<PreparedQuery>> {
    Ok(prepare(args, partition)?.0)
}

/// As [`prepare_queries`], with the scripts' `autoscale` settings if they
/// turn it on (a group's: `vigil run` alone refuses them).
fn prepare(
    args: &RunArgs,
    partition: Option<i32>,
) -> Result<(Vec<PreparedQuery>, Option<AutoscaleSettings>)> {
    let mut engine = Engine::new();
    if let Some(mode) = args.execution_mode {
        engine.set_execution_mode(mode.into());
    }
    for (name, path) in &args.input {
        engine.override_input(name, path.clone());
    }
    if args.follow || args.until_end {
        engine.set_follow(args.follow);
    }
    if let Some(rows) = args.batch_size {
        engine.set_batch_size(rows as usize);
    }
    if let Some(instances) = args.parallelism {
        engine.set_parallelism(instances as usize)?;
    }
    if let Some(p) = partition {
        engine.set_kafka_partition(p);
    }
    let mut queries = Vec::new();
    let mut sinks = check::SinkColumns::default();
    let format = output_format(args);
    let in_group = args.group.is_some();
    for file in &args.files {
        queries.extend(load_script(
            &mut engine,
            &mut sinks,
            file,
            format,
            in_group,
        )?);
    }
    check_inputs(&engine, &args.input)?;
    Ok((drop_routed_alerts(queries), engine.autoscale()))
}

/// The format results go out in: `--format`, else a table on a terminal
/// and CSV elsewhere.
fn output_format(args: &RunArgs) -> OutputFormat {
    let to_terminal = args.output.is_none() && std::io::stdout().is_terminal();
    args.format
        .map(OutputFormat::from)
        .unwrap_or(if to_terminal {
            OutputFormat::Table
        } else {
            OutputFormat::Csv
        })
}

async fn run(args: RunArgs) -> Result<()> {
    // Installed first, so that a Ctrl-C while the scripts are read already
    // ends the run cleanly.
    let stopper = Stopper::install();
    let (queries, autoscale) = prepare(&args, None)?;
    if queries.is_empty() {
        return Ok(());
    }
    if let Some(name) = &args.group {
        let leave = group::leave_on_signal(stopper.as_ref());
        // The scripts are checked first: their errors say more.
        group::group_topic(&queries)?;
        let live = group::member_runtime(&args)?;
        return group::run(&args, name, (queries, autoscale), live, leave).await;
    }
    let format = output_format(&args);
    let show_progress = match args.progress {
        ProgressArg::Auto => std::io::stderr().is_terminal(),
        ProgressArg::Always => true,
        ProgressArg::Never => false,
    };
    let status = Arc::new(StatusLine::default());
    // Everything bound for stdout goes through one writer; on a terminal,
    // that writer clears the progress line while it writes. A reader that
    // goes away (`| head`) ends the run like a signal does.
    let closed = Arc::new(StdoutClosed::default());
    let mut stdout = SharedOutput::stdout(closed.clone());
    if show_progress && std::io::stdout().is_terminal() {
        stdout = stdout.with_status(status.clone());
    }
    let output = match &args.output {
        Some(path) => SharedOutput::file(path)?,
        None => stdout.clone(),
    };
    let outputs = Outputs {
        stdout,
        default: output,
        format,
        to_file: args.output.is_some(),
    };
    let labelled = outputs.shared(&queries);
    let mut turns = outputs.turns(&queries);
    let live = match &args.checkpoints.checkpoint_dir {
        Some(dir) => Live::with_checkpoints(checkpoint_config(dir, &args.checkpoints)),
        None => Live::new(),
    };
    let runnable = queries
        .into_iter()
        .enumerate()
        .map(|(i, q)| {
            let label = query_name(i, &q);
            let sink = outputs.sink(&q, labelled.then_some(label.as_str()), &mut turns)?;
            Ok(NamedQuery {
                query: RunnableQuery {
                    graph: q.graph,
                    sink,
                },
                label: format!("q{}", i + 1),
                name: q.name,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut progress = None;
    let coordinator = live.coordinator().cloned();
    let outcome = runtime::run_on(&live, runnable, |report| {
        if let Some(stopper) = &stopper {
            match &coordinator {
                Some(coordinator) => {
                    let coordinator = coordinator.clone();
                    stopper.watch_with(
                        report,
                        Box::new(move || {
                            coordinator.stop();
                        }),
                    );
                }
                None => stopper.watch(report),
            }
        }
        closed.watch(report);
        if show_progress {
            progress = Some(Progress::start(status.clone(), report));
        }
    })
    .await;
    if let Some(progress) = progress {
        progress.finish();
    }
    let report = outcome?;
    if let Some(signal) = stopper.as_ref().and_then(Stopper::stopped_by) {
        eprintln!("vigil: stopped by {signal}; windows still open were not fired");
    }
    if let Some(root) = coordinator.as_ref().and_then(|c| c.stop_savepoint()) {
        eprintln!("vigil: savepoint written to {root}");
    }
    print_summary(&report);
    unreadable_inputs(&report)
}

/// Fails the run when an input had rows and not one of them could be
/// read: its results would be empty for no reason the exit status shows.
fn unreadable_inputs(report: &RunReport) -> Result<()> {
    let unreadable = report.streams.iter().find(|(_, stats)| {
        stats.rows.load(Ordering::Relaxed) == 0 && stats.bad_rows.load(Ordering::Relaxed) > 0
    });
    match unreadable {
        Some((name, stats)) => Err(Error::Connector(format!(
            "stream {name}: none of its {} rows could be read (see the bad rows above)",
            stats.bad_rows.load(Ordering::Relaxed)
        ))),
        None => Ok(()),
    }
}

/// The outputs of a run that queries without a sink of their own share.
struct Outputs {
    /// Standard output, for the default output and `connector = 'stdout'`
    /// sinks.
    stdout: SharedOutput,
    /// Where queries without `INSERT INTO` write: stdout or `--output`.
    default: SharedOutput,
    /// The format of the default output.
    format: OutputFormat,
    /// The default output is an `--output` file, not stdout.
    to_file: bool,
}

/// Which shared output a query writes to, if any.
#[derive(PartialEq)]
enum SharedTarget {
    Stdout,
    OutputFile,
}

impl Outputs {
    fn target(&self, query: &PreparedQuery) -> Option<SharedTarget> {
        match &query.sink {
            Some(config) if config.target == SinkTarget::Stdout => Some(SharedTarget::Stdout),
            Some(_) => None,
            None if self.to_file => Some(SharedTarget::OutputFile),
            None => Some(SharedTarget::Stdout),
        }
    }

    /// True when more than one query writes to stdout, or to the
    /// `--output` file: their rows are then labelled with the query.
    fn shared(&self, queries: &[PreparedQuery]) -> bool {
        let count = |target: SharedTarget| {
            queries
                .iter()
                .filter(|q| self.target(q).as_ref() == Some(&target))
                .count()
        };
        count(SharedTarget::Stdout) > 1 || count(SharedTarget::OutputFile) > 1
    }

    /// When every input of the run ends and several queries share an
    /// output, their turns on it, so that the output is the same on every
    /// run: per shared output, the turns and the next query's index.
    fn turns(&self, queries: &[PreparedQuery]) -> Vec<(SharedTarget, Arc<Turns>, usize)> {
        let finite = queries.iter().all(|q| {
            q.graph
                .inputs
                .iter()
                .all(|i| never_ends(&i.stream).is_none())
        });
        if !finite {
            return Vec::new();
        }
        [SharedTarget::Stdout, SharedTarget::OutputFile]
            .into_iter()
            .filter_map(|target| {
                let count = queries
                    .iter()
                    .filter(|q| self.target(q).as_ref() == Some(&target))
                    .count();
                let out = match target {
                    SharedTarget::Stdout => self.stdout.clone(),
                    SharedTarget::OutputFile => self.default.clone(),
                };
                (count > 1).then(|| (target, Turns::new(out, count), 0))
            })
            .collect()
    }

    /// Opens the sink of `query`; `label` marks its rows on a shared output,
    /// where it takes its turn from `turns` if the output has turns.
    fn sink(
        &self,
        query: &PreparedQuery,
        label: Option<&str>,
        turns: &mut [(SharedTarget, Arc<Turns>, usize)],
    ) -> Result<Box<dyn Sink>> {
        let target = self.target(query);
        let (format, out) = match (&query.sink, &target) {
            (Some(config), Some(_)) => (config.format, self.stdout.clone()),
            (Some(config), None) => return open_sink(config, &query.graph.schema),
            (None, _) => (self.format, self.default.clone()),
        };
        let out: Box<dyn Destination> =
            match turns.iter_mut().find(|t| Some(&t.0) == target.as_ref()) {
                Some((_, turns, next)) => {
                    *next += 1;
                    Box::new(turns.writer(*next - 1))
                }
                None => out.destination(),
            };
        Ok(make_sink_to(format, label, out))
    }
}

/// The name that labels a query's rows on a shared output: its alert's
/// name for a `CREATE ALERT`, else `q<N>` for the run's N-th query (as in
/// the `vigil: query N:` summary line).
fn query_name(index: usize, query: &PreparedQuery) -> String {
    match &query.declares_alert {
        Some(name) => name.clone(),
        None => format!("q{}", index + 1),
    }
}

/// An error for an `--input` that names no declared stream (a typo would
/// otherwise run the scripts over their own files).
fn check_inputs(engine: &Engine, inputs: &[(String, PathBuf)]) -> Result<()> {
    let streams: Vec<&str> = engine
        .catalog()
        .streams()
        .map(|s| s.name.as_str())
        .collect();
    for (name, _) in inputs {
        if !streams.contains(&name.as_str()) {
            let known = match streams.is_empty() {
                true => "the scripts declare no stream".to_string(),
                false => format!("streams: {}", streams.join(", ")),
            };
            return Err(Error::Plan(format!(
                "--input {name}: no stream is named '{name}' ({known})"
            )));
        }
    }
    Ok(())
}

/// Parses and executes one script; returns its queries, not yet running.
/// `sinks` rejects a query writing other columns to a file sink than an
/// earlier query of the run, before anything runs; what a statement
/// answers at once (`SELECT 1`, `SHOW`) is printed in `format`.
fn load_script(
    engine: &mut Engine,
    sinks: &mut check::SinkColumns,
    file: &Path,
    format: OutputFormat,
    in_group: bool,
) -> Result<Vec<PreparedQuery>> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| Error::io(format!("cannot read {}", file.display()), e))?;
    let name = file.display();
    let statements = parse_script(&text).map_err(|e| Error::Parse(format!("{name}: {e}")))?;
    let base = script_dir(file);
    let stem = file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "script".into());
    let mut queries = Vec::new();
    let mut in_file = 0;
    for statement in &statements {
        let outcome = engine
            .execute(statement, &base)
            .map_err(|e| match e.location() {
                // FILE:LINE:COLUMN and a caret under the name it is about.
                Some((line, column)) => {
                    let at = datafusion::sql::sqlparser::tokenizer::Location::new(line, column);
                    let rendered = crate::sql::render_error(&text, &e.to_string(), at);
                    Error::Plan(check::located(&name, &rendered))
                }
                None => Error::Plan(format!("{name}:{}: {e}", statement.line)),
            })?;
        if engine.autoscale().is_some() && !in_group {
            // The controller runs where a live query can be rescaled (the
            // shell with --state-dir, vigil serve) or a group can report
            // the processes it needs (--group); silently not scaling
            // would be worse than saying so.
            return Err(Error::Plan(format!(
                "{name}:{}: vigil run does not autoscale; set parallelism (SET parallelism = N, \
                 or --parallelism), run the script in `vigil serve` or `vigil repl --state-dir`, \
                 which do, or in a group (--group), which reports the processes it needs",
                statement.line
            )));
        }
        match outcome {
            Outcome::Done => {}
            Outcome::Explain(text) => {
                // A closed stdout (`| head`) must not panic the run.
                let _ = writeln!(std::io::stdout(), "{text}");
            }
            Outcome::Query(mut query) => {
                in_file += 1;
                if query.name.is_none() {
                    query.name = Some(format!("{stem}.q{in_file}"));
                }
                // `CREATE OR REPLACE ALERT`: the new alert takes the
                // place of the old one's query.
                if let Some(name) = &query.declares_alert {
                    queries.retain(|q: &PreparedQuery| q.declares_alert.as_ref() != Some(name));
                }
                let place = format!("{name}:{}:{}", statement.line, statement.column);
                sinks
                    .add(&query, place)
                    .map_err(|e| Error::Plan(format!("{name}:{}: {e}", statement.line)))?;
                queries.push(*query)
            }
            Outcome::Dropped(dropped) => {
                // A dropped alert runs no query; the other queries were
                // planned before the drop and keep their plans.
                queries.retain(|q| {
                    !dropped.iter().any(|d| {
                        d.kind == crate::sql::ObjectKind::Alert
                            && q.declares_alert.as_ref() == Some(&d.name)
                    })
                });
            }
            Outcome::Change(change) => {
                // No query runs yet: an altered alert's query takes the
                // place of the one planned.
                let Some(mut query) = change.query else {
                    return Err(Error::Plan(format!(
                        "{name}:{}: ALTER QUERY changes a running query; in a script, SET parallelism before the query",
                        statement.line
                    )));
                };
                if let Some(old) = queries.iter().position(|q| {
                    q.declares_alert.is_some() && q.declares_alert == query.declares_alert
                }) {
                    query.name = queries[old].name.take();
                    queries[old] = *query;
                }
            }
            Outcome::Rows(listing) => print_listing(&listing, format)?,
            Outcome::ShowQueries => {
                // The queries start once every script has been read: none
                // is running yet.
                print_listing(&Listing::new(&QUERY_COLUMNS, Vec::new()), format)?;
            }
        }
    }
    Ok(queries)
}

/// Prints what a statement answered: a table, or CSV or JSON lines like
/// a query's results (its notes then go to standard error, out of the
/// way of a program reading the rows).
fn print_listing(listing: &Listing, format: OutputFormat) -> Result<()> {
    if format == OutputFormat::Table {
        let _ = write!(std::io::stdout(), "{}", listing_text(listing));
        return Ok(());
    }
    for note in &listing.notes {
        eprintln!("{note}");
    }
    if listing.rows.is_empty() {
        // No rows: CSV still names the columns, as psql does.
        if format == OutputFormat::Csv {
            println!("{}", listing.columns.join(","));
        }
        return Ok(());
    }
    let stdout = SharedOutput::stdout(Arc::new(StdoutClosed::default()));
    let mut sink = make_sink_to(format, None, Box::new(stdout));
    sink.write(&listing.to_batch()?)?;
    sink.finish()
}

fn print_summary(report: &RunReport) {
    for (name, stats) in &report.streams {
        eprintln!(
            "vigil: stream {name}: rows={} bad={}{}",
            stats.rows.load(Ordering::Relaxed),
            stats.bad_rows.load(Ordering::Relaxed),
            shed_text(&stats.shed_rows)
        );
        let samples = stats.bad_samples.lock().unwrap_or_else(|e| e.into_inner());
        for bad in samples.iter() {
            eprintln!(
                "vigil: bad row: stream {name} line {}: {}",
                bad.line, bad.reason
            );
        }
    }
    for (i, stats) in report.queries.iter().enumerate() {
        eprintln!(
            "vigil: query {}: out={} late={}{}",
            i + 1,
            stats.rows_out.load(Ordering::Relaxed),
            stats.late_rows.load(Ordering::Relaxed),
            shed_text(&stats.shed_rows)
        );
    }
}

/// ` shed=N` for a summary line, when rows were shed.
fn shed_text(shed: &std::sync::atomic::AtomicU64) -> String {
    match shed.load(Ordering::Relaxed) {
        0 => String::new(),
        n => format!(" shed={n}"),
    }
}
