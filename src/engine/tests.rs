use super::*;
use crate::sql::parse_script;

const STREAM: &str = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
        WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH (path = 'm.csv');";

fn engine() -> Engine {
    let mut engine = Engine::new();
    for s in parse_script(STREAM).unwrap() {
        engine.execute(&s, Path::new(".")).unwrap();
    }
    engine
}

fn run(sql: &str) -> Result<Outcome> {
    let statement = parse_script(sql).unwrap().remove(0);
    engine().execute(&statement, Path::new("."))
}

fn err(sql: &str) -> String {
    match run(sql) {
        Ok(_) => panic!("{sql} should fail"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn watermark_delay_is_evaluated() {
    let engine = engine();
    let def = engine.catalog().stream("m").unwrap();
    assert_eq!(def.delay_ms, 2000);
    assert_eq!(def.event_time, Some(0));
}

#[test]
fn windowed_aggregate_fuses_stateless_ops_before_the_aggregate() {
    let Ok(Outcome::Query(q)) = run(
        "SELECT window_start, host, avg(cpu) FROM TUMBLE(m, ts, INTERVAL '10' SECOND)
             WHERE cpu > 1 GROUP BY window_start, host",
    ) else {
        panic!("plans")
    };
    assert_eq!(q.graph.stages.len(), 2);
    assert_eq!(q.graph.stages[0].ops().len(), 3, "{}", q.graph.describe());
    assert!(q.graph.describe().contains("window aggregate"));
}

/// The queries planned by running `script` over `m`.
fn queries(script: &str) -> Vec<PreparedQuery> {
    let mut engine = engine();
    let mut queries = Vec::new();
    for s in parse_script(script).unwrap() {
        if let Outcome::Query(q) = engine.execute(&s, Path::new(".")).unwrap() {
            queries.push(*q);
        }
    }
    queries
}

/// What each input of `graph` runs before the merge.
fn input_ops(graph: &QueryGraph) -> Vec<String> {
    graph
        .inputs
        .iter()
        .map(|i| {
            let ops = i.stages.iter().flat_map(|s| s.ops());
            ops.map(|op| op.describe()).collect::<Vec<_>>().join(" | ")
        })
        .collect()
}

#[test]
fn a_window_over_a_union_runs_in_each_input_on_its_own_clock() {
    let q = queries(
        "CREATE STREAM n (ts TIMESTAMP, host TEXT) WITH (path = 'n.csv');
             CREATE VIEW u AS SELECT ts, host FROM m UNION ALL SELECT ts, host FROM n;
             SELECT window_start, count(*) AS c FROM TUMBLE(u, ts, INTERVAL '10' SECOND)
             GROUP BY window_start, window_end;",
    );
    let inputs = input_ops(&q[0].graph);
    assert_eq!(inputs.len(), 2, "{}", q[0].graph.describe());
    for ops in &inputs {
        assert!(ops.contains("window"), "{}", q[0].graph.describe());
    }
    let after_merge = q[0].graph.stages.iter().flat_map(|s| s.ops());
    assert!(
        !after_merge
            .map(|op| op.describe())
            .any(|d| d.starts_with("window tumble") || d.starts_with("window hop")),
        "{}",
        q[0].graph.describe()
    );
}

#[test]
fn controlled_over_a_plain_view_gets_the_stream_s_watermark() {
    let q = queries(
        "CREATE STREAM ctl (ts TIMESTAMP, key TEXT, action TEXT) WITH (path = 'c.csv');
             CREATE VIEW busy AS SELECT ts, host, cpu FROM m WHERE cpu > 50;
             SELECT * FROM CONTROLLED(busy, ctl, host, ts);",
    );
    let inputs = input_ops(&q[0].graph);
    assert!(
        inputs[0].contains("watermark(column 0 - 2000 ms)"),
        "{}",
        q[0].graph.describe()
    );
    assert_eq!(inputs[1].matches("watermark").count(), 1, "{inputs:?}");
}

/// The error planning `sql` over `m` read with `follow`: a stream that
/// never ends.
fn err_following(sql: &str) -> String {
    let mut engine = Engine::new();
    engine.set_follow(true);
    for s in parse_script(&format!("{STREAM}{sql}")).unwrap() {
        if let Err(e) = engine.execute(&s, Path::new(".")) {
            return e.to_string();
        }
    }
    panic!("{sql} should fail")
}

#[test]
fn rules_reject_what_cannot_run_on_a_stream() {
    let e = err_following("SELECT host, count(*) FROM m GROUP BY host");
    assert!(
        e.contains("unbounded aggregate") && e.contains("stream 'm', which never ends"),
        "{e}"
    );
    assert!(err_following("SELECT count(*) FROM m").contains("unbounded aggregate"));
    assert!(err_following("SELECT * FROM m ORDER BY ts").contains("ORDER BY"));
    assert!(err_following("SELECT * FROM m a JOIN m b ON a.host = b.host").contains("join"));
    assert!(
        err("SELECT host, count(*) FROM TUMBLE(m, ts, INTERVAL '1' SECOND) GROUP BY host")
            .contains("GROUP BY window_start or window_end")
    );
}

#[test]
fn bounded_questions_over_files_that_end_are_batch_queries() {
    for sql in [
        "SELECT count(*) FROM m",
        "SELECT * FROM m ORDER BY ts LIMIT 3",
        "SELECT a.host FROM m a JOIN m b ON a.host = b.host",
    ] {
        let Ok(Outcome::Explain(text)) = run(&format!("EXPLAIN {sql}")) else {
            panic!("{sql} explains")
        };
        assert!(text.contains("batch query at the end of input"), "{text}");
    }
    let Ok(Outcome::Query(q)) = run("SELECT host, count(*) FROM m GROUP BY host") else {
        panic!("plans")
    };
    assert!(
        q.graph.describe().contains("AggregateExec"),
        "{}",
        q.graph.describe()
    );
}

#[test]
fn hop_and_session_windows_need_their_aggregate() {
    let hop = "HOP(m, ts, INTERVAL '5' SECOND, INTERVAL '15' SECOND)";
    assert!(err(&format!("SELECT * FROM {hop}")).contains("window without aggregate"));
    assert!(
        err(&format!(
            "SELECT count(*) FROM {hop} WHERE window_start > ts GROUP BY window_end"
        ))
        .contains("window columns before the aggregate")
    );
    assert!(
        err("SELECT host FROM SESSION(m, ts, INTERVAL '1' MINUTE)")
            .contains("window without aggregate")
    );
    assert!(
        err("SELECT * FROM HOP(m, ts, INTERVAL '20' SECOND, INTERVAL '10' SECOND)")
            .contains("must not exceed")
    );
    assert!(
            err("SELECT count(*) FROM HOP(m, ts, INTERVAL '1' MILLISECOND, INTERVAL '1' DAY) GROUP BY window_end")
                .contains("at most 10000")
        );
    let Ok(Outcome::Explain(text)) = run(&format!(
        "EXPLAIN SELECT window_end, host, avg(cpu) FROM {hop} GROUP BY window_end, host"
    )) else {
        panic!("explains")
    };
    assert!(
        text.contains("hop(slide 5000 ms, size 15000 ms, panes of 5000 ms)"),
        "{text}"
    );
}

#[test]
fn set_parallelism_splits_keyed_stages_into_instances() {
    let mut engine = engine();
    let query = "EXPLAIN SELECT window_start, host, avg(cpu) AS a \
            FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_start, window_end, host";
    let mut explain = |setting: &str| {
        let script = format!("SET parallelism = {setting}; {query};");
        let statements = parse_script(&script).unwrap();
        let mut text = String::new();
        for s in &statements {
            match engine.execute(s, Path::new(".")) {
                Ok(Outcome::Explain(t)) => text = t,
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(text)
    };
    let three = explain("3").unwrap();
    let keyed = three
        .lines()
        .find(|l| l.contains("window aggregate"))
        .unwrap();
    assert!(
        keyed.contains("[3 instances; exchange: rows by hash(host@1) into 128 key groups]"),
        "{three}"
    );
    let watermark = three.lines().find(|l| l.contains("watermark(")).unwrap();
    assert!(!watermark.contains("instances"), "{three}");
    let one = explain("1").unwrap();
    assert!(!one.contains("instances"), "{one}");
    for bad in ["0", "129", "two"] {
        let e = explain(bad).unwrap_err();
        assert!(e.contains("parallelism must be"), "{e}");
    }
}

#[test]
fn set_execution_mode_applies_to_later_queries() {
    let mut engine = engine();
    let script = "EXPLAIN SELECT host FROM m;
            SET execution_mode = 'per_record';
            EXPLAIN SELECT host FROM m;
            SET execution_mode TO micro_batch;
            EXPLAIN SELECT host FROM m;";
    let modes: Vec<String> = parse_script(script)
        .unwrap()
        .iter()
        .filter_map(|s| match engine.execute(s, Path::new(".")).unwrap() {
            Outcome::Explain(text) => Some(
                text.lines()
                    .find(|l| l.starts_with("operator graph"))
                    .unwrap()
                    .to_string(),
            ),
            _ => None,
        })
        .collect();
    assert_eq!(
        modes,
        [
            "operator graph (micro-batch):",
            "operator graph (per-record):",
            "operator graph (micro-batch):"
        ]
    );
    let bad = parse_script("SET execution_mode = 'fast'")
        .unwrap()
        .remove(0);
    let e = engine
        .execute(&bad, Path::new("."))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("'micro_batch' or 'per_record'"), "{e}");
    let unknown = parse_script("SET nosuch = 1").unwrap().remove(0);
    let e = engine
        .execute(&unknown, Path::new("."))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("unknown setting 'nosuch'"), "{e}");
}

#[test]
fn buffer_options_and_settings_reach_the_query_inputs() {
    let script = "CREATE STREAM b (ts TIMESTAMP, host TEXT)
                WITH (path = 'b.csv', buffer = 'disk', buffer_max = '2GiB');
            CREATE STREAM n (ts TIMESTAMP, host TEXT) WITH (path = 'n.csv', buffer = 'none');
            SELECT host FROM m; SELECT host FROM b; SELECT host FROM n;
            SET buffer = 'disk'; SET buffer_max TO '512 MiB';
            SELECT host FROM m; SELECT host FROM b; SELECT host FROM n;";
    let mut engine = self::engine();
    let bounds: Vec<Option<u64>> = parse_script(script)
        .unwrap()
        .iter()
        .filter_map(|s| match engine.execute(s, Path::new(".")).unwrap() {
            Outcome::Query(q) => Some(q.graph.inputs[0].stream.buffer.disk_bytes()),
            _ => None,
        })
        .collect();
    assert_eq!(
        bounds,
        [
            None,
            Some(2 << 30),
            None,
            // The session's setting fills in what a stream does not say.
            Some(512 << 20),
            Some(2 << 30),
            None,
        ]
    );
    let described = parse_script("DESCRIBE b").unwrap().remove(0);
    let Outcome::Rows(listing) = engine.execute(&described, Path::new(".")).unwrap() else {
        panic!("DESCRIBE lists")
    };
    assert!(
        listing
            .notes
            .iter()
            .any(|n| n == "a query behind it buffers its rows on disk, up to 2147483648 bytes"),
        "{:?}",
        listing.notes
    );
    let mut fresh = self::engine();
    let mut e = |sql: &str| {
        let statement = parse_script(sql).unwrap().remove(0);
        fresh
            .execute(&statement, Path::new("."))
            .err()
            .unwrap()
            .to_string()
    };
    let bad = e("CREATE STREAM x (ts TIMESTAMP) WITH (path = 'x.csv', buffer = 'memory')");
    assert!(
        bad.contains("bad value 'memory' for option 'buffer' (accepted: disk, none)"),
        "{bad}"
    );
    for size in ["lots", "10 parsecs", "1000"] {
        let bad = e(&format!(
            "CREATE STREAM x (ts TIMESTAMP) WITH (path = 'x.csv', buffer_max = '{size}')"
        ));
        assert!(
            bad.contains(&format!("bad value '{size}' for option 'buffer_max'")),
            "{bad}"
        );
    }
    let twice =
        e("CREATE STREAM x (ts TIMESTAMP) WITH (path = 'x.csv', buffer = 'disk', buffer = 'none')");
    assert!(
        twice.contains("'buffer' is given more than once"),
        "{twice}"
    );
    let bad = e("SET buffer = 'ram'");
    assert!(
        bad.contains("SET: bad value 'ram' for option 'buffer'"),
        "{bad}"
    );
}

#[test]
fn planning_errors_name_the_problem() {
    assert!(err("SELECT nosuch FROM m").contains("nosuch"));
    assert!(err("SELECT * FROM nope").contains("unknown stream 'nope'"));
    assert!(err("SELECT * FROM TUMBLE(m, host, INTERVAL '1' SECOND)").contains("not a TIMESTAMP"));
    assert!(err("SELECT * FROM TUMBLE(m, ts, INTERVAL '1' MONTH)").contains("fixed-length"));
    assert!(err("INSERT INTO nosink SELECT * FROM m").contains("unknown sink 'nosink'"));
}

/// Parses, plans and drops `sql` after [`STREAM`] on a thread with
/// tokio's worker stack (2 MiB), where the service plans.
fn plan_on_small_stack(sql: String) -> std::result::Result<(), String> {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let mut engine = engine();
            for statement in parse_script(&sql).map_err(|e| e.to_string())? {
                engine
                    .execute(&statement, Path::new("."))
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        })
        .expect("a thread")
        .join()
        .expect("no panic")
}

#[test]
fn expressions_at_the_depth_limit_plan_on_a_worker_stack() {
    use crate::sql::limits::MAX_EXPR_DEPTH;
    let terms = MAX_EXPR_DEPTH - 10;
    let sum = vec!["cpu"; terms].join(" + ");
    let all = vec!["cpu > 0"; terms / 2].join(" AND ");
    let names = vec!["host"; terms].join(" || ");
    let alert = vec!["s > 0"; terms / 2].join(" AND ");
    let sql = format!(
        "SELECT window_end, host, max({sum}) AS s FROM TUMBLE(m, ts, INTERVAL '1' SECOND)
             WHERE {all} GROUP BY window_end, host ALERT WHEN {alert};
             SELECT {names} FROM m WHERE {all};"
    );
    plan_on_small_stack(sql).expect("plans");
}

#[test]
fn view_chains_past_the_plan_limit_are_refused() {
    let mut sql = String::from("CREATE VIEW v0 AS SELECT host, cpu FROM m;\n");
    for i in 1..400 {
        sql.push_str(&format!(
            "CREATE VIEW v{i} AS SELECT host, cpu + 1 AS cpu FROM v{};\n",
            i - 1
        ));
    }
    let e = plan_on_small_stack(sql).expect_err("refused");
    assert!(
        e.contains(&format!(
            "query plan too deep: more than {MAX_PLAN_DEPTH} levels"
        )),
        "{e}"
    );
    // A stack of views well within the limit plans.
    let mut sql = String::from("CREATE VIEW v0 AS SELECT host, cpu FROM m;\n");
    for i in 1..20 {
        sql.push_str(&format!(
            "CREATE VIEW v{i} AS SELECT host, cpu + 1 AS cpu FROM v{};\n",
            i - 1
        ));
    }
    sql.push_str("SELECT * FROM v19;");
    plan_on_small_stack(sql).expect("plans");
}

#[test]
fn explain_shows_both_plans() {
    let Ok(Outcome::Explain(text)) = run(
        "EXPLAIN SELECT window_end, max(cpu) FROM TUMBLE(m, ts, INTERVAL '1' MINUTE) GROUP BY window_end",
    ) else {
        panic!("explains")
    };
    assert!(
        text.contains("WindowAssign: tumble(60000 ms) on ts"),
        "{text}"
    );
    assert!(text.contains("Watermark: ts - 2000 ms"), "{text}");
    assert!(text.contains("operator graph (micro-batch)"), "{text}");
}

/// Runs each statement of `sql` on `engine`; the last outcome.
fn exec(engine: &mut Engine, sql: &str) -> Result<Outcome> {
    let mut last = Ok(Outcome::Done);
    for statement in parse_script(sql).unwrap() {
        last = Ok(engine.execute(&statement, Path::new("."))?);
    }
    last
}

fn dropped(outcome: Outcome) -> Vec<String> {
    let Outcome::Dropped(dropped) = outcome else {
        panic!("not a drop")
    };
    dropped
        .iter()
        .map(|d| format!("{} {}", d.kind, d.name))
        .collect()
}

const READERS: &str = "CREATE VIEW hot AS SELECT ts, host, cpu FROM m WHERE cpu > 50;
        CREATE VIEW hotter AS SELECT ts, host, cpu FROM hot WHERE cpu > 90;
        CREATE ALERT busy AS SELECT ts, host, cpu FROM hot ALERT BY host WHEN cpu > 95;";

#[test]
fn a_declared_name_says_how_to_replace_or_drop_it() {
    let mut engine = engine();
    let e = exec(&mut engine, STREAM).err().unwrap().to_string();
    assert!(
        e.contains("stream 'm' already exists")
            && e.contains("CREATE OR REPLACE STREAM m")
            && e.contains("DROP STREAM m"),
        "{e}"
    );
    let e = exec(&mut engine, "CREATE VIEW m AS SELECT host FROM m")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("a stream named 'm' already exists"), "{e}");
    let sink = "CREATE SINK s WITH (connector = 'stdout');";
    exec(&mut engine, sink).unwrap();
    let e = exec(&mut engine, sink).err().unwrap().to_string();
    assert!(e.contains("CREATE OR REPLACE SINK s"), "{e}");
}

#[test]
fn drop_is_refused_while_something_reads_the_entry_unless_cascade() {
    let mut engine = engine();
    exec(&mut engine, READERS).unwrap();
    let e = exec(&mut engine, "DROP STREAM m")
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        e,
        "cannot drop stream 'm': view 'hot', view 'hotter' and alert 'busy' read it (DROP STREAM m CASCADE drops them too)"
    );
    let e = exec(&mut engine, "DROP VIEW busy")
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("'busy' is an alert, not a view (DROP ALERT busy"),
        "{e}"
    );
    // A reader without readers goes on its own.
    assert_eq!(
        dropped(exec(&mut engine, "DROP VIEW hotter").unwrap()),
        ["view hotter"]
    );
    assert_eq!(
        dropped(exec(&mut engine, "DROP STREAM m CASCADE").unwrap()),
        ["stream m", "alert busy", "view hot"]
    );
    assert!(engine.catalog().stream("m").is_none());
    assert!(engine.catalog().view("hot").is_none());
    let e = exec(&mut engine, "SELECT * FROM hot")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("unknown stream 'hot'"), "{e}");
    // Gone, so it can be declared again.
    exec(&mut engine, STREAM).unwrap();
    exec(&mut engine, READERS).unwrap();
}

#[test]
fn drop_of_nothing() {
    let mut engine = engine();
    assert!(dropped(exec(&mut engine, "DROP VIEW IF EXISTS nope").unwrap()).is_empty());
    let e = exec(&mut engine, "DROP ALERT nope")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no alert named 'nope'"), "{e}");
    let e = exec(&mut engine, "DROP STREAM host_metrics")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("built in"), "{e}");
    let e = exec(&mut engine, "DROP SINK s").err().unwrap().to_string();
    assert!(e.contains("no sink named 's' (SHOW SINKS"), "{e}");
    exec(&mut engine, "CREATE SINK s WITH (connector = 'stdout')").unwrap();
    assert_eq!(
        dropped(exec(&mut engine, "DROP SINK s").unwrap()),
        ["sink s"]
    );
    let e = exec(&mut engine, "INSERT INTO s SELECT * FROM m")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("unknown sink 's'"), "{e}");
}

#[test]
fn replace_plans_the_readers_again_on_the_new_definition() {
    let mut engine = engine();
    exec(&mut engine, READERS).unwrap();
    // The new stream has another column: the readers follow it.
    exec(
        &mut engine,
        "CREATE OR REPLACE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE, mem DOUBLE)
             WITH (path = 'other.csv')",
    )
    .unwrap();
    let Outcome::Explain(text) = exec(&mut engine, "EXPLAIN SELECT * FROM hotter").unwrap() else {
        panic!("explains")
    };
    assert!(text.contains("other.csv"), "{text}");
    assert!(
        !text.contains("2000 ms"),
        "the new stream has no delay: {text}"
    );
    // The readers keep their order: `hotter` still reads `hot`.
    let e = exec(&mut engine, "DROP VIEW hot")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("view 'hotter' and alert 'busy' read it"), "{e}");

    // A replacement the readers cannot plan on changes nothing.
    let e = exec(
        &mut engine,
        "CREATE OR REPLACE VIEW hot AS SELECT ts, host FROM m",
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("cannot replace view 'hot': view 'hotter' reads it and does not plan"),
        "{e}"
    );
    assert!(e.contains("cpu"), "{e}");
    let Outcome::Rows(listing) = exec(&mut engine, "DESCRIBE hot").unwrap() else {
        panic!("describes")
    };
    assert_eq!(listing.rows.len(), 3, "{listing:?}");

    // A replacement cannot read what reads it.
    let e = exec(
        &mut engine,
        "CREATE OR REPLACE VIEW hot AS SELECT ts, host, cpu FROM hotter",
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("view 'hot' cannot read view 'hotter', which reads it"),
        "{e}"
    );

    // Replacing an alert gives its new query; across kinds is refused.
    let outcome = exec(
        &mut engine,
        "CREATE OR REPLACE ALERT busy AS SELECT ts, host, cpu FROM hot ALERT WHEN cpu > 99",
    )
    .unwrap();
    assert!(matches!(outcome, Outcome::Query(q) if q.declares_alert.as_deref() == Some("busy")));
    let e = exec(
        &mut engine,
        "CREATE OR REPLACE VIEW busy AS SELECT * FROM m",
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("'busy' is an alert, not a view"), "{e}");
    // Of nothing, it is a plain CREATE.
    exec(
        &mut engine,
        "CREATE OR REPLACE VIEW fresh AS SELECT host FROM m",
    )
    .unwrap();
    assert!(engine.catalog().view("fresh").is_some());
}

/// A view or alert over a built-in stream names it as its source.
#[test]
fn a_view_of_a_built_in_stream_names_it() {
    let mut engine = engine();
    exec(
        &mut engine,
        "CREATE VIEW busy_here AS SELECT ts, cpu FROM host_metrics WHERE cpu > 90",
    )
    .unwrap();
    let Outcome::Rows(views) = exec(&mut engine, "SHOW VIEWS").unwrap() else {
        panic!("rows")
    };
    let row = views
        .rows
        .iter()
        .find(|r| r[0] == "busy_here")
        .expect("the view");
    assert_eq!(row.last().unwrap(), "reads host_metrics", "{views:?}");
}

#[test]
fn show_and_describe_list_the_catalog() {
    let mut engine = engine();
    exec(&mut engine, READERS).unwrap();
    exec(
        &mut engine,
        "CREATE SINK out WITH (connector = 'file', path = 'o.csv')",
    )
    .unwrap();
    let Outcome::Rows(streams) = exec(&mut engine, "SHOW STREAMS").unwrap() else {
        panic!("rows")
    };
    assert_eq!(streams.columns, ["name", "kind", "columns", "source"]);
    let names: Vec<[&str; 2]> = streams
        .rows
        .iter()
        .map(|r| [r[0].as_str(), r[1].as_str()])
        .collect();
    assert_eq!(
        names,
        [
            ["m", "stream"],
            ["host_metrics", "stream"],
            ["demo", "stream"],
            ["hot", "view"],
            ["hotter", "view"],
            ["busy", "alert"],
            ["out", "sink"]
        ]
    );
    assert_eq!(streams.rows[0][2], "ts TIMESTAMP, host TEXT, cpu DOUBLE");
    assert!(streams.rows[0][3].contains("m.csv (csv)"), "{streams:?}");
    assert!(streams.rows[1][3].ends_with("(built in)"), "{streams:?}");
    assert_eq!(streams.rows[4][3], "reads hot, m");
    let Outcome::Rows(alerts) = exec(&mut engine, "SHOW ALERTS").unwrap() else {
        panic!("rows")
    };
    assert_eq!(alerts.rows.len(), 1);
    assert_eq!(alerts.rows[0][0], "busy");
    let Outcome::Rows(sinks) = exec(&mut engine, "SHOW SINKS").unwrap() else {
        panic!("rows")
    };
    assert_eq!(
        sinks.rows,
        [["out".to_string(), "file ./o.csv (csv)".to_string()]]
    );
    assert!(matches!(
        exec(&mut engine, "SHOW QUERIES").unwrap(),
        Outcome::ShowQueries
    ));

    let Outcome::Rows(m) = exec(&mut engine, "DESCRIBE m").unwrap() else {
        panic!("rows")
    };
    assert_eq!(m.notes[1], "event time: ts, watermark delay 2 s");
    assert_eq!(m.rows[0], ["ts", "TIMESTAMP", "event time"]);
    let Outcome::Rows(busy) = exec(&mut engine, "DESCRIBE busy").unwrap() else {
        panic!("rows")
    };
    assert_eq!(busy.notes, ["alert busy: reads hot, m"]);
    let e = exec(&mut engine, "DESCRIBE nope")
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("no stream, view, alert, invariant or sink named 'nope'"),
        "{e}"
    );
}

fn shed_engine(options: &str) -> Result<Engine> {
    let mut engine = Engine::new();
    let sql = format!(
        "CREATE STREAM s (ts TIMESTAMP, host TEXT, severity BIGINT) WITH (path = 's.csv'{options});"
    );
    for s in parse_script(&sql).unwrap() {
        engine.execute(&s, Path::new("."))?;
    }
    Ok(engine)
}

fn explain(engine: &mut Engine, query: &str) -> Result<String> {
    let mut text = String::new();
    for s in parse_script(query).unwrap() {
        if let Outcome::Explain(t) = engine.execute(&s, Path::new("."))? {
            text = t;
        }
    }
    Ok(text)
}

const WINDOWED: &str = "EXPLAIN SELECT window_start, host, count(*) AS n
        FROM TUMBLE(s, ts, INTERVAL '10' SECOND) GROUP BY window_start, window_end, host;";

#[test]
fn bad_shed_options_are_rejected_with_the_reason() {
    for (options, expected) in [
        (
            ", shed = 'sometimes'",
            "shed must be 'random', 'priority', 'window' or 'off'",
        ),
        (", shed = 'priority'", "shed = 'priority' needs shed_keep"),
        (
            ", shed = 'random', max_latency = 'soon'",
            "bad value 'soon' for option 'max_latency'",
        ),
        (
            ", shed = 'random', max_latency = '0 seconds'",
            "max_latency must be longer than 0",
        ),
        (
            ", shed = 'priority', shed_keep = 'severity + 1'",
            "not a boolean",
        ),
        (
            ", shed = 'priority', shed_keep = 'level > 2'",
            "bad shed_keep 'level > 2'",
        ),
        (
            ", shed = 'random', shed_scale = 'yes'",
            "shed_scale must be 'true' or 'false'",
        ),
    ] {
        let e = shed_engine(options).expect_err(options).to_string();
        assert!(e.contains(expected), "{options}: {e}");
    }
}

#[test]
fn set_shed_overrides_the_stream_for_later_queries() {
    let mut engine = shed_engine(", shed = 'random', max_latency = '2 seconds'").unwrap();
    let plan = explain(&mut engine, WINDOWED).unwrap();
    assert!(plan.contains("task 1: shed random under 2000 ms"), "{plan}");
    assert!(plan.contains("with _shed_fraction"), "{plan}");
    let plan = explain(
        &mut engine,
        &format!("SET max_latency = '500 milliseconds'; SET shed_scale = 'true'; {WINDOWED}"),
    )
    .unwrap();
    assert!(plan.contains("shed random under 500 ms"), "{plan}");
    assert!(plan.contains("count and sum scaled up"), "{plan}");
    let plan = explain(&mut engine, &format!("SET shed = 'off'; {WINDOWED}")).unwrap();
    assert!(!plan.contains("shed"), "{plan}");
    let e = explain(&mut engine, "SET shed = 'often';")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("shed must be"), "{e}");
}

#[test]
fn set_shed_turns_shedding_on_for_a_stream_without_it() {
    let mut engine = shed_engine("").unwrap();
    let plan = explain(&mut engine, WINDOWED).unwrap();
    assert!(!plan.contains("shed"), "{plan}");
    let plan = explain(
        &mut engine,
        "SET shed = 'window'; EXPLAIN SELECT host FROM s WHERE severity > 1;",
    );
    let e = plan.err().unwrap().to_string();
    assert!(
        e.contains("shed = 'window' needs a windowed aggregate"),
        "{e}"
    );
    let plan = explain(
        &mut engine,
        "SET shed = 'random'; EXPLAIN SELECT host FROM s;",
    )
    .unwrap();
    assert!(plan.contains("task 1: shed random under 2000 ms"), "{plan}");
}

#[test]
fn queries_shedding_cannot_mark_are_refused() {
    let mut engine = shed_engine(", shed = 'random'").unwrap();
    let e = explain(
        &mut engine,
        "EXPLAIN SELECT host, count(*) AS n FROM s GROUP BY host EMIT CHANGES;",
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("load shedding cannot apply to this query"),
        "{e}"
    );
    let e = explain(
        &mut engine,
        "EXPLAIN SELECT window_start, n FROM (SELECT window_start, window_end, count(*) AS n
               FROM TUMBLE(s, ts, INTERVAL '10' SECOND) GROUP BY window_start, window_end, host)
             GROUP BY window_start, window_end, n;",
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("load shedding cannot apply"), "{e}");
}
