use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use datafusion::arrow::array::{Array, AsArray, MapArray};
use datafusion::arrow::datatypes::{Field, Float64Type, Schema, TimestampMillisecondType};

use super::super::catalogue::full_schema;
use super::super::test_server::serve;
use super::super::{Format, Replay, SourceLocation};
use super::*;

/// The example page of Prometheus's exposition format documentation,
/// with more of what pages hold.
const PAGE: &str = r#"# HELP http_requests_total The total number of HTTP requests.
# TYPE http_requests_total counter
http_requests_total{method="post",code="200"} 1027 1395066363000
http_requests_total{method="post",code="400"}    3 1395066363000

# Escaping in label values:
msdos_file_access_time_seconds{path="C:\\DIR\\FILE.TXT",error="Cannot find file:\n\"FILE.TXT\""} 1.458255915e9

# Minimalistic line:
metric_without_timestamp_and_labels 12.47

# A weird metric from before the epoch:
something_weird{problem="division by zero"} +Inf -3982045

# A histogram, which has a pretty complex representation in the text format:
# HELP http_request_duration_seconds A histogram of the request duration.
# TYPE http_request_duration_seconds histogram
http_request_duration_seconds_bucket{le="0.05"} 24054
http_request_duration_seconds_bucket{le="0.1"} 33444
http_request_duration_seconds_bucket{le="+Inf"} 144320
http_request_duration_seconds_sum 53423
http_request_duration_seconds_count 144320

# Finally a summary, which has a complex representation, too:
# HELP rpc_duration_seconds A summary of the RPC duration in seconds.
# TYPE rpc_duration_seconds summary
rpc_duration_seconds{quantile="0.01"} 3102
rpc_duration_seconds{quantile="0.99"} 76656
rpc_duration_seconds_sum 1.7560473e+07
rpc_duration_seconds_count 2693
# TYPE g gauge
g{b="2",a="1,=}{",empty=""} NaN
g{job="page",instance="x",exported_job="y"} -Inf
job:rate:sum5m{} 0.5
untyped_value 7e-3
"#;

fn sample(name: &str, labels: &[(&str, &str)], value: f64, ts: Option<i64>) -> Sample {
    Sample {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        value,
        timestamp: ts,
    }
}

/// NaN is not equal to itself: compare through the bits.
fn same(a: &[Sample], b: &[Sample]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.name == y.name
                && x.labels == y.labels
                && x.timestamp == y.timestamp
                && x.value.to_bits() == y.value.to_bits()
        })
}

#[test]
fn a_page_flattens_as_prometheus_stores_it() {
    let page = parse_page(PAGE.as_bytes(), None);
    let bad: Vec<_> = page
        .bad
        .iter()
        .map(|b| (b.line, b.reason.clone()))
        .collect();
    let want = vec![
        sample(
            "http_requests_total",
            &[("code", "200"), ("method", "post")],
            1027.0,
            Some(1395066363000),
        ),
        sample(
            "http_requests_total",
            &[("code", "400"), ("method", "post")],
            3.0,
            Some(1395066363000),
        ),
        sample(
            "msdos_file_access_time_seconds",
            &[
                ("error", "Cannot find file:\n\"FILE.TXT\""),
                ("path", r"C:\DIR\FILE.TXT"),
            ],
            1.458255915e9,
            None,
        ),
        sample("metric_without_timestamp_and_labels", &[], 12.47, None),
        sample(
            "something_weird",
            &[("problem", "division by zero")],
            f64::INFINITY,
            Some(-3982045),
        ),
        sample(
            "http_request_duration_seconds_bucket",
            &[("le", "0.05")],
            24054.0,
            None,
        ),
        sample(
            "http_request_duration_seconds_bucket",
            &[("le", "0.1")],
            33444.0,
            None,
        ),
        sample(
            "http_request_duration_seconds_bucket",
            &[("le", "+Inf")],
            144320.0,
            None,
        ),
        sample("http_request_duration_seconds_sum", &[], 53423.0, None),
        sample("http_request_duration_seconds_count", &[], 144320.0, None),
        sample(
            "rpc_duration_seconds",
            &[("quantile", "0.01")],
            3102.0,
            None,
        ),
        sample(
            "rpc_duration_seconds",
            &[("quantile", "0.99")],
            76656.0,
            None,
        ),
        sample("rpc_duration_seconds_sum", &[], 1.7560473e7, None),
        sample("rpc_duration_seconds_count", &[], 2693.0, None),
        sample("g", &[("a", "1,=}{"), ("b", "2")], f64::NAN, None),
        sample(
            "g",
            &[
                ("exported_exported_job", "page"),
                ("exported_instance", "x"),
                ("exported_job", "y"),
            ],
            f64::NEG_INFINITY,
            None,
        ),
    ];
    assert!(
        same(&page.samples[..want.len()], &want),
        "{:#?}\nbad: {bad:?}",
        page.samples
    );
    // `{}` is valid Prometheus, but the parser crate wants a label in
    // braces: that line is a bad row, the line after it is kept.
    assert!(same(
        &page.samples[want.len()..],
        &[sample("untyped_value", &[], 7e-3, None)]
    ));
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].0, 34);
    assert!(bad[0].1.contains("job:rate:sum5m{}"), "{bad:?}");
    assert_eq!(page.scraped, want.len() as u64 + 1);
}

/// A page of the real node_exporter 1.5 (Debian's), as served here.
const NODE_EXPORTER: &str = include_str!("../../../tests/data/prometheus/node_exporter.prom");

#[test]
fn a_real_node_exporter_page_parses_whole() {
    let page = parse_page(NODE_EXPORTER.as_bytes(), None);
    assert!(page.bad.is_empty(), "{:?}", page.bad);
    let lines = NODE_EXPORTER
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    assert_eq!(page.samples.len(), lines);
    assert_eq!(page.scraped, lines as u64);
    // Its summary, flattened: one series per quantile, then _sum and
    // _count.
    let gc: Vec<String> = page
        .samples
        .iter()
        .filter(|s| s.name.starts_with("go_gc_duration_seconds"))
        .map(|s| match s.labels.first() {
            Some((k, v)) => format!("{}{{{k}={v}}}", s.name),
            None => s.name.clone(),
        })
        .collect();
    assert_eq!(
        gc,
        [
            "go_gc_duration_seconds{quantile=0}",
            "go_gc_duration_seconds{quantile=0.25}",
            "go_gc_duration_seconds{quantile=0.5}",
            "go_gc_duration_seconds{quantile=0.75}",
            "go_gc_duration_seconds{quantile=1}",
            "go_gc_duration_seconds_sum",
            "go_gc_duration_seconds_count",
        ]
    );
    // Empty label values are no labels, as in Prometheus.
    let disk = page
        .samples
        .iter()
        .find(|s| s.name == "node_disk_info")
        .unwrap();
    assert!(
        disk.labels
            .iter()
            .all(|(k, v)| !v.is_empty() && k != "model"),
        "{disk:?}"
    );
    let root = page
        .samples
        .iter()
        .find(|s| {
            s.name == "node_filesystem_avail_bytes"
                && s.labels.iter().any(|(k, v)| k == "mountpoint" && v == "/")
        })
        .unwrap();
    assert!(root.value > 0.0);
}

#[test]
fn bad_lines_are_counted_with_their_reason_and_the_rest_kept() {
    let mut body =
        b"ok 1\nbad_value{a=\"1\"} one\nunclosed{a=\"1} 2\ntwice{a=\"1\",a=\"2\"} 3\n  \t\n#\n"
            .to_vec();
    body.extend_from_slice(b"not_utf8{a=\"\xff\"} 4\r\nno_value\nstamp 1 12x\ncolon:name 5 -1\r\n");
    let page = parse_page(&body, None);
    assert!(same(
        &page.samples,
        &[
            sample("ok", &[], 1.0, None),
            sample("colon:name", &[], 5.0, Some(-1)),
        ]
    ));
    let bad: Vec<(u64, &str)> = page
        .bad
        .iter()
        .map(|b| (b.line, b.reason.as_str()))
        .collect();
    let lines: Vec<u64> = bad.iter().map(|b| b.0).collect();
    assert_eq!(lines, [2, 3, 4, 7, 8, 9], "{bad:?}");
    assert!(bad[0].1.contains("bad_value"), "{bad:?}");
    assert!(bad[2].1.contains("label a given twice"), "{bad:?}");
    assert!(bad[3].1.contains("not UTF-8"), "{bad:?}");
    assert_eq!(page.scraped, 2);
}

#[test]
fn match_is_anchored_like_promql() {
    let filter = parse_match("node_cpu|node_memory_.*").unwrap();
    let body =
        b"node_cpu_seconds_total 1\nnode_cpu 2\nnode_memory_MemFree_bytes 3\nx_node_memory_a 4\n";
    let page = parse_page(body, Some(&filter));
    let names: Vec<&str> = page.samples.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["node_cpu", "node_memory_MemFree_bytes"]);
    assert_eq!(page.scraped, 4);
    assert!(parse_match("(").unwrap_err().contains("regular expression"));
}

#[test]
fn targets_and_their_instances() {
    let t = parse_targets(" http://127.0.0.1:9100/metrics , localhost:9101,https://example.com/m, http://[::1]:9200/x").unwrap();
    let pairs: Vec<(&str, &str)> = t
        .iter()
        .map(|t| (t.url.as_str(), t.instance.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("http://127.0.0.1:9100/metrics", "127.0.0.1:9100"),
            ("http://localhost:9101/metrics", "localhost:9101"),
            ("https://example.com/m", "example.com:443"),
            ("http://[::1]:9200/x", "[::1]:9200"),
        ]
    );
    assert_eq!(Target::parse("http://h/metrics").unwrap().instance, "h:80");
    for (bad, why) in [
        ("", "no target"),
        ("ftp://h/x", "http://"),
        ("http://a:1/m, http://a:1/m", "twice"),
        ("http://:80/x", "not a URL"),
    ] {
        let e = parse_targets(bad).unwrap_err();
        assert!(e.contains(why), "{bad}: {e}");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn config(schema: SchemaRef) -> SourceConfig {
    SourceConfig {
        stream: "scraped".into(),
        schema,
        connector: "prometheus",
        location: SourceLocation::Push,
        format: Format::Csv,
        replay: Replay::Fast,
        event_time: Some(0),
        batch_size: 3,
        dead_letter: None,
        follow: false,
        decode_threads: 1,
        decode: Default::default(),
    }
}

/// (instance, name, labels, value) of every row.
fn rows(batches: &[RecordBatch]) -> Vec<(String, String, String, f64)> {
    let mut out = Vec::new();
    for b in batches {
        let instance = b.column(2).as_string::<i32>();
        let name = b.column(3).as_string::<i32>();
        let labels = b.column(4).as_any().downcast_ref::<MapArray>().unwrap();
        let value = b.column(5).as_primitive::<Float64Type>();
        for i in 0..b.num_rows() {
            let entries = labels.value(i);
            let keys = entries.column(0).as_string::<i32>();
            let values = entries.column(1).as_string::<i32>();
            let text: Vec<String> = (0..entries.len())
                .map(|j| format!("{}={}", keys.value(j), values.value(j)))
                .collect();
            out.push((
                instance.value(i).to_string(),
                name.value(i).to_string(),
                text.join(","),
                value.value(i),
            ));
        }
    }
    out
}

fn value_of(rows: &[(String, String, String, f64)], instance: &str, name: &str) -> Vec<f64> {
    rows.iter()
        .filter(|r| r.0 == instance && r.1 == name)
        .map(|r| r.3)
        .collect()
}

#[test]
fn live_and_down_targets_each_round() {
    let page = "# TYPE a counter\na_total{x=\"1\"} 5\nb 2 1000\nc 3\nbroken{ 1\n";
    let live = Router::new().route("/metrics", get(move || async move { page }));
    let failing = Router::new().route(
        "/metrics",
        get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "no") }),
    );
    let slow = Router::new().route(
        "/metrics",
        get(|| async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            "late 1\n"
        }),
    );
    let (addrs, _runtime) = serve(vec![slow, live, failing]);
    let down = free_port();
    let targets = parse_targets(&format!(
        "{}, http://{}/metrics, {}, 127.0.0.1:{down}",
        addrs[0], addrs[1], addrs[2]
    ))
    .unwrap();
    let scraper = Scraper {
        targets,
        interval: Duration::from_millis(400),
        timeout: Duration::from_millis(300),
        filter: Some(parse_match("a_total|b").unwrap()),
        job: "node".into(),
        limit: Some(2),
    };
    let cfg = config(full_schema(&COLUMNS));
    let stats = SourceStats::default();
    let mut batches = Vec::new();
    let mut empty = 0;
    let start = Instant::now();
    scraper
        .scrape_rounds(&cfg, &stats, &mut |b| {
            assert_eq!(b.schema(), cfg.schema);
            if b.num_rows() == 0 {
                empty += 1;
            } else {
                assert!(b.num_rows() <= 3);
                batches.push(b);
            }
            true
        })
        .unwrap();
    // Two rounds 400 ms apart, the last one waited for up to its
    // timeout; never the slow target's 3 s.
    assert!(
        start.elapsed() < Duration::from_millis(2900),
        "{:?}",
        start.elapsed()
    );
    assert!(empty >= 2, "{empty}");
    let rows = rows(&batches);
    let (slow, live, failing) = (
        addrs[0].to_string(),
        addrs[1].to_string(),
        addrs[2].to_string(),
    );
    let down = format!("127.0.0.1:{down}");
    assert_eq!(value_of(&rows, &live, "up"), [1.0, 1.0]);
    assert_eq!(value_of(&rows, &live, "a_total"), [5.0, 5.0]);
    assert_eq!(value_of(&rows, &live, "b"), [2.0, 2.0]);
    assert!(value_of(&rows, &live, "c").is_empty());
    assert_eq!(value_of(&rows, &live, "scrape_samples_scraped"), [3.0, 3.0]);
    assert_eq!(
        value_of(&rows, &live, "scrape_samples_post_metric_relabeling"),
        [2.0, 2.0]
    );
    // The slow, the failing and the closed target: down each round,
    // with their report series and nothing else.
    for instance in [&slow, &failing, &down] {
        let names: Vec<&str> = rows
            .iter()
            .filter(|r| &r.0 == instance)
            .map(|r| r.1.as_str())
            .collect();
        assert_eq!(names.len(), 8, "{instance}: {names:?}");
        assert_eq!(value_of(&rows, instance, "up"), [0.0, 0.0]);
        assert_eq!(
            value_of(&rows, instance, "scrape_samples_scraped"),
            [0.0, 0.0]
        );
    }
    let slow_took = value_of(&rows, &slow, "scrape_duration_seconds");
    assert!(
        slow_took.iter().all(|&t| (0.25..2.9).contains(&t)),
        "{slow_took:?}"
    );
    assert!(rows.iter().all(|r| r.1 != "a_total" || r.2 == "x=1"));
    // The page's own timestamp, else the scrape's.
    let ts = batches[0]
        .column(0)
        .as_primitive::<TimestampMillisecondType>();
    assert!(ts.iter().all(|t| t.is_some()));
    let b_ts: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let ts = b.column(0).as_primitive::<TimestampMillisecondType>();
            let name = b.column(3).as_string::<i32>();
            (0..b.num_rows())
                .filter(|&i| name.value(i) == "b")
                .map(|i| ts.value(i))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(b_ts, [1000, 1000]);
    assert_eq!(stats.rows.load(Ordering::Relaxed), rows.len() as u64);
    assert_eq!(stats.bad_rows.load(Ordering::Relaxed), 2);
    let bad = stats.bad_samples.lock().unwrap();
    assert_eq!(bad[0].line, 5);
    assert!(
        bad[0]
            .reason
            .starts_with(&format!("target {live}: not a sample line")),
        "{bad:?}"
    );
}

#[test]
fn declared_subset_and_a_stop_request() {
    let (addrs, _runtime) = serve(vec![
        Router::new().route("/metrics", get(|| async { "m 1\n" })),
    ]);
    let scraper = Scraper {
        targets: parse_targets(&addrs[0].to_string()).unwrap(),
        interval: Duration::from_secs(60),
        timeout: Duration::from_secs(5),
        filter: None,
        job: "j".into(),
        limit: None,
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("VALUE", DataType::Float64, true),
        Field::new("name", DataType::Utf8, true),
        Field::new("job", DataType::Utf8, true),
    ]));
    let cfg = config(schema.clone());
    let stats = SourceStats::default();
    let mut names = Vec::new();
    scraper
        .scrape_rounds(&cfg, &stats, &mut |b| {
            assert_eq!(b.schema(), schema);
            let name = b.column(1).as_string::<i32>();
            names.extend((0..b.num_rows()).map(|i| name.value(i).to_string()));
            if b.num_rows() == 0 {
                // Waiting for the next round, 60 s away: asked to stop.
                stats.stop.store(true, Ordering::Relaxed);
            } else {
                assert_eq!(b.column(2).as_string::<i32>().value(0), "j");
            }
            true
        })
        .unwrap();
    assert_eq!(
        names,
        [
            "m",
            "up",
            "scrape_duration_seconds",
            "scrape_samples_scraped",
            "scrape_samples_post_metric_relabeling"
        ]
    );

    let wrong = Arc::new(Schema::new(vec![Field::new("host", DataType::Utf8, true)]));
    let e = scraper
        .scrape_rounds(&config(wrong), &stats, &mut |_| true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no column 'host'"), "{e}");
}

/// A stream `node` with every column, declared with `kv`.
fn declare(kv: &[(&str, &str)]) -> Result<SourceConfig> {
    let mut options = vec![("connector".to_string(), "prometheus".to_string())];
    options.extend(kv.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    SourceConfig::from_options(
        "node",
        full_schema(&COLUMNS),
        Some(0),
        &options,
        std::path::Path::new("/base"),
    )
}

fn scraper(config: &SourceConfig) -> &Scraper {
    let SourceLocation::Connector(reader) = &config.location else {
        panic!("not a reader: {:?}", config.location)
    };
    let any: &dyn std::any::Any = reader.0.as_ref();
    any.downcast_ref::<Scraper>().expect("a scraper")
}

#[test]
fn options_and_their_defaults() {
    let c = declare(&[("targets", "127.0.0.1:9100")]).unwrap();
    assert_eq!(c.connector, "prometheus");
    let s = scraper(&c);
    assert_eq!(s.targets[0].url, "http://127.0.0.1:9100/metrics");
    assert_eq!((s.interval, s.timeout), (DEFAULT_INTERVAL, DEFAULT_TIMEOUT));
    assert_eq!((s.job.as_str(), s.limit), ("node", None));
    assert!(s.filter.is_none());

    let c = declare(&[
        ("targets", "http://a:1/m, http://b:2/m"),
        ("interval", "2 seconds"),
        ("match", "up|node_.*"),
        ("job", "nodes"),
        ("limit", "3"),
    ])
    .unwrap();
    let s = scraper(&c);
    assert_eq!(s.targets.len(), 2);
    // The timeout is at most the interval.
    assert_eq!(
        (s.interval, s.timeout),
        (Duration::from_secs(2), Duration::from_secs(2))
    );
    assert_eq!((s.job.as_str(), s.limit), ("nodes", Some(3)));
    assert!(s.filter.as_ref().unwrap().is_match("node_load1"));
    assert!(!s.filter.as_ref().unwrap().is_match("xnode_load1"));
    let listed = s.describe();
    assert_eq!(listed, "http://a:1/m, http://b:2/m, every 2000 ms");
    assert!(s.explain().contains("not replayable"));
}

#[test]
fn bad_options_say_what_is_accepted() {
    let err = |kv: &[(&str, &str)]| declare(kv).unwrap_err().to_string();
    let e = err(&[]);
    assert!(e.contains("needs a 'targets' option"), "{e}");
    for (kv, want) in [
        (
            vec![("targets", "ftp://x/y")],
            "not an http:// or https:// URL",
        ),
        (vec![("targets", "a:1, a:1")], "listed twice"),
        (vec![("targets", " , ")], "no target given"),
        (
            vec![("targets", "a:1"), ("interval", "50 ms")],
            "at least 100 milliseconds",
        ),
        (
            vec![
                ("targets", "a:1"),
                ("interval", "1 second"),
                ("timeout", "2 seconds"),
            ],
            "no longer than interval",
        ),
        (
            vec![("targets", "a:1"), ("match", "node_(")],
            "not a regular expression",
        ),
        (vec![("targets", "a:1"), ("limit", "0")], "positive integer"),
        (vec![("targets", "a:1"), ("path", "x")], "path"),
    ] {
        let e = err(&kv);
        assert!(e.contains(want), "{kv:?}: {e}");
    }
    let mut wrong = vec![Field::new("cpu", DataType::Float64, true)];
    wrong.push(Field::new("ts", TIMESTAMP, true));
    let e = SourceConfig::from_options(
        "node",
        Arc::new(Schema::new(wrong)),
        Some(1),
        &[
            ("connector".into(), "prometheus".into()),
            ("targets".into(), "a:1".into()),
        ],
        std::path::Path::new("/base"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("no column 'cpu'") && e.contains("labels MAP<TEXT, TEXT>"),
        "{e}"
    );
}

#[test]
fn kinds_follow_the_catalogue() {
    let names: Vec<&str> = COLUMNS.iter().map(|c| c.name).collect();
    assert_eq!(names, ["ts", "job", "instance", "name", "labels", "value"]);
    for (kind, name) in KINDS.iter().zip(names) {
        assert_eq!(format!("{kind:?}").to_ascii_lowercase(), name);
    }
}
