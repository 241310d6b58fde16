//! vigil: continuous SQL over unbounded streams of system metrics and events.
//!
//! The data path reads top to bottom, one module per stage:
//! [`sql`] (parser) -> [`plan`] (logical plan) -> [`planner`] (incremental
//! planner) -> [`exec`] (Arrow operators) -> [`runtime`] (tasks, channels,
//! watermarks), with [`connectors`] (sources, sinks) and the front end
//! ([`cli`]) at the edges. [`engine`] plans statements; [`session`] runs them
//! in the background for programs that embed vigil; [`service`] puts a
//! session behind HTTP (`vigil serve`); [`analyze`] measures a query for
//! `EXPLAIN ANALYZE` and the shell's `.stats`.

pub mod analyze;
pub mod cli;
pub mod connector;
pub mod connectors;
pub mod crashpoint;
pub mod diag;
pub mod engine;
pub mod error;
pub mod exec;
pub mod functions;
pub mod group;
pub mod plan;
pub mod planner;
pub mod repl;
pub mod runtime;
pub mod service;
pub mod session;
pub mod sql;
pub mod state;
pub mod text;
pub mod timestamp;
pub mod types;
