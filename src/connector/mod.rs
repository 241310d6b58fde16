//! The connector contract: what the engine knows of sources and sinks, and
//! all a connector may rely on. It sits below the planner and the runtime,
//! which use only these types; the connectors themselves (`connectors`)
//! implement it, and the registry there is the one list of them.
//!
//! # Lifecycle of a source
//!
//! 1. **Declared.** `CREATE STREAM ... WITH (connector = 'NAME', ...)` is
//!    resolved through the registry to a [`SourceConnector`]; its
//!    [`options`](SourceConnector::options) are checked by [`Options`],
//!    its [`columns`](SourceConnector::columns) against its catalogue, and
//!    [`configure`](SourceConnector::configure) returns the stream's
//!    [`SourceConfig`].
//! 2. **Restored.** A query started from a checkpoint hands the source the
//!    [`SourcePosition`] that checkpoint recorded; a source that cannot be
//!    read again ([`NOT_REPLAYABLE`]) refuses one.
//! 3. **Read.** The source sends batches of its schema, counts rows and bad
//!    rows in its [`SourceStats`], and raises the largest event time it has
//!    seen (the watermark follows it); it keeps its position current in
//!    `SourceStats::position` for the next checkpoint.
//! 4. **Finished or stopped.** It ends at the end of its input, or when
//!    the runtime sets `SourceStats::stop` (a stop, a savepoint, a
//!    rescale); what it read is then what its position says.
//!
//! # Lifecycle of a sink
//!
//! 1. **Declared.** `CREATE SINK` resolves to a [`SinkConnector`], which
//!    returns a [`SinkConfig`]; a [`SinkOpen`] opens it for each query.
//! 2. **Restored.** A query restored from a checkpoint calls
//!    [`Sink::restore`] with the [`SinkCommit`] that checkpoint recorded,
//!    before any write.
//! 3. **Written.** [`Sink::write`] (and [`Sink::write_changes`], with a
//!    [`RowKind`]) take result batches; the watermark reaches the sink too.
//! 4. **Checkpointed, then committed.** At a barrier [`Sink::checkpoint`]
//!    makes what was written durable and returns its commit; once every
//!    operator's state is written, [`Sink::committed`] says the checkpoint
//!    is complete (a transactional sink commits then).
//! 5. **Finished or stopped.** [`Sink::finish`] at the end of input; a
//!    stopped query drops its sink after its last checkpoint.

pub mod catalogue;
mod config;
pub mod options;
mod sink;
mod spec;
mod stats;

pub use config::{
    DEFAULT_MAX_FUTURE_MS, DEFAULT_MAX_RECORD_SIZE, Decoding, Format, OutputFormat, Replay,
    SinkConfig, SinkTarget, SourceConfig, SourceLocation, default_decode_threads,
};
pub use sink::{RowKind, Sink};
pub use spec::{
    Columns, Connectors, NOT_REPLAYABLE, Opener, OptionSpec, OptionType, Reader, SinkConnector,
    SinkOpen, SourceConnector, SourceRead, StreamDecl,
};
pub use stats::{BAD_ROW_SAMPLES, BadRow, MaxEventTime, SourceStats};

pub use crate::state::position::{SinkCommit, SourcePosition};
