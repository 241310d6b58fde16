//! The examples of `grammar/README.md`: every ```` ```sql ```` block parses with
//! `vigil::sql::parse_script`, and every statement of every block plans with
//! `vigil::engine::Engine::execute` against the streams and sinks its block declares (each
//! block is a self-contained example; the built-in streams `host_metrics` and `demo` need
//! no declaration). Nothing runs: planning opens no file and creates no sink file.
//!
//! The ```` ```sql ```` blocks of the top-level `README.md` and of each page of `docs/`
//! build on each other (one `CREATE STREAM metrics`, then queries over it), so each page's
//! are planned in document order with one engine, after those of the pages it builds on
//! ([`BUILDS_ON`]); a page whose blocks are each a script of their own ([`ONE_BY_ONE`]) has
//! each planned alone.

use std::path::{Path, PathBuf};

use vigil::engine::{Engine, Outcome};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Blocks deliberately not planned, by a text their SQL contains, with the reason. Every
/// entry must match a block (a stale entry fails the test), so none is skipped silently.
const NOT_PLANNED: &[(&str, &str)] = &[];

/// Counts the statements of a script: `;` outside strings, quoted identifiers and comments.
fn count_statements(sql: &str) -> usize {
    let mut count = 0;
    let mut chars = sql.chars().peekable();
    let mut pending = false; // some text since the last `;`
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                pending = true;
                // A doubled quote inside re-enters the loop as a new quoted run: fine for
                // counting purposes.
                for d in chars.by_ref() {
                    if d == c {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
            }
            ';' => {
                count += 1;
                pending = false;
            }
            c if c.is_whitespace() => {}
            _ => pending = true,
        }
    }
    assert!(!pending, "script has text after its last `;`:\n{sql}");
    count
}

// ---------------------------------------------------------------------------------------
// parsing
// ---------------------------------------------------------------------------------------

/// Every ```` ```sql ```` block of the file, with the 1-based line of its first SQL line.
fn sql_blocks(markdown: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim();
        match current.as_mut() {
            None if trimmed == "```sql" => current = Some((i + 2, String::new())),
            None => {}
            Some(_) if trimmed == "```" => blocks.push(current.take().expect("open block")),
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    assert!(current.is_none(), "unterminated ```sql block");
    blocks
}

#[test]
fn grammar_readme_sql_blocks_parse() {
    let path = repo().join("grammar/README.md");
    let markdown = std::fs::read_to_string(&path).expect("read grammar/README.md");
    let blocks = sql_blocks(&markdown);
    assert!(
        blocks.len() >= 8,
        "expected many ```sql examples, found {}",
        blocks.len()
    );

    // Every construct vigil adds has at least one example.
    for construct in [
        "CREATE STREAM",
        "WATERMARK FOR",
        "WITH (",
        "CREATE SINK",
        "INSERT INTO",
        "TUMBLE(",
        "window_start",
        "EXPLAIN",
        "connector = 'stdin'",
        "connector = 'stdout'",
    ] {
        assert!(
            blocks.iter().any(|(_, sql)| sql.contains(construct)),
            "grammar/README.md has no ```sql example containing {construct:?}"
        );
    }

    let mut failures = Vec::new();
    for (line, sql) in &blocks {
        let expected = count_statements(sql);
        match vigil::sql::parse_script(sql) {
            Ok(statements) if statements.len() == expected => {}
            Ok(statements) => failures.push(format!(
                "grammar/README.md line {line}: parsed {} statements, expected {expected}",
                statements.len()
            )),
            Err(e) => failures.push(format!("grammar/README.md line {line}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} ```sql blocks failed:\n{}",
        failures.len(),
        blocks.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// planning
// ---------------------------------------------------------------------------------------

/// Plans every statement of one block in a fresh engine; relative paths resolve against a
/// scratch directory. Returns one line per failure, and the number of statements planned.
fn plan_block(line: usize, sql: &str) -> (Vec<String>, usize) {
    let statements = match vigil::sql::parse_script(sql) {
        Ok(statements) => statements,
        Err(e) => return (vec![format!("grammar/README.md line {line}: {e}")], 0),
    };
    let scratch = tempfile::tempdir().expect("temp dir");
    let mut engine = Engine::new();
    let mut failures = Vec::new();
    let mut planned = 0;
    for statement in &statements {
        // The statement's line within the markdown file.
        let at = line + statement.line as usize - 1;
        match engine.execute(statement, scratch.path()) {
            Ok(Outcome::Explain(text)) if text.trim().is_empty() => failures.push(format!(
                "grammar/README.md line {at}: EXPLAIN printed nothing"
            )),
            Ok(_) => planned += 1,
            Err(e) => failures.push(format!("grammar/README.md line {at}: {e}")),
        }
    }
    let leftovers: Vec<_> = std::fs::read_dir(scratch.path())
        .expect("read scratch dir")
        .map(|e| e.expect("dir entry").file_name())
        .collect();
    if !leftovers.is_empty() {
        failures.push(format!(
            "grammar/README.md line {line}: planning created files {leftovers:?}"
        ));
    }
    (failures, planned)
}

#[test]
fn grammar_readme_sql_blocks_plan() {
    let markdown =
        std::fs::read_to_string(repo().join("grammar/README.md")).expect("read grammar/README.md");
    let blocks = sql_blocks(&markdown);
    let mut failures = Vec::new();
    let mut planned = 0;
    let mut expected = 0;
    let mut used = vec![false; NOT_PLANNED.len()];
    for (line, sql) in &blocks {
        if let Some(i) = NOT_PLANNED.iter().position(|(text, _)| sql.contains(text)) {
            used[i] = true;
            continue;
        }
        expected += count_statements(sql);
        let (mut errors, n) = plan_block(*line, sql);
        failures.append(&mut errors);
        planned += n;
    }
    for ((text, why), used) in NOT_PLANNED.iter().zip(used) {
        assert!(used, "NOT_PLANNED entry {text:?} ({why}) matches no block");
    }
    assert!(
        failures.is_empty(),
        "{} grammar/README.md statements do not plan:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(
        planned, expected,
        "every statement of every block is planned"
    );
    assert!(planned >= 60, "only {planned} statements planned");
}

/// The planning test can fail: a block with an unknown stream or column is reported with
/// its line in the markdown file.
#[test]
fn grammar_block_planning_reports_errors() {
    let sql = "CREATE STREAM m (ts TIMESTAMP, cpu DOUBLE, WATERMARK FOR ts AS ts)\n  WITH (path = 'm.csv');\n\nSELECT mem FROM m;\nSELECT cpu FROM nowhere;\n";
    let (failures, planned) = plan_block(100, sql);
    assert_eq!(planned, 1, "{failures:?}");
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert!(
        failures[0].starts_with("grammar/README.md line 103: "),
        "{failures:?}"
    );
    assert!(
        failures[1].starts_with("grammar/README.md line 104: "),
        "{failures:?}"
    );
}

/// Pages of `docs/` whose blocks read what other pages declare, planned after the blocks of
/// those pages (in the order given, in the same engine; their failures are reported under
/// their own page). Every page named must exist, so none is skipped silently.
const BUILDS_ON: &[(&str, &[&str])] = &[
    ("docs/detection.md", &["docs/sql.md"]),
    ("docs/operations.md", &["docs/sql.md", "docs/detection.md"]),
];

/// Pages whose blocks are each a script of their own (two of them may declare the same
/// stream), each planned in a fresh engine.
const ONE_BY_ONE: &[&str] = &["docs/prometheus.md"];

/// `README.md`, then every page of `docs/` in name order, as paths from the repository.
fn pages() -> Vec<String> {
    let mut docs: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .expect("read docs/")
        .map(|entry| {
            entry
                .expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    let mut pages = vec!["README.md".to_string()];
    pages.extend(docs);
    pages
}

fn read_page(page: &str) -> String {
    std::fs::read_to_string(repo().join(page)).unwrap_or_else(|e| panic!("read {page}: {e}"))
}

/// Plans `blocks` of `page` in document order with `engine`; a failure is one line naming
/// the page and the line. Returns the number of statements planned.
fn plan_in_order(
    engine: &mut Engine,
    scratch: &Path,
    page: &str,
    blocks: &[(usize, String)],
    failures: &mut Vec<String>,
) -> usize {
    let mut planned = 0;
    for (line, sql) in blocks {
        let statements = match vigil::sql::parse_script(sql) {
            Ok(statements) => statements,
            Err(e) => {
                failures.push(format!("{page} line {line}: {e}"));
                continue;
            }
        };
        for statement in &statements {
            match engine.execute(statement, scratch) {
                Ok(_) => planned += 1,
                Err(e) => failures.push(format!(
                    "{page} line {}: {e}",
                    line + statement.line as usize - 1
                )),
            }
        }
    }
    planned
}

#[test]
fn readme_sql_blocks_plan_in_document_order() {
    let pages = pages();
    let known = |page: &str| pages.iter().any(|p| p == page);
    for (page, before) in BUILDS_ON {
        for named in std::iter::once(page).chain(before.iter()) {
            assert!(known(named), "BUILDS_ON names {named}, which is not a page");
        }
    }
    for page in ONE_BY_ONE {
        assert!(known(page), "ONE_BY_ONE names {page}, which is not a page");
    }
    let readme = sql_blocks(&read_page("README.md"));
    assert!(readme.len() >= 5, "only {} ```sql blocks", readme.len());
    let scratch = tempfile::tempdir().expect("temp dir");
    let mut failures = Vec::new();
    let mut planned = 0;
    let mut expected = 0;
    for page in &pages {
        let blocks = sql_blocks(&read_page(page));
        expected += blocks
            .iter()
            .map(|(_, sql)| count_statements(sql))
            .sum::<usize>();
        if ONE_BY_ONE.contains(&page.as_str()) {
            for block in &blocks {
                let mut engine = Engine::new();
                let one = std::slice::from_ref(block);
                planned += plan_in_order(&mut engine, scratch.path(), page, one, &mut failures);
            }
            continue;
        }
        let mut engine = Engine::new();
        let before: &[&str] = BUILDS_ON
            .iter()
            .find(|(p, _)| *p == page.as_str())
            .map(|(_, before)| *before)
            .unwrap_or_default();
        for earlier in before {
            let blocks = sql_blocks(&read_page(earlier));
            plan_in_order(
                &mut engine,
                scratch.path(),
                earlier,
                &blocks,
                &mut Vec::new(),
            );
        }
        planned += plan_in_order(&mut engine, scratch.path(), page, &blocks, &mut failures);
    }
    assert!(
        failures.is_empty(),
        "README.md and docs/*.md statements that do not plan:\n{}",
        failures.join("\n")
    );
    assert_eq!(
        planned, expected,
        "every statement of every block is planned"
    );
}
