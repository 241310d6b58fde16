//! The interactive shell, driven through a pseudo-terminal as a person
//! would: multi-line statements, dot commands, errors, foreground and
//! background queries, Ctrl-C, completion and history.
//!
//! The screen is matched by substrings, never by layout: the line editor
//! repaints lines as it likes.

use std::path::Path;
use std::process::Command;

use rexpect::process::WaitStatus;
use rexpect::session::{Options, PtySession, spawn_with_options};

/// Per expectation: generous, the machine is shared and slow.
const TIMEOUT_MS: u64 = 60_000;

const ROWS: &str = "ts,host,cpu\n1000,a,1\n4000,a,3\n11000,b,5\n25000,a,7\n";

fn start(dir: &Path, history: &Path) -> PtySession {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vigil"));
    command
        .current_dir(dir)
        .env("VIGIL_HISTORY", history)
        .env("TERM", "xterm")
        .env("NO_COLOR", "1");
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
    expect(&mut repl, "No field named nope");
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
    expect(&mut repl, "rows out");
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
    match repl.process().wait() {
        Ok(WaitStatus::Exited(_, code)) => assert_eq!(code, 0, "exit status"),
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
    match repl.process_mut().wait() {
        Ok(WaitStatus::Exited(_, 0)) => {}
        other => panic!("the shell should exit 0, got {other:?}"),
    }
}

/// A bounded question over a file is answered at the prompt as a batch
/// query; over a stream that never ends it is refused, saying why.
#[test]
fn a_batch_query_in_the_shell() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("m.csv"), ROWS).expect("write m.csv");
    let history = dir.path().join("history");
    let mut repl = start(dir.path(), &history);
    expect(&mut repl, "vigil> ");
    type_line(
        &mut repl,
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE) WITH (path = 'm.csv');",
    );
    expect(&mut repl, "vigil> ");
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
