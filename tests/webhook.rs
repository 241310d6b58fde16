//! The webhook sink end to end: a local HTTP server (axum on 127.0.0.1, a
//! free port) receives what the real `vigil` binary POSTs, and answers with
//! scripted statuses to drive retries and give-ups.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde_json::{Value, json};

/// One request the server received, and what it answered.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    content_type: Option<String>,
    authorization: Option<String>,
    idempotency_key: Option<String>,
    body: String,
    answered: u16,
}

#[derive(Clone)]
struct Script {
    /// Statuses for the first requests, in order; 200 after them.
    statuses: Arc<Vec<u16>>,
    received: Arc<Mutex<Vec<Received>>>,
}

/// A webhook receiver running on its own runtime until dropped.
struct Receiver {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    _runtime: tokio::runtime::Runtime,
}

impl Receiver {
    fn start(statuses: &[u16]) -> Receiver {
        let script = Script {
            statuses: Arc::new(statuses.to_vec()),
            received: Arc::default(),
        };
        let received = script.received.clone();
        let app = Router::new()
            .route("/{*path}", post(hook))
            .with_state(script);
        let (addr, runtime) = serve_locally(app);
        Receiver {
            addr,
            received,
            _runtime: runtime,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// Serves `app` on 127.0.0.1 at a free port, on a runtime of its own that
/// stops when dropped; returns the address and the runtime.
pub(crate) fn serve_locally(app: Router) -> (SocketAddr, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("address");
    runtime.spawn(async move { axum::serve(listener, app).await });
    (addr, runtime)
}

async fn hook(
    State(script): State<Script>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let mut received = script.received.lock().unwrap();
    let status = script.statuses.get(received.len()).copied().unwrap_or(200);
    let header = |name: &str| {
        headers
            .get(name)
            .map(|v| v.to_str().unwrap_or("(not text)").to_string())
    };
    received.push(Received {
        path: uri.path().to_string(),
        content_type: header("content-type"),
        authorization: header("authorization"),
        idempotency_key: header("idempotency-key"),
        body: String::from_utf8_lossy(&body).into_owned(),
        answered: status,
    });
    StatusCode::from_u16(status).expect("a status")
}

const ROWS: &str = "ts,host,cpu\n\
1000,a,91.5\n\
2000,b,20\n\
3000,,95\n\
4000,c,\n\
5000,a,99\n\
6000,b,92.25\n";

/// Writes the script and the CSV into a temp dir and runs `vigil run` there.
fn run(sql: &str) -> (tempfile::TempDir, Output) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("m.csv"), ROWS).expect("write csv");
    std::fs::write(dir.path().join("q.sql"), sql).expect("write sql");
    let out = vigil(dir.path());
    (dir, out)
}

fn vigil(dir: &Path) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vigil"));
    command
        .args(["run", "q.sql", "--format", "csv"])
        .current_dir(dir);
    // Requests to the local receiver must not go through a proxy.
    for var in ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"] {
        command.env_remove(var);
    }
    crate::support::run_within(&mut command, Duration::from_secs(120), "vigil run")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn stream(batch_size: usize) -> String {
    format!(
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE, \
         WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) \
         WITH (path = 'm.csv', batch_size = '{batch_size}');"
    )
}

/// The rows of every request the server accepted, in arrival order.
fn delivered_rows(received: &[Received]) -> Vec<Value> {
    received
        .iter()
        .filter(|r| r.answered == 200)
        .flat_map(|r| {
            let body: Value = serde_json::from_str(&r.body).expect("a JSON body");
            let Value::Array(rows) = body else {
                panic!("body is not a JSON array: {}", r.body)
            };
            assert!(!rows.is_empty(), "an empty batch was posted");
            rows
        })
        .collect()
}

fn hot_rows() -> Vec<Value> {
    vec![
        json!({"ts": "1970-01-01T00:00:01", "host": "a", "cpu": 91.5}),
        json!({"ts": "1970-01-01T00:00:03", "host": null, "cpu": 95.0}),
        json!({"ts": "1970-01-01T00:00:05", "host": "a", "cpu": 99.0}),
        json!({"ts": "1970-01-01T00:00:06", "host": "b", "cpu": 92.25}),
    ]
}

#[test]
fn posts_every_batch_as_a_json_array_in_order() {
    let server = Receiver::start(&[]);
    // Batches of two rows: the rows arrive over several requests.
    let sql = format!(
        "{}\nCREATE SINK pager WITH (connector = 'webhook', url = '{}', \
         header_authorization = 'Bearer xyz');\n\
         INSERT INTO pager SELECT ts, host, cpu FROM m WHERE cpu > 90;",
        stream(2),
        server.url()
    );
    let (_dir, out) = run(&sql);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let received = server.received();
    assert!(
        received.len() >= 2,
        "expected several requests: {received:?}"
    );
    for r in &received {
        assert_eq!(r.path, "/hook");
        assert_eq!(r.content_type.as_deref(), Some("application/json"));
        assert_eq!(r.authorization.as_deref(), Some("Bearer xyz"));
        assert_eq!(r.answered, 200);
    }
    assert_eq!(delivered_rows(&received), hot_rows());
    assert!(
        stderr.contains(&format!(
            "vigil: sink pager: delivered={} failed=0 retried=0",
            received.len()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("vigil: query 1: out=4 late=0"), "{stderr}");
}

#[test]
fn window_results_keep_their_timestamps_and_nulls() {
    let server = Receiver::start(&[]);
    let sql = format!(
        "{}\nCREATE SINK pager WITH (connector = 'webhook', url = '{}');\n\
         INSERT INTO pager SELECT window_start, window_end, host, max(cpu) AS max_cpu \
         FROM TUMBLE(m, ts, INTERVAL '3' SECOND) GROUP BY window_start, window_end, host;",
        stream(8192),
        server.url()
    );
    let (_dir, out) = run(&sql);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut rows = delivered_rows(&server.received());
    let key = |v: &Value| format!("{}{}", v["window_start"], v["host"]);
    rows.sort_by_key(key);
    assert_eq!(
        rows,
        vec![
            json!({"window_start": "1970-01-01T00:00:00", "window_end": "1970-01-01T00:00:03",
                   "host": "a", "max_cpu": 91.5}),
            json!({"window_start": "1970-01-01T00:00:00", "window_end": "1970-01-01T00:00:03",
                   "host": "b", "max_cpu": 20.0}),
            json!({"window_start": "1970-01-01T00:00:03", "window_end": "1970-01-01T00:00:06",
                   "host": "a", "max_cpu": 99.0}),
            json!({"window_start": "1970-01-01T00:00:03", "window_end": "1970-01-01T00:00:06",
                   "host": "c", "max_cpu": null}),
            json!({"window_start": "1970-01-01T00:00:03", "window_end": "1970-01-01T00:00:06",
                   "host": null, "max_cpu": 95.0}),
            json!({"window_start": "1970-01-01T00:00:06", "window_end": "1970-01-01T00:00:09",
                   "host": "b", "max_cpu": 92.25}),
        ]
    );
}

#[test]
fn server_errors_are_retried_and_rows_arrive_once() {
    let server = Receiver::start(&[503, 503]);
    let sql = format!(
        "{}\nCREATE SINK pager WITH (connector = 'webhook', url = '{}', \
         retries = '3', backoff = '10 milliseconds');\n\
         INSERT INTO pager SELECT ts, host, cpu FROM m WHERE cpu > 90;",
        stream(8192),
        server.url()
    );
    let (_dir, out) = run(&sql);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let received = server.received();
    let answered: Vec<u16> = received.iter().map(|r| r.answered).collect();
    assert_eq!(answered, [503, 503, 200], "{received:?}");
    // The same batch each time.
    assert!(received.iter().all(|r| r.body == received[0].body));
    assert_eq!(delivered_rows(&received), hot_rows());
    assert!(
        stderr.contains("vigil: sink pager: delivered=1 failed=0 retried=2"),
        "{stderr}"
    );
    assert!(!stderr.contains("gave up"), "{stderr}");
}

#[test]
fn a_client_error_is_not_retried_and_the_run_goes_on() {
    let server = Receiver::start(&[400]);
    let sql = format!(
        "{}\nCREATE SINK pager WITH (connector = 'webhook', url = '{}', \
         retries = '5', backoff = '10 milliseconds');\n\
         INSERT INTO pager SELECT ts, host, cpu FROM m WHERE cpu > 90;\n\
         SELECT host, cpu FROM m WHERE cpu < 50;",
        stream(8192),
        server.url()
    );
    let (_dir, out) = run(&sql);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let received = server.received();
    assert_eq!(received.len(), 1, "retried a 400: {received:?}");
    assert!(
        stderr.contains(
            "vigil: sink pager: gave up on a batch of 4 rows after 1 attempt: HTTP 400 Bad Request"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("vigil: sink pager: delivered=0 failed=1 retried=0"),
        "{stderr}"
    );
    // The other query's output is intact.
    assert_eq!(text(&out.stdout), "host,cpu\nb,20.0\n");
    assert!(stderr.contains("vigil: query 2: out=1 late=0"), "{stderr}");
}

#[test]
fn an_unreachable_endpoint_is_given_up_after_the_configured_attempts() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("address")
        .port();
    let sql = format!(
        "{}\nCREATE SINK pager WITH (connector = 'webhook', \
         url = 'http://127.0.0.1:{port}/hook', retries = '2', backoff = '5 ms');\n\
         INSERT INTO pager SELECT ts, host, cpu FROM m WHERE cpu > 90;",
        stream(8192)
    );
    let (_dir, out) = run(&sql);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("vigil: sink pager: gave up on a batch of 4 rows after 3 attempts: "),
        "{stderr}"
    );
    assert!(
        stderr.contains("vigil: sink pager: delivered=0 failed=1 retried=2"),
        "{stderr}"
    );
}

#[test]
fn bad_options_fail_when_the_sink_is_created() {
    for (options, expected) in [
        (
            "url = 'ftp://example.com/x'",
            "bad value 'ftp://example.com/x' for option 'url'",
        ),
        (
            "url = 'http://h/', backoff = 'soon'",
            "bad value 'soon' for option 'backoff'",
        ),
        (
            "url = 'http://h/', retries = '-1'",
            "bad value '-1' for option 'retries'",
        ),
        ("path = 'x.csv'", "unknown option 'path'"),
        ("retries = '2'", "connector 'webhook' needs a 'url' option"),
    ] {
        let sql = format!(
            "{}\nCREATE SINK pager WITH (connector = 'webhook', {options});\n\
             INSERT INTO pager SELECT ts FROM m;",
            stream(8192)
        );
        let (_dir, out) = run(&sql);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{options}: {stderr}");
        assert!(
            stderr.contains("sink pager: ") && stderr.contains(expected),
            "{options}: {stderr}"
        );
    }
}

#[test]
fn alert_state_changes_are_delivered_to_a_webhook() {
    let server = Receiver::start(&[]);
    // Per host, in event time: a fires at 1 s (99 at 5 s is a repeat, not
    // sent); b fires at 6 s; the row without a host is its own key (NULL)
    // and fires at 3 s; c's NULL cpu is not above 90.
    let sql = format!(
        "{}\nCREATE SINK pager WITH (connector = 'webhook', url = '{}');\n\
         CREATE ALERT hot AS SELECT ts, host, cpu FROM m \
         ALERT BY host WHEN cpu > 90 SEVERITY 'page' MESSAGE '{{host}} at {{cpu}}';\n\
         INSERT INTO pager SELECT alert, host, state, event_time, severity, message FROM hot;",
        stream(8192),
        server.url()
    );
    let (_dir, out) = run(&sql);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty(), "the routed alert prints nothing");
    let mut rows = delivered_rows(&server.received());
    rows.sort_by_key(|v| v["event_time"].to_string());
    let alert = |host: Value, at: &str, message: &str| {
        json!({"alert": "hot", "host": host, "state": "firing", "event_time": at,
               "severity": "page", "message": message})
    };
    assert_eq!(
        rows,
        vec![
            alert(json!("a"), "1970-01-01T00:00:01", "a at 91.5"),
            alert(Value::Null, "1970-01-01T00:00:03", "NULL at 95.0"),
            alert(json!("b"), "1970-01-01T00:00:06", "b at 92.25"),
        ]
    );
}

#[test]
fn every_post_carries_an_idempotency_key_stable_for_the_same_rows() {
    // One alert change per request: batches of one row.
    let script = |url: &str| {
        format!(
            "{}\nCREATE SINK pager WITH (connector = 'webhook', url = '{url}');\n\
             CREATE ALERT hot AS SELECT ts, host, cpu FROM m \
             ALERT BY host WHEN cpu > 90 MESSAGE '{{host}} at {{cpu}}';\n\
             INSERT INTO pager SELECT alert, host, state, event_time, message FROM hot;",
            stream(1)
        )
    };
    let keyed = |received: Vec<Received>| -> Vec<(String, String)> {
        let mut keyed: Vec<(String, String)> = received
            .into_iter()
            .map(|r| {
                let key = r.idempotency_key.expect("an Idempotency-Key header");
                assert!(
                    key.len() == 32 && key.chars().all(|c| c.is_ascii_hexdigit()),
                    "{key}"
                );
                (r.body, key)
            })
            .collect();
        keyed.sort();
        keyed
    };
    let first = Receiver::start(&[]);
    let (_dir, out) = run(&script(&first.url()));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let first = keyed(first.received());
    assert_eq!(first.len(), 3, "{first:?}");
    let mut keys: Vec<&String> = first.iter().map(|(_, k)| k).collect();
    keys.dedup();
    assert_eq!(keys.len(), 3, "different rows, different keys: {first:?}");

    // Computed again (another run, another receiver): the same keys.
    let second = Receiver::start(&[]);
    let (_dir, out) = run(&script(&second.url()));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(keyed(second.received()), first);

    // A plain query's batches are keyed too, and a retried batch keeps its key.
    let server = Receiver::start(&[503]);
    let sql = format!(
        "{}\nCREATE SINK pager WITH (connector = 'webhook', url = '{}', \
         backoff = '10 milliseconds');\n\
         INSERT INTO pager SELECT ts, host, cpu FROM m WHERE cpu > 90;",
        stream(2),
        server.url()
    );
    let (_dir, out) = run(&sql);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let received = server.received();
    let keys: Vec<String> = received
        .iter()
        .map(|r| r.idempotency_key.clone().expect("a key"))
        .collect();
    assert_eq!(keys[0], keys[1], "the retry: {received:?}");
    let mut distinct = keys[1..].to_vec();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), keys.len() - 1, "{received:?}");
}
