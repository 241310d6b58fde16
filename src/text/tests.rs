use std::io::Cursor;

use datafusion::arrow::array::{
    Array, BooleanArray, Float64Array, Int64Array, StringArray, TimestampMillisecondArray,
};
use datafusion::arrow::datatypes::{Field, Schema};

use super::*;

/// A message's own line end does not show as a literal `\n` at the end
/// of its dead-letter entry; newlines inside it do.
#[test]
fn a_dead_letter_entry_ends_with_its_own_newline_only() {
    let line = dead_letter_line(&"topic/0@7", "bad", b"{\"a\":\n1}\r\n");
    assert_eq!(line, b"topic/0@7\tbad\t{\"a\":\\n1}\n");
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new("host", DataType::Utf8, true),
        Field::new("cpu", DataType::Float64, true),
        Field::new("n", DataType::Int64, true),
        Field::new("up", DataType::Boolean, true),
    ]))
}

fn config(format: Format, location: SourceLocation) -> SourceConfig {
    SourceConfig {
        stream: "m".to_string(),
        schema: schema(),
        connector: "file",
        location,
        format,
        replay: Replay::Fast,
        event_time: Some(0),
        batch_size: 100,
        dead_letter: None,
        follow: false,
        decode_threads: 3,
        decode: Default::default(),
    }
}

struct Run {
    batches: Vec<RecordBatch>,
    stats: SourceStats,
    result: Result<()>,
}

impl Run {
    fn rows(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum()
    }

    fn bad(&self) -> Vec<(u64, String)> {
        self.stats
            .bad_samples
            .lock()
            .unwrap()
            .iter()
            .map(|b| (b.line, b.reason.clone()))
            .collect()
    }

    fn lines(&self) -> Vec<u64> {
        self.bad().into_iter().map(|(l, _)| l).collect()
    }

    /// All rows, each rendered as a string of its values.
    fn table(&self) -> Vec<String> {
        let mut out = Vec::new();
        for b in &self.batches {
            assert_eq!(b.schema(), schema());
            let ts = b
                .column(0)
                .as_any()
                .downcast_ref::<TimestampMillisecondArray>()
                .unwrap();
            let host = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
            let cpu = b.column(2).as_any().downcast_ref::<Float64Array>().unwrap();
            let n = b.column(3).as_any().downcast_ref::<Int64Array>().unwrap();
            let up = b.column(4).as_any().downcast_ref::<BooleanArray>().unwrap();
            for i in 0..b.num_rows() {
                let cell = |a: &dyn Array, s: String| {
                    if a.is_null(i) { "NULL".to_string() } else { s }
                };
                out.push(format!(
                    "{}|{}|{}|{}|{}",
                    cell(ts, ts.value(i).to_string()),
                    cell(host, host.value(i).to_string()),
                    cell(cpu, cpu.value(i).to_string()),
                    cell(n, n.value(i).to_string()),
                    cell(up, up.value(i).to_string()),
                ));
            }
        }
        out
    }
}

fn run_reader<R: Read>(cfg: &SourceConfig, input: R, live: bool) -> Run {
    let stats = SourceStats::default();
    let mut batches = Vec::new();
    let mut emit = |b: RecordBatch| {
        batches.push(b);
        true
    };
    let result = Driver::new(cfg, &stats, &mut emit).and_then(|mut d| {
        read_format(
            cfg.format,
            Input::new(input, "test-input", live),
            &mut d,
            None,
        )
    });
    Run {
        batches,
        stats,
        result,
    }
}

fn run_csv(text: &str) -> Run {
    let cfg = config(Format::Csv, SourceLocation::Stdin);
    let run = run_reader(&cfg, Cursor::new(text.as_bytes().to_vec()), false);
    assert!(run.result.is_ok(), "{:?}", run.result);
    run
}

fn run_jsonl(text: &str) -> Run {
    let cfg = config(Format::Jsonl, SourceLocation::Stdin);
    let run = run_reader(&cfg, Cursor::new(text.as_bytes().to_vec()), false);
    assert!(run.result.is_ok(), "{:?}", run.result);
    run
}

#[test]
fn csv_basic_and_types() {
    let run = run_csv(
        "ts,host,cpu,n,up\n\
             1970-01-01T00:00:10Z,a,1.5,7,true\n\
             1970-01-01 00:00:11.250,b,-2,-3,f\n\
             12000, c ,1e3, 42 ,0\n",
    );
    assert_eq!(
        run.table(),
        vec![
            "10000|a|1.5|7|true",
            "11250|b|-2|-3|false",
            "12000|c|1000|42|false",
        ]
    );
    assert_eq!(run.stats.rows.load(Ordering::Relaxed), 3);
    assert_eq!(run.stats.bad_rows.load(Ordering::Relaxed), 0);
}

#[test]
fn csv_extra_and_reordered_columns() {
    let run = run_csv(
        "extra,UP,n,cpu,Host,ts,more\n\
             x,true,1,0.5,h1,1000,y\n\
             z,false,2,0.25,h2,2000,w\n",
    );
    assert_eq!(
        run.table(),
        vec!["1000|h1|0.5|1|true", "2000|h2|0.25|2|false"]
    );
}

#[test]
fn csv_exact_header_match_wins() {
    let cfg = SourceConfig {
        schema: Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)])),
        event_time: None,
        ..config(Format::Csv, SourceLocation::Stdin)
    };
    let run = run_reader(&cfg, Cursor::new(b"V,v\n1,2\n".to_vec()), false);
    let col = run.batches[0]
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    assert_eq!(col.value(0), 2);
}

fn run_multiline(text: &str) -> Run {
    let cfg = SourceConfig {
        decode: Decoding {
            multiline: true,
            ..Decoding::default()
        },
        ..config(Format::Csv, SourceLocation::Stdin)
    };
    let run = run_reader(&cfg, Cursor::new(text.as_bytes().to_vec()), false);
    assert!(run.result.is_ok(), "{:?}", run.result);
    run
}

/// Spaces around header names and around values go alike, for text
/// as for numbers; spaces inside a value stay.
#[test]
fn csv_values_lose_surrounding_spaces_as_header_names_do() {
    let run = run_multiline(
        "ts, host, cpu, n, up\n\
             1000, a b ,  2.5, 1, true\n\
             2000,   ,3,2,false\n",
    );
    assert_eq!(
        run.table(),
        vec!["1000|a b|2.5|1|true", "2000|NULL|3|2|false"]
    );
}

#[test]
fn csv_quoted_fields() {
    let run = run_multiline(
        "ts,host,cpu,n,up\n\
             1000,\"a, \"\"quoted\"\" host\",\"2.5\",1,true\n\
             2000,\"two\nlines\",3,2,false\n\
             3000,x,abc,3,true\n",
    );
    assert_eq!(
        run.table(),
        vec![
            "1000|a, \"quoted\" host|2.5|1|true",
            "2000|two\nlines|3|2|false"
        ]
    );
    // The multi-line record occupies lines 3-4, so the bad row is line 5.
    assert_eq!(
        run.bad(),
        vec![(5, "column cpu: cannot parse 'abc' as DOUBLE".to_string())]
    );
}

/// A small deterministic generator (no dependency, same file each run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// A line that is never a valid row: it opens a quote that never
/// closes, or its first field is not a timestamp.
fn garbage_line(rng: &mut Lcg) -> Vec<u8> {
    const ALPHABET: &[u8] = b"abc,\" 1;x";
    let len = rng.next(30) as usize;
    let mut line = match rng.next(3) {
        0 => b"\"".to_vec(),
        1 => format!("{},\"", rng.next(100_000)).into_bytes(),
        _ => b"z".to_vec(),
    };
    let stray_quote_only = line.ends_with(b"\"");
    for _ in 0..len {
        let b = if rng.next(4) == 0 {
            rng.next(256) as u8
        } else {
            ALPHABET[rng.next(ALPHABET.len() as u64) as usize]
        };
        // Keep the unterminated quote unterminated, and the line a line.
        if b == b'\n' || b == b'\r' || (stray_quote_only && b == b'"') {
            continue;
        }
        line.push(b);
    }
    line
}

#[test]
fn csv_garbage_lines_cost_one_row_each() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.csv");
    let dead = dir.path().join("bad.txt");
    let mut rng = Lcg(7);
    let mut text = b"ts,host,cpu,n,up\n".to_vec();
    let mut good = Vec::new();
    let mut garbage_lines = Vec::new();
    for i in 0..3000u64 {
        let line = i + 2;
        if rng.next(100) < 5 {
            text.extend(garbage_line(&mut rng));
            garbage_lines.push(line);
        } else {
            // Good lines carry quotes too, which a stray quote would
            // otherwise pair with.
            let host = if i % 3 == 0 {
                format!("\"h,{i}\"")
            } else {
                format!("h{i}")
            };
            text.extend_from_slice(format!("{},{host},1.5,{i},true", i * 1000).as_bytes());
            good.push(i as i64);
        }
        text.push(b'\n');
    }
    std::fs::write(&input, &text).unwrap();
    let cfg = SourceConfig {
        dead_letter: Some(dead.clone()),
        ..config(Format::Csv, SourceLocation::File(input))
    };
    let stats = SourceStats::default();
    let mut kept = Vec::new();
    read_source(&cfg, &stats, &mut |b| {
        let n = b.column(3).as_any().downcast_ref::<Int64Array>().unwrap();
        kept.extend(n.values().iter().copied());
        true
    })
    .unwrap();
    assert!(garbage_lines.len() > 100, "{}", garbage_lines.len());
    assert_eq!(kept, good, "exactly the good lines survive");
    assert_eq!(stats.rows.load(Ordering::Relaxed), good.len() as u64);
    assert_eq!(
        stats.bad_rows.load(Ordering::Relaxed),
        garbage_lines.len() as u64
    );
    let dead_text = std::fs::read(&dead).unwrap();
    let dead_lines: Vec<u64> = dead_text
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let tab = l.iter().position(|&b| b == b'\t').unwrap();
            std::str::from_utf8(&l[..tab]).unwrap().parse().unwrap()
        })
        .collect();
    assert_eq!(dead_lines, garbage_lines);
}

#[test]
fn csv_a_stray_quote_costs_its_line_only() {
    let run = run_csv(
        "ts,host,cpu,n,up\n\
             1000,\"a,1,1,true\n\
             2000,b,1,1,true\n\
             3000,\"c\",1,1,true\n",
    );
    assert_eq!(run.table(), vec!["2000|b|1|1|true", "3000|c|1|1|true"]);
    let bad = run.bad();
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].0, 2);
    assert!(
        bad[0].1.contains("not closed") && bad[0].1.contains("multiline = 'true'"),
        "{}",
        bad[0].1
    );
}

#[test]
fn csv_multiline_records_are_bounded_and_every_line_counts() {
    // A stray quote in multiline mode swallows lines up to the next
    // quote: the record then has the wrong field count, and each of
    // its three lines is a bad row.
    let run = run_multiline(
        "ts,host,cpu,n,up\n\
             1000,\"a,1,1,true\n\
             2000,b,1,1,true\n\
             3000,c\",1,true\n\
             4000,\"two\nlines\",1,1,true\n",
    );
    assert_eq!(run.table(), vec!["4000|two\nlines|1|1|true"]);
    assert_eq!(run.lines(), vec![2, 3, 4]);
    assert_eq!(run.bad()[0].1, "expected 5 fields, found 4");
    assert!(
        run.bad()[1].1.contains("the record that starts at line 2"),
        "{}",
        run.bad()[1].1
    );

    // A quote that never closes: bounded by max_record_size, then
    // reading starts afresh at the next line.
    let cfg = SourceConfig {
        decode: Decoding {
            multiline: true,
            max_record_size: 40,
            ..Decoding::default()
        },
        ..config(Format::Csv, SourceLocation::Stdin)
    };
    let text = "ts,host,cpu,n,up\n\
                    1000,\"a,1,1,true\n\
                    2000,b,1,1,true\n\
                    3000,b,1,1,true\n\
                    4000,b,1,1,true\n\
                    5000,\"open\n";
    let run = run_reader(&cfg, Cursor::new(text.as_bytes().to_vec()), false);
    assert_eq!(run.table(), vec!["4000|b|1|1|true"]);
    let bad = run.bad();
    assert_eq!(run.lines(), vec![2, 3, 4, 6]);
    assert_eq!(
        bad[0].1,
        "a quoted field is not closed within max_record_size (40 bytes)"
    );
    assert_eq!(
        bad[3].1,
        "a quoted field is not closed at the end of the input"
    );
}

#[test]
fn a_header_with_an_unclosed_quote_is_an_error() {
    let cfg = config(Format::Csv, SourceLocation::Stdin);
    let run = run_reader(&cfg, Cursor::new(b"ts,\"host\n1,a\n".to_vec()), false);
    let msg = run.result.unwrap_err().to_string();
    assert!(
        msg.contains("cannot read the header of test-input"),
        "{msg}"
    );
}

#[test]
fn an_event_time_far_ahead_is_a_bad_row_and_the_stream_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let dead = dir.path().join("bad.txt");
    let ten_years = 10 * 365 * 86_400_000i64;
    let mut text = String::from("ts,host,cpu,n,up\n");
    for i in 0..300i64 {
        let ts = if i == 150 {
            i * 1000 + ten_years
        } else {
            i * 1000
        };
        text.push_str(&format!("{ts},a,1,{i},true\n"));
    }
    let cfg = SourceConfig {
        dead_letter: Some(dead.clone()),
        ..config(Format::Csv, SourceLocation::Stdin)
    };
    let run = run_reader(&cfg, Cursor::new(text.into_bytes()), false);
    assert_eq!(run.rows(), 299);
    assert_eq!(run.stats.max_event_time.get(), Some(299_000));
    assert_eq!(run.lines(), vec![152]);
    let reason = &run.bad()[0].1;
    assert!(
        reason.starts_with("column ts: event time too far ahead: 1979-")
            && reason.contains("more than 1 day after 1970-01-01T00:02:29"),
        "{reason}"
    );
    let dead_text = std::fs::read_to_string(&dead).unwrap();
    assert!(
        dead_text.starts_with("152\tcolumn ts: event time too far ahead"),
        "{dead_text}"
    );

    // Disabled: the row goes through.
    let mut text = String::from("ts,host,cpu,n,up\n0,a,1,1,true\n");
    text.push_str(&format!("{ten_years},a,1,2,true\n"));
    let cfg = SourceConfig {
        decode: Decoding {
            max_future_ms: None,
            ..Decoding::default()
        },
        ..config(Format::Csv, SourceLocation::Stdin)
    };
    let run = run_reader(&cfg, Cursor::new(text.into_bytes()), false);
    assert_eq!(run.rows(), 2);
}

#[test]
fn a_jump_of_several_rows_is_a_gap_not_outliers() {
    let day = 86_400_000i64;
    let mut text = String::from("ts,host,cpu,n,up\n");
    // Two outliers far apart, then a gap of a week: all rows after it
    // agree with each other, so they are kept; held rows keep order.
    for (i, ts) in [
        0,
        1000,
        400 * day,
        2000,
        7 * day,
        7 * day + 1000,
        7 * day + 2000,
        7 * day + 3000,
    ]
    .iter()
    .enumerate()
    {
        text.push_str(&format!("{ts},a,1,{i},true\n"));
    }
    text.push_str(&format!("{},a,1,9,true\n", 900 * day));
    let run = run_csv(&text);
    let kept: Vec<String> = run
        .table()
        .into_iter()
        .map(|r| r.split('|').next().unwrap().to_string())
        .collect();
    let expect: Vec<String> = [
        0,
        1000,
        2000,
        7 * day,
        7 * day + 1000,
        7 * day + 2000,
        7 * day + 3000,
    ]
    .iter()
    .map(|t| t.to_string())
    .collect();
    assert_eq!(kept, expect);
    // The year-ahead row, and the last row held at the end of input.
    assert_eq!(run.lines(), vec![4, 10]);
}

#[test]
fn pushed_rows_are_judged_by_the_wall_clock() {
    let now = chrono::Utc::now().timestamp_millis();
    let text = format!(
        "{{\"ts\":{now}}}\n{{\"ts\":{}}}\n{{\"ts\":1000}}\n",
        now + 2 * 86_400_000
    );
    let cfg = config(Format::Jsonl, SourceLocation::Push);
    let stats = SourceStats::default();
    let mut rows = 0;
    read_bytes(&cfg, Format::Jsonl, text.as_bytes(), &stats, &mut |b| {
        rows += b.num_rows();
        true
    })
    .unwrap();
    assert_eq!(rows, 2);
    let bad = stats.bad_samples.lock().unwrap().clone();
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].line, 2);
    assert!(
        bad[0].reason.contains("the wall clock"),
        "{}",
        bad[0].reason
    );
}

#[test]
fn numeric_timestamps_in_a_declared_unit() {
    for (unit, factor) in [
        (TsUnit::Seconds, 1i64),
        (TsUnit::Millis, 1000),
        (TsUnit::Micros, 1_000_000),
        (TsUnit::Nanos, 1_000_000_000),
    ] {
        let base = 1_392_388_200i64 * factor;
        let cfg = |format| SourceConfig {
            decode: Decoding {
                ts_unit: unit,
                ..Decoding::default()
            },
            ..config(format, SourceLocation::Stdin)
        };
        let csv = format!(
            "ts,host,cpu,n,up\n{base},a,1,1,true\n{},a,1,1,true\n",
            base + 60 * factor
        );
        let run = run_reader(&cfg(Format::Csv), Cursor::new(csv.into_bytes()), false);
        assert_eq!(
            run.table(),
            vec!["1392388200000|a|1|1|true", "1392388260000|a|1|1|true"],
            "{unit:?}"
        );
        let json = format!("{{\"ts\":{base}}}\n");
        let run = run_reader(&cfg(Format::Jsonl), Cursor::new(json.into_bytes()), false);
        assert_eq!(
            run.table(),
            vec!["1392388200000|NULL|NULL|NULL|NULL"],
            "{unit:?}"
        );
    }
    // Seconds with a fraction, in both formats.
    let cfg = |format| SourceConfig {
        decode: Decoding {
            ts_unit: TsUnit::Seconds,
            ..Decoding::default()
        },
        ..config(format, SourceLocation::Stdin)
    };
    let run = run_reader(
        &cfg(Format::Jsonl),
        Cursor::new(b"{\"ts\":1392388200.25}\n{\"ts\":1.0}\n".to_vec()),
        false,
    );
    assert_eq!(
        run.table(),
        vec![
            "1392388200250|NULL|NULL|NULL|NULL",
            "1000|NULL|NULL|NULL|NULL"
        ]
    );
    let run = run_reader(
        &cfg(Format::Csv),
        Cursor::new(b"ts,host,cpu,n,up\n1392388200.5,a,1,1,true\n".to_vec()),
        false,
    );
    assert_eq!(run.table(), vec!["1392388200500|a|1|1|true"]);
}

#[test]
fn csv_empty_fields_are_null() {
    let run = run_csv("ts,host,cpu,n,up\n1000,,,,\n2000,\"\",  ,,\n");
    assert_eq!(
        run.table(),
        vec!["1000|NULL|NULL|NULL|NULL", "2000|NULL|NULL|NULL|NULL"]
    );
}

#[test]
fn csv_bad_rows_with_line_numbers() {
    let run = run_csv(
        "ts,host,cpu,n,up\n\
             1000,a,1,1,true\n\
             2000,a,1\n\
             3000,a,1,1,true,extra\n\
             4000,a,x1,1,true\n\
             5000,a,1,1.5,true\n\
             yesterday,a,1,1,true\n\
             \n\
             6000,a,1,1,maybe\n\
             ,a,1,1,true\n\
             7000,a,1,1,true\n",
    );
    assert_eq!(run.table(), vec!["1000|a|1|1|true", "7000|a|1|1|true"]);
    assert_eq!(
        run.bad(),
        vec![
            (3, "expected 5 fields, found 3".to_string()),
            (4, "expected 5 fields, found 6".to_string()),
            (5, "column cpu: cannot parse 'x1' as DOUBLE".to_string()),
            (6, "column n: cannot parse '1.5' as BIGINT".to_string()),
            (
                7,
                "column ts: cannot parse 'yesterday' as TIMESTAMP".to_string()
            ),
            (9, "column up: cannot parse 'maybe' as BOOLEAN".to_string()),
            (10, "column ts: missing event time".to_string()),
        ]
    );
    assert_eq!(run.stats.rows.load(Ordering::Relaxed), 2);
    assert_eq!(run.stats.bad_rows.load(Ordering::Relaxed), 7);
}

#[test]
fn csv_crlf_line_endings() {
    let run = run_csv("ts,host,cpu,n,up\r\n1000,a,1,1,true\r\n2000,a,oops,1,true\r\n");
    assert_eq!(run.table(), vec!["1000|a|1|1|true"]);
    assert_eq!(run.lines(), vec![3]);
}

#[test]
fn csv_line_numbers_with_blank_lines_crlf_and_quotes() {
    let run = run_multiline(
        "\r\n\
             ts,host,cpu,n,up\r\n\
             \r\n\
             \n\
             1000,a,x,1,true\r\n\
             2000,\"multi\r\nline\",1,1,true\r\n\
             \r\n\
             3000,b,1,1,true,extra\r\n\
             4000,\"q\",1,1,\"true\"\r\n\
             5000,c,1,1,bad",
    );
    assert_eq!(
        run.table(),
        vec!["2000|multi\r\nline|1|1|true", "4000|q|1|1|true"]
    );
    assert_eq!(run.lines(), vec![5, 9, 11]);
    assert_eq!(run.bad()[2].1, "column up: cannot parse 'bad' as BOOLEAN");
}

#[test]
fn csv_crlf_text_in_last_column() {
    let cfg = SourceConfig {
        schema: Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ])),
        event_time: None,
        ..config(Format::Csv, SourceLocation::Stdin)
    };
    let input = b"n,s\r\n1,abc\r\n2,\"q\"\r\n3,\r\n4\r\n".to_vec();
    let run = run_reader(&cfg, Cursor::new(input), false);
    let b = &run.batches[0];
    let s = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
    assert_eq!(s.value(0), "abc");
    assert_eq!(s.value(1), "q");
    assert!(s.is_null(2));
    assert_eq!(
        run.bad(),
        vec![(5, "expected 2 fields, found 1".to_string())]
    );
}

#[test]
fn csv_invalid_utf8_is_a_bad_row() {
    let cfg = config(Format::Csv, SourceLocation::Stdin);
    let input = b"ts,host,cpu,n,up\n1000,\xff\xfe,1,1,true\n2000,b,1,1,true\n".to_vec();
    let run = run_reader(&cfg, Cursor::new(input), false);
    assert_eq!(run.table(), vec!["2000|b|1|1|true"]);
    assert_eq!(
        run.bad(),
        vec![(2, "column host: invalid UTF-8".to_string())]
    );
}

#[test]
fn csv_missing_header_column_reads_as_null() {
    let run = run_csv("ts,host,cpu,up\n1,a,1,true\n");
    assert_eq!(run.table(), vec!["1|a|1|NULL|true"]);
    assert_eq!(run.stats.bad_rows.load(Ordering::Relaxed), 0);
}

#[test]
fn csv_missing_event_time_column_is_an_error() {
    let cfg = config(Format::Csv, SourceLocation::Stdin);
    let run = run_reader(
        &cfg,
        Cursor::new(b"host,cpu,n,up\na,1,1,true\n".to_vec()),
        false,
    );
    let msg = run.result.unwrap_err().to_string();
    assert!(
        msg.contains("event-time column ts") && msg.contains("test-input"),
        "{msg}"
    );
    assert!(run.batches.is_empty());
}

#[test]
fn empty_input_is_an_empty_stream() {
    let cfg = config(Format::Csv, SourceLocation::Stdin);
    let run = run_reader(&cfg, Cursor::new(Vec::new()), false);
    assert!(run.result.is_ok());
    assert!(run.batches.is_empty());
    assert_eq!(run.stats.bad_rows.load(Ordering::Relaxed), 0);
}

#[test]
fn header_only_emits_nothing() {
    let run = run_csv("ts,host,cpu,n,up\n");
    assert!(run.batches.is_empty());
    assert_eq!(run.stats.rows.load(Ordering::Relaxed), 0);
}

#[test]
fn batches_split_at_batch_size() {
    let mut text = String::from("ts,host,cpu,n,up\n");
    for i in 0..7 {
        text.push_str(&format!("{i},h,1,{i},true\n"));
    }
    let cfg = SourceConfig {
        batch_size: 3,
        ..config(Format::Csv, SourceLocation::Stdin)
    };
    let run = run_reader(&cfg, Cursor::new(text.into_bytes()), false);
    let sizes: Vec<usize> = run.batches.iter().map(|b| b.num_rows()).collect();
    assert_eq!(sizes, vec![3, 3, 1]);
    assert_eq!(run.stats.rows.load(Ordering::Relaxed), 7);

    let mut text = String::new();
    for i in 0..6 {
        text.push_str(&format!("{{\"ts\":{i}}}\n"));
    }
    let cfg = SourceConfig {
        batch_size: 3,
        ..config(Format::Jsonl, SourceLocation::Stdin)
    };
    let run = run_reader(&cfg, Cursor::new(text.into_bytes()), false);
    let sizes: Vec<usize> = run.batches.iter().map(|b| b.num_rows()).collect();
    assert_eq!(sizes, vec![3, 3]);
}

#[test]
fn stops_when_downstream_is_gone() {
    let mut text = String::from("ts,host,cpu,n,up\n");
    for i in 0..10 {
        text.push_str(&format!("{i},h,1,{i},true\n"));
    }
    let cfg = SourceConfig {
        batch_size: 2,
        ..config(Format::Csv, SourceLocation::Stdin)
    };
    let stats = SourceStats::default();
    let mut calls = 0;
    let mut emit = |_b: RecordBatch| {
        calls += 1;
        false
    };
    let mut d = Driver::new(&cfg, &stats, &mut emit).unwrap();
    read_format(
        cfg.format,
        Input::new(Cursor::new(text.into_bytes()), "t", false),
        &mut d,
        None,
    )
    .unwrap();
    drop(d);
    assert_eq!(calls, 1);
}

mod json;
mod live;
