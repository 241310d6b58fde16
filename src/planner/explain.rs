//! Text form of an operator graph, for `EXPLAIN`.

use std::fmt::Write;

use super::{QueryGraph, Stages};
use crate::connector::NOT_REPLAYABLE;
use crate::connector::SourceLocation;
use crate::plan::StreamDef;

/// Describes the graph one task per line, in data-flow order.
pub fn describe(graph: &QueryGraph) -> String {
    let mut text = String::new();
    let _ = writeln!(text, "operator graph ({}):", graph.mode);
    let several = graph.inputs.len() > 1;
    let mut task = 0;
    for input in &graph.inputs {
        let indent = if several { "    " } else { "  " };
        let _ = writeln!(text, "{indent}source {}", source(&input.stream));
        stages(&mut text, &input.stages, indent, &mut task);
    }
    if several {
        let _ = write!(
            text,
            "  -> merge {} inputs (watermark: the minimum of theirs)",
            graph.inputs.len()
        );
        match &graph.join {
            Some(join) => {
                let _ = write!(text, ": {}", join.describe());
                if let Some(keys) = join.keys().filter(|_| join.instances.len() > 1) {
                    let per_input: Vec<String> = keys
                        .iter()
                        .enumerate()
                        .map(|(i, k)| {
                            let k: Vec<String> = k.iter().map(|e| e.to_string()).collect();
                            format!("input {}'s by hash({})", i + 1, k.join(", "))
                        })
                        .collect();
                    let _ = write!(
                        text,
                        " [{} instances; exchange: rows, {}, into {} key groups]",
                        join.instances.len(),
                        per_input.join(", "),
                        crate::state::KEY_GROUPS
                    );
                }
                text.push('\n');
            }
            None => text.push('\n'),
        }
    }
    stages(&mut text, &graph.stages, "  ", &mut task);
    let _ = write!(text, "  -> sink");
    text
}

fn source(stream: &StreamDef) -> String {
    let format = stream.source.format;
    let location = match &stream.source.location {
        SourceLocation::File(path) => format!("file {}, {format:?}", path.display()),
        SourceLocation::Stdin => format!("stdin, {format:?}, {NOT_REPLAYABLE}"),
        SourceLocation::Connector(reader) => reader.0.explain(),
        SourceLocation::Push => format!("pushed rows, {format:?}"),
    };
    format!("{} ({location})", stream.name)
}

fn stages(text: &mut String, stages: &Stages, indent: &str, task: &mut usize) {
    for stage in stages {
        *task += 1;
        let ops: Vec<String> = stage.ops().iter().map(|op| op.describe()).collect();
        let _ = write!(text, "{indent}-> task {task}: {}", ops.join(" | "));
        if let Some(keys) = stage.keys.as_ref().filter(|_| stage.instances.len() > 1) {
            let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
            let _ = write!(
                text,
                " [{} instances; exchange: rows by hash({}) into {} key groups]",
                stage.instances.len(),
                keys.join(", "),
                crate::state::KEY_GROUPS
            );
        }
        text.push('\n');
    }
}
