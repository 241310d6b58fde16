//! All integration tests live in one binary so DataFusion is linked once.

mod cli;
mod conformance;
mod examples;
mod grammar_examples;
mod library;
mod repl;
mod series_pack;
mod service;
mod session;
mod webhook;
