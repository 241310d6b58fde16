//! Where a checkpoint stands in a query's inputs and outputs: a source's
//! position and a sink's commit. They are part of the checkpointed state
//! (the store writes them into each manifest), so they live with it; the
//! connectors fill them in and read them back.

/// Where a source stands, as a checkpoint records it: reading again from
/// here (see `text::read_source_from`) gives exactly the rows after
/// those already emitted. What the fields mean depends on the source; a
/// source that cannot be read again (stdin, a pipe, `host`, pushed rows)
/// has no position.
///
/// - A file (CSV or JSON lines): `offset` and `line` are the byte offset
///   just past the last line consumed and that line's number (lines of a
///   CSV record still open are not consumed yet; bad lines are); `rows` and
///   `bad_rows` the counters; `extra` the decoder state the next rows
///   depend on: the `max_future` guard's reference (`guard`), the
///   `ts_unit` check's samples (`unit_check`), the rows consumed but not
///   yet emitted (`held` by the guard, or `accepted` and still to be
///   batched), the largest event time emitted (`max_event_time`) and, when
///   following, the file's identity (`file`: device and inode).
/// - `demo`: `rows` is the number of rows of the series emitted; the other
///   fields are zero and `extra` null.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SourcePosition {
    /// File sources: the byte offset just past the last line consumed.
    #[serde(default)]
    pub offset: u64,
    /// File sources: the number of the last line consumed, so that bad-row
    /// line numbers go on from it.
    #[serde(default)]
    pub line: u64,
    /// Rows emitted so far (the `demo` source resumes from this).
    #[serde(default)]
    pub rows: u64,
    /// Bad rows met so far.
    #[serde(default)]
    pub bad_rows: u64,
    /// Decoder state that later rows depend on (the `max_future` guard's
    /// reference time, rows held back, a followed file's identity);
    /// source-specific, null when there is none.
    #[serde(default)]
    pub extra: serde_json::Value,
}

/// What a checkpoint records of a sink: opaque to everyone but the sink.
pub type SinkCommit = serde_json::Value;
