//! `vigil serve`: the query service's command line.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use futures::FutureExt;

use super::{CheckpointArgs, ProgressArg, RunArgs, group, prepare};
use crate::error::{Error, Result};
use crate::service::{self, Config, DEFAULT_ADDR, DEFAULT_MAX_QUERIES};
use crate::session::Session;
use crate::state::store::Location;

const AFTER_HELP: &str = "\
Endpoints (JSON; errors are {\"error\": \"...\"} with a 4xx status):
  POST   /statements              SQL text, one or more statements; starts queries
  GET    /queries                 queries (running, failed, finished) and their counters
  GET    /queries/{id}            one query
  DELETE /queries/{id}            stops a query, or removes an ended one
  GET    /queries/{id}/results    its result rows as Server-Sent Events (event: error
                                  if it fails, event: lagged for a slow reader)
  GET    /alerts                  every alert row as Server-Sent Events (event: alert)
  POST   /streams/{name}/rows     rows for a connector = 'push' stream, as JSON lines
                                  (Content-Type: application/x-ndjson), a JSON array
                                  (application/json) or CSV with a header (text/csv)
  POST   /savepoints              with --state-dir: a savepoint of every running query
                                  under DIR/savepoints/NAME (body {\"name\": \"NAME\"},
                                  else the time); answers its path and queries
  GET    /groups/{name}           a group's members, their partitions, lag and checkpoint
                                  age (?checkpoint_dir=DIR, else --checkpoint-dir's)
  GET    /metrics                 Prometheus text format
  GET    /health                  {\"status\":\"ok\"}, open even with --token

With --state-dir DIR, pushed rows are fsynced to a write-ahead log before the
request is answered (a full log answers 503 with Retry-After), queries are
checkpointed, and posted statements and stops are recorded; after a crash,
`vigil serve --state-dir DIR` (same scripts) runs them again and restores every
query from its checkpoint: rows answered 200 are counted once. A request that
got no answer may or may not have been applied.

With --group NAME --checkpoint-dir DIR, the service is also a member of group
NAME, as `vigil run SCRIPTS --group NAME --checkpoint-dir DIR` is: the scripts'
queries run over the Kafka partitions the group gives this process (not in the
service's session), and it leaves the group on Ctrl-C or SIGTERM. If the member
fails, the service stops with its error.

With a token (--token or $VIGIL_TOKEN), every other request needs
`Authorization: Bearer TOKEN`. Paths in posted statements resolve against the
working directory; anyone who can post statements can read and write the files
this process can.

Example:
  vigil serve --addr 127.0.0.1:8080 setup.sql
  curl -X POST --data-binary @queries.sql http://127.0.0.1:8080/statements
  curl -N http://127.0.0.1:8080/alerts";

/// Arguments of `vigil serve`.
#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
#[command(group(clap::ArgGroup::new("checkpointed").args(["state_dir", "checkpoint_dir"]).multiple(true)))]
pub(super) struct ServeArgs {
    /// Address to listen on; port 0 picks a free port. The address is
    /// printed on stderr (`vigil: listening on http://ADDR`) once bound.
    #[arg(long, default_value = DEFAULT_ADDR, value_name = "HOST:PORT")]
    addr: String,
    /// Require `Authorization: Bearer TOKEN` on every request but
    /// GET /health. Defaults to $VIGIL_TOKEN, which keeps the token out of
    /// the process list.
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// Largest request body (bytes, or with KiB, MiB, GiB, KB, MB, GB);
    /// larger requests get 413.
    #[arg(long, default_value = "16MiB", value_name = "SIZE", value_parser = parse_size)]
    max_body: usize,
    /// Most queries running at once; a statement that would start one more
    /// gets 429.
    #[arg(long, default_value_t = DEFAULT_MAX_QUERIES, value_name = "N")]
    max_queries: usize,
    /// Bytes of results (Arrow buffer memory) kept per query for followers
    /// that have not read them (sizes as for --max-body); a follower
    /// further behind misses the oldest batches and gets `event: lagged`.
    #[arg(long, default_value = "8MiB", value_name = "SIZE", value_parser = parse_size)]
    max_result_buffer: usize,
    /// How long POST /streams/NAME/rows waits for the stream's queries to
    /// have room for its rows (back-pressure) before it answers 429 with
    /// Retry-After, e.g. `5s`, `500ms`.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = super::parse_duration)]
    ingest_timeout: std::time::Duration,
    /// Keep state in DIR: checkpoints, write-ahead logs of push streams and
    /// the statements posted, all picked up again on start.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Time between two checkpoints (of the session's queries, and of the
    /// group member's), e.g. `10s`, `500ms`, `1m`.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = super::parse_duration, requires = "checkpointed")]
    checkpoint_interval: std::time::Duration,
    /// Complete checkpoints kept per query.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=1000), requires = "checkpointed")]
    keep_checkpoints: u64,
    /// Most bytes each push stream's write-ahead log may hold (sizes as
    /// for --max-body); pushes beyond it get 503 until a checkpoint lets
    /// the log shrink.
    #[arg(long, default_value = "1GiB", value_name = "SIZE", value_parser = parse_size, requires = "state_dir")]
    max_wal_size: usize,
    /// Restore the queries from the savepoint in PATH (from POST
    /// /savepoints) rather than from their newest checkpoints.
    #[arg(long, value_name = "PATH", requires = "state_dir")]
    from_savepoint: Option<PathBuf>,
    /// Instances of each stage whose state is per key, until a `SET
    /// parallelism` says otherwise (default: one per core).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=128))]
    parallelism: Option<u64>,
    /// Also be a member of the group NAME of processes sharing the
    /// scripts' Kafka topic, as `vigil run --group NAME` is: the scripts'
    /// queries run over the partitions the group gives this process, with
    /// their state in --checkpoint-dir. See docs/kafka.md, "Scaling out".
    #[arg(long, value_name = "NAME", requires = "checkpoint_dir")]
    group: Option<String>,
    /// With --group: the checkpoint directory every member of the group
    /// shares (a path, or a `file://` or `s3://` URL).
    #[arg(long, value_name = "DIR", value_parser = Location::parse, requires = "group")]
    checkpoint_dir: Option<Location>,
    /// Scripts executed at start, in order, e.g. to declare streams, sinks
    /// and alerts. Their queries run like posted ones. With --state-dir
    /// they run on every start, before the recorded statements, and are
    /// not recorded. With --group they are the group's scripts, run by
    /// the member rather than the session.
    files: Vec<PathBuf>,
}

/// Runs the service until Ctrl-C or SIGTERM.
pub(super) async fn serve(args: ServeArgs) -> Result<()> {
    // Planned before the service starts, so that a script the group
    // cannot run is refused at once.
    let member = args
        .group
        .as_deref()
        .map(|name| group_member(&args, name))
        .transpose()?;
    let token = match args.token {
        Some(token) if token.trim().is_empty() => {
            return Err(Error::Plan("--token must not be empty".into()));
        }
        Some(token) => Some(token),
        None => std::env::var("VIGIL_TOKEN")
            .ok()
            .filter(|t| !t.trim().is_empty()),
    };
    let config = Config {
        addr: args.addr,
        token: token.map(|t| t.trim().to_string()),
        max_body: args.max_body,
        max_queries: args.max_queries,
        max_result_buffer: args.max_result_buffer,
        scripts: match member {
            Some(_) => Vec::new(),
            None => args.files,
        },
        state_dir: args.state_dir.clone(),
        ingest_timeout: args.ingest_timeout,
        group_checkpoint_dir: args.checkpoint_dir,
        group: args.group.clone(),
    };
    let mut builder = Session::builder();
    if let Some(dir) = &args.state_dir {
        builder = builder
            .state_dir(dir)
            .checkpoint_interval(args.checkpoint_interval)
            .keep_checkpoints(args.keep_checkpoints as usize)
            .max_wal_bytes(args.max_wal_size as u64);
    }
    if let Some(path) = &args.from_savepoint {
        builder = builder.from_savepoint(path);
    }
    if let Some(instances) = args.parallelism {
        builder = builder.parallelism(instances as usize);
    }
    service::serve_with(builder.build()?, config, member).await
}

/// The member of group `name` that runs the scripts' queries, as `vigil
/// run --group` runs them.
fn group_member(args: &ServeArgs, name: &str) -> Result<service::Member> {
    let run = RunArgs {
        files: args.files.clone(),
        format: None,
        output: None,
        execution_mode: None,
        input: Vec::new(),
        follow: false,
        until_end: false,
        progress: ProgressArg::Never,
        checkpoints: CheckpointArgs {
            checkpoint_dir: args.checkpoint_dir.clone(),
            checkpoint_interval: args.checkpoint_interval,
            keep_checkpoints: args.keep_checkpoints,
            from_savepoint: None,
            savepoint_on_stop: false,
            allow_non_restored_state: false,
            stop_after_rows: None,
        },
        batch_size: None,
        parallelism: args.parallelism,
        group: Some(name.to_string()),
    };
    let (queries, autoscale) = prepare(&run, None)?;
    group::group_topic(&queries)?;
    let live = group::member_runtime(&run)?;
    let leave = Arc::new(AtomicBool::new(false));
    let name = name.to_string();
    let flag = leave.clone();
    Ok(service::Member {
        queries: live.clone(),
        run: async move { group::run(&run, &name, (queries, autoscale), live, flag).await }.boxed(),
        leave,
    })
}

/// A size such as `16MiB`, `512KiB`, `10MB` or `1048576` (bytes).
fn parse_size(text: &str) -> std::result::Result<usize, String> {
    crate::connector::options::parse_size(text)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| {
            format!(
                "expected a size such as 16MiB, 512KiB or 1048576, got '{}'",
                text.trim()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("512 KiB"), Ok(512 << 10));
        assert_eq!(parse_size("10MB"), Ok(10_000_000));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5 parsecs").is_err());
    }
}
