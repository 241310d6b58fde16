//! End-to-end checks of the `vigil` command line that the case format does
//! not cover: stdin, output flags and formats, EXPLAIN, dead letters,
//! several files, realtime replay.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support;

/// How long one `vigil run` may take (a debug build on 2 loaded cores).
const RUN: Duration = Duration::from_secs(120);

const STREAM: &str = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND)";

const ROWS: &str = "ts,host,cpu\n1000,a,1\n4000,a,3\n11000,b,5\n25000,a,7\n";

const AVG: &str = "SELECT window_start, host, avg(cpu) AS avg_cpu
  FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_start, window_end, host;";

fn vigil(dir: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    support::run_with_input(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(args)
            .current_dir(dir),
        stdin.unwrap_or("").as_bytes(),
        RUN,
        &format!("vigil {}", args.join(" ")),
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn setup(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, body) in files {
        std::fs::write(dir.path().join(name), body).expect("write file");
    }
    dir
}

#[test]
fn reads_a_stream_from_stdin() {
    let sql = format!("{STREAM} WITH (connector = 'stdin', format = 'csv');\n{AVG}");
    let dir = setup(&[("q.sql", &sql)]);
    let out = vigil(dir.path(), &["run", "q.sql", "--format", "csv"], Some(ROWS));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("window_start,host,avg_cpu\n"),
        "{stdout}"
    );
    assert!(stdout.contains("1970-01-01T00:00:00,a,2.0"), "{stdout}");
    assert!(stdout.contains("1970-01-01T00:00:20,a,7.0"), "{stdout}");
    assert!(text(&out.stderr).contains("vigil: stream m: rows=4 bad=0"));
}

#[test]
fn output_flag_and_formats() {
    let sql = format!("{STREAM} WITH (path = 'm.csv');\n{AVG}");
    let dir = setup(&[("q.sql", &sql), ("m.csv", ROWS)]);
    let out = vigil(
        dir.path(),
        &["run", "q.sql", "--format", "jsonl", "--output", "r.jsonl"],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    let written = std::fs::read_to_string(dir.path().join("r.jsonl")).expect("output file");
    assert_eq!(written.lines().count(), 3, "{written}");
    assert!(
        written.contains(r#"{"window_start":"1970-01-01T00:00:10","host":"b","avg_cpu":5.0}"#),
        "{written}"
    );

    let out = vigil(dir.path(), &["run", "q.sql", "--format", "table"], None);
    let table = text(&out.stdout);
    assert!(table.contains("| window_start"), "{table}");
    assert!(
        table.contains("| 1970-01-01T00:00:00 | a    | 2.0     |"),
        "{table}"
    );
}

#[test]
fn csv_is_the_default_when_stdout_is_not_a_terminal() {
    let sql = format!("{STREAM} WITH (path = 'm.csv');\nSELECT host FROM m WHERE cpu > 4;");
    let dir = setup(&[("q.sql", &sql), ("m.csv", ROWS)]);
    let out = vigil(dir.path(), &["run", "q.sql"], None);
    assert_eq!(text(&out.stdout), "host\nb\na\n");
}

#[test]
fn explain_prints_logical_plan_and_operator_graph() {
    let sql = format!("{STREAM} WITH (path = 'm.csv');\nEXPLAIN {AVG}");
    let dir = setup(&[("q.sql", &sql), ("m.csv", ROWS)]);
    let out = vigil(dir.path(), &["run", "q.sql"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for expected in [
        "logical plan:",
        "WindowAssign: tumble(10000 ms) on ts",
        "Watermark: ts - 2000 ms",
        "TableScan: m",
        "operator graph (micro-batch):",
        "-> task 2: window aggregate",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in\n{stdout}"
        );
    }
}

#[test]
fn bad_rows_go_to_the_dead_letter_file_and_the_summary() {
    let rows = "ts,host,cpu\n1000,a,1\n2000,a,oops\n3000,a\n4000,a,2\n";
    let sql = format!(
        "{STREAM} WITH (path = 'm.csv', dead_letter = 'bad.txt');\nSELECT host, cpu FROM m;"
    );
    let dir = setup(&[("q.sql", &sql), ("m.csv", rows)]);
    let out = vigil(dir.path(), &["run", "q.sql"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "host,cpu\na,1.0\na,2.0\n");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("vigil: stream m: rows=2 bad=2"), "{stderr}");
    assert!(
        stderr
            .contains("vigil: bad row: stream m line 3: column cpu: cannot parse 'oops' as DOUBLE"),
        "{stderr}"
    );
    assert!(
        stderr.contains("vigil: bad row: stream m line 4:"),
        "{stderr}"
    );
    let dead = std::fs::read_to_string(dir.path().join("bad.txt")).expect("dead letters");
    assert_eq!(dead.lines().count(), 2, "{dead}");
    assert!(dead.contains("2000,a,oops"), "{dead}");
}

#[test]
fn several_files_share_streams_and_run_together() {
    let ddl = format!("{STREAM} WITH (path = 'm.csv');");
    let dir = setup(&[
        ("ddl.sql", &ddl),
        (
            "q.sql",
            "SELECT host FROM m WHERE cpu > 6;\nSELECT host FROM m WHERE cpu < 2;",
        ),
        ("m.csv", ROWS),
    ]);
    let out = vigil(dir.path(), &["run", "ddl.sql", "q.sql"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("vigil: stream m: rows=4 bad=0"),
        "the stream is read once: {stderr}"
    );
    assert!(stderr.contains("vigil: query 1: out=1 late=0"), "{stderr}");
    assert!(stderr.contains("vigil: query 2: out=1 late=0"), "{stderr}");
}

#[test]
fn errors_exit_non_zero_with_one_clear_line() {
    let dir = setup(&[(
        "bad.sql",
        "CREATE STREAM m (ts TIMESTAMP);\nSELECT host FROM m WHERE;",
    )]);
    let out = vigil(dir.path(), &["run", "missing.sql"], None);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).starts_with("error: cannot read missing.sql"),
        "{}",
        text(&out.stderr)
    );

    let out = vigil(dir.path(), &["run", "bad.sql"], None);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.starts_with("error: bad.sql: "), "{stderr}");
    assert!(stderr.contains("at line 2, column 25"), "{stderr}");
    assert!(
        stderr.contains(" 2 | SELECT host FROM m WHERE;"),
        "{stderr}"
    );
}

#[test]
fn realtime_replay_is_paced_by_event_time() {
    let rows = "ts,host,cpu\n0,a,1\n1000,a,2\n2000,a,3\n";
    let sql = format!(
        "{STREAM} WITH (path = 'm.csv', replay = 'realtime', speed = '4');\nSELECT cpu FROM m;"
    );
    let dir = setup(&[("q.sql", &sql), ("m.csv", rows)]);
    let started = Instant::now();
    let out = vigil(dir.path(), &["run", "q.sql"], None);
    let elapsed = started.elapsed();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "cpu\n1.0\n2.0\n3.0\n");
    // 2 s of event time at 4x is 0.5 s of wall time; fast replay takes none.
    assert!(elapsed.as_millis() >= 450, "replayed too fast: {elapsed:?}");
}

#[test]
fn emit_every_sends_early_results_then_the_final_one() {
    // 20 s of event time replayed at 10x: 2 s of wall time, with an early
    // result every 200 ms for the open window.
    let rows = "ts,host,cpu\n0,a,1\n5000,a,2\n10000,a,4\n15000,a,8\n20000,a,16\n";
    let sql = format!(
        "{STREAM} WITH (path = 'm.csv', replay = 'realtime', speed = '10');
         SELECT window_start, sum(cpu) AS total FROM TUMBLE(m, ts, INTERVAL '1' MINUTE)
         GROUP BY window_start EMIT EVERY INTERVAL '200' MILLISECOND;"
    );
    let dir = setup(&[("q.sql", &sql), ("m.csv", rows)]);
    let out = vigil(dir.path(), &["run", "q.sql"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "window_start,total,_final");
    assert_eq!(
        lines.last(),
        Some(&"1970-01-01T00:00:00,31.0,true"),
        "{stdout}"
    );
    let early: Vec<&str> = lines
        .iter()
        .filter(|l| l.ends_with(",false"))
        .copied()
        .collect();
    assert!(early.len() >= 2, "expected early results: {stdout}");
    // Early results only grow: each is a partial sum of the rows so far.
    let totals: Vec<f64> = early
        .iter()
        .map(|l| l.split(',').nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(totals.windows(2).all(|w| w[0] <= w[1]), "{totals:?}");
}

#[test]
fn rows_written_into_a_pipe_come_out_before_the_pipe_closes() {
    use std::io::{BufRead, BufReader};
    let dir = setup(&[(
        "q.sql",
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE) WITH (path = 'in.fifo', format = 'csv');
         SELECT host, cpu FROM m WHERE cpu > 90;",
    )]);
    let fifo = dir.path().join("in.fifo");
    let made = support::run_within(Command::new("mkfifo").arg(&fifo), RUN, "mkfifo");
    assert!(made.status.success(), "{}", text(&made.stderr));
    let mut child = support::spawn(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["run", "q.sql", "--format", "csv"])
            .current_dir(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        "vigil run over a FIFO",
    );
    // The write end opens once vigil has opened the read end: until then a
    // non-blocking open fails (ENXIO), and a blocking one would wait for ever.
    let writer = support::wait_until("vigil to open the FIFO for reading", RUN, || {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .ok()
    });
    // Writes block again, as into any pipe.
    // SAFETY: fcntl on a descriptor this test owns.
    let cleared = unsafe {
        use std::os::fd::AsRawFd;
        libc::fcntl(writer.as_raw_fd(), libc::F_SETFL, 0)
    };
    assert_eq!(cleared, 0, "fcntl F_SETFL on the FIFO");
    let mut writer = writer;
    writer
        .write_all(b"ts,host,cpu\n1000,a,95\n2000,b,10\n")
        .expect("write rows");
    writer.flush().expect("flush");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.expect("a line")).is_err() {
                return;
            }
        }
    });
    let wait = std::time::Duration::from_secs(20);
    // The pipe is still open: these lines can only come from rows sent on as
    // soon as they were read, not at end of input.
    assert_eq!(
        rx.recv_timeout(wait)
            .expect("header while the pipe is open"),
        "host,cpu"
    );
    assert_eq!(
        rx.recv_timeout(wait).expect("row while the pipe is open"),
        "a,95.0"
    );
    drop(writer);
    assert!(child.wait_within(RUN).success());
}

#[test]
fn check_accepts_good_scripts_without_running_them() {
    let ddl = format!(
        "{STREAM} WITH (path = 'missing.csv');\nCREATE SINK out WITH (path = 'out/result.csv');"
    );
    let dir = setup(&[
        ("ddl.sql", &ddl),
        (
            "q.sql",
            &format!("{AVG}\nINSERT INTO out SELECT host FROM m;"),
        ),
    ]);
    // Each file alone: q.sql needs ddl.sql's stream and sink.
    let alone = vigil(dir.path(), &["check", "--each", "ddl.sql", "q.sql"], None);
    let alone_err = text(&alone.stderr);
    assert_eq!(alone.status.code(), Some(1), "{alone_err}");
    assert!(
        alone_err.contains("q.sql:1:1: unknown stream 'm'"),
        "{alone_err}"
    );
    // By default they share one catalog, as `vigil run` runs them.
    let out = vigil(dir.path(), &["check", "ddl.sql", "q.sql"], None);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(out.stdout.is_empty());
    // The file may appear before the run: a warning, not an error.
    assert_eq!(
        stderr,
        "ddl.sql:1:1: warning: stream 'm' reads 'missing.csv', which does not exist\n\
         vigil check: 2 files, 4 statements, ok (1 warning)\n"
    );
    assert!(
        !dir.path().join("out").exists(),
        "checking must not create the sink's file"
    );
}

#[test]
fn check_reports_every_error_with_file_line_and_column() {
    let first = format!(
        "{STREAM} WITH (path = 'm.csv');
CREATE SINK out WITH (path = 'out.csv');
SELECT nosuch FROM m;
INSERT INTO out SELECT host FROM m;
   SELECT * FROM HOP(m, ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND);"
    );
    let second = "SELECT host FROM m WHERE;\nSELECT host FROM m;";
    let dir = setup(&[("a.sql", &first), ("b.sql", second)]);
    let out = vigil(dir.path(), &["check", "a.sql", "b.sql"], None);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(".sql:") && !l.contains(": warning: "))
        .collect();
    assert_eq!(errors.len(), 3, "{stderr}");
    assert!(
        errors[0].starts_with("a.sql:4:8: unknown column 'nosuch'"),
        "{stderr}"
    );
    assert!(
        errors[1].starts_with("a.sql:6:4: cannot run on a stream"),
        "{stderr}"
    );
    assert!(
        errors[2].starts_with("b.sql:1:25: Expected: an expression"),
        "{stderr}"
    );
    // The caret under the unknown name, not at the statement's start.
    assert!(
        stderr.contains(" 4 | SELECT nosuch FROM m;\n   |        ^"),
        "{stderr}"
    );
    assert!(
        stderr.contains(" 1 | SELECT host FROM m WHERE;\n   |                         ^"),
        "the caret under the error: {stderr}"
    );
    assert!(
        stderr.ends_with("vigil check: 2 files, 7 statements, 3 errors (1 warning)\n"),
        "{stderr}"
    );
    assert!(!dir.path().join("out.csv").exists());
}

/// 4 s of event time replayed at 4x: about a second of wall time, so the
/// progress line is drawn a few times.
const PACED: &str = "ts,host,cpu\n0,a,1\n1000,a,2\n2000,a,3\n3000,a,4\n4000,a,5\n";

#[test]
fn progress_is_shown_on_request_and_hidden_from_pipes_by_default() {
    let sql = format!(
        "{STREAM} WITH (path = 'm.csv', replay = 'realtime', speed = '4');\nSELECT cpu FROM m WHERE cpu > 2;"
    );
    let dir = setup(&[("q.sql", &sql), ("m.csv", PACED)]);
    let out = vigil(dir.path(), &["run", "q.sql", "--progress", "always"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "cpu\n3.0\n4.0\n5.0\n");
    let stderr = text(&out.stderr);
    assert!(stderr.starts_with("\r\x1b[2Kvigil: "), "{stderr:?}");
    assert!(stderr.contains("/s) at 1970-01-01T00:00:0"), "{stderr:?}");
    assert!(stderr.contains(", late 0, bad 0"), "{stderr:?}");
    // Cleared before the summary, which starts on a clean line.
    assert!(
        stderr.contains("\r\x1b[2Kvigil: stream m: rows=5 bad=0\n"),
        "{stderr:?}"
    );

    let out = vigil(dir.path(), &["run", "q.sql"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "cpu\n3.0\n4.0\n5.0\n");
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("/s)"), "{stderr:?}");
    assert!(!stderr.contains('\r'), "{stderr:?}");
}

#[test]
fn until_end_overrides_the_follow_option() {
    let sql = format!(
        "{STREAM} WITH (path = 'm.csv', follow = 'true');\nSELECT host FROM m WHERE cpu > 4;"
    );
    let dir = setup(&[("q.sql", &sql), ("m.csv", ROWS)]);
    let out = vigil(dir.path(), &["run", "q.sql", "--until-end"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "host\nb\na\n");
}

#[test]
fn follow_reads_appended_rows_live_until_sigterm() {
    use std::io::{BufRead, BufReader};
    let sql = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
  WATERMARK FOR ts AS ts) WITH (path = 'm.csv');
SELECT window_start, count(*) AS n, max(cpu) AS top
  FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_start, window_end;";
    let dir = setup(&[
        ("q.sql", sql),
        ("m.csv", "ts,host,cpu\n1000,a,1\n2000,a,2\n"),
    ]);
    let mut child = support::spawn(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["run", "--follow", "q.sql"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        "vigil run --follow",
    );
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.expect("a line")).is_err() {
                return;
            }
        }
    });
    let append = |rows: &str| {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("m.csv"))
            .expect("open the input");
        file.write_all(rows.as_bytes()).expect("append rows");
    };
    let wait = Duration::from_secs(20);
    // The end of the file is no end: the window [0 s, 10 s) stays open.
    assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());
    // A row at 12 s moves the watermark past it.
    append("12000,b,7\n");
    assert_eq!(rx.recv_timeout(wait).as_deref(), Ok("window_start,n,top"));
    assert_eq!(
        rx.recv_timeout(wait).as_deref(),
        Ok("1970-01-01T00:00:00,2,2.0")
    );
    // A row written in two pieces counts once its line is complete.
    append("25000,a,");
    std::thread::sleep(Duration::from_millis(400));
    append("3\n");
    assert_eq!(
        rx.recv_timeout(wait).as_deref(),
        Ok("1970-01-01T00:00:10,1,7.0")
    );
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "still running"
    );
    child.signal(libc::SIGTERM);
    let status = child
        .wait_for_exit(wait)
        .unwrap_or_else(|| panic!("vigil did not stop within {wait:?} of SIGTERM"));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    assert!(status.success(), "{status:?}: {stderr}");
    // Stopped, not ended: the window [20 s, 30 s) never closed.
    assert!(rx.recv_timeout(Duration::from_secs(2)).is_err());
    assert!(stderr.contains("vigil: SIGTERM: stopping"), "{stderr}");
    assert!(
        stderr.contains("vigil: stopped by SIGTERM; windows still open were not fired"),
        "{stderr}"
    );
    assert!(stderr.contains("vigil: stream m: rows=4 bad=0"), "{stderr}");
    assert!(stderr.contains("vigil: query 1: out=2 late=0"), "{stderr}");
}

/// `n` rows of stream m, one a second, host `a`, cpu 0, 1, 2, ...
fn numbered_rows(n: usize) -> String {
    let mut rows = String::from("ts,host,cpu\n");
    for i in 0..n {
        rows.push_str(&format!("{},a,{i}\n", i * 1000));
    }
    rows
}

#[test]
fn queries_writing_one_file_sink_share_it() {
    let sql = format!(
        "{STREAM} WITH (path = 'm.csv');
CREATE SINK out WITH (path = 'out.csv');
INSERT INTO out SELECT host, cpu FROM m WHERE cpu < 37;
INSERT INTO out SELECT host, cpu FROM m WHERE cpu >= 59;"
    );
    let dir = setup(&[("q.sql", &sql), ("m.csv", &numbered_rows(100))]);
    let out = vigil(dir.path(), &["run", "q.sql"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let written = std::fs::read_to_string(dir.path().join("out.csv")).expect("sink file");
    let mut lines: Vec<&str> = written.lines().collect();
    assert_eq!(lines.remove(0), "host,cpu", "one header, first: {written}");
    // 37 + 41 rows, each whole and once.
    lines.sort_by_key(|l| l.trim_start_matches("a,").parse::<f64>().unwrap_or(-1.0) as i64);
    let expected: Vec<String> = (0..37).chain(59..100).map(|i| format!("a,{i}.0")).collect();
    assert_eq!(lines, expected, "{written}");
}

#[test]
fn queries_sharing_a_file_sink_with_other_columns_are_rejected() {
    let sql = format!(
        "{STREAM} WITH (path = 'm.csv');
CREATE SINK out WITH (path = 'out.csv');
INSERT INTO out SELECT host, cpu FROM m;
INSERT INTO out SELECT host FROM m;"
    );
    let dir = setup(&[("q.sql", &sql), ("m.csv", ROWS)]);
    let out = vigil(dir.path(), &["run", "q.sql"], None);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(
            "error: q.sql:5: sink 'out': the queries writing to out.csv must write the same columns, \
             but one writes (host, cpu) and another (host) (the first query is at q.sql:4:1)"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("vigil: query"), "nothing ran: {stderr}");
}

/// Splits labelled CSV by query: each header line (first field `query`)
/// must come right before a row of its query, and each query has one.
fn lines_by_query(stdout: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut by_query = std::collections::BTreeMap::<String, Vec<String>>::new();
    let mut header = None;
    for line in stdout.lines() {
        let (query, _) = line.split_once(',').expect("a labelled line");
        if query == "query" {
            assert!(
                header.replace(line).is_none(),
                "two headers in a row: {stdout}"
            );
            continue;
        }
        let lines = by_query.entry(query.to_string()).or_default();
        match header.take() {
            Some(h) => {
                assert!(lines.is_empty(), "a second header for {query}: {stdout}");
                lines.push(h.to_string());
            }
            None => assert!(
                !lines.is_empty(),
                "rows of {query} before its header: {stdout}"
            ),
        }
        lines.push(line.to_string());
    }
    assert!(header.is_none(), "a header without rows: {stdout}");
    by_query
}

#[test]
fn several_queries_on_stdout_label_their_rows() {
    let sql = format!(
        "{STREAM} WITH (path = 'm.csv');
SELECT host FROM m WHERE cpu > 2;
CREATE ALERT hot AS SELECT ts, host, cpu FROM m ALERT BY host WHEN cpu > 6;
SELECT cpu, host FROM m WHERE cpu < 4;"
    );
    let dir = setup(&[("q.sql", &sql), ("m.csv", ROWS)]);
    let mut first = None;
    for _ in 0..3 {
        let out = vigil(dir.path(), &["run", "q.sql"], None);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let by_query = lines_by_query(&text(&out.stdout));
        assert_eq!(by_query["q1"], ["query,host", "q1,a", "q1,b", "q1,a"]);
        assert_eq!(by_query["q3"], ["query,cpu,host", "q3,1.0,a", "q3,3.0,a"]);
        assert!(by_query["hot"][0].starts_with("query,"), "{by_query:?}");
        assert!(by_query["hot"][1].contains("firing"), "{by_query:?}");
        assert_eq!(by_query.len(), 3, "{by_query:?}");
        // Over a file, the queries write in turn, in query order, so the
        // whole output is the same on every run.
        let stdout = text(&out.stdout);
        let order: Vec<&str> = stdout
            .lines()
            .map(|l| l.split(',').next().unwrap())
            .collect();
        let mut turns = order.clone();
        turns.dedup();
        assert_eq!(
            turns,
            ["query", "q1", "query", "hot", "query", "q3"],
            "{stdout}"
        );
        match &first {
            None => first = Some(stdout),
            Some(first) => assert_eq!(first, &stdout),
        }
    }

    let out = vigil(dir.path(), &["run", "q.sql", "--format", "jsonl"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 3 + 2 + 1, "{stdout}");
    for line in stdout.lines() {
        assert!(
            [
                "{\"query\":\"q1\",\"host\":",
                "{\"query\":\"q3\",\"cpu\":",
                "{\"query\":\"hot\","
            ]
            .iter()
            .any(|start| line.starts_with(start)),
            "{stdout}"
        );
    }

    let out = vigil(dir.path(), &["run", "q.sql", "--format", "table"], None);
    let stdout = text(&out.stdout);
    for title in ["-- q1\n+", "-- q3\n+", "-- hot\n+"] {
        assert!(stdout.contains(title), "{stdout}");
    }
}

#[test]
fn a_closed_stdout_ends_the_run_cleanly() {
    use std::io::{BufRead, BufReader};
    // Far more output than a pipe holds, and a source that would follow
    // its file for ever: only the closed pipe can end this run.
    let sql = format!("{STREAM} WITH (path = 'm.csv');\nSELECT host, cpu FROM m;");
    let dir = setup(&[("q.sql", &sql), ("m.csv", &numbered_rows(50_000))]);
    let mut child = support::spawn(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["run", "q.sql", "--follow"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        "vigil run --follow into a pipe",
    );
    // The first line is read on a thread, which hands the pipe back so that
    // the test closes it; the guard's kill ends a read that never returns.
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut header = String::new();
        let read = stdout.read_line(&mut header).map(|_| header);
        let _ = tx.send((read, stdout));
    });
    let (header, stdout) = rx
        .recv_timeout(RUN)
        .unwrap_or_else(|_| panic!("no first line from vigil within {RUN:?}"));
    assert_eq!(header.expect("a line"), "host,cpu\n");
    drop(stdout);
    let limit = Duration::from_secs(90);
    let status = child
        .wait_for_exit(limit)
        .unwrap_or_else(|| panic!("vigil did not end within {limit:?} after its stdout closed"));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
    assert!(stderr.contains("vigil: stream m: rows="), "{stderr}");
}

#[test]
fn an_input_naming_no_stream_is_an_error() {
    let sql = format!(
        "{STREAM} WITH (path = 'm.csv');\nCREATE STREAM other (ts TIMESTAMP) WITH (path = 'm.csv');\nSELECT host FROM m;"
    );
    let dir = setup(&[("q.sql", &sql), ("m.csv", ROWS), ("my.csv", ROWS)]);
    let out = vigil(
        dir.path(),
        &["run", "q.sql", "--input", "metrcs=my.csv"],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "error: --input metrcs: no stream is named 'metrcs' (streams: m, other)\n"
    );
    assert!(out.stdout.is_empty());
}

/// In `vigil run`: SHOW, DESCRIBE and a query over no stream print when read, in the
/// run's format (CSV here; a table on a terminal), a dropped alert runs no query and a
/// replaced one only its new definition.
#[test]
fn run_prints_show_and_drops_alerts_before_they_start() {
    let sql = format!(
        "{STREAM} WITH (path = 'm.csv');
         CREATE ALERT gone AS SELECT ts, host, cpu FROM m ALERT BY host WHEN cpu > 0;
         DROP ALERT gone;
         CREATE ALERT hot AS SELECT ts, host, cpu FROM m ALERT BY host WHEN cpu > 100;
         CREATE OR REPLACE ALERT hot AS SELECT ts, host, cpu FROM m ALERT BY host WHEN cpu > 6;
         SHOW ALERTS;
         DESCRIBE m;
         SHOW QUERIES;
         SELECT 1 + 2 AS three;"
    );
    let dir = setup(&[("q.sql", &sql), ("m.csv", ROWS)]);
    let out = vigil(dir.path(), &["run", "q.sql", "--format", "csv"], None);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("name,kind,columns,source\nhot,alert,"),
        "{stdout}"
    );
    assert!(!stdout.contains("gone"), "{stdout}");
    assert!(
        stdout.contains("column,type,note\nts,TIMESTAMP,event time\n"),
        "{stdout}"
    );
    // DESCRIBE's notes go to stderr, out of the CSV's way.
    assert!(
        stderr.contains("event time: ts, watermark delay 2 s"),
        "{stderr}"
    );
    assert!(stdout.contains("three\n3\n"), "{stdout}");
    // No query runs while the script is read: SHOW QUERIES names its columns only.
    assert!(stdout.contains("\nid,rows_out,late_rows,"), "{stdout}");
    assert!(!stdout.contains('|'), "no table in CSV output: {stdout}");
    // One query ran: the replaced alert, firing for the one row over 6.
    assert!(stderr.contains("vigil: query 1: out=1"), "{stderr}");
    assert!(!stderr.contains("vigil: query 2"), "{stderr}");
    assert!(stdout.contains("hot,a,firing"), "{stdout}");
}

/// A checkpoint written through the library, as the runtime writes one,
/// for `vigil checkpoints` to show.
fn write_checkpoint(root: &Path) {
    use datafusion::arrow::array::{Float64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::record_batch::RecordBatch;
    use std::sync::Arc;
    use vigil::connectors::SourcePosition;
    use vigil::state::OperatorState;
    use vigil::state::store::*;
    let schema = Arc::new(Schema::new(vec![
        Field::new("host", DataType::Utf8, true),
        Field::new("sum", DataType::Float64, true),
    ]));
    let hosts = StringArray::from(vec!["a", "b", "a", "c"]);
    let sums = Float64Array::from(vec![1.0, 2.0, 3.0, 4.0]);
    let batch = RecordBatch::try_new(schema, vec![Arc::new(hosts), Arc::new(sums)]).unwrap();
    let mut state = OperatorState::new();
    state.add("panes", batch, vec![0]);
    state.add_scalars("meta", &[("watermark", Some(25_000))]);
    let shapes = [OperatorShape::of("1", "WindowAggregate sum(cpu)", &state)];
    let checkpoint = Checkpoint {
        id: 3,
        time_ms: 1_700_000_000_007,
        query: "cpu alert".into(),
        fingerprint: fingerprint(&shapes),
        savepoint: false,
        operators: vec![OperatorEntry {
            id: "1".into(),
            describe: "WindowAggregate sum(cpu)".into(),
            state,
        }],
        sources: vec![
            SourceEntry {
                stream: "m".into(),
                position: Some(SourcePosition {
                    offset: 120,
                    line: 5,
                    rows: 4,
                    ..Default::default()
                }),
                ended: false,
                buffer: None,
            },
            SourceEntry {
                stream: "events".into(),
                position: None,
                ended: false,
                buffer: None,
            },
        ],
        sinks: vec![SinkEntry {
            name: "out".into(),
            commit: Some(serde_json::json!({"bytes": 42})),
        }],
    };
    let store = QueryStore::open(&Location::local(root), "cpu alert", 2).unwrap();
    store.write(&checkpoint).unwrap();
}

#[test]
fn checkpoints_lists_and_inspects_a_directory() {
    let dir = setup(&[]);
    let root = dir.path().join("chk");
    write_checkpoint(&root);
    let out = vigil(dir.path(), &["checkpoints", "chk"], None);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].starts_with("QUERY"), "{stdout}");
    let fields: Vec<&str> = lines[1].split("  ").filter(|f| !f.is_empty()).collect();
    assert_eq!(fields[0].trim(), "cpu alert", "{stdout}");
    assert_eq!(fields[1].trim(), "3", "{stdout}");
    assert_eq!(fields[2].trim(), "2023-11-14T22:13:20.007Z", "{stdout}");
    assert_eq!(fields[3].trim(), "checkpoint", "{stdout}");
    assert!(
        fields[4].ends_with("KiB") || fields[4].ends_with(" B"),
        "{stdout}"
    );
    assert_eq!(
        fields[5].trim(),
        "m=120/5 events=not replayable",
        "{stdout}"
    );

    let out = vigil(
        dir.path(),
        &[
            "checkpoints",
            "chk",
            "--query",
            "cpu alert",
            "--inspect",
            "3",
        ],
        None,
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.starts_with("query cpu alert, checkpoint 3 (checkpoint)\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("operator 1: WindowAggregate sum(cpu)\n"),
        "{stdout}"
    );
    assert!(stdout.contains("  state: "), "{stdout}");
    assert!(
        stdout.contains(" 5 rows, tables: panes, meta\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  table panes: 4 rows, ")
            && stdout.contains("keyed by (host), 3 keys in "),
        "{stdout}"
    );
    assert!(stdout.contains("  table meta: 1 row, "), "{stdout}");
    assert!(stdout.contains(", not keyed\n"), "{stdout}");
    assert!(
        stdout.contains("source m: offset 120, line 5, 4 rows, 0 bad rows\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("source events: not replayable\n"),
        "{stdout}"
    );
    assert!(stdout.contains("sink out: {\"bytes\":42}\n"), "{stdout}");
}

#[test]
fn checkpoints_errors_are_one_line_with_exit_code_1() {
    let dir = setup(&[]);
    write_checkpoint(&dir.path().join("chk"));
    for (args, message) in [
        (
            &["checkpoints", "missing"][..],
            "error: checkpoint directory missing does not exist\n",
        ),
        (
            &["checkpoints", "chk", "--inspect", "9"][..],
            "error: query 'cpu alert' has no checkpoint 9 in chk\n",
        ),
        (
            &["checkpoints", "chk", "--query", "q9"][..],
            "error: no checkpoints of query 'q9' in chk (queries: cpu alert)\n",
        ),
    ] {
        let out = vigil(dir.path(), args, None);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(text(&out.stderr), message, "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// Peer functions over more than a megabyte of window results in several
/// batches (five windows fire together at the end): the sort of those rows
/// merges its runs in spawned tasks, which once waited forever behind the
/// operator that waited for them.
#[test]
fn peers_over_a_window_of_many_rows_do_not_hang() {
    let mut rows = String::from("ts,k,v\n");
    for i in 0..60_000 {
        let ts = (i / 12_000) * 10_000 + i % 1000;
        rows.push_str(&format!("{ts},key-{:05},{}\n", i % 12_000, i % 97));
    }
    let dir = setup(&[
        ("m.csv", &rows),
        (
            "q.sql",
            "CREATE STREAM m (ts TIMESTAMP, k TEXT, v BIGINT,
               WATERMARK FOR ts AS ts - INTERVAL '1' HOUR) WITH (path = 'm.csv');
             SELECT k, n FROM (
               SELECT k, n, max(n) OVER (PARTITION BY window_end) AS most
               FROM (SELECT window_end, k, count(*) AS n
                     FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_end, k))
             WHERE n >= most;",
        ),
    ]);
    let output = support::spawn(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["run", "q.sql", "--output", "out.csv"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        "vigil run of the tied top-k over 60,000 rows",
    )
    .output_within(RUN);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let out = std::fs::read_to_string(dir.path().join("out.csv")).expect("results");
    // Every key has one row in each window: all of them tie for the most.
    assert_eq!(
        out.lines().count(),
        60_001,
        "{}",
        &out[..out.len().min(300)]
    );
    assert!(out.lines().skip(1).all(|l| l.ends_with(",1")), "{out:.300}");
}

/// `SET autoscale = 'on'` in a script run by `vigil run` is refused with
/// what to do instead, rather than stored and ignored.
#[test]
fn run_refuses_autoscale_and_says_where_it_works() {
    let sql = format!("{STREAM} WITH (path = 'm.csv');\nSET autoscale = 'on';\n{AVG}");
    let dir = setup(&[("q.sql", &sql), ("m.csv", ROWS)]);
    let out = vigil(dir.path(), &["run", "q.sql"], None);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("q.sql:3: vigil run does not autoscale")
            && stderr.contains("vigil repl --state-dir"),
        "{stderr}"
    );
    assert!(text(&out.stdout).is_empty(), "nothing ran");
}
