//! A tool-world component whose descriptions break every rule, and whose output is not JSON.

wit_bindgen::generate!({
    path: "../../wit",
    world: "keel:tool/tool",
});

use exports::keel::tool::tools::Guest;
use keel::tool::types::{Effect, ToolError, ToolSpec};

struct Bad;

fn spec(name: &str, schema: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: "bad".into(),
        input_schema: schema.into(),
        output_schema: None,
        effect: Effect::ReadOnly,
        idempotent: false,
    }
}

impl Guest for Bad {
    fn describe() -> Vec<ToolSpec> {
        vec![
            spec("dup", r#"{"type":"object"}"#),
            spec("dup", r#"{"type":"object"}"#),
            spec("Not A Name", r#"{"type":"object"}"#),
            spec("not_json", "{"),
            spec("not_object", r#"{"type":"array"}"#),
        ]
    }

    fn invoke(_name: String, _input: String) -> Result<String, ToolError> {
        Ok("this is not JSON".into())
    }
}

export!(Bad);
