//! All integration tests live in one binary so DataFusion is linked once.

mod checkpoints;
mod cli;
mod conformance;
mod crash;
mod examples;
mod follow;
mod grammar_examples;
mod library;
mod limits;
mod props;
mod repl;
mod restore;
mod series_pack;
mod service;
mod session;
mod statement_gen;
mod webhook;
