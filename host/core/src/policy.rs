//! What a session allows: the [`Effect`] class of a tool and the [`Policy`] that decides, per
//! tool and per effect class, whether a call runs, waits for a person, or is refused. A leaf:
//! the session stores a policy, the tool chain applies it, neither owns the other.

use serde::{Deserialize, Serialize};

crate::stored_enum! {
    /// What a tool's call can do to the world, as its component declares it.
    pub enum Effect: "effect class" {
        /// Reads granted files only.
        ReadOnly = "read-only",
        /// Changes files inside the granted directories.
        WorkspaceWrite = "workspace-write",
        /// Acts outside the host (sends, posts, calls a service).
        External = "external",
        /// Deletes or overwrites in ways that cannot be undone.
        Destructive = "destructive",
    }
}

/// The effect classes a session asks about before running, unless its policy says otherwise.
pub const DEFAULT_ASK_EFFECTS: [Effect; 2] = [Effect::Destructive, Effect::External];

fn default_ask_effects() -> Vec<Effect> {
    DEFAULT_ASK_EFFECTS.to_vec()
}

/// Which calls a session allows, which it asks a person about first, and which it refuses —
/// per tool and per effect class. The default asks before `destructive` and `external` calls
/// and allows the rest (within the session's grants).
///
/// Rules, first match wins: denied tool → allowed tool → asked tool → denied effect → asked
/// effect → allow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    #[serde(default)]
    pub deny_tools: Vec<String>,
    #[serde(default)]
    pub deny_effects: Vec<Effect>,
    /// Tools that always run without asking (unless denied by name).
    #[serde(default)]
    pub allow_tools: Vec<String>,
    /// Tools that need a person's approval for each call.
    #[serde(default)]
    pub ask_tools: Vec<String>,
    /// Effect classes that need a person's approval for each call.
    #[serde(default = "default_ask_effects")]
    pub ask_effects: Vec<Effect>,
    /// Regular expressions whose matches in tool results are replaced by [`REDACTED`] before
    /// anything keeps or sends them: the model, the history, the journal, a summary
    /// (`--redact`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redact: Vec<String>,
}

/// What a redacted match becomes.
pub const REDACTED: &str = "[redacted]";

/// Longest redaction pattern, in bytes.
pub const MAX_REDACT_PATTERN: usize = 1024;

impl Default for Policy {
    fn default() -> Self {
        Self {
            deny_tools: Vec::new(),
            deny_effects: Vec::new(),
            allow_tools: Vec::new(),
            ask_tools: Vec::new(),
            ask_effects: default_ask_effects(),
            redact: Vec::new(),
        }
    }
}

/// What a policy says about one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyDecision {
    Allow,
    /// A person must approve the call first; why.
    Ask(String),
    /// Refused; why.
    Deny(String),
}

impl Policy {
    /// Checks the redaction patterns: each must be a regular expression keel can use.
    pub fn check_patterns(&self) -> Result<(), String> {
        for p in &self.redact {
            if p.is_empty() || p.len() > MAX_REDACT_PATTERN {
                return Err(format!(
                    "a redaction pattern must be 1 to {MAX_REDACT_PATTERN} bytes long"
                ));
            }
            regex::Regex::new(p).map_err(|e| {
                format!("the redaction pattern `{p}` is not a regular expression: {e}")
            })?;
        }
        Ok(())
    }

    /// `text` with every match of the redaction patterns replaced by [`REDACTED`] (a pattern
    /// that does not compile redacts everything: [`check_patterns`](Self::check_patterns) refuses it before a
    /// session stores it).
    pub fn redact<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        let mut out = std::borrow::Cow::Borrowed(text);
        for p in &self.redact {
            match regex::Regex::new(p) {
                Ok(re) => {
                    if let std::borrow::Cow::Owned(s) = re.replace_all(&out, REDACTED) {
                        out = std::borrow::Cow::Owned(s);
                    }
                }
                Err(_) => return std::borrow::Cow::Borrowed(REDACTED),
            }
        }
        out
    }

    /// One line a person reads: `deny …; ask …; allow …; redact N pattern(s)`.
    pub fn summary(&self) -> String {
        let list = |tools: &[String], effects: &[Effect]| -> Option<String> {
            let all: Vec<String> =
                tools.iter().cloned().chain(effects.iter().map(|e| e.to_string())).collect();
            (!all.is_empty()).then(|| all.join(", "))
        };
        let mut parts = Vec::new();
        if let Some(d) = list(&self.deny_tools, &self.deny_effects) {
            parts.push(format!("deny {d}"));
        }
        if let Some(a) = list(&self.ask_tools, &self.ask_effects) {
            parts.push(format!("ask {a}"));
        }
        if let Some(a) = list(&self.allow_tools, &[]) {
            parts.push(format!("allow {a}"));
        }
        if !self.redact.is_empty() {
            parts.push(format!("redact {} pattern(s)", self.redact.len()));
        }
        if parts.is_empty() {
            parts.push("every call runs without asking".into());
        }
        parts.join(" · ")
    }

    /// Applies `--allow/--ask/--deny TOOL|EFFECT` adjustments to this policy.
    pub fn adjust(&mut self, allow: &[String], ask: &[String], deny: &[String]) {
        for a in allow {
            match a.parse::<Effect>() {
                Ok(e) => {
                    self.ask_effects.retain(|x| *x != e);
                    self.deny_effects.retain(|x| *x != e);
                }
                Err(_) => self.allow_tools.push(a.clone()),
            }
        }
        for a in ask {
            match a.parse::<Effect>() {
                Ok(e) => self.ask_effects.push(e),
                Err(_) => self.ask_tools.push(a.clone()),
            }
        }
        for d in deny {
            match d.parse::<Effect>() {
                Ok(e) => self.deny_effects.push(e),
                Err(_) => self.deny_tools.push(d.clone()),
            }
        }
    }

    /// The decision for a call of `tool`, whose effect class is `effect`.
    pub fn decide(&self, tool: &str, effect: Effect) -> PolicyDecision {
        let has = |list: &[String], x: &str| list.iter().any(|t| t == x);
        if has(&self.deny_tools, tool) {
            PolicyDecision::Deny(format!("denied by policy (--deny {tool})"))
        } else if has(&self.allow_tools, tool) {
            PolicyDecision::Allow
        } else if has(&self.ask_tools, tool) {
            PolicyDecision::Ask(format!("the session's policy asks before every call of `{tool}`"))
        } else if self.deny_effects.contains(&effect) {
            PolicyDecision::Deny(format!(
                "denied by policy (--deny {effect}): `{tool}` is a `{effect}` tool"
            ))
        } else if self.ask_effects.contains(&effect) {
            PolicyDecision::Ask(format!(
                "`{tool}` is a `{effect}` tool, and the session's policy asks before those"
            ))
        } else {
            PolicyDecision::Allow
        }
    }

    /// `None` when allowed outright, else why not (asking counts as "not outright").
    pub fn check(&self, tool: &str, effect: Effect) -> Option<String> {
        match self.decide(tool, effect) {
            PolicyDecision::Allow => None,
            PolicyDecision::Ask(why) | PolicyDecision::Deny(why) => Some(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effects_keep_their_stored_names() {
        let names: Vec<_> = Effect::ALL.iter().map(|e| e.as_str()).collect();
        assert_eq!(names, ["read-only", "workspace-write", "external", "destructive"]);
        assert!("write".parse::<Effect>().is_err());
    }

    #[test]
    fn a_policy_stored_with_effect_names_reads_back() {
        let stored =
            r#"{"deny_tools":[],"deny_effects":["external"],"allow_tools":[],"ask_tools":["x"]}"#;
        let p: Policy = serde_json::from_str(stored).unwrap();
        assert_eq!(p.deny_effects, vec![Effect::External]);
        assert_eq!(p.ask_effects, DEFAULT_ASK_EFFECTS.to_vec());
        assert!(matches!(p.decide("y", Effect::External), PolicyDecision::Deny(_)));
        assert!(matches!(p.decide("x", Effect::ReadOnly), PolicyDecision::Ask(_)));
        assert_eq!(p.decide("y", Effect::ReadOnly), PolicyDecision::Allow);
    }
}
