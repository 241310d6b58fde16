//! What `CREATE OR REPLACE`, `DROP` and `ALTER ALERT` do to the catalog:
//! the names taken, what reads what, and the catalog saved and put back
//! around a change that may fail.

use super::*;

impl Engine {
    /// Records a view, alert or invariant just added to the catalog.
    pub(super) fn remember(
        &mut self,
        kind: ObjectKind,
        name: &str,
        statement: &Statement,
        query: &Query,
    ) -> Result<()> {
        let raw = self.planner.plan_raw(&self.catalog, query)?;
        let reads = self.catalog.reads(&raw);
        self.derived.push(Derived {
            kind,
            name: name.to_string(),
            statement: statement.clone(),
            reads,
        });
        Ok(())
    }

    /// What kind of entry `name` is, if the script declared one (a
    /// built-in stream is none).
    pub(super) fn kind_of(&self, name: &str) -> Option<ObjectKind> {
        if let Some(derived) = self.derived.iter().find(|d| d.name == name) {
            return Some(derived.kind);
        }
        if self.catalog.has_stream(name) {
            return Some(ObjectKind::Stream);
        }
        self.catalog.view(name).map(|_| ObjectKind::View)
    }

    /// Fails if `name` is taken, saying how to replace or remove what has
    /// it. Sinks have names of their own, checked by the catalog.
    pub(super) fn check_new(&self, kind: ObjectKind, name: &str) -> Result<()> {
        if kind == ObjectKind::Sink {
            return Ok(());
        }
        match self.kind_of(name) {
            None => Ok(()),
            Some(existing) if existing == kind => Err(Error::Plan(format!(
                "{kind} '{name}' already exists (CREATE OR REPLACE {word} {name} replaces it, DROP {word} {name} removes it)",
                word = kind.keyword()
            ))),
            Some(existing) => Err(Error::Plan(format!(
                "{} named '{name}' already exists (DROP {} {name} removes it)",
                existing.a(),
                existing.keyword()
            ))),
        }
    }

    /// The views, alerts and invariants that read `name`, directly or
    /// through others, in declaration order.
    pub(super) fn readers_of(&self, name: &str) -> Vec<Derived> {
        self.derived
            .iter()
            .filter(|d| d.reads.iter().any(|r| r == name))
            .cloned()
            .collect()
    }

    /// Removes an entry from the catalog and the record of views.
    pub(super) fn forget(&mut self, kind: ObjectKind, name: &str) {
        match kind {
            ObjectKind::Sink => {
                self.catalog.remove_sink(name);
            }
            ObjectKind::Stream => {
                self.catalog.remove_stream(name);
            }
            ObjectKind::View | ObjectKind::Alert | ObjectKind::Invariant => {
                self.catalog.remove_view(name);
                self.derived.retain(|d| d.name != name);
            }
        }
    }

    /// `DROP kind name`: refused while views, alerts or invariants read
    /// the entry, unless `cascade` drops them too.
    pub(super) fn drop_entry(
        &mut self,
        kind: ObjectKind,
        name: &str,
        if_exists: bool,
        cascade: bool,
    ) -> Result<Vec<Dropped>> {
        let exists = match kind {
            ObjectKind::Sink => self.catalog.sink(name).is_some(),
            _ => match self.kind_of(name) {
                Some(existing) if existing != kind => {
                    return Err(Error::Plan(format!(
                        "'{name}' is {}, not {} (DROP {} {name} drops it)",
                        existing.a(),
                        kind.a(),
                        existing.keyword()
                    )));
                }
                found => found.is_some(),
            },
        };
        if !exists {
            if kind == ObjectKind::Stream && self.catalog.stream(name).is_some() {
                return Err(Error::Plan(format!(
                    "stream '{name}' is built in and cannot be dropped"
                )));
            }
            if if_exists {
                return Ok(Vec::new());
            }
            return Err(Error::Plan(format!(
                "no {kind} named '{name}' (SHOW {}S lists them)",
                if kind == ObjectKind::Sink {
                    "SINK"
                } else {
                    "STREAM"
                }
            )));
        }
        let readers = self.readers_of(name);
        if !readers.is_empty() && !cascade {
            return Err(Error::Plan(format!(
                "cannot drop {kind} '{name}': {} {} it (DROP {} {name} CASCADE drops them too)",
                describe_all(&readers),
                if readers.len() == 1 { "reads" } else { "read" },
                kind.keyword()
            )));
        }
        let mut dropped = vec![Dropped {
            kind,
            name: name.to_string(),
        }];
        // Readers last first, so that nothing is left reading a dropped
        // entry while the others go.
        dropped.extend(readers.iter().rev().map(|d| Dropped {
            kind: d.kind,
            name: d.name.clone(),
        }));
        for entry in &dropped {
            self.forget(entry.kind, &entry.name);
        }
        Ok(dropped)
    }

    /// `CREATE OR REPLACE`: declares the entry in place of the one of the
    /// same name, then plans again, on the new definition, each view,
    /// alert and invariant that read the old one. If one of them no longer
    /// plans, nothing changes.
    pub(super) fn replace(&mut self, statement: &Statement, base_dir: &Path) -> Result<Outcome> {
        let Some((kind, name)) = declared_name(&statement.kind) else {
            return Err(Error::Plan(
                "OR REPLACE belongs to CREATE STREAM, VIEW, SINK, ALERT or INVARIANT".into(),
            ));
        };
        let name = name.to_string();
        if kind != ObjectKind::Sink
            && let Some(existing) = self.kind_of(&name).filter(|k| *k != kind)
        {
            return Err(Error::Plan(format!(
                "'{name}' is {}, not {} (DROP {} {name} removes it)",
                existing.a(),
                kind.a(),
                existing.keyword()
            )));
        }
        let saved = (self.catalog.clone(), self.derived.clone());
        let replaced = self.replace_in_place(kind, &name, statement, base_dir);
        if replaced.is_err() {
            (self.catalog, self.derived) = saved;
        }
        replaced
    }

    pub(super) fn replace_in_place(
        &mut self,
        kind: ObjectKind,
        name: &str,
        statement: &Statement,
        base_dir: &Path,
    ) -> Result<Outcome> {
        let readers = self.readers_of(name);
        self.forget(kind, name);
        let outcome = self.run(statement, base_dir)?;
        if let Some(new) = self.derived.last().filter(|d| d.name == name)
            && let Some(reader) = readers.iter().find(|r| new.reads.contains(&r.name))
        {
            return Err(Error::Plan(format!(
                "{kind} '{name}' cannot read {} '{}', which reads it",
                reader.kind, reader.name
            )));
        }
        for reader in readers {
            self.forget(reader.kind, &reader.name);
            // A reader is planned again only into the catalog: a query it
            // started (CREATE ALERT) goes on with its own plan.
            self.run(&reader.statement, base_dir).map_err(|e| {
                Error::Plan(format!(
                    "cannot replace {kind} '{name}': {} '{}' reads it and does not plan on the new definition ({e}); drop or replace it first",
                    reader.kind, reader.name
                ))
            })?;
        }
        Ok(outcome)
    }

    /// `ALTER ALERT name SET ...`: the alert's declaration changed and
    /// planned again into the catalog, as the change to make.
    pub(super) fn alter_alert(
        &mut self,
        name: &str,
        change: &crate::sql::AlertChange,
        allow_state_loss: bool,
        base_dir: &Path,
    ) -> Result<Outcome> {
        let declared = self
            .derived
            .iter()
            .find(|d| d.kind == ObjectKind::Alert && d.name == name)
            .map(|d| d.statement.clone())
            .ok_or_else(|| {
                Error::Plan(format!("no alert named '{name}' (SHOW ALERTS lists them)"))
            })?;
        let mut changed = declared.clone();
        let StatementKind::CreateAlert { alert, .. } = &mut changed.kind else {
            return Err(Error::Plan(format!("'{name}' is not an alert")));
        };
        let clause = alert
            .as_deref()
            .ok_or_else(|| Error::Plan(format!("alert '{name}' has no ALERT clause")))?;
        *alert = Some(Box::new(change.apply(clause).map_err(Error::Plan)?));
        changed.or_replace = true;
        let undo = self.save_catalog();
        let saved_name = self.query_name.take();
        let outcome = self.replace(&changed, base_dir);
        self.query_name = saved_name;
        let Outcome::Query(query) = outcome? else {
            return Err(Error::Plan(format!("alert '{name}' plans no query")));
        };
        Ok(Outcome::Change(Box::new(Change {
            target: ChangeTarget::Alert(name.to_string()),
            query: Some(query),
            parallelism: None,
            allow_state_loss,
            what: format!("alert {name}"),
            undo: Some(undo),
        })))
    }

    /// The catalog and declarations as they are, for [`Engine::restore_catalog`].
    pub fn save_catalog(&self) -> SavedCatalog {
        SavedCatalog {
            catalog: self.catalog.clone(),
            derived: self.derived.clone(),
        }
    }

    /// Puts back what [`Engine::save_catalog`] saved.
    pub fn restore_catalog(&mut self, saved: SavedCatalog) {
        self.catalog = saved.catalog;
        self.derived = saved.derived;
    }
}

/// `view 'v' and alert 'a'`.
pub(super) fn describe_all(entries: &[Derived]) -> String {
    let named: Vec<String> = entries
        .iter()
        .map(|d| format!("{} '{}'", d.kind, d.name))
        .collect();
    match named.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The name of an alert written inline (not with `CREATE ALERT`): after
/// the line of its statement.
pub(super) fn alert_name(statement: &Statement) -> String {
    format!("alert_{}", statement.line)
}
