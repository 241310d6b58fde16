//! The Alertmanager sink against a real Alertmanager (`tests/stack.rs`):
//! the real `vigil` binary runs an alert over rows the test writes to its
//! stdin, and the test reads what Alertmanager made of it through
//! Alertmanager's own API: the alert with its labels and annotations, a
//! silence suppressing it, and its resolution when the data recovers.

use std::io::Write;
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::stack;
use crate::support::{self, Guarded};

/// How long a test waits for Alertmanager to show something.
const PATIENCE: Duration = Duration::from_secs(30);

/// How long vigil may take to end once its stdin is closed.
const END: Duration = Duration::from_secs(120);

fn script(am: &str) -> String {
    format!(
        "CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
           WITH (connector = 'stdin', format = 'csv', buffer = 'disk');
         CREATE SINK am WITH (connector = 'alertmanager', url = '{am}', resend = '1 second',
           generator_url = 'http://vigil.example/alerts?host={{host}}');
         CREATE ALERT high_cpu AS SELECT ts, host, cpu FROM metrics
         ALERT BY host WHEN cpu > 90 RESOLVE WHEN cpu < 50
           SEVERITY 'critical'
           MESSAGE 'cpu on {{host}} at {{cpu:.0}} %'
           LABELS (team = 'infra', instance = '{{host}}:9100')
           ANNOTATIONS (runbook_url = 'http://wiki.example/cpu');
         SET query_name = 'page';
         INSERT INTO am SELECT * FROM high_cpu;\n"
    )
}

fn start(dir: &Path, args: &[&str]) -> Guarded {
    support::spawn(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["run", "alerts.sql"])
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.txt")).unwrap()),
        "vigil run alerts.sql",
    )
}

fn send(stdin: &mut ChildStdin, rows: &str) {
    stdin.write_all(rows.as_bytes()).expect("vigil reads stdin");
    stdin.flush().unwrap();
}

fn get(url: &str) -> Value {
    let text = stack::http()
        .get(url)
        .call()
        .expect("Alertmanager answers")
        .body_mut()
        .read_to_string()
        .expect("a body");
    serde_json::from_str(&text).expect("JSON")
}

/// Alertmanager's alerts named `high_cpu` (its API's filter).
fn high_cpu(am: &stack::Program) -> Vec<Value> {
    let alerts = get(&am.url("/api/v2/alerts?filter=alertname%3D%22high_cpu%22"));
    alerts.as_array().cloned().unwrap_or_default()
}

/// Waits until `check` holds for the `high_cpu` alerts; returns them.
fn wait_until(
    am: &stack::Program,
    dir: &Path,
    what: &str,
    check: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let alerts = high_cpu(am);
        if check(&alerts) {
            return alerts;
        }
        if Instant::now() > deadline {
            let stderr = std::fs::read_to_string(dir.join("stderr.txt")).unwrap_or_default();
            panic!(
                "Alertmanager never showed {what}: {alerts:#?}\nvigil stderr:\n{stderr}\n{}",
                am.log()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn alerts_reach_alertmanager_are_silenced_and_resolve() {
    let am = stack::alertmanager(None);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("alerts.sql"), script(&am.url(""))).unwrap();
    let mut vigil = start(dir.path(), &[]);
    let mut stdin = vigil.stdin.take().unwrap();
    // Event time a minute ago, so that the resolve time is in the past.
    let t0 = epoch_ms() - 60_000;
    // b's row moves the watermark past a's, which fires.
    send(
        &mut stdin,
        &format!("ts,host,cpu\n{t0},a,95\n{},b,10\n", t0 + 1000),
    );

    let alerts = wait_until(&am, dir.path(), "the firing alert", |a| a.len() == 1);
    let alert = &alerts[0];
    assert_eq!(
        alert["labels"],
        json!({"alertname": "high_cpu", "host": "a", "severity": "critical",
               "team": "infra", "instance": "a:9100"})
    );
    assert_eq!(
        alert["annotations"],
        json!({"summary": "cpu on a at 95 %", "runbook_url": "http://wiki.example/cpu"})
    );
    assert_eq!(alert["generatorURL"], "http://vigil.example/alerts?host=a");
    assert_eq!(alert["status"]["state"], "active");
    let starts = chrono::DateTime::parse_from_rfc3339(alert["startsAt"].as_str().unwrap()).unwrap();
    assert_eq!(
        starts.timestamp_millis(),
        t0,
        "startsAt is the event time it began"
    );

    // A silence on the alert's labels, through Alertmanager's API.
    let now = chrono::Utc::now();
    let silence = json!({
        "matchers": [
            {"name": "alertname", "value": "high_cpu", "isRegex": false, "isEqual": true},
            {"name": "host", "value": "a", "isRegex": false, "isEqual": true}
        ],
        "startsAt": now.to_rfc3339(),
        "endsAt": (now + chrono::Duration::hours(1)).to_rfc3339(),
        "createdBy": "vigil tests",
        "comment": "maintenance"
    });
    let answer = stack::http()
        .post(&am.url("/api/v2/silences"))
        .header("content-type", "application/json")
        .send(silence.to_string().as_bytes())
        .expect("silence created")
        .body_mut()
        .read_to_string()
        .unwrap();
    let id = serde_json::from_str::<Value>(&answer).unwrap()["silenceID"]
        .as_str()
        .expect("a silence id")
        .to_string();
    let alerts = wait_until(&am, dir.path(), "the alert suppressed", |a| {
        a.len() == 1 && a[0]["status"]["state"] == "suppressed"
    });
    assert_eq!(alerts[0]["status"]["silencedBy"], json!([id]));

    // Resent while firing: its endsAt moves on with the wall clock.
    let ends = |a: &Value| {
        chrono::DateTime::parse_from_rfc3339(a["endsAt"].as_str().unwrap())
            .unwrap()
            .timestamp_millis()
    };
    let first = ends(&alerts[0]);
    wait_until(&am, dir.path(), "the alert resent", |a| {
        a.len() == 1 && ends(&a[0]) > first
    });

    // The data recovers: resolved at that row's event time, and gone from
    // Alertmanager's active alerts.
    let recovered = t0 + 2000;
    send(
        &mut stdin,
        &format!("{recovered},a,20\n{},b,10\n", t0 + 3000),
    );
    wait_until(&am, dir.path(), "the alert resolved", |a| a.is_empty());
    drop(stdin);
    let status = vigil.wait_within(END);
    let stderr = std::fs::read_to_string(dir.path().join("stderr.txt")).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("vigil: sink am: delivered=") && stderr.contains("failed=0"),
        "{stderr}"
    );
}

/// Checkpoints of query `page` whose sink commit records a firing alert.
fn checkpoints_with_firing(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("ck/page"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| std::fs::read_to_string(e.path().join("manifest.json")).ok())
                .filter(|manifest| manifest.contains("starts_at"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn a_restore_sends_the_firing_alerts_again() {
    let am = stack::alertmanager(None);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("alerts.sql"), script(&am.url(""))).unwrap();
    let args = ["--checkpoint-dir", "ck", "--checkpoint-interval", "100ms"];
    let mut vigil = start(dir.path(), &args);
    let mut stdin = vigil.stdin.take().unwrap();
    let t0 = epoch_ms() - 60_000;
    send(&mut stdin, &format!("ts,host,cpu\n{t0},a,95\n"));
    // b's rows move the watermark on (a fires) and let checkpoints be taken.
    let mut t = t0;
    let deadline = Instant::now() + PATIENCE;
    while high_cpu(&am).is_empty() || checkpoints_with_firing(dir.path()) == 0 {
        assert!(Instant::now() < deadline, "no alert or no checkpoint of it");
        t += 1000;
        send(&mut stdin, &format!("{t},b,10\n"));
        std::thread::sleep(Duration::from_millis(50));
    }
    // vigil dies: nobody resends, and Alertmanager lets the alert end at
    // its endsAt (4 resends of 1 s after the last send).
    vigil.kill_group();
    wait_until(&am, dir.path(), "the alert ended", |a| a.is_empty());

    // Restored from its checkpoint, with no new row: the firing alert is
    // sent again at once.
    let mut vigil = start(dir.path(), &args);
    let alerts = wait_until(&am, dir.path(), "the alert sent again", |a| a.len() == 1);
    assert_eq!(alerts[0]["labels"]["host"], "a");
    assert_eq!(alerts[0]["status"]["state"], "active");
    let starts =
        chrono::DateTime::parse_from_rfc3339(alerts[0]["startsAt"].as_str().unwrap()).unwrap();
    assert_eq!(starts.timestamp_millis(), t0, "the alert it was");
    drop(vigil.stdin.take());
    assert!(vigil.wait_within(END).success());
}
