//! A tool written from `wit/tool.wit` alone, with plain wit-bindgen (no keel-sdk): the code
//! the README's "without keel-sdk" section shows.

wit_bindgen::generate!({ path: "../../wit", world: "tool" });

use exports::keel::tool::tools::{Guest, ToolError, ToolSpec};
use keel::tool::host::{LogLevel, log};
use keel::tool::types::Effect;

struct Upper;

impl Guest for Upper {
    fn describe() -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "upper".into(),
            description: "Upper-cases `text`.".into(),
            input_schema:
                r#"{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}"#
                    .into(),
            output_schema: None,
            effect: Effect::ReadOnly,
            idempotent: true,
        }]
    }

    fn invoke(name: String, input: String) -> Result<String, ToolError> {
        if name != "upper" {
            return Err(ToolError::UnknownTool(name));
        }
        let v: serde_json::Value =
            serde_json::from_str(&input).map_err(|e| ToolError::InvalidInput(e.to_string()))?;
        let text = v["text"].as_str().ok_or(ToolError::InvalidInput("`text` is missing".into()))?;
        log(LogLevel::Info, "upper-casing");
        Ok(serde_json::json!({ "text": text.to_uppercase() }).to_string())
    }
}

export!(Upper);
