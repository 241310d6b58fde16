//! `SET` and the settings a query is planned with: parallelism, execution
//! mode, autoscaling, buffering and load shedding.

use super::*;

impl Engine {
    pub(super) fn set(&mut self, name: &str, value: &str) -> Result<()> {
        match name {
            "execution_mode" => {
                self.mode = Some(ExecutionMode::parse(value)?);
                Ok(())
            }
            "parallelism" => {
                let instances = value.trim().parse::<usize>().map_err(|_| {
                    Error::Plan(format!(
                        "parallelism must be a whole number of instances, got '{value}'"
                    ))
                })?;
                self.set_parallelism(instances)
            }
            _ if ShedSettings::KEYS.contains(&name) => {
                let mut settings = self.shed.clone();
                settings.set(name, value);
                self.check_shed_setting(&settings)?;
                self.shed = settings;
                Ok(())
            }
            BUFFER | BUFFER_MAX => self.buffer.set("SET", name, value),
            "autoscale" => {
                self.autoscale_on = match value.trim().to_ascii_lowercase().as_str() {
                    "on" | "true" => true,
                    "off" | "false" => false,
                    _ => {
                        return Err(Error::Plan(format!(
                            "autoscale must be 'on' or 'off', got '{value}'"
                        )));
                    }
                };
                Ok(())
            }
            _ if autoscale::KEYS.contains(&name) => {
                let mut settings = self.autoscale.clone();
                settings.set(name, value)?;
                settings.check()?;
                self.autoscale = settings;
                Ok(())
            }
            "query_name" => {
                let value = value.trim();
                if value.is_empty() {
                    return Err(Error::Plan("query_name cannot be empty".into()));
                }
                self.query_name = Some(value.to_string());
                Ok(())
            }
            _ => Err(Error::Plan(format!(
                "unknown setting '{name}' (settings: autoscale, autoscale.policy, autoscale.min, autoscale.max, autoscale.headroom, autoscale.interval, autoscale.cooldown, autoscale.hook, buffer, buffer_max, execution_mode, parallelism, query_name, shed, max_latency, shed_keep, shed_scale)"
            ))),
        }
    }

    /// Checks `SET` shedding settings as far as they go without a stream:
    /// the policy, the interval and the flag.
    pub(super) fn check_shed_setting(&self, settings: &ShedSettings) -> Result<()> {
        if let Some(policy) = &settings.policy {
            ShedPolicy::parse(policy)?;
        }
        if let Some(text) = &settings.max_latency {
            self.max_latency("SET", text)?;
        }
        settings.scale_flag()?;
        Ok(())
    }

    pub(super) fn max_latency(&self, stream: &str, text: &str) -> Result<std::time::Duration> {
        let ms = self.option_ms(stream, "max_latency", text)?;
        if ms == 0 {
            return Err(Error::Plan(format!(
                "stream '{stream}': max_latency must be longer than 0"
            )));
        }
        Ok(std::time::Duration::from_millis(ms as u64))
    }

    /// The shedding of a query over `stream`, by its options `settings`
    /// and the `SET`s after them; `None` when off.
    pub(super) fn shed_config(
        &self,
        stream: &StreamDef,
        settings: &ShedSettings,
    ) -> Result<Option<ShedConfig>> {
        let settings = settings.overridden_by(&self.shed);
        let name = &stream.name;
        let in_stream = |e: Error| Error::Plan(format!("stream '{name}': {e}"));
        let Some(policy) = settings.policy.as_deref() else {
            return Ok(None);
        };
        let Some(policy) = ShedPolicy::parse(policy).map_err(in_stream)? else {
            return Ok(None);
        };
        let max_latency = match &settings.max_latency {
            Some(text) => self.max_latency(name, text)?,
            None => crate::exec::shed::DEFAULT_MAX_LATENCY,
        };
        let keep = match settings.keep.as_deref() {
            Some(text) => Some(
                self.planner
                    .row_predicate(&self.catalog, &stream.schema, text)
                    .map_err(|e| in_stream(Error::Plan(format!("bad shed_keep '{text}': {e}"))))?,
            ),
            None => None,
        };
        if policy == ShedPolicy::Priority && keep.is_none() {
            return Err(in_stream(Error::Plan(
                "shed = 'priority' needs shed_keep, the rows always kept (e.g. shed_keep = 'severity >= 3')".into(),
            )));
        }
        let scale = settings.scale_flag().map_err(in_stream)?;
        Ok(Some(ShedConfig {
            policy,
            max_latency,
            keep,
            scale,
        }))
    }

    /// The shedding of a query reading `plan`'s streams.
    pub(super) fn query_shed(&self, plan: &LogicalPlan) -> Result<Option<ShedConfig>> {
        let mut streams: Vec<Arc<StreamDef>> = Vec::new();
        plan.apply(|node| {
            if let LogicalPlan::TableScan(scan) = node
                && let Some(source) = scan
                    .source
                    .as_ref()
                    .downcast_ref::<crate::plan::StreamSource>()
            {
                streams.push(source.def.clone());
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        })?;
        let mut configs = Vec::new();
        for stream in &streams {
            let own = self
                .stream_shed
                .get(&stream.name)
                .cloned()
                .unwrap_or_default();
            if let Some(config) = self.shed_config(stream, &own)? {
                configs.push(config);
            }
        }
        Ok(configs.into_iter().next())
    }

    /// Reads an interval option such as `allowed_lateness = '5 seconds'` as
    /// milliseconds.
    pub(super) fn option_ms(&self, stream: &str, key: &str, text: &str) -> Result<i64> {
        let bad = |why: String| {
            Error::Plan(format!(
                "stream '{stream}': bad value '{text}' for option '{key}' ({why}; write e.g. '30 seconds')"
            ))
        };
        let literal = format!("INTERVAL '{}'", text.replace('\'', "''"));
        let expr = Parser::new(&GenericDialect {})
            .try_with_sql(&literal)
            .and_then(|mut p| p.parse_expr())
            .map_err(|e| bad(e.to_string()))?;
        let ms = self
            .planner
            .interval_ms(&self.catalog, &expr)
            .map_err(|e| bad(e.to_string()))?;
        if ms < 0 {
            return Err(bad("it must not be negative".into()));
        }
        Ok(ms)
    }

    /// How the queries started now are scaled: `None` unless `SET
    /// autoscale = 'on'`.
    pub fn autoscale(&self) -> Option<AutoscaleSettings> {
        self.autoscale_on.then(|| self.autoscale.clone())
    }
}
