//! The walk-through of `docs/prometheus.md` ("A Prometheus stack in four
//! steps"), run as written against the real programs: node_exporter scraped
//! by Prometheus, Prometheus remote-writing to `vigil serve` loaded with the
//! page's `alerts.sql`, and vigil's alerts in Alertmanager. Only ports and
//! times change (scrapes every second, `FOR` a few seconds), so the test does
//! in seconds what the page says takes a minute.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::service::{Server, TOKEN};
use crate::stack;

const PAGE: &str = include_str!("../docs/prometheus.md");

/// How long Alertmanager may take to show the alert once node_exporter
/// is gone: a scrape, a remote-write batch, the watermark delay, the `FOR`.
const PATIENCE: Duration = Duration::from_secs(90);

/// The page's first code block whose first line is `first_line` (the
/// walk-through comes first on the page, before the other `# prometheus.yml`).
fn block(first_line: &str) -> String {
    let start = PAGE
        .find(&format!("```sql\n{first_line}\n"))
        .or_else(|| PAGE.find(&format!("```yaml\n{first_line}\n")))
        .unwrap_or_else(|| panic!("docs/prometheus.md has no block starting with {first_line}"));
    let body = &PAGE[start..];
    let body = &body[body.find('\n').unwrap() + 1..];
    body[..body.find("```").expect("the block ends")].to_string()
}

/// `text` with `from` replaced by `to`, which must be there.
fn swap(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the block of docs/prometheus.md no longer has {from:?}"
    );
    text.replace(from, to)
}

fn alerts(am: &str) -> Vec<Value> {
    let text = stack::http()
        .get(am)
        .call()
        .expect("Alertmanager answers")
        .body_mut()
        .read_to_string()
        .expect("a body");
    serde_json::from_str::<Vec<Value>>(&text).expect("a JSON array")
}

fn queries(server: &Server) -> Value {
    let answer = stack::http()
        .get(&server.url("/queries"))
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .call()
        .expect("vigil answers")
        .body_mut()
        .read_to_string()
        .expect("a body");
    serde_json::from_str(&answer).expect("JSON")
}

fn rows_received(server: &Server) -> u64 {
    queries(server)["queries"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|q| q["sources"].as_array().cloned().unwrap_or_default())
        .filter_map(|s| s["rows"].as_u64())
        .sum()
}

#[test]
fn the_readme_walk_through_pages_through_alertmanager() {
    let node = stack::node_exporter();
    let am = stack::alertmanager(None);
    let dir = tempfile::tempdir().expect("temp dir");

    let script = swap(
        &block("-- alerts.sql"),
        "url = 'http://127.0.0.1:9093'",
        &format!("url = '{}', resend = '1 second'", am.url("")),
    );
    let script = swap(
        &script,
        "FOR INTERVAL '1' MINUTE",
        "FOR INTERVAL '3' SECOND",
    );
    let script = swap(&script, "- INTERVAL '10' SECOND", "- INTERVAL '1' SECOND");
    std::fs::write(dir.path().join("alerts.sql"), script).expect("write alerts.sql");
    let server = Server::start(
        dir.path(),
        &["--addr", "127.0.0.1:0", "--token", TOKEN, "alerts.sql"],
    );

    let node_address = node.address();
    let config = swap(
        &block("# prometheus.yml"),
        "scrape_interval: 15s",
        "scrape_interval: 1s",
    );
    let config = swap(&config, "localhost:9100", &node_address);
    let config = swap(
        &config,
        "http://127.0.0.1:8080/api/v1/write",
        &server.url("/api/v1/write"),
    );
    let config = swap(
        &config,
        "credentials: secret",
        &format!("credentials: {TOKEN}"),
    );
    let prometheus = stack::prometheus(&config, &[]);

    // Samples arrive before anything is down.
    let deadline = Instant::now() + PATIENCE;
    while rows_received(&server) == 0 {
        assert!(
            Instant::now() < deadline,
            "no remote-written rows reached vigil\n{}\n{}",
            prometheus.log(),
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let url = am.url("/api/v2/alerts");
    assert!(
        !alerts(&url)
            .iter()
            .any(|a| a["labels"]["alertname"] == "InstanceDown"),
        "nothing is down yet"
    );

    // node_exporter goes away: Prometheus writes up = 0 for it.
    drop(node);
    let deadline = Instant::now() + PATIENCE;
    let alert = loop {
        let found = alerts(&url)
            .into_iter()
            .find(|a| a["labels"]["alertname"] == "InstanceDown");
        if let Some(alert) = found {
            break alert;
        }
        assert!(
            Instant::now() < deadline,
            "InstanceDown never reached Alertmanager\n{}\n{}\n{}\nqueries: {}",
            server.stderr(),
            am.log(),
            prometheus.log(),
            queries(&server)
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let labels = &alert["labels"];
    assert_eq!(labels["job"], "node", "{alert}");
    assert_eq!(labels["instance"], node_address.as_str(), "{alert}");
    assert_eq!(labels["severity"], "critical", "{alert}");
    assert_eq!(alert["status"]["state"], "active", "{alert}");
    let summary = alert["annotations"]["summary"].as_str().unwrap_or("");
    assert_eq!(
        summary,
        format!("{node_address} of job node is down"),
        "{alert}"
    );
    assert!(
        alert["annotations"]["description"]
            .as_str()
            .is_some_and(|d| d.contains(&node_address)),
        "{alert}"
    );
}
