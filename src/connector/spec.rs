//! The kinds of connector and what they declare: a [`SourceConnector`] or
//! [`SinkConnector`] per `connector = 'NAME'`, with its options
//! ([`OptionSpec`]) and columns ([`Columns`]); once configured, a source
//! that reads by itself ([`SourceRead`], held in a [`Reader`]) or a sink
//! that opens its own destination ([`SinkOpen`], held in an [`Opener`]).

use std::any::Any;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

use super::catalogue::CatalogueColumn;
use super::options::Options;
use super::{Sink, SinkConfig, SourceConfig, SourceStats};
use crate::error::Result;
use crate::state::position::SourcePosition;

/// The type of an option's value, checked by [`Options`] before a
/// connector sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionType {
    /// Any text.
    Text,
    /// A file path, resolved against the script's directory; not empty.
    Path,
    /// `true` or `false`, any case.
    Flag,
    /// A positive whole number.
    Count,
    /// A positive finite number.
    Number,
    /// A duration such as `'15 seconds'`, `'500 ms'`, `'1 hour'`.
    Duration,
    /// A size in bytes such as `'64 MiB'`.
    Size,
    /// An `http://` or `https://` URL with a host.
    Url,
    /// One of these words, any case.
    Choice(&'static [&'static str]),
    /// Any key that starts with the spec's name (`header_`, `properties.`)
    /// takes text.
    Prefix,
}

/// One `WITH` option of a connector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionSpec {
    /// The key, lower case (for [`OptionType::Prefix`], the prefix).
    pub name: &'static str,
    /// The type of its value.
    pub ty: OptionType,
    /// Its default as the user would write it; `None` when it has none
    /// (required, or absent means off).
    pub default: Option<&'static str>,
    /// What is accepted, for the error a bad value gets: `a duration of at
    /// least 100 milliseconds, e.g. '1 second'`.
    pub accepted: &'static str,
    /// One line for the reference.
    pub doc: &'static str,
}

/// Where a source's columns come from.
#[derive(Debug, Clone, Copy)]
pub enum Columns {
    /// The stream declares any columns; they are decoded by name.
    Declared,
    /// The stream declares a subset of these, by name and with these types.
    Catalogue(&'static [CatalogueColumn]),
}

/// What `CREATE STREAM` declared, as a connector configures it.
#[derive(Debug, Clone)]
pub struct StreamDecl<'a> {
    /// The stream's name, for messages.
    pub stream: &'a str,
    /// The declared columns.
    pub schema: SchemaRef,
    /// Index of the event-time column in `schema`.
    pub event_time: Option<usize>,
    /// The directory relative paths are resolved against.
    pub base_dir: &'a Path,
}

/// A kind of source: `connector = 'NAME'` in `CREATE STREAM ... WITH`.
pub trait SourceConnector: Sync {
    /// The `connector` value that selects it.
    fn name(&self) -> &'static str;
    /// One line for the reference: what it reads.
    fn summary(&self) -> &'static str;
    /// Every option it takes, `connector` aside.
    fn options(&self) -> &'static [OptionSpec];
    /// Where its columns come from.
    fn columns(&self) -> Columns {
        Columns::Declared
    }
    /// The source configuration of a stream declared with this connector;
    /// `opts` holds only keys of [`Self::options`], each of its type.
    fn configure(&self, decl: &StreamDecl<'_>, opts: &Options<'_>) -> Result<SourceConfig>;
}

/// A kind of sink: `connector = 'NAME'` in `CREATE SINK ... WITH`.
pub trait SinkConnector: Sync {
    /// The `connector` value that selects it.
    fn name(&self) -> &'static str;
    /// One line for the reference: where it writes.
    fn summary(&self) -> &'static str;
    /// Every option it takes, `connector` aside.
    fn options(&self) -> &'static [OptionSpec];
    /// The configuration of a sink declared with this connector.
    fn configure(&self, name: &str, opts: &Options<'_>, base_dir: &Path) -> Result<SinkConfig>;
}

/// A source that reads by itself, configured.
pub trait SourceRead: Any + fmt::Debug + Send + Sync {
    /// Where it reads, for `EXPLAIN` and `SHOW STREAMS`: `this machine,
    /// every 1s`.
    fn describe(&self) -> String;

    /// Where it reads, for `EXPLAIN`, which also says when a restore
    /// cannot read it again (see [`NOT_REPLAYABLE`]): `host, every 1000
    /// ms, not replayable: ...`.
    fn explain(&self) -> String;

    /// Why its stream is live (it cannot be read to an end as a batch),
    /// for the batch planner's message: `connector 'host' samples this
    /// machine live`.
    fn live_because(&self) -> &'static str;

    /// Reads like the file source (`connectors::read_source_from`): batches
    /// of `config.schema` to `emit` (an empty one at least every 100 ms
    /// while waiting), stopping when `emit` returns `false` or
    /// `stats.stop` is set. A source that cannot be read again fails when
    /// `start` is given.
    fn read(
        &self,
        config: &SourceConfig,
        stats: &SourceStats,
        start: Option<&SourcePosition>,
        emit: &mut dyn FnMut(RecordBatch) -> bool,
    ) -> Result<()>;
}

/// What `EXPLAIN` says of a source a restore cannot rewind: its operators'
/// state is checkpointed, but rows read after the checkpoint are not read
/// again.
pub const NOT_REPLAYABLE: &str = "not replayable: a restore does not read it again";

/// A configured [`SourceRead`], as a [`SourceLocation`] holds it. Two are
/// equal when they describe themselves alike (same connector, same
/// settings).
#[derive(Clone)]
pub struct Reader(pub Arc<dyn SourceRead>);

impl fmt::Debug for Reader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for Reader {
    fn eq(&self, other: &Self) -> bool {
        format!("{:?}", self.0) == format!("{:?}", other.0)
    }
}

/// A sink that opens its own destination, configured. (`Any` lets a
/// connector's own code and tests get its settings back.)
pub trait SinkOpen: Any + fmt::Debug + Send + Sync {
    /// Where it writes, for `SHOW SINKS`: `webhook 127.0.0.1:9093`.
    fn describe(&self) -> String;

    /// Opens it for sink `name` and a query whose rows have `schema`.
    fn open(&self, name: &str, schema: &SchemaRef) -> Result<Box<dyn Sink>>;
}

/// A configured [`SinkOpen`], as a [`SinkTarget`] holds it; equal like
/// [`Reader`].
#[derive(Clone)]
pub struct Opener(pub Arc<dyn SinkOpen>);

impl fmt::Debug for Opener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for Opener {
    fn eq(&self, other: &Self) -> bool {
        format!("{:?}", self.0) == format!("{:?}", other.0)
    }
}

/// How `connector = '...'` is resolved: the one list of connectors, as the
/// catalog sees it. The engine hands the catalog the registry
/// (`connectors::registry::Registry`) through this, so that the planner
/// never names a connector.
pub trait Connectors: Sync {
    /// The configuration of stream `decl.stream` from its connector
    /// options (`connector` among them; `file` when it is missing).
    fn source(&self, decl: &StreamDecl<'_>, options: &[(String, String)]) -> Result<SourceConfig>;

    /// The configuration of sink `name` from its `WITH` options.
    fn sink(&self, name: &str, options: &[(String, String)], base_dir: &Path)
    -> Result<SinkConfig>;

    /// The fixed columns of source connector `connector`, if it has them.
    fn catalogue(&self, connector: &str) -> Option<&'static [CatalogueColumn]>;
}
