//! Alert columns keep their roles through `SELECT *` and `INSERT INTO`, as
//! planned by the engine and read by the Alertmanager sink's layout.

use datafusion::arrow::datatypes::SchemaRef;

use crate::connectors::alertmanager::Layout;
use crate::engine::{Engine, Outcome};
use crate::plan::columns;
use crate::sql::parse_script;

/// The schema of the rows the last query of `script` (over stream `m`)
/// gives its sink.
fn planned_schema(script: &str) -> SchemaRef {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.csv"), "ts,host,cpu\n").unwrap();
    let script = format!(
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE, \
             WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH (path = 'm.csv');\n\
             CREATE SINK out WITH (connector = 'stdout', format = 'jsonl');\n{script}"
    );
    let mut engine = Engine::new();
    let mut schema = None;
    for statement in parse_script(&script).unwrap() {
        if let Outcome::Query(q) = engine.execute(&statement, dir.path()).unwrap() {
            schema = Some(q.graph.schema.clone());
        }
    }
    schema.expect("a query")
}

const ALERT: &str = "CREATE ALERT hot AS SELECT window_end, host, avg(cpu) AS cpu \
        FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_end, host \
        ALERT WHEN cpu > 90 SEVERITY 'page' MESSAGE 'cpu {cpu:.0}' \
        LABELS (team = 'infra', instance = '{host}:9100') ANNOTATIONS (runbook = 'http://r/{host}');\n";

#[test]
fn roles_survive_select_star_and_insert_into() {
    for reader in [
        "INSERT INTO out SELECT * FROM hot WHERE state = 'firing';",
        "SELECT * FROM hot;",
        "INSERT INTO out SELECT alert, host AS node, state, event_time, since, label_team, message FROM hot;",
    ] {
        let schema = planned_schema(&format!("{ALERT}{reader}"));
        let layout = Layout::of("am", &schema).unwrap();
        let name = |i: usize| schema.field(i).name().as_str();
        assert_eq!(name(layout.alert), "alert", "{reader}");
        let keys: Vec<&str> = layout.keys.iter().map(|(_, n)| n.as_str()).collect();
        let labels: Vec<&str> = layout.labels.iter().map(|(_, n)| n.as_str()).collect();
        if reader.contains("AS node") {
            assert_eq!(keys, ["node"], "an alias renames the key label");
            assert_eq!(labels, ["team"]);
            assert!(layout.annotations.is_empty() && layout.severity.is_none());
        } else {
            assert_eq!(keys, ["host"], "{reader}");
            assert_eq!(labels, ["team", "instance"]);
            assert_eq!(
                layout.annotations,
                [(schema.fields().len() - 1, "runbook".into())]
            );
        }
    }
    // Without the new clauses: the same columns as ever, with roles.
    let schema = planned_schema(
        "CREATE ALERT hot AS SELECT window_end, host, avg(cpu) AS cpu \
             FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_end, host \
             ALERT WHEN cpu > 90;\nSELECT * FROM hot;",
    );
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(
        names,
        [
            "alert",
            "host",
            "state",
            "event_time",
            "since",
            "cpu",
            "severity",
            "message"
        ]
    );
    let roles: Vec<&str> = schema
        .fields()
        .iter()
        .map(|f| f.metadata()[columns::ROLE].as_str())
        .collect();
    assert_eq!(
        roles,
        [
            "alert",
            "key",
            "state",
            "event_time",
            "since",
            "value",
            "severity",
            "message"
        ]
    );
}
