//! `vigil serve` end to end: the real binary on a free port, driven by a
//! real HTTP client (ureq, blocking; event streams are read on threads).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::support::{self, Guarded};

/// Generous: the machine is shared and slow.
const WAIT: Duration = Duration::from_secs(60);
pub(crate) const TOKEN: &str = "secret";

/// A `vigil serve` process, killed when dropped.
pub(crate) struct Server {
    child: Guarded,
    base: String,
    stderr: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `vigil serve ARGS` in `dir` and waits for its address.
    pub(crate) fn start(dir: &Path, args: &[&str]) -> Server {
        Server::start_with(dir, args, &[])
    }

    /// Like [`Server::start`], with environment variables `env` set.
    fn start_with(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_vigil"));
        command
            .arg("serve")
            .args(args)
            .current_dir(dir)
            .env_remove("VIGIL_TOKEN")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = support::spawn(&mut command, "vigil serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let pipe = child.stderr.take().expect("stderr");
        let log = stderr.clone();
        // Keeps reading stderr so the server never blocks on it.
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.strip_prefix("vigil: listening on ") {
                    let _ = tx.send(addr.to_string());
                }
                let mut log = log.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let base = match rx.recv_timeout(WAIT) {
            Ok(base) => base,
            Err(_) => {
                child.kill_group();
                panic!(
                    "vigil serve did not print its address; stderr:\n{}",
                    stderr.lock().unwrap()
                );
            }
        };
        assert!(base.starts_with("http://127.0.0.1:"), "{base}");
        assert!(!base.ends_with(":0"), "the real port is printed: {base}");
        Server {
            child,
            base,
            stderr,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends SIGTERM and waits for the exit.
    fn terminate(&mut self) -> ExitStatus {
        self.child.signal(libc::SIGTERM);
        self.child.wait_within(WAIT)
    }

    /// Kills the server with SIGKILL, as a crash would.
    fn kill9(&mut self) {
        self.child.kill_group();
    }
}

pub(crate) fn agent(timeout: Option<Duration>) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(timeout)
        .build()
        .new_agent()
}

/// An answer: status, content type, body.
pub(crate) struct Answer {
    pub(crate) status: u16,
    content_type: String,
    pub(crate) body: String,
}

impl Answer {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    fn error(&self) -> String {
        self.json()["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error message: {}", self.body))
            .to_string()
    }
}

fn answer(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Answer {
    let mut response = response.expect("the server answers");
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    Answer {
        status: status_code(&response),
        content_type,
        body: response.body_mut().read_to_string().expect("a text body"),
    }
}

pub(crate) fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn get(server: &Server, path: &str, token: Option<&str>) -> Answer {
    let mut request = agent(Some(WAIT)).get(server.url(path));
    if let Some(token) = token {
        request = request.header("authorization", bearer(token));
    }
    answer(request.call())
}

fn delete(server: &Server, path: &str) -> Answer {
    answer(
        agent(Some(WAIT))
            .delete(server.url(path))
            .header("authorization", bearer(TOKEN))
            .call(),
    )
}

pub(crate) fn post(server: &Server, path: &str, content_type: Option<&str>, body: &str) -> Answer {
    let mut request = agent(Some(WAIT))
        .post(server.url(path))
        .header("authorization", bearer(TOKEN));
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    answer(request.send(body))
}

pub(crate) fn statements(server: &Server, sql: &str) -> Answer {
    post(server, "/statements", None, sql)
}

/// One Server-Sent Event: its name (empty for none) and data.
pub(crate) type SseEvent = (String, String);

/// Opens an event stream; its events arrive on the receiver, which
/// disconnects when the stream ends.
pub(crate) fn follow(server: &Server, path: &str) -> Receiver<SseEvent> {
    read_events(subscribe(server, path))
}

/// The status code of `response`.
pub(crate) fn status_code(response: &ureq::http::Response<ureq::Body>) -> u16 {
    ureq::http::Response::status(response).as_u16()
}

/// How long an event stream may stay open: longer than any test.
const STREAM_FOR: Duration = Duration::from_secs(1800);

/// Opens an event stream without reading it. The answer's headers come
/// within [`WAIT`]; its body, open as long as the stream is, within
/// [`STREAM_FOR`] (the readers of its events wait at most [`WAIT`] each).
fn subscribe(server: &Server, path: &str) -> ureq::http::Response<ureq::Body> {
    let response = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(WAIT))
        .timeout_send_request(Some(WAIT))
        .timeout_recv_response(Some(WAIT))
        .timeout_recv_body(Some(STREAM_FOR))
        .build()
        .new_agent()
        .get(server.url(path))
        .header("authorization", bearer(TOKEN))
        .call()
        .expect("the server answers");
    assert_eq!(status_code(&response), 200, "GET {path}");
    let content_type = response.headers().get("content-type").unwrap();
    assert_eq!(content_type.to_str().unwrap(), "text/event-stream");
    response
}

/// Reads the events of an open stream on a thread; they arrive on the
/// receiver, which disconnects when the stream ends.
fn read_events(response: ureq::http::Response<ureq::Body>) -> Receiver<SseEvent> {
    let reader = BufReader::new(response.into_body().into_reader());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut name, mut data) = (String::new(), String::new());
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if line.is_empty() {
                if !data.is_empty() && tx.send((name.clone(), data.clone())).is_err() {
                    break;
                }
                name.clear();
                data.clear();
            } else if let Some(value) = line.strip_prefix("event:") {
                name = value.trim().to_string();
            } else if let Some(value) = line.strip_prefix("data:") {
                data.push_str(value.trim_start());
            }
        }
    });
    rx
}

/// The next event on `events` whose data is JSON matching `want`, skipping
/// others.
pub(crate) fn next_matching(
    events: &Receiver<SseEvent>,
    what: &str,
    want: impl Fn(&str, &Value) -> bool,
) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (name, data) = events
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no {what} event: {e:?}"));
        let value: Value = serde_json::from_str(&data).expect("event data is JSON");
        if want(&name, &value) {
            return value;
        }
    }
}

/// Waits until the event stream has ended.
fn ends(events: &Receiver<SseEvent>) -> bool {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(_) => continue,
            Err(RecvTimeoutError::Disconnected) => return true,
            Err(RecvTimeoutError::Timeout) => return false,
        }
    }
}

/// Parses `name{labels} value` from a metrics page.
fn metric(page: &str, series: &str) -> u64 {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{page}"))
        .parse()
        .expect("a number")
}

const SETUP: &str = "
CREATE STREAM events (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
  WITH (connector = 'push');
CREATE STREAM logged (ts TIMESTAMP, msg TEXT) WITH (path = 'logged.csv');
";

#[test]
fn serves_statements_rows_results_alerts_and_metrics() {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("setup.sql"), SETUP).expect("write script");
    let mut server = Server::start(
        dir.path(),
        &[
            "--addr",
            "127.0.0.1:0",
            "--token",
            TOKEN,
            "--max-body",
            "8KiB",
            "--max-queries",
            "3",
            "setup.sql",
        ],
    );

    // Health is open; everything else needs the token.
    let health = get(&server, "/health", None);
    assert_eq!(
        (health.status, health.json()),
        (200, json!({"status": "ok"}))
    );
    for token in [None, Some("wrong"), Some("secre"), Some("secrets")] {
        let refused = get(&server, "/queries", token);
        assert_eq!(refused.status, 401, "token {token:?}: {}", refused.body);
        assert!(refused.error().contains("Bearer"), "{}", refused.body);
        assert_eq!(get(&server, "/metrics", token).status, 401);
    }

    // An alert and a query over the pushed stream.
    let started_queries = statements(
        &server,
        "CREATE ALERT hot AS SELECT ts, host, cpu FROM events ALERT BY host WHEN cpu > 90;
         SELECT host, cpu FROM events WHERE cpu > 50;",
    );
    assert_eq!(started_queries.status, 200, "{}", started_queries.body);
    assert_eq!(started_queries.content_type, "application/json");
    let results = started_queries.json()["results"].clone();
    assert_eq!(results[0]["kind"], "query", "{results}");
    assert_eq!(results[0]["alert"], true);
    assert_eq!(results[1]["alert"], false);
    assert_eq!(
        results[1]["columns"],
        json!([{"name": "host", "type": "TEXT"}, {"name": "cpu", "type": "DOUBLE"}])
    );
    let alert_id = results[0]["id"].as_u64().expect("an id");
    let query_id = results[1]["id"].as_u64().expect("an id");

    let alerts = follow(&server, "/alerts");
    let rows = follow(&server, &format!("/queries/{query_id}/results"));

    // JSON lines, one malformed: the alert fires for host a.
    let pushed = post(
        &server,
        "/streams/events/rows",
        Some("application/x-ndjson"),
        "{\"ts\": 1000, \"host\": \"a\", \"cpu\": 95}\nnot json\n{\"ts\": 2000, \"host\": \"b\", \"cpu\": 20}\n",
    );
    assert_eq!(pushed.status, 200, "{}", pushed.body);
    assert_eq!(
        (pushed.json()["rows"].clone(), pushed.json()["bad"].clone()),
        (json!(2), json!(1))
    );
    assert_eq!(pushed.json()["bad_rows"][0]["line"], 2);
    let fired = next_matching(&alerts, "firing alert", |name, v| {
        name == "alert" && v["state"] == "firing"
    });
    assert_eq!(fired["host"], "a", "{fired}");
    assert_eq!(fired["alert"], "hot", "{fired}");
    assert_eq!(fired["event_time"], "1970-01-01T00:00:01", "{fired}");
    let row = next_matching(&rows, "result", |_, _| true);
    assert_eq!(row, json!({"host": "a", "cpu": 95.0}));

    // CSV with a header, then a JSON array.
    let pushed = post(
        &server,
        "/streams/events/rows",
        Some("text/csv"),
        "ts,host,cpu\n3000,c,42\n4000,d,77\n",
    );
    assert_eq!(pushed.status, 200, "{}", pushed.body);
    assert_eq!(pushed.json()["rows"], 2);
    assert_eq!(
        next_matching(&rows, "result", |_, _| true),
        json!({"host": "d", "cpu": 77.0})
    );
    let pushed = post(
        &server,
        "/streams/Events/rows",
        Some("application/json"),
        r#"[{"ts": 5000, "host": "e", "cpu": 60}]"#,
    );
    assert_eq!(pushed.status, 200, "{}", pushed.body);
    assert_eq!(
        next_matching(&rows, "result", |_, _| true),
        json!({"host": "e", "cpu": 60.0})
    );

    // Listing.
    let listed = get(&server, "/queries", Some(TOKEN));
    assert_eq!(listed.status, 200);
    let queries = listed.json()["queries"].clone();
    let ids: Vec<u64> = queries
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [alert_id, query_id], "{queries}");
    assert_eq!(
        queries[1]["label"],
        "SELECT host, cpu FROM events WHERE cpu > 50"
    );
    assert_eq!(queries[1]["rows_out"], 3, "{queries}");
    assert_eq!(
        queries[1]["sources"][0],
        json!({"stream": "events", "rows": 5, "bad_rows": 1})
    );

    // Metrics.
    let page = get(&server, "/metrics", Some(TOKEN));
    assert_eq!(page.status, 200);
    assert!(
        page.content_type.starts_with("text/plain; version=0.0.4"),
        "{}",
        page.content_type
    );
    let page = page.body;
    assert_eq!(
        metric(&page, "vigil_stream_rows_total{stream=\"events\"}"),
        5
    );
    assert_eq!(
        metric(&page, "vigil_stream_bad_rows_total{stream=\"events\"}"),
        1
    );
    assert_eq!(
        metric(
            &page,
            &format!("vigil_query_rows_out_total{{query=\"{query_id}\"}}")
        ),
        3
    );
    assert_eq!(
        metric(
            &page,
            &format!("vigil_query_late_rows_total{{query=\"{query_id}\"}}")
        ),
        0
    );
    assert_eq!(metric(&page, "vigil_running_queries"), 2);
    assert!(metric(&page, "vigil_alerts_fired_total") >= 1, "{page}");

    // Bad SQL: 400 with line and column; nothing starts.
    let bad = statements(&server, "SELECT host FROM events;\nSELEC oops;");
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(bad.error().contains("line 2, column 1"), "{}", bad.body);
    let bad = statements(
        &server,
        "CREATE VIEW v AS SELECT host FROM events;\n  SELECT nope FROM events;",
    );
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(
        bad.error().contains("unknown column 'nope'"),
        "{}",
        bad.body
    );
    // The caret under the unknown name, not at the statement's start.
    assert!(bad.error().contains("line 2, column 10"), "{}", bad.body);
    assert_eq!(
        bad.json()["results"],
        json!([{"kind": "done"}]),
        "the view stays declared"
    );

    // Over the query limit: the first query starts, the second gets 429.
    let limited = statements(&server, "SELECT host FROM events;\nSELECT cpu FROM events;");
    assert_eq!(limited.status, 429, "{}", limited.body);
    assert!(
        limited.error().contains("--max-queries"),
        "{}",
        limited.body
    );
    assert!(limited.error().contains("line 2"), "{}", limited.body);
    let third = limited.json()["results"][0]["id"]
        .as_u64()
        .expect("the first started");
    assert_eq!(delete(&server, &format!("/queries/{third}")).status, 200);

    // Too large a body.
    let big = format!("-- {}\nSELECT host FROM events;", "x".repeat(20_000));
    let refused = statements(&server, &big);
    assert_eq!(refused.status, 413, "{}", refused.body);
    assert!(refused.error().contains("--max-body"), "{}", refused.body);

    // Streams that take no pushed rows.
    let unknown = post(
        &server,
        "/streams/nope/rows",
        Some("application/x-ndjson"),
        "{}",
    );
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert!(unknown.error().contains("unknown stream 'nope'"));
    let file = post(
        &server,
        "/streams/logged/rows",
        Some("text/csv"),
        "ts,msg\n1,x\n",
    );
    assert_eq!(file.status, 409, "{}", file.body);
    assert!(file.error().contains("connector = 'push'"), "{}", file.body);
    let wrong_type = post(&server, "/streams/events/rows", Some("text/plain"), "x");
    assert_eq!(wrong_type.status, 415, "{}", wrong_type.body);

    // Stopping ends the query's event stream.
    let stopped = delete(&server, &format!("/queries/{query_id}"));
    assert_eq!(stopped.status, 200, "{}", stopped.body);
    assert!(ends(&rows), "the results stream ends with its query");
    assert_eq!(delete(&server, &format!("/queries/{query_id}")).status, 404);
    assert_eq!(delete(&server, "/queries/abc").status, 404);
    assert_eq!(
        get(&server, "/queries/999/results", Some(TOKEN)).status,
        404
    );
    let listed = get(&server, "/queries", Some(TOKEN)).json();
    assert_eq!(listed["queries"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["queries"][0]["id"], alert_id);

    // SIGTERM: a graceful exit, open event streams end.
    let status = server.terminate();
    assert!(status.success(), "{status:?}; stderr:\n{}", server.stderr());
    assert!(ends(&alerts), "the alert stream ends on shutdown");
    assert!(
        server.stderr().contains("vigil: shutting down"),
        "{}",
        server.stderr()
    );
    eprintln!("service scenario took {:?}", started.elapsed());
}

#[test]
fn a_broken_startup_script_stops_the_service_before_it_listens() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("bad.sql"),
        "CREATE STREAM s (ts TIMESTAMP) WITH (connector = 'push');\nSELECT nope FROM s;\n",
    )
    .expect("write script");
    let output = support::run_within(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["serve", "--addr", "127.0.0.1:0", "bad.sql"])
            .current_dir(dir.path()),
        WAIT,
        "vigil serve with a broken startup script",
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("error: bad.sql: "), "{stderr}");
    // At the unknown name itself.
    assert!(stderr.contains("line 2, column 8"), "{stderr}");
    assert!(!stderr.contains("listening"), "{stderr}");
}

/// Query `id` as `GET /queries/{id}` answers it.
fn query(server: &Server, id: u64) -> Value {
    let answer = get(server, &format!("/queries/{id}"), Some(TOKEN));
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.json()
}

/// Waits until query `id` is in `state`; its listing.
fn wait_state(server: &Server, id: u64, state: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let listed = query(server, id);
        if listed["state"] == state {
            return listed;
        }
        assert!(
            Instant::now() < deadline,
            "query {id} is not {state}: {listed}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The id of the one query `sql` starts.
fn start_query(server: &Server, sql: &str) -> u64 {
    let started = statements(server, sql);
    assert_eq!(started.status, 200, "{}", started.body);
    started.json()["results"][0]["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no query id: {}", started.body))
}

#[test]
fn a_query_that_fails_while_running_stays_listed_with_its_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("setup.sql"), SETUP).expect("write script");
    std::fs::write(dir.path().join("logged.csv"), "ts,msg\n1,x\n2,y\n").expect("write csv");
    std::fs::write(
        dir.path().join("gone.sql"),
        "CREATE STREAM gone (ts TIMESTAMP, x BIGINT) WITH (path = 'missing.csv');\n",
    )
    .expect("write script");
    let server = Server::start(
        dir.path(),
        &[
            "--addr",
            "127.0.0.1:0",
            "--token",
            TOKEN,
            "setup.sql",
            "gone.sql",
        ],
    );

    let failing = start_query(&server, "SELECT CAST(host AS BIGINT) AS n FROM events;");
    let running = start_query(&server, "SELECT host FROM events;");
    let rows = follow(&server, &format!("/queries/{failing}/results"));
    let pushed = post(
        &server,
        "/streams/events/rows",
        None,
        "{\"ts\": 1000, \"host\": \"abc\", \"cpu\": 1}\n",
    );
    assert_eq!(pushed.status, 200, "{}", pushed.body);

    // The follower is told, then its stream ends.
    let told = next_matching(&rows, "error", |name, _| name == "error");
    let message = told["error"]
        .as_str()
        .expect("an error message")
        .to_string();
    assert!(message.contains("abc"), "{told}");
    assert!(ends(&rows), "the results stream ends after the error");

    // Listed as failed with the same error; the other query runs on.
    let listed = wait_state(&server, failing, "failed");
    assert_eq!(listed["error"], message.as_str(), "{listed}");
    assert_eq!(
        listed["label"],
        "SELECT CAST(host AS BIGINT) AS n FROM events"
    );
    let all = get(&server, "/queries", Some(TOKEN)).json();
    let states: Vec<(u64, String)> = all["queries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            (
                q["id"].as_u64().unwrap(),
                q["state"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [(failing, "failed".into()), (running, "running".into())],
        "{all}"
    );
    assert_eq!(query(&server, running)["error"], Value::Null);
    assert!(
        server
            .stderr()
            .contains(&format!("vigil serve: query {failing} failed: {message}")),
        "{}",
        server.stderr()
    );

    // A follower arriving later gets the error at once.
    let late = follow(&server, &format!("/queries/{failing}/results"));
    let told = next_matching(&late, "error", |name, _| name == "error");
    assert_eq!(told["error"], message.as_str());
    assert!(ends(&late));

    // A source that cannot be read fails the same way; a file read to its
    // end finishes.
    let missing = start_query(&server, "SELECT x FROM gone;");
    let listed = wait_state(&server, missing, "failed");
    assert!(
        listed["error"].as_str().unwrap().contains("missing.csv"),
        "{listed}"
    );
    let finished = start_query(&server, "SELECT msg FROM logged;");
    let listed = wait_state(&server, finished, "finished");
    assert_eq!(listed["rows_out"], 2, "{listed}");
    assert_eq!(listed["error"], Value::Null);
    let page = get(&server, "/metrics", Some(TOKEN)).body;
    assert_eq!(metric(&page, "vigil_running_queries"), 1, "{page}");
    assert_eq!(metric(&page, "vigil_failed_queries"), 2, "{page}");

    // DELETE removes an ended query from the listing.
    let removed = delete(&server, &format!("/queries/{failing}"));
    assert_eq!(removed.status, 200, "{}", removed.body);
    assert_eq!(removed.json(), json!({"removed": failing}));
    let gone = get(&server, &format!("/queries/{failing}"), Some(TOKEN));
    assert_eq!(gone.status, 404, "{}", gone.body);
    assert_eq!(delete(&server, &format!("/queries/{failing}")).status, 404);
    let stopped = delete(&server, &format!("/queries/{running}"));
    assert_eq!(stopped.json(), json!({"stopped": running}));
    let left: Vec<u64> = get(&server, "/queries", Some(TOKEN)).json()["queries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["id"].as_u64().unwrap())
        .collect();
    assert_eq!(left, [missing, finished], "stopped queries are not kept");
}

#[test]
fn unknown_or_malformed_query_ids_are_not_found() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Server::start(dir.path(), &["--addr", "127.0.0.1:0"]);
    let paths = [
        "/queries/abc",
        "/queries/abc/results",
        "/queries/-1",
        "/queries/1.5",
        "/queries/99999999999999999999999",
        "/queries/%FF",
        "/queries/7",
        "/queries/7/results",
        "/queries/7/nope",
    ];
    for path in paths {
        let answer = get(&server, path, None);
        assert_eq!(answer.status, 404, "GET {path}: {}", answer.body);
        assert_eq!(answer.content_type, "application/json", "GET {path}");
        assert!(!answer.error().is_empty(), "GET {path}");
    }
    for path in ["/queries/abc", "/queries/7", "/queries/-1"] {
        let answer = delete(&server, path);
        assert_eq!(answer.status, 404, "DELETE {path}: {}", answer.body);
        assert!(!answer.error().is_empty(), "DELETE {path}");
    }
    // A method the endpoint does not take is still 405, with a JSON body.
    let answer = post(&server, "/queries/abc", None, "");
    assert_eq!(answer.status, 405, "{}", answer.body);
    assert!(!answer.error().is_empty());
}

/// Resident memory of process `pid` in bytes, from /proc.
pub(crate) fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmRSS");
    kib * 1024
}

#[test]
fn results_kept_for_followers_stay_within_the_budget() {
    const BUDGET: u64 = 2 << 20;
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("setup.sql"),
        "CREATE STREAM notes (ts TIMESTAMP, host TEXT, note TEXT, WATERMARK FOR ts AS ts)
           WITH (connector = 'push');",
    )
    .expect("write script");
    let server = Server::start(
        dir.path(),
        &[
            "--addr",
            "127.0.0.1:0",
            "--token",
            TOKEN,
            "--max-result-buffer",
            "2MiB",
            "setup.sql",
        ],
    );
    let followed = start_query(&server, "SELECT host, note FROM notes;");
    let unfollowed = [
        start_query(&server, "SELECT note FROM notes WHERE host <> 'x';"),
        start_query(&server, "SELECT ts, host FROM notes;"),
    ];
    // A follower that does not read: the socket and the server's write
    // buffers fill, then its results queue up in the service.
    let slow = subscribe(&server, &format!("/queries/{followed}/results"));

    let note = "n".repeat(100);
    let body: String = (0..2500)
        .map(|i| {
            format!(
                "{{\"ts\": {i}, \"host\": \"h{}\", \"note\": \"{note}\"}}\n",
                i % 7
            )
        })
        .collect();
    let buffered = |page: &str, id: u64| {
        metric(
            page,
            &format!("vigil_query_result_buffer_bytes{{query=\"{id}\"}}"),
        )
    };
    let mut most = 0;
    for push in 0..60 {
        let pushed = post(
            &server,
            "/streams/notes/rows",
            Some("application/x-ndjson"),
            &body,
        );
        assert_eq!(pushed.status, 200, "push {push}: {}", pushed.body);
        let page = get(&server, "/metrics", Some(TOKEN)).body;
        let kept = buffered(&page, followed);
        assert!(kept <= BUDGET, "push {push}: {kept} bytes kept\n{page}");
        most = most.max(kept);
        for id in unfollowed {
            assert_eq!(buffered(&page, id), 0, "no follower, nothing kept");
        }
    }
    assert!(
        most > BUDGET / 2,
        "the slow follower's results queued up to near the budget: {most}"
    );
    // Coarse: 150k rows went through three queries; the service's memory
    // stays far from what keeping them all would take.
    let rss = rss_bytes(server.child.id());
    assert!(rss < 600 << 20, "resident memory {} MiB", rss >> 20);

    // Once it reads, the follower learns what it missed and gets rows.
    let events = read_events(slow);
    let lagged = next_matching(&events, "lagged", |name, _| name == "lagged");
    assert!(lagged["skipped_batches"].as_u64().unwrap() > 0, "{lagged}");
    let pushed = post(
        &server,
        "/streams/notes/rows",
        None,
        "{\"ts\": 99999, \"host\": \"last\", \"note\": \"end\"}\n",
    );
    assert_eq!(pushed.status, 200, "{}", pushed.body);
    let last = next_matching(&events, "the last row", |_, v| v["host"] == "last");
    assert_eq!(last, json!({"host": "last", "note": "end"}));
    let page = get(&server, "/metrics", Some(TOKEN)).body;
    assert!(buffered(&page, followed) <= BUDGET, "{page}");
}

#[test]
fn a_long_plan_does_not_stop_the_server_answering() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("setup.sql"), SETUP).expect("write script");
    // One worker thread: planning on it would hold every other request.
    let server = Server::start_with(
        dir.path(),
        &["--addr", "127.0.0.1:0", "--token", TOKEN, "setup.sql"],
        &[("TOKIO_WORKER_THREADS", "1")],
    );
    // Starting a query into a file sink creates the file: the first marks
    // that planning began, the last that it ended.
    let mut sql = String::from(
        "CREATE SINK first WITH (connector = 'file', path = 'first.csv', format = 'csv');
         INSERT INTO first SELECT host FROM events;\n",
    );
    for _ in 0..PLANS {
        sql.push_str(
            "EXPLAIN SELECT window_end, host, avg(cpu) AS cpu, max(cpu) AS peak
               FROM TUMBLE(events, ts, INTERVAL '1' MINUTE)
               WHERE cpu > 1 AND host <> 'x' GROUP BY window_start, window_end, host;\n",
        );
    }
    sql.push_str(
        "CREATE SINK last WITH (connector = 'file', path = 'last.csv', format = 'csv');
         INSERT INTO last SELECT host FROM events;\n",
    );
    let url = server.url("/statements");
    let posting = std::thread::spawn(move || {
        answer(
            agent(Some(WAIT * 4))
                .post(&url)
                .header("authorization", bearer(TOKEN))
                .send(&sql),
        )
    });
    let deadline = Instant::now() + WAIT;
    while !dir.path().join("first.csv").exists() {
        assert!(Instant::now() < deadline, "planning did not begin");
        std::thread::sleep(Duration::from_millis(10));
    }
    let health = get(&server, "/health", None);
    assert_eq!(health.status, 200);
    assert!(
        !dir.path().join("last.csv").exists(),
        "the server answered only once planning ended"
    );
    let posted = posting.join().expect("the post thread");
    assert_eq!(posted.status, 200, "{}", posted.body);
    assert!(dir.path().join("last.csv").exists());
}

/// EXPLAINs in the long statement batch: enough to take seconds.
const PLANS: usize = 1500;

/// The ids of the running queries, from `GET /queries`.
fn running_ids(server: &Server) -> Vec<u64> {
    let listed = get(server, "/queries", Some(TOKEN)).json();
    listed["queries"]
        .as_array()
        .expect("a list")
        .iter()
        .filter(|q| q["state"] == "running")
        .map(|q| q["id"].as_u64().expect("an id"))
        .collect()
}

#[test]
fn drop_replace_show_and_describe_over_http() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("setup.sql"), SETUP).expect("write script");
    let mut server = Server::start(
        dir.path(),
        &["--addr", "127.0.0.1:0", "--token", TOKEN, "setup.sql"],
    );
    let started = statements(
        &server,
        "CREATE ALERT hot AS SELECT ts, host, cpu FROM events ALERT BY host WHEN cpu > 90;
         SELECT host, cpu FROM events WHERE cpu > 50;",
    );
    assert_eq!(started.status, 200, "{}", started.body);
    let results = started.json()["results"].clone();
    let alert_id = results[0]["id"].as_u64().expect("an id");
    let query_id = results[1]["id"].as_u64().expect("an id");
    let rows = follow(&server, &format!("/queries/{query_id}/results"));

    // The alert reads the stream: dropping it alone is refused.
    let refused = statements(&server, "DROP STREAM events;");
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(
        refused.error().contains(
            "cannot drop stream 'events': alert 'hot' reads it (DROP STREAM events CASCADE"
        ),
        "{}",
        refused.body
    );

    let shown = statements(&server, "SHOW QUERIES; SHOW STREAMS; DESCRIBE events;");
    assert_eq!(shown.status, 200, "{}", shown.body);
    let shown = shown.json()["results"].clone();
    assert_eq!(shown[0]["kind"], "rows", "{shown}");
    assert_eq!(
        shown[0]["columns"],
        json!([
            "id",
            "rows_out",
            "late_rows",
            "shed_rows",
            "rows_in",
            "query"
        ])
    );
    let ids: Vec<&str> = shown[0]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_str().unwrap())
        .collect();
    assert_eq!(ids, [alert_id.to_string(), query_id.to_string()]);
    let streams = &shown[1]["rows"];
    assert_eq!(
        streams[0],
        json!([
            "events",
            "stream",
            "ts TIMESTAMP, host TEXT, cpu DOUBLE",
            "push"
        ]),
        "{shown}"
    );
    assert_eq!(streams[1][0], "logged", "{shown}");
    // Then the built-in streams, which nothing declared hides.
    assert_eq!(streams[2][0], "host_metrics", "{shown}");
    assert_eq!(streams[3][0], "demo", "{shown}");
    assert_eq!(
        [&streams[4][0], &streams[4][1], &streams[4][3]],
        ["hot", "alert", "reads events"],
        "{shown}"
    );
    assert_eq!(streams.as_array().unwrap().len(), 5, "{shown}");
    assert_eq!(
        shown[2]["notes"],
        json!(["stream events: push", "event time: ts, watermark delay 0 s"])
    );
    assert_eq!(
        shown[2]["rows"][0],
        json!(["ts", "TIMESTAMP", "event time"])
    );

    // Replacing the alert replaces its query.
    let replaced = statements(
        &server,
        "CREATE OR REPLACE ALERT hot AS SELECT ts, host, cpu FROM events ALERT BY host WHEN cpu > 80;",
    );
    assert_eq!(replaced.status, 200, "{}", replaced.body);
    let new_alert = replaced.json()["results"][0]["id"].as_u64().expect("an id");
    assert_eq!(running_ids(&server), [query_id, new_alert]);

    // Dropping the alert stops its query; the other goes on.
    let dropped = statements(&server, "DROP ALERT hot;");
    assert_eq!(dropped.status, 200, "{}", dropped.body);
    assert_eq!(
        dropped.json()["results"][0],
        json!({"kind": "dropped", "dropped": [{"kind": "alert", "name": "hot"}]})
    );
    assert_eq!(running_ids(&server), [query_id]);

    // The stream again, with other columns: the query on the old one sees
    // its input end; rows of the new shape are taken.
    let redeclared = statements(
        &server,
        "DROP STREAM events;
         CREATE STREAM events (ts TIMESTAMP, host TEXT, mem DOUBLE, WATERMARK FOR ts AS ts)
           WITH (connector = 'push');",
    );
    assert_eq!(redeclared.status, 200, "{}", redeclared.body);
    assert!(ends(&rows), "the query on the dropped push stream ends");
    assert!(running_ids(&server).is_empty());
    let pushed = post(
        &server,
        "/streams/events/rows",
        None,
        "{\"ts\": 1000, \"host\": \"a\", \"mem\": 5}\n",
    );
    assert_eq!(pushed.status, 200, "{}", pushed.body);
    assert_eq!(pushed.json()["rows"], 1);
    let again = statements(
        &server,
        "CREATE STREAM events (ts TIMESTAMP) WITH (connector = 'push');",
    );
    assert_eq!(again.status, 400, "{}", again.body);
    assert!(
        again.error().contains("CREATE OR REPLACE STREAM events"),
        "{}",
        again.body
    );
    let replaced = statements(
        &server,
        "CREATE OR REPLACE STREAM events (ts TIMESTAMP) WITH (connector = 'push');
         SHOW STREAMS;",
    );
    assert_eq!(replaced.status, 200, "{}", replaced.body);
    assert_eq!(
        replaced.json()["results"][1]["rows"][0],
        json!(["events", "stream", "ts TIMESTAMP", "push"])
    );
    let status = server.terminate();
    assert!(status.success(), "{status:?}; stderr:\n{}", server.stderr());
}

const DURABLE_SETUP: &str = "CREATE STREAM ev (ts TIMESTAMP, host TEXT, v DOUBLE, hot DOUBLE,
       WATERMARK FOR ts AS ts) WITH (connector = 'push');
     CREATE SINK totals WITH (path = 'totals.csv', format = 'csv');
     INSERT INTO totals SELECT window_end, host, count(*) AS n, sum(v) AS s
       FROM TUMBLE(ev, ts, INTERVAL '1' SECOND) GROUP BY window_end, host;
     CREATE SINK pages WITH (path = 'pages.csv', format = 'csv');
     CREATE ALERT warm AS SELECT window_end, host, max(hot) AS peak
       FROM TUMBLE(ev, ts, INTERVAL '1' SECOND) GROUP BY window_end, host
       ALERT BY host WHEN peak > 0;
     INSERT INTO pages SELECT host, event_time, state FROM warm;";

/// Request `i`'s hundred rows, all in second `i`: hosts a and b, values
/// `100 i + j` (unique), `hot` on odd requests.
fn request_rows(i: u64) -> String {
    (0..100)
        .map(|j| {
            let host = if j % 2 == 0 { "a" } else { "b" };
            format!(
                "{{\"ts\": {}, \"host\": \"{host}\", \"v\": {}, \"hot\": {}}}\n",
                i * 1000 + j * 10,
                i * 100 + j,
                i % 2
            )
        })
        .collect()
}

/// What request `i` adds to its window, per host: rows and sum.
fn request_totals(i: u64) -> [(String, u64, f64); 2] {
    let sum = |parity: u64| {
        (0..100)
            .filter(|j| j % 2 == parity)
            .map(|j| (i * 100 + j) as f64)
            .sum::<f64>()
    };
    [("a".into(), 50, sum(0)), ("b".into(), 50, sum(1))]
}

#[test]
fn a_durable_service_killed_at_random_points_loses_no_acknowledged_row() {
    const REQUESTS: u64 = 1000;
    let dir = tempfile::tempdir().expect("temp dir");
    let args = [
        "--addr",
        "127.0.0.1:0",
        "--state-dir",
        "state",
        "--checkpoint-interval",
        "200ms",
    ];
    let mut server = Server::start(dir.path(), &args);
    assert_eq!(statements(&server, DURABLE_SETUP).status, 200);
    // Kill points, spread by a fixed pseudo-random sequence; never among
    // the last requests, so the last windows are acknowledged.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut random = move |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let mut kills: Vec<u64> = (0..6).map(|k| k * 150 + 20 + random(120)).collect();
    kills.dedup();
    let mut acked = Vec::new();
    let mut unanswered = Vec::new();
    for i in 0..REQUESTS {
        let url = server.url("/streams/ev/rows");
        let body = request_rows(i);
        let send = move || {
            agent(Some(WAIT))
                .post(url)
                .header("content-type", "application/x-ndjson")
                .send(body)
                .map(|r| status_code(&r))
        };
        if kills.contains(&i) {
            let request = std::thread::spawn(send);
            std::thread::sleep(Duration::from_micros(random(12_000)));
            server.kill9();
            match request.join().unwrap() {
                Ok(200) => acked.push(i),
                Ok(status) => panic!("request {i}: status {status}"),
                Err(_) => unanswered.push(i),
            }
            server = Server::start(dir.path(), &args);
            continue;
        }
        let status = send().expect("the server answers");
        assert_eq!(status, 200, "request {i}");
        acked.push(i);
    }
    // A later second makes the last window fire; then wait for it to be
    // written.
    let flush = format!(
        "{{\"ts\": {}, \"host\": \"a\", \"v\": 0, \"hot\": 0}}\n",
        (REQUESTS + 5) * 1000
    );
    assert_eq!(
        post(
            &server,
            "/streams/ev/rows",
            Some("application/x-ndjson"),
            &flush
        )
        .status,
        200
    );
    let last_end = format!("1970-01-01T00:{:02}:{:02}", REQUESTS / 60, REQUESTS % 60);
    let deadline = Instant::now() + WAIT;
    while !std::fs::read_to_string(dir.path().join("totals.csv"))
        .unwrap_or_default()
        .contains(&last_end)
    {
        assert!(Instant::now() < deadline, "the last window is not written");
        std::thread::sleep(Duration::from_millis(50));
    }
    let page = get(&server, "/metrics", None).body;
    assert!(
        metric(&page, "vigil_checkpoints_completed_total") > 0,
        "{page}"
    );
    assert!(metric(&page, "vigil_restores_total") > 0, "{page}");
    server.terminate();

    let seconds = |text: &str| {
        chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S")
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .and_utc()
            .timestamp() as u64
    };
    let mut windows: std::collections::BTreeMap<u64, Vec<(String, u64, f64)>> = Default::default();
    let totals = std::fs::read_to_string(dir.path().join("totals.csv")).unwrap();
    for line in totals.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let request = seconds(f[0]) - 1;
        if request < REQUESTS {
            windows.entry(request).or_default().push((
                f[1].to_string(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            ));
        }
    }
    for i in 0..REQUESTS {
        let mut got = windows.remove(&i).unwrap_or_default();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let whole = request_totals(i).to_vec();
        if unanswered.contains(&i) {
            assert!(got.is_empty() || got == whole, "request {i}: {got:?}");
        } else {
            assert_eq!(got, whole, "acknowledged request {i}, once");
        }
    }
    assert!(acked.len() as u64 >= REQUESTS - kills.len() as u64);
    assert!(kills.len() >= 5);
    eprintln!("acknowledged {}, unanswered {unanswered:?}", acked.len());

    // Alerts: a change per host at most once, alternating.
    let pages = std::fs::read_to_string(dir.path().join("pages.csv")).unwrap();
    let mut last: std::collections::HashMap<String, String> = Default::default();
    let mut seen = std::collections::HashSet::new();
    let mut firing = 0;
    for line in pages.lines().skip(1) {
        assert!(seen.insert(line.to_string()), "duplicate alert row {line}");
        let f: Vec<&str> = line.split(',').collect();
        let previous = last.insert(f[0].to_string(), f[2].to_string());
        assert_ne!(previous.as_deref(), Some(f[2]), "{line} twice in a row");
        firing += (f[2] == "firing") as u64;
    }
    assert!(firing > 100, "{pages}");
}

#[test]
fn a_full_write_ahead_log_answers_503_with_retry_after_and_savepoints_are_taken() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Server::start(
        dir.path(),
        &[
            "--addr",
            "127.0.0.1:0",
            "--state-dir",
            "state",
            "--checkpoint-interval",
            "1h",
            "--max-wal-size",
            "64KiB",
        ],
    );
    let setup = "CREATE STREAM ev (ts TIMESTAMP, host TEXT, v DOUBLE, hot DOUBLE,
       WATERMARK FOR ts AS ts) WITH (connector = 'push');
     SELECT host, v FROM ev WHERE v < 0;";
    assert_eq!(statements(&server, setup).status, 200);
    let mut full = None;
    for i in 0..200 {
        let response = agent(Some(WAIT))
            .post(server.url("/streams/ev/rows"))
            .header("content-type", "application/x-ndjson")
            .send(request_rows(i))
            .expect("an answer");
        match status_code(&response) {
            200 => {}
            503 => {
                full = Some(response);
                break;
            }
            other => panic!("request {i}: {other}"),
        }
    }
    let mut response = full.expect("the log fills up");
    let retry: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let body = response.body_mut().read_to_string().unwrap();
    assert!(body.contains("full"), "{body}");
    let page = get(&server, "/metrics", None).body;
    assert!(
        metric(&page, "vigil_wal_bytes{stream=\"ev\"}") > 0,
        "{page}"
    );

    let taken = post(&server, "/savepoints", None, r#"{"name": "sp1"}"#);
    assert_eq!(taken.status, 200, "{}", taken.body);
    let taken = taken.json();
    assert_eq!(taken["queries"], json!(["query-1"]));
    let path = std::path::PathBuf::from(taken["path"].as_str().unwrap());
    assert!(dir.path().join(&path).join("query-1").is_dir(), "{path:?}");
    let again = post(&server, "/savepoints", None, r#"{"name": "sp1"}"#);
    assert_eq!(again.status, 409, "{}", again.body);
    let bad = post(&server, "/savepoints", None, r#"{"name": "../x"}"#);
    assert_eq!(bad.status, 400, "{}", bad.body);

    // A query stopped is recorded: after a crash only the first runs again,
    // restored from the savepoint.
    let second = start_query(&server, "SELECT v FROM ev WHERE v > 1e9;");
    assert_eq!(delete(&server, &format!("/queries/{second}")).status, 200);
    let mut server = server;
    server.kill9();
    let server = Server::start(
        dir.path(),
        &[
            "--addr",
            "127.0.0.1:0",
            "--state-dir",
            "state",
            "--from-savepoint",
            path.to_str().unwrap(),
        ],
    );
    let listed = get(&server, "/queries", None).json();
    let labels: Vec<&str> = listed["queries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["SELECT host, v FROM ev WHERE v < 0"], "{listed}");
    let page = get(&server, "/metrics", None).body;
    assert_eq!(metric(&page, "vigil_restores_total"), 1, "{page}");
}

/// Parses a `/metrics` page with a Prometheus text-format parser, checking
/// that it took every sample line and that the families follow the naming
/// conventions (a HELP for each, `_total` on counters, one TYPE each).
fn scrape(page: &str) -> prometheus_parse::Scrape {
    use prometheus_parse::Value;
    let lines = page.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the page parses");
    let sample_lines = page
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    let parsed: usize = scrape
        .samples
        .iter()
        .map(|s| match &s.value {
            Value::Histogram(buckets) => buckets.len(),
            _ => 1,
        })
        .sum();
    assert_eq!(parsed, sample_lines, "every sample line parses:\n{page}");
    let mut types = std::collections::HashSet::new();
    for line in page.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut words = line.split_whitespace().skip(2);
        let (name, kind) = (words.next().unwrap(), words.next().unwrap());
        assert!(types.insert(name.to_string()), "one TYPE for {name}");
        assert!(scrape.docs.contains_key(name), "a HELP for {name}");
        assert!(name.starts_with("vigil_"), "{name}");
        assert_eq!(
            kind == "counter",
            name.ends_with("_total"),
            "counters, and only they, end in _total: {line}"
        );
        if name.contains("seconds") {
            assert!(
                name.ends_with("_seconds") || name.ends_with("_seconds_total"),
                "{name}"
            );
        }
    }
    scrape
}

/// The value of the sample of `metric` whose labels include `labels`.
fn value_of(scrape: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    use prometheus_parse::Value;
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .unwrap_or_else(|| panic!("no {metric} with {labels:?}"));
    match sample.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
        _ => panic!("{metric} is not a single value"),
    }
}

#[test]
fn metrics_show_operators_queues_lag_and_latency() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("setup.sql"),
        "CREATE STREAM events (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
           WITH (connector = 'push');",
    )
    .expect("write script");
    let server = Server::start(
        dir.path(),
        &["--addr", "127.0.0.1:0", "--token", TOKEN, "setup.sql"],
    );
    // A stateless query (no watermark reaches its sink) and a windowed one.
    let started = statements(
        &server,
        "SELECT ts, host, cpu FROM events WHERE cpu > 50;
         SELECT window_end, count(*) AS n FROM TUMBLE(events, ts, INTERVAL '1' HOUR)
         GROUP BY window_start, window_end;",
    );
    assert_eq!(started.status, 200, "{}", started.body);
    let id = |i: usize| {
        started.json()["results"][i]["id"]
            .as_u64()
            .unwrap()
            .to_string()
    };
    let (query, windowed) = (id(0), id(1));
    let results = follow(&server, &format!("/queries/{query}/results"));

    // Ten rows five seconds old; four have cpu > 50.
    let old = chrono::Utc::now().timestamp_millis() - 5_000;
    let rows: Vec<Value> = (0..10)
        .map(|i| json!({"ts": old + i, "host": "a", "cpu": i * 10}))
        .collect();
    let pushing = Instant::now();
    let pushed = post(
        &server,
        "/streams/events/rows",
        Some("application/json"),
        &Value::Array(rows).to_string(),
    );
    assert_eq!(pushed.status, 200, "{}", pushed.body);
    for _ in 0..4 {
        next_matching(&results, "result", |_, _| true);
    }

    // The windowed query's watermark reaches its sink soon after.
    let deadline = Instant::now() + WAIT;
    let (page, scrape) = loop {
        let page = get(&server, "/metrics", Some(TOKEN)).body;
        let parsed = scrape(&page);
        let seen = parsed.samples.iter().any(|s| {
            s.metric == "vigil_query_watermark_lag_seconds"
                && s.labels.get("query") == Some(&windowed)
        });
        if seen || Instant::now() > deadline {
            break (page, parsed);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let q = [("query", query.as_str())];

    // The filter saw every row and kept four.
    let filter = scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == "vigil_operator_rows_in_total"
                && s.labels.get("query") == Some(&query)
                && s.labels
                    .get("name")
                    .is_some_and(|n| n.starts_with("filter"))
        })
        .unwrap_or_else(|| panic!("the filter's series:\n{page}"));
    let labels: Vec<(&str, &str)> = ["query", "stage", "operator", "name"]
        .iter()
        .map(|&k| (k, filter.labels.get(k).unwrap()))
        .collect();
    assert_eq!(
        value_of(&scrape, "vigil_operator_rows_in_total", &labels),
        10.0
    );
    assert_eq!(
        value_of(&scrape, "vigil_operator_rows_out_total", &labels),
        4.0
    );
    assert!(value_of(&scrape, "vigil_operator_busy_seconds_total", &labels) > 0.0);

    // The rows are five seconds behind the clock, and so are results.
    let lag = value_of(&scrape, "vigil_stream_lag_seconds", &[("stream", "events")]);
    assert!((4.9..WAIT.as_secs_f64() + 5.0).contains(&lag), "{lag}");
    let w = [("query", windowed.as_str())];
    let watermark_lag = value_of(&scrape, "vigil_query_watermark_lag_seconds", &w);
    assert!(watermark_lag >= 4.9, "{watermark_lag}");
    let no_watermark = scrape.samples.iter().any(|s| {
        s.metric == "vigil_query_watermark_lag_seconds" && s.labels.get("query") == Some(&query)
    });
    assert!(!no_watermark, "no lag without a watermark:\n{page}");
    let latency = scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == "vigil_query_result_latency_seconds"
                && s.labels.get("query") == Some(&query)
        })
        .expect("a latency histogram");
    let prometheus_parse::Value::Histogram(buckets) = &latency.value else {
        panic!("a histogram");
    };
    let counts: Vec<f64> = buckets.iter().map(|b| b.count).collect();
    assert!(
        counts.windows(2).all(|w| w[0] <= w[1]),
        "cumulative: {counts:?}"
    );
    assert_eq!(*counts.last().unwrap(), 4.0, "{counts:?}");
    assert!(buckets.last().unwrap().less_than.is_infinite());
    // The 5 s of lag fall in the bucket up to 10 s (or later, on a slow machine).
    let under_2_5s = buckets.iter().find(|b| b.less_than == 2.5).unwrap().count;
    assert_eq!(under_2_5s, 0.0, "{counts:?}");
    assert_eq!(
        value_of(&scrape, "vigil_query_result_latency_seconds_count", &q),
        4.0
    );
    assert!(value_of(&scrape, "vigil_query_result_latency_seconds_sum", &q) >= 4.0 * 4.9);

    // Its queues are listed, and empty once the rows went through.
    let queues: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "vigil_queue_rows" && s.labels.get("query") == Some(&query))
        .collect();
    assert!(!queues.is_empty(), "{page}");
    let received: f64 = scrape
        .samples
        .iter()
        .filter(|s| {
            s.metric == "vigil_queue_received_rows_total" && s.labels.get("query") == Some(&query)
        })
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) => v,
            _ => 0.0,
        })
        .sum();
    assert!(received >= 10.0, "{page}");
    assert_eq!(value_of(&scrape, "vigil_query_shed_rows_total", &q), 0.0);
    assert_eq!(
        value_of(
            &scrape,
            "vigil_stream_buffered_rows",
            &[("stream", "events")]
        ),
        0.0
    );
    assert_eq!(
        value_of(&scrape, "vigil_buffer_full", &[("stream", "events")]),
        0.0
    );
    // The stream's back-pressure is a counter of seconds: the pushed rows
    // were handed on within the time since they were pushed.
    let blocked = scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == "vigil_stream_blocked_seconds_total"
                && s.labels.get("stream") == Some("events")
        })
        .unwrap_or_else(|| panic!("no back-pressure of stream events:\n{page}"));
    let prometheus_parse::Value::Counter(blocked) = blocked.value else {
        panic!("vigil_stream_blocked_seconds_total is not a counter:\n{page}");
    };
    let since = pushing.elapsed().as_secs_f64();
    assert!((0.0..=since).contains(&blocked), "{blocked} s of {since} s");
}

/// Pushed rows go through the decoder files use: nested JSON values and CSV
/// cells of JSON text become struct, list and map columns, and a value of
/// the wrong shape is a bad row whose reason names the column and path.
/// The sum of the samples of `metric` whose labels include `labels`.
fn sum_of(scrape: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    use prometheus_parse::Value;
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            _ => panic!("{metric} is not a single value"),
        })
        .sum()
}

/// A Kafka stream and a Kafka sink whose broker is unreachable count their
/// client's errors in `GET /metrics` (per query, labelled by the stream)
/// while the service keeps answering, and a Kafka stream's messages that
/// do not decode are counted there too.
#[test]
fn metrics_count_kafka_errors_and_bad_rows_while_the_service_stays_up() {
    use rdkafka::producer::{BaseRecord, Producer};
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cluster = rdkafka::mocking::MockCluster::new(1).expect("the mock cluster starts");
    cluster.create_topic("metrics", 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let producer = crate::kafka::producer(&bootstrap);
    // One row and two messages that do not decode (the last has no value).
    for payload in [
        Some(r#"{"ts": 1000, "host": "a", "cpu": 1}"#),
        Some("not json"),
        None,
    ] {
        let mut record = BaseRecord::<str, str>::to("metrics").key("a");
        if let Some(p) = payload {
            record = record.payload(p);
        }
        producer.send(record).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--addr", "127.0.0.1:0"]);
    let started = statements(
        &server,
        &format!(
            "CREATE STREAM gone (ts TIMESTAMP, host TEXT, WATERMARK FOR ts AS ts)
               WITH (connector = 'kafka', bootstrap = '127.0.0.1:{closed}', topic = 'metrics');
             CREATE STREAM read (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
               WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = 'metrics');
             CREATE STREAM events (ts TIMESTAMP, host TEXT) WITH (connector = 'push');
             CREATE SINK out WITH (connector = 'kafka', bootstrap = '127.0.0.1:{closed}',
               topic = 'out', delivery = 'at_least_once');
             SELECT host, count(*) FROM TUMBLE(gone, ts, INTERVAL '1' MINUTE)
               GROUP BY window_start, window_end, host;
             SELECT host, cpu FROM read;
             INSERT INTO out SELECT ts, host FROM events;"
        ),
    );
    assert_eq!(started.status, 200, "{}", started.body);
    let pushed = post(
        &server,
        "/streams/events/rows",
        Some("application/x-ndjson"),
        "{\"ts\": 1000, \"host\": \"a\"}\n",
    );
    assert_eq!(pushed.status, 200, "{}", pushed.body);

    let counts = || {
        let page = get(&server, "/metrics", None);
        assert_eq!(page.status, 200, "{}", page.body);
        let scrape = scrape(&page.body);
        (
            sum_of(
                &scrape,
                "vigil_query_input_errors_total",
                &[("stream", "gone")],
            ),
            sum_of(&scrape, "vigil_query_sink_errors_total", &[]),
            sum_of(
                &scrape,
                "vigil_query_input_bad_rows_total",
                &[("stream", "read")],
            ),
            sum_of(
                &scrape,
                "vigil_query_input_errors_total",
                &[("stream", "read")],
            ),
        )
    };
    let mut first = (0.0, 0.0, 0.0, 0.0);
    let counted = crate::kafka::wait_until(WAIT, || {
        first = counts();
        first.0 > 0.0 && first.1 > 0.0 && first.2 == 2.0
    });
    assert!(counted, "{first:?}\n{}", server.stderr());
    // The reachable stream met no error.
    assert_eq!(first.3, 0.0, "{first:?}");
    // The broker stays unreachable: the stream's counter keeps rising as
    // it retries (librdkafka reports the same connection failure at most
    // every 30 s, so the sink's may not yet), the service keeps answering
    // and the queries keep running.
    let rising = crate::kafka::wait_until(WAIT, || counts().0 > first.0);
    assert!(rising, "{first:?} then {:?}\n{}", counts(), server.stderr());
    assert_eq!(get(&server, "/health", None).status, 200);
    let page = get(&server, "/metrics", None);
    assert_eq!(
        value_of(&scrape(&page.body), "vigil_running_queries", &[]),
        3.0
    );
    assert!(
        server.stderr().contains("stream gone: kafka:"),
        "{}",
        server.stderr()
    );
    assert!(
        server.stderr().contains("sink out: kafka:"),
        "{}",
        server.stderr()
    );
}

#[test]
fn pushed_rows_decode_nested_columns() {
    let dir = tempfile::tempdir().expect("temp dir");
    let setup = "CREATE STREAM samples (ts TIMESTAMP, labels MAP<TEXT, TEXT>, \
                 point STRUCT<x BIGINT, tags ARRAY<TEXT>>, WATERMARK FOR ts AS ts) \
                 WITH (connector = 'push');";
    std::fs::write(dir.path().join("setup.sql"), setup).expect("write script");
    let server = Server::start(
        dir.path(),
        &["--addr", "127.0.0.1:0", "--token", TOKEN, "setup.sql"],
    );
    let started = statements(
        &server,
        "SELECT labels['instance'] AS instance, point.x AS x, point.tags[1] AS tag, labels \
         FROM samples;",
    );
    assert_eq!(started.status, 200, "{}", started.body);
    let result = &started.json()["results"][0];
    assert_eq!(
        result["columns"][3],
        json!({"name": "labels", "type": "MAP<TEXT, TEXT>"})
    );
    let id = result["id"].as_u64().expect("an id");
    let rows = follow(&server, &format!("/queries/{id}/results"));

    let pushed = post(
        &server,
        "/streams/samples/rows",
        Some("application/x-ndjson"),
        "{\"ts\": 1000, \"labels\": {\"instance\": \"i1\"}, \"point\": {\"x\": 1, \"tags\": [\"a\"]}}\n\
         {\"ts\": 2000, \"labels\": {\"instance\": 7}}\n",
    );
    assert_eq!(pushed.status, 200, "{}", pushed.body);
    assert_eq!(pushed.json()["rows"], 1, "{}", pushed.body);
    assert_eq!(
        pushed.json()["bad_rows"][0]["reason"],
        "column labels: key 'instance': expected TEXT, found number 7"
    );
    assert_eq!(
        next_matching(&rows, "result", |_, _| true),
        json!({"instance": "i1", "x": 1, "tag": "a", "labels": {"instance": "i1"}})
    );

    let pushed = post(
        &server,
        "/streams/samples/rows",
        Some("text/csv"),
        "ts,labels,point\n3000,\"{\"\"instance\"\": \"\"i2\"\"}\",\"{\"\"x\"\": 2}\"\n4000,,[1]\n",
    );
    assert_eq!(pushed.status, 200, "{}", pushed.body);
    assert_eq!(pushed.json()["rows"], 1, "{}", pushed.body);
    assert_eq!(
        pushed.json()["bad_rows"][0]["reason"],
        "column point: expected STRUCT<x BIGINT, tags ARRAY<TEXT>>, found an array"
    );
    assert_eq!(
        next_matching(&rows, "result", |_, _| true),
        json!({"instance": "i2", "x": 2, "tag": null, "labels": {"instance": "i2"}})
    );
}

#[test]
fn a_pushed_control_stream_blocks_and_unblocks_keys_of_a_running_query() {
    let dir = tempfile::tempdir().expect("temp dir");
    let setup = "CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE, \
                 WATERMARK FOR ts AS ts) WITH (connector = 'push');
                 CREATE STREAM silences (ts TIMESTAMP, key TEXT, action TEXT, \
                 WATERMARK FOR ts AS ts) WITH (connector = 'push', idle_timeout = '1 second');";
    std::fs::write(dir.path().join("setup.sql"), setup).expect("write script");
    let server = Server::start(
        dir.path(),
        &["--addr", "127.0.0.1:0", "--token", TOKEN, "setup.sql"],
    );
    let started = statements(
        &server,
        "SELECT host, cpu FROM CONTROLLED(metrics, silences, host);",
    );
    assert_eq!(started.status, 200, "{}", started.body);
    let id = started.json()["results"][0]["id"].as_u64().expect("an id");
    let rows = follow(&server, &format!("/queries/{id}/results"));
    let push = |stream: &str, body: &str| {
        let path = format!("/streams/{stream}/rows");
        let pushed = post(&server, &path, Some("application/x-ndjson"), body);
        assert_eq!(pushed.status, 200, "{}", pushed.body);
    };
    let metric = |ts: i64, host: &str, cpu: f64| {
        format!("{{\"ts\": {ts}, \"host\": \"{host}\", \"cpu\": {cpu}}}\n")
    };
    // A silence of host a from time 0; the rows at 1 s wait for both
    // streams' watermark, which the quiet silences stop holding back
    // after their idle timeout: the results come once vigil finds them
    // idle. The streams' rows meet in the order they get there, and the
    // silences may be idle already (then the metrics' watermark alone
    // lets rows through): the silence must be in before the rows.
    push(
        "silences",
        "{\"ts\": 0, \"key\": \"a\", \"action\": \"block\"}\n",
    );
    wait_taken_in(&server, id, 1, 1.0);
    push(
        "metrics",
        &(metric(1000, "a", 1.5) + &metric(1000, "b", 2.5)),
    );
    push("metrics", &metric(2000, "a", 3.5));
    let result = |_: &str, _: &Value| true;
    assert_eq!(
        next_matching(&rows, "result", result),
        json!({"host": "b", "cpu": 2.5})
    );
    // Unblocked at 3 s: a's row at 2 s stays dropped, its row at 4 s goes.
    push(
        "silences",
        "{\"ts\": 3000, \"key\": \"a\", \"action\": \"unblock\"}\n",
    );
    wait_taken_in(&server, id, 1, 2.0);
    push(
        "metrics",
        &(metric(4000, "a", 4.5) + &metric(4000, "b", 5.5)),
    );
    push("metrics", &metric(5000, "b", 6.5));
    assert_eq!(
        next_matching(&rows, "result", result),
        json!({"host": "a", "cpu": 4.5})
    );
    assert_eq!(
        next_matching(&rows, "result", result),
        json!({"host": "b", "cpu": 5.5})
    );
}

/// Waits until query `id` has taken `rows` rows of its input `input` out
/// of the queue that feeds where its inputs meet (which takes from its
/// inputs' queues in the order their rows get there).
fn wait_taken_in(server: &Server, id: u64, input: usize, rows: f64) {
    let query = id.to_string();
    let deadline = Instant::now() + WAIT;
    loop {
        let page = get(server, "/metrics", Some(TOKEN)).body;
        let scrape = scrape(&page);
        let queues: Vec<&str> = scrape
            .samples
            .iter()
            .filter(|s| s.metric == "vigil_queue_received_rows_total")
            .filter(|s| s.labels.get("query") == Some(query.as_str()))
            .filter_map(|s| s.labels.get("queue"))
            .collect();
        let queue = meeting_queue(&queues, input);
        let taken = value_of(
            &scrape,
            "vigil_queue_received_rows_total",
            &[("query", &query), ("queue", &queue)],
        );
        if taken >= rows {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "query {id} took {taken} of {rows} rows of input {input} out of {queue}:\n{page}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Of a query's queues (their labels in `GET /metrics`), the one that
/// takes input `input`'s rows to where the inputs meet: the one after the
/// input's last stage (`in1.s1`, or `in1.s1 gather` behind several
/// instances), or its source's (`in1 source`) when it has no stage.
fn meeting_queue(queues: &[&str], input: usize) -> String {
    let prefix = format!("in{input}.s");
    let stage = |q: &&str| {
        q.strip_prefix(&prefix)?
            .split(' ')
            .next()?
            .parse::<usize>()
            .ok()
    };
    let Some(last) = queues.iter().filter_map(stage).max() else {
        return format!("in{input} source");
    };
    let (after, gather) = (format!("{prefix}{last}"), format!("{prefix}{last} gather"));
    match queues.contains(&gather.as_str()) {
        true => gather,
        false => after,
    }
}

/// The members `GET /groups/cpu` lists: (member, partitions).
fn group_members(server: &Server) -> Vec<(String, Vec<i64>)> {
    let answer = get(server, "/groups/cpu", None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let status = answer.json();
    assert_eq!(status["group"], "cpu", "{status}");
    status["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let partitions = m["partitions"].as_array().unwrap().iter();
            let partitions = partitions.map(|p| p["partition"].as_i64().unwrap());
            (
                m["member"].as_str().unwrap().to_string(),
                partitions.collect(),
            )
        })
        .collect()
}

/// The arguments of `vigil serve` as a member of group `cpu` running
/// `q.sql`, checkpointing under `ck`.
const MEMBER_ARGS: &[&str] = &[
    "--addr",
    "127.0.0.1:0",
    "--group",
    "cpu",
    "--checkpoint-dir",
    "ck",
    "--checkpoint-interval",
    "200ms",
    "q.sql",
];

/// A mock cluster whose 4-partition topic `metrics` holds `seconds` of
/// `hosts` hosts' rows, and a directory whose `q.sql` runs the group
/// test's script over it into `out` and `alerts`.
fn group_of_a_topic(
    hosts: usize,
    seconds: usize,
) -> (
    rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    String,
    tempfile::TempDir,
) {
    use crate::kafka::{group_script, produce_hosts};
    let cluster = rdkafka::mocking::MockCluster::new(1).expect("the mock cluster starts");
    cluster.create_topic("metrics", 4, 1).unwrap();
    for topic in ["out", "alerts"] {
        cluster.create_topic(topic, 1, 1).unwrap();
    }
    let bootstrap = cluster.bootstrap_servers();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("q.sql"),
        group_script(&bootstrap, "out", "alerts", ""),
    )
    .unwrap();
    produce_hosts(&bootstrap, hosts, 0..seconds);
    (cluster, bootstrap, dir)
}

/// `vigil serve --group` is a member of a group beside a `vigil run
/// --group` process: the two share the topic's partitions, every result
/// reaches the Kafka sink once, and `GET /groups/{name}` lists both with
/// their partitions and lags; the service still answers HTTP, and leaves
/// the group on SIGTERM.
#[test]
fn a_service_is_a_member_of_a_group() {
    use crate::kafka::{data_results, expected_hosts, member, produce_closing_rows, wait_until};
    const HOSTS: usize = 8;
    const SECONDS: usize = 600;
    let (_cluster, bootstrap, dir) = group_of_a_topic(HOSTS, SECONDS);
    produce_closing_rows(&bootstrap, 4, SECONDS);
    let mut server = Server::start(dir.path(), MEMBER_ARGS);
    let mut other = member(dir.path(), "other");
    let other_stderr =
        || std::fs::read_to_string(dir.path().join("other.stderr")).unwrap_or_default();

    let want = expected_hosts(HOSTS, SECONDS);
    let complete = wait_until(Duration::from_secs(90), || {
        assert!(other.try_wait().unwrap().is_none(), "{}", other_stderr());
        data_results(&bootstrap).len() >= want.len()
    });
    assert!(
        complete,
        "results missing\nservice:\n{}\nother:\n{}",
        server.stderr(),
        other_stderr()
    );
    // Every result once (`data_results` checks), none missing, none wrong.
    assert_eq!(data_results(&bootstrap), want);

    // Both members, each partition held once, the service among them.
    let service = format!(":{}", server.pid());
    let shared = wait_until(Duration::from_secs(60), || {
        let members = group_members(&server);
        let mut held: Vec<i64> = members.iter().flat_map(|(_, p)| p.clone()).collect();
        held.sort();
        members.len() == 2
            && members.iter().all(|(_, p)| !p.is_empty())
            && members.iter().any(|(m, _)| m.ends_with(&service))
            && held == [0, 1, 2, 3]
    });
    assert!(
        shared,
        "the members do not share the partitions: {:?}\nservice:\n{}",
        group_members(&server),
        server.stderr()
    );
    // Its own pipelines ran, checkpointed under the shared directory.
    assert!(
        server.stderr().contains(": pipeline started"),
        "{}",
        server.stderr()
    );
    // Read to the end and checkpointed: no lag left.
    let caught_up = wait_until(Duration::from_secs(30), || {
        let status = get(&server, "/groups/cpu", None).json();
        status["members"].as_array().unwrap().iter().all(|m| {
            m["partitions"].as_array().unwrap().iter().all(|p| {
                p["lag"] == 0 && p["end_offset"].is_i64() && p["checkpoint_age_ms"].is_i64()
            })
        })
    });
    assert!(caught_up, "{}", get(&server, "/groups/cpu", None).body);
    // Another group, another directory, or none that is a group's.
    let nobody = get(&server, "/groups/nobody", None);
    assert_eq!(nobody.json()["members"], json!([]), "{}", nobody.body);
    let elsewhere = get(&server, "/groups/cpu?checkpoint_dir=nowhere", None);
    assert_eq!(elsewhere.status, 400, "{}", elsewhere.body);
    assert!(
        elsewhere.error().contains("cannot read"),
        "{}",
        elsewhere.body
    );
    let bad_url = get(
        &server,
        "/groups/cpu?checkpoint_dir=ftp%3A%2F%2Fh%2Fck",
        None,
    );
    assert_eq!(bad_url.status, 400, "{}", bad_url.body);
    assert!(
        bad_url.error().contains("unknown scheme"),
        "{}",
        bad_url.body
    );
    // The service goes on serving meanwhile.
    assert_eq!(get(&server, "/health", None).status, 200);
    assert_eq!(get(&server, "/metrics", None).status, 200);

    let status = server.terminate();
    assert!(status.success(), "{status}\n{}", server.stderr());
    assert!(
        server.stderr().contains("left group cpu"),
        "{}",
        server.stderr()
    );
}

/// The pipelines `vigil serve --group` runs as a member are in `GET
/// /metrics` like the service's own queries, by label (`q1-p0`): one per
/// partition it holds, their input rows adding up to the topic's.
#[test]
fn a_service_shows_its_group_pipelines_in_metrics() {
    use crate::kafka::wait_until;
    const HOSTS: usize = 8;
    const SECONDS: usize = 300;
    let (_cluster, _, dir) = group_of_a_topic(HOSTS, SECONDS);
    let server = Server::start(dir.path(), MEMBER_ARGS);
    let partitions = ["q1-p0", "q1-p1", "q1-p2", "q1-p3"];
    let mut read = 0.0;
    let shown = wait_until(Duration::from_secs(90), || {
        let page = get(&server, "/metrics", None);
        assert_eq!(page.status, 200, "{}", page.body);
        let scrape = scrape(&page.body);
        let listed = partitions.iter().all(|q| {
            scrape.samples.iter().any(|s| {
                s.metric == "vigil_query_rows_out_total" && s.labels.get("query") == Some(q)
            })
        });
        read = partitions
            .iter()
            .map(|q| sum_of(&scrape, "vigil_query_input_rows_total", &[("query", q)]))
            .sum();
        listed && read == (HOSTS * SECONDS) as f64
    });
    assert!(
        shown,
        "{read} rows read; metrics:\n{}\nstderr:\n{}",
        get(&server, "/metrics", None).body,
        server.stderr()
    );
    // The member's queries count among the running ones; the service runs
    // none of its own.
    let page = get(&server, "/metrics", None);
    let running = value_of(&scrape(&page.body), "vigil_running_queries", &[]);
    assert!(running >= partitions.len() as f64, "{}", page.body);
    // Its sinks are Kafka's: their error counters are there, at 0.
    let sink_errors = value_of(
        &scrape(&page.body),
        "vigil_query_sink_errors_total",
        &[("query", "q1-p0")],
    );
    assert_eq!(sink_errors, 0.0, "{}", page.body);
}

/// A script the group cannot run stops the service before it listens.
#[test]
fn a_service_refuses_a_group_script_it_would_answer_in_part() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("q.sql"),
        "CREATE STREAM local (ts TIMESTAMP, host TEXT, WATERMARK FOR ts AS ts) WITH (path = 'l.csv');
         SELECT host, count(*) FROM TUMBLE(local, ts, INTERVAL '1' MINUTE)
         GROUP BY window_start, window_end, host;",
    )
    .unwrap();
    std::fs::write(dir.path().join("l.csv"), "ts,host\n").unwrap();
    let out = support::run_within(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .current_dir(dir.path())
            .args([
                "serve",
                "--addr",
                "127.0.0.1:0",
                "--group",
                "g",
                "--checkpoint-dir",
                "ck",
                "q.sql",
            ]),
        WAIT,
        "vigil serve with a group script it cannot run",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("which is not a kafka stream"), "{stderr}");
    assert!(!stderr.contains("listening on"), "{stderr}");
}

/// A service in no group needs to be told where a group's checkpoints
/// are.
#[test]
fn a_group_status_needs_a_checkpoint_directory() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--addr", "127.0.0.1:0"]);
    let answer = get(&server, "/groups/cpu", None);
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(
        answer.error().contains("?checkpoint_dir="),
        "{}",
        answer.body
    );
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let answer = get(&server, "/groups/cpu?checkpoint_dir=empty", None);
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(
        answer.error().contains("is not a checkpoint directory"),
        "{}",
        answer.body
    );
}

/// Pushes JSON lines `body` into stream `ev`; fails unless taken.
fn push_ev(server: &Server, body: &str) {
    let pushed = post(
        server,
        "/streams/ev/rows",
        Some("application/x-ndjson"),
        body,
    );
    assert_eq!(pushed.status, 200, "{}", pushed.body);
}

/// A service with a token, keeping its state in `dir/state` with a
/// checkpoint every 200 ms.
fn durable_server(dir: &Path) -> Server {
    let args = [
        "--addr",
        "127.0.0.1:0",
        "--token",
        TOKEN,
        "--state-dir",
        "state",
        "--checkpoint-interval",
        "200ms",
    ];
    Server::start(dir, &args)
}

#[test]
fn a_running_query_is_rescaled_over_http_and_its_followers_miss_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = durable_server(dir.path());
    let setup = "CREATE STREAM ev (ts TIMESTAMP, host TEXT, v DOUBLE, \
                 WATERMARK FOR ts AS ts) WITH (connector = 'push');
                 SELECT window_end, host, count(*) AS n \
                 FROM TUMBLE(ev, ts, INTERVAL '10' SECOND) GROUP BY window_end, host;";
    let started = statements(&server, setup);
    assert_eq!(started.status, 200, "{}", started.body);
    let id = started.json()["results"][1]["id"].as_u64().expect("an id");
    let rows = follow(&server, &format!("/queries/{id}/results"));
    let push = |from: i64, to: i64| {
        let body: String = (from..to)
            .flat_map(|k| {
                ["a", "b"]
                    .map(|h| format!("{{\"ts\": {}, \"host\": \"{h}\", \"v\": 1}}\n", k * 1000))
            })
            .collect();
        push_ev(&server, &body);
    };
    push(0, 15);
    let changed = statements(&server, &format!("ALTER QUERY {id} SET parallelism = 2;"));
    assert_eq!(changed.status, 200, "{}", changed.body);
    let result = &changed.json()["results"][0];
    assert_eq!(result["kind"], "changed", "{result}");
    assert_eq!(result["id"].as_u64(), Some(id));
    assert_eq!(result["emptied"], json!([]), "{result}");
    let refused = statements(&server, "ALTER QUERY 42 SET parallelism = 2;");
    assert_eq!(refused.status, 400, "{}", refused.body);
    push(15, 25);
    push(40, 41);
    let mut counts = Vec::new();
    while counts.len() < 6 {
        let row = next_matching(&rows, "result", |name, _| name.is_empty());
        counts.push((
            row["host"].as_str().unwrap().to_string(),
            row["n"].as_u64().unwrap(),
        ));
    }
    counts.sort();
    let expected: Vec<(String, u64)> = ["a", "b"]
        .iter()
        .flat_map(|h| [10, 10, 5].map(|n| (h.to_string(), n)))
        .collect();
    let mut expected = expected;
    expected.sort();
    assert_eq!(
        counts, expected,
        "each window whole and once, across the change"
    );
}

/// `SET autoscale = 'on'` in the service: its controller measures the
/// running query and rescales it (here to `autoscale.min`, whatever the
/// rate), and `/metrics` shows where it stands.
#[test]
fn the_service_rescales_an_autoscaled_query_and_shows_it_in_its_metrics() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = durable_server(dir.path());
    let setup = "CREATE STREAM ev (ts TIMESTAMP, host TEXT, v DOUBLE, \
                 WATERMARK FOR ts AS ts) WITH (connector = 'push');
                 SET parallelism = 1; SET autoscale = 'on'; SET autoscale.min = 2;
                 SET autoscale.max = 2; SET autoscale.interval = '500ms';
                 SELECT window_end, host, count(*) AS n \
                 FROM TUMBLE(ev, ts, INTERVAL '1' SECOND) GROUP BY window_end, host;";
    let started = statements(&server, setup);
    assert_eq!(started.status, 200, "{}", started.body);
    let wanted = "vigil_autoscale_rescales_total{query=\"1\",direction=\"up\",outcome=\"made\"} 1";
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut k = 0;
    let page = loop {
        let body: String = (0..20)
            .map(|i| format!("{{\"ts\": {}, \"host\": \"h{i}\", \"v\": 1}}\n", k * 100))
            .collect();
        push_ev(&server, &body);
        k += 1;
        let page = get(&server, "/metrics", Some(TOKEN)).body;
        if page.lines().any(|l| l == wanted) || std::time::Instant::now() > deadline {
            break page;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(page.lines().any(|l| l == wanted), "{page}");
    assert!(
        page.lines()
            .any(|l| l == "vigil_autoscale_parallelism{query=\"1\"} 2"),
        "{page}"
    );
    assert!(
        page.contains("vigil_autoscale_offered_rows_per_second{query=\"1\"}"),
        "{page}"
    );
    // Restarted, the service runs the query at the parallelism the
    // controller chose, from its statement log: at 2 without a rescale of
    // its own (at 1, or rescaled again, the log would not have said so).
    let mut server = server;
    assert!(server.terminate().success(), "{}", server.stderr());
    let server = durable_server(dir.path());
    let page = get(&server, "/metrics", Some(TOKEN)).body;
    assert!(
        page.lines()
            .any(|l| l == "vigil_autoscale_parallelism{query=\"1\"} 2"),
        "{page}\n{}",
        server.stderr()
    );
    assert!(!page.lines().any(|l| l == wanted), "{page}");
    // And it goes on giving results.
    let rows = follow(&server, "/queries/1/results");
    let body = "{\"ts\": 900000, \"host\": \"x\", \"v\": 1}\n\
                {\"ts\": 900100, \"host\": \"x\", \"v\": 1}\n\
                {\"ts\": 905000, \"host\": \"y\", \"v\": 1}\n";
    push_ev(&server, body);
    let row = next_matching(&rows, "result", |_, row| row["host"] == "x");
    assert_eq!(row["n"].as_u64(), Some(2), "{row}");
}

/// `ALTER ALERT` over `POST /statements`: the running alert takes the new
/// severity and keeps its firing episode (no second `firing`); the
/// statement log records the change, so a restarted service comes back
/// with it.
#[test]
fn an_alert_altered_over_http_keeps_its_episode_and_a_restart_keeps_the_change() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = durable_server(dir.path());
    let setup = "CREATE STREAM ev (ts TIMESTAMP, host TEXT, cpu DOUBLE, \
                 WATERMARK FOR ts AS ts) WITH (connector = 'push');
                 CREATE ALERT hot AS SELECT ts, host, cpu FROM ev \
                 ALERT BY host WHEN cpu > 90 SEVERITY 'warning';";
    let started = statements(&server, setup);
    assert_eq!(started.status, 200, "{}", started.body);
    let id = started.json()["results"][1]["id"].as_u64().expect("an id");
    let rows = follow(&server, &format!("/queries/{id}/results"));
    let push = push_ev;
    push(&server, "{\"ts\": 1000, \"host\": \"a\", \"cpu\": 95}\n");
    let firing = next_matching(&rows, "firing", |_, row| row["state"] == "firing");
    assert_eq!(firing["severity"], "warning", "{firing}");
    let changed = statements(&server, "ALTER ALERT hot SET SEVERITY 'page';");
    assert_eq!(changed.status, 200, "{}", changed.body);
    let result = &changed.json()["results"][0];
    assert_eq!(result["kind"], "changed", "{result}");
    assert_eq!(result["emptied"], json!([]), "{result}");
    // Still firing, still one episode: the next change is its resolution,
    // under the new severity.
    push(&server, "{\"ts\": 2000, \"host\": \"a\", \"cpu\": 96}\n");
    push(&server, "{\"ts\": 3000, \"host\": \"a\", \"cpu\": 10}\n");
    let next = next_matching(&rows, "a change", |_, row| row["state"].is_string());
    assert_eq!(next["state"], "resolved", "{next}");
    assert_eq!(next["severity"], "page", "{next}");

    let mut server = server;
    assert!(server.terminate().success(), "{}", server.stderr());
    let server = durable_server(dir.path());
    let rows = follow(&server, &format!("/queries/{id}/results"));
    push(&server, "{\"ts\": 4000, \"host\": \"b\", \"cpu\": 99}\n");
    let after = next_matching(&rows, "firing after the restart", |_, row| {
        row["state"] == "firing" && row["host"] == "b"
    });
    assert_eq!(after["severity"], "page", "{after}\n{}", server.stderr());
}
