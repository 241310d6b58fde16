use std::sync::mpsc;

use datafusion::arrow::array::{Int64Array, TimestampMillisecondArray};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{Field, Schema};

use super::*;

const DAY: i64 = 86_400_000;
const TEN_YEARS: i64 = 3650 * DAY;
const WEEK: i64 = 7 * DAY;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new("host", DataType::Utf8, true),
        Field::new("cpu", DataType::Float64, true),
        Field::new("n", DataType::Int64, true),
        Field::new("up", DataType::Boolean, true),
    ]))
}

fn config(format: Format, path: &Path, dead: &Path, batch_size: usize) -> SourceConfig {
    SourceConfig {
        stream: "m".to_string(),
        schema: schema(),
        connector: "file",
        location: SourceLocation::File(path.to_path_buf()),
        format,
        replay: Replay::Fast,
        event_time: Some(0),
        batch_size,
        dead_letter: Some(dead.to_path_buf()),
        follow: false,
        decode_threads: 3,
        decode: Decoding {
            multiline: format == Format::Csv,
            ..Decoding::default()
        },
    }
}

/// A CSV file with every kind of bad row, records spanning lines, an
/// outlier and a jump in its second half, and no final newline.
fn csv_text() -> String {
    let mut lines = vec![
        "n,ts,host,cpu,up".to_string(),
        "0,0,a,1,true".into(),
        "1,1000,a,1,true".into(),
        "2,2000,a,x,true".into(),
        "3,3000,\"two\nlines\",1,true".into(),
        "4,4000,a,1".into(),
        String::new(),
        "5,5000,\"bad\nrecord\",1".into(),
    ];
    for i in 6..13 {
        lines.push(format!("{i},{},h{i},1,true", i * 1000));
    }
    lines.extend([
        format!("13,{TEN_YEARS},a,1,true"),
        "14,zz,a,1,true".into(),
        "15,15000,a,1,true".into(),
        "16,16000,a,1,true".into(),
        format!("17,{WEEK},a,1,true"),
        format!("18,{},a,inf,true", WEEK + 1000),
        format!("19,{},a,1,true", WEEK + 2000),
        format!("20,{},a,1,true", WEEK + 3000),
        format!("21,{},a,1,\"t\nrue\"", WEEK + 4000),
        format!("22,{},a,1,true", WEEK + 5000),
        format!("23,{},a,1,true", WEEK + 6000),
    ]);
    lines.join("\n")
}

fn jsonl_text() -> String {
    let mut lines = vec![
        "{\"ts\":0,\"n\":0}".to_string(),
        "{\"ts\":1000,\"n\":1}".into(),
        "{\"ts\":2000,\"n\":\"x\"}".into(),
        "not json".into(),
        "{\"n\":3}".into(),
        String::new(),
        "{\"ts\":4000,\"n\":4,\"host\":\"h\"}".into(),
    ];
    for i in 5..11 {
        lines.push(format!("{{\"ts\":{},\"n\":{i}}}", i * 1000));
    }
    lines.extend([
        format!("{{\"ts\":{TEN_YEARS},\"n\":11}}"),
        "{\"ts\":12000,\"n\":12}".into(),
        format!("{{\"ts\":{WEEK},\"n\":13}}"),
        format!("{{\"ts\":{},\"n\":14,\"cpu\":1.5}}", WEEK + 1),
        format!("{{\"ts\":{},\"n\":15}}", WEEK + 2),
        format!("{{\"ts\":{},\"n\":16}}", WEEK + 3),
        "{\"ts\":true}".into(),
        format!("{{\"ts\":{},\"n\":17}}", WEEK + 4),
    ]);
    lines.join("\n") + "\n"
}

/// One read: each batch with the position stored before it.
struct Read {
    batches: Vec<(RecordBatch, SourcePosition)>,
    stats: SourceStats,
}

fn read(cfg: &SourceConfig, start: Option<&SourcePosition>) -> Read {
    let stats = SourceStats::default();
    let mut batches = Vec::new();
    read_source_from(cfg, &stats, start, &mut |b| {
        let position = stats.position.lock().unwrap().clone();
        batches.push((b, position.expect("a file source stores its position")));
        true
    })
    .unwrap();
    Read { batches, stats }
}

fn rows(batches: &[&RecordBatch]) -> RecordBatch {
    concat_batches(&schema(), batches.iter().copied()).unwrap()
}

fn bad_rows(stats: &SourceStats) -> Vec<BadRow> {
    stats.bad_samples.lock().unwrap().clone()
}

/// The dead-letter lines as bad rows.
fn dead_rows(text: &str) -> Vec<BadRow> {
    text.lines()
        .map(|l| {
            let mut parts = l.splitn(3, '\t');
            BadRow {
                line: parts.next().unwrap().parse().unwrap(),
                reason: parts.next().unwrap().to_string(),
            }
        })
        .collect()
}

/// Reads `text` whole, then resumes at every position stored and checks
/// that the rows, counters, bad rows and dead letter add up to the
/// whole read. Returns the positions, for more checks.
fn resume_everywhere(format: Format, text: &str, batch_size: usize) -> Vec<SourcePosition> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in");
    let dead = dir.path().join("dead");
    std::fs::write(&path, text).unwrap();
    let cfg = config(format, &path, &dead, batch_size);
    let whole = read(&cfg, None);
    assert!(whole.batches.len() > 4, "{}", whole.batches.len());
    let all: Vec<&RecordBatch> = whole.batches.iter().map(|(b, _)| b).collect();
    let expected = rows(&all);
    let dead_text = std::fs::read_to_string(&dead).unwrap();
    let dead_lines: Vec<&str> = dead_text.lines().collect();
    let bad = dead_rows(&dead_text);
    assert_eq!(
        whole.stats.bad_rows.load(Ordering::Relaxed),
        bad.len() as u64
    );
    for (k, (_, position)) in whole.batches.iter().enumerate() {
        let context = format!("{format:?}, batch size {batch_size}, after batch {k}: {position:?}");
        // The dead letter as it was when the position was stored.
        let done = position.bad_rows as usize;
        let resumed_dead = dir.path().join(format!("dead{k}"));
        let mut prefix = dead_lines[..done].join("\n");
        if done > 0 {
            prefix.push('\n');
        }
        std::fs::write(&resumed_dead, prefix).unwrap();
        let resumed_cfg = SourceConfig {
            dead_letter: Some(resumed_dead.clone()),
            ..cfg.clone()
        };
        let resumed = read(&resumed_cfg, Some(position));
        let mut parts = all[..=k].to_vec();
        parts.extend(resumed.batches.iter().map(|(b, _)| b));
        assert_eq!(rows(&parts), expected, "{context}");
        let counter = |s: &SourceStats| {
            (
                s.rows.load(Ordering::Relaxed),
                s.bad_rows.load(Ordering::Relaxed),
            )
        };
        assert_eq!(counter(&resumed.stats), counter(&whole.stats), "{context}");
        assert_eq!(
            std::fs::read_to_string(&resumed_dead).unwrap(),
            dead_text,
            "{context}"
        );
        let later: Vec<BadRow> = bad[done..]
            .iter()
            .take(crate::connector::BAD_ROW_SAMPLES)
            .cloned()
            .collect();
        assert_eq!(bad_rows(&resumed.stats), later, "{context}");
        // The resumed read stores the same positions.
        let tail: Vec<&SourcePosition> = whole.batches[k + 1..].iter().map(|(_, p)| p).collect();
        let again: Vec<&SourcePosition> = resumed.batches.iter().map(|(_, p)| p).collect();
        assert_eq!(again, tail, "{context}");
    }
    whole.batches.into_iter().map(|(_, p)| p).collect()
}

fn kept(position: &SourcePosition, what: &str) -> usize {
    position
        .extra
        .get(what)
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

#[test]
fn csv_resumes_at_every_batch() {
    let mut inside_jump = false;
    for batch_size in [2, 3] {
        let positions = resume_everywhere(Format::Csv, &csv_text(), batch_size);
        inside_jump |= positions.iter().any(|p| kept(p, "accepted") > 0);
        let last = positions.last().unwrap();
        assert_eq!(last.offset, csv_text().len() as u64);
        assert_eq!(last.line, 29);
        assert!(last.extra["guard"]["largest"].as_i64() == Some(WEEK + 6000));
    }
    // Some position falls inside the jump, with rows accepted and not
    // yet emitted.
    assert!(inside_jump);
}

#[test]
fn jsonl_resumes_at_every_batch() {
    let mut inside_jump = false;
    for batch_size in [2, 3] {
        let positions = resume_everywhere(Format::Jsonl, &jsonl_text(), batch_size);
        inside_jump |= positions.iter().any(|p| kept(p, "accepted") > 0);
        assert_eq!(positions.last().unwrap().line, 21);
    }
    assert!(inside_jump);
}

#[test]
fn the_whole_reads_count_what_they_should() {
    // The fixtures themselves: what the resumed reads are compared to.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in");
    let dead = dir.path().join("dead");
    std::fs::write(&path, csv_text()).unwrap();
    let whole = read(&config(Format::Csv, &path, &dead, 2), None);
    let lines: Vec<u64> = dead_rows(&std::fs::read_to_string(&dead).unwrap())
        .iter()
        .map(|b| b.line)
        .collect();
    // 2000,x; 4000 short; the bad record of lines 9-10; zz, then the
    // outlier before it, once the next row shows it is one; the bad
    // record of lines 26-27.
    assert_eq!(lines, vec![4, 7, 9, 10, 19, 18, 26, 27]);
    assert_eq!(whole.stats.rows.load(Ordering::Relaxed), 18);
}

#[test]
fn a_position_past_the_end_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.csv");
    let dead = dir.path().join("dead");
    std::fs::write(&path, "ts,host,cpu,n,up\n1,a,1,1,true\n").unwrap();
    let cfg = config(Format::Csv, &path, &dead, 2);
    let position = SourcePosition {
        offset: 500,
        line: 20,
        ..SourcePosition::default()
    };
    let stats = SourceStats::default();
    let err = read_source_from(&cfg, &stats, Some(&position), &mut |_| true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&path.display().to_string())
            && err.contains("byte 500")
            && err.contains("only 30 bytes"),
        "{err}"
    );
    // stdin cannot resume at all.
    let stdin = SourceConfig {
        location: SourceLocation::Stdin,
        ..cfg
    };
    let err = read_source_from(&stdin, &stats, Some(&position), &mut |_| true).unwrap_err();
    assert!(err.to_string().contains("cannot be read again"), "{err}");
}

/// What a followed read sends: its rows' event times, or `None` for an
/// empty batch, with the position stored before.
type Sent = (Option<Vec<i64>>, SourcePosition);

fn follow(
    cfg: SourceConfig,
    start: Option<SourcePosition>,
) -> (
    Arc<SourceStats>,
    mpsc::Receiver<Sent>,
    std::thread::JoinHandle<Result<()>>,
) {
    let stats = Arc::new(SourceStats::default());
    let (tx, rx) = mpsc::channel();
    let reader = {
        let stats = stats.clone();
        std::thread::spawn(move || {
            read_source_from(&cfg, &stats, start.as_ref(), &mut |b| {
                let ts = b
                    .column(0)
                    .as_any()
                    .downcast_ref::<TimestampMillisecondArray>()
                    .unwrap()
                    .values()
                    .to_vec();
                let position = stats.position.lock().unwrap().clone().unwrap();
                tx.send(((!ts.is_empty()).then_some(ts), position)).is_ok()
            })
        })
    };
    (stats, rx, reader)
}

/// Receives until `rows` rows came, then until an empty batch comes;
/// returns the rows and the empty batch's position.
fn until_idle(rx: &mpsc::Receiver<Sent>, rows: usize) -> (Vec<i64>, SourcePosition) {
    let mut got = Vec::new();
    loop {
        let (ts, position) = rx.recv_timeout(Duration::from_secs(20)).expect("a batch");
        match ts {
            Some(ts) => got.extend(ts),
            None if got.len() >= rows => return (got, position),
            None => {}
        }
    }
}

#[test]
fn a_followed_file_resumes_where_it_waited() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.csv");
    let dead = dir.path().join("dead");
    // The last row is far ahead: the guard holds it while the file
    // waits for more.
    let text =
        format!("ts,host,cpu,n,up\n1000,a,1,1,true\n2000,a,1,2,true\n{TEN_YEARS},a,1,3,true\n");
    std::fs::write(&path, &text).unwrap();
    let cfg = SourceConfig {
        follow: true,
        ..config(Format::Csv, &path, &dead, 100)
    };
    let (stats, rx, reader) = follow(cfg.clone(), None);
    let (got, idle) = until_idle(&rx, 2);
    assert_eq!(got, vec![1000, 2000]);
    assert_eq!(idle.offset, text.len() as u64);
    assert_eq!((idle.line, idle.rows, idle.bad_rows), (4, 2, 0));
    assert_eq!(kept(&idle, "held"), 1, "{idle:?}");
    // It keeps emitting empty batches while it waits.
    let start = Instant::now();
    for _ in 0..3 {
        let (ts, position) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(ts, None);
        assert_eq!(position, idle);
    }
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    stats.stop.store(true, Ordering::Relaxed);
    reader.join().unwrap().unwrap();
    assert_eq!(
        stats.bad_rows.load(Ordering::Relaxed),
        0,
        "stopped, not ended"
    );

    // The file grows while nothing reads it; the resumed read takes the
    // new rows only, and the held row turns out an outlier.
    let mut file = OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(b"3000,a,1,4,true\n4000,a,1,5,true\n")
        .unwrap();
    let (stats, rx, reader) = follow(cfg.clone(), Some(idle));
    let (got, idle) = until_idle(&rx, 2);
    assert_eq!(got, vec![3000, 4000]);
    assert_eq!(stats.rows.load(Ordering::Relaxed), 4);
    assert_eq!(
        bad_rows(&stats),
        vec![BadRow {
            line: 4,
            reason: format!(
                "column ts: event time too far ahead: {} is more than 1 day after \
                     1970-01-01T00:00:02, the largest event time so far (max_future)",
                crate::timestamp::format_timestamp_ms(TEN_YEARS)
            ),
        }]
    );
    stats.stop.store(true, Ordering::Relaxed);
    reader.join().unwrap().unwrap();

    // Rotated while nothing read it: the new file is read from its
    // start, its own header first.
    std::fs::rename(&path, dir.path().join("in.csv.1")).unwrap();
    std::fs::write(&path, "host,ts,cpu,n,up\nb,5000,1,6,true\nb,x,1,7,true\n").unwrap();
    let (stats, rx, reader) = follow(cfg, Some(idle));
    let (got, idle) = until_idle(&rx, 1);
    assert_eq!(got, vec![5000]);
    assert_eq!((idle.line, idle.rows, idle.bad_rows), (3, 5, 2));
    assert_eq!(bad_rows(&stats)[0].line, 3);
    stats.stop.store(true, Ordering::Relaxed);
    reader.join().unwrap().unwrap();
}

#[test]
fn a_record_open_while_waiting_is_read_again_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.csv");
    let dead = dir.path().join("dead");
    let head = "ts,host,cpu,n,up\n1000,a,1,1,true\n";
    std::fs::write(&path, format!("{head}2000,\"open\n")).unwrap();
    let cfg = SourceConfig {
        follow: true,
        ..config(Format::Csv, &path, &dead, 100)
    };
    let (stats, rx, reader) = follow(cfg.clone(), None);
    let (got, idle) = until_idle(&rx, 1);
    assert_eq!(got, vec![1000]);
    // Before the record's first line.
    assert_eq!((idle.offset, idle.line), (head.len() as u64, 2));
    stats.stop.store(true, Ordering::Relaxed);
    reader.join().unwrap().unwrap();
    assert_eq!(
        stats.bad_rows.load(Ordering::Relaxed),
        0,
        "stopped, not ended"
    );

    let mut file = OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(b"field\",1,2,true\n3000,a,x,3,true\n")
        .unwrap();
    let (stats, rx, reader) = follow(cfg, Some(idle));
    let (got, _) = until_idle(&rx, 1);
    assert_eq!(got, vec![2000]);
    wait_for_bad(&stats, 1);
    assert_eq!(bad_rows(&stats)[0].line, 5);
    stats.stop.store(true, Ordering::Relaxed);
    reader.join().unwrap().unwrap();
}

fn wait_for_bad(stats: &SourceStats, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while stats.bad_rows.load(Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "waiting for {n} bad rows");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_realtime_pause_emits_empty_batches_and_keeps_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.jsonl");
    let dead = dir.path().join("dead");
    std::fs::write(&path, "{\"ts\":0,\"n\":1}\n{\"ts\":350,\"n\":2}\n").unwrap();
    let cfg = SourceConfig {
        replay: Replay::Realtime { speed: 1.0 },
        ..config(Format::Jsonl, &path, &dead, 100)
    };
    let whole = read(&cfg, None);
    let sizes: Vec<usize> = whole.batches.iter().map(|(b, _)| b.num_rows()).collect();
    // The first row, empty batches during the 350 ms pause, the second.
    assert!(sizes.len() >= 4, "{sizes:?}");
    assert_eq!(sizes[0], 1);
    assert_eq!(*sizes.last().unwrap(), 1);
    assert!(
        sizes[1..sizes.len() - 1].iter().all(|&n| n == 0),
        "{sizes:?}"
    );
    // During the pause the second row is consumed and still to come.
    let (_, pausing) = &whole.batches[1];
    assert_eq!(pausing.line, 2);
    assert_eq!(kept(pausing, "accepted"), 1);
    let resumed = read(&cfg, Some(pausing));
    let n: Vec<i64> = resumed
        .batches
        .iter()
        .flat_map(|(b, _)| {
            let n = b.column(3).as_any().downcast_ref::<Int64Array>().unwrap();
            n.values().to_vec()
        })
        .collect();
    assert_eq!(n, vec![2]);
}
