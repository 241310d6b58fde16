//! What a query writes its results to: the [`Sink`] trait, and what a
//! batch of result rows is ([`RowKind`]).

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;

use crate::error::Result;
use crate::state::position::SinkCommit;

/// What a batch of result rows is, under an emit policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    /// A new result: the first value of a key, or a window's final row.
    Insert,
    /// A new value for a result emitted before.
    Update,
    /// An early, partial result of a window that has not closed.
    Early,
}

/// A destination for query results.
pub trait Sink: Send {
    /// Writes one batch of results and flushes it to the destination.
    /// Empty batches write nothing.
    fn write(&mut self, batch: &RecordBatch) -> Result<()>;

    /// Writes result rows that say what they are (updates, early results,
    /// see [`RowKind`](RowKind)). Sinks that write every row
    /// alike, the default, write them as [`Sink::write`] does.
    fn write_changes(&mut self, batch: &RecordBatch, _kind: RowKind) -> Result<()> {
        self.write(batch)
    }

    /// At a checkpoint barrier, before [`Sink::checkpoint`]: where the
    /// query's sources stood when they sent it (everything they had read
    /// by then has reached the sink). The default ignores it.
    fn sources_at_barrier(
        &mut self,
        _positions: &[crate::state::position::SourcePosition],
    ) -> Result<()> {
        Ok(())
    }

    /// The query's watermark reached `ms` (never the end of input, which
    /// [`Sink::finish`] says): a sink that hands results to another stage
    /// of the query (an exchange between processes) passes it on. The
    /// default does nothing.
    fn watermark(&mut self, _ms: i64) -> Result<()> {
        Ok(())
    }

    /// Flushes everything; call once when the query has ended. Calling it
    /// again is harmless.
    fn finish(&mut self) -> Result<()>;

    /// At a checkpoint barrier: makes everything written so far durable and
    /// returns what the checkpoint must record so that a restore comes back
    /// to exactly this point (see [`Sink::restore`]). `None`, the default,
    /// for a sink that cannot go back (stdout): it is at-least-once, and
    /// rows written after the checkpoint may be written again after a
    /// restore. A webhook cannot go back either, but commits the number
    /// of batches it sent, so that those it sends again carry the same
    /// idempotency keys (see the `webhook` connector).
    fn checkpoint(&mut self) -> Result<Option<SinkCommit>> {
        Ok(None)
    }

    /// Goes back to `commit`, what [`Sink::checkpoint`] returned for the
    /// checkpoint being restored: a file sink drops what it wrote after it.
    /// Called, if at all, before anything is written. The default does
    /// nothing.
    fn restore(&mut self, _commit: &SinkCommit) -> Result<()> {
        Ok(())
    }

    /// The checkpoint that the last [`Sink::checkpoint`] call was for has
    /// been written: a sink that holds results back until a checkpoint
    /// covers them (Kafka transactions) publishes them now. The default
    /// does nothing.
    fn committed(&mut self) -> Result<()> {
        Ok(())
    }

    /// The query was stopped before the end of its input (a signal, a
    /// stop, a partition moving to another process): called instead of
    /// [`Sink::finish`]. A sink that holds results back until a checkpoint
    /// covers them drops them, since whoever restores the checkpoint makes
    /// them again. The default finishes.
    fn stopped(&mut self) -> Result<()> {
        self.finish()
    }

    /// Why this sink cannot work without checkpoints, if it cannot: a
    /// query writing to it without them fails at its start with this
    /// text. `None`, the default, for every sink that can.
    fn needs_checkpoints(&self) -> Option<String> {
        None
    }

    /// The count of the errors its client met and retried (a Kafka sink:
    /// failed deliveries and transactions, unreachable brokers), live, for
    /// `GET /metrics`. `None`, the default, for a sink that counts none.
    fn client_errors(&self) -> Option<Arc<std::sync::atomic::AtomicU64>> {
        None
    }
}
