//! The aggregating operators as the engine plans them, run over rows,
//! checkpointed and restored: unit tests of `exec::aggregate` that need
//! the whole planning path, so they live above it.

mod testing {
    //! Aggregating operators as the planner builds them, for unit tests.

    use datafusion::arrow::record_batch::RecordBatch;

    use crate::connector::SourceStats;
    use crate::connectors::read_source;
    use crate::engine::{Engine, Outcome};
    use crate::exec::Operator;
    use crate::sql::parse_script;

    /// Rows of `m(ts, host, cpu)`, out of order, with a NULL key and a
    /// NULL value.
    pub const ROWS: &str = "ts,host,cpu\n1000,a,1.5\n2000,b,2.0\n1500,,3.25\n\
        12000,a,\n4000,b,0.7\n13000,a,4.0\n25000,b,1.0\n";

    /// The operators of `query` over `m` (watermark delay 1 s, allowed
    /// lateness `lateness`), and the input's batches of two rows.
    pub fn plan(query: &str, lateness: &str) -> (Vec<Box<dyn Operator>>, Vec<RecordBatch>) {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("m.csv"), ROWS).expect("writes");
        let script = format!(
            "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE, \
             WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) \
             WITH (path = 'm.csv', allowed_lateness = '{lateness}');\n{query}"
        );
        let mut engine = Engine::new();
        let mut graph = None;
        for statement in parse_script(&script).expect("parses") {
            if let Outcome::Query(q) = engine.execute(&statement, dir.path()).expect("plans") {
                graph = Some(q.graph);
            }
        }
        let graph = graph.expect("a query");
        let mut config = graph.inputs[0].stream.source.clone();
        config.batch_size = 2;
        let mut batches = Vec::new();
        read_source(&config, &SourceStats::default(), &mut |b| {
            batches.push(b);
            true
        })
        .expect("reads");
        let crate::planner::QueryGraph { inputs, stages, .. } = graph;
        let ops = inputs
            .into_iter()
            .flat_map(|i| i.stages)
            .chain(stages)
            .flat_map(|s| s.into_ops())
            .collect();
        (ops, batches)
    }
}

mod tests {
    use super::testing::plan;
    use crate::exec::{Chain, END_OF_INPUT, Message};
    use crate::state::OperatorState;

    const QUERIES: [&str; 4] = [
        "SELECT window_start, host, count(*) AS n, sum(cpu) AS s, median(cpu) AS m \
         FROM HOP(m, ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND) GROUP BY window_start, host",
        "SELECT window_start, window_end, host, avg(cpu) AS a, max(cpu) AS hi \
         FROM SESSION(m, ts, INTERVAL '3' SECOND) GROUP BY window_start, window_end, host",
        "SELECT host, count(*) AS n, min(cpu) AS lo FROM m GROUP BY host EMIT CHANGES",
        "SELECT window_start, host, sum(cpu) AS s FROM TUMBLE(m, ts, INTERVAL '10' SECOND) \
         GROUP BY window_start, host EMIT CHANGES",
    ];

    fn is_aggregate(describe: &str) -> bool {
        describe.contains("aggregate")
    }

    #[test]
    fn a_fresh_operator_snapshots_every_table_empty_with_its_schema() {
        let expected: [&[&str]; 4] = [
            &["panes", "pending", "dirty", "fired", "meta"],
            &["sessions", "meta"],
            &["groups"],
            &["groups"],
        ];
        for (query, tables) in QUERIES.iter().zip(expected) {
            let (mut ops, _) = plan(query, "0s");
            let op = ops
                .iter_mut()
                .find(|o| is_aggregate(&o.describe()))
                .unwrap();
            let state = op.snapshot().unwrap().expect("keeps state");
            let names: Vec<&str> = state.tables.iter().map(|t| t.name.as_str()).collect();
            assert_eq!(names, tables, "{query}");
            let main = &state.tables[0];
            assert_eq!(main.batch.num_rows(), 0, "{query}");
            // The key column `host`, then the accumulators' state columns.
            let schema = main.batch.schema();
            assert_eq!(main.key_columns.len(), 1, "{query}");
            assert_eq!(schema.field(main.key_columns[0]).name(), "host");
            assert!(schema.fields().len() > main.key_columns[0] + 2, "{query}");
            // Meta scalars are there, NULL before any row.
            if let Ok(meta) = state.table("meta") {
                assert_eq!(meta.num_rows(), 1);
                assert_eq!(state.scalar("meta", "watermark").unwrap(), None);
            }
            // A fresh snapshot restores into a fresh operator.
            let (mut again, _) = plan(query, "0s");
            let other = again
                .iter_mut()
                .find(|o| is_aggregate(&o.describe()))
                .unwrap();
            other.restore(state).unwrap();
        }
    }

    /// Snapshots taken at barriers: (barrier, operator, state).
    type Taken = Vec<(u64, usize, OperatorState)>;

    /// Runs the operators over the input with `barriers` barriers after
    /// each batch; the output rows and the snapshots taken.
    fn run(query: &str, barriers: u64) -> (Vec<String>, Taken) {
        let (ops, batches) = plan(query, "5s");
        let taken = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = taken.clone();
        let mut chain = Chain::new(ops).with_snapshots(Box::new(move |id, op, state| {
            sink.lock().unwrap().extend(state.map(|s| (id, op, s)));
            Ok(())
        }));
        let mut out = Vec::new();
        let messages = batches.into_iter().map(Message::Batch);
        for message in messages.chain([Message::Watermark(END_OF_INPUT)]) {
            out.extend(chain.process(message).unwrap());
            for id in 0..barriers {
                chain.process(Message::Barrier(id)).unwrap();
            }
        }
        let rows = out
            .iter()
            .filter_map(|m| match m {
                Message::Batch(b) | Message::Changes(b, _) => Some(format!("{m:?}{b:?}")),
                _ => None,
            })
            .collect();
        let states = std::mem::take(&mut *taken.lock().unwrap());
        (rows, states)
    }

    #[test]
    fn snapshots_in_a_row_change_nothing() {
        for query in QUERIES {
            let (plain, _) = run(query, 0);
            let (twice, states) = run(query, 2);
            assert_eq!(plain, twice, "{query}");
            // The second of two back-to-back snapshots equals the first.
            let tables = |s: &OperatorState| -> Vec<_> {
                s.tables
                    .iter()
                    .map(|t| (t.name.clone(), t.batch.clone()))
                    .collect()
            };
            let firsts = states.iter().filter(|(id, _, _)| *id == 0);
            let seconds = states.iter().filter(|(id, _, _)| *id == 1);
            let mut pairs = 0;
            for ((_, op_a, a), (_, op_b, b)) in firsts.zip(seconds) {
                assert_eq!(op_a, op_b);
                assert_eq!(tables(a), tables(b), "{query}");
                pairs += 1;
            }
            assert!(pairs > 0 && states.iter().any(|(_, _, s)| s.rows() > 1));
            // Keyed rows are keyed by the grouping keys, never the window.
            for (_, _, state) in &states {
                for table in &state.tables {
                    let schema = table.batch.schema();
                    let names: Vec<&str> = table
                        .key_columns
                        .iter()
                        .map(|&c| schema.field(c).name().as_str())
                        .collect();
                    assert!(names.is_empty() || names == ["host"], "{query}: {names:?}");
                    crate::state::key_groups(&table.batch, &table.key_columns).unwrap();
                }
            }
        }
    }

    #[test]
    fn a_snapshot_of_another_query_is_refused() {
        let (mut ops, _) = plan(QUERIES[0], "0s");
        let median = ops
            .iter_mut()
            .find(|o| is_aggregate(&o.describe()))
            .unwrap();
        let state = median.snapshot().unwrap().unwrap();
        let other = QUERIES[0].replace("median(cpu)", "max(cpu)");
        let (mut max_ops, _) = plan(&other, "0s");
        let max = max_ops
            .iter_mut()
            .find(|o| is_aggregate(&o.describe()))
            .unwrap();
        let error = max.restore(state).unwrap_err().to_string();
        assert!(error.contains("state table 'panes'"), "{error}");
    }
}
