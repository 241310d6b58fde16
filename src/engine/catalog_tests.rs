//! The catalog as the engine fills it: built-in streams resolved through
//! the connector registry, declared ones hiding them, what a query reads.

use std::time::Duration;

use std::path::Path;
use std::sync::Arc;

use crate::connector::{Reader, SourceLocation};
use crate::connectors::demo::Demo;
use crate::connectors::host::Host;
use crate::engine::{Engine, Outcome};
use crate::error::Result;
use crate::plan::Catalog;
use crate::sql::parse_script;

fn run(engine: &mut Engine, sql: &str) -> Result<Outcome> {
    let mut last = Ok(Outcome::Done);
    for statement in parse_script(sql).unwrap() {
        last = Ok(engine.execute(&statement, Path::new("."))?);
    }
    last
}

#[test]
fn builtin_streams() {
    let catalog = Engine::new().catalog().clone();
    let host = catalog.stream("host_metrics").unwrap();
    let names: Vec<&str> = host
        .schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    assert_eq!(names[..3], ["ts", "host", "cpu"]);
    assert!(names.contains(&"processes") && names.contains(&"net_tx_bytes"));
    assert_eq!(host.event_time, Some(0));
    assert_eq!(host.delay_ms, 0);
    assert_eq!(
        host.source.location,
        SourceLocation::Connector(Reader(Arc::new(Host {
            interval: Duration::from_secs(1),
            limit: None
        })))
    );
    let demo = catalog.stream("demo").unwrap();
    assert_eq!(demo.schema.fields().len(), 4);
    assert_eq!(demo.event_time, Some(0));
    assert_eq!(
        demo.source.location,
        SourceLocation::Connector(Reader(Arc::new(Demo {
            speed: 1000.0,
            limit: None
        })))
    );
    assert!(catalog.stream("metrics").is_none());
    // The same definition every time, so that queries share one source.
    assert!(Arc::ptr_eq(host, catalog.stream("host_metrics").unwrap()));
}

#[test]
fn builtin_streams_need_no_ddl_and_declared_ones_hide_them() {
    let catalog = Engine::new().catalog().clone();
    assert!(catalog.stream("host_metrics").is_some());
    assert!(Catalog::default().stream("host_metrics").is_none());
    assert!(catalog.stream("demo").is_some());

    let mut engine = Engine::new();
    let outcome = run(
        &mut engine,
        "SELECT window_end, host, avg(cpu) AS avg_cpu
         FROM TUMBLE(host_metrics, ts, INTERVAL '10' SECOND)
         GROUP BY window_end, host
         ALERT WHEN avg_cpu > 80 FOR INTERVAL '30' SECOND;",
    )
    .unwrap();
    assert!(matches!(outcome, Outcome::Query(_)));
    let outcome = run(
        &mut engine,
        "EXPLAIN SELECT ts, value FROM demo WHERE value < 50;",
    )
    .unwrap();
    let Outcome::Explain(text) = outcome else {
        panic!("not an explain")
    };
    assert!(text.contains("source demo (demo, 1000 rows/s)"), "{text}");

    run(
        &mut engine,
        "CREATE STREAM demo (ts TIMESTAMP, value DOUBLE) WITH (connector = 'demo', limit = '5');",
    )
    .unwrap();
    let demo = engine.catalog().stream("demo").unwrap();
    assert_eq!(demo.schema.fields().len(), 2);
    assert_eq!(
        demo.source.location,
        SourceLocation::Connector(Reader(Arc::new(Demo {
            speed: 1000.0,
            limit: Some(5)
        })))
    );
}

#[test]
fn host_stream_columns_are_checked_when_declared() {
    let mut engine = Engine::new();
    let e = run(
        &mut engine,
        "CREATE STREAM h (ts TIMESTAMP, host TEXT, cpu BIGINT, WATERMARK FOR ts AS ts)
         WITH (connector = 'host');",
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("'cpu'")
            && e.contains("is DOUBLE, not BIGINT")
            && e.contains("mem_used_bytes BIGINT"),
        "{e}"
    );
}

#[test]
fn reads_names_streams_and_views_but_not_aliases() {
    let mut engine = Engine::new();
    run(
        &mut engine,
        "CREATE STREAM m (ts TIMESTAMP, cpu DOUBLE) WITH (path = 'm.csv');
         CREATE VIEW hot AS SELECT ts, cpu FROM m WHERE cpu > 1;",
    )
    .unwrap();
    let catalog = engine.catalog();
    let planner = crate::plan::SqlPlanner::new();
    let reads = |sql: &str| {
        let statement = parse_script(sql).unwrap().remove(0);
        let crate::sql::StatementKind::Query { query, .. } = statement.kind else {
            panic!("not a query")
        };
        catalog.reads(&planner.plan_raw(catalog, &query).unwrap())
    };
    assert_eq!(reads("SELECT * FROM hot"), ["hot", "m"]);
    assert_eq!(
        reads(
            "SELECT window_end, count(*) FROM TUMBLE(hot, ts, INTERVAL '1' SECOND) GROUP BY window_end"
        ),
        ["hot", "m"]
    );
    // An alias named like the view is not the view.
    assert_eq!(reads("SELECT * FROM m AS hot"), ["m"]);
    assert_eq!(reads("SELECT * FROM late(m)"), ["m"]);
    assert_eq!(reads("SELECT * FROM host_metrics"), ["host_metrics"]);

    let mut catalog = catalog.clone();
    assert!(catalog.remove_view("hot") && !catalog.remove_view("hot"));
    assert!(catalog.remove_stream("m") && !catalog.has_stream("m"));
    assert!(!catalog.remove_stream("host_metrics"));
    assert!(catalog.stream("host_metrics").is_some());
}
