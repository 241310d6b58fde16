//! The embedding API (`vigil::session`): the example program, pushed rows,
//! alerts as they fire, listing and stopping queries.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{
    AsArray, Float64Array, RecordBatch, StringArray, TimestampMillisecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use vigil::session::{Executed, QueryHandle, QueryState, Session};

#[allow(dead_code)]
#[path = "../examples/embed.rs"]
mod embed;

const WAIT: Duration = Duration::from_secs(20);

/// How long the embedding example may take, a whole run (debug build, 2
/// loaded cores).
const RUN: Duration = Duration::from_secs(120);

/// `future`'s output if it comes within `limit`; else the test fails
/// naming `what` it waited for.
async fn within<T>(what: &str, limit: Duration, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("waited {limit:?} for {what}"))
}

/// The query handles among what `execute` gave.
pub(crate) fn started(executed: Vec<Executed>) -> Vec<QueryHandle> {
    executed
        .into_iter()
        .filter_map(|e| match e {
            Executed::Query(q) => Some(q),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedding_example_prints_its_alerts() {
    let messages = within("the embedding example to end", RUN, embed::run())
        .await
        .expect("the example runs");
    // web-2 is hot from 20 s to 45 s: windows ending at 30 and 40 s average
    // 97, so FOR 2 WINDOWS fires at 40 s; the window ending at 50 s averages
    // 66, not below 50, so it stays firing; the one ending at 60 s resolves.
    assert_eq!(
        messages,
        [
            "firing: web-2 averaged 97.0 % CPU",
            "resolved: web-2 averaged 35.0 % CPU"
        ]
    );
}

/// `(ts TIMESTAMP, host TEXT, cpu DOUBLE)`, none of them nullable.
pub(crate) fn metrics_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        ),
        Field::new("host", DataType::Utf8, false),
        Field::new("cpu", DataType::Float64, false),
    ]))
}

/// Registers push stream `events` (ts, host, cpu) in `session` and starts
/// alert `hot` on it (by host, when cpu > 90); the stream's schema.
fn start_hot_alert(session: &mut Session) -> Arc<Schema> {
    let schema = metrics_schema();
    session
        .register_stream("events", schema.clone(), Some("ts"), 0)
        .expect("registers");
    session
        .execute(
            "CREATE ALERT hot AS SELECT ts, host, cpu FROM events ALERT BY host WHEN cpu > 90;",
        )
        .expect("starts");
    schema
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_on_pushed_rows_fires_while_the_stream_is_open() {
    let mut session = Session::new();
    let schema = start_hot_alert(&mut session);
    let mut alerts = session.alerts();
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(TimestampMillisecondArray::from(vec![1000, 2000])),
            Arc::new(StringArray::from(vec!["a", "b"])),
            Arc::new(Float64Array::from(vec![95.0, 20.0])),
        ],
    )
    .unwrap();
    within("the push", WAIT, session.push("events", batch))
        .await
        .expect("pushes");
    let fired = tokio::time::timeout(WAIT, alerts.recv())
        .await
        .expect("the alert fires before the stream ends")
        .expect("a batch");
    assert_eq!(fired.num_rows(), 1);
    let state = fired.column_by_name("state").unwrap().as_string::<i32>();
    let host = fired.column_by_name("host").unwrap().as_string::<i32>();
    assert_eq!((state.value(0), host.value(0)), ("firing", "a"));
    within("the session to shut down", WAIT, session.shutdown()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_at_parallelism_3_alerts_on_every_key_once() {
    assert!(Session::builder().parallelism(0).build().is_err());
    let mut session = Session::builder().parallelism(3).build().expect("builds");
    let schema = start_hot_alert(&mut session);
    let mut alerts = session.alerts();
    let hosts: Vec<String> = (0..40).map(|i| format!("h{i}")).collect();
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(TimestampMillisecondArray::from(vec![1000; 40])),
            Arc::new(StringArray::from(hosts.clone())),
            Arc::new(Float64Array::from(vec![95.0; 40])),
        ],
    )
    .unwrap();
    within("the push", WAIT, session.push("events", batch))
        .await
        .expect("pushes");
    let mut fired = Vec::new();
    while fired.len() < hosts.len() {
        let batch = tokio::time::timeout(WAIT, alerts.recv())
            .await
            .expect("every host's alert fires")
            .expect("a batch");
        let host = batch.column_by_name("host").unwrap().as_string::<i32>();
        fired.extend(host.iter().map(|h| h.unwrap().to_string()));
    }
    fired.sort();
    let mut expected = hosts;
    expected.sort();
    assert_eq!(fired, expected, "each host once");
    within("the session to shut down", WAIT, session.shutdown()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_are_listed_and_stopped() {
    let mut session = Session::new();
    let mut handles = started(
        session
            .execute(
                "CREATE STREAM events (ts TIMESTAMP, host TEXT, WATERMARK FOR ts AS ts)
                   WITH (connector = 'push');
                 SELECT host FROM events;",
            )
            .expect("starts"),
    );
    let mut query = handles.remove(0);
    let listed = session.queries();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, query.id);
    assert_eq!(listed[0].label, "SELECT host FROM events");
    let pushed = within(
        "the push",
        WAIT,
        session.push_json(
            "events",
            "{\"ts\": 1, \"host\": \"a\"}\nnot json\n{\"ts\": 2, \"host\": \"b\"}\n",
        ),
    )
    .await
    .expect("pushes");
    assert_eq!(pushed, 2);
    assert_eq!(
        session
            .push_stats("events")
            .bad_rows
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let first = tokio::time::timeout(WAIT, query.next())
        .await
        .expect("results arrive")
        .expect("a batch");
    assert_eq!(first.column(0).as_string::<i32>().value(0), "a");
    assert!(session.stop(query.id));
    assert!(!session.stop(query.id), "already stopped");
    assert!(session.queries().is_empty());
    // The handle drains what was sent and then ends.
    let rest = tokio::time::timeout(WAIT, async { while query.next().await.is_some() {} }).await;
    assert!(rest.is_ok(), "a stopped query's results end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushing_into_a_file_stream_or_an_unknown_one_is_refused() {
    let mut session = Session::new();
    session
        .execute("CREATE STREAM f (ts TIMESTAMP) WITH (path = 'nowhere.csv');")
        .unwrap();
    let e = within("the push", WAIT, session.push_json("f", "{\"ts\": 1}"))
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("only streams with connector = 'push'"),
        "{e}"
    );
    let e = within("the push", WAIT, session.push_json("nope", "{}"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("unknown stream 'nope'"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_started_one_by_one_share_a_file_sink() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut session = Session::new();
    session.set_base_dir(dir.path());
    let handles = started(
        session
            .execute(
                "CREATE STREAM events (ts TIMESTAMP, n BIGINT, WATERMARK FOR ts AS ts)
                   WITH (connector = 'push');
                 CREATE SINK out WITH (path = 'out.csv');
                 INSERT INTO out SELECT n FROM events WHERE n < 37;",
            )
            .expect("starts"),
    );
    // Started later, while the first still writes: it must not truncate
    // the file nor write a second header.
    let more = started(
        session
            .execute("INSERT INTO out SELECT n FROM events WHERE n >= 59;")
            .expect("starts"),
    );
    let other = session
        .execute("INSERT INTO out SELECT ts FROM events;")
        .err()
        .expect("other columns are refused")
        .to_string();
    assert!(
        other.contains("sink 'out'") && other.contains("(n)") && other.contains("(ts)"),
        "{other}"
    );
    let rows: String = (0..100).map(|i| format!("{i},{i}\n")).collect();
    within(
        "the push",
        WAIT,
        session.push_csv("events", &format!("ts,n\n{rows}")),
    )
    .await
    .expect("pushes");
    within(
        "the end of stream events",
        WAIT,
        session.end_stream("events"),
    )
    .await;
    for query in handles.iter().chain(&more) {
        tokio::time::timeout(WAIT, session.wait(query.id))
            .await
            .expect("the query ends")
            .expect("without error");
    }
    let written = std::fs::read_to_string(dir.path().join("out.csv")).expect("sink file");
    let mut lines: Vec<&str> = written.lines().collect();
    assert_eq!(lines.remove(0), "n", "{written}");
    let mut numbers: Vec<i64> = lines.iter().map(|l| l.parse().expect("a number")).collect();
    numbers.sort();
    let expected: Vec<i64> = (0..37).chain(59..100).collect();
    assert_eq!(numbers, expected, "{written}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_that_fails_while_running_is_kept_with_its_error() {
    let mut session = Session::new();
    let mut handles = started(
        session
            .execute(
                "CREATE STREAM events (ts TIMESTAMP, host TEXT, WATERMARK FOR ts AS ts)
                   WITH (connector = 'push');
                 SELECT CAST(host AS BIGINT) AS n FROM events;
                 SELECT host FROM events;",
            )
            .expect("starts"),
    );
    let (failing, running) = (handles.remove(0), handles.remove(0));
    let ended = session.wait(failing.id);
    within(
        "the push",
        WAIT,
        session.push_json("events", "{\"ts\": 1, \"host\": \"abc\"}\n"),
    )
    .await
    .expect("pushes");
    let error = tokio::time::timeout(WAIT, ended)
        .await
        .expect("the query ends")
        .expect_err("it failed");
    assert!(error.to_string().contains("abc"), "{error}");

    // `queries` lists the running ones only, as before; `all_queries` the
    // failed one too, with its error.
    let ids: Vec<_> = session.queries().iter().map(|q| q.id).collect();
    assert_eq!(ids, [running.id]);
    let all = session.all_queries();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].id, failing.id);
    assert_eq!(all[0].state, QueryState::Failed);
    assert_eq!(all[0].state.to_string(), "failed");
    assert_eq!(all[0].error.as_deref(), Some(error.to_string().as_str()));
    assert_eq!(
        (all[1].state, all[1].error.clone()),
        (QueryState::Running, None)
    );
    assert!(
        !session.stop(failing.id),
        "an ended query cannot be stopped"
    );
    assert!(
        !session.forget(running.id),
        "a running query is not forgotten"
    );
    assert!(session.forget(failing.id));
    assert!(!session.forget(failing.id));

    // A query whose input ends is kept as finished.
    let ended = session.wait(running.id);
    within(
        "the end of stream events",
        WAIT,
        session.end_stream("events"),
    )
    .await;
    tokio::time::timeout(WAIT, ended)
        .await
        .expect("the query ends")
        .expect("it finished");
    let all = session.all_queries();
    assert_eq!(all.len(), 1);
    assert_eq!(
        (all[0].id, all[0].state),
        (running.id, QueryState::Finished)
    );
    assert!(session.queries().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_in_one_input_ends_the_whole_query() {
    let mut session = Session::new();
    let handles = started(
        session
            .execute(
                "CREATE STREAM a (ts TIMESTAMP, host TEXT, WATERMARK FOR ts AS ts)
                   WITH (connector = 'push');
                 CREATE STREAM b (ts TIMESTAMP, host TEXT, WATERMARK FOR ts AS ts)
                   WITH (connector = 'push');
                 SELECT CAST(host AS BIGINT) AS n FROM a
                 UNION ALL SELECT CAST(host AS BIGINT) AS n FROM b;",
            )
            .expect("starts"),
    );
    let id = handles[0].id;
    let ended = session.wait(id);
    within(
        "the push",
        WAIT,
        session.push_json("a", "{\"ts\": 1, \"host\": \"abc\"}\n"),
    )
    .await
    .expect("pushes");
    // Stream b stays open: the failed input must stop the rest.
    let error = tokio::time::timeout(WAIT, ended)
        .await
        .expect("the query ends although b is still open")
        .expect_err("it failed");
    assert!(error.to_string().contains("abc"), "{error}");
    assert_eq!(session.all_queries()[0].state, QueryState::Failed);
    within("the session to shut down", WAIT, session.shutdown()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_question_over_a_file_is_answered_and_refused_over_pushed_rows() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("m.csv"),
        "ts,host,cpu\n1000,a,10\n2000,b,30\n3000,a,20\n",
    )
    .unwrap();
    let mut session = Session::new();
    session.set_base_dir(dir.path());
    let mut handles = started(
        session
            .execute(
                "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE) WITH (path = 'm.csv');
                 SELECT host, max(cpu) AS hi FROM m GROUP BY host ORDER BY host;",
            )
            .expect("a batch query starts"),
    );
    let mut query = handles.remove(0);
    let mut rows = Vec::new();
    let drained = tokio::time::timeout(WAIT, async {
        while let Some(batch) = query.next().await {
            let host = batch.column(0).as_string::<i32>();
            let hi = batch
                .column(1)
                .as_primitive::<datafusion::arrow::datatypes::Float64Type>();
            for i in 0..batch.num_rows() {
                rows.push((host.value(i).to_string(), hi.value(i)));
            }
        }
    })
    .await;
    assert!(drained.is_ok(), "the batch query ends with its input");
    assert_eq!(rows, [("a".to_string(), 20.0), ("b".to_string(), 30.0)]);

    let e = session
        .execute(
            "CREATE STREAM p (ts TIMESTAMP, host TEXT) WITH (connector = 'push');
             SELECT count(*) FROM p;",
        )
        .err()
        .expect("an aggregate without a window over pushed rows is refused");
    let e = e.to_string();
    assert!(
        e.contains("unbounded aggregate") && e.contains("stream 'p', which never ends"),
        "{e}"
    );
    within("the session to shut down", WAIT, session.shutdown()).await;
}

const DURABLE_SQL: &str =
    "CREATE STREAM ev (ts TIMESTAMP, host TEXT, v DOUBLE, WATERMARK FOR ts AS ts)
       WITH (connector = 'push');
     CREATE SINK totals WITH (path = 'totals.csv', format = 'csv');
     INSERT INTO totals SELECT window_end, host, count(*) AS n, sum(v) AS s
       FROM TUMBLE(ev, ts, INTERVAL '1' SECOND) GROUP BY window_end, host;";

/// Window `k`'s rows as JSON lines: ten rows, hosts a and b, values
/// `100 k + j`, all in second `k`.
fn window_rows(k: u64) -> String {
    (0..10)
        .map(|j| {
            let host = if j % 2 == 0 { "a" } else { "b" };
            format!(
                "{{\"ts\": {}, \"host\": \"{host}\", \"v\": {}}}\n",
                k * 1000 + j * 10,
                k * 100 + j
            )
        })
        .collect()
}

fn durable_session(state: &std::path::Path, base: &std::path::Path) -> Session {
    let mut session = Session::builder()
        .state_dir(state)
        .checkpoint_interval(Duration::from_millis(100))
        .build()
        .expect("a durable session");
    session.set_base_dir(base);
    session
}

#[test]
fn a_durable_session_restores_its_query_and_replays_logged_rows_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    // The first life: windows 0 to 9, a checkpoint, then 10 to 14, and the
    // process "dies" (its runtime goes without a shutdown).
    let first = runtime();
    first.block_on(async {
        let session = durable_session(&state, dir.path());
        let mut session = session;
        session.execute(DURABLE_SQL).unwrap();
        for k in 0..10 {
            within("the push", WAIT, session.push_json("ev", &window_rows(k)))
                .await
                .unwrap();
        }
        let stats = session.checkpoint_stats().expect("checkpoints are on");
        let deadline = std::time::Instant::now() + WAIT;
        while stats.completed.load(std::sync::atomic::Ordering::Relaxed) < 2 {
            assert!(std::time::Instant::now() < deadline, "no checkpoint");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for k in 10..15 {
            within("the push", WAIT, session.push_json("ev", &window_rows(k)))
                .await
                .unwrap();
        }
        assert!(session.wal_bytes()[0].1 > 0, "the rows are logged");
        std::mem::forget(session);
    });
    first.shutdown_timeout(Duration::from_secs(5));

    // The second life runs the same statements: the query is restored and
    // given windows 10 to 14 from the log before 15 to 19.
    let second = runtime();
    second.block_on(async {
        let mut session = durable_session(&state, dir.path());
        let id = started(session.execute(DURABLE_SQL).unwrap())[0].id;
        let stats = session.checkpoint_stats().unwrap();
        assert_eq!(stats.restores.load(std::sync::atomic::Ordering::Relaxed), 1);
        for k in 15..20 {
            within("the push", WAIT, session.push_json("ev", &window_rows(k)))
                .await
                .unwrap();
        }
        within("the end of stream ev", WAIT, session.end_stream("ev")).await;
        tokio::time::timeout(WAIT, session.wait(id))
            .await
            .expect("the query ends")
            .unwrap();
    });
    let text = std::fs::read_to_string(dir.path().join("totals.csv")).unwrap();
    let mut rows: Vec<(String, String, u64, f64)> = text
        .lines()
        .skip(1)
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            (
                f[0].to_string(),
                f[1].to_string(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            )
        })
        .collect();
    rows.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    let expected: Vec<(u64, f64)> = (0..20u64)
        .flat_map(|k| {
            let sum = |parity: u64| {
                (0..10)
                    .filter(|j| j % 2 == parity)
                    .map(|j| (k * 100 + j) as f64)
                    .sum::<f64>()
            };
            [(5, sum(0)), (5, sum(1))]
        })
        .collect();
    let got: Vec<(u64, f64)> = rows.iter().map(|r| (r.2, r.3)).collect();
    assert_eq!(got, expected, "every window once:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_cut_behind_the_kept_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = Session::builder()
        .state_dir(dir.path().join("state"))
        .checkpoint_interval(Duration::from_millis(100))
        .max_wal_bytes(128 << 10)
        .build()
        .unwrap();
    session.set_base_dir(dir.path());
    session.execute(DURABLE_SQL).unwrap();
    for k in 0..100 {
        within("the push", WAIT, session.push_json("ev", &window_rows(k)))
            .await
            .unwrap();
    }
    let before = session.wal_bytes()[0].1;
    let stats = session.checkpoint_stats().unwrap();
    let done = stats.completed.load(std::sync::atomic::Ordering::Relaxed);
    let deadline = std::time::Instant::now() + WAIT;
    // Once the kept checkpoints (3) are all newer than the pushes, the
    // log's full segments go.
    while stats.completed.load(std::sync::atomic::Ordering::Relaxed) < done + 4 {
        assert!(std::time::Instant::now() < deadline, "no checkpoint");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    session.trim_wals().unwrap();
    let after = session.wal_bytes()[0].1;
    assert!(after < before / 2, "{before} -> {after}");
    within("the session to shut down", WAIT, session.shutdown()).await;
}
