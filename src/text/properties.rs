use std::io::Cursor;

use datafusion::arrow::array::{Array, Int64Array};
use datafusion::arrow::datatypes::{Field, Schema};
use proptest::prelude::*;

use super::*;

fn config(format: Format) -> SourceConfig {
    SourceConfig {
        stream: "p".to_string(),
        schema: Arc::new(Schema::new(vec![
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
            Field::new("host", DataType::Utf8, true),
            Field::new("n", DataType::Int64, true),
        ])),
        connector: "file",
        location: SourceLocation::Stdin,
        format,
        replay: Replay::Fast,
        event_time: Some(0),
        batch_size: 7,
        dead_letter: None,
        follow: false,
        decode_threads: 1,
        decode: Decoding {
            // The guard's own property is tested elsewhere; here every
            // line must be judged on its text alone.
            max_future_ms: None,
            ..Decoding::default()
        },
    }
}

/// Decodes `input`; returns the `n` values kept and the bad-row count.
fn decode(cfg: &SourceConfig, input: &[u8]) -> (Result<()>, Vec<i64>, u64) {
    let stats = SourceStats::default();
    let mut kept = Vec::new();
    let mut emit = |b: RecordBatch| {
        let n = b.column(2).as_any().downcast_ref::<Int64Array>().unwrap();
        kept.extend((0..n.len()).map(|i| if n.is_null(i) { -1 } else { n.value(i) }));
        true
    };
    let result = Driver::new(cfg, &stats, &mut emit).and_then(|mut d| {
        read_format(
            cfg.format,
            Input::new(Cursor::new(input), "p", false),
            &mut d,
            None,
        )
    });
    (result, kept, stats.bad_rows.load(Ordering::Relaxed))
}

/// Lines that count: not blank once their terminator is cut (CSV), or
/// once trimmed (JSON lines).
fn counted(lines: &[Vec<u8>], format: Format) -> u64 {
    lines
        .iter()
        .filter(|l| match format {
            Format::Csv => !split_terminator(l).0.is_empty(),
            Format::Jsonl => !l.trim_ascii().is_empty(),
        })
        .count() as u64
}

/// A CSV-ish or JSON-ish garbage line (no newline in it).
fn garbage() -> impl Strategy<Value = Vec<u8>> {
    let pieces = prop_oneof![
        Just(b"\"".to_vec()),
        Just(b",".to_vec()),
        Just(b"{".to_vec()),
        Just(b"}".to_vec()),
        Just(b":".to_vec()),
        Just(b"\"ts\"".to_vec()),
        Just(b"1000".to_vec()),
        Just(b"\r".to_vec()),
        Just(b" ".to_vec()),
        Just(b"x".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..4),
    ];
    proptest::collection::vec(pieces, 0..12)
        .prop_map(|parts| parts.concat().into_iter().filter(|&b| b != b'\n').collect())
}

fn good_line(format: Format, i: i64) -> Vec<u8> {
    match format {
        Format::Csv => format!("{},\"h,{i}\",{}\n", i * 10, 1_000_000 + i).into_bytes(),
        Format::Jsonl => format!(
            "{{\"ts\":{},\"host\":\"h\",\"n\":{}}}\n",
            i * 10,
            1_000_000 + i
        )
        .into_bytes(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        for format in [Format::Csv, Format::Jsonl] {
            let (result, _, _) = decode(&config(format), &bytes);
            // A broken CSV header is an error; nothing else is.
            if let Err(e) = result {
                prop_assert!(format == Format::Csv && e.to_string().contains("header"), "{e}");
            }
        }
        let mut multiline = config(Format::Csv);
        multiline.decode.multiline = true;
        multiline.decode.max_record_size = 64;
        let _ = decode(&multiline, &bytes);
    }

    #[test]
    fn good_lines_survive_garbage_lines(
        plan in proptest::collection::vec(prop_oneof![Just(None), garbage().prop_map(Some)], 1..40),
        csv in any::<bool>(),
    ) {
        let format = if csv { Format::Csv } else { Format::Jsonl };
        let mut lines: Vec<Vec<u8>> = Vec::new();
        let mut good = Vec::new();
        for (i, entry) in plan.into_iter().enumerate() {
            match entry {
                None => {
                    lines.push(good_line(format, i as i64));
                    good.push(1_000_000 + i as i64);
                }
                Some(mut g) => {
                    g.push(b'\n');
                    lines.push(g);
                }
            }
        }
        let mut input = match format {
            Format::Csv => b"ts,host,n\n".to_vec(),
            Format::Jsonl => Vec::new(),
        };
        input.extend(lines.concat());
        let (result, kept, bad) = decode(&config(format), &input);
        prop_assert!(result.is_ok(), "{result:?}");
        // Every good line is kept, in order.
        let kept_good: Vec<i64> = kept.iter().copied().filter(|n| *n >= 1_000_000).collect();
        prop_assert_eq!(&kept_good, &good);
        // Every line that counts is one row or one bad row.
        prop_assert_eq!(kept.len() as u64 + bad, counted(&lines, format));
    }
}
