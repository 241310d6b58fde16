//! Parsing speed of the `prometheus` source: one real node_exporter page
//! (`tests/data/prometheus/node_exporter.prom`, 507 samples), parsed line by
//! line into samples as a scrape parses it. Criterion reports samples per
//! second.
//!
//! Run with `cargo bench --bench scrape`.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use vigil::connectors::prometheus::parse_page;

const PAGE: &[u8] = include_bytes!("../tests/data/prometheus/node_exporter.prom");

fn parse(c: &mut Criterion) {
    let page = parse_page(PAGE, None);
    assert!(page.bad.is_empty(), "{:?}", page.bad);
    let mut group = c.benchmark_group("prometheus");
    group.throughput(Throughput::Elements(page.samples.len() as u64));
    group.bench_function("parse_node_exporter_page", |b| {
        b.iter(|| parse_page(black_box(PAGE), None))
    });
    group.finish();
}

criterion_group!(benches, parse);
criterion_main!(benches);
