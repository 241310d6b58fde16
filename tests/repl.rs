//! The interactive shell, driven through a pseudo-terminal as a person
//! would: multi-line statements, dot commands, errors, foreground and
//! background queries, Ctrl-C, completion and history.
//!
//! The screen is matched by substrings, never by layout: the line editor
//! repaints lines as it likes.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rexpect::process::{PtyProcess, WaitStatus};
use rexpect::session::{Options, PtySession, spawn_with_options};

use crate::support;

/// Per expectation: generous, the machine is shared and slow.
const TIMEOUT_MS: u64 = 60_000;

/// How long the shell may take to exit once told to.
const EXIT: Duration = Duration::from_secs(60);

const ROWS: &str = "ts,host,cpu\n1000,a,1\n4000,a,3\n11000,b,5\n25000,a,7\n";

fn start(dir: &Path, history: &Path) -> PtySession {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vigil"));
    command
        .current_dir(dir)
        .env("VIGIL_HISTORY", history)
        .env("TERM", "xterm")
        .env("NO_COLOR", "1");
    // rexpect forks the shell itself (in its own session, on a pty), so not
    // through `support::spawn`; the session's drop kills it, and the kernel
    // does if the test ends first.
    support::die_with_test(&mut command);
    let options = Options::new()
        .timeout_ms(Some(TIMEOUT_MS))
        .strip_ansi_escape_codes(true);
    let mut session = spawn_with_options(command, options).expect("vigil starts in a pty");
    session.process_mut().set_kill_timeout(Some(5_000));
    session
}

/// Waits for `text` on the screen; fails with what was seen instead.
fn expect(session: &mut PtySession, text: &str) -> String {
    session
        .exp_string(text)
        .unwrap_or_else(|e| panic!("waiting for {text:?}: {e}"))
}

/// Types a line and presses Enter.
fn type_line(session: &mut PtySession, line: &str) {
    session.send(line).expect("type");
    session.send("\r").expect("enter");
    session.flush().expect("flush");
}

#[test]
fn a_session_at_the_prompt() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("m.csv"), ROWS).expect("write m.csv");
    std::fs::create_dir(dir.path().join("sub")).expect("sub dir");
    std::fs::write(dir.path().join("sub/n.csv"), ROWS).expect("write n.csv");
    std::fs::write(
        dir.path().join("sub/count.sql"),
        "CREATE STREAM n (ts TIMESTAMP, host TEXT, cpu DOUBLE) WITH (path = 'n.csv');\n\
         SELECT window_end, count(*) AS readings FROM TUMBLE(n, ts, INTERVAL '100' SECOND)\n\
         GROUP BY window_start, window_end;\n",
    )
    .expect("write script");
    let history = dir.path().join("history");
    let mut repl = start(dir.path(), &history);
    expect(&mut repl, "vigil> ");

    // A statement over two lines: the second prompt is the continuation.
    type_line(
        &mut repl,
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,",
    );
    expect(&mut repl, "...> ");
    type_line(
        &mut repl,
        "  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH (path = 'm.csv');",
    );
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, ".streams");
    expect(&mut repl, "host TEXT");
    expect(&mut repl, "m.csv (csv)");
    type_line(&mut repl, ".describe m");
    expect(&mut repl, "watermark delay 2 s");
    expect(&mut repl, "event time");

    // A parse error shows where, and the prompt comes back.
    type_line(&mut repl, "SELEC host FROM m;");
    expect(&mut repl, "line 1, column 1");
    expect(&mut repl, "^");
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, "SELECT nope FROM m;");
    // The caret under the unknown name.
    expect(
        &mut repl,
        "unknown column 'nope' at line 1, column 8\r\n 1 | SELECT nope FROM m;\r\n   |        ^",
    );
    type_line(&mut repl, "SELECT hots FROM m;");
    expect(&mut repl, "unknown column 'hots' (did you mean 'host'?)");
    expect(&mut repl, "vigil> ");

    // A windowed query over the file: its results, then the prompt.
    type_line(
        &mut repl,
        "SELECT window_start, host, avg(cpu) AS avg_cpu FROM TUMBLE(m, ts, INTERVAL '10' SECOND)",
    );
    expect(&mut repl, "...> ");
    type_line(&mut repl, "  GROUP BY window_start, window_end, host;");
    expect(&mut repl, "avg_cpu");
    expect(&mut repl, "1970-01-01T00:00:20");
    expect(&mut repl, "(3 rows)");

    // A script: its relative paths resolve against its directory.
    type_line(&mut repl, ".read sub/count.sql");
    expect(&mut repl, "readings");
    expect(&mut repl, "(1 row)");

    // A query over a stream that never ends, stopped by Ctrl-C.
    type_line(
        &mut repl,
        "CREATE STREAM p (ts TIMESTAMP, v DOUBLE) WITH (connector = 'push');",
    );
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, "SELECT ts, v FROM p WHERE v > 0;");
    // The hint says it runs: the terminal is out of the editor's hands.
    expect(&mut repl, "Ctrl-C stops it");
    repl.send_control('c').expect("Ctrl-C");
    expect(&mut repl, "stopped query");
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, ".queries");
    expect(&mut repl, "no queries running");

    // In the background: listed, then stopped.
    type_line(&mut repl, "SELECT v FROM p &");
    expect(&mut repl, "running in the background");
    type_line(&mut repl, ".queries");
    expect(&mut repl, "rows_out");
    expect(&mut repl, "FROM p");
    type_line(&mut repl, ".stop all");
    expect(&mut repl, "stopped 1 query");

    // Completion of a column name, then the statement goes on.
    repl.send("SELECT hos\t").expect("type");
    repl.flush().expect("flush");
    expect(&mut repl, "SELECT host");
    type_line(&mut repl, " FROM m;");
    expect(&mut repl, "(4 rows)");
    // The prompt after a statement's output is a fresh one: the editor
    // reads keys, so Ctrl-C reaches it as a key (not as SIGINT). At an
    // empty prompt it tells how to leave.
    expect(&mut repl, "vigil> ");
    repl.send_control('c').expect("Ctrl-C");
    expect(&mut repl, "to leave");

    type_line(&mut repl, ".quit");
    repl.exp_eof().expect("vigil exits");
    match exit_status(&repl) {
        Some(WaitStatus::Exited(_, code)) => assert_eq!(code, 0, "exit status"),
        other => panic!("vigil did not exit normally: {other:?}"),
    }

    let saved = std::fs::read_to_string(&history).expect("history file");
    for entry in [
        "CREATE STREAM m (ts TIMESTAMP",
        "WATERMARK FOR ts",
        ".streams",
        "SELEC host FROM m;",
        "SELECT v FROM p &",
        ".quit",
    ] {
        assert!(saved.contains(entry), "history lacks {entry:?}:\n{saved}");
    }
}

/// The README's first step: a CPU alert over this machine's own metrics
/// (the built-in `host_metrics` stream), typed at the prompt. The threshold
/// here holds on any machine, so the alert fires without loading it.
#[test]
fn a_live_cpu_alert_fires_in_the_shell() {
    let dir = tempfile::tempdir().expect("temp dir");
    let history = dir.path().join("history");
    let mut repl = start(dir.path(), &history);
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, "CREATE ALERT busy AS");
    expect(&mut repl, "...> ");
    type_line(
        &mut repl,
        "  SELECT window_end, host, avg(cpu) AS cpu FROM TUMBLE(host_metrics, ts, INTERVAL '2' SECOND)",
    );
    type_line(&mut repl, "  GROUP BY window_end, host");
    type_line(
        &mut repl,
        "ALERT WHEN cpu >= 0 MESSAGE 'cpu on {host} at {cpu:.0} %';",
    );
    expect(&mut repl, "firing");
    expect(&mut repl, "cpu on ");
    type_line(&mut repl, ".stop all");
    type_line(&mut repl, ".quit");
    match exit_status(&repl) {
        Some(WaitStatus::Exited(_, 0)) => {}
        other => panic!("the shell should exit 0, got {other:?}"),
    }
}

/// The shell's exit status once it is no longer running, waiting at most
/// [`EXIT`]; `None` when it cannot be had (already reaped).
fn exit_status(session: &PtySession) -> Option<WaitStatus> {
    support::wait_until("the shell to exit", EXIT, || {
        match PtyProcess::status(session.process()) {
            Some(WaitStatus::StillAlive) => None,
            other => Some(other),
        }
    })
}

/// Waits for the shell to exit and returns its exit code.
fn exit_code(session: &mut PtySession) -> i32 {
    session.exp_eof().expect("vigil exits");
    match exit_status(session) {
        Some(WaitStatus::Exited(_, code)) => code,
        other => panic!("vigil did not exit normally: {other:?}"),
    }
}

/// Ctrl-C stops a foreground query that is still printing rows: its sink,
/// blocked on the full channel of results the shell no longer reads, must
/// not keep the prompt from coming back.
#[test]
fn ctrl_c_stops_a_query_that_is_still_producing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rows = String::from("ts,host,cpu\n");
    for i in 0..300_000 {
        rows.push_str(&format!("{},h{},{}.5\n", i * 1000, i % 7, i % 100));
    }
    std::fs::write(dir.path().join("big.csv"), rows).expect("write big.csv");
    let history = dir.path().join("history");
    let mut repl = start(dir.path(), &history);
    expect(&mut repl, "vigil> ");
    // Small batches: far more of them than the channels between the query
    // and the shell hold, so that the query is still producing when Ctrl-C
    // comes.
    type_line(
        &mut repl,
        "CREATE STREAM big (ts TIMESTAMP, host TEXT, cpu DOUBLE) \
         WITH (path = 'big.csv', batch_size = '100');",
    );
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, "SELECT ts, host, cpu FROM big;");
    expect(&mut repl, "| h3 ");
    repl.send_control('c').expect("Ctrl-C");
    expect(&mut repl, "stopped query");
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, ".queries");
    expect(&mut repl, "no queries running");
    type_line(&mut repl, ".quit");
    assert_eq!(exit_code(&mut repl), 0, "exit status");
}

/// A query whose rows come one batch each prints one table: its header
/// once, its rows below it; DOUBLEs are rounded for reading.
#[test]
fn rows_that_come_one_by_one_share_one_table() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rows = String::from("ts,host,cpu\n");
    for i in 0..30 {
        rows.push_str(&format!("{},a,0.2\n", i * 1000));
    }
    std::fs::write(dir.path().join("r.csv"), rows).expect("write r.csv");
    let history = dir.path().join("history");
    let mut repl = start(dir.path(), &history);
    expect(&mut repl, "vigil> ");
    // One row per batch: before, each became a five-line table.
    type_line(
        &mut repl,
        "CREATE STREAM r (ts TIMESTAMP, host TEXT, cpu DOUBLE) \
         WITH (path = 'r.csv', batch_size = '1');",
    );
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, "SELECT host, cpu + 0.1 AS cpu FROM r;");
    let screen = expect(&mut repl, "(30 rows)");
    assert_eq!(screen.matches("| host |").count(), 1, "{screen}");
    assert_eq!(screen.matches("| a    | 0.3 |").count(), 30, "{screen}");
    assert!(!screen.contains("0.30000000000000004"), "{screen}");
    type_line(&mut repl, ".quit");
    assert_eq!(exit_code(&mut repl), 0, "exit status");
}

/// psql's commands do what psql users expect, or give a hint; none opens
/// a continuation prompt. `.streams` lists the built-in streams and tells
/// streams, views, alerts and sinks apart.
#[test]
fn psql_commands_and_the_kinds_of_streams() {
    let dir = tempfile::tempdir().expect("temp dir");
    let history = dir.path().join("history");
    let mut repl = start(dir.path(), &history);
    expect(&mut repl, "vigil> ");
    type_line(
        &mut repl,
        "CREATE STREAM p (ts TIMESTAMP, v DOUBLE) WITH (connector = 'push');",
    );
    expect(&mut repl, "vigil> ");
    type_line(
        &mut repl,
        "CREATE VIEW big_v AS SELECT ts, v FROM p WHERE v > 5;",
    );
    expect(&mut repl, "vigil> ");
    type_line(
        &mut repl,
        "CREATE ALERT hot AS SELECT ts, v FROM p ALERT WHEN v > 9;",
    );
    expect(&mut repl, "running in the background");
    type_line(
        &mut repl,
        "CREATE SINK out WITH (path = 'out.csv', format = 'csv');",
    );
    expect(&mut repl, "vigil> ");

    // Wider than the terminal: one field a line (`\\x auto`), every source
    // named.
    type_line(&mut repl, "\\d");
    for (name, kind) in [
        ("p", "stream"),
        ("host_metrics", "stream"),
        ("demo", "stream"),
        ("big_v", "view"),
        ("hot", "alert"),
        ("out", "sink"),
    ] {
        expect(
            &mut repl,
            &format!("name    | {name}\r\nkind    | {kind}\r\n"),
        );
    }
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, ".streams");
    expect(&mut repl, "this host, every 1000 ms (built in)");
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, "\\d hot");
    expect(&mut repl, "alert hot");
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, "\\d host_metrics");
    expect(&mut repl, "event time: ts");
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, "\\?");
    expect(&mut repl, ".describe NAME");
    expect(&mut repl, "vigil> ");

    // Any other backslash command: a hint, and a fresh prompt.
    type_line(&mut repl, "\\dS");
    let screen = expect(&mut repl, "unknown command \\dS; try .help");
    assert!(!screen.contains("...>"), "{screen}");
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, "\\z");
    expect(&mut repl, "unknown command \\z; try .help");
    let screen = expect(&mut repl, "vigil> ");
    assert!(!screen.contains("...>"), "{screen}");

    // `\q` leaves, even in the middle of a statement.
    type_line(&mut repl, "SELECT v");
    expect(&mut repl, "...> ");
    type_line(&mut repl, "\\q");
    assert_eq!(exit_code(&mut repl), 0, "exit status");
}

/// Runs the shell with `input` piped to it (not a terminal): its exit
/// code, standard output and standard error.
fn piped(dir: &Path, input: &str) -> (Option<i32>, String, String) {
    piped_with(dir, &[], input)
}

/// A script piped into the shell stops at its first error and exits 1,
/// as `psql -v ON_ERROR_STOP=1` and `duckdb` do; one without errors exits
/// 0, its last statement may lack its `;`, and CSV keeps full precision.
#[test]
fn a_piped_script_stops_at_its_first_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("m.csv"), ROWS).expect("write m.csv");
    let (code, stdout, stderr) = piped(dir.path(), "SELEC 1;\n.streams\n");
    assert_eq!(code, Some(1), "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stderr.contains("error: ") && stderr.contains("column 1"),
        "{stderr}"
    );
    // Nothing after the error ran.
    assert!(!stdout.contains("host_metrics"), "{stdout}");

    let (code, stdout, stderr) = piped(dir.path(), ".nope\nSELECT 1;\n");
    assert_eq!(code, Some(1), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.contains("unknown command .nope"), "{stderr}");

    let (code, stdout, stderr) = piped(
        dir.path(),
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE) WITH (path = 'm.csv');\n\
         SELECT nope FROM m;\nSELECT host FROM m;\n",
    );
    assert_eq!(code, Some(1), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.contains("nope"), "{stderr}");
    assert!(!stdout.contains("host"), "{stdout}");

    let (code, stdout, stderr) = piped(
        dir.path(),
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE) WITH (path = 'm.csv');\n\
         SELECT host, cpu + 0.1 AS x FROM m WHERE cpu = 5",
    );
    assert_eq!(code, Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert_eq!(stdout, "host,x\nb,5.1\n", "{stderr}");
    let (code, stdout, stderr) = piped(
        dir.path(),
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE) WITH (path = 'm.csv');\n\
         SELECT cpu * 0.1 AS x FROM m WHERE cpu = 3;\n",
    );
    assert_eq!(code, Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert_eq!(stdout, "x\n0.30000000000000004\n", "{stderr}");
}

/// After the README's tour (a `metrics` stream of one's own), an alert file
/// of the pack reads, and reads again: it declares with `CREATE OR
/// REPLACE`. Then `SHOW`, `DROP` and a new `CREATE STREAM` at the prompt.
#[test]
fn a_pack_file_reads_twice_then_drop_and_show() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("m.csv"), ROWS).expect("write m.csv");
    let pack = Path::new(env!("CARGO_MANIFEST_DIR")).join("queries/pack/high_cpu_sustained.sql");
    let history = dir.path().join("history");
    let mut repl = start(dir.path(), &history);
    expect(&mut repl, "vigil> ");
    type_line(
        &mut repl,
        "CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE, \
         WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH (path = 'm.csv');",
    );
    expect(&mut repl, "vigil> ");
    for id in 1..=2 {
        type_line(&mut repl, &format!(".read {}", pack.display()));
        let seen = expect(&mut repl, &format!("[{id}] running in the background"));
        assert!(!seen.contains("error"), "read {id}: {seen}");
        let seen = expect(&mut repl, &format!("[{id}] ended"));
        assert!(!seen.contains("error"), "read {id}: {seen}");
        assert!(seen.contains("firing"), "read {id}: {seen}");
    }
    type_line(&mut repl, "SHOW ALERTS;");
    expect(&mut repl, "reads metrics");
    type_line(&mut repl, "DROP STREAM metrics;");
    expect(
        &mut repl,
        "cannot drop stream 'metrics': alert 'high_cpu_sustained' reads it",
    );
    type_line(&mut repl, "DROP ALERT high_cpu_sustained;");
    expect(&mut repl, "dropped alert high_cpu_sustained");
    type_line(&mut repl, "DROP STREAM metrics;");
    expect(&mut repl, "dropped stream metrics");
    type_line(
        &mut repl,
        "CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE) WITH (path = 'm.csv');",
    );
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, "SHOW STREAMS;");
    expect(&mut repl, "m.csv (csv)");
    type_line(&mut repl, "DESCRIBE metrics;");
    expect(&mut repl, "event time");
    type_line(
        &mut repl,
        "CREATE STREAM p (ts TIMESTAMP, v DOUBLE) WITH (connector = 'push');",
    );
    type_line(&mut repl, "SELECT v FROM p &");
    expect(&mut repl, "running in the background");
    type_line(&mut repl, "SHOW QUERIES;");
    expect(&mut repl, "rows_out");
    expect(&mut repl, "SELECT v FROM p");
    type_line(&mut repl, ".quit");
    match exit_status(&repl) {
        Some(WaitStatus::Exited(_, 0)) => {}
        other => panic!("the shell should exit 0, got {other:?}"),
    }
}

/// A shell in `dir` with stream `m` declared over [`ROWS`] in `m.csv`, at
/// its prompt.
fn shell_over_m(dir: &Path) -> PtySession {
    std::fs::write(dir.join("m.csv"), ROWS).expect("write m.csv");
    let mut repl = start(dir, &dir.join("history"));
    expect(&mut repl, "vigil> ");
    type_line(
        &mut repl,
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE) WITH (path = 'm.csv');",
    );
    expect(&mut repl, "vigil> ");
    repl
}

/// A bounded question over a file is answered at the prompt as a batch
/// query; over a stream that never ends it is refused, saying why.
#[test]
fn a_batch_query_in_the_shell() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut repl = shell_over_m(dir.path());
    type_line(
        &mut repl,
        "SELECT count(*) AS readings, max(cpu) AS peak FROM m;",
    );
    expect(&mut repl, "peak");
    expect(&mut repl, "(1 row)");
    type_line(
        &mut repl,
        "CREATE STREAM p (ts TIMESTAMP, v DOUBLE) WITH (connector = 'push');",
    );
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, "SELECT count(*) FROM p;");
    expect(&mut repl, "stream 'p', which never ends");
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, ".quit");
    repl.exp_eof().expect("vigil exits");
}

/// `.stats` shows a running query's operators with the rows they took and
/// gave; `.queries` lists shed rows; `EXPLAIN ANALYZE` runs at the prompt.
#[test]
fn stats_show_the_operators_of_a_running_query() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut repl = shell_over_m(dir.path());
    type_line(&mut repl, ".stats");
    expect(&mut repl, "no queries running");

    type_line(
        &mut repl,
        "EXPLAIN ANALYZE SELECT host FROM m WHERE cpu > 2;",
    );
    expect(
        &mut repl,
        "totals: 4 rows read, 3 result rows, 0 late, 0 shed",
    );

    type_line(
        &mut repl,
        "CREATE STREAM f (ts TIMESTAMP, host TEXT, cpu DOUBLE) WITH (path = 'm.csv', follow = 'true');",
    );
    expect(&mut repl, "vigil> ");
    type_line(&mut repl, "SELECT host, cpu FROM f WHERE cpu > 2 &");
    expect(&mut repl, "running in the background");
    type_line(&mut repl, ".queries");
    expect(&mut repl, "shed_rows");
    expect(&mut repl, "f: 4");
    // The follower reads the 4 rows at once; the filter keeps 3.
    let mut seen = Vec::new();
    for _ in 0..60 {
        type_line(&mut repl, ".stats");
        let before = expect(&mut repl, "filter cpu@2 > 2");
        let row = before.rsplit('\n').next().unwrap_or_default();
        let cells: Vec<&str> = row
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty() && *c != "*")
            .collect();
        assert!(cells.len() >= 7, "an operator row: {row:?}");
        seen = vec![cells[3].to_string(), cells[4].to_string()];
        if seen == ["4", "3"] {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    assert_eq!(seen, ["4", "3"], "rows in and out of the filter");
    // Then its queues: the one from the source took the 4 rows.
    expect(&mut repl, "queues:");
    let before = expect(&mut repl, "in0 source");
    let row = before.rsplit('\n').next().unwrap_or_default();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells.get(2),
        Some(&"4"),
        "rows taken from the source's queue: {row:?}"
    );
    type_line(&mut repl, ".stats 99");
    expect(&mut repl, "no query 99 is running");
    type_line(&mut repl, ".stop all");
    expect(&mut repl, "stopped 1 query");
    type_line(&mut repl, ".quit");
    assert_eq!(exit_code(&mut repl), 0, "exit status");
}

/// `.group NAME DIR` lists a running `vigil run --group` member with the
/// partitions it holds, as `vigil group` does; bad arguments are errors
/// the shell survives.
#[test]
fn the_shell_shows_a_group_of_processes() {
    use crate::kafka::{group_script, member, produce_hosts, wait_until};
    let cluster = rdkafka::mocking::MockCluster::new(1).expect("the mock cluster starts");
    cluster.create_topic("metrics", 3, 1).unwrap();
    for topic in ["out", "alerts"] {
        cluster.create_topic(topic, 1, 1).unwrap();
    }
    let bootstrap = cluster.bootstrap_servers();
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("q.sql"),
        group_script(&bootstrap, "out", "alerts", ""),
    )
    .unwrap();
    produce_hosts(&bootstrap, 6, 0..120);
    let mut running = member(dir.path(), "a");
    let status = dir.path().join("ck/groups/cpu");
    let stderr = || std::fs::read_to_string(dir.path().join("a.stderr")).unwrap_or_default();
    // Its status file lists the three partitions once it holds them.
    let holds_all = wait_until(std::time::Duration::from_secs(60), || {
        assert!(running.try_wait().unwrap().is_none(), "{}", stderr());
        std::fs::read_dir(&status).is_ok_and(|files| {
            files.flatten().any(|f| {
                std::fs::read_to_string(f.path()).is_ok_and(|text| {
                    serde_json::from_str::<serde_json::Value>(&text)
                        .is_ok_and(|v| v["partitions"] == serde_json::json!([0, 1, 2]))
                })
            })
        })
    });
    assert!(holds_all, "the member holds no partitions:\n{}", stderr());

    let mut repl = start(dir.path(), &dir.path().join("history"));
    expect(&mut repl, "vigil> ");
    for (line, error) in [
        (
            ".group",
            ".group needs a group name and the checkpoint directory",
        ),
        (
            ".group cpu",
            ".group needs a group name and the checkpoint directory",
        ),
        (".group cpu nowhere", "cannot read checkpoint directory"),
        (".group cpu ftp://host/ck", "unknown scheme 'ftp'"),
    ] {
        type_line(&mut repl, line);
        expect(&mut repl, error);
        expect(&mut repl, "vigil> ");
    }
    type_line(&mut repl, ".group nobody ck");
    expect(&mut repl, "group nobody: no members");
    type_line(&mut repl, ".group cpu ck");
    expect(&mut repl, "CHECKPOINT AGE");
    let table = expect(&mut repl, "vigil> ");
    // MEMBER  SEEN  PARTITION  LAG  CHECKPOINT AGE: `host:pid  0 s ago  1 ...`
    let me = format!(":{}", running.id());
    let mut partitions: Vec<&str> = table
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|cells| cells.first().is_some_and(|c| c.ends_with(&me)))
        .map(|cells| cells[4])
        .collect();
    partitions.sort();
    assert_eq!(partitions, ["0", "1", "2"], "{table}");
    type_line(&mut repl, ".quit");
    assert_eq!(exit_code(&mut repl), 0, "exit status");
}

/// [`piped`] with command-line arguments `args`.
fn piped_with(dir: &Path, args: &[&str], input: &str) -> (Option<i32>, String, String) {
    let out = support::run_with_input(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(args)
            .current_dir(dir)
            .env("VIGIL_HISTORY", dir.join("history")),
        input.as_bytes(),
        Duration::from_secs(120),
        &format!("vigil {} reading statements from a pipe", args.join(" ")),
    );
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// psql and DuckDB habits work: a query that reads no stream answers once,
/// `SHOW TABLES`, `.tables` and `\\dt` list the catalog, and a listing wider
/// than the terminal (80 columns when it is not one) is shown expanded,
/// one field a line, as `\\x` shows it; `\\x off` draws the wide table.
#[test]
fn sql_shell_habits_work_and_listings_fit_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let script = "SELECT 1 + 2 AS three, upper('x') AS s;\nSHOW TABLES;\n.format table\n.tables\n\\dt\n\\x off\n\\d\n";
    let (code, out, err) = piped(dir.path(), script);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.starts_with("three,s\n3,X\n"), "{out}");
    assert!(out.contains("host_metrics,stream,"), "{out}");
    let expanded = out.matches("-[ RECORD 1 ]").count();
    assert_eq!(expanded, 2, "{out}");
    let tables = &out[out.find("-[ RECORD 1 ]").unwrap()..];
    let (listings, wide) = tables.split_at(tables.rfind("-[ RECORD 2 ]").unwrap());
    assert!(
        listings.lines().all(|l| l.chars().count() <= 80),
        "a line wider than 80 columns:\n{listings}"
    );
    assert!(wide.lines().any(|l| l.chars().count() > 80), "{wide}");
    assert!(
        out.contains("columns | ts TIMESTAMP, host TEXT, cpu DOUBLE"),
        "{out}"
    );
}

/// A script piped into the shell runs as `vigil run` runs it: it waits
/// for its alerts over a file that ends, prints their rows as plain CSV,
/// one alert's after the other, and says nothing of running in the
/// background.
#[test]
fn a_piped_script_waits_for_its_alerts_and_prints_them_plainly() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("m.csv"),
        "ts,host,cpu\n1000,a,95\n2000,b,20\n3000,a,97\n4000,b,99\n5000,a,10\n9000,b,10\n",
    )
    .unwrap();
    let script = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
         WITH (path = 'm.csv');
       CREATE ALERT hot AS SELECT ts, host, cpu FROM m ALERT BY host WHEN cpu > 90;
       CREATE ALERT very_hot AS SELECT window_end, host, max(cpu) AS top
         FROM TUMBLE(m, ts, INTERVAL '2' SECOND) GROUP BY window_end, host
       ALERT WHEN top > 96;\n";
    // In both execution modes, at parallelism 1 and 3.
    for settings in [
        "",
        "SET execution_mode = 'per_record';",
        "SET parallelism = 3;",
        "SET execution_mode = 'per_record'; SET parallelism = 3;",
    ] {
        let (code, out, err) = piped(dir.path(), &format!("{settings}\n{script}"));
        assert_eq!(code, Some(0), "{settings}: {out}\n{err}");
        // Each alert's rows under its header; the order of keys within
        // one may differ between parallelisms.
        assert_eq!(
            sections(&out),
            sections(ALERTS_OF_THE_PIPED_SCRIPT),
            "{settings}: {out}\n{err}"
        );
    }
}

/// The piped script of [`a_piped_script_waits_for_its_alerts_and_prints_them_plainly`]
/// stopped with a checkpoint after three rows and run again by a shell on the same state
/// folder at another parallelism: the second run restores both alerts and the two runs
/// together print what one run prints, in both execution modes. The stream is read a row
/// at a time so that the stop falls inside the file.
#[test]
fn a_piped_script_stopped_with_a_checkpoint_goes_on_in_the_next_shell() {
    let script = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
         WITH (path = 'm.csv', batch_size = 1);
       CREATE ALERT hot AS SELECT ts, host, cpu FROM m ALERT BY host WHEN cpu > 90;
       CREATE ALERT very_hot AS SELECT window_end, host, max(cpu) AS top
         FROM TUMBLE(m, ts, INTERVAL '2' SECOND) GROUP BY window_end, host
       ALERT WHEN top > 96;\n";
    for (mode, (first, second)) in ["", "SET execution_mode = 'per_record';"]
        .into_iter()
        .flat_map(|mode| [(mode, (1, 3)), (mode, (3, 1))])
    {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("m.csv"),
            "ts,host,cpu\n1000,a,95\n2000,b,20\n3000,a,97\n4000,b,99\n5000,a,10\n9000,b,10\n",
        )
        .unwrap();
        let run = |parallelism: usize, extra: &[&str]| {
            let args = [&["repl", "--state-dir", "state"], extra].concat();
            let text = format!("{mode} SET parallelism = {parallelism};\n{script}");
            let (code, out, err) = piped_with(dir.path(), &args, &text);
            assert_eq!(code, Some(0), "{mode} {parallelism}: {out}\n{err}");
            (out, err)
        };
        let (stopped, _) = run(first, &["--stop-after-rows", "3"]);
        let (restored, err) = run(second, &[]);
        let rows = |text: &str| text.lines().filter(|l| !l.starts_with("alert,")).count();
        assert!(
            rows(&stopped) < 8 && rows(&restored) > 0,
            "{mode} {first} then {second}: the first run stopped inside the file: {stopped}"
        );
        assert_eq!(
            err.matches("restored from checkpoint").count(),
            2,
            "{mode} {first} then {second}: both alerts restore: {err}"
        );
        assert_eq!(
            merged_sections(&format!("{stopped}{restored}")),
            merged_sections(ALERTS_OF_THE_PIPED_SCRIPT),
            "{mode} {first} then {second}: {stopped}\nthen\n{restored}\n{err}"
        );
    }
}

/// CSV text as its rows sorted under each distinct header.
fn merged_sections(text: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut merged = std::collections::BTreeMap::<String, Vec<String>>::new();
    for (header, rows) in sections(text) {
        merged.entry(header).or_default().extend(rows);
    }
    merged.values_mut().for_each(|rows| rows.sort());
    merged
}

/// CSV text as its sections, each a header and its rows sorted.
fn sections(text: &str) -> Vec<(String, Vec<String>)> {
    let mut sections: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        match (line.starts_with("alert,"), sections.last_mut()) {
            (false, Some((_, rows))) => rows.push(line.to_string()),
            _ => sections.push((line.to_string(), Vec::new())),
        }
    }
    for (_, rows) in &mut sections {
        rows.sort();
    }
    sections
}

/// What `vigil run` prints for the script of
/// [`a_piped_script_waits_for_its_alerts_and_prints_them_plainly`], but for
/// its `query` labels.
const ALERTS_OF_THE_PIPED_SCRIPT: &str = "alert,host,state,event_time,since,cpu,severity,message
hot,a,firing,1970-01-01T00:00:01,1970-01-01T00:00:01,95.0,,
hot,b,firing,1970-01-01T00:00:04,1970-01-01T00:00:04,99.0,,
hot,a,resolved,1970-01-01T00:00:05,1970-01-01T00:00:01,10.0,,
hot,b,resolved,1970-01-01T00:00:09,1970-01-01T00:00:04,10.0,,
alert,host,state,event_time,since,top,severity,message
very_hot,a,firing,1970-01-01T00:00:04,1970-01-01T00:00:04,97.0,,
very_hot,b,firing,1970-01-01T00:00:06,1970-01-01T00:00:06,99.0,,
very_hot,a,resolved,1970-01-01T00:00:06,1970-01-01T00:00:04,10.0,,
very_hot,b,resolved,1970-01-01T00:00:10,1970-01-01T00:00:06,10.0,,
";

/// `ALTER ALERT` in the shell: with a state directory the running alert
/// keeps its state; without one the change is refused and the alert
/// runs on unchanged.
#[test]
fn an_alert_is_altered_in_the_shell() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.csv"), "ts,host,cpu\n1000,a,95\n").unwrap();
    let script = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
         WITH (path = 'm.csv', format = 'csv', follow = 'true');
       CREATE ALERT hot AS SELECT ts, host, cpu FROM m ALERT BY host WHEN cpu > 90;
       ALTER ALERT hot SET SEVERITY 'ticket';\n";
    let (code, out, err) = piped_with(dir.path(), &["repl", "--state-dir", "state"], script);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains("query 1 changed (alert hot); state kept:"),
        "{out}\n{err}"
    );
    assert!(out.contains("alert hot (s1.o0)"), "{out}\n{err}");
    let (code, out, err) = piped(dir.path(), script);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(err.contains("keeps no state"), "{err}");
    assert!(err.contains("nothing was changed"), "{err}");
    assert!(out.contains("hot,a,firing"), "{out}\n{err}");
}

/// `ALTER QUERY` in the shell: a background query over a followed file is
/// rescaled by id and by name with a state directory, its open windows
/// kept; a bad parallelism is refused with what it takes.
#[test]
fn a_query_is_rescaled_in_the_shell() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("m.csv"),
        "ts,host,cpu\n1000,a,95\n2000,b,5\n",
    )
    .unwrap();
    let script = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
         WITH (path = 'm.csv', format = 'csv', follow = 'true');
       SET query_name = 'per_host';
       SELECT window_start, host, count(*) AS n FROM TUMBLE(m, ts, INTERVAL '10' SECOND)
         GROUP BY window_start, window_end, host &
       ALTER QUERY 1 SET parallelism = 2;
       ALTER QUERY per_host SET parallelism = 3;
       ALTER QUERY 1 SET parallelism = 0;\n";
    let (code, out, err) = piped_with(dir.path(), &["repl", "--state-dir", "state"], script);
    assert_eq!(code, Some(1), "the last change is refused: {out}\n{err}");
    assert_eq!(
        out.matches("query 1 changed").count(),
        2,
        "by id, then by name: {out}\n{err}"
    );
    assert!(out.contains("state kept:"), "{out}\n{err}");
    assert!(err.contains("parallelism"), "{err}");
}

/// `SET autoscale = 'on'` in the shell: a query needs a state directory to
/// be rescaled, and bad settings are refused with what they take.
#[test]
fn autoscaling_in_the_shell_needs_a_state_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.csv"), "ts,host,cpu\n1000,a,95\n").unwrap();
    let script = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
         WITH (path = 'm.csv', format = 'csv');
       SET autoscale = 'on';
       SELECT window_start, host, count(*) AS n FROM TUMBLE(m, ts, INTERVAL '1' SECOND)
         GROUP BY window_start, window_end, host;\n";
    let (code, out, err) = piped(dir.path(), script);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(err.contains("autoscale needs a state directory"), "{err}");
    let (code, out, err) = piped(dir.path(), "SET autoscale.policy = 'magic';\n");
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(err.contains("'ds2' or 'rule'"), "{err}");
    let (code, out, err) = piped_with(dir.path(), &["repl", "--state-dir", "state"], script);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("a,1"), "{out}\n{err}");
}
