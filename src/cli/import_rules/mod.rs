//! `vigil import-rules rules.yml`: a Prometheus rule file as vigil SQL.
//!
//! The translation is in [`translate`] (rule file to statements),
//! [`promql`] (expressions to relations) and [`sql`] (statements and
//! templates); this module reads the file, writes the SQL to stdout or one
//! file per group, and reports every rule that did not translate on stderr.

pub mod promql;
pub mod rules;
pub mod sql;
pub mod translate;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use translate::{Options, Translation, group_sql, translate_file};

/// Arguments of `vigil import-rules`.
#[derive(Debug, clap::Args)]
pub struct ImportRulesArgs {
    /// The Prometheus rule file (YAML: groups of alerting and recording
    /// rules).
    file: PathBuf,
    /// Write one FILE.sql per group into DIR (each with the stream
    /// declaration) instead of printing the SQL.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Read the samples from this stream, declared elsewhere, instead of
    /// declaring one.
    #[arg(long, value_name = "NAME", conflicts_with = "connector")]
    stream: Option<String>,
    /// The connector of the declared samples stream.
    #[arg(long, value_name = "NAME", default_value = "remote_write")]
    connector: String,
    /// Evaluation interval of groups that set none (Prometheus'
    /// global evaluation_interval), e.g. 1m, 30s.
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = parse_interval)]
    interval: std::time::Duration,
}

fn parse_interval(text: &str) -> Result<std::time::Duration, String> {
    match rules::duration(text)? {
        d if d.is_zero() => Err("the interval must be longer than zero".into()),
        d => Ok(d),
    }
}

/// Runs `vigil import-rules`: exit status 0 when every rule translated, 1
/// when some did not (each reported) or the file could not be read.
pub fn run(args: ImportRulesArgs) -> ExitCode {
    let text = match std::fs::read_to_string(&args.file) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", args.file.display());
            return ExitCode::FAILURE;
        }
    };
    let options = Options {
        stream: args.stream.clone().unwrap_or_else(|| "prom_samples".into()),
        connector: args.stream.is_none().then(|| args.connector.clone()),
        default_interval: args.interval,
    };
    let translation = match translate_file(&text, &options) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {}: {e}", args.file.display());
            return ExitCode::FAILURE;
        }
    };
    let written = match &args.out {
        Some(dir) => write_groups(&translation, dir),
        None => {
            print!("{}", translation.script());
            Ok(())
        }
    };
    if let Err(e) = written {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    report(&args.file, &translation);
    match translation.complete() {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    }
}

/// One `GROUP.sql` per group with at least one translated rule.
fn write_groups(translation: &Translation, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for group in translation.groups.iter().filter(|g| !g.rules.is_empty()) {
        let path = dir.join(format!("{}.sql", sql::object_name(&group.name)));
        let text = format!("{}{}", translation.header, group_sql(group));
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Per rule not translated, `FILE:LINE: group G, rule R: not translated:
/// reason`; then approximations; then a count.
fn report(file: &Path, translation: &Translation) {
    let place = |line: usize| match line {
        0 => file.display().to_string(),
        n => format!("{}:{n}", file.display()),
    };
    for p in &translation.problems {
        eprintln!(
            "{}: group {}, rule {}: not translated: {}",
            place(p.line),
            p.group,
            p.rule,
            p.reason
        );
    }
    for n in &translation.notes {
        eprintln!(
            "{}: group {}, rule {}: note: {}",
            place(n.line),
            n.group,
            n.rule,
            n.reason
        );
    }
    let translated: usize = translation.groups.iter().map(|g| g.rules.len()).sum();
    eprintln!(
        "vigil import-rules: {translated} of {} rules translated",
        translated + translation.problems.len()
    );
}
