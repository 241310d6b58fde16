//! All integration tests live in one binary so DataFusion is linked once.

mod alertmanager;
mod analyze;
mod autoscale;
mod buffer;
mod changes;
mod checkpoints;
mod cli;
mod conformance;
mod crash;
mod examples;
mod follow;
mod grammar_examples;
mod group_autoscale;
mod import_rules;
mod ingest;
mod kafka;
mod layers;
mod library;
mod limits;
mod overload;
mod prometheus;
mod props;
mod repl;
mod restore;
mod series_pack;
mod service;
mod session;
mod shed;
mod stack;
mod statement_gen;
mod support;
mod webhook;
mod with_prometheus;

// The benchmark harness's data generator, tested here so that `cargo test`
// runs its tests without building the harness.
#[allow(dead_code)]
#[path = "../benches/harness/data.rs"]
mod bench_data;
#[path = "../benches/harness/data_tests.rs"]
mod bench_data_tests;
