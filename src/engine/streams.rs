//! `CREATE STREAM`: a stream declared, with its connector's options
//! checked and an input override of `vigil run --input` applied.

use super::*;

impl Engine {
    pub(super) fn create_stream(&mut self, create: &CreateStream, base_dir: &Path) -> Result<()> {
        let delay_ms = match create.watermark.as_ref().and_then(|w| w.delay.as_ref()) {
            Some(expr) => self.planner.interval_ms(&self.catalog, expr)?,
            None => 0,
        };
        if delay_ms < 0 {
            return Err(Error::Plan(format!(
                "stream '{}': the watermark delay must not be negative",
                create.name
            )));
        }
        let option = |key: &str| {
            create
                .options
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, text)| self.option_ms(&create.name, key, text))
                .transpose()
        };
        let timing = StreamTiming {
            delay_ms,
            lateness_ms: option(ALLOWED_LATENESS)?.unwrap_or(0),
            idle_timeout: option(IDLE_TIMEOUT)?
                .map(|ms| std::time::Duration::from_millis(ms as u64)),
        };
        let mut create = self.with_input_override(create);
        for key in ShedSettings::KEYS {
            if create.options.iter().filter(|(k, _)| k == key).count() > 1 {
                return Err(Error::Plan(format!(
                    "stream '{}': option '{key}' is given more than once",
                    create.name
                )));
            }
        }
        let shed = ShedSettings::from_options(&create.options);
        create
            .options
            .retain(|(k, _)| !ShedSettings::KEYS.contains(&k.as_str()));
        let reads_file = create
            .options
            .iter()
            .find(|(k, _)| k == "connector")
            .is_none_or(|(_, v)| v.trim().eq_ignore_ascii_case("file"));
        if let Some(rows) = self.batch_size {
            create
                .options
                .retain(|(k, _)| !k.eq_ignore_ascii_case("batch_size"));
            create.options.push(("batch_size".into(), rows.to_string()));
        }
        if let Some(follow) = self.follow.filter(|_| reads_file) {
            create.options.retain(|(k, _)| k != "follow");
            create.options.push(("follow".into(), follow.to_string()));
        }
        if let Some(partition) = self.kafka_partition {
            crate::connectors::kafka::stream_for_partition(&mut create.options, partition);
        }
        let def = stream_def(&create, timing, base_dir, &Registry)?;
        self.shed_config(&def, &shed)?;
        self.catalog.add_stream(def)?;
        self.stream_shed.insert(create.name.clone(), shed);
        Ok(())
    }

    /// `create` reading from its override file, if it has one.
    pub(super) fn with_input_override(&self, create: &CreateStream) -> CreateStream {
        let mut create = create.clone();
        if let Some((_, path)) = self.inputs.iter().rev().find(|(n, _)| *n == create.name) {
            // The file replaces the connector, with the options that
            // belong to the one it replaces.
            const REPLACED: [&str; 5] = ["path", "connector", "interval", "limit", "speed"];
            create
                .options
                .retain(|(k, _)| !REPLACED.contains(&k.as_str()));
            let absolute = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            create
                .options
                .push(("path".into(), absolute.display().to_string()));
        }
        create
    }
}
