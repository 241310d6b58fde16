//! `SHOW` and `DESCRIBE`: what the catalog holds, as listings.

use super::*;

impl Engine {
    /// What `SHOW` lists (`SHOW QUERIES` has no rows here: see
    /// [`Outcome::ShowQueries`]).
    pub fn show(&self, what: Show) -> Listing {
        let derived = |kinds: &[ObjectKind]| -> Vec<Vec<String>> {
            self.derived
                .iter()
                .filter(|d| kinds.contains(&d.kind))
                .filter_map(|d| {
                    let view = self.catalog.view(&d.name)?;
                    let schema = datafusion::logical_expr::TableSource::schema(view.as_ref());
                    Some(vec![
                        d.name.clone(),
                        d.kind.noun(),
                        listing::column_list(&schema),
                        format!("reads {}", d.reads.join(", ")),
                    ])
                })
                .collect()
        };
        const COLUMNS: [&str; 4] = ["name", "kind", "columns", "source"];
        match what {
            Show::Streams => {
                let mut rows: Vec<Vec<String>> = self
                    .catalog
                    .all_streams()
                    .map(|s| {
                        let mut source = listing::source_text(s);
                        if self.catalog.is_builtin(s) {
                            source.push_str(" (built in)");
                        }
                        vec![
                            s.name.clone(),
                            "stream".into(),
                            listing::column_list(&s.schema),
                            source,
                        ]
                    })
                    .collect();
                rows.extend(derived(&[
                    ObjectKind::View,
                    ObjectKind::Alert,
                    ObjectKind::Invariant,
                ]));
                rows.extend(self.catalog.sinks().map(|s| {
                    vec![
                        s.name.clone(),
                        "sink".into(),
                        String::new(),
                        listing::sink_text(s),
                    ]
                }));
                Listing::new(&COLUMNS, rows)
            }
            Show::Views => Listing::new(&COLUMNS, derived(&[ObjectKind::View])),
            Show::Alerts => Listing::new(&COLUMNS, derived(&[ObjectKind::Alert])),
            Show::Sinks => Listing::new(
                &["name", "target"],
                self.catalog
                    .sinks()
                    .map(|s| vec![s.name.clone(), listing::sink_text(s)])
                    .collect(),
            ),
            Show::Queries => Listing::new(&listing::QUERY_COLUMNS, Vec::new()),
        }
    }

    /// What `DESCRIBE name` shows: a stream's source and event time, or
    /// what a view, alert or invariant reads; then the columns.
    pub fn describe(&self, name: &str) -> Result<Listing> {
        if let Some(stream) = self.catalog.stream(name) {
            return Ok(listing::describe_stream(stream));
        }
        let Some(view) = self.catalog.view(name) else {
            if let Some(sink) = self.catalog.sink(name) {
                let row = vec![name.to_string(), listing::sink_text(sink)];
                return Ok(Listing::new(&["sink", "target"], vec![row]));
            }
            return Err(Error::Plan(format!(
                "no stream, view, alert, invariant or sink named '{name}' (SHOW STREAMS lists them)"
            )));
        };
        let schema = datafusion::logical_expr::TableSource::schema(view.as_ref());
        let mut described = listing::describe_columns(&schema, None);
        let note = match self.derived.iter().find(|d| d.name == name) {
            Some(d) => format!("{} {name}: reads {}", d.kind, d.reads.join(", ")),
            None => format!("view {name}"),
        };
        described.notes.push(note);
        Ok(described)
    }
}
