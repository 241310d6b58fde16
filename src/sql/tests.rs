use super::*;

fn one(sql: &str) -> StatementKind {
    let mut statements = parse_script(sql).expect("parses");
    assert_eq!(statements.len(), 1);
    statements.remove(0).kind
}

fn error(sql: &str) -> String {
    parse_script(sql).expect_err("must fail").to_string()
}

#[test]
fn create_stream_with_watermark_and_options() {
    let StatementKind::CreateStream(s) = one(
        "CREATE STREAM Metrics (ts TIMESTAMP, \"Host\" TEXT, cpu DOUBLE,
           WATERMARK FOR ts AS ts - INTERVAL '2' SECOND)
         WITH (connector = 'file', PATH = 'm.csv', batch_size = 10);",
    ) else {
        panic!("not a stream")
    };
    assert_eq!(s.name, "metrics");
    let names: Vec<_> = s.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["ts", "Host", "cpu"]);
    let w = s.watermark.expect("watermark");
    assert_eq!(w.column, "ts");
    assert_eq!(w.delay.expect("delay").to_string(), "INTERVAL '2' SECOND");
    assert_eq!(
        s.options,
        [
            ("connector".to_string(), "file".to_string()),
            ("path".to_string(), "m.csv".to_string()),
            ("batch_size".to_string(), "10".to_string())
        ]
    );
}

#[test]
fn option_keys_may_be_dotted_or_quoted() {
    let StatementKind::CreateSink(s) = one(
        "CREATE SINK out WITH (connector = 'kafka', properties.Session.timeout.ms = '6000',
           'properties.client.id' = 'x');",
    ) else {
        panic!("not a sink")
    };
    assert_eq!(s.options[1].0, "properties.session.timeout.ms");
    assert_eq!(s.options[2].0, "properties.client.id");
    let e = error("CREATE SINK out WITH (properties. = 'x');");
    assert!(e.contains("line 1"), "{e}");
}

#[test]
fn watermark_without_delay() {
    let StatementKind::CreateStream(s) = one(
        "CREATE STREAM s (\"timestamp\" TIMESTAMP, WATERMARK FOR \"timestamp\" AS \"timestamp\")",
    ) else {
        panic!("not a stream")
    };
    let w = s.watermark.expect("watermark");
    assert_eq!(w.column, "timestamp");
    assert!(w.delay.is_none());
}

#[test]
fn watermark_on_other_column_is_rejected() {
    let e = error(
        "CREATE STREAM s (ts TIMESTAMP, t2 TIMESTAMP, WATERMARK FOR ts AS t2 - INTERVAL '1' SECOND)",
    );
    assert!(e.contains("WATERMARK expression must be"), "{e}");
    assert!(e.contains("line 1, column 66"), "{e}");
}

#[test]
fn sink_insert_and_explain() {
    let statements = parse_script(
        "CREATE SINK out WITH (connector = 'file', path = 'o.csv');
         INSERT INTO out SELECT * FROM s;
         EXPLAIN SELECT 1;",
    )
    .expect("parses");
    assert!(matches!(&statements[0].kind, StatementKind::CreateSink(s) if s.name == "out"));
    assert!(
        matches!(&statements[1].kind, StatementKind::Query { sink: Some(n), .. } if n == "out")
    );
    assert!(matches!(&statements[2].kind, StatementKind::Explain { .. }));
    assert_eq!(statements[1].line, 2);
}

#[test]
fn errors_carry_line_column_and_caret() {
    let e = error("CREATE STREAM s (ts TIMESTAMP);\nSELEC host FROM s;");
    assert!(e.contains("at line 2, column 1"), "{e}");
    assert!(e.contains(" 2 | SELEC host FROM s;\n   | ^"), "{e}");
    let e = error("SELECT a FROM s WHERE;");
    assert!(e.contains("line 1, column 22"), "{e}");
    let e = error("SELECT 'unterminated FROM s;");
    assert!(e.contains("line 1, column"), "{e}");
}

#[test]
fn unsupported_statements_are_named() {
    let e = error("CREATE TABLE x (a INT);");
    assert!(e.contains("unsupported statement: CREATE TABLE x"), "{e}");
}

#[test]
fn statements_need_separators() {
    let e = error("SELECT 1 SELECT 2");
    assert!(e.contains("line 1, column 10"), "{e}");
}

#[test]
fn emit_clauses() {
    let statements = parse_script(
        "SELECT host, count(*) FROM m GROUP BY host EMIT CHANGES;
         INSERT INTO out SELECT * FROM m EMIT ON WINDOW CLOSE;
         EXPLAIN SELECT 1 EMIT EVERY INTERVAL '5' SECOND;
         SELECT 1;",
    )
    .expect("parses");
    let emits: Vec<Option<Emit>> = statements
        .into_iter()
        .map(|s| match s.kind {
            StatementKind::Query { emit, .. } | StatementKind::Explain { emit, .. } => emit,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(emits[0], Some(Emit::Changes));
    assert_eq!(emits[1], Some(Emit::OnWindowClose));
    assert!(matches!(&emits[2], Some(Emit::Every(e)) if e.to_string() == "INTERVAL '5' SECOND"));
    assert_eq!(emits[3], None);
    // `EMIT` followed by no policy word stays what SQL makes of it (an alias).
    let e = error("SELECT 1 FROM s EMIT SOMETIMES;");
    assert!(e.contains("found: SOMETIMES at line 1, column 22"), "{e}");
    let e = error("SELECT 1 EMIT EVERY;");
    assert!(e.contains("line 1, column 20"), "{e}");
    let e = error("CREATE SINK o WITH (path = 'x') EMIT CHANGES;");
    assert!(e.contains("EMIT belongs to a query"), "{e}");
    // Nested EMIT words are SQL's, not the clause.
    let statements = parse_script("SELECT emit FROM (SELECT 1 AS emit) EMIT CHANGES;").unwrap();
    assert!(matches!(
        &statements[0].kind,
        StatementKind::Query {
            emit: Some(Emit::Changes),
            ..
        }
    ));
}

#[test]
fn alert_clauses() {
    let StatementKind::Query {
        alert: Some(a),
        emit: None,
        ..
    } = one(
        "SELECT * FROM m ALERT BY host, job WHEN cpu > 90 FOR INTERVAL '5' MINUTE
         RESOLVE WHEN cpu < 70 MESSAGE 'cpu {cpu}' SEVERITY 'critical'",
    )
    else {
        panic!("a query with an alert")
    };
    assert_eq!(a.by, ["host", "job"]);
    assert_eq!(a.severity.as_deref(), Some("critical"));
    assert_eq!(a.message.as_deref(), Some("cpu {cpu}"));
    let AlertCondition::When {
        when,
        hold,
        resolve,
    } = a.condition
    else {
        panic!("when")
    };
    assert_eq!(when.to_string(), "cpu > 90");
    assert!(matches!(hold, Some(Hold::Interval(e)) if e.to_string() == "INTERVAL '5' MINUTE"));
    assert_eq!(resolve.unwrap().to_string(), "cpu < 70");

    let StatementKind::CreateAlert {
        name,
        alert: Some(a),
        emit: Some(Emit::OnWindowClose),
        ..
    } = one(
        "CREATE ALERT quiet AS SELECT ts, host FROM m EMIT ON WINDOW CLOSE
             ALERT BY host WHEN ABSENT FOR INTERVAL '1' MINUTE",
    )
    else {
        panic!("create alert")
    };
    assert_eq!(name, "quiet");
    assert!(matches!(a.condition, AlertCondition::Absent { .. }));
    let StatementKind::Query { alert: Some(a), .. } =
        one("SELECT * FROM m ALERT WHEN x FOR 3 WINDOWS")
    else {
        panic!("query")
    };
    assert!(matches!(
        a.condition,
        AlertCondition::When {
            hold: Some(Hold::Windows(3)),
            ..
        }
    ));
}

#[test]
fn bad_alert_clauses() {
    let e = error("CREATE ALERT a AS SELECT * FROM m;");
    assert!(e.contains("needs an ALERT WHEN"), "{e}");
    let e = error("SELECT * FROM m ALERT WHEN x SEVERITY 'a' SEVERITY 'b';");
    assert!(
        e.contains("each appear once") && e.contains("column 43"),
        "{e}"
    );
    let e = error("SELECT * FROM m ALERT BY host cpu > 1;");
    assert!(e.contains("Expected: WHEN"), "{e}");
    let e = error("CREATE SINK s WITH (path = 'x') ALERT WHEN x;");
    assert!(e.contains("ALERT belongs to a query"), "{e}");
    // A column named `alert` is still SQL's.
    assert!(parse_script("SELECT alert FROM m;").is_ok());
}

#[test]
fn drop_show_and_describe() {
    assert_eq!(
        one("DROP STREAM Metrics;"),
        StatementKind::Drop {
            kind: ObjectKind::Stream,
            name: "metrics".into(),
            if_exists: false,
            cascade: false
        }
    );
    assert_eq!(
        one("drop alert if exists hot cascade"),
        StatementKind::Drop {
            kind: ObjectKind::Alert,
            name: "hot".into(),
            if_exists: true,
            cascade: true
        }
    );
    for (sql, kind) in [
        ("DROP VIEW v RESTRICT", ObjectKind::View),
        ("DROP SINK s", ObjectKind::Sink),
        ("DROP INVARIANT i", ObjectKind::Invariant),
    ] {
        let StatementKind::Drop { kind: got, .. } = one(sql) else {
            panic!("{sql} is not a DROP")
        };
        assert_eq!(got, kind);
    }
    assert_eq!(one("SHOW STREAMS"), StatementKind::Show(Show::Streams));
    assert_eq!(one("SHOW TABLES"), StatementKind::Show(Show::Streams));
    assert_eq!(one("show queries;"), StatementKind::Show(Show::Queries));
    assert_eq!(one("SHOW SINKS"), StatementKind::Show(Show::Sinks));
    assert_eq!(one("SHOW ALERTS"), StatementKind::Show(Show::Alerts));
    assert_eq!(
        one("DESCRIBE \"Metrics\""),
        StatementKind::Describe {
            name: "Metrics".into()
        }
    );
    assert!(error("DROP TABLE t").contains("Expected: STREAM, VIEW, SINK, ALERT or INVARIANT"));
    assert!(error("DROP STREAM a b").contains("end of statement"));
    assert!(error("SHOW NOPE").contains("STREAMS, TABLES, VIEWS, ALERTS, SINKS or QUERIES"));
    assert!(error("SHOW NOPE").contains("line 1, column 6"));
}

#[test]
fn create_or_replace() {
    let statements = parse_script(
        "CREATE OR REPLACE STREAM m (ts TIMESTAMP) WITH (path = 'm.csv');
         create or replace view v as select * from m;
         CREATE OR REPLACE ALERT a AS SELECT ts FROM m ALERT WHEN ts IS NULL;
         CREATE VIEW w AS SELECT * FROM m;",
    )
    .unwrap();
    let replaces: Vec<bool> = statements.iter().map(|s| s.or_replace).collect();
    assert_eq!(replaces, [true, true, true, false]);
    assert!(matches!(&statements[0].kind, StatementKind::CreateStream(s) if s.name == "m"));
    assert!(matches!(&statements[1].kind, StatementKind::CreateView { name, .. } if name == "v"));
    assert!(matches!(
        &statements[2].kind,
        StatementKind::CreateAlert { name, alert: Some(_), .. } if name == "a"
    ));
    assert_eq!((statements[1].line, statements[1].column), (2, 10));
    let e = error("CREATE OR REPLACE FUNCTION f() RETURNS INT RETURN 1");
    assert!(e.contains("OR REPLACE belongs to CREATE STREAM"), "{e}");
}
