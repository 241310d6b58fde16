use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{Float64Array, StringArray, TimestampMillisecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};

use super::*;
use crate::connector::{Opener, SinkConfig, SinkTarget};

fn opts(kv: &[(&str, &str)]) -> Vec<(String, String)> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Parses through the public entry point, as `CREATE SINK` does.
fn config(kv: &[(&str, &str)]) -> Result<SinkConfig> {
    let mut all = opts(&[("connector", "webhook")]);
    all.extend(opts(kv));
    SinkConfig::from_options("pager", &all, std::path::Path::new("/base"))
}

fn webhook(kv: &[(&str, &str)]) -> WebhookConfig {
    match config(kv).unwrap().target {
        SinkTarget::Connector(open) => settings(&open).clone(),
        other => panic!("not a webhook: {other:?}"),
    }
}

fn settings(open: &Opener) -> &WebhookConfig {
    let any: &dyn std::any::Any = open.0.as_ref();
    any.downcast_ref::<WebhookConfig>().expect("a webhook")
}

fn err(kv: &[(&str, &str)]) -> String {
    config(kv).unwrap_err().to_string()
}

#[test]
fn defaults() {
    let c = config(&[("url", "http://127.0.0.1:9093/hook")]).unwrap();
    assert_eq!(c.name, "pager");
    assert!(!c.append_only);
    assert_eq!(
        c.target,
        SinkTarget::Connector(Opener(Arc::new(WebhookConfig {
            url: "http://127.0.0.1:9093/hook".into(),
            retries: 5,
            backoff: Duration::from_millis(200),
            timeout: Duration::from_secs(10),
            headers: vec![],
        })))
    );
}

#[test]
fn all_options() {
    let c = config(&[
        ("url", " https://alerts.example.com "),
        ("retries", "0"),
        ("backoff", "1.5 seconds"),
        ("timeout", "2min"),
        ("append_only", "TRUE"),
        ("header_authorization", "Bearer xyz"),
        ("header_x_api_key", "k1"),
        ("header_content-type", "application/json; charset=utf-8"),
    ])
    .unwrap();
    assert!(c.append_only);
    let SinkTarget::Connector(open) = c.target else {
        panic!("not a webhook")
    };
    let w = settings(&open);
    assert_eq!(w.url, "https://alerts.example.com/");
    assert_eq!(w.retries, 0);
    assert_eq!(w.backoff, Duration::from_millis(1500));
    assert_eq!(w.timeout, Duration::from_secs(120));
    assert_eq!(
        w.headers,
        vec![
            ("authorization".to_string(), "Bearer xyz".to_string()),
            ("x-api-key".to_string(), "k1".to_string()),
            (
                "content-type".to_string(),
                "application/json; charset=utf-8".to_string()
            ),
        ]
    );
    // The connector name is matched case-insensitively, like the others.
    let c = SinkConfig::from_options(
        "p",
        &opts(&[("connector", " WebHook "), ("url", "http://h/")]),
        std::path::Path::new("."),
    )
    .unwrap();
    assert!(
        matches!(c.target, SinkTarget::Connector(ref o) if o.0.describe().starts_with("webhook"))
    );
}

#[test]
fn url_is_required_and_must_be_http() {
    let e = err(&[]);
    assert!(e.contains("sink pager") && e.contains("'url'"), "{e}");
    for bad in [
        "",
        "127.0.0.1:9093/hook",
        "/hook",
        "ftp://example.com/x",
        "file:///tmp/x",
        "http://",
        "http://exa mple.com/",
    ] {
        let e = err(&[("url", bad)]);
        assert!(
            e.starts_with(&format!("sink pager: bad value '{bad}' for option 'url'"))
                && e.contains("http:// or https://"),
            "{bad}: {e}"
        );
    }
    assert!(err(&[("url", "ftp://x/")]).contains("scheme 'ftp'"));
}

#[test]
fn numeric_options_are_checked() {
    let url = ("url", "http://h/");
    for bad in ["-1", "x", "1.5", "101", ""] {
        let e = err(&[url, ("retries", bad)]);
        assert!(
            e.contains(&format!("bad value '{bad}' for option 'retries'"))
                && e.contains("0 to 100"),
            "{e}"
        );
    }
    assert_eq!(webhook(&[url, ("retries", "100")]).retries, 100);
    for bad in [
        "0 ms",
        "0.4 ms",
        "-5 seconds",
        "200",
        "abc",
        "5 hours",
        "31 seconds",
        "1e3 ms",
        "",
    ] {
        let e = err(&[url, ("backoff", bad)]);
        assert!(
            e.contains(&format!("bad value '{bad}' for option 'backoff'"))
                && e.contains("to 30 seconds"),
            "{e}"
        );
    }
    assert_eq!(
        webhook(&[url, ("backoff", "30 seconds")]).backoff,
        MAX_BACKOFF
    );
    for bad in ["0 seconds", "10", "2 days", "1441 minutes"] {
        let e = err(&[url, ("timeout", bad)]);
        assert!(
            e.contains(&format!("bad value '{bad}' for option 'timeout'")),
            "{e}"
        );
    }
    let e = err(&[url, ("append_only", "maybe")]);
    assert!(
        e.contains("'append_only'") && e.contains("true, false"),
        "{e}"
    );
}

#[test]
fn other_keys_are_rejected_with_the_accepted_list() {
    let e = err(&[("url", "http://h/"), ("path", "x.csv")]);
    assert!(
        e.contains("unknown option 'path'")
            && e.contains("url, retries, backoff, timeout")
            && e.contains("header_<name>"),
        "{e}"
    );
    let e = err(&[("url", "http://h/"), ("format", "csv")]);
    assert!(e.contains("unknown option 'format'"), "{e}");
    let e = err(&[("url", "http://h/"), ("url", "http://i/")]);
    assert!(e.contains("more than once"), "{e}");
}

#[test]
fn headers_are_checked() {
    let url = ("url", "http://h/");
    let e = err(&[url, ("header_", "x")]);
    assert!(e.contains("'header_'") && e.contains("header name"), "{e}");
    let e = err(&[url, ("header_x(y)", "x")]);
    assert!(e.contains("not a valid header name"), "{e}");
    let e = err(&[url, ("header_host", "evil")]);
    assert!(e.contains("set by the sink"), "{e}");
    let e = err(&[url, ("header_content_length", "5")]);
    assert!(e.contains("set by the sink"), "{e}");
    let e = err(&[url, ("header_x", "secret\nb")]);
    assert!(
        e.starts_with("sink pager: option 'header_x': bad header value") && !e.contains("secret"),
        "{e}"
    );
    let e = err(&[url, ("header_x_a", "1"), ("header_x-a", "2")]);
    assert!(e.contains("'x-a' is given more than once"), "{e}");
}

#[test]
fn backoff_doubles_up_to_the_cap() {
    let first = Duration::from_millis(200);
    let waits: Vec<u128> = (1..=10)
        .map(|n| backoff_delay(first, n).as_millis())
        .collect();
    assert_eq!(
        waits,
        [200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]
    );
    assert_eq!(backoff_delay(first, 0), first);
    assert_eq!(backoff_delay(first, 1000), MAX_BACKOFF);
    assert_eq!(backoff_delay(MAX_BACKOFF, 2), MAX_BACKOFF);
    assert_eq!(
        backoff_delay(Duration::from_millis(1), 33),
        Duration::from_millis(1 << 31).min(MAX_BACKOFF)
    );
}

/// Runs `deliver` against scripted answers; returns the outcome, the
/// waits it asked for and how many answers were used.
fn scripted(retries: u32, answers: &[Attempt]) -> (Outcome, Vec<u128>, usize) {
    let mut next = answers.iter();
    let mut waits = Vec::new();
    let outcome = deliver(
        retries,
        Duration::from_millis(10),
        || next.next().expect("no more answers").clone(),
        |d| waits.push(d.as_millis()),
    );
    let used = answers.len() - next.len();
    (outcome, waits, used)
}

#[test]
fn retry_policy() {
    use Attempt::*;
    let t = |s: &str| Transient(s.to_string());
    // Delivered first time: no wait.
    let (o, waits, _) = scripted(5, &[Delivered]);
    assert_eq!((o.attempts, o.error, waits), (1, None, vec![]));
    // Two transient failures, then delivered, with doubling waits.
    let (o, waits, _) = scripted(5, &[t("503"), t("503"), Delivered]);
    assert_eq!((o.attempts, o.error, waits), (3, None, vec![10, 20]));
    // A permanent rejection is not retried.
    let (o, waits, used) = scripted(5, &[Permanent("400".into()), Delivered]);
    assert_eq!(
        (o.attempts, o.error, waits, used),
        (1, Some("400".into()), vec![], 1)
    );
    // Transient every time: given up after 1 + retries attempts, with
    // the last error.
    let answers: Vec<Attempt> = (0..10).map(|i| t(&format!("e{i}"))).collect();
    let (o, waits, used) = scripted(3, &answers);
    assert_eq!(
        (o.attempts, o.error, waits, used),
        (4, Some("e3".into()), vec![10, 20, 40], 4)
    );
    // No retries at all.
    let (o, waits, _) = scripted(0, &answers);
    assert_eq!((o.attempts, o.error, waits), (1, Some("e0".into()), vec![]));
}

#[test]
fn statuses() {
    for s in [200, 201, 202, 204, 299] {
        assert_eq!(classify_status(s, ""), Attempt::Delivered, "{s}");
    }
    for s in [429, 500, 502, 503, 504, 599] {
        assert!(
            matches!(classify_status(s, ""), Attempt::Transient(_)),
            "{s}"
        );
    }
    for s in [301, 302, 307, 400, 401, 403, 404, 408, 410, 413, 422, 100] {
        assert!(
            matches!(classify_status(s, ""), Attempt::Permanent(_)),
            "{s}"
        );
    }
    assert_eq!(
        classify_status(503, ""),
        Attempt::Transient("HTTP 503 Service Unavailable".into())
    );
    assert_eq!(
        classify_status(400, "missing field"),
        Attempt::Permanent("HTTP 400 Bad Request: missing field".into())
    );
}

fn batch() -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new("host", DataType::Utf8, true),
        Field::new("cpu", DataType::Float64, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(TimestampMillisecondArray::from(vec![Some(10_000), None])),
            Arc::new(StringArray::from(vec![Some("a"), None])),
            Arc::new(Float64Array::from(vec![Some(1.5), None])),
        ],
    )
    .unwrap()
}

#[test]
fn body_is_a_json_array_rendered_like_jsonl() {
    let body = write_json_rows::<JsonArray>(&batch(), Vec::new()).unwrap();
    assert_eq!(
        String::from_utf8(body).unwrap(),
        r#"[{"ts":"1970-01-01T00:00:10","host":"a","cpu":1.5},{"ts":null,"host":null,"cpu":null}]"#
    );
}

#[test]
fn connection_refused_is_given_up_after_every_attempt() {
    // A port that was just free: nothing listens there any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = WebhookConfig {
        url: format!("http://127.0.0.1:{port}/hook"),
        retries: 3,
        backoff: Duration::from_millis(20),
        timeout: Duration::from_secs(5),
        headers: vec![],
    };
    let mut sink = WebhookSink::open("pager", &config).unwrap();
    let started = Instant::now();
    sink.write(&batch()).unwrap();
    sink.write(&batch().slice(0, 0)).unwrap();
    sink.write(&batch().slice(0, 1)).unwrap();
    let stats = sink.close().unwrap().expect("first close");
    assert_eq!(
        stats,
        DeliveryStats {
            delivered: 0,
            failed: 2,
            retried: 6,
        }
    );
    // Each batch waited 20 + 40 + 80 ms between its attempts.
    assert!(started.elapsed() >= Duration::from_millis(280));
    assert_eq!(sink.close().unwrap(), None);
    sink.finish().unwrap();
    assert!(sink.write(&batch()).is_err());
}

#[test]
fn a_silent_endpoint_times_out_without_holding_up_write() {
    // Takes connections (the kernel's backlog does) but never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = WebhookConfig {
        url: format!("http://{}/hook", listener.local_addr().unwrap()),
        retries: 1,
        backoff: Duration::from_millis(1),
        timeout: Duration::from_millis(300),
        headers: vec![],
    };
    let mut sink = WebhookSink::open("pager", &config).unwrap();
    let started = Instant::now();
    sink.write(&batch()).unwrap();
    // write only queues: it returns long before the first timeout.
    assert!(started.elapsed() < Duration::from_millis(250));
    let stats = sink.close().unwrap().unwrap();
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!(
        stats,
        DeliveryStats {
            delivered: 0,
            failed: 1,
            retried: 1,
        }
    );
    let client = Client::new(&config);
    assert_eq!(
        client.post(b"[]", "k"),
        Attempt::Transient("no answer within 300ms".into())
    );
    drop(listener);
}

fn alert_rows(message: &str, at: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("alert", DataType::Utf8, false),
        Field::new("host", DataType::Utf8, true),
        Field::new("state", DataType::Utf8, false),
        Field::new(
            "event_time",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        ),
        Field::new("message", DataType::Utf8, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(vec!["hot"])),
            Arc::new(StringArray::from(vec![Some("a")])),
            Arc::new(StringArray::from(vec!["firing"])),
            Arc::new(TimestampMillisecondArray::from(vec![at])),
            Arc::new(StringArray::from(vec![message])),
        ],
    )
    .unwrap()
}

#[test]
fn idempotency_keys() {
    let key = |sink: &str, number: u64, batch: &RecordBatch| {
        let body = write_json_rows::<JsonArray>(batch, Vec::new()).unwrap();
        idempotency_key(sink, number, batch, &body).unwrap()
    };
    let first = key("pager", 1, &batch());
    assert_eq!(first.len(), 32);
    assert!(first.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(first, key("pager", 1, &batch()), "stable");
    assert_ne!(first, key("pager", 2, &batch()), "another batch number");
    assert_ne!(first, key("other", 1, &batch()), "another sink");
    assert_ne!(first, key("pager", 1, &batch().slice(0, 1)), "other rows");

    // An alert's change is keyed by what it is, wherever it is sent.
    let alert = key("pager", 1, &alert_rows("a at 91.5", 1000));
    assert_eq!(alert, key("other", 7, &alert_rows("a at 91.5", 1000)));
    assert_eq!(alert, key("pager", 1, &alert_rows("reworded", 1000)));
    assert_ne!(alert, key("pager", 1, &alert_rows("a at 91.5", 2000)));
    assert_eq!(alert_identity(&batch().schema()), None);
    assert_eq!(
        alert_identity(&alert_rows("", 0).schema()),
        Some(vec![0, 1, 2, 3])
    );
    // A LABELS column follows from the change too.
    let role = [(crate::plan::columns::ROLE.to_string(), "label".to_string())];
    let label = Field::new("label_team", DataType::Utf8, true).with_metadata(role.into());
    let mut fields = alert_rows("", 0).schema().fields().to_vec();
    fields.push(Arc::new(label));
    assert_eq!(alert_identity(&Schema::new(fields)), Some(vec![0, 1, 2, 3]));
}

/// Each request's idempotency key and body, in arrival order.
type Seen = Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// A local receiver recording each request's idempotency key and body.
fn receiver() -> (String, Seen, tokio::runtime::Runtime) {
    use axum::extract::State;
    use axum::http::HeaderMap;
    let received: Seen = Arc::default();
    let app = axum::Router::new()
        .route(
            "/hook",
            axum::routing::post(
                |State(seen): State<Seen>, headers: HeaderMap, body: String| async move {
                    let key = headers
                        .get("idempotency-key")
                        .map(|k| k.to_str().unwrap().to_string())
                        .unwrap_or_default();
                    seen.lock().unwrap().push((key, body));
                },
            ),
        )
        .with_state(received.clone());
    let (addrs, runtime) = crate::connectors::test_server::serve(vec![app]);
    (format!("http://{}/hook", addrs[0]), received, runtime)
}

#[test]
fn a_restore_sends_the_batches_after_the_checkpoint_with_their_keys() {
    let (url, received, _runtime) = receiver();
    let config = WebhookConfig {
        url,
        retries: 0,
        backoff: Duration::from_millis(1),
        timeout: Duration::from_secs(5),
        headers: vec![],
    };
    let rows = [
        batch().slice(0, 1),
        batch().slice(1, 1),
        batch().slice(0, 1),
    ];
    let mut sink = WebhookSink::open("pager", &config).unwrap();
    sink.write(&rows[0]).unwrap();
    let commit = sink.checkpoint().unwrap().unwrap();
    // Delivered before the checkpoint returned.
    assert_eq!(received.lock().unwrap().len(), 1);
    assert_eq!(commit, serde_json::json!({"batches": 1}));
    sink.write(&rows[1]).unwrap();
    sink.write(&rows[2]).unwrap();
    sink.close().unwrap();

    let mut sink = WebhookSink::open("pager", &config).unwrap();
    sink.restore(&commit).unwrap();
    sink.write(&rows[1]).unwrap();
    sink.write(&rows[2]).unwrap();
    sink.close().unwrap();
    let received = received.lock().unwrap().clone();
    let keys: Vec<&str> = received.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys.len(), 5);
    assert_eq!(keys[1..3], keys[3..5], "sent again with the same keys");
    // Rows 0 and 2 are equal, yet their batches are not the same delivery.
    assert_eq!(received[0].1, received[2].1);
    assert_ne!(keys[0], keys[2]);
    assert_ne!(keys[0], keys[1]);
    let err = sink
        .restore(&serde_json::json!({}))
        .unwrap_err()
        .to_string();
    assert!(err.contains("has no batch count"), "{err}");
}
