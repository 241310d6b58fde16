//! End-to-end checks of the `vigil` command line that the case format does
//! not cover: stdin, output flags and formats, EXPLAIN, dead letters,
//! several files, realtime replay.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Instant;

const STREAM: &str = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND)";

const ROWS: &str = "ts,host,cpu\n1000,a,1\n4000,a,3\n11000,b,5\n25000,a,7\n";

const AVG: &str = "SELECT window_start, host, avg(cpu) AS avg_cpu
  FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_start, window_end, host;";

fn vigil(dir: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vigil starts");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or("").as_bytes())
        .expect("write stdin");
    drop(input);
    child.wait_with_output().expect("vigil runs")
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
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["run", "q.sql", "--format", "csv"])
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vigil starts");
    // Opening the write end waits for vigil to open the read end.
    let mut writer = std::fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .expect("open fifo");
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
    assert!(child.wait().expect("vigil ends").success());
}
