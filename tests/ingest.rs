//! The push protocols of `vigil serve` and the `remote_write` sink, with
//! the real senders and receivers: Prometheus scraping node_exporter and
//! remote-writing to vigil, vigil remote-writing into Prometheus, the
//! OpenTelemetry Python SDK's OTLP/HTTP exporter, and line protocol as
//! Telegraf writes it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::service::{Server, SseEvent, TOKEN, agent, bearer, follow, next_matching, statements};
use super::stack;
use super::support;

const WAIT: Duration = Duration::from_secs(90);

/// `vigil serve` with the token and `setup` as its startup script.
fn serve(dir: &Path, setup: &str) -> Server {
    std::fs::write(dir.join("setup.sql"), setup).expect("write setup.sql");
    Server::start(
        dir,
        &["--addr", "127.0.0.1:0", "--token", TOKEN, "setup.sql"],
    )
}

/// Starts `sql` (one query) and follows its results.
fn follow_query(server: &Server, sql: &str) -> Receiver<SseEvent> {
    let answer = statements(server, sql);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let id = answer.json()["results"][0]["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no query id: {}", answer.body));
    follow(server, &format!("/queries/{id}/results"))
}

/// Result rows from `events` until `done` says there are enough.
fn rows_until(events: &Receiver<SseEvent>, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    let mut rows = Vec::new();
    while !done(&rows) {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok((_, data)) => rows.push(serde_json::from_str(&data).expect("JSON row")),
            Err(e) => panic!("rows stopped ({e:?}) after {rows:?}"),
        }
    }
    rows
}

/// POSTs `body` with `headers`; status and body text.
fn post_raw(server: &Server, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    let mut request = agent(Some(WAIT)).post(server.url(path));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let (parts, mut body) = request.send(body).expect("the server answers").into_parts();
    (
        parts.status.as_u16(),
        body.read_to_string().unwrap_or_default(),
    )
}

/// `GET /queries` as JSON.
fn queries(server: &Server) -> Value {
    let mut response = agent(Some(WAIT))
        .get(server.url("/queries"))
        .header("authorization", bearer(TOKEN))
        .call()
        .expect("the server answers");
    serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap()
}

/// The bad rows counted on `stream` by the running queries reading it.
fn bad_rows(server: &Server, stream: &str) -> u64 {
    queries(server)["queries"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|q| q["sources"].as_array().cloned().unwrap_or_default())
        .filter(|s| s["stream"] == stream)
        .map(|s| s["bad_rows"].as_u64().unwrap())
        .max()
        .unwrap_or(0)
}

#[test]
fn prometheus_remote_writes_node_exporter_samples_and_a_vigil_alert_fires() {
    let node = stack::node_exporter();
    let dir = tempfile::tempdir().unwrap();
    let server = serve(
        dir.path(),
        "CREATE STREAM prom (ts TIMESTAMP, job TEXT, instance TEXT, name TEXT, value DOUBLE,
           WATERMARK FOR ts AS ts - INTERVAL '3' SECOND)
         WITH (connector = 'remote_write');",
    );
    let alerts = follow(&server, "/alerts");
    let samples = follow_query(
        &server,
        "SELECT ts, job, instance, name, value FROM prom
         WHERE name = 'node_memory_MemTotal_bytes'",
    );
    let alert = statements(
        &server,
        "CREATE ALERT memory_seen AS
           SELECT window_end, instance, max(value) AS total
           FROM TUMBLE(prom, ts, INTERVAL '2' SECOND)
           WHERE name = 'node_memory_MemTotal_bytes'
           GROUP BY window_end, instance
         ALERT WHEN total > 0 MESSAGE '{instance} has {total:.0} bytes';",
    );
    assert_eq!(alert.status, 200, "{}", alert.body);

    let config = format!(
        "global:\n  scrape_interval: 1s\n\
         scrape_configs:\n  - job_name: node\n    static_configs:\n      - targets: ['{}']\n\
         remote_write:\n  - url: {}\n    authorization:\n      credentials: {TOKEN}\n\
         \x20   queue_config:\n      batch_send_deadline: 1s\n",
        node.address(),
        server.url("/api/v1/write"),
    );
    let prometheus = stack::prometheus(&config, &[]);

    let row = next_matching(&samples, "remote-written sample", |_, row| {
        row["name"] == "node_memory_MemTotal_bytes"
    });
    let context = || format!("{}\n{}", prometheus.log(), server.stderr());
    assert_eq!(row["job"], "node", "{row}\n{}", context());
    assert_eq!(row["instance"], node.address().as_str(), "{row}");
    assert!(row["value"].as_f64().unwrap() > 0.0, "{row}");

    let fired = next_matching(&alerts, "firing alert", |name, row| {
        name == "alert" && row["alert"] == "memory_seen" && row["state"] == "firing"
    });
    assert_eq!(fired["instance"], node.address().as_str(), "{fired}");
    assert!(
        fired["message"].as_str().unwrap().contains("bytes"),
        "{fired}"
    );
    assert_eq!(bad_rows(&server, "prom"), 0, "{}", context());
}

#[test]
fn remote_write_refuses_what_does_not_decode_and_counts_malformed_series() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(
        dir.path(),
        "CREATE STREAM prom (ts TIMESTAMP, name TEXT, instance TEXT, value DOUBLE)
           WITH (connector = 'remote_write');",
    );
    let rows = follow_query(&server, "SELECT name, instance, value FROM prom");
    let auth = bearer(TOKEN);
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/x-protobuf"),
        ("content-encoding", "snappy"),
        ("x-prometheus-remote-write-version", "0.1.0"),
    ];
    let (status, body) = post_raw(&server, "/api/v1/write", &headers, b"not snappy");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("snappy"), "{body}");

    // A request as Prometheus builds it: one good series, one without a
    // name, one staleness marker.
    let request = remote_write_request(&[
        (&[("__name__", "up"), ("instance", "a:1")], 1.0),
        (&[("instance", "b:1")], 2.0),
        (
            &[("__name__", "up"), ("instance", "c:1")],
            f64::from_bits(0x7ff0_0000_0000_0002),
        ),
    ]);
    let (status, body) = post_raw(&server, "/api/v1/write", &headers, &request);
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (answer["samples"].as_u64(), answer["bad"].as_u64()),
        (Some(1), Some(1))
    );
    let got = rows_until(&rows, |r| !r.is_empty());
    assert_eq!(got[0]["instance"], "a:1");
    assert_eq!(bad_rows(&server, "prom"), 1);

    let unauthorized = post_raw(&server, "/api/v1/write", &headers[1..], &request);
    assert_eq!(unauthorized.0, 401);
    let (status, body) = post_raw(&server, "/api/v1/write?stream=nope", &headers, &request);
    assert_eq!(status, 404, "{body}");
}

/// An HTTP endpoint that takes connections and never answers, holding a
/// webhook-style sink (and so its query) for as long as the test runs.
fn silent_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    format!("http://{addr}/api/v1/write")
}

#[test]
fn remote_write_answers_429_with_retry_after_while_the_queries_are_behind() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("setup.sql"),
        format!(
            "CREATE STREAM prom (ts TIMESTAMP, name TEXT, instance TEXT, value DOUBLE)
               WITH (connector = 'remote_write');
             CREATE SINK stuck WITH (connector = 'remote_write', url = '{}', timeout = '10min');
             INSERT INTO stuck SELECT ts, instance, value FROM prom;",
            silent_endpoint()
        ),
    )
    .unwrap();
    let args = [
        "--addr",
        "127.0.0.1:0",
        "--token",
        TOKEN,
        "--ingest-timeout",
        "200ms",
    ];
    let server = Server::start(dir.path(), &[&args[..], &["setup.sql"]].concat());
    let names: Vec<String> = (0..1000).map(|i| format!("h{i}:9100")).collect();
    let labels: Vec<[(&str, &str); 2]> = names
        .iter()
        .map(|n| [("__name__", "up"), ("instance", n.as_str())])
        .collect();
    let request = remote_write_request(&labels.iter().map(|l| (&l[..], 1.0)).collect::<Vec<_>>());
    let auth = bearer(TOKEN);
    let headers = [
        ("authorization", auth.as_str()),
        ("content-encoding", "snappy"),
    ];
    let mut answers = Vec::new();
    for _ in 0..300 {
        let (parts, mut body) = agent(Some(WAIT))
            .post(server.url("/api/v1/write"))
            .header("authorization", auth.as_str())
            .header("content-encoding", "snappy")
            .send(&request[..])
            .expect("the server answers")
            .into_parts();
        let status = parts.status.as_u16();
        let retry = parts.headers.get("retry-after").cloned();
        let body = body.read_to_string().unwrap_or_default();
        answers.push(status);
        if status == 429 {
            let retry = retry.expect("429 carries Retry-After");
            assert!(retry.to_str().unwrap().parse::<u64>().unwrap() >= 1);
            assert!(body.contains("error"), "{body}");
            // The service still answers, and the body check still runs.
            let (status, _) = post_raw(&server, "/api/v1/write", &headers, b"junk");
            assert_eq!(status, 400);
            return;
        }
        assert_eq!(status, 204, "{body}");
    }
    panic!(
        "no 429 in {} requests: {answers:?}\n{}",
        answers.len(),
        server.stderr()
    );
}

/// A snappy-compressed `WriteRequest` of one sample per series, encoded
/// here by hand (protobuf wire format) so the test does not share vigil's
/// encoder.
fn remote_write_request(series: &[(&[(&str, &str)], f64)]) -> Vec<u8> {
    fn field(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
        out.push(tag << 3 | 2);
        let mut len = bytes.len();
        while len >= 0x80 {
            out.push((len as u8) | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
        out.extend_from_slice(bytes);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut request = Vec::new();
    for (labels, value) in series {
        let mut ts = Vec::new();
        for (name, label) in labels.iter() {
            let mut l = Vec::new();
            field(&mut l, 1, name.as_bytes());
            field(&mut l, 2, label.as_bytes());
            field(&mut ts, 1, &l);
        }
        let mut sample = vec![1 << 3 | 1];
        sample.extend_from_slice(&value.to_le_bytes());
        sample.push(2 << 3);
        let mut t = now;
        while t >= 0x80 {
            sample.push((t as u8) | 0x80);
            t >>= 7;
        }
        sample.push(t as u8);
        field(&mut ts, 2, &sample);
        field(&mut request, 1, &ts);
    }
    snap::raw::Encoder::new().compress_vec(&request).unwrap()
}

#[test]
fn a_windowed_aggregate_written_into_prometheus_reads_back_through_its_api() {
    let prometheus = stack::prometheus(
        "global:\n  scrape_interval: 15s\n",
        &["--web.enable-remote-write-receiver"],
    );
    let dir = tempfile::tempdir().unwrap();
    // Samples of the last minute: Prometheus takes recent samples only.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let start = (now - 120) / 10 * 10;
    let mut csv = String::from("ts,host,cpu\n");
    for i in 0..40 {
        let t = (start + i) * 1000;
        csv.push_str(&format!("{t},a,{}\n", 10 + i % 10));
        csv.push_str(&format!("{t},b,{}\n", 50 + i % 10));
    }
    std::fs::write(dir.path().join("cpu.csv"), csv).unwrap();
    let script = format!(
        "CREATE STREAM cpu (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
           WITH (path = 'cpu.csv');
         CREATE SINK prom WITH (connector = 'remote_write', url = '{}',
           metric_prefix = 'vigil_', label_job = 'vigil');
         INSERT INTO prom
         SELECT window_end, host, avg(cpu) AS cpu_avg, count(*) AS samples
         FROM TUMBLE(cpu, ts, INTERVAL '10' SECOND)
         GROUP BY window_end, host;",
        prometheus.url("/api/v1/write")
    );
    std::fs::write(dir.path().join("rec.sql"), script).unwrap();
    let run = support::run_within(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["run", "rec.sql"])
            .current_dir(dir.path()),
        Duration::from_secs(120),
        "vigil run rec.sql (remote_write into Prometheus)",
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(
        stderr.contains("sink prom: delivered=") && stderr.contains("failed=0"),
        "{stderr}\n{}",
        prometheus.log()
    );

    // The window [start, start+10s) of host a averages 10..19.
    let at = start + 10;
    let query = |q: &str| -> Value {
        let url = prometheus.url("/api/v1/query");
        let mut response = agent(Some(WAIT))
            .get(&url)
            .query("query", q)
            .query("time", at.to_string())
            .call()
            .expect("Prometheus answers");
        serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap()
    };
    let answer = query("vigil_cpu_avg{host=\"a\",job=\"vigil\"}");
    let result = &answer["data"]["result"];
    assert_eq!(result.as_array().map(Vec::len), Some(1), "{answer}");
    assert_eq!(result[0]["value"][0].as_f64(), Some(at as f64), "{answer}");
    assert_eq!(result[0]["value"][1], "14.5", "{answer}");
    let answer = query("sum(vigil_samples)");
    assert_eq!(answer["data"]["result"][0]["value"][1], "20", "{answer}");
}

/// The environment variable naming a Python with the OpenTelemetry SDK
/// and its OTLP/HTTP exporter, for [`otel_python`].
const OTEL_PYTHON_VAR: &str = "VIGIL_TEST_OTEL_PYTHON";

/// A Python with the OpenTelemetry SDK and its OTLP/HTTP exporter:
/// `$VIGIL_TEST_OTEL_PYTHON`, else the venv `.ci/run` makes in
/// `$HOME/.cache/vigil/otel-venv` from `tests/requirements-otel.txt`. The
/// test installs nothing (no network at test time): without that Python it
/// fails with the line that makes it.
fn otel_python() -> PathBuf {
    const VENV: &str = "$HOME/.cache/vigil/otel-venv";
    let python = match std::env::var_os(OTEL_PYTHON_VAR) {
        Some(python) => PathBuf::from(python),
        None => {
            let home = std::env::var_os("HOME").expect("HOME is set");
            PathBuf::from(home).join(".cache/vigil/otel-venv/bin/python")
        }
    };
    let install = format!(
        "make it with (at the repository's root):\n  \
         python3 -m venv {VENV} && {VENV}/bin/pip install -r tests/requirements-otel.txt\n\
         or set {OTEL_PYTHON_VAR} to a Python with those packages"
    );
    assert!(
        python.exists(),
        "no Python for the OpenTelemetry test at {}; {install}",
        python.display()
    );
    let check = support::run_within(
        Command::new(&python).args([
            "-c",
            "import opentelemetry.sdk.metrics, opentelemetry.exporter.otlp.proto.http",
        ]),
        Duration::from_secs(60),
        "python importing the OpenTelemetry SDK",
    );
    assert!(
        check.status.success(),
        "{} cannot import the OpenTelemetry SDK and its OTLP/HTTP exporter ({}); {install}",
        python.display(),
        String::from_utf8_lossy(&check.stderr).trim()
    );
    python
}

/// Sends a counter, a histogram and a gauge through the SDK's exporter.
const OTEL_SCRIPT: &str = r#"
import sys
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.metrics import Observation
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

endpoint, token = sys.argv[1], sys.argv[2]
exporter = OTLPMetricExporter(endpoint=endpoint, headers={"Authorization": "Bearer " + token})
reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3600000)
resource = Resource.create({"service.name": "shop", "service.instance.id": "pod-1"})
provider = MeterProvider(resource=resource, metric_readers=[reader])
meter = provider.get_meter("checkout")
meter.create_counter("orders").add(3, {"region": "eu"})
latency = meter.create_histogram("latency", unit="s")
latency.record(0.2, {"region": "eu"})
latency.record(0.7, {"region": "eu"})
meter.create_observable_gauge("queue_depth", callbacks=[lambda options: [Observation(7, {"queue": "q1"})]])
ok = provider.force_flush(30000)
provider.shutdown()
print("flushed" if ok else "not flushed")
"#;

#[test]
fn the_opentelemetry_sdk_exporter_sends_rows_to_an_otlp_stream() {
    let python = otel_python();
    let dir = tempfile::tempdir().unwrap();
    let server = serve(
        dir.path(),
        "CREATE STREAM otel (ts TIMESTAMP, job TEXT, instance TEXT, name TEXT, kind TEXT,
           temporality TEXT, value DOUBLE)
         WITH (connector = 'otlp');",
    );
    let rows = follow_query(
        &server,
        "SELECT name, job, instance, kind, temporality, value FROM otel",
    );
    std::fs::write(dir.path().join("send.py"), OTEL_SCRIPT).unwrap();
    let sent = support::run_within(
        Command::new(&python)
            .arg("send.py")
            .arg(server.url("/v1/metrics"))
            .arg(TOKEN)
            .current_dir(dir.path()),
        Duration::from_secs(120),
        "the OpenTelemetry SDK script send.py",
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&sent.stdout),
        String::from_utf8_lossy(&sent.stderr)
    );
    assert!(sent.status.success(), "{said}");
    let names = |rows: &[Value]| -> Vec<String> {
        rows.iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect()
    };
    let got = rows_until(&rows, |r| {
        let n = names(r);
        ["orders", "latency_count", "latency_sum", "queue_depth"]
            .iter()
            .all(|w| n.iter().any(|x| x == w))
    });
    let find = |name: &str| got.iter().find(|r| r["name"] == name).unwrap().clone();
    let orders = find("orders");
    assert_eq!(
        (
            &orders["job"],
            &orders["instance"],
            &orders["kind"],
            &orders["value"]
        ),
        (&"shop".into(), &"pod-1".into(), &"sum".into(), &3.0.into()),
        "{said}"
    );
    assert_eq!(orders["temporality"], "cumulative");
    assert_eq!(find("latency_count")["value"], 2.0);
    assert!((find("latency_sum")["value"].as_f64().unwrap() - 0.9).abs() < 1e-9);
    assert_eq!(find("queue_depth")["kind"], "gauge");
    let buckets = got.iter().filter(|r| r["name"] == "latency_bucket").count();
    assert!(buckets > 2, "{got:?}");
    assert_eq!(bad_rows(&server, "otel"), 0);
}

#[test]
fn otlp_json_with_a_bad_point_answers_partial_success() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(
        dir.path(),
        "CREATE STREAM otel (ts TIMESTAMP, name TEXT, value DOUBLE) WITH (connector = 'otlp');",
    );
    let rows = follow_query(&server, "SELECT name, value FROM otel");
    let auth = bearer(TOKEN);
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    let body = r#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[
        {"name":"temp","gauge":{"dataPoints":[
          {"timeUnixNano":"1700000000000000000","asDouble":21.5},
          {"timeUnixNano":"1700000000000000000"}]}}]}]}]}"#;
    let (status, answer) = post_raw(&server, "/v1/metrics", &headers, body.as_bytes());
    assert_eq!(status, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(
        answer["partialSuccess"]["rejectedDataPoints"], 1,
        "{answer}"
    );
    let got = rows_until(&rows, |r| !r.is_empty());
    assert_eq!(
        (&got[0]["name"], &got[0]["value"]),
        (&"temp".into(), &21.5.into())
    );
    let (status, answer) = post_raw(&server, "/v1/metrics", &headers, b"{not json");
    assert_eq!(status, 400, "{answer}");
    let plain = [
        ("authorization", auth.as_str()),
        ("content-type", "text/plain"),
    ];
    assert_eq!(post_raw(&server, "/v1/metrics", &plain, b"x").0, 415);
}

/// Line protocol as Telegraf's cpu, mem, system and disk inputs write it
/// (tags sorted, integers with `i`, nanosecond timestamps), with two lines
/// that are not valid among them.
const TELEGRAF: &str = "\
cpu,cpu=cpu0,host=h usage_idle=98.5,usage_user=1.2 1700000000000000000
cpu,cpu=cpu-total,host=h usage_guest=0,usage_idle=97.1,usage_iowait=0.2,usage_system=1.1,usage_user=1.6 1700000000000000000
mem,host=h available=6012342272i,available_percent=71.3,total=8430559232i,used=2418216960i 1700000000000000000
system,host=h load1=0.52,load15=0.41,load5=0.47,n_cpus=2i,n_users=1i 1700000000000000000
cpu,cpu=cpu0,host=h usage_idle=\"lots\" 1700000001000000000
system,host=h uptime_format=\"0 days,  1:00\" 1700000000000000000
disk,device=sda1,fstype=ext4,host=h,mode=rw,path=/ free=1000i,total=2000i,used=1000i,used_percent=50 1700000000000000000
garbage without fields
cpu,cpu=cpu0,host=h usage_idle=98.0,usage_user=1.5 1700000010000000000
";

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn line_protocol_as_telegraf_writes_it_arrives_as_rows_with_bad_lines_counted() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(
        dir.path(),
        "CREATE STREAM telegraf (ts TIMESTAMP, measurement TEXT, host TEXT, cpu TEXT,
           usage_idle DOUBLE, used BIGINT)
         WITH (connector = 'influx');",
    );
    let rows = follow_query(
        &server,
        "SELECT ts, measurement, host, cpu, usage_idle, used FROM telegraf",
    );
    // As outputs.influxdb_v2 sends it: gzip, the token as `Token`.
    let token = format!("Token {TOKEN}");
    let body = gzip(TELEGRAF.as_bytes());
    let headers = [
        ("authorization", token.as_str()),
        ("content-type", "text/plain; charset=utf-8"),
        ("content-encoding", "gzip"),
        ("user-agent", "Telegraf/1.28.5 Go/1.21.4"),
    ];
    let path = "/api/v2/write?bucket=telegraf&org=vigil&precision=ns";
    let (status, answer) = post_raw(&server, path, &headers, &body);
    assert_eq!(status, 204, "{answer}");
    let got = rows_until(&rows, |r| r.len() >= 7);
    assert_eq!(got[0]["measurement"], "cpu");
    assert_eq!(got[0]["cpu"], "cpu0");
    assert_eq!(got[0]["usage_idle"], 98.5);
    assert_eq!(got[0]["ts"], "2023-11-14T22:13:20");
    assert_eq!(got[2]["used"], 2418216960u64);
    assert_eq!(got[6]["usage_idle"], 98.0);
    assert_eq!(bad_rows(&server, "telegraf"), 2);

    // outputs.influxdb (1.x): no compression, precision in seconds.
    let auth = bearer(TOKEN);
    let v1 = [("authorization", auth.as_str())];
    let line = b"cpu,cpu=cpu1,host=h2 usage_idle=50 1700000020\n";
    let (status, answer) = post_raw(&server, "/write?db=telegraf&precision=s", &v1, line);
    assert_eq!(status, 204, "{answer}");
    let got = rows_until(&rows, |r| !r.is_empty());
    assert_eq!(
        (&got[0]["host"], &got[0]["ts"]),
        (&"h2".into(), &"2023-11-14T22:13:40".into())
    );

    // Nothing valid: 400 with InfluxDB's error body.
    let (status, answer) = post_raw(&server, path, &headers[..2], b"no fields here\n");
    assert_eq!(status, 400, "{answer}");
    let error: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(error["code"], "invalid", "{answer}");
    assert!(
        error["message"].as_str().unwrap().contains("line 1"),
        "{answer}"
    );
}
