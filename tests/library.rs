//! The same queries from the library API: parse, plan, run with a sink of
//! the caller's own.

use std::path::Path;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use vigil::connectors::Sink;
use vigil::engine::{Engine, Outcome};
use vigil::runtime::{RunnableQuery, run};
use vigil::sql::parse_script;

/// Collects result batches in memory.
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<RecordBatch>>>);

impl Sink for Collect {
    fn write(&mut self, batch: &RecordBatch) -> vigil::error::Result<()> {
        self.0.lock().unwrap().push(batch.clone());
        Ok(())
    }

    fn finish(&mut self) -> vigil::error::Result<()> {
        Ok(())
    }
}

fn run_script(dir: &Path, sql: &str) -> Vec<Vec<RecordBatch>> {
    let mut engine = Engine::new();
    let mut queries = Vec::new();
    let mut outputs = Vec::new();
    for statement in parse_script(sql).expect("parses") {
        if let Outcome::Query(query) = engine.execute(&statement, dir).expect("plans") {
            let sink = Collect::default();
            outputs.push(sink.clone());
            queries.push(RunnableQuery {
                graph: query.graph,
                sink: Box::new(sink),
            });
        }
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let limit = std::time::Duration::from_secs(120);
    runtime
        .block_on(async { tokio::time::timeout(limit, run(queries)).await })
        .unwrap_or_else(|_| panic!("the queries did not end within {limit:?}"))
        .expect("runs");
    outputs
        .into_iter()
        .map(|c| c.0.lock().unwrap().clone())
        .collect()
}

fn column_i64(batches: &[RecordBatch], name: &str) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.column_by_name(name)
                .expect("column")
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

#[test]
fn windows_and_modes_from_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let rows = "ts,host,cpu\n1000,a,1\n4000,a,2\n11000,a,3\n9000,b,4\n13000,b,5\n25000,a,6\n";
    std::fs::write(dir.path().join("m.csv"), rows).unwrap();
    let sql = "
        CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
          WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH (path = 'm.csv');
        SELECT window_start, count(*) AS n FROM TUMBLE(m, ts, INTERVAL '10' SECOND)
          GROUP BY window_start;
        SET execution_mode = 'per_record';
        SELECT window_start, count(*) AS n
          FROM HOP(m, ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND) GROUP BY window_start;
        SELECT host, count(*) AS n FROM m GROUP BY host EMIT CHANGES;";
    let outputs = run_script(dir.path(), sql);
    // The worked vector of the semantics: 3, 2 and 1 rows per window.
    let mut tumble = column_i64(&outputs[0], "n");
    tumble.sort();
    assert_eq!(tumble, [1, 2, 3]);
    // Windows of 10 s every 5 s: each of the 6 rows lies in two of them.
    assert_eq!(
        column_i64(&outputs[1], "n").iter().sum::<i64>(),
        12,
        "each row in 2 windows"
    );
    // The changelog: one row per input row.
    assert_eq!(column_i64(&outputs[2], "n"), [1, 2, 3, 1, 2, 4]);
}
