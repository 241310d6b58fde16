//! Changing running queries (`ALTER ALERT`, `ALTER QUERY`) through the
//! library: state kept where it fits, refused where it would be lost.

use std::time::Duration;

use datafusion::arrow::array::{AsArray, RecordBatch};
use vigil::session::{Executed, PendingChange, QueryHandle, Session};

use crate::session::started;

const WAIT: Duration = Duration::from_secs(60);

/// `future`'s output, within [`WAIT`]; fails naming `what` past it.
async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("waited {WAIT:?} for {what}"))
}

/// Pushes JSON lines `rows` into stream `ev`.
async fn push(session: &Session, rows: &str) {
    within("rows pushed into ev", session.push_json("ev", rows))
        .await
        .expect("rows pushed");
}

const ALERT_SQL: &str =
    "CREATE STREAM ev (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
       WITH (connector = 'push');
     CREATE ALERT hot AS SELECT ts, host, cpu FROM ev
       ALERT BY host WHEN cpu > 90 FOR INTERVAL '2' SECOND SEVERITY 'page';";

fn durable(dir: &std::path::Path) -> Session {
    let mut session = Session::builder()
        .state_dir(dir.join("state"))
        .checkpoint_interval(Duration::from_millis(100))
        .build()
        .expect("a durable session");
    session.set_base_dir(dir);
    session
}

fn pending(executed: Vec<Executed>) -> PendingChange {
    match executed.into_iter().next() {
        Some(Executed::Change(change)) => *change,
        _ => panic!("ALTER gives a change"),
    }
}

/// `(ts, host, cpu)` rows as JSON lines.
fn rows(rows: &[(i64, &str, f64)]) -> String {
    rows.iter()
        .map(|(ts, host, cpu)| format!("{{\"ts\": {ts}, \"host\": \"{host}\", \"cpu\": {cpu}}}\n"))
        .collect()
}

/// The alert rows of `batch` as `state key severity` (the key is the column after
/// `alert`: `host` here).
fn alert_rows(batch: &RecordBatch) -> Vec<String> {
    let column = |name: &str| {
        batch
            .column_by_name(name)
            .unwrap()
            .as_string::<i32>()
            .clone()
    };
    let host = batch.column(1).as_string::<i32>().clone();
    let (state, severity) = (column("state"), column("severity"));
    (0..batch.num_rows())
        .map(|i| format!("{} {} {}", state.value(i), host.value(i), severity.value(i)))
        .collect()
}

/// The alert rows up to and with the one that fires `key`.
async fn until_firing(handle: &mut QueryHandle, key: &str) -> Vec<String> {
    let firing = format!("firing {key}");
    let mut seen = Vec::new();
    while !seen.iter().any(|r: &String| r.starts_with(&firing)) {
        seen.extend(next_alerts(handle).await);
    }
    seen
}

async fn next_alerts(handle: &mut QueryHandle) -> Vec<String> {
    let batch = tokio::time::timeout(WAIT, handle.next())
        .await
        .expect("an alert row in time")
        .expect("the query goes on");
    alert_rows(&batch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_altered_alert_keeps_its_episodes_and_takes_its_new_condition_and_severity() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = durable(dir.path());
    let mut handle = started(session.execute(ALERT_SQL).unwrap()).remove(0);
    let id = handle.id;
    // a is hot from 0 s: pending, then firing at 2 s; b pending from 2 s.
    push(
        &session,
        &rows(&[(0, "a", 95.0), (1000, "a", 96.0), (2000, "a", 97.0)]),
    )
    .await;
    push(&session, &rows(&[(2000, "b", 93.0)])).await;
    push(&session, &rows(&[(2500, "c", 10.0)])).await;
    let seen = until_firing(&mut handle, "a").await;
    assert!(seen.contains(&"firing a page".to_string()), "{seen:?}");

    let change = pending(
        session
            .execute("ALTER ALERT hot SET WHEN cpu > 92 SEVERITY 'ticket';")
            .unwrap(),
    );
    assert!(change.report().emptied.is_empty(), "{:?}", change.report());
    let changed = within("the change", change.apply())
        .await
        .expect("the change is made");
    assert_eq!(changed.id, id);
    assert!(
        changed.kept.iter().any(|k| k.contains("alert hot")),
        "{changed}"
    );
    assert_eq!(session.queries().len(), 1);
    assert_eq!(session.queries()[0].id, id, "the query keeps its id");

    // a is still firing (not firing again); b's pending episode from 2 s
    // fires at 4 s with the new severity; a at 91 resolves under the new
    // condition.
    push(&session, &rows(&[(4000, "b", 94.0), (4000, "a", 91.0)])).await;
    push(&session, &rows(&[(4500, "c", 10.0)])).await;
    let mut after = Vec::new();
    while after.len() < 2 {
        after.extend(next_alerts(&mut handle).await);
    }
    after.sort();
    assert_eq!(after, ["firing b ticket", "resolved a ticket"]);
    within("the end of ev", session.end_stream("ev")).await;
    tokio::time::timeout(WAIT, session.wait(id))
        .await
        .expect("the query ends once")
        .unwrap();
    let next = within("the end of the results", handle.next()).await;
    assert!(next.is_none(), "no row repeated: {after:?}");
}

const TOTALS_SQL: &str =
    "CREATE STREAM ev (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
       WITH (connector = 'push');
     SET query_name = 'totals';
     SELECT window_end, host, count(*) AS n, sum(cpu) AS s
       FROM TUMBLE(ev, ts, INTERVAL '10' SECOND) GROUP BY window_end, host;";

/// Rows for second `k`: one per host of `hosts`, value k.
fn second(k: i64, hosts: usize) -> String {
    (0..hosts)
        .map(|h| {
            format!(
                "{{\"ts\": {}, \"host\": \"h{h}\", \"cpu\": {k}}}\n",
                k * 1000
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_rescaled_while_its_windows_are_open_loses_and_repeats_no_row() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = durable(dir.path());
    session.engine_mut().set_parallelism(1).unwrap();
    let mut handle = started(session.execute(TOTALS_SQL).unwrap()).remove(0);
    let id = handle.id;
    let collect = tokio::spawn(async move {
        let mut out = Vec::new();
        while let Some(batch) = handle.next().await {
            let host = batch
                .column_by_name("host")
                .unwrap()
                .as_string::<i32>()
                .clone();
            let n = batch
                .column_by_name("n")
                .unwrap()
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                .clone();
            for i in 0..batch.num_rows() {
                out.push((host.value(i).to_string(), n.value(i)));
            }
        }
        out
    });
    // Seconds 0 to 14: window [0, 10) closes, [10, 20) is open.
    for k in 0..15 {
        push(&session, &second(k, 8)).await;
    }
    for parallelism in [3, 2] {
        let sql = format!("ALTER QUERY {id} SET parallelism = {parallelism};");
        let change = pending(session.execute(&sql).unwrap());
        let changed = within("the rescale", change.apply())
            .await
            .expect("rescaled");
        assert!(changed.emptied.is_empty(), "{changed}");
        assert!(!changed.kept.is_empty(), "{changed}");
    }
    let by_name = pending(
        session
            .execute("ALTER QUERY totals SET parallelism = 2;")
            .unwrap(),
    );
    within("the rescale by name", by_name.apply())
        .await
        .expect("found by name");
    for k in 15..25 {
        push(&session, &second(k, 8)).await;
    }
    within("the end of ev", session.end_stream("ev")).await;
    tokio::time::timeout(WAIT, session.wait(id))
        .await
        .expect("ends")
        .unwrap();
    let mut out = within("the results", collect).await.unwrap();
    out.sort();
    // Three windows (0, 10, 20) per host, each counted whole, once.
    let mut expected: Vec<(String, i64)> = (0..8)
        .flat_map(|h| {
            [
                (format!("h{h}"), 10),
                (format!("h{h}"), 10),
                (format!("h{h}"), 5),
            ]
        })
        .collect();
    expected.sort();
    assert_eq!(out, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_would_lose_state_is_refused_before_it_is_made() {
    let mut session = Session::new();
    let mut handle = started(session.execute(ALERT_SQL).unwrap()).remove(0);
    let refused = session
        .execute("ALTER ALERT hot SET SEVERITY 'ticket';")
        .err()
        .expect("refused")
        .to_string();
    assert!(refused.contains("keeps no state"), "{refused}");
    assert!(refused.contains("ALLOW STATE LOSS"), "{refused}");
    // Nothing changed: the alert still pages.
    push(
        &session,
        &rows(&[(0, "a", 95.0), (2000, "a", 95.0), (2500, "b", 1.0)]),
    )
    .await;
    let mut seen = Vec::new();
    while seen.is_empty() {
        seen.extend(next_alerts(&mut handle).await);
    }
    assert_eq!(seen, ["firing a page"]);
    // Allowed, it restarts empty: a fires again, now as a ticket.
    let change = pending(
        session
            .execute("ALTER ALERT hot SET SEVERITY 'ticket' ALLOW STATE LOSS;")
            .unwrap(),
    );
    within("the change", change.apply()).await.unwrap();
    push(
        &session,
        &rows(&[(3000, "a", 95.0), (5000, "a", 95.0), (5500, "b", 1.0)]),
    )
    .await;
    assert_eq!(next_alerts(&mut handle).await, ["firing a ticket"]);
    for (sql, error) in [
        (
            "ALTER ALERT nope SET SEVERITY 'x';",
            "no alert named 'nope'",
        ),
        (
            "ALTER QUERY 99 SET parallelism = 2;",
            "no running query '99'",
        ),
        ("ALTER QUERY 1 SET parallelism = 0;", "at least 1"),
        ("ALTER QUERY 1 SET batch = 2;", "sets parallelism"),
        ("ALTER ALERT hot SET;", "Expected: WHEN, FOR, SEVERITY"),
        (
            "ALTER ALERT hot SET SEVERITY 'x' ALLOW STATE;",
            "Expected: LOSS",
        ),
    ] {
        let e = session.execute(sql).err().expect(sql).to_string();
        assert!(e.contains(error), "{sql}: {e}");
    }
    within("the shutdown", session.shutdown()).await;
}

/// A changed `FOR` applies to the episode already pending, from when it
/// began (b, hot from 2 s, fires at 2 + 5 = 7 s, not at 4 s), and a
/// changed `MESSAGE` is the next notification's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_for_keeps_the_pending_timer_and_a_changed_message_is_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = durable(dir.path());
    let mut handle = started(session.execute(ALERT_SQL).unwrap()).remove(0);
    push(&session, &rows(&[(2000, "b", 93.0), (3000, "b", 94.0)])).await;
    let change = pending(
        session
            .execute("ALTER ALERT hot SET FOR INTERVAL '5' SECOND MESSAGE '{host} hot at {cpu}';")
            .unwrap(),
    );
    assert!(change.report().emptied.is_empty(), "{:?}", change.report());
    within("the change", change.apply())
        .await
        .expect("the change is made");
    // At 4 s the old FOR would have fired; the new one waits until 7 s.
    push(&session, &rows(&[(4000, "b", 95.0), (6000, "b", 96.0)])).await;
    push(&session, &rows(&[(7000, "b", 97.0)])).await;
    let batch = tokio::time::timeout(WAIT, handle.next())
        .await
        .expect("an alert row in time")
        .expect("the query goes on");
    assert_eq!(alert_rows(&batch), ["firing b page"]);
    let message = batch.column_by_name("message").unwrap().as_string::<i32>();
    assert_eq!(message.value(0), "b hot at 97.0");
    let time = |name: &str| {
        batch
            .column_by_name(name)
            .unwrap()
            .as_primitive::<datafusion::arrow::datatypes::TimestampMillisecondType>()
            .value(0)
    };
    assert_eq!((time("since"), time("event_time")), (2000, 7000));
}

/// `CREATE OR REPLACE ALERT` of a running alert in a durable session is a change of its
/// query, as `ALTER ALERT` is: reported before it applies, the same id and results, a
/// ("firing") and b's pending episode carried over. What no longer fits starts empty
/// instead of being refused (the statement asked for a new definition), and new result
/// columns start a new query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_alert_goes_on_from_the_state_that_fits() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = durable(dir.path());
    let mut handle = started(session.execute(ALERT_SQL).unwrap()).remove(0);
    let id = handle.id;
    push(
        &session,
        &rows(&[(0, "a", 95.0), (2000, "a", 97.0), (2000, "b", 93.0)]),
    )
    .await;
    push(&session, &rows(&[(2500, "c", 10.0)])).await;
    until_firing(&mut handle, "a").await;

    let change = pending(
        session
            .execute(
                "CREATE OR REPLACE ALERT hot AS SELECT ts, host, cpu FROM ev
                   ALERT BY host WHEN cpu > 92 FOR INTERVAL '2' SECOND SEVERITY 'ticket';",
            )
            .unwrap(),
    );
    assert!(change.report().emptied.is_empty(), "{:?}", change.report());
    assert!(
        change.report().kept.iter().any(|k| k.contains("alert hot")),
        "{:?}",
        change.report()
    );
    let changed = within("the replacement", change.apply())
        .await
        .expect("the replacement is made");
    assert_eq!(changed.id, id);
    assert_eq!(session.queries().len(), 1, "one query, not two");
    assert_eq!(session.queries()[0].id, id, "the query keeps its id");
    push(&session, &rows(&[(4000, "b", 94.0), (4000, "a", 91.0)])).await;
    push(&session, &rows(&[(4500, "c", 10.0)])).await;
    let mut after = Vec::new();
    while after.len() < 2 {
        after.extend(next_alerts(&mut handle).await);
    }
    after.sort();
    assert_eq!(after, ["firing b ticket", "resolved a ticket"]);

    // A window in place of the row-wise condition: nothing of the old state fits the
    // new operators, and the replacement is still made, saying what started empty.
    let change = pending(
        session
            .execute(
                "CREATE OR REPLACE ALERT hot AS
                   SELECT window_end AS ts, host, max(cpu) AS cpu
                   FROM TUMBLE(ev, ts, INTERVAL '1' SECOND) GROUP BY window_end, host
                   ALERT BY host WHEN cpu > 92 FOR INTERVAL '2' SECOND;",
            )
            .unwrap(),
    );
    let report = change.report().clone();
    assert!(!report.emptied.is_empty(), "{report}");
    within("the second replacement", change.apply())
        .await
        .expect("a replacement whose state does not fit is made");
    assert_eq!(session.queries()[0].id, id, "{report}");

    // Other columns: the old query stops and a new one starts.
    let executed = session
        .execute("CREATE OR REPLACE ALERT hot AS SELECT ts, cpu FROM ev ALERT WHEN cpu > 92;")
        .unwrap();
    let replaced = match executed.into_iter().next() {
        Some(Executed::Query(handle)) => handle,
        Some(Executed::Change(change)) => panic!("a change: {}", change.report()),
        _ => panic!("no query"),
    };
    assert_ne!(replaced.id, id);
    within("the first query's end", session.wait(id))
        .await
        .expect("the old query stops cleanly");
    within("the shutdown", session.shutdown()).await;
}

const INVARIANT_SQL: &str =
    "CREATE STREAM procs (ts TIMESTAMP, parent TEXT, child TEXT, WATERMARK FOR ts AS ts)
       WITH (connector = 'push');
     CREATE INVARIANT children AS SELECT ts, parent, child FROM procs
       LEARN SET OF child BY parent TRAIN FOR INTERVAL '10' SECOND MODE OFFLINE;
     CREATE INVARIANT parents AS SELECT ts, parent, child FROM procs
       LEARN SET OF parent BY child TRAIN FOR INTERVAL '10' SECOND MODE OFFLINE;
     CREATE ALERT odd AS SELECT ts, parent, child, violation FROM children
       ALERT BY parent WHEN violation;";

/// Pushes `(ts, parent, child)` rows into stream `procs`.
async fn push_procs(session: &Session, rows: &[(i64, &str, &str)]) {
    let lines: String = rows
        .iter()
        .map(|(ts, parent, child)| {
            format!("{{\"ts\": {ts}, \"parent\": \"{parent}\", \"child\": \"{child}\"}}\n")
        })
        .collect();
    within("rows pushed into procs", session.push_json("procs", &lines))
        .await
        .expect("rows pushed");
}

/// An alert over a learned invariant: a change that keeps the invariant's operator (a new
/// severity) keeps what it learned, so a child unknown to the trained set fires at once;
/// one that puts another invariant in its place (its shape changed) starts it learning
/// again, and says so before it applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learned_invariant_is_kept_by_a_change_that_keeps_it_and_relearned_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = durable(dir.path());
    let mut handle = started(session.execute(INVARIANT_SQL).unwrap()).remove(0);
    // Trained on 0..10 s: sshd starts bash and scp.
    push_procs(
        &session,
        &[
            (0, "sshd", "bash"),
            (5000, "sshd", "scp"),
            (12000, "sshd", "bash"),
        ],
    )
    .await;

    let change = pending(
        session
            .execute("ALTER ALERT odd SET SEVERITY 'page';")
            .unwrap(),
    );
    let report = change.report().clone();
    assert!(report.emptied.is_empty(), "{report}");
    assert!(
        report.kept.iter().any(|k| k.contains("invariant children")),
        "{report}"
    );
    within("the change", change.apply())
        .await
        .expect("the change is made");
    // Past training: nc is unknown to what sshd learned before the change.
    push_procs(&session, &[(13000, "sshd", "nc")]).await;
    assert_eq!(next_alerts(&mut handle).await, ["firing sshd page"]);

    let change = pending(
        session
            .execute(
                "CREATE OR REPLACE ALERT odd AS SELECT ts, parent, child, violation FROM parents
                   ALERT BY parent WHEN violation SEVERITY 'page';",
            )
            .unwrap(),
    );
    let report = change.report().clone();
    assert!(
        report
            .emptied
            .iter()
            .any(|e| e.contains("invariant parents")),
        "{report}"
    );
    within("the replacement", change.apply())
        .await
        .expect("the replacement is made");
    // The new invariant trains from its first row (20 s) to 30 s: cron starting ls is
    // learned, not a violation; after training, ls started by a stranger is one.
    push_procs(
        &session,
        &[
            (20000, "cron", "ls"),
            (31000, "cron", "ls"),
            (32000, "evil", "ls"),
        ],
    )
    .await;
    assert_eq!(next_alerts(&mut handle).await, ["firing evil page"]);
    within("the shutdown", session.shutdown()).await;
}
