//! Text form of an operator graph, for `EXPLAIN`.

use std::fmt::Write;

use super::QueryGraph;
use crate::connectors::SourceLocation;

/// Describes the graph one task per line, in data-flow order.
pub fn describe(graph: &QueryGraph) -> String {
    let mut text = String::new();
    let source = match &graph.stream.source.location {
        SourceLocation::File(path) => format!("file {}", path.display()),
        SourceLocation::Stdin => "stdin".to_string(),
    };
    let _ = writeln!(text, "operator graph ({}):", graph.mode);
    let _ = writeln!(
        text,
        "  source {} ({source}, {:?})",
        graph.stream.name, graph.stream.source.format
    );
    for (i, stage) in graph.stages.iter().enumerate() {
        let ops: Vec<String> = stage.iter().map(|op| op.describe()).collect();
        let _ = writeln!(text, "  -> task {}: {}", i + 1, ops.join(" | "));
    }
    let _ = write!(text, "  -> sink");
    text
}
