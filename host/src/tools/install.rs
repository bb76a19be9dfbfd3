//! Validation of a component's tool descriptions at install time.

use crate::sandbox::RawSpec;

use super::catalog::ToolRecord;

/// Longest tool name.
pub const MAX_TOOL_NAME: usize = 64;
/// Longest tool description.
pub const MAX_DESCRIPTION: usize = 4096;
/// Most tools one component may describe.
pub const MAX_TOOLS_PER_COMPONENT: usize = 256;
/// Largest schema accepted, in bytes.
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;

/// Checks a component name: lowercase letters, digits, `-` and `_`, starting with a letter.
pub fn valid_component_name(name: &str) -> bool {
    valid_name(name, &['_', '-'])
}

/// Checks a tool name: lowercase letters, digits and `_`, starting with a letter.
pub fn valid_tool_name(name: &str) -> bool {
    valid_name(name, &['_'])
}

fn valid_name(name: &str, extra: &[char]) -> bool {
    let mut chars = name.chars();
    name.len() <= MAX_TOOL_NAME
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || extra.contains(&c))
}

fn parse_schema(
    tool: &str,
    which: &str,
    text: &str,
    problems: &mut Vec<String>,
) -> Option<serde_json::Value> {
    if text.len() > MAX_SCHEMA_BYTES {
        problems.push(format!(
            "`{tool}`: {which} schema is {} bytes, over {MAX_SCHEMA_BYTES}",
            text.len()
        ));
        return None;
    }
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            problems.push(format!("`{tool}`: {which} schema is not JSON: {e}"));
            return None;
        }
    };
    if let Err(e) = jsonschema::meta::validate(&value) {
        problems.push(format!(
            "`{tool}`: {which} schema is not a valid JSON Schema: {e} (at {})",
            e.instance_path()
        ));
        return None;
    }
    if let Err(e) = jsonschema::validator_for(&value) {
        problems.push(format!("`{tool}`: {which} schema cannot be compiled: {e}"));
        return None;
    }
    Some(value)
}

/// Validates every spec and turns them into catalog records for `component`. Returns every
/// problem found, not just the first.
pub fn validate_specs(
    component: &str,
    specs: Vec<RawSpec>,
) -> Result<Vec<ToolRecord>, Vec<String>> {
    let mut problems = Vec::new();
    if specs.is_empty() {
        problems.push("`describe` returned no tools".to_string());
    }
    if specs.len() > MAX_TOOLS_PER_COMPONENT {
        problems.push(format!(
            "`describe` returned {} tools, over {MAX_TOOLS_PER_COMPONENT}",
            specs.len()
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut records = Vec::new();
    for s in specs {
        let shown: String = s.name.chars().take(80).collect();
        if !valid_tool_name(&s.name) {
            problems.push(format!(
                "tool name {shown:?} is not well-formed: use lowercase letters, digits and `_`, \
                 starting with a letter, at most {MAX_TOOL_NAME} characters"
            ));
            continue;
        }
        if !seen.insert(s.name.clone()) {
            problems.push(format!("tool name `{}` is described twice", s.name));
            continue;
        }
        if s.description.trim().is_empty() || s.description.len() > MAX_DESCRIPTION {
            problems
                .push(format!("`{}`: description must be 1 to {MAX_DESCRIPTION} bytes", s.name));
        }
        let input = parse_schema(&s.name, "input", &s.input_schema, &mut problems);
        if let Some(v) = &input
            && v.get("type").and_then(|t| t.as_str()) != Some("object")
        {
            problems.push(format!(
                "`{}`: input schema must describe an object (\"type\": \"object\")",
                s.name
            ));
        }
        let output = match &s.output_schema {
            Some(text) => parse_schema(&s.name, "output", text, &mut problems).map(Some),
            None => Some(None),
        };
        let (Some(input), Some(output)) = (input, output) else { continue };
        let spec_digest = crate::sandbox::sha256_hex(
            serde_json::json!({
                "name": s.name, "description": s.description, "input_schema": input,
                "output_schema": output, "effect": s.effect, "idempotent": s.idempotent,
            })
            .to_string()
            .as_bytes(),
        );
        records.push(ToolRecord {
            name: s.name,
            component: component.to_string(),
            description: s.description,
            input_schema: input,
            output_schema: output,
            effect: s.effect,
            idempotent: s.idempotent,
            spec_digest,
        });
    }
    if problems.is_empty() { Ok(records) } else { Err(problems) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, schema: &str) -> RawSpec {
        RawSpec {
            name: name.into(),
            description: "does things".into(),
            input_schema: schema.into(),
            output_schema: None,
            effect: crate::policy::Effect::ReadOnly,
            idempotent: true,
        }
    }

    #[test]
    fn names() {
        assert!(valid_tool_name("fs_read_file"));
        assert!(!valid_tool_name("Fs"));
        assert!(!valid_tool_name("1fs"));
        assert!(!valid_tool_name("fs-read"));
        assert!(!valid_tool_name(""));
        assert!(valid_component_name("my-tool_2"));
    }

    #[test]
    fn every_problem_is_reported() {
        let obj = r#"{"type":"object"}"#;
        let err = validate_specs(
            "c",
            vec![
                spec("ok", obj),
                spec("ok", obj),
                spec("Bad", obj),
                spec("s", "{"),
                spec("t", r#"{"type":"string"}"#),
                spec("u", r#"{"type": 5}"#),
            ],
        )
        .unwrap_err();
        assert_eq!(err.len(), 5, "{err:#?}");
        assert!(err[0].contains("described twice"));
        assert!(err[1].contains("not well-formed"));
        assert!(err[2].contains("not JSON"));
        assert!(err[3].contains("must describe an object"));
        assert!(err[4].contains("not a valid JSON Schema"));
    }
}
