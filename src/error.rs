//! One error type for the whole engine, so front ends can print any failure
//! as a single clear line.

use datafusion::error::DataFusionError;

/// Everything that can go wrong between reading SQL and writing results.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The SQL text could not be parsed; the message already carries the
    /// position and a caret under the offending text.
    #[error("{0}")]
    Parse(String),
    /// The statement parsed but cannot be planned (unknown stream or column,
    /// type error, bad option).
    #[error("{0}")]
    Plan(String),
    /// The statement parsed but cannot be planned, for a reason at a known
    /// place in its SQL text (an unknown column's name): front ends put
    /// the caret there.
    #[error("{message}")]
    PlanAt {
        /// What is wrong.
        message: String,
        /// Where, 1-based, in the text the statement was parsed from.
        line: u64,
        /// The column, 1-based.
        column: u64,
    },
    /// The query is valid SQL but cannot run on an unbounded stream.
    #[error("cannot run on a stream ({rule}): {message}")]
    Unbounded {
        /// Short name of the rule that rejected the query.
        rule: &'static str,
        /// What the user can do instead.
        message: String,
    },
    /// A source or sink failed (missing file, unreadable header, write error).
    #[error("{0}")]
    Connector(String),
    /// An error from DataFusion while planning or evaluating.
    #[error("{0}")]
    DataFusion(#[from] DataFusionError),
    /// An error from Arrow while building or writing batches.
    #[error("{0}")]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    /// The engine cannot take more now (a full write-ahead log, a queue
    /// at its bound); the caller should try again after `retry_after`.
    #[error("{message}")]
    Overloaded {
        /// What is full.
        message: String,
        /// When trying again makes sense.
        retry_after: std::time::Duration,
    },
    /// The queries reading a stream are behind: a push waited as long as
    /// it was allowed for room and handed out nothing; the caller should
    /// try again after `retry_after` (HTTP 429).
    #[error("{message}")]
    Busy {
        /// Which stream is behind.
        message: String,
        /// When trying again makes sense.
        retry_after: std::time::Duration,
    },
    /// An I/O error with the path or context it concerns.
    #[error("{context}: {source}")]
    Io {
        /// What was being read or written.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Where in its SQL text a planning error points, as (line, column),
    /// when it knows.
    pub fn location(&self) -> Option<(u64, u64)> {
        match self {
            Error::PlanAt { line, column, .. } => Some((*line, *column)),
            _ => None,
        }
    }

    /// An I/O error with a description of what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}
