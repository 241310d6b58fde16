//! `EXPLAIN ANALYZE` from `vigil run` and from the library: the numbers it
//! prints are those of the run.

use std::path::Path;
use std::process::{Command, Output};

use vigil::session::{Executed, Session};

/// 1000 rows, 100 ms apart, over hosts a and b; `cpu` is the row's number
/// modulo 100, so a tenth of the rows have `cpu >= 90`.
fn rows() -> String {
    let mut csv = String::from("ts,host,cpu\n");
    for i in 0..1000 {
        csv.push_str(&format!("{},{},{}\n", i * 100, ["a", "b"][i % 2], i % 100));
    }
    csv
}

fn stream(path: &Path, options: &str) -> String {
    format!(
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
           WATERMARK FOR ts AS ts) WITH (path = '{}'{options});",
        path.display()
    )
}

/// Ten 10-second windows, two hosts each: 20 result rows, from the 100
/// rows the filter keeps.
const QUERY: &str = "SELECT window_start, host, count(*) AS n
  FROM TUMBLE(m, ts, INTERVAL '10' SECOND) WHERE cpu >= 90
  GROUP BY window_start, window_end, host";

/// The operator table's row of the operator whose name starts with
/// `name`: its cells (stage, op, instances, rows in, rows out, busy,
/// blocked), and whether it is marked as the bottleneck.
fn operator(text: &str, name: &str) -> (Vec<String>, bool) {
    let line = text
        .lines()
        .find(|l| {
            let cells = cells(l);
            cells.len() == 8
                && cells[0].parse::<u64>().is_ok()
                && cells[7].trim_start_matches("* ").starts_with(name)
        })
        .unwrap_or_else(|| panic!("no operator {name} in\n{text}"));
    let mut cells = cells(line);
    let marked = cells.pop().expect("a name").starts_with("* ");
    (cells, marked)
}

fn cells(line: &str) -> Vec<String> {
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect()
}

fn number(cell: &str) -> u64 {
    cell.replace(',', "").parse().expect("a number")
}

/// Checks the figures of [`QUERY`] over [`rows`], run at parallelism 2.
fn check_analysis(text: &str) {
    assert!(text.contains("operator graph (micro-batch):"), "{text}");
    assert!(
        text.contains("totals: 1,000 rows read, 20 result rows, 0 late, 0 shed, wall time "),
        "{text}"
    );
    let (filter, _) = operator(text, "filter");
    assert_eq!(
        (number(&filter[3]), number(&filter[4])),
        (1000, 100),
        "{text}"
    );
    let (aggregate, _) = operator(text, "window aggregate");
    assert_eq!(aggregate[2], "2", "two instances: {text}");
    assert_eq!(number(&aggregate[3]), 100, "{text}");
    assert_eq!(number(&aggregate[4]), 20, "{text}");
    let marked = text.lines().filter(|l| {
        let cells = cells(l);
        cells.len() == 8 && cells[7].starts_with("* ")
    });
    assert_eq!(marked.count(), 1, "one bottleneck: {text}");
    assert!(text.contains("* the bottleneck"), "{text}");
}

fn vigil(dir: &Path, args: &[&str]) -> Output {
    crate::support::run_within(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(args)
            .current_dir(dir),
        std::time::Duration::from_secs(120),
        &format!("vigil {}", args.join(" ")),
    )
}

#[test]
fn explain_analyze_in_a_script_prints_the_runs_figures() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("m.csv");
    std::fs::write(&data, rows()).unwrap();
    let script = format!(
        "{}\nSET parallelism = '2';\nEXPLAIN ANALYZE {QUERY};\nSELECT count(*) AS n FROM m WHERE cpu >= 90;",
        stream(&data, "")
    );
    std::fs::write(dir.path().join("q.sql"), script).unwrap();
    let out = vigil(dir.path(), &["run", "q.sql", "--format", "csv"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    check_analysis(&stdout);
    // Its results were thrown away; the query after it read the file
    // from the start.
    assert!(!stdout.contains("window_start,host,n"), "{stdout}");
    assert!(stdout.contains("\n100\n"), "{stdout}");
    assert!(stderr.contains("vigil: stream m: rows=1000"), "{stderr}");
}

#[test]
fn explain_analyze_refuses_a_followed_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("m.csv");
    std::fs::write(&data, rows()).unwrap();
    let script = format!(
        "{}\nEXPLAIN ANALYZE {QUERY};",
        stream(&data, ", follow = 'true'")
    );
    std::fs::write(dir.path().join("q.sql"), script).unwrap();
    let out = vigil(dir.path(), &["run", "q.sql"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("EXPLAIN ANALYZE"), "{stderr}");
    assert!(stderr.contains("never ends"), "{stderr}");
    assert!(stderr.contains(".stats"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_analyze_through_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("m.csv");
    std::fs::write(&data, rows()).unwrap();
    let mut session = Session::builder().parallelism(2).build().unwrap();
    let sql = format!("{}\nEXPLAIN ANALYZE {QUERY};", stream(&data, ""));
    let executed = session.execute(&sql).unwrap();
    let Some(Executed::Explain(text)) = executed.last() else {
        panic!("EXPLAIN ANALYZE gives text");
    };
    check_analysis(text);
    assert!(!text.contains("autoscale"), "{text}");
    // Nothing keeps running.
    assert!(session.queries().is_empty());
    // With autoscale on, it says what the controller would choose.
    let sql = format!("SET autoscale = 'on';\nSET autoscale.max = 4;\nEXPLAIN ANALYZE {QUERY};");
    let executed = session.execute(&sql).unwrap();
    let Some(Executed::Explain(text)) = executed.last() else {
        panic!("EXPLAIN ANALYZE gives text");
    };
    let line = text.lines().last().unwrap();
    assert!(
        line.starts_with("autoscale (ds2): at the rate this run read, parallelism 2 -> "),
        "{text}"
    );
    assert!(
        line.contains("rows/s per instance of useful time"),
        "{line}"
    );

    session
        .execute("CREATE STREAM p (ts TIMESTAMP, v DOUBLE) WITH (connector = 'push');")
        .unwrap();
    let Err(e) = session.execute("EXPLAIN ANALYZE SELECT v FROM p;") else {
        panic!("a push stream never ends");
    };
    let message = e.to_string();
    assert!(message.contains("stream 'p' never ends"), "{message}");
    assert!(message.contains(".stats"), "{message}");
}

/// A query much slower than its file: the source waits on it, and the
/// progress line says how much of the time.
#[test]
fn the_progress_line_shows_back_pressure() {
    let dir = tempfile::tempdir().unwrap();
    let mut csv = String::from("ts,host,cpu\n");
    for i in 0..200_000 {
        csv.push_str(&format!("{i},h{},{}\n", i % 10, i % 100));
    }
    std::fs::write(dir.path().join("m.csv"), csv).unwrap();
    let script = format!(
        "{}\nSELECT window_end, host, median(cpu) AS med
           FROM HOP(m, ts, INTERVAL '100' MILLISECOND, INTERVAL '1' SECOND)
           GROUP BY window_start, window_end, host;",
        stream(Path::new("m.csv"), "")
    );
    std::fs::write(dir.path().join("q.sql"), script).unwrap();
    let out = vigil(dir.path(), &["run", "q.sql", "--progress", "always"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let shares: Vec<u64> = stderr
        .split(", back-pressure ")
        .skip(1)
        .filter_map(|rest| rest.split('%').next()?.parse().ok())
        .collect();
    assert!(
        shares.iter().any(|&s| s > 0 && s <= 100),
        "back-pressure on the progress line: {stderr:?}"
    );
}
