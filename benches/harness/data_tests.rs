//! Tests of the benchmark harness's data generator
//! (`benches/harness/data.rs`), run by `cargo test` without building the
//! harness.

use crate::bench_data::*;

/// 20,000 rows over 100 hosts.
fn small(seed: u64) -> MetricsSpec {
    MetricsSpec {
        seed,
        rows: 20_000,
        hosts: 100,
    }
}

#[test]
fn metrics_are_the_same_for_a_seed_and_differ_between_seeds() {
    let a: Vec<MetricRow> = Metrics::new(small(1)).collect();
    let b: Vec<MetricRow> = Metrics::new(small(1)).collect();
    let c: Vec<MetricRow> = Metrics::new(small(2)).collect();
    assert_eq!(a.len(), 20_000);
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn every_row_is_within_two_seconds_of_the_running_maximum() {
    let mut max = i64::MIN;
    let mut behind = 0;
    for row in Metrics::new(small(7)) {
        max = max.max(row.ts);
        assert!(
            max - row.ts < MAX_DISORDER_MS,
            "{row:?} is {} ms behind",
            max - row.ts
        );
        behind = behind.max(max - row.ts);
    }
    // The disorder is real, not zero.
    assert!(behind > MAX_DISORDER_MS / 2, "at most {behind} ms behind");
}

#[test]
fn metrics_cover_the_hosts_and_the_cpu_range() {
    let rows: Vec<MetricRow> = Metrics::new(small(3)).collect();
    let mut seen = [false; 100];
    for r in &rows {
        seen[r.host as usize] = true;
        assert!(r.cpu_centi < 10_000);
    }
    assert!(seen.iter().all(|&s| s));
    let hot = rows.iter().filter(|r| r.cpu_centi > 9_000).count();
    assert!((1_500..2_500).contains(&hot), "{hot} rows above 90");
}

#[test]
fn the_metrics_files_are_written_once_and_agree() {
    let dir = std::env::temp_dir().join(format!("vigil-bench-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let small = MetricsSpec {
        seed: 5,
        rows: 1_000,
        hosts: 10,
    };
    let (csv, json) = write_metrics(&dir, small).unwrap();
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    let json_text = std::fs::read_to_string(&json).unwrap();
    assert_eq!(csv_text.lines().count(), 1_001);
    assert_eq!(json_text.lines().count(), 1_000);
    let first = Metrics::new(small).next().unwrap();
    assert_eq!(
        csv_text.lines().nth(1).unwrap(),
        format!(
            "{},{},{}.{:02}",
            first.ts,
            host_name(first.host),
            first.cpu_centi / 100,
            first.cpu_centi % 100
        )
    );
    // Reused: the same parameters do not write again.
    let modified = std::fs::metadata(&csv).unwrap().modified().unwrap();
    write_metrics(&dir, small).unwrap();
    assert_eq!(
        std::fs::metadata(&csv).unwrap().modified().unwrap(),
        modified
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn nexmark_is_deterministic_in_order_and_in_proportion() {
    let spec = NexmarkSpec {
        seed: 1,
        events: 10_007,
        rate: 10_000,
    };
    let a: Vec<Event> = Nexmark::new(spec).collect();
    assert_eq!(a, Nexmark::new(spec).collect::<Vec<_>>());
    let mut counts = NexmarkCounts::default();
    let mut last_ts = i64::MIN;
    for event in &a {
        let (line, fields, ts_field) = match event {
            Event::Person(l) => {
                counts.persons += 1;
                (l, 8, 6)
            }
            Event::Auction(l) => {
                counts.auctions += 1;
                (l, 10, 5)
            }
            Event::Bid(l) => {
                counts.bids += 1;
                (l, 7, 5)
            }
        };
        let parts: Vec<&str> = line.split(',').collect();
        assert_eq!(parts.len(), fields, "{line}");
        let ts: i64 = parts[ts_field].parse().unwrap();
        assert!(ts >= last_ts);
        last_ts = ts;
    }
    assert_eq!(counts, nexmark_counts(spec));
    assert_eq!(counts.persons, 201);
    assert_eq!(counts.auctions, 603);
}

#[test]
fn bids_name_auctions_and_people_that_exist() {
    let spec = NexmarkSpec {
        seed: 9,
        events: 5_000,
        rate: 1_000,
    };
    let (mut persons, mut auctions) = (0u64, 0u64);
    for event in Nexmark::new(spec) {
        match event {
            Event::Person(_) => persons += 1,
            Event::Auction(l) => {
                auctions += 1;
                let seller: u64 = l.split(',').nth(7).unwrap().parse().unwrap();
                assert!((FIRST_ID..FIRST_ID + persons).contains(&seller), "{l}");
            }
            Event::Bid(l) => {
                let mut f = l.split(',');
                let auction: u64 = f.next().unwrap().parse().unwrap();
                let bidder: u64 = f.next().unwrap().parse().unwrap();
                assert!((FIRST_ID..FIRST_ID + auctions).contains(&auction), "{l}");
                assert!((FIRST_ID..FIRST_ID + persons).contains(&bidder), "{l}");
            }
        }
    }
}
