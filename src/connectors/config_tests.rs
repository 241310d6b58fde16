//! `WITH (...)` options resolved through the registry into source and
//! sink configurations, and the option value parsers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::demo::Demo;
use super::host::Host;
use super::{
    Decoding, Format, OutputFormat, Reader, Replay, SinkConfig, SinkTarget, SourceConfig,
    SourceLocation, TsUnit,
};
use crate::connector::options::*;
use crate::error::{Error, Result};

fn host(interval: Duration, limit: Option<u64>) -> SourceLocation {
    SourceLocation::Connector(Reader(Arc::new(Host { interval, limit })))
}

fn demo(speed: f64, limit: Option<u64>) -> SourceLocation {
    SourceLocation::Connector(Reader(Arc::new(Demo { speed, limit })))
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new("cpu", DataType::Float64, true),
    ]))
}

fn opts(kv: &[(&str, &str)]) -> Vec<(String, String)> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn source(kv: &[(&str, &str)]) -> Result<SourceConfig> {
    SourceConfig::from_options("m", schema(), Some(0), &opts(kv), Path::new("/base"))
}

fn err(r: Result<impl std::fmt::Debug>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn source_defaults() {
    let c = source(&[("path", "data/m.csv")]).unwrap();
    assert_eq!(c.stream, "m");
    assert_eq!(
        c.location,
        SourceLocation::File(PathBuf::from("/base/data/m.csv"))
    );
    assert_eq!(c.format, Format::Csv);
    assert_eq!(c.replay, Replay::Fast);
    assert_eq!(c.batch_size, DEFAULT_BATCH_SIZE);
    assert_eq!(c.dead_letter, None);
    assert_eq!(c.event_time, Some(0));
    assert!(!c.follow);
}

#[test]
fn source_follow() {
    assert!(
        source(&[("path", "m.csv"), ("follow", "TRUE")])
            .unwrap()
            .follow
    );
    assert!(
        !source(&[("path", "m.csv"), ("follow", "false")])
            .unwrap()
            .follow
    );
    let e = err(source(&[("path", "m.csv"), ("follow", "yes")]));
    assert!(e.contains("'follow'") && e.contains("true, false"), "{e}");
    // `path` and `follow` are options of files alone.
    let e = err(source(&[("connector", "stdin"), ("follow", "true")]));
    assert!(e.contains("unknown option 'follow'"), "{e}");
}

#[test]
fn source_all_options() {
    let c = source(&[
        ("connector", "file"),
        ("path", "/abs/m.txt"),
        ("format", "NDJSON"),
        ("replay", "realtime"),
        ("speed", "10"),
        ("batch_size", "100"),
        ("dead_letter", "bad.txt"),
    ])
    .unwrap();
    assert_eq!(
        c.location,
        SourceLocation::File(PathBuf::from("/abs/m.txt"))
    );
    assert_eq!(c.format, Format::Jsonl);
    assert_eq!(c.replay, Replay::Realtime { speed: 10.0 });
    assert_eq!(c.batch_size, 100);
    assert_eq!(c.dead_letter, Some(PathBuf::from("/base/bad.txt")));
}

#[test]
fn source_format_from_extension() {
    for (p, f) in [
        ("a.jsonl", Format::Jsonl),
        ("a.JSON", Format::Jsonl),
        ("a.ndjson", Format::Jsonl),
        ("a.csv", Format::Csv),
        ("a.log", Format::Csv),
        ("a", Format::Csv),
    ] {
        assert_eq!(source(&[("path", p)]).unwrap().format, f, "{p}");
    }
    assert_eq!(
        source(&[("path", "a.jsonl"), ("format", "csv")])
            .unwrap()
            .format,
        Format::Csv
    );
}

#[test]
fn source_stdin() {
    let c = source(&[("connector", "stdin"), ("format", "json")]).unwrap();
    assert_eq!(c.location, SourceLocation::Stdin);
    assert_eq!(c.format, Format::Jsonl);
    let c = source(&[("connector", "stdin")]).unwrap();
    assert_eq!(c.format, Format::Csv);
    assert!(err(source(&[("connector", "stdin"), ("path", "x.csv")])).contains("'path'"));
}

#[test]
fn source_errors_name_key_and_accepted_values() {
    let e = err(source(&[("path", "a.csv"), ("colour", "red")]));
    assert!(e.contains("'colour'") && e.contains("batch_size"), "{e}");
    let e = err(source(&[("path", "a.csv"), ("format", "xml")]));
    assert!(e.contains("'format'") && e.contains("csv, jsonl"), "{e}");
    let e = err(source(&[("connector", "mqtt"), ("path", "a.csv")]));
    assert!(
        e.contains("'connector'") && e.contains("file, stdin, push, host, demo"),
        "{e}"
    );
    let e = err(source(&[("path", "a.csv"), ("replay", "slow")]));
    assert!(
        e.contains("'replay'") && e.contains("fast, realtime"),
        "{e}"
    );
    for bad in ["0", "-1", "abc", "inf", "NaN"] {
        let e = err(source(&[("path", "a.csv"), ("speed", bad)]));
        assert!(e.contains("'speed'"), "{e}");
    }
    for bad in ["0", "-5", "1.5", "x", "99999999999"] {
        let e = err(source(&[("path", "a.csv"), ("batch_size", bad)]));
        assert!(e.contains("'batch_size'"), "{e}");
    }
    let e = err(source(&[]));
    assert!(e.contains("'path'"), "{e}");
    let e = err(source(&[("path", "")]));
    assert!(e.contains("'path'"), "{e}");
    let e = err(source(&[("path", "a.csv"), ("path", "b.csv")]));
    assert!(e.contains("more than once"), "{e}");
    assert!(matches!(source(&[]), Err(Error::Plan(_))));
}

#[test]
fn decoding_options() {
    let c = source(&[("path", "a.csv")]).unwrap();
    assert_eq!(c.decode, Decoding::default());
    assert_eq!(c.decode.max_future_ms, Some(86_400_000));
    let c = source(&[
        ("path", "a.csv"),
        ("multiline", "TRUE"),
        ("max_record_size", "4096"),
        ("ts_unit", "us"),
        ("max_future", "1 hour"),
    ])
    .unwrap();
    assert_eq!(
        c.decode,
        Decoding {
            multiline: true,
            max_record_size: 4096,
            ts_unit: TsUnit::Micros,
            max_future_ms: Some(3_600_000),
        }
    );
    for (text, ms) in [
        ("2 days", Some(172_800_000)),
        ("90 s", Some(90_000)),
        ("none", None),
        ("OFF", None),
    ] {
        let c = source(&[("path", "a.csv"), ("max_future", text)]).unwrap();
        assert_eq!(c.decode.max_future_ms, ms, "{text}");
    }
    for bad in ["0 s", "soon", "1", "-1 hour", ""] {
        let e = err(source(&[("path", "a.csv"), ("max_future", bad)]));
        assert!(
            e.contains("'max_future'") && e.contains("'none'"),
            "{bad}: {e}"
        );
    }
    let e = err(source(&[("path", "a.csv"), ("ts_unit", "sec")]));
    assert!(
        e.contains("'ts_unit'") && e.contains("s, ms, us, ns"),
        "{e}"
    );
    for bad in ["0", "x", "2000000000"] {
        let e = err(source(&[("path", "a.csv"), ("max_record_size", bad)]));
        assert!(e.contains("'max_record_size'"), "{e}");
    }
    let e = err(source(&[("path", "a.jsonl"), ("multiline", "true")]));
    assert!(e.contains("'multiline' is for CSV"), "{e}");
}

fn live(
    connector: &str,
    columns: &[(&str, DataType)],
    kv: &[(&str, &str)],
) -> Result<SourceConfig> {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, t)| Field::new(*n, t.clone(), true))
            .collect::<Vec<_>>(),
    ));
    let mut options = opts(kv);
    options.insert(0, ("connector".into(), connector.into()));
    SourceConfig::from_options("h", schema, Some(0), &options, Path::new("/base"))
}

const TS: DataType = DataType::Timestamp(TimeUnit::Millisecond, None);

#[test]
fn host_options() {
    let cols = [
        ("ts", TS),
        ("host", DataType::Utf8),
        ("cpu", DataType::Float64),
    ];
    let c = live("host", &cols, &[]).unwrap();
    assert_eq!(c.location, host(Duration::from_secs(1), None));
    assert_eq!(c.event_time, Some(0));
    let c = live(
        "HOST",
        &cols,
        &[("interval", "100 milliseconds"), ("limit", "3")],
    )
    .unwrap();
    assert_eq!(c.location, host(Duration::from_millis(100), Some(3)));
    for (text, ms) in [("2 minutes", 120_000), ("1.5s", 1500), ("250 ms", 250)] {
        let c = live("host", &cols, &[("interval", text)]).unwrap();
        assert_eq!(c.location, host(Duration::from_millis(ms), None), "{text}");
    }
    for bad in ["99 ms", "0 seconds", "1", "soon", "", "-1 second"] {
        let e = err(live("host", &cols, &[("interval", bad)]));
        assert!(
            e.contains("stream h") && e.contains("'interval'") && e.contains("100 milliseconds"),
            "{bad}: {e}"
        );
    }
    for bad in ["0", "-1", "1.5", "many", ""] {
        let e = err(live("host", &cols, &[("limit", bad)]));
        assert!(
            e.contains("'limit'") && e.contains("positive integer"),
            "{bad}: {e}"
        );
    }
    let e = err(live("host", &cols, &[("path", "m.csv")]));
    assert!(
        e.contains("'path'") && e.contains("connector, interval, limit"),
        "{e}"
    );
    let e = err(live("host", &cols, &[("speed", "2")]));
    assert!(e.contains("unknown option 'speed'"), "{e}");
}

#[test]
fn host_columns_come_from_the_catalogue() {
    let e = err(live("host", &[("ts", TS), ("gpu", DataType::Float64)], &[]));
    assert!(
        e.contains("no column 'gpu'")
            && e.contains("load_1 DOUBLE")
            && e.contains("net_rx_bytes BIGINT"),
        "{e}"
    );
    let e = err(live("host", &[("ts", TS), ("mem", DataType::Utf8)], &[]));
    assert!(
        e.contains("'mem'") && e.contains("is DOUBLE, not TEXT"),
        "{e}"
    );
    assert!(matches!(
        live("host", &[("cpu", DataType::Int64)], &[]),
        Err(Error::Plan(_))
    ));
}

#[test]
fn demo_options() {
    let cols = [("ts", TS), ("value", DataType::Float64)];
    let c = live("demo", &cols, &[]).unwrap();
    assert_eq!(c.location, demo(1000.0, None));
    let c = live("demo", &cols, &[("speed", "20"), ("limit", "5")]).unwrap();
    assert_eq!(c.location, demo(20.0, Some(5)));
    for bad in ["0", "-3", "fast", "inf"] {
        let e = err(live("demo", &cols, &[("speed", bad)]));
        assert!(
            e.contains("'speed'") && e.contains("rows per second"),
            "{bad}: {e}"
        );
    }
    let e = err(live("demo", &cols, &[("interval", "1 second")]));
    assert!(
        e.contains("'interval'") && e.contains("connector, speed, limit"),
        "{e}"
    );
    let e = err(live(
        "demo",
        &[("ts", TS), ("temp", DataType::Float64)],
        &[],
    ));
    assert!(
        e.contains("no column 'temp'")
            && e.contains("ts TIMESTAMP, host TEXT, metric TEXT, value DOUBLE"),
        "{e}"
    );
}

#[test]
fn sink_options() {
    let base = Path::new("/base");
    let c = SinkConfig::from_options("out", &opts(&[("path", "o.csv")]), base).unwrap();
    assert_eq!(c.name, "out");
    assert_eq!(c.target, SinkTarget::File(PathBuf::from("/base/o.csv")));
    assert_eq!(c.format, OutputFormat::Csv);
    let c = SinkConfig::from_options("out", &opts(&[("path", "o.jsonl")]), base).unwrap();
    assert_eq!(c.format, OutputFormat::Jsonl);
    let c = SinkConfig::from_options(
        "out",
        &opts(&[("connector", "stdout"), ("format", "table")]),
        base,
    )
    .unwrap();
    assert_eq!(c.target, SinkTarget::Stdout);
    assert_eq!(c.format, OutputFormat::Table);

    let e = err(SinkConfig::from_options("out", &opts(&[]), base));
    assert!(e.contains("'path'"), "{e}");
    let e = err(SinkConfig::from_options(
        "out",
        &opts(&[("path", "o"), ("format", "xml")]),
        base,
    ));
    assert!(e.contains("'format'") && e.contains("table"), "{e}");
    let e = err(SinkConfig::from_options(
        "out",
        &opts(&[("path", "o"), ("speed", "1")]),
        base,
    ));
    assert!(
        e.contains("'speed'") && e.contains("connector, path, format"),
        "{e}"
    );
}

#[test]
fn output_formats() {
    assert_eq!(parse_output_format("table").unwrap(), OutputFormat::Table);
    assert_eq!(parse_output_format("CSV").unwrap(), OutputFormat::Csv);
    assert_eq!(parse_output_format("jsonl").unwrap(), OutputFormat::Jsonl);
    assert_eq!(parse_output_format("json").unwrap(), OutputFormat::Jsonl);
    assert_eq!(parse_output_format("ndjson").unwrap(), OutputFormat::Jsonl);
    let e = err(parse_output_format("yaml"));
    assert!(e.contains("yaml") && e.contains("table, csv, jsonl"), "{e}");
}

#[test]
fn durations() {
    let ms = |t: &str| parse_duration(t).map(|d| d.as_millis());
    assert_eq!(ms("200 milliseconds"), Some(200));
    assert_eq!(ms("1 millisecond"), Some(1));
    assert_eq!(ms("200ms"), Some(200));
    assert_eq!(ms(" 5 Seconds "), Some(5000));
    assert_eq!(ms("1 second"), Some(1000));
    assert_eq!(ms("1.5s"), Some(1500));
    assert_eq!(ms("2 secs"), Some(2000));
    assert_eq!(ms(".5 sec"), Some(500));
    assert_eq!(ms("1 minute"), Some(60_000));
    assert_eq!(ms("3 mins"), Some(180_000));
    assert_eq!(ms("2m"), Some(120_000));
    assert_eq!(ms("1 M"), Some(60_000));
    assert_eq!(ms("1 hour"), Some(3_600_000));
    assert_eq!(ms("2 days"), Some(172_800_000));
    assert_eq!(ms("1 week"), Some(604_800_000));
    for bad in [
        "", "5", "ms", "0 ms", "0.2 ms", "-1 s", "1 mo", "1..2 s", "five s", "1 s x",
    ] {
        assert_eq!(ms(bad), None, "{bad:?}");
    }
}
