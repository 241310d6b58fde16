//! JSON lines: rows, missing fields and nulls, the fast path agreeing with
//! the slow one, bad rows, and the dead-letter file.

use super::*;

#[test]
pub(super) fn jsonl_rows() {
    let run = run_jsonl(
        "{\"ts\":\"1970-01-01T00:00:01Z\",\"host\":\"a\",\"cpu\":1.5,\"n\":2,\"up\":true}\n\
             {\"ts\":2000,\"host\":\"b\\\"q\\\"\",\"cpu\":3,\"n\":4.0,\"up\":false,\"other\":[1,{}]}\n\
             {\"TS\":3000,\"Host\":\"c\"}\n",
    );
    assert_eq!(
        run.table(),
        vec![
            "1000|a|1.5|2|true",
            "2000|b\"q\"|3|4|false",
            "3000|c|NULL|NULL|NULL",
        ]
    );
}

#[test]
fn jsonl_missing_fields_and_nulls() {
    let run = run_jsonl(
        "{\"ts\":1000}\n{\"ts\":2000,\"host\":null,\"cpu\":null,\"n\":null,\"up\":null}\n",
    );
    assert_eq!(
        run.table(),
        vec!["1000|NULL|NULL|NULL|NULL", "2000|NULL|NULL|NULL|NULL"]
    );
}

/// Decodes a JSON line with the fast path (falling back) and with the
/// slow one alone; both must give the same values and text, or the
/// same error.
fn fast_and_slow_agree(line: &str, unit: TsUnit) {
    let schema = schema();
    let kinds: Vec<Kind> = schema
        .fields()
        .iter()
        .map(|f| Kind::of(f.data_type()).unwrap())
        .collect();
    let decode = |slow: bool| {
        let mut vals = vec![Val::Int(7); kinds.len()];
        let mut arena = String::new();
        let args = (line.as_bytes(), &schema, &kinds[..], unit, Some(0));
        let result = if slow {
            slow_json_row(
                args.0, args.1, args.2, args.3, args.4, &mut vals, &mut arena,
            )
        } else {
            parse_json_row(
                args.0, args.1, args.2, args.3, args.4, &mut vals, &mut arena,
            )
        };
        // A text is compared by its value: a key given twice may
        // leave the first value unused in the arena.
        result.map(|epoch| {
            let vals: Vec<std::result::Result<Val, String>> = vals
                .iter()
                .map(|v| match *v {
                    Val::Text(a, b) => Err(arena[a..b].to_string()),
                    v => Ok(v),
                })
                .collect();
            (epoch, vals)
        })
    };
    assert_eq!(decode(false), decode(true), "{line}");
}

#[test]
fn the_fast_json_path_decodes_as_the_slow_one() {
    let lines = [
        r#"{"ts":1000,"host":"a","cpu":1.5,"n":3,"up":true}"#,
        r#"{"ts":"2024-01-01T00:00:00Z","host":"a\"b\u00e9"}"#,
        r#"{"ts":1.5,"n":2.0,"cpu":3}"#,
        r#"{"ts":1.5e3,"n":1e2,"cpu":-0.0}"#,
        r#"{"ts":18446744073709551615}"#,
        r#"{"ts":-5,"n":9223372036854775807}"#,
        r#"{"ts":1000,"n":18446744073709551615}"#,
        r#"{"ts":1000,"n":1.5}"#,
        r#"{"ts":1000,"host":1}"#,
        r#"{"ts":1000,"cpu":"1.5"}"#,
        r#"{"ts":1000,"up":"true"}"#,
        r#"{"ts":null,"host":null}"#,
        r#"{"TS":1000,"Host":"x"}"#,
        r#"{"ts":1000,"TS":2000}"#,
        r#"{"ts":1000,"ts":2000,"host":"a","host":"b"}"#,
        r#"{"ts":1000,"host":"a","host":2}"#,
        r#"{"ts":1000,"x":[1,{"y":[]}],"z":{"a":null}}"#,
        r#"{"ts":1000,"host":["a"]}"#,
        r#"{"ts":1000} x"#,
        r#"{"ts":1000,}"#,
        r#"[1,2]"#,
        r#""text""#,
        r#"12"#,
        r#"null"#,
        r#"{"ts":"soon"}"#,
        r#"{"ts":99999999999999999999}"#,
        r#"{"host":"a"}"#,
        r#"{}"#,
    ];
    for unit in [TsUnit::Millis, TsUnit::Seconds, TsUnit::Micros] {
        for line in lines {
            fast_and_slow_agree(line, unit);
        }
    }
    // The common row takes the fast path.
    let schema = schema();
    let kinds: Vec<Kind> = schema
        .fields()
        .iter()
        .map(|f| Kind::of(f.data_type()).unwrap())
        .collect();
    let mut vals = vec![Val::Null; kinds.len()];
    let mut arena = String::new();
    let fast = fast_json_row(
        lines[0].as_bytes(),
        &schema,
        &kinds,
        TsUnit::Millis,
        Some(0),
        &mut vals,
        &mut arena,
    );
    assert_eq!(fast, Some(true));
}

#[test]
pub(super) fn jsonl_bad_rows_and_blank_lines() {
    let run = run_jsonl(
        "{\"ts\":1000,\"host\":\"a\"}\n\
             \n\
             {\"ts\":2000,\"host\":\"a\"\n\
             {\"ts\":3000,\"cpu\":\"high\"}\n\
             \x20\x20\t\n\
             {\"ts\":4000,\"host\":5}\n\
             {\"ts\":5000,\"n\":1.5}\n\
             {\"ts\":\"soon\"}\n\
             [1,2]\n\
             {\"ts\":true}\n\
             {\"host\":\"no time\"}\n\
             {\"ts\":6000,\"up\":\"yes\"}\n\
             {\"ts\":7000} trailing\n\
             {\"ts\":8000,\"host\":\"z\"}\r\n",
    );
    assert_eq!(
        run.table(),
        vec!["1000|a|NULL|NULL|NULL", "8000|z|NULL|NULL|NULL"]
    );
    let bad = run.bad();
    let lines: Vec<u64> = bad.iter().map(|(l, _)| *l).collect();
    assert_eq!(lines, vec![3, 4, 6, 7, 8, 9, 10, 11, 12, 13]);
    // Only the first BAD_ROW_SAMPLES are kept; the count is complete.
    assert_eq!(run.stats.bad_rows.load(Ordering::Relaxed), 10);
    assert!(bad[0].1.starts_with("invalid JSON: "), "{}", bad[0].1);
    assert!(!bad[0].1.contains("line 1"), "{}", bad[0].1);
    assert_eq!(bad[1].1, "column cpu: expected DOUBLE, found string 'high'");
    assert_eq!(bad[2].1, "column host: expected TEXT, found number 5");
    assert_eq!(bad[3].1, "column n: cannot represent 1.5 as BIGINT");
    assert_eq!(bad[4].1, "column ts: cannot parse 'soon' as TIMESTAMP");
    assert_eq!(bad[5].1, "expected a JSON object, found an array");
    assert_eq!(
        bad[6].1,
        "column ts: expected TIMESTAMP, found boolean true"
    );
    assert_eq!(bad[7].1, "column ts: missing event time");
    assert_eq!(bad[8].1, "column up: expected BOOLEAN, found string 'yes'");
    assert!(
        bad[9].1.starts_with("invalid JSON: trailing characters"),
        "{}",
        bad[9].1
    );
}

#[test]
fn dead_letter_file() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.csv");
    std::fs::write(
        &input,
        "ts,host,cpu,n,up\n1000,a,1,1,true\n2000,\"b,c\",zz,1,true\n3000,a\n",
    )
    .unwrap();
    let dead = dir.path().join("bad.txt");
    std::fs::write(&dead, "earlier\n").unwrap();
    let cfg = SourceConfig {
        dead_letter: Some(dead.clone()),
        ..config(Format::Csv, SourceLocation::File(input))
    };
    let stats = SourceStats::default();
    let mut rows = 0;
    read_source(&cfg, &stats, &mut |b| {
        rows += b.num_rows();
        true
    })
    .unwrap();
    assert_eq!(rows, 1);
    assert_eq!(
        std::fs::read_to_string(&dead).unwrap(),
        "earlier\n\
             3\tcolumn cpu: cannot parse 'zz' as DOUBLE\t2000,\"b,c\",zz,1,true\n\
             4\texpected 5 fields, found 2\t3000,a\n"
    );

    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"ts\":1}\n{\"ts\":\"x\"}\n").unwrap();
    let dead = dir.path().join("bad-json.txt");
    let cfg = SourceConfig {
        dead_letter: Some(dead.clone()),
        ..config(Format::Jsonl, SourceLocation::File(input))
    };
    read_source(&cfg, &stats, &mut |_| true).unwrap();
    assert_eq!(
        std::fs::read_to_string(&dead).unwrap(),
        "2\tcolumn ts: cannot parse 'x' as TIMESTAMP\t{\"ts\":\"x\"}\n"
    );
}

#[test]
fn no_dead_letter_file_without_bad_rows() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.csv");
    std::fs::write(&input, "ts,host,cpu,n,up\n1000,a,1,1,true\n").unwrap();
    let dead = dir.path().join("bad.txt");
    let cfg = SourceConfig {
        dead_letter: Some(dead.clone()),
        ..config(Format::Csv, SourceLocation::File(input))
    };
    read_source(&cfg, &SourceStats::default(), &mut |_| true).unwrap();
    assert!(!dead.exists());
}

#[test]
fn missing_file_is_a_connector_error() {
    let cfg = config(
        Format::Csv,
        SourceLocation::File(PathBuf::from("/nonexistent/vigil/m.csv")),
    );
    let err = read_source(&cfg, &SourceStats::default(), &mut |_| true).unwrap_err();
    assert!(matches!(err, Error::Connector(_)));
    let msg = err.to_string();
    assert!(
        msg.starts_with("cannot open /nonexistent/vigil/m.csv: "),
        "{msg}"
    );
}

#[test]
fn unsupported_column_type_is_an_error() {
    let cfg = SourceConfig {
        schema: Arc::new(Schema::new(vec![Field::new("d", DataType::Date32, true)])),
        event_time: None,
        ..config(Format::Csv, SourceLocation::Stdin)
    };
    let run = run_reader(&cfg, Cursor::new(b"d\n1\n".to_vec()), false);
    assert!(run.result.unwrap_err().to_string().contains("column d"));
}

#[test]
fn non_nullable_column_rejects_nulls() {
    let cfg = SourceConfig {
        schema: Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)])),
        event_time: None,
        ..config(Format::Csv, SourceLocation::Stdin)
    };
    let run = run_reader(&cfg, Cursor::new(b"v\n1\n\"\"\n3\n".to_vec()), false);
    assert_eq!(run.rows(), 2);
    assert_eq!(run.bad(), vec![(3, "column v: missing value".to_string())]);
}
