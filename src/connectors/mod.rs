//! Sources and sinks: where rows enter the engine and where results leave it.
//!
//! One module per connector (`file` for files, stdin and pushed rows,
//! `host`, `demo`, `webhook`), each declaring its options and columns to
//! the one list in [`registry`], which the planner, `vigil check`, the
//! shell's completion and the reference read. Shared by all: option parsing
//! ([`options`]), the decoding of text rows ([`source`]: CSV and JSON lines;
//! malformed rows are skipped, counted and reported with their line number,
//! never silently lost), timestamps ([`timestamp`]) and the rendering of
//! results ([`sink`]).

pub mod alertmanager;
#[cfg(test)]
mod catalogue_tests;
mod common;
#[cfg(test)]
mod config_tests;
pub mod demo;
pub mod file;
pub mod file_commit;
pub mod host;
pub mod http;
pub mod influx;
pub mod kafka;
pub mod otlp;
pub mod prometheus;
pub mod registry;
pub mod remote_write;
pub mod sink;
pub mod table;
#[cfg(test)]
mod test_server;
pub mod webhook;

pub use crate::connector::options::parse_output_format;
pub use crate::connector::*;
pub use crate::text::{
    MessageOrigin, dead_letter_line, read_bytes, read_messages, read_source, read_source_from,
};
pub use crate::timestamp::TsUnit;
pub use sink::{Destination, make_labelled_sink, make_sink, make_sink_to, open_sink};
