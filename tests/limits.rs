//! Statements past the size limits (grammar/README.md, "Limits") get a
//! clean error from every front end: `vigil check` and `vigil run` print
//! it and exit 1, `vigil serve` answers 400 and goes on serving. Before the
//! limits these inputs overflowed the stack and aborted the process.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::support;

const STREAM: &str = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
    WATERMARK FOR ts AS ts) WITH (path = 'm.csv');\n";

/// The long statements of the hardening issue: a 4 KB `1+1+...`, 2,000
/// `AND`s, 1,000 `UNION ALL`s; and the limit each must name.
fn long_statements() -> Vec<(String, &'static str)> {
    vec![
        (
            format!("SELECT {} AS x FROM m;", vec!["1"; 2_000].join("+")),
            "expression too deep: more than 256 levels",
        ),
        (
            format!(
                "SELECT host FROM m WHERE {};",
                vec!["cpu > 1"; 2_000].join(" AND ")
            ),
            "expression too deep: more than 256 levels",
        ),
        (
            format!("{};", vec!["SELECT host FROM m"; 1_000].join(" UNION ALL ")),
            "more than 128 levels of UNION",
        ),
    ]
}

#[test]
fn check_and_run_refuse_long_statements_with_exit_1() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("m.csv"), "ts,host,cpu\n1000,a,1\n").expect("write");
    for (statement, limit) in long_statements() {
        std::fs::write(dir.path().join("q.sql"), format!("{STREAM}{statement}")).expect("write");
        for command in ["check", "run"] {
            let out = support::run_within(
                Command::new(env!("CARGO_BIN_EXE_vigil"))
                    .args([command, "q.sql"])
                    .current_dir(dir.path()),
                Duration::from_secs(120),
                &format!("vigil {command} of a long statement"),
            );
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{command}: {stderr}");
            assert!(stderr.contains(limit), "{command}: {stderr}");
            assert!(!stderr.contains("overflow"), "{command}: {stderr}");
        }
    }
}

#[test]
fn serve_answers_400_to_long_statements_and_goes_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = support::spawn(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["serve", "--addr", "127.0.0.1:0"])
            .current_dir(dir.path())
            .env_remove("VIGIL_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        "vigil serve",
    );
    let (tx, rx) = mpsc::channel();
    let pipe = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(|l| l.ok()) {
            if let Some(addr) = line.strip_prefix("vigil: listening on ") {
                let _ = tx.send(addr.to_string());
            }
        }
    });
    let base = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("vigil serve prints its address");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .new_agent();
    let post = |sql: &str| {
        let response = agent
            .post(format!("{base}/statements"))
            .send(sql)
            .expect("the server answers");
        let (parts, mut body) = response.into_parts();
        let body = body.read_to_string().expect("a body");
        (parts.status.as_u16(), body)
    };
    assert_eq!(post(STREAM).0, 200);
    for (statement, limit) in long_statements() {
        let (status, body) = post(&statement);
        assert_eq!(status, 400, "{body}");
        assert!(body.contains(limit), "{body}");
    }
    // Still serving.
    let (status, body) = post("EXPLAIN SELECT host FROM m;");
    assert_eq!(status, 200, "{body}");
    child.kill_group();
}

/// A CSV line far past `max_record_size` (200 MB, the limit 1 MiB by
/// default) is one bad row with its line number; the rows around it are
/// read, and memory stays far below the line's size (it is read past,
/// never held).
#[test]
fn a_200_mb_line_is_one_bad_row_and_memory_stays_bounded() {
    use std::io::Write;

    let dir = tempfile::tempdir().expect("temp dir");
    let mut file = std::io::BufWriter::new(
        std::fs::File::create(dir.path().join("m.csv")).expect("create m.csv"),
    );
    file.write_all(b"ts,host,cpu\n1000,a,1\n").expect("write");
    let block = vec![b'9'; 1 << 20];
    for _ in 0..200 {
        file.write_all(&block).expect("write the long line");
    }
    file.write_all(b",b,2\n3000,c,3\n").expect("write");
    file.flush().expect("flush");
    drop(file);
    std::fs::write(
        dir.path().join("q.sql"),
        format!("{STREAM}SELECT host, cpu FROM m;"),
    )
    .expect("write q.sql");
    let child = support::spawn(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["run", "q.sql", "--format", "csv"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        "vigil run over a 200 MB line",
    );
    let peak = support::PeakRss::watch(child.id());
    let out = child.output_within(Duration::from_secs(120));
    let peak = peak.finish();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout, "host,cpu\na,1.0\nc,3.0\n", "{stderr}");
    assert!(stderr.contains("vigil: stream m: rows=2 bad=1"), "{stderr}");
    assert!(
        stderr.contains("line 3") && stderr.contains("longer than max_record_size (1048576 bytes)"),
        "{stderr}"
    );
    eprintln!("peak RSS over a 200 MB line: {} MiB", peak >> 20);
    assert!(peak > 0 && peak < 150 << 20, "peak RSS {} MiB", peak >> 20);
}
