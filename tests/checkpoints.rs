//! Checkpoints and savepoints of `vigil run`, end to end: stopping and
//! resuming, refusing a changed query, and falling back past a damaged
//! checkpoint.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::support::run_within;

/// How long one run of `vigil` may take.
const PATIENCE: Duration = Duration::from_secs(120);

fn vigil(dir: &Path, args: &[&str]) -> Output {
    run_within(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(args)
            .current_dir(dir),
        PATIENCE,
        &format!("vigil {}", args.join(" ")),
    )
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// 200 rows over 3 hosts, one per second.
fn metrics() -> String {
    let mut text = String::from("ts,host,cpu\n");
    for i in 0..200 {
        text.push_str(&format!("{},h{},{}\n", i * 1000, i % 3, (i * 7) % 100));
    }
    text
}

fn script(aggregates: &str) -> String {
    format!(
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH (path = 'm.csv');
CREATE SINK out WITH (connector = 'file', path = 'out.csv', format = 'csv');
INSERT INTO out SELECT window_start, host, {aggregates}
  FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_start, host;"
    )
}

const AGGREGATES: &str = "count(*) AS n, avg(cpu) AS a";

/// A dir with the input and the script, and the file sink of a straight
/// run of it.
fn setup() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("m.csv"), metrics()).expect("input");
    std::fs::write(dir.path().join("q.sql"), script(AGGREGATES)).expect("script");
    let straight = vigil(dir.path(), &["run", "q.sql"]);
    assert!(straight.status.success(), "{}", stderr(&straight));
    let expected = std::fs::read_to_string(dir.path().join("out.csv")).expect("output");
    std::fs::remove_file(dir.path().join("out.csv")).expect("remove");
    (dir, expected)
}

/// The savepoint a run that stopped says it wrote.
fn savepoint_written(output: &Output) -> String {
    let err = stderr(output);
    err.lines()
        .find_map(|l| l.strip_prefix("vigil: savepoint written to "))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no savepoint line in {err}"))
}

fn run_checkpointed(dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "run",
        "q.sql",
        "--checkpoint-dir",
        "ck",
        "--batch-size",
        "10",
    ];
    args.extend(extra);
    vigil(dir, &args)
}

#[test]
fn a_savepoint_taken_on_stop_resumes_to_the_same_file() {
    let (dir, expected) = setup();
    let first = run_checkpointed(
        dir.path(),
        &["--savepoint-on-stop", "--stop-after-rows", "90"],
    );
    assert!(first.status.success(), "{}", stderr(&first));
    let savepoint = savepoint_written(&first);
    let partial = std::fs::read_to_string(dir.path().join("out.csv")).expect("output");
    assert!(
        partial.len() < expected.len() && expected.starts_with(&partial),
        "the first run stopped part-way:\n{partial}"
    );
    let listing = vigil(dir.path(), &["checkpoints", &savepoint]);
    assert!(
        String::from_utf8_lossy(&listing.stdout).contains("savepoint"),
        "{}",
        String::from_utf8_lossy(&listing.stdout)
    );
    // The checkpoint directory lists its savepoints too, with the path to
    // restore from.
    let all = vigil(dir.path(), &["checkpoints", "ck"]);
    let all = String::from_utf8_lossy(&all.stdout).into_owned();
    assert!(
        all.contains("--from-savepoint SAVEPOINT") && all.contains(&format!("{savepoint}  q.q1")),
        "{all}"
    );
    let second = run_checkpointed(dir.path(), &["--from-savepoint", &savepoint]);
    assert!(second.status.success(), "{}", stderr(&second));
    assert!(stderr(&second).contains("rows=200"), "{}", stderr(&second));
    let out = std::fs::read_to_string(dir.path().join("out.csv")).expect("output");
    assert_eq!(out, expected);
}

#[test]
fn a_changed_query_is_refused_unless_told_to_start_it_empty() {
    let (dir, _) = setup();
    let first = run_checkpointed(dir.path(), &["--stop-after-rows", "90"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let before = std::fs::read_to_string(dir.path().join("out.csv")).expect("output");
    let changed = format!("{AGGREGATES}, max(cpu) AS top");
    std::fs::write(dir.path().join("q.sql"), script(&changed)).expect("script");
    let refused = run_checkpointed(dir.path(), &[]);
    assert!(!refused.status.success());
    let err = stderr(&refused);
    assert!(
        err.contains("query q.q1 changed since its checkpoint"),
        "{err}"
    );
    assert!(
        err.contains("window aggregate"),
        "names the operator: {err}"
    );
    assert!(err.contains("max(m.cpu)"), "says what differs: {err}");
    assert!(err.contains("--allow-non-restored-state"), "{err}");
    let after = std::fs::read_to_string(dir.path().join("out.csv")).expect("output");
    assert_eq!(after, before, "a refused restore leaves the sink alone");
    let allowed = run_checkpointed(dir.path(), &["--allow-non-restored-state"]);
    assert!(allowed.status.success(), "{}", stderr(&allowed));
    assert!(
        stderr(&allowed).contains("starts empty"),
        "{}",
        stderr(&allowed)
    );
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_one_before() {
    let (dir, expected) = setup();
    for stop in ["60", "120"] {
        let run = run_checkpointed(dir.path(), &["--stop-after-rows", stop]);
        assert!(run.status.success(), "{}", stderr(&run));
    }
    let query_dir = dir.path().join("ck").join("q%2Eq1");
    let mut checkpoints: Vec<_> = std::fs::read_dir(&query_dir)
        .expect("query folder")
        .map(|e| e.expect("entry").path())
        .collect();
    checkpoints.sort();
    assert!(checkpoints.len() >= 2, "{checkpoints:?}");
    let newest = checkpoints.last().expect("one");
    let table = std::fs::read_dir(newest)
        .expect("checkpoint folder")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|e| e == "arrow"))
        .expect("a state file");
    let mut bytes = std::fs::read(&table).expect("state file");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&table, bytes).expect("damage it");
    let last = run_checkpointed(dir.path(), &[]);
    assert!(last.status.success(), "{}", stderr(&last));
    let err = stderr(&last);
    assert!(
        err.contains("warning"),
        "the damaged checkpoint is reported: {err}"
    );
    let out = std::fs::read_to_string(dir.path().join("out.csv")).expect("output");
    assert_eq!(out, expected);
}

#[test]
fn a_missing_savepoint_is_an_error_and_leaves_the_sink_alone() {
    let (dir, expected) = setup();
    std::fs::write(dir.path().join("out.csv"), &expected).expect("an earlier output");
    let run = run_checkpointed(dir.path(), &["--from-savepoint", "no/such/savepoint"]);
    assert_eq!(run.status.code(), Some(1));
    let err = stderr(&run);
    assert!(
        err.contains("savepoint no/such/savepoint does not exist"),
        "{err}"
    );
    let out = std::fs::read_to_string(dir.path().join("out.csv")).expect("output");
    assert_eq!(out, expected);
}

/// Keyed state of several kinds: windows, sessions (hosts fall silent
/// for 20 s every minute) and an alert's episodes.
const RESCALED: &str = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH (path = 'm.csv');
CREATE SINK windows WITH (connector = 'file', path = 'windows.csv', format = 'csv');
CREATE SINK sessions WITH (connector = 'file', path = 'sessions.csv', format = 'csv');
CREATE SINK alerts WITH (connector = 'file', path = 'alerts.csv', format = 'csv');
INSERT INTO windows SELECT window_start, host, count(*) AS n, avg(cpu) AS a
  FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_start, host;
INSERT INTO sessions SELECT host, window_start, window_end, count(*) AS n
  FROM SESSION(m, ts, INTERVAL '6' SECOND) GROUP BY window_start, window_end, host;
CREATE ALERT busy AS SELECT window_end, host, avg(cpu) AS a
  FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_end, host
  ALERT WHEN a > 40 FOR 2 WINDOWS RESOLVE WHEN a < 30;
INSERT INTO alerts SELECT * FROM busy;";

const RESCALED_SINKS: [&str; 3] = ["windows.csv", "sessions.csv", "alerts.csv"];

/// 600 rows, one per second, over 5 hosts, each silent 20 s a minute.
fn silent_spells() -> String {
    let mut text = String::from("ts,host,cpu\n");
    for i in 0..600 {
        let host = i % 5;
        if (i / 20) % 3 == host % 3 && host < 3 {
            continue;
        }
        text.push_str(&format!(
            "{},h{host},{}\n",
            i * 1000,
            (i * 37 + host * 11) % 100
        ));
    }
    text
}

/// Each sink's lines, the header first and the rows sorted: instances of
/// a stage write their results in another order at another parallelism.
fn sink_rows(dir: &Path) -> Vec<Vec<String>> {
    RESCALED_SINKS
        .iter()
        .map(|name| {
            let text = std::fs::read_to_string(dir.join(name)).expect("sink file");
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            lines[1..].sort();
            lines
        })
        .collect()
}

#[test]
fn a_savepoint_at_parallelism_2_restores_at_1_and_at_3() {
    let straight = tempfile::tempdir().expect("temp dir");
    std::fs::write(straight.path().join("m.csv"), silent_spells()).expect("input");
    std::fs::write(straight.path().join("q.sql"), RESCALED).expect("script");
    let run = vigil(straight.path(), &["run", "q.sql", "--parallelism", "1"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let expected = sink_rows(straight.path());
    assert!(expected.iter().all(|lines| lines.len() > 3), "{expected:?}");
    for restored_at in ["1", "3"] {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("m.csv"), silent_spells()).expect("input");
        std::fs::write(dir.path().join("q.sql"), RESCALED).expect("script");
        let first = run_checkpointed(
            dir.path(),
            &[
                "--parallelism",
                "2",
                "--savepoint-on-stop",
                "--stop-after-rows",
                "250",
            ],
        );
        assert!(first.status.success(), "{}", stderr(&first));
        let savepoint = savepoint_written(&first);
        let second = run_checkpointed(
            dir.path(),
            &["--parallelism", restored_at, "--from-savepoint", &savepoint],
        );
        assert!(second.status.success(), "{}", stderr(&second));
        assert!(
            stderr(&second).contains("restored from savepoint"),
            "{}",
            stderr(&second)
        );
        assert_eq!(
            sink_rows(dir.path()),
            expected,
            "taken at parallelism 2, restored at {restored_at}"
        );
    }
}

/// A join whose second input ends long before the first: its checkpoints
/// after that have no state of the ended input's operators.
const JOINED: &str = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH (path = 'm.csv');
CREATE STREAM hosts (ts TIMESTAMP, host TEXT, rack TEXT,
  WATERMARK FOR ts AS ts) WITH (path = 'hosts.csv');
CREATE SINK out WITH (connector = 'file', path = 'out.csv', format = 'csv');
INSERT INTO out SELECT c.window_start, c.host, c.n, r.racks
  FROM (SELECT window_start, window_end, host, count(*) AS n
        FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_start, window_end, host) c
  JOIN (SELECT window_start, window_end, host, count(*) AS racks
        FROM TUMBLE(hosts, ts, INTERVAL '10' SECOND) GROUP BY window_start, window_end, host) r
  ON c.host = r.host AND c.window_start = r.window_start;";

#[test]
fn a_join_restores_after_one_of_its_inputs_ended() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("m.csv"), metrics()).expect("input");
    let mut hosts = String::from("ts,host,rack\n");
    // Sparse over the whole run: its last rows wait in the join for the
    // metrics of their windows when it ends.
    for i in 0..10 {
        hosts.push_str(&format!("{},h{},r{}\n", i * 20_000, i % 3, i % 2));
    }
    std::fs::write(dir.path().join("hosts.csv"), hosts).expect("input");
    std::fs::write(dir.path().join("q.sql"), JOINED).expect("script");
    let straight = vigil(dir.path(), &["run", "q.sql"]);
    assert!(straight.status.success(), "{}", stderr(&straight));
    let expected = std::fs::read_to_string(dir.path().join("out.csv")).expect("output");
    assert!(expected.lines().count() > 1, "{expected}");
    std::fs::remove_file(dir.path().join("out.csv")).expect("remove");
    let first = run_checkpointed(
        dir.path(),
        &["--savepoint-on-stop", "--stop-after-rows", "100"],
    );
    assert!(first.status.success(), "{}", stderr(&first));
    let savepoint = savepoint_written(&first);
    // Restored with the short input at its end, stopped again: the second
    // savepoint must still say where that input ended, or the third run
    // would read it again.
    let second = run_checkpointed(
        dir.path(),
        &[
            "--from-savepoint",
            &savepoint,
            "--savepoint-on-stop",
            "--stop-after-rows",
            "150",
        ],
    );
    assert!(second.status.success(), "{}", stderr(&second));
    let again = savepoint_written(&second);
    let third = run_checkpointed(dir.path(), &["--from-savepoint", &again]);
    assert!(third.status.success(), "{}", stderr(&third));
    let out = std::fs::read_to_string(dir.path().join("out.csv")).expect("output");
    assert_eq!(out, expected);
}

/// `vigil run q.sql` checkpointing into `store` (a path or a URL), with
/// crash point `crash` armed if given.
fn run_in_store(dir: &Path, store: &str, extra: &[&str], crash: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vigil"));
    command
        .args([
            "run",
            "q.sql",
            "--checkpoint-dir",
            store,
            "--batch-size",
            "10",
        ])
        .args(extra)
        .env_remove("VIGIL_CRASH_AT")
        .current_dir(dir);
    if let Some(point) = crash {
        command.env("VIGIL_CRASH_AT", point);
    }
    run_within(
        &mut command,
        PATIENCE,
        "vigil run checkpointing into a store",
    )
}

#[test]
fn a_file_url_store_restores_after_a_kill_mid_checkpoint() {
    use std::os::unix::process::ExitStatusExt;
    let (dir, expected) = setup();
    let store = format!("file://{}/store", dir.path().display());
    let first = run_in_store(dir.path(), &store, &["--stop-after-rows", "60"], None);
    assert!(first.status.success(), "{}", stderr(&first));
    // Killed (SIGKILL) once its next checkpoint's state is in the store,
    // before the manifest.
    let killed = run_in_store(
        dir.path(),
        &store,
        &["--stop-after-rows", "120"],
        Some("checkpoint-write:1"),
    );
    assert_eq!(killed.status.signal(), Some(9), "{}", stderr(&killed));
    assert!(
        stderr(&killed).contains("restored from checkpoint 1"),
        "{}",
        stderr(&killed)
    );
    let last = run_in_store(dir.path(), &store, &[], None);
    assert!(last.status.success(), "{}", stderr(&last));
    let err = stderr(&last);
    assert!(
        err.contains("skipped checkpoint 2") && err.contains("incomplete"),
        "{err}"
    );
    assert!(err.contains("restored from checkpoint 1"), "{err}");
    let out = std::fs::read_to_string(dir.path().join("out.csv")).expect("output");
    assert_eq!(out, expected);
    // The same layout as a local directory's, and listed by URL.
    assert!(dir.path().join("store/q%2Eq1").is_dir());
    let listing = vigil(dir.path(), &["checkpoints", &store]);
    let listed = String::from_utf8_lossy(&listing.stdout);
    assert!(listing.status.success(), "{}", stderr(&listing));
    assert!(
        listed.contains("q.q1") && listed.contains("checkpoint"),
        "{listed}"
    );
}

#[test]
fn a_savepoint_in_a_file_url_store_resumes_to_the_same_file() {
    let (dir, expected) = setup();
    let store = format!("file://{}/store", dir.path().display());
    let stop = ["--savepoint-on-stop", "--stop-after-rows", "90"];
    let first = run_in_store(dir.path(), &store, &stop, None);
    assert!(first.status.success(), "{}", stderr(&first));
    let savepoint = savepoint_written(&first);
    assert!(
        savepoint.starts_with(&format!("{store}/savepoints/sp-")),
        "{savepoint}"
    );
    let second = run_in_store(dir.path(), &store, &["--from-savepoint", &savepoint], None);
    assert!(second.status.success(), "{}", stderr(&second));
    assert!(
        stderr(&second).contains("restored from savepoint"),
        "{}",
        stderr(&second)
    );
    let out = std::fs::read_to_string(dir.path().join("out.csv")).expect("output");
    assert_eq!(out, expected);
    let missing = run_in_store(
        dir.path(),
        &store,
        &["--from-savepoint", &format!("{store}/savepoints/none")],
        None,
    );
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains("does not exist"),
        "{}",
        stderr(&missing)
    );
}

#[test]
fn a_bad_store_url_is_a_clear_error() {
    let (dir, _) = setup();
    let run = run_in_store(dir.path(), "ftp://host/ck", &[], None);
    assert_eq!(run.status.code(), Some(2), "{}", stderr(&run));
    assert!(
        stderr(&run).contains("unknown scheme 'ftp'"),
        "{}",
        stderr(&run)
    );
    assert!(!stderr(&run).contains("panicked"), "{}", stderr(&run));
}
