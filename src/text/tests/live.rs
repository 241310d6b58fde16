//! The source on live input: emitting when input runs dry, following a
//! growing, rotated or truncated file, stopping, and pacing a replay.

use super::*;

/// Hands out its input in the given chunks, one per read call, like a
/// pipe whose writer is slow.
pub(super) struct Chunked(Vec<Vec<u8>>);

impl Read for Chunked {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.0.is_empty() {
            return Ok(0);
        }
        let chunk = self.0.remove(0);
        assert!(chunk.len() < buf.len());
        buf[..chunk.len()].copy_from_slice(&chunk);
        Ok(chunk.len())
    }
}

#[test]
pub(super) fn live_input_emits_when_input_runs_dry() {
    for format in [Format::Csv, Format::Jsonl] {
        let chunks: Vec<Vec<u8>> = match format {
            Format::Csv => vec![
                b"ts,host,cpu,n,up\n1000,a,1,1,true\n".to_vec(),
                b"2000,a,1,1,true\r\n3000,a,1,1,true\r\n".to_vec(),
                b"4000,a,1,1,true\n".to_vec(),
            ],
            Format::Jsonl => vec![
                b"{\"ts\":1000}\n".to_vec(),
                b"{\"ts\":2000}\n{\"ts\":3000}\r\n".to_vec(),
                b"{\"ts\":4000}\n".to_vec(),
            ],
        };
        let cfg = config(format, SourceLocation::Stdin);
        let run = run_reader(&cfg, Chunked(chunks.clone()), true);
        let sizes: Vec<usize> = run.batches.iter().map(|b| b.num_rows()).collect();
        assert_eq!(sizes, vec![1, 2, 1], "{format:?}");
        // Not live: one batch.
        let run = run_reader(&cfg, Chunked(chunks), false);
        let sizes: Vec<usize> = run.batches.iter().map(|b| b.num_rows()).collect();
        assert_eq!(sizes, vec![4], "{format:?}");
    }
}

#[test]
pub(super) fn follow_reads_a_growing_file_until_stopped() {
    for format in [Format::Csv, Format::Jsonl] {
        let rows: [&str; 4] = match format {
            Format::Csv => [
                "ts,host,cpu,n,up\n1000,a,1,1,true\n",
                "2000,a,1,1,true\n3000,a,",
                "1,1,true\n",
                "4000,a,1,1,true\n",
            ],
            Format::Jsonl => [
                "{\"ts\":1000}\n",
                "{\"ts\":2000}\n{\"ts\":",
                "3000}\n",
                "{\"ts\":4000}\n",
            ],
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in");
        std::fs::write(&path, rows[0]).unwrap();
        let cfg = SourceConfig {
            follow: true,
            ..config(format, SourceLocation::File(path.clone()))
        };
        let stats = Arc::new(SourceStats::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = {
            let stats = stats.clone();
            std::thread::spawn(move || {
                read_source(&cfg, &stats, &mut |b| {
                    // Empty batches (waiting) are tested elsewhere.
                    b.num_rows() == 0 || tx.send(b.num_rows()).is_ok()
                })
            })
        };
        let append = |text: &str| {
            let mut file = OpenOptions::new().append(true).open(&path).unwrap();
            file.write_all(text.as_bytes()).unwrap();
        };
        let wait = Duration::from_secs(10);
        assert_eq!(rx.recv_timeout(wait), Ok(1), "{format:?}: the first row");
        append(rows[1]);
        // The whole line goes on; the partial one waits for its newline.
        assert_eq!(rx.recv_timeout(wait), Ok(1), "{format:?}: the second row");
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
        append(rows[2]);
        assert_eq!(
            rx.recv_timeout(wait),
            Ok(1),
            "{format:?}: the completed row"
        );
        assert_eq!(stats.max_event_time.get(), Some(3000));
        stats.stop.store(true, Ordering::Relaxed);
        reader.join().unwrap().unwrap();
        append(rows[3]);
        assert_eq!(stats.rows.load(Ordering::Relaxed), 3);
        assert_eq!(stats.bad_rows.load(Ordering::Relaxed), 0);
    }
}

/// Waits (boundedly) until `cond` holds.
pub(super) fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
pub(super) fn follow_reopens_a_rotated_or_truncated_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.csv");
    // The old file's last line has no newline: it still counts.
    std::fs::write(&path, "ts,host,cpu,n,up\n1000,a,1,1,true\n2000,a,1,1,true").unwrap();
    let cfg = SourceConfig {
        follow: true,
        ..config(Format::Csv, SourceLocation::File(path.clone()))
    };
    let stats = Arc::new(SourceStats::default());
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = {
        let stats = stats.clone();
        std::thread::spawn(move || {
            read_source(&cfg, &stats, &mut |b| {
                if b.num_rows() == 0 {
                    return true;
                }
                let ts = b
                    .column(0)
                    .as_any()
                    .downcast_ref::<TimestampMillisecondArray>()
                    .unwrap()
                    .values()
                    .to_vec();
                tx.send(ts).is_ok()
            })
        })
    };
    let wait = Duration::from_secs(20);
    assert_eq!(rx.recv_timeout(wait), Ok(vec![1000]));
    // Rotation: rename, then a new file with its own header, in
    // another column order, and a bad row on its line 3.
    std::fs::rename(&path, dir.path().join("in.csv.1")).unwrap();
    std::fs::write(&path, "host,ts,cpu,n,up\nb,3000,1,1,true\nb,x,1,1,true\n").unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        got.extend(rx.recv_timeout(wait).expect("rows after the rotation"));
    }
    assert_eq!(got, vec![2000, 3000]);
    wait_for("the bad row", || {
        stats.bad_rows.load(Ordering::Relaxed) == 1
    });
    assert_eq!(
        stats.bad_samples.lock().unwrap()[0],
        BadRow {
            line: 3,
            reason: "column ts: cannot parse 'x' as TIMESTAMP".into()
        }
    );
    // Truncation (copy-and-truncate): read again from the start.
    std::fs::write(&path, "ts,host,cpu,n,up\n4000,c,1,1,true\n").unwrap();
    assert_eq!(rx.recv_timeout(wait), Ok(vec![4000]));
    stats.stop.store(true, Ordering::Relaxed);
    reader.join().unwrap().unwrap();
    assert_eq!(stats.rows.load(Ordering::Relaxed), 4);
}

#[test]
pub(super) fn a_stop_request_ends_reading_at_the_next_row() {
    let mut text = String::from("ts,host,cpu,n,up\n");
    for i in 0..10 {
        text.push_str(&format!("{i},h,1,{i},true\n"));
    }
    let cfg = SourceConfig {
        batch_size: 2,
        ..config(Format::Csv, SourceLocation::Stdin)
    };
    let stats = SourceStats::default();
    let mut batches = 0;
    let mut emit = |_b: RecordBatch| {
        batches += 1;
        stats.stop.store(true, Ordering::Relaxed);
        true
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
    assert_eq!(batches, 1);
    assert_eq!(stats.rows.load(Ordering::Relaxed), 2);
    assert_eq!(stats.max_event_time.get(), Some(1));
}

#[test]
pub(super) fn realtime_replay_paces_rows() {
    let text = "ts,host,cpu,n,up\n0,a,1,1,true\n0,a,1,1,true\n400,a,1,1,true\n800,a,1,1,true\n";
    let cfg = SourceConfig {
        replay: Replay::Realtime { speed: 4.0 },
        ..config(Format::Csv, SourceLocation::Stdin)
    };
    let stats = SourceStats::default();
    let start = Instant::now();
    let mut arrivals = Vec::new();
    let mut emit = |b: RecordBatch| {
        arrivals.push((b.num_rows(), start.elapsed()));
        true
    };
    let mut d = Driver::new(&cfg, &stats, &mut emit).unwrap();
    read_format(
        cfg.format,
        Input::new(Cursor::new(text.as_bytes().to_vec()), "t", false),
        &mut d,
        None,
    )
    .unwrap();
    drop(d);
    // 400 ms of event time at speed 4 = 100 ms of wall time per gap.
    let sizes: Vec<usize> = arrivals.iter().map(|a| a.0).collect();
    assert_eq!(sizes, vec![2, 1, 1]);
    // At once: before the first gap's 100 ms, with room for a busy
    // machine.
    assert!(arrivals[0].1 < Duration::from_millis(100), "{arrivals:?}");
    assert!(arrivals[1].1 >= Duration::from_millis(100), "{arrivals:?}");
    assert!(arrivals[2].1 >= Duration::from_millis(200), "{arrivals:?}");
    assert!(arrivals[2].1 < Duration::from_millis(1000), "{arrivals:?}");
}
