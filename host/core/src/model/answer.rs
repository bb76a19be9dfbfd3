//! Reading the JSON answers of the supporting calls (task understanding, the Orchestrator,
//! the summary) liberally: real servers answer in JSON mode only (`json_object`), or ignore the
//! schema, and real models wrap the object in a code fence or a sentence, write one string
//! where a list is asked for, leave an empty list out, or add fields of their own. What can be
//! read is read — each liberty taken is noted, for the log — and only what cannot be read is
//! refused, with what was wrong.

use serde_json::{Map, Value};

/// A JSON object read from an answer, with the liberties taken to read it.
#[derive(Debug, Default)]
pub struct Reader {
    pub map: Map<String, Value>,
    /// What was not as asked but was read anyway (shown in the log).
    pub notes: Vec<String>,
}

/// Positions of `{` tried when looking for the object inside prose, at most.
const STARTS_TRIED: usize = 8;

impl Reader {
    /// The JSON object of `content`: the whole text, or the first object inside a code fence
    /// or prose. Fields other than `known` are dropped, with a note.
    pub fn new(content: &str, known: &[&str]) -> Result<Self, String> {
        let text = content.trim();
        let mut notes = Vec::new();
        let value = match serde_json::from_str::<Value>(text) {
            Ok(v) => v,
            Err(whole) => {
                let v = embedded(text).ok_or_else(|| {
                    if text.is_empty() {
                        "the answer is empty".to_string()
                    } else {
                        format!("the answer holds no JSON object: {whole}")
                    }
                })?;
                notes.push(if text.starts_with("```") {
                    "the object was inside a code fence".to_string()
                } else {
                    "the object was inside other text".to_string()
                });
                v
            }
        };
        let Value::Object(mut map) = value else {
            return Err(format!("the answer is JSON but not an object ({})", kind(&value)));
        };
        let unknown: Vec<String> =
            map.keys().filter(|k| !known.contains(&k.as_str())).cloned().collect();
        for k in &unknown {
            map.remove(k);
        }
        if !unknown.is_empty() {
            notes.push(format!("unknown fields ignored: {}", unknown.join(", ")));
        }
        Ok(Self { map, notes })
    }

    /// Field `key` as a list of texts: an array (numbers and booleans read as text, objects as
    /// their JSON), one string as one item, a missing or null field as empty. Empty items are
    /// dropped; past `max` items the rest are dropped, and past `max_chars` an item is cut —
    /// each with a note. An object is not a list: refused.
    pub fn list(&mut self, key: &str, max: usize, max_chars: usize) -> Result<Vec<String>, String> {
        let items = match self.map.get(key) {
            None | Some(Value::Null) => {
                self.notes.push(format!("`{key}` was missing: read as empty"));
                return Ok(Vec::new());
            }
            Some(Value::Array(items)) => items.clone(),
            Some(Value::Object(_)) => {
                return Err(format!("`{key}` is an object, not a list of strings"));
            }
            Some(one) => {
                self.notes.push(format!("`{key}` was one {}: read as a list of one", kind(one)));
                vec![one.clone()]
            }
        };
        let mut out = Vec::new();
        for item in &items {
            let text = match item {
                Value::String(s) => s.trim().to_string(),
                Value::Null => continue,
                Value::Number(_) | Value::Bool(_) => item.to_string(),
                Value::Array(_) | Value::Object(_) => {
                    self.notes.push(format!("`{key}` held a {}: read as its JSON", kind(item)));
                    item.to_string()
                }
            };
            if text.is_empty() {
                continue;
            }
            out.push(self.cut(key, text, max_chars));
        }
        if out.len() > max {
            self.notes.push(format!("`{key}` held {} items: the first {max} were kept", out.len()));
            out.truncate(max);
        }
        Ok(out)
    }

    /// Field `key` as one text: a string, or a list of strings joined by spaces (a missing
    /// field: `None`). Cut past `max_chars`.
    pub fn text(&mut self, key: &str, max_chars: usize) -> Result<Option<String>, String> {
        let text = match self.map.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(s)) => s.trim().to_string(),
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
                self.notes.push(format!("`{key}` was a list: read as one text"));
                let parts: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
                parts.join(" ").trim().to_string()
            }
            Some(other) => return Err(format!("`{key}` is a {}, not a string", kind(other))),
        };
        Ok(Some(self.cut(key, text, max_chars)))
    }

    fn cut(&mut self, key: &str, text: String, max_chars: usize) -> String {
        if text.chars().count() <= max_chars {
            return text;
        }
        self.notes.push(format!("an entry of `{key}` was longer than {max_chars} characters: cut"));
        let mut cut: String = text.chars().take(max_chars).collect();
        cut.push('…');
        cut
    }

    /// Logs the liberties taken, if any, under `what` (the call's name).
    pub fn log(&self, what: &str) {
        if !self.notes.is_empty() {
            tracing::info!(call = what, notes = %self.notes.join("; "), "answer read liberally");
        }
    }
}

/// The first JSON object inside `text`: after a code fence's opening line, or at one of the
/// first `{` of prose (the object may be followed by more text).
fn embedded(text: &str) -> Option<Value> {
    let fenced = text.strip_prefix("```").map(|rest| {
        let body = rest.split_once('\n').map_or("", |(_, b)| b);
        body.rsplit_once("```").map_or(body, |(b, _)| b)
    });
    if let Some(body) = fenced
        && let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(body.trim())
    {
        return Some(v);
    }
    text.match_indices('{').take(STARTS_TRIED).find_map(|(i, _)| {
        let mut stream = serde_json::Deserializer::from_str(&text[i..]).into_iter::<Value>();
        match stream.next() {
            Some(Ok(v @ Value::Object(_))) => Some(v),
            _ => None,
        }
    })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_is_found_in_a_fence_or_in_prose() {
        for text in [
            "{\"a\": [\"x\"]}",
            "```json\n{\"a\": [\"x\"]}\n```",
            "```\n{\"a\": [\"x\"]}\n```\n",
            "Here is the summary:\n{\"a\": [\"x\"]}\nHope it helps {not json}",
            "Sure! {bad} then {\"a\": \"x\"}",
        ] {
            let mut r = Reader::new(text, &["a"]).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(r.list("a", 8, 100).unwrap(), vec!["x"], "{text}");
        }
        for (text, why) in [
            ("", "empty"),
            ("no object here", "no JSON object"),
            ("[1, 2]", "not an object (array)"),
            ("```json\n[1]\n```", "no JSON object"),
        ] {
            let e = Reader::new(text, &["a"]).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn lists_are_read_liberally_and_an_object_is_refused() {
        let mut r = Reader::new(
            r#"{"one": "a", "many": ["a", 2, true, null, "", {"k": "v"}], "obj": {"k": 1}, "extra": 1}"#,
            &["one", "many", "obj", "missing"],
        )
        .unwrap();
        assert!(
            r.notes.iter().any(|n| n.contains("unknown fields ignored: extra")),
            "{:?}",
            r.notes
        );
        assert_eq!(r.list("one", 8, 100).unwrap(), vec!["a"]);
        assert_eq!(r.list("many", 8, 100).unwrap(), vec!["a", "2", "true", r#"{"k":"v"}"#]);
        assert_eq!(r.list("missing", 8, 100).unwrap(), Vec::<String>::new());
        assert!(r.list("obj", 8, 100).unwrap_err().contains("is an object"));
        assert_eq!(r.list("many", 2, 100).unwrap(), vec!["a", "2"]);
        assert_eq!(r.list("one", 8, 0).unwrap(), vec!["…"]);
        assert!(r.notes.len() >= 5, "{:?}", r.notes);
    }

    #[test]
    fn a_text_may_be_a_list_of_strings() {
        let mut r =
            Reader::new(r#"{"t": ["fix", "the bug"], "n": 3, "s": " x "}"#, &["t", "n", "s", "m"])
                .unwrap();
        assert_eq!(r.text("t", 100).unwrap().as_deref(), Some("fix the bug"));
        assert_eq!(r.text("s", 100).unwrap().as_deref(), Some("x"));
        assert_eq!(r.text("m", 100).unwrap(), None);
        assert!(r.text("n", 100).unwrap_err().contains("number, not a string"));
    }
}
