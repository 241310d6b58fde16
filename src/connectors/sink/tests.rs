use std::sync::Mutex;

use datafusion::arrow::array::{
    BooleanArray, Float64Array, Int64Array, StringArray, TimestampMillisecondArray,
    TimestampNanosecondArray,
};

use super::*;

/// A writer whose contents the test can read afterwards.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

fn batch(ts: Vec<Option<i64>>, host: Vec<Option<&str>>, cpu: Vec<Option<f64>>) -> RecordBatch {
    let n = ts.len();
    let schema = Arc::new(Schema::new(vec![
        Field::new(
            "window_start",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            true,
        ),
        Field::new("host", DataType::Utf8, true),
        Field::new("avg_cpu", DataType::Float64, true),
        Field::new("n", DataType::Int64, true),
        Field::new("hot", DataType::Boolean, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(TimestampMillisecondArray::from(ts)),
            Arc::new(StringArray::from(host)),
            Arc::new(Float64Array::from(cpu)),
            Arc::new(Int64Array::from((0..n as i64).collect::<Vec<_>>())),
            Arc::new(BooleanArray::from(
                (0..n).map(|i| i % 2 == 0).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap()
}

fn sample() -> RecordBatch {
    batch(
        vec![Some(10_000), Some(10_250), None],
        vec![Some("a"), Some("b,\"c\""), None],
        vec![Some(1.5), Some(2.0), None],
    )
}

fn render(format: OutputFormat, batches: &[RecordBatch]) -> String {
    let shared = Shared::default();
    let mut sink = make_sink(format, Box::new(shared.clone()));
    for b in batches {
        sink.write(b).unwrap();
    }
    sink.finish().unwrap();
    sink.finish().unwrap();
    shared.text()
}

#[test]
fn csv_output() {
    let empty = sample().slice(0, 0);
    let text = render(
        OutputFormat::Csv,
        &[empty.clone(), sample(), empty, sample().slice(0, 1)],
    );
    assert_eq!(
        text,
        "window_start,host,avg_cpu,n,hot\n\
             1970-01-01T00:00:10,a,1.5,0,true\n\
             1970-01-01T00:00:10.250,\"b,\"\"c\"\"\",2.0,1,false\n\
             ,,,2,true\n\
             1970-01-01T00:00:10,a,1.5,0,true\n"
    );
}

#[test]
fn csv_without_rows_writes_nothing() {
    assert_eq!(render(OutputFormat::Csv, &[]), "");
    assert_eq!(render(OutputFormat::Csv, &[sample().slice(0, 0)]), "");
    assert_eq!(render(OutputFormat::Jsonl, &[sample().slice(0, 0)]), "");
    assert_eq!(render(OutputFormat::Table, &[sample().slice(0, 0)]), "");
}

#[test]
fn jsonl_output() {
    let text = render(OutputFormat::Jsonl, &[sample(), sample().slice(1, 1)]);
    assert_eq!(
        text,
        "{\"window_start\":\"1970-01-01T00:00:10\",\"host\":\"a\",\"avg_cpu\":1.5,\"n\":0,\"hot\":true}\n\
             {\"window_start\":\"1970-01-01T00:00:10.250\",\"host\":\"b,\\\"c\\\"\",\"avg_cpu\":2.0,\"n\":1,\"hot\":false}\n\
             {\"window_start\":null,\"host\":null,\"avg_cpu\":null,\"n\":2,\"hot\":true}\n\
             {\"window_start\":\"1970-01-01T00:00:10.250\",\"host\":\"b,\\\"c\\\"\",\"avg_cpu\":2.0,\"n\":1,\"hot\":false}\n"
    );
    for line in text.lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap();
    }
}

/// Rows with a labels map and a struct holding a timestamp and a list.
fn nested_sample() -> RecordBatch {
    use datafusion::arrow::array::{ListArray, StructArray};
    use datafusion::arrow::datatypes::Int64Type;
    let mut labels = crate::types::LabelsBuilder::default();
    labels.append([("job", "node"), ("instance", "a")]);
    labels.append([]);
    let labels = labels.finish();
    let at = TimestampMillisecondArray::from(vec![Some(1_500), None]);
    let xs = ListArray::from_iter_primitive::<Int64Type, _, _>([Some(vec![Some(1), None]), None]);
    let s = StructArray::from(vec![
        (
            Arc::new(Field::new("at", at.data_type().clone(), true)),
            Arc::new(at) as ArrayRef,
        ),
        (
            Arc::new(Field::new("xs", xs.data_type().clone(), true)),
            Arc::new(xs) as ArrayRef,
        ),
    ]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("labels", labels.data_type().clone(), true),
        Field::new("s", s.data_type().clone(), true),
    ]));
    RecordBatch::try_new(schema, vec![Arc::new(labels), Arc::new(s)]).unwrap()
}

#[test]
fn nested_values_render_as_json() {
    let jsonl = render(OutputFormat::Jsonl, &[nested_sample()]);
    assert_eq!(
        jsonl,
        "{\"labels\":{\"instance\":\"a\",\"job\":\"node\"},\"s\":{\"at\":\"1970-01-01T00:00:01.500\",\"xs\":[1,null]}}\n\
             {\"labels\":{},\"s\":{\"at\":null,\"xs\":null}}\n"
    );
    let csv = render(OutputFormat::Csv, &[nested_sample()]);
    assert_eq!(
        csv,
        "labels,s\n\
             \"{\"\"instance\"\":\"\"a\"\",\"\"job\"\":\"\"node\"\"}\",\"{\"\"at\"\":\"\"1970-01-01T00:00:01.500\"\",\"\"xs\"\":[1,null]}\"\n\
             {},\"{\"\"at\"\":null,\"\"xs\"\":null}\"\n"
    );
    let table = render(OutputFormat::Table, &[nested_sample()]);
    assert!(
        table.contains("| {\"instance\":\"a\",\"job\":\"node\"} |"),
        "{table}"
    );
}

/// On a terminal a query's rows continue one table, as in the shell:
/// one header for batches that fit its columns, DOUBLEs rounded.
#[test]
fn table_output_grows_one_table_with_rounded_numbers() {
    let row = sample().slice(0, 1);
    let text = render(OutputFormat::Table, &[row.clone(), row]);
    assert_eq!(text.matches("| window_start").count(), 1, "{text}");
    assert_eq!(text.matches("| 1970-01-01T00:00:10 |").count(), 2, "{text}");
    let unrounded = batch(
        vec![Some(0)],
        vec![Some("a")],
        vec![Some(93.78999999999999)],
    );
    let text = render(OutputFormat::Table, &[unrounded]);
    assert!(text.contains("| 93.79 "), "{text}");
}

#[test]
fn table_output() {
    let text = render(OutputFormat::Table, &[sample().slice(0, 2)]);
    assert_eq!(
        text,
        "+-------------------------+-------+---------+---+-------+\n\
             | window_start            | host  | avg_cpu | n | hot   |\n\
             +-------------------------+-------+---------+---+-------+\n\
             | 1970-01-01T00:00:10     | a     | 1.5     | 0 | true  |\n\
             | 1970-01-01T00:00:10.250 | b,\"c\" | 2.0     | 1 | false |\n\
             +-------------------------+-------+---------+---+-------+\n"
    );
}

#[test]
fn other_timestamp_units() {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "t",
        DataType::Timestamp(TimeUnit::Nanosecond, None),
        true,
    )]));
    let b = RecordBatch::try_new(
        schema,
        vec![Arc::new(TimestampNanosecondArray::from(vec![
            10_000_000_000,
            10_250_000_000,
            10_000_001_000,
            10_250_000_001,
            -1_000_000,
        ]))],
    )
    .unwrap();
    assert_eq!(
        render(OutputFormat::Csv, &[b]),
        "t\n\
             1970-01-01T00:00:10\n\
             1970-01-01T00:00:10.250\n\
             1970-01-01T00:00:10.000001\n\
             1970-01-01T00:00:10.250000001\n\
             1969-12-31T23:59:59.999\n"
    );
}

#[test]
fn open_sink_creates_and_truncates() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.csv");
    std::fs::write(&path, "old contents\n").unwrap();
    let config = SinkConfig {
        name: "out".to_string(),
        target: SinkTarget::File(path.clone()),
        format: OutputFormat::Csv,
        append_only: false,
    };
    let schema = sample().schema();
    let mut sink = open_sink(&config, &schema).unwrap();
    // Not truncated yet: a restore may come.
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "old contents\n");
    sink.write(&sample().slice(0, 1)).unwrap();
    // Flushed per batch: visible before finish.
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "window_start,host,avg_cpu,n,hot\n1970-01-01T00:00:10,a,1.5,0,true\n"
    );
    sink.finish().unwrap();
    drop(sink);

    let nested = SinkConfig {
        target: SinkTarget::File(dir.path().join("new/dir/out.csv")),
        ..config.clone()
    };
    open_sink(&nested, &schema).unwrap().finish().unwrap();
    assert!(dir.path().join("new/dir/out.csv").exists());
    // A run that wrote no rows leaves the file empty, as it truncates.
    std::fs::write(&path, "old contents\n").unwrap();
    open_sink(&config, &schema).unwrap().finish().unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "");

    std::fs::write(dir.path().join("file"), "").unwrap();
    let bad = SinkConfig {
        target: SinkTarget::File(dir.path().join("file/out.csv")),
        ..config
    };
    let err = open_sink(&bad, &schema).err().unwrap();
    assert!(err.to_string().starts_with("cannot create "), "{err}");
}

fn file_sink(name: &str, path: &Path, format: OutputFormat) -> SinkConfig {
    SinkConfig {
        name: name.to_string(),
        target: SinkTarget::File(path.to_path_buf()),
        format,
        append_only: false,
    }
}

#[test]
fn queries_writing_one_file_share_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.csv");
    let schema = sample().schema();
    let mut first = open_sink(&file_sink("out", &path, OutputFormat::Csv), &schema).unwrap();
    first.write(&sample().slice(0, 1)).unwrap();
    // A second sink over the same file (another name, a relative
    // spelling would do too) neither truncates it nor repeats the header.
    let mut second = open_sink(&file_sink("again", &path, OutputFormat::Csv), &schema).unwrap();
    second.write(&sample().slice(1, 1)).unwrap();
    first.write(&sample().slice(0, 1)).unwrap();
    first.finish().unwrap();
    second.write(&sample().slice(2, 1)).unwrap();
    second.finish().unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "window_start,host,avg_cpu,n,hot\n\
             1970-01-01T00:00:10,a,1.5,0,true\n\
             1970-01-01T00:00:10.250,\"b,\"\"c\"\"\",2.0,1,false\n\
             1970-01-01T00:00:10,a,1.5,0,true\n\
             ,,,2,true\n"
    );
    drop((first, second));
    // Once no query writes it, the next one starts the file afresh.
    let mut third = open_sink(&file_sink("out", &path, OutputFormat::Csv), &schema).unwrap();
    third.finish().unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
}

#[test]
fn a_shared_file_takes_one_set_of_columns_and_one_format() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.csv");
    let schema = sample().schema();
    let _first = open_sink(&file_sink("out", &path, OutputFormat::Csv), &schema).unwrap();
    let other = Arc::new(Schema::new(vec![Field::new("host", DataType::Utf8, true)]));
    let err = open_sink(&file_sink("out", &path, OutputFormat::Csv), &other)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("sink 'out'")
            && err.contains("(window_start, host, avg_cpu, n, hot)")
            && err.contains("(host)"),
        "{err}"
    );
    let err = open_sink(&file_sink("j", &path, OutputFormat::Jsonl), &schema)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("sink 'j' writes")
            && err.contains("as jsonl, but sink 'out' already writes it as csv"),
        "{err}"
    );
}

#[test]
fn labelled_output_names_the_query() {
    let shared = Shared::default();
    let mut sink = make_labelled_sink(OutputFormat::Csv, "q2", Box::new(shared.clone()));
    sink.write(&sample().slice(0, 0)).unwrap();
    sink.write(&sample().slice(0, 1)).unwrap();
    sink.write(&sample().slice(2, 1)).unwrap();
    assert_eq!(
        shared.text(),
        "query,window_start,host,avg_cpu,n,hot\n\
             q2,1970-01-01T00:00:10,a,1.5,0,true\n\
             q2,,,,2,true\n"
    );
    let shared = Shared::default();
    let mut sink = make_labelled_sink(OutputFormat::Jsonl, "hot", Box::new(shared.clone()));
    sink.write(&sample().slice(2, 1)).unwrap();
    assert_eq!(
        shared.text(),
        "{\"query\":\"hot\",\"window_start\":null,\"host\":null,\"avg_cpu\":null,\"n\":2,\"hot\":true}\n"
    );
    let shared = Shared::default();
    let mut sink = make_labelled_sink(OutputFormat::Table, "q1", Box::new(shared.clone()));
    sink.write(&sample().slice(0, 1).project(&[1]).unwrap())
        .unwrap();
    sink.finish().unwrap();
    assert_eq!(
        shared.text(),
        "-- q1\n+------+\n| host |\n+------+\n| a    |\n+------+\n"
    );
}

/// Rows of `sample` fed one batch at a time, with a checkpoint after
/// the second and the fourth batch.
fn feed() -> Vec<RecordBatch> {
    let s = sample();
    vec![
        s.slice(0, 1),
        s.slice(1, 2),
        s.slice(0, 0),
        s.clone(),
        s.slice(2, 1),
    ]
}

/// Writes `feed()` to `path` uninterrupted; returns the file.
fn uninterrupted(config: &SinkConfig) -> Vec<u8> {
    let schema = sample().schema();
    let mut sink = open_sink(config, &schema).unwrap();
    for batch in feed() {
        sink.write(&batch).unwrap();
    }
    sink.finish().unwrap();
    drop(sink);
    let SinkTarget::File(path) = &config.target else {
        unreachable!()
    };
    std::fs::read(path).unwrap()
}

#[test]
fn a_restored_file_sink_writes_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let schema = sample().schema();
    for format in [OutputFormat::Csv, OutputFormat::Jsonl, OutputFormat::Table] {
        for crash_after in 1..=3 {
            let path = dir.path().join(format!("{}.out", format_name(format)));
            let config = file_sink("out", &path, format);
            let expected = uninterrupted(&config);

            // Checkpoint after batches 2 and 4; crash after `crash_after`
            // more batches, restore the last checkpoint and go on.
            let mut sink = open_sink(&config, &schema).unwrap();
            let batches = feed();
            let mut commit = None;
            let mut from = 0;
            for (i, batch) in batches.iter().enumerate() {
                sink.write(batch).unwrap();
                if i == 1 || i == 3 {
                    commit = sink.checkpoint().unwrap();
                    from = i + 1;
                }
                if i + 1 == from.max(2) + crash_after - 1 {
                    break;
                }
            }
            let commit = commit.expect("a file sink commits");
            assert_eq!(commit["path"], path.display().to_string());
            drop(sink);

            let mut sink = open_sink(&config, &schema).unwrap();
            sink.restore(&commit).unwrap();
            for batch in &batches[from..] {
                sink.write(batch).unwrap();
            }
            sink.finish().unwrap();
            drop(sink);
            assert_eq!(
                String::from_utf8(std::fs::read(&path).unwrap()).unwrap(),
                String::from_utf8(expected).unwrap(),
                "{} crash after {crash_after}",
                format_name(format)
            );
        }
    }
}

#[test]
fn a_restore_before_the_first_row_keeps_the_header_to_come() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.csv");
    let config = file_sink("out", &path, OutputFormat::Csv);
    let schema = sample().schema();
    let mut sink = open_sink(&config, &schema).unwrap();
    let commit = sink.checkpoint().unwrap().unwrap();
    assert_eq!(commit["length"], 0);
    assert_eq!(commit["format"]["header_written"], false);
    sink.write(&sample()).unwrap();
    drop(sink);
    let mut sink = open_sink(&config, &schema).unwrap();
    sink.restore(&commit).unwrap();
    sink.write(&sample().slice(0, 1)).unwrap();
    sink.finish().unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "window_start,host,avg_cpu,n,hot\n1970-01-01T00:00:10,a,1.5,0,true\n"
    );
}

#[test]
fn restoring_a_file_shorter_than_its_commit_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.jsonl");
    let config = file_sink("out", &path, OutputFormat::Jsonl);
    let schema = sample().schema();
    let mut sink = open_sink(&config, &schema).unwrap();
    sink.write(&sample()).unwrap();
    let commit = sink.checkpoint().unwrap().unwrap();
    drop(sink);
    std::fs::write(&path, "{}\n").unwrap();
    let mut sink = open_sink(&config, &schema).unwrap();
    let err = sink.restore(&commit).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "cannot restore {}: it holds 3 bytes",
            path.display()
        )),
        "{err}"
    );
    // A commit without a length is refused, not guessed at.
    let err = sink
        .restore(&serde_json::json!({"path": path.display().to_string()}))
        .unwrap_err()
        .to_string();
    assert!(err.contains("the commit has no length"), "{err}");
}

#[test]
fn two_queries_on_one_file_commit_what_each_wrote_before_its_barrier() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.csv");
    let config = file_sink("out", &path, OutputFormat::Csv);
    let schema = sample().schema();
    let mut first = open_sink(&config, &schema).unwrap();
    let mut second = open_sink(&file_sink("again", &path, OutputFormat::Csv), &schema).unwrap();
    let row = |i: usize| sample().slice(i, 1);
    let ahead = std::thread::spawn(move || {
        first.write(&row(0)).unwrap();
        let commit = first.checkpoint().unwrap().unwrap();
        // Its barrier passed: this row is after the checkpoint.
        first.write(&row(1)).unwrap();
        (first, commit)
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    second.write(&row(2)).unwrap();
    let commit = second.checkpoint().unwrap().unwrap();
    let (first, first_commit) = ahead.join().unwrap();
    assert_eq!(commit, first_commit);
    second.write(&row(0)).unwrap();
    drop((first, second));

    let mut first = open_sink(&config, &schema).unwrap();
    let mut second = open_sink(&file_sink("again", &path, OutputFormat::Csv), &schema).unwrap();
    first.restore(&commit).unwrap();
    first.write(&row(1)).unwrap();
    // The co-writer restores the same commit: no second cut.
    second.restore(&commit).unwrap();
    second.write(&row(0)).unwrap();
    first.finish().unwrap();
    second.finish().unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "window_start,host,avg_cpu,n,hot\n\
             1970-01-01T00:00:10,a,1.5,0,true\n\
             ,,,2,true\n\
             1970-01-01T00:00:10.250,\"b,\"\"c\"\"\",2.0,1,false\n\
             1970-01-01T00:00:10,a,1.5,0,true\n"
    );
}

#[test]
fn stdout_sinks_do_not_commit() {
    let mut sink = make_sink(OutputFormat::Csv, Box::new(Shared::default()));
    sink.write(&sample()).unwrap();
    assert_eq!(sink.checkpoint().unwrap(), None);
}
