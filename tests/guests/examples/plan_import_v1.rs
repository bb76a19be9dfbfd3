//! A control tool built against `keel:control@0.1.0`, whose errors are strings — as keel's own
//! control component was before 0.2.0. keel links 0.1.0 beside 0.2.0, so the sessions that
//! pinned such a component keep it working.

#[allow(unsafe_code, clippy::all)]
mod bindings {
    wit_bindgen::generate!({
        path: "wit-v1",
        world: "keel:compat-guest/control-tool-v1",
        generate_all,
    });
}

use bindings::exports::keel::tool::tools::Guest;
use bindings::keel::control0_1_0::plan;
use bindings::keel::tool::types::{Effect, ToolError, ToolSpec};

struct OldPlanner;

impl Guest for OldPlanner {
    fn describe() -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "old_plan".into(),
            description:
                "Writes a plan through keel:control@0.1.0, then asks for a step it does not have."
                    .into(),
            input_schema: r#"{"type":"object"}"#.into(),
            output_schema: None,
            effect: Effect::ReadOnly,
            idempotent: true,
        }]
    }

    fn invoke(_name: String, _input: String) -> Result<String, ToolError> {
        let steps = plan::create(&["obey the old tool".to_string()]).map_err(ToolError::Failed)?;
        // A refused request comes back as the 0.1.0 string.
        let refused = match plan::update(9, plan::StepStatus::Done, None) {
            Ok(_) => String::new(),
            Err(message) => message,
        };
        Ok(serde_json::json!({"steps": steps.len(), "refused": refused}).to_string())
    }
}

bindings::export!(OldPlanner with_types_in bindings);
