use super::*;
use datafusion::arrow::array::{StringArray, TimestampMillisecondArray};
use datafusion::arrow::datatypes::TimeUnit;
use datafusion::physical_expr::expressions::{BinaryExpr, col, lit};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new("host", DataType::Utf8, true),
        Field::new("severity", DataType::Int64, true),
    ]))
}

/// `rows` rows, 1 ms apart from `start`, over `hosts` hosts; every
/// tenth has severity 5, the others 1.
fn rows(start: i64, rows: usize, hosts: usize) -> RecordBatch {
    let ts: TimestampMillisecondArray = (0..rows).map(|i| Some(start + i as i64)).collect();
    let host: StringArray = (0..rows).map(|i| Some(format!("h{}", i % hosts))).collect();
    let severity: Int64Array = (0..rows)
        .map(|i| Some(if i % 10 == 0 { 5 } else { 1 }))
        .collect();
    RecordBatch::try_new(
        schema(),
        vec![Arc::new(ts), Arc::new(host), Arc::new(severity)],
    )
    .unwrap()
}

fn windows(ledger: &Arc<ShedLedger>) -> ShedWindows {
    ShedWindows {
        time_column: 0,
        spec: WindowSpec::tumble(1_000, 0),
        delay_ms: 0,
        lateness_ms: 0,
        keys: vec![1],
        ledger: ledger.clone(),
    }
}

fn ledger() -> Arc<ShedLedger> {
    Arc::new(ShedLedger::new(WindowSpec::tumble(1_000, 0), 0))
}

fn op(policy: ShedPolicy, windows: Option<ShedWindows>) -> (ShedOp, Arc<QueryStats>) {
    let stats = Arc::new(QueryStats::default());
    let keep: Option<Arc<dyn PhysicalExpr>> = (policy == ShedPolicy::Priority).then(|| {
        let severity = col("severity", &schema()).unwrap();
        Arc::new(BinaryExpr::new(
            severity,
            datafusion::logical_expr::Operator::GtEq,
            lit(3i64),
        )) as Arc<dyn PhysicalExpr>
    });
    let op = ShedOp::try_new(
        schema(),
        policy,
        Duration::from_secs(2),
        keep,
        windows,
        stats.clone(),
    )
    .unwrap();
    (op, stats)
}

/// Every batch `op` hands on for `input`, then for a final watermark.
fn run(op: &mut ShedOp, input: &[RecordBatch]) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    for batch in input {
        op.on_batch(batch.clone(), &mut out).unwrap();
    }
    op.on_watermark(crate::exec::END_OF_INPUT, &mut out)
        .unwrap();
    out.into_iter()
        .filter_map(|m| match m {
            Message::Batch(b) => Some(b),
            _ => None,
        })
        .collect()
}

fn count(batches: &[RecordBatch]) -> usize {
    batches.iter().map(|b| b.num_rows()).sum()
}

#[test]
fn the_drop_fraction_rises_with_overload_and_decays_after() {
    let mut c = Controller::new(Duration::from_secs(2));
    assert_eq!(c.update(500.0), 0.0, "under the aim nothing is dropped");
    // 3 s against an aim of 1 s: 2 units of overload a tick.
    let first = c.update(3_000.0);
    assert!((first - 2.0 * GAIN).abs() < 1e-9, "{first}");
    let mut last = first;
    for _ in 0..5 {
        let next = c.update(3_000.0);
        assert!(next > last);
        last = next;
    }
    for _ in 0..100 {
        c.update(1e9);
    }
    assert_eq!(c.drop_fraction(), MAX_DROP);
    // In the dead band it holds; under a quarter of the bound it decays.
    assert_eq!(c.update(700.0), MAX_DROP);
    let decayed = c.update(100.0);
    assert!((decayed - MAX_DROP * DECAY).abs() < 1e-9, "{decayed}");
    for _ in 0..400 {
        c.update(0.0);
    }
    assert_eq!(c.drop_fraction(), 0.0);
}

#[test]
fn random_keeps_about_one_minus_p() {
    let (mut op, stats) = op(ShedPolicy::Random, None);
    op.set_drop_fraction(0.7);
    let input: Vec<_> = (0..20).map(|i| rows(i * 1_000, 1_000, 4)).collect();
    let kept = count(&run(&mut op, &input));
    let share = kept as f64 / 20_000.0;
    assert!((share - 0.3).abs() < 0.02, "kept {share}");
    assert_eq!(
        stats.shed_rows.load(Ordering::Relaxed),
        20_000 - kept as u64
    );
}

#[test]
fn priority_keeps_every_matching_row() {
    let (mut op, stats) = op(ShedPolicy::Priority, None);
    op.set_drop_fraction(MAX_DROP);
    let out = run(&mut op, &[rows(0, 10_000, 4)]);
    let severe = out
        .iter()
        .flat_map(|b| {
            b.column(2)
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                .values()
                .to_vec()
        })
        .filter(|s| *s >= 3)
        .count();
    assert_eq!(severe, 1_000, "every severe row is kept");
    let kept = count(&out);
    assert!(
        kept < 1_200,
        "the others are dropped at the rate: kept {kept}"
    );
    assert_eq!(
        stats.shed_rows.load(Ordering::Relaxed),
        10_000 - kept as u64
    );
}

#[test]
fn priority_needs_shed_keep_and_window_needs_windows() {
    let stats = Arc::new(QueryStats::default());
    let new = |policy| ShedOp::try_new(schema(), policy, TICK, None, None, stats.clone()).err();
    assert!(
        new(ShedPolicy::Priority)
            .unwrap()
            .to_string()
            .contains("shed_keep")
    );
    assert!(
        new(ShedPolicy::Window)
            .unwrap()
            .to_string()
            .contains("windowed")
    );
}

/// (pane, host) -> rows, of what was handed on.
fn groups(batches: &[RecordBatch]) -> HashMap<(i64, String), u64> {
    let mut groups = HashMap::new();
    for b in batches {
        let ts = b.column(0).as_primitive::<TimestampMillisecondType>();
        let host = b.column(1).as_string::<i32>();
        for i in 0..b.num_rows() {
            let pane = ts.value(i) - ts.value(i).rem_euclid(1_000);
            *groups.entry((pane, host.value(i).to_string())).or_default() += 1;
        }
    }
    groups
}

#[test]
fn window_drops_whole_groups_and_the_fraction_is_the_dropped_share() {
    let ledger = ledger();
    let (mut op, stats) = op(ShedPolicy::Window, Some(windows(&ledger)));
    op.set_drop_fraction(0.5);
    // Ten 1 s windows of 4 hosts, 250 rows each, in batches that cut
    // across windows.
    let input: Vec<_> = (0..40).map(|i| rows(i * 250, 250, 4)).collect();
    let all = groups(&input);
    let kept = groups(&run(&mut op, &input));
    assert!(
        kept.iter().all(|(g, n)| all[g] == *n),
        "a group is kept whole or not at all: {kept:?}"
    );
    assert!(
        (10..30).contains(&kept.len()),
        "about half of 40 groups: {}",
        kept.len()
    );
    let dropped = 10_000 - kept.values().sum::<u64>();
    assert_eq!(stats.shed_rows.load(Ordering::Relaxed), dropped);
    let output = ShedOutput {
        ledger: ledger.clone(),
        scale: false,
    };
    for &(pane, ref host) in kept.keys() {
        let keys: ArrayRef = Arc::new(StringArray::from(vec![host.as_str()]));
        let f = output.fractions(pane, &[keys], 1).unwrap();
        assert_eq!(f.value(0), 0.0, "a surviving window is exact");
    }
}

#[test]
fn the_fraction_is_exactly_the_share_dropped_per_window_and_key() {
    let ledger = ledger();
    let (mut op, _) = op(ShedPolicy::Random, Some(windows(&ledger)));
    op.set_drop_fraction(0.4);
    let input: Vec<_> = (0..8).map(|i| rows(i * 500, 500, 2)).collect();
    let kept = groups(&run(&mut op, &input));
    let output = ShedOutput {
        ledger,
        scale: false,
    };
    for pane in [0, 1_000, 2_000, 3_000] {
        for host in ["h0", "h1"] {
            let keys: ArrayRef = Arc::new(StringArray::from(vec![host]));
            let f = output.fractions(pane, &[keys], 1).unwrap().value(0);
            let n = kept[&(pane, host.to_string())];
            // Each (window, host) had 500 rows.
            assert_eq!(f, (500 - n) as f64 / 500.0, "{pane} {host}");
        }
    }
}

#[test]
fn late_rows_are_left_to_the_window_operator() {
    let ledger = ledger();
    let (mut op, stats) = op(ShedPolicy::Random, Some(windows(&ledger)));
    let mut out = Vec::new();
    // Kept, so the window operator sees it and the watermark is 5000.
    op.on_batch(rows(5_000, 1, 1), &mut out).unwrap();
    op.set_drop_fraction(MAX_DROP);
    let before = stats.shed_rows.load(Ordering::Relaxed);
    // Window [0, 1000) closed at watermark 5000: late, so never shed.
    op.on_batch(rows(0, 100, 1), &mut out).unwrap();
    assert_eq!(stats.shed_rows.load(Ordering::Relaxed), before);
    op.on_watermark(crate::exec::END_OF_INPUT, &mut out)
        .unwrap();
    assert!(count(&run(&mut op, &[])) == 0);
    let handed: usize = out
        .iter()
        .map(|m| match m {
            Message::Batch(b) => b.num_rows(),
            _ => 0,
        })
        .sum();
    assert_eq!(handed, 101);
    assert_eq!(
        ledger.window(
            0,
            key_hashes(&[Arc::new(StringArray::from(vec!["h0"])) as ArrayRef], 1).unwrap()[0]
        ),
        Tally::default()
    );
}

#[test]
fn counts_and_sums_scale_by_the_share_kept() {
    let fractions = Float64Array::from(vec![0.0, 0.5, 0.75]);
    let counts: ArrayRef = Arc::new(Int64Array::from(vec![Some(10), Some(10), None]));
    let scaled = scale_up(&counts, &fractions).unwrap();
    let scaled = scaled.as_primitive::<datafusion::arrow::datatypes::Int64Type>();
    assert_eq!(scaled.value(0), 10);
    assert_eq!(scaled.value(1), 20);
    assert!(scaled.is_null(2));
    let sums: ArrayRef = Arc::new(Float64Array::from(vec![1.5, 1.5, 1.5]));
    let scaled = scale_up(&sums, &fractions).unwrap();
    let scaled = scaled.as_primitive::<datafusion::arrow::datatypes::Float64Type>();
    assert_eq!(scaled.values().to_vec(), vec![1.5, 3.0, 6.0]);
}

#[test]
fn the_ledger_forgets_a_pane_once_every_reader_is_past_it() {
    let ledger = ledger();
    ledger.set_readers(2);
    let mut counts = HashMap::new();
    counts.insert(
        (0, 7),
        Tally {
            kept: 3,
            dropped: 1,
        },
    );
    ledger.record(&counts);
    let (a, b) = (ledger.join(), ledger.join());
    ledger.advance(a, 5_000);
    assert_eq!(ledger.window(0, 7).dropped, 1, "reader b has not fired it");
    ledger.advance(b, 1_000);
    assert_eq!(ledger.window(0, 7), Tally::default());
}

#[test]
fn a_restored_op_carries_on_as_the_original() {
    let ledger = ledger();
    let (mut op, _) = op(ShedPolicy::Window, Some(windows(&ledger)));
    op.set_drop_fraction(0.5);
    let mut out = Vec::new();
    op.on_batch(rows(0, 600, 4), &mut out).unwrap();
    let state = op.snapshot().unwrap().unwrap();
    let again_ledger = self::ledger();
    let (mut again, _) = self::op(ShedPolicy::Window, Some(windows(&again_ledger)));
    again.restore(state).unwrap();
    assert_eq!(again.drop_fraction(), 0.5);
    let rest = [rows(600, 400, 4), rows(1_000, 1_000, 4)];
    assert_eq!(
        groups(&run(&mut op, &rest)),
        groups(&run(&mut again, &rest))
    );
    for host in ["h0", "h1", "h2", "h3"] {
        let key = key_hashes(&[Arc::new(StringArray::from(vec![host])) as ArrayRef], 1).unwrap()[0];
        assert_eq!(ledger.window(0, key), again_ledger.window(0, key));
    }
}

#[test]
fn queue_gauges_drive_the_drop_fraction_up_and_then_down() {
    let (mut op, stats) = op(ShedPolicy::Random, None);
    let gauge = Arc::new(QueueGauge::new("s1", "s1"));
    stats.metrics.add_queue(gauge.clone());
    let mut out = Vec::new();
    op.on_tick(&mut out).unwrap();
    // Draining 1000 rows a tick (10k/s) with 50k waiting: 5 s queued,
    // against max_latency 2 s.
    for tick in 1..=10u64 {
        gauge.received_rows.store(tick * 1_000, Ordering::Relaxed);
        gauge.queued_rows.store(50_000, Ordering::Relaxed);
        std::thread::sleep(TICK);
        op.on_tick(&mut out).unwrap();
    }
    let raised = op.drop_fraction();
    assert!(raised > 0.5, "{raised}");
    // The queue empties: the fraction decays.
    for tick in 11..=20u64 {
        gauge.received_rows.store(tick * 1_000, Ordering::Relaxed);
        gauge.queued_rows.store(0, Ordering::Relaxed);
        std::thread::sleep(TICK);
        op.on_tick(&mut out).unwrap();
    }
    let decayed = op.drop_fraction();
    assert!(decayed < raised * 0.9, "{raised} then {decayed}");
}

#[test]
fn instances_of_a_stage_count_once_and_stages_add_up() {
    let gauge = |stage: &str, queued: u64| {
        let g = Arc::new(QueueGauge::new(stage, stage));
        g.queued_rows.store(queued, Ordering::Relaxed);
        g
    };
    let queues = vec![gauge("s1", 100), gauge("s1", 300), gauge("s2", 200)];
    let mut watch = QueueWatch::default();
    let start = Instant::now();
    assert_eq!(watch.delay_ms(&queues, start), 0.0, "no drain rate yet");
    for q in &queues {
        q.received_rows.store(100, Ordering::Relaxed);
    }
    // 100 rows in a second each: s1 waits 3 s (its slower instance),
    // s2 2 s.
    let delay = watch.delay_ms(&queues, start + Duration::from_secs(1));
    assert!((delay - 5_000.0).abs() < 1e-6, "{delay}");
}

#[test]
fn a_replay_of_old_data_is_never_shed() {
    let ledger = ledger();
    let (mut op, stats) = op(ShedPolicy::Random, Some(windows(&ledger)));
    let gauge = Arc::new(QueueGauge::new("s1", "s1"));
    stats.metrics.add_queue(gauge.clone());
    let mut out = Vec::new();
    // Event times of 1970: not live.
    op.on_batch(rows(0, 10, 1), &mut out).unwrap();
    for tick in 1..=5u64 {
        gauge.received_rows.store(tick, Ordering::Relaxed);
        gauge.queued_rows.store(1_000_000, Ordering::Relaxed);
        op.on_tick(&mut out).unwrap();
    }
    assert_eq!(op.drop_fraction(), 0.0);
}
