//! Parsing of a streamed (SSE) chat completion.

use serde::Deserialize;

use crate::ids::CallId;

use super::{FunctionPart, MAX_TOOL_CALLS, ModelError, ModelReply, ToolCallRequest, UsageJson};

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    /// Sent in the last chunk (with no choices) when the request asked for it
    /// (`stream_options.include_usage`); some servers send it with every chunk.
    #[serde(default)]
    usage: Option<UsageJson>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Delta {
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<DeltaCall>>,
    function_call: Option<FunctionPart>,
}

#[derive(Deserialize)]
struct DeltaCall {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionPart>,
}

/// Merges a repeated-or-split field: servers either send it once, repeat it whole in every
/// delta, or split it; a repeat of what is already there is ignored.
fn merge(into: &mut String, part: Option<String>) {
    if let Some(p) = part
        && !p.is_empty()
        && *into != p
    {
        into.push_str(&p);
    }
}

/// The text one stream line carries (`data: {"choices":[{"delta":{"content":"…"}}]}`), for
/// showing it as it arrives. Anything else — another field, `[DONE]`, a line that does not
/// parse — is `None`: the whole body is parsed, and checked, when it ends.
pub fn delta_text(line: &str) -> Option<String> {
    let data = line.trim_end_matches('\r').strip_prefix("data:")?.trim();
    if data.is_empty() || data == "[DONE]" {
        return None;
    }
    let chunk: Chunk = serde_json::from_str(data).ok()?;
    chunk.choices.into_iter().next()?.delta?.content.filter(|c| !c.is_empty())
}

/// Parses a complete SSE body: `data: {json}` events until `data: [DONE]`. A body that ends
/// without `[DONE]` and without a finish reason is [`ModelError::Truncated`].
pub fn parse_stream(bytes: &[u8]) -> Result<ModelReply, ModelError> {
    let text = String::from_utf8_lossy(bytes);
    let mut content = String::new();
    let mut saw_content = false;
    let mut calls: Vec<ToolCallRequest> = Vec::new();
    let mut legacy: Option<ToolCallRequest> = None;
    let mut finish_reason = None;
    let mut done = false;
    let mut usage = None;
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        let Some(data) = line.strip_prefix("data:") else { continue };
        let data = data.trim();
        if data == "[DONE]" {
            done = true;
            break;
        }
        if data.is_empty() {
            continue;
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| ModelError::Malformed(format!("bad stream event {data:?}: {e}")))?;
        if let Some(u) = chunk.usage {
            usage = u.into_usage().or(usage);
        }
        let Some(choice) = chunk.choices.into_iter().next() else { continue };
        if choice.finish_reason.is_some() {
            finish_reason = choice.finish_reason;
        }
        let delta = choice.delta.unwrap_or_default();
        if let Some(c) = delta.content {
            saw_content |= !c.is_empty();
            content.push_str(&c);
        }
        for (n, d) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
            let index = d.index.unwrap_or(n);
            if index >= MAX_TOOL_CALLS {
                // Checked before the calls up to it are made room for.
                return Err(ModelError::Malformed(format!(
                    "a stream delta names tool call index {index}; at most {MAX_TOOL_CALLS} calls are accepted in one reply"
                )));
            }
            while calls.len() <= index {
                calls.push(ToolCallRequest {
                    id: CallId::default(),
                    name: String::new(),
                    arguments: String::new(),
                });
            }
            let call = &mut calls[index];
            merge(call.id.as_mut_string(), d.id);
            let f = d.function.unwrap_or_default();
            merge(&mut call.name, f.name);
            if let Some(a) = f.arguments {
                call.arguments.push_str(&a);
            }
        }
        if let Some(f) = delta.function_call {
            let call = legacy.get_or_insert_with(|| ToolCallRequest {
                id: CallId::default(),
                name: String::new(),
                arguments: String::new(),
            });
            merge(&mut call.name, f.name);
            if let Some(a) = f.arguments {
                call.arguments.push_str(&a);
            }
        }
    }
    if !done && finish_reason.is_none() {
        return Err(ModelError::Truncated);
    }
    if calls.is_empty()
        && let Some(l) = legacy
    {
        calls.push(l);
    }
    Ok(ModelReply {
        content: saw_content.then_some(content),
        tool_calls: calls,
        finish_reason,
        usage,
        attempts: 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_arguments_repeated_names_and_done() {
        let body = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"fs_read_file\",\"arguments\":\"{\\\"pa\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"fs_read_file\",\"arguments\":\"th\\\": \\\"/w\\\"}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n"
        );
        let r = parse_stream(body.as_bytes()).unwrap();
        assert_eq!(
            r.tool_calls,
            vec![ToolCallRequest {
                id: "c1".into(),
                name: "fs_read_file".into(),
                arguments: "{\"path\": \"/w\"}".into()
            }]
        );
        assert_eq!(r.content, None);
    }

    #[test]
    fn usage_comes_in_the_last_chunk_without_choices() {
        let body = concat!(
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":3,",
            "\"total_tokens\":123,\"prompt_tokens_details\":{\"cached_tokens\":100}}}\n\n",
            "data: [DONE]\n\n"
        );
        let r = parse_stream(body.as_bytes()).unwrap();
        assert_eq!(r.content.as_deref(), Some("Hi"));
        assert_eq!(
            r.usage,
            Some(super::super::Usage {
                prompt_tokens: 120,
                completion_tokens: 3,
                cached_tokens: Some(100)
            })
        );
    }

    #[test]
    fn cut_stream_is_truncated() {
        let body = "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n";
        assert_eq!(parse_stream(body.as_bytes()), Err(ModelError::Truncated));
    }

    #[test]
    fn legacy_function_call() {
        let body = concat!(
            "data: {\"choices\":[{\"delta\":{\"function_call\":{\"name\":\"echo\",\"arguments\":\"{}\"}}}]}\n\n",
            "data: [DONE]\n"
        );
        let r = parse_stream(body.as_bytes()).unwrap();
        assert_eq!(r.tool_calls[0].name, "echo");
    }

    #[test]
    fn a_call_index_past_the_limit_is_refused_before_room_is_made_for_it() {
        // Without the check, this index would have the parser allocate a call for every
        // index below it: about 10^18 of them.
        let event = |index: u64| {
            format!(
                "data: {{\"choices\":[{{\"delta\":{{\"tool_calls\":[{{\"index\":{index},\"id\":\"c\",\"function\":{{\"name\":\"echo\",\"arguments\":\"{{}}\"}}}}]}}}}]}}\n\ndata: [DONE]\n\n"
            )
        };
        match parse_stream(event(1 << 60).as_bytes()) {
            Err(ModelError::Malformed(m)) => {
                assert!(m.contains("index 1152921504606846976"), "{m}")
            }
            other => panic!("expected a malformed reply, got {other:?}"),
        }
        assert!(matches!(
            parse_stream(event(MAX_TOOL_CALLS as u64).as_bytes()),
            Err(ModelError::Malformed(_))
        ));
        // The last index accepted.
        let r = parse_stream(event(MAX_TOOL_CALLS as u64 - 1).as_bytes()).unwrap();
        assert_eq!(r.tool_calls.len(), MAX_TOOL_CALLS);
    }
}
