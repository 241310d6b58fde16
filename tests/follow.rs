//! `--follow` across log rotation, with a real vigil process.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::support;

const SQL: &str = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
  WATERMARK FOR ts AS ts) WITH (path = 'm.csv');
SELECT host, cpu FROM m;";

/// Lines of `reader`, as they come.
fn lines(reader: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Waits (boundedly) for a line equal to `want`, or containing it.
fn expect(rx: &Receiver<String>, want: &str, exact: bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            if (exact && line == want) || (!exact && line.contains(want)) {
                return;
            }
            seen.push(line);
        }
    }
    panic!("no line {want:?} within 30 s; saw {seen:?}");
}

fn append(path: &std::path::Path, rows: &str) {
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open the input");
    file.write_all(rows.as_bytes()).expect("append rows");
}

#[test]
fn follow_reopens_a_rotated_and_a_truncated_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("q.sql"), SQL).expect("write sql");
    let input = dir.path().join("m.csv");
    std::fs::write(&input, "ts,host,cpu\n1000,a,1\n").expect("write input");
    let mut child = support::spawn(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["run", "--follow", "--format", "csv", "q.sql"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        "vigil run --follow",
    );
    let out = lines(child.stdout.take().expect("stdout"));
    let err = lines(child.stderr.take().expect("stderr"));
    expect(&out, "a,1.0", true);
    append(&input, "2000,a,2\n");
    expect(&out, "a,2.0", true);

    // Rotation by rename: the new file has its own header.
    std::fs::rename(&input, dir.path().join("m.csv.1")).expect("rotate");
    std::fs::write(&input, "ts,host,cpu\n3000,b,3\n").expect("new file");
    expect(&err, "vigil: stream m: file rotated, reopened", false);
    expect(&out, "b,3.0", true);
    append(&input, "4000,b,4\n");
    expect(&out, "b,4.0", true);

    // Copy-and-truncate: read again from the start.
    std::fs::write(&input, "ts,host,cpu\n5000,c,5\n").expect("truncate");
    expect(&err, "vigil: stream m: file truncated, reopened", false);
    expect(&out, "c,5.0", true);

    child.kill_group();
}
