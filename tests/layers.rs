//! The layers of `src/`, checked: a module may name modules of its own
//! layer or below, never above (`docs/architecture.md`, "Layers"). Every
//! `crate::NAME` path and every `super::` chain that reaches the crate root
//! counts, in code, tests and comments alike, so a doc link up the layers
//! fails too. Within `connectors`, a connector names only the contract and
//! the kits, never another connector; only the registry lists them all.

use std::path::{Path, PathBuf};

/// The layers, lowest first; the modules of one layer may name each other.
const LAYERS: &[&[&str]] = &[
    &["error", "diag", "types", "timestamp", "crashpoint"],
    &["sql"],
    &["functions"],
    &["state"],
    &["connector"],
    &["text"],
    &["plan"],
    &["exec"],
    &["planner"],
    &["runtime"],
    &["connectors"],
    &["group"],
    &["analyze"],
    &["engine"],
    &["session"],
    &["service"],
    &["repl"],
    &["cli"],
    &["lib", "main"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// Every `.rs` file under `dir`, as paths relative to `src/`.
fn sources(dir: &Path, src: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, src, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path.strip_prefix(src).expect("under src/").to_path_buf());
        }
    }
}

/// The module path of a file: `engine/show.rs` is `[engine, show]`,
/// `exec/over/tests.rs` `[exec, over, tests]`, `connector/mod.rs`
/// `[connector]`, `lib.rs` `[lib]`.
fn module_path(file: &Path) -> Vec<String> {
    let mut parts: Vec<String> = file
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.len() > 1 && parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The top-level modules `text` names: after `crate::`, and after a chain
/// of `super::` long enough to reach the crate root from `depth`.
fn named_modules(text: &str, depth: usize) -> Vec<(usize, String)> {
    let ident = |rest: &str| -> String {
        rest.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut named = Vec::new();
    for (number, line) in text.lines().enumerate() {
        for (at, _) in line.match_indices("crate::") {
            let glued = line[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
            if !glued {
                named.push((number + 1, ident(&line[at + "crate::".len()..])));
            }
        }
        let mut rest = line;
        while let Some(at) = rest.find("super::") {
            let chain = &rest[at..];
            let supers = chain
                .split("::")
                .take_while(|part| *part == "super")
                .count();
            let after = chain.splitn(supers + 1, "::").last().unwrap_or("");
            if supers >= depth {
                named.push((number + 1, ident(after)));
            }
            rest = &rest[at + "super::".len() * supers..];
        }
    }
    named
}

#[test]
fn no_module_names_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &src, &mut files);
    files.sort();
    let mut upward = Vec::new();
    for file in &files {
        let path = module_path(file);
        let top = &path[0];
        let own = layer(top).unwrap_or_else(|| {
            panic!(
                "src/{}: {top} is in no layer: add it to LAYERS",
                file.display()
            )
        });
        let text = std::fs::read_to_string(src.join(file)).expect("read a source file");
        for (line, named) in named_modules(&text, path.len()) {
            let Some(theirs) = layer(&named) else {
                continue; // an item of the crate root, or a local module
            };
            if theirs <= own {
                continue;
            }
            let shown = file.to_string_lossy();
            upward.push(format!(
                "src/{shown}:{line}: {top} names {named}, a layer above it"
            ));
        }
    }
    assert!(
        upward.is_empty(),
        "imports up the layers:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_checker_sees_crate_paths_and_super_chains() {
    let text = "use crate::engine::Engine;\n// see crate::plan\nuse super::super::runtime::Live;\nuse super::x;\nlet a = mycrate::exec;";
    let named: Vec<String> = named_modules(text, 2).into_iter().map(|(_, m)| m).collect();
    assert_eq!(named, ["engine", "plan", "runtime"]);
    assert_eq!(module_path(Path::new("connector/mod.rs")), ["connector"]);
    assert_eq!(
        module_path(Path::new("exec/over/tests.rs")),
        ["exec", "over", "tests"]
    );
    assert!(layer("engine") > layer("runtime") && layer("connector") < layer("plan"));
}

/// The connectors (`src/connectors/NAME`), each a leaf.
const CONNECTORS: &[&str] = &[
    "alertmanager",
    "demo",
    "file",
    "host",
    "influx",
    "kafka",
    "otlp",
    "prometheus",
    "remote_write",
    "webhook",
];

/// What may name every connector: the registry and its tests.
const LISTS: &[&str] = &["registry", "config_tests", "catalogue_tests"];

/// The connectors `text` names: after `crate::connectors::`, and after a
/// chain of `super::` that reaches `connectors` from `depth`.
fn named_connectors(text: &str, depth: usize) -> Vec<(usize, String)> {
    let mut named = Vec::new();
    for (line, module) in named_modules(text, depth - 1) {
        named.push((line, module));
    }
    for (number, line) in text.lines().enumerate() {
        for (at, _) in line.match_indices("crate::connectors::") {
            let rest = &line[at + "crate::connectors::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            named.push((number + 1, name));
        }
    }
    named
        .into_iter()
        .filter(|(_, m)| CONNECTORS.contains(&m.as_str()))
        .collect()
}

#[test]
fn no_connector_names_another() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let dir = root.join("connectors");
    let mut files = Vec::new();
    sources(&dir, &root, &mut files);
    files.sort();
    let mut crossing = Vec::new();
    for file in &files {
        let path = module_path(file);
        let Some(own) = path.get(1) else {
            continue; // connectors/mod.rs
        };
        if LISTS.contains(&own.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(root.join(file)).expect("read a source file");
        for (line, named) in named_connectors(&text, path.len()) {
            if named != *own {
                crossing.push(format!(
                    "src/{}:{line}: {own} names connector {named}",
                    file.display()
                ));
            }
        }
    }
    assert!(
        crossing.is_empty(),
        "connectors naming each other (share through a kit instead):\n{}",
        crossing.join("\n")
    );
}
