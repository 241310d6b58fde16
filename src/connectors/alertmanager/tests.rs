use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Float64Array, StringArray, TimestampMillisecondArray};
use datafusion::arrow::datatypes::Field;
use serde_json::{Value, json};

use super::*;

#[test]
fn a_labels_map_key_spreads_into_labels() {
    let key = |f: Field| {
        f.with_metadata(std::collections::HashMap::from([(
            columns::ROLE.to_string(),
            Role::Key.as_str().to_string(),
        )]))
    };
    let time = |name: &str| {
        Field::new(
            name,
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        )
    };
    let mut labels = crate::types::LabelsBuilder::default();
    labels.append([("mountpoint", "/"), ("device", "sda1")]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("alert", DataType::Utf8, false),
        key(Field::new("instance", DataType::Utf8, true)),
        key(Field::new("labels", crate::types::labels_type(), true)),
        Field::new("state", DataType::Utf8, false),
        time("event_time"),
        time("since"),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(vec!["DiskFull"])),
            Arc::new(StringArray::from(vec!["n:9100"])),
            Arc::new(labels.finish()),
            Arc::new(StringArray::from(vec!["firing"])),
            Arc::new(TimestampMillisecondArray::from(vec![2_000])),
            Arc::new(TimestampMillisecondArray::from(vec![1_000])),
        ],
    )
    .unwrap();
    let layout = Layout::of("am", &schema).unwrap();
    let alerts = alerts_of(&layout, &batch, None).unwrap();
    let labels: Vec<(&str, &str)> = alerts[0]
        .labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        labels,
        [
            ("alertname", "DiskFull"),
            ("device", "sda1"),
            ("instance", "n:9100"),
            ("mountpoint", "/")
        ]
    );
}

#[test]
fn rows_without_the_alert_columns_are_refused() {
    let schema = Schema::new(vec![Field::new("host", DataType::Utf8, true)]);
    let e = Layout::of("am", &schema).unwrap_err().to_string();
    assert!(
        e.contains("sink am") && e.contains("got columns host"),
        "{e}"
    );
}

fn alert_rows(states: &[&str], hosts: &[Option<&str>], labels: &[Option<&str>]) -> RecordBatch {
    let n = states.len();
    let role = |f: Field, role: Role, name: Option<&str>| {
        let mut m = std::collections::HashMap::from([(
            columns::ROLE.to_string(),
            role.as_str().to_string(),
        )]);
        m.extend(name.map(|n| (columns::NAME.to_string(), n.to_string())));
        f.with_metadata(m)
    };
    let time = |name: &str| {
        Field::new(
            name,
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        )
    };
    let schema = Schema::new(vec![
        Field::new("alert", DataType::Utf8, false),
        role(Field::new("host", DataType::Utf8, true), Role::Key, None),
        Field::new("state", DataType::Utf8, false),
        time("event_time"),
        time("since"),
        role(
            Field::new("cpu", DataType::Float64, true),
            Role::Value,
            None,
        ),
        Field::new("severity", DataType::Utf8, true),
        Field::new("message", DataType::Utf8, true),
        role(
            Field::new("label_team", DataType::Utf8, true),
            Role::Label,
            Some("team"),
        ),
        role(
            Field::new("annotation_summary", DataType::Utf8, true),
            Role::Annotation,
            Some("summary"),
        ),
    ]);
    RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(StringArray::from(vec!["hot"; n])),
            Arc::new(StringArray::from(hosts.to_vec())),
            Arc::new(StringArray::from(states.to_vec())),
            Arc::new(TimestampMillisecondArray::from(vec![1_715_000_000_000; n])),
            Arc::new(TimestampMillisecondArray::from(vec![1_714_999_990_000; n])),
            Arc::new(Float64Array::from(vec![97.0; n])),
            Arc::new(StringArray::from(vec![Some("page"); n])),
            Arc::new(StringArray::from(vec![Some("cpu 97"); n])),
            Arc::new(StringArray::from(labels.to_vec())),
            Arc::new(StringArray::from_iter(
                (0..n).map(|i| (i == 0).then_some("hot a")),
            )),
        ],
    )
    .unwrap()
}

#[test]
fn rows_become_alerts_with_labels_and_annotations() {
    let batch = alert_rows(
        &["firing", "pending", "resolved"],
        &[Some("a"), Some("b"), None],
        &[Some("infra"), Some("x"), Some("")],
    );
    let layout = Layout::of("am", &batch.schema()).unwrap();
    let url = MessageTemplate::parse("http://g/{host}").unwrap();
    let alerts = alerts_of(&layout, &batch, Some(&url)).unwrap();
    assert_eq!(alerts.len(), 2, "the pending row is not sent");
    let map = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        alerts[0].labels,
        map(&[
            ("alertname", "hot"),
            ("host", "a"),
            ("severity", "page"),
            ("team", "infra")
        ])
    );
    assert_eq!(
        alerts[0].annotations,
        map(&[("summary", "hot a")]),
        "ANNOTATIONS win over the message"
    );
    assert!(alerts[1].annotations.is_empty(), "NULL or empty: left out");
    assert_eq!(alerts[0].ends_at, None);
    assert_eq!(alerts[0].generator_url.as_deref(), Some("http://g/a"));
    // NULL key and empty label are left out; resolved at event time.
    assert_eq!(
        alerts[1].labels,
        map(&[("alertname", "hot"), ("severity", "page")])
    );
    assert_eq!(alerts[1].ends_at, Some(1_715_000_000_000));
    assert_eq!(alerts[1].starts_at, 1_714_999_990_000);
    assert_ne!(alerts[0].identity, alerts[1].identity);

    let e = alerts_of(&layout, &alert_rows(&["odd"], &[None], &[None]), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("state 'odd'"), "{e}");
}

#[test]
fn payload_is_what_prometheus_sends() {
    let firing = AmAlert {
        identity: "x".into(),
        labels: BTreeMap::from([("alertname".into(), "hot".into())]),
        annotations: BTreeMap::from([("summary".into(), "cpu 97".into())]),
        starts_at: 1_715_000_000_000,
        ends_at: None,
        generator_url: Some("http://g/a".into()),
    };
    let resolved = AmAlert {
        ends_at: Some(1_715_000_060_500),
        generator_url: None,
        ..firing.clone()
    };
    let now = 1_715_000_100_000;
    let body = payload(&[firing, resolved], now, Duration::from_secs(60));
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body,
        json!([
            {"labels": {"alertname": "hot"}, "annotations": {"summary": "cpu 97"},
             "startsAt": "2024-05-06T12:53:20.000Z", "endsAt": "2024-05-06T12:59:00.000Z",
             "generatorURL": "http://g/a"},
            {"labels": {"alertname": "hot"}, "annotations": {"summary": "cpu 97"},
             "startsAt": "2024-05-06T12:53:20.000Z", "endsAt": "2024-05-06T12:54:20.500Z"}
        ])
    );
}

#[test]
fn alerts_url_appends_the_api_path_once() {
    let url = |u: &str| alerts_url(u).unwrap();
    assert_eq!(
        url("http://127.0.0.1:9093"),
        "http://127.0.0.1:9093/api/v2/alerts"
    );
    assert_eq!(url("http://h:9093/"), "http://h:9093/api/v2/alerts");
    assert_eq!(url("https://h/am/"), "https://h/am/api/v2/alerts");
    assert_eq!(url("http://h/api/v2/alerts"), "http://h/api/v2/alerts");
}

fn alert(id: &str, ends_at: Option<i64>) -> AmAlert {
    AmAlert {
        identity: id.into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        starts_at: 0,
        ends_at,
        generator_url: None,
    }
}

#[test]
fn firing_alerts_are_resent_each_interval_until_resolved() {
    let start = Instant::now();
    let at = |s: u64| start + Duration::from_secs(s);
    let ids =
        |alerts: Vec<AmAlert>| -> Vec<String> { alerts.into_iter().map(|a| a.identity).collect() };
    let mut resends = Resends::new(Duration::from_secs(60));
    assert_eq!(resends.next_due(), None, "nothing firing");
    resends.update(&[alert("a", None)], at(0));
    resends.update(&[alert("b", None)], at(30));
    assert_eq!(resends.next_due(), Some(at(60)));
    assert!(resends.due(at(59)).is_empty());
    assert_eq!(ids(resends.due(at(60))), ["a"]);
    assert_eq!(resends.next_due(), Some(at(90)));
    assert_eq!(ids(resends.due(at(95))), ["b"]);
    // A firing row again (a restore) restarts its clock.
    resends.update(&[alert("a", None)], at(100));
    assert_eq!(resends.next_due(), Some(at(155)));
    resends.update(&[alert("b", Some(5))], at(110));
    assert_eq!(resends.next_due(), Some(at(160)));
    assert_eq!(ids(resends.due(at(200))), ["a"]);
    resends.update(&[alert("a", Some(7))], at(201));
    assert_eq!(resends.next_due(), None);
}

/// Bodies Alertmanager would have received, as JSON.
type Seen = Arc<Mutex<Vec<Value>>>;

fn receiver() -> (String, Seen, tokio::runtime::Runtime) {
    use axum::extract::State;
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route(
            ALERTS_PATH,
            axum::routing::post(|State(seen): State<Seen>, body: String| async move {
                seen.lock()
                    .unwrap()
                    .push(serde_json::from_str(&body).unwrap());
            }),
        )
        .with_state(seen.clone());
    let (addrs, runtime) = crate::connectors::test_server::serve(vec![app]);
    (format!("http://{}", addrs[0]), seen, runtime)
}

fn config(url: &str, resend: Duration) -> AlertmanagerConfig {
    AlertmanagerConfig {
        delivery: WebhookConfig {
            url: alerts_url(url).unwrap(),
            retries: 0,
            backoff: Duration::from_millis(1),
            timeout: Duration::from_secs(5),
            headers: vec![],
        },
        resend,
        generator_url: None,
    }
}

fn wait_for(seen: &Seen, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.lock().unwrap().len() < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    seen.lock().unwrap().clone()
}

#[test]
fn the_sink_resends_while_firing_and_a_restore_sends_again() {
    let (url, seen, _runtime) = receiver();
    let resend = Duration::from_millis(150);
    let config = config(&url, resend);
    let rows = alert_rows(&["firing"], &[Some("a")], &[Some("infra")]);
    let mut sink = AlertmanagerSink::open("am", &config, &rows.schema()).unwrap();
    let before = wall_clock_ms();
    sink.write(&rows).unwrap();
    let bodies = wait_for(&seen, 3);
    assert!(bodies.len() >= 3, "sent, then resent: {bodies:?}");
    assert!(
        bodies
            .iter()
            .all(|b| b == &bodies[0] || b[0]["labels"] == bodies[0][0]["labels"])
    );
    let ends = chrono::DateTime::parse_from_rfc3339(bodies[2][0]["endsAt"].as_str().unwrap())
        .unwrap()
        .timestamp_millis();
    assert!(
        ends >= before + 4 * 150,
        "endsAt is 4 resends ahead of the send"
    );
    let commit = sink.checkpoint().unwrap().unwrap();
    assert_eq!(commit["firing"].as_array().unwrap().len(), 1);

    // A resolved row whose label template changed still resolves the
    // alert that fired: it is sent with the labels it fired with.
    let resolved = alert_rows(&["resolved"], &[Some("a")], &[Some("other")]);
    sink.write(&resolved).unwrap();
    sink.close().unwrap();
    let count = seen.lock().unwrap().len();
    let last = seen.lock().unwrap()[count - 1].clone();
    assert_eq!(last[0]["labels"]["team"], "infra");
    assert_eq!(last[0]["endsAt"], "2024-05-06T12:53:20.000Z");
    std::thread::sleep(resend * 3);
    assert_eq!(seen.lock().unwrap().len(), count, "no resend once resolved");
    assert!(sink.checkpoint().is_err(), "closed");

    let mut restored = AlertmanagerSink::open("am", &config, &rows.schema()).unwrap();
    restored.restore(&commit).unwrap();
    let bodies = wait_for(&seen, count + 1);
    assert_eq!(
        bodies[count][0]["labels"]["host"], "a",
        "sent again at once"
    );
    restored.finish().unwrap();
    let e = restored.restore(&json!({})).unwrap_err().to_string();
    assert!(e.contains("no firing alerts"), "{e}");
}

fn configure(kv: &[(&str, &str)]) -> Result<SinkConfig> {
    let mut options = vec![("connector".to_string(), "alertmanager".to_string())];
    options.extend(kv.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    SinkConfig::from_options("am", &options, Path::new("."))
}

fn settings(kv: &[(&str, &str)]) -> AlertmanagerConfig {
    let SinkTarget::Connector(open) = configure(kv).unwrap().target else {
        panic!("not a connector sink")
    };
    let any: &dyn std::any::Any = open.0.as_ref();
    any.downcast_ref::<AlertmanagerConfig>().unwrap().clone()
}

#[test]
fn options_and_their_errors() {
    let c = settings(&[("url", "http://127.0.0.1:9093")]);
    assert_eq!(c.delivery.url, "http://127.0.0.1:9093/api/v2/alerts");
    assert_eq!(c.resend, DEFAULT_RESEND);
    assert_eq!(c.delivery.retries, http::DEFAULT_RETRIES);
    assert_eq!(c.generator_url, None);
    assert_eq!(c.describe(), "alertmanager http://127.0.0.1:9093");
    let c = settings(&[
        ("url", "https://am.example/prefix/"),
        ("resend", "30 seconds"),
        ("generator_url", "http://g/{host}"),
        ("retries", "2"),
        ("header_authorization", "Bearer x"),
    ]);
    assert_eq!(c.delivery.url, "https://am.example/prefix/api/v2/alerts");
    assert_eq!(c.resend, Duration::from_secs(30));
    assert_eq!(c.generator_url.as_deref(), Some("http://g/{host}"));
    assert_eq!(c.delivery.retries, 2);
    assert_eq!(
        c.delivery.headers,
        [("authorization".to_string(), "Bearer x".to_string())]
    );
    let err = |kv: &[(&str, &str)]| configure(kv).unwrap_err().to_string();
    let e = err(&[]);
    assert!(e.contains("needs a 'url' option"), "{e}");
    let e = err(&[("url", "ftp://h")]);
    assert!(e.contains("bad value 'ftp://h' for option 'url'"), "{e}");
    let e = err(&[("url", "http://h"), ("resend", "500 ms")]);
    assert!(
        e.contains("option 'resend'") && e.contains("1 second"),
        "{e}"
    );
    let e = err(&[("url", "http://h"), ("generator_url", "http://g/{host")]);
    assert!(
        e.contains("generator_url") && e.contains("without its '}'"),
        "{e}"
    );
    let e = err(&[("url", "http://h"), ("path", "x")]);
    assert!(e.contains("unknown option 'path'"), "{e}");
}

#[test]
fn a_generator_url_must_read_columns_the_rows_have() {
    let rows = alert_rows(&["firing"], &[Some("a")], &[None]);
    let mut config = config("http://127.0.0.1:1", DEFAULT_RESEND);
    config.generator_url = Some("http://g/{hostname}".into());
    let e = AlertmanagerSink::open("am", &config, &rows.schema())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("generator_url reads '{hostname}'"), "{e}");
}
