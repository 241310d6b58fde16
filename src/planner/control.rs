//! Lowering a `ControlNode` (`CONTROLLED`, `PARAMS`): the data and the
//! control stream meeting in a [`ControlFilter`].

use super::*;

impl Builder {
    /// `CONTROLLED(...)`: the data and the control stream meet in a
    /// [`ControlFilter`], each read with its own watermark.
    pub(super) fn control(&mut self, control: &ControlNode) -> Result<Built> {
        let mut inputs = Vec::with_capacity(2);
        let sides = [
            (&control.data, control.data_time),
            (&control.control, control.control_time),
        ];
        for (side, time) in sides {
            let built = self.build(side)?;
            if built.inputs.len() != 1 || built.join.is_some() {
                return Err(Error::Plan("CONTROLLED reads two declared streams".into()));
            }
            let (stream, mut ops) = built.inputs.into_iter().next().expect("one input");
            ops.extend(built.ops);
            // A plain view of a stream has no clock of its own: without one
            // its rows would wait for the end of input.
            if !has_clock(side) {
                let clock = WatermarkOp::new(time, stream.delay_ms);
                ops.push((Box::new(clock), Placement::Serial));
            }
            inputs.push((stream, ops));
        }
        let schema = |plan: &LogicalPlan| Arc::new(plan.schema().as_arrow().clone());
        let mode = match &control.kind {
            ControlKind::Block {
                data_key,
                action,
                until,
            } => ControlMode::Block {
                data_key: *data_key,
                action: *action,
                until: *until,
            },
            ControlKind::Params { params, value } => ControlMode::Params {
                params: params
                    .iter()
                    .map(|(name, default)| match default {
                        ScalarValue::Float64(Some(v)) => Ok((name.clone(), *v)),
                        other => Err(Error::Plan(format!(
                            "parameter '{name}': its default {other} is not a DOUBLE"
                        ))),
                    })
                    .collect::<Result<_>>()?,
                value: *value,
            },
        };
        let spec = ControlSpec {
            data_schema: schema(&control.data),
            data_time: control.data_time,
            control_schema: schema(&control.control),
            control_time: control.control_time,
            control_key: control.control_key,
            mode,
            output_schema: Arc::new(control.schema().as_arrow().clone()),
        };
        Ok(Built {
            inputs,
            join: Some(Box::new(ControlFilter::new(spec))),
            ops: Vec::new(),
            window: None,
            shed_fraction: false,
        })
    }
}
