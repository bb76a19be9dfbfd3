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
/// Rules, first match wins: denied tool → allowed tool → tool allowed under a path prefix
/// (every path the call names is under it) → asked tool → denied effect → asked effect →
/// allow.
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
    /// Tools that run without asking when every path their call names is under a prefix (a
    /// person's "always allow" of one call's directory).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_under: Vec<AllowUnder>,
}

/// A tool allowed without asking for calls whose paths are all under `prefix` (a guest path).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllowUnder {
    pub tool: String,
    pub prefix: String,
}

/// One change of a session's policy after its creation (`keel session policy`, chat's `a`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum PolicyChange {
    /// Allow `tool` without asking — everywhere, or for calls under `under` only.
    Allow { tool: String, under: Option<String> },
    /// Ask before every call of `tool` (undoes an allow).
    Ask { tool: String },
    /// Refuse every call of `tool`.
    Deny { tool: String },
}

impl PolicyChange {
    /// Whether the change lets more calls run without a person (an allow), rather than fewer.
    pub fn widens(&self) -> bool {
        matches!(self, Self::Allow { .. })
    }

    /// The tool it is about.
    pub fn tool(&self) -> &str {
        match self {
            Self::Allow { tool, .. } | Self::Ask { tool } | Self::Deny { tool } => tool,
        }
    }

    /// Checks the change: a tool name, and a prefix that is an absolute guest path without
    /// `..`; the prefix comes back normalized.
    pub fn checked(self) -> Result<Self, String> {
        let tool = self.tool();
        if tool.is_empty() || tool.len() > 128 || tool.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("`{}` is not a tool name", tool.escape_debug()));
        }
        match self {
            Self::Allow { tool, under: Some(prefix) } => match normalized(&prefix) {
                Some(p) => Ok(Self::Allow { tool, under: Some(p) }),
                None => Err(format!(
                    "`{}` is not a path prefix: give an absolute guest path without `..` (/out)",
                    prefix.escape_debug()
                )),
            },
            other => Ok(other),
        }
    }
}

impl std::fmt::Display for PolicyChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Allow { tool, under: None } => write!(f, "allow {tool}"),
            Self::Allow { tool, under: Some(p) } => write!(f, "allow {tool} under {p}"),
            Self::Ask { tool } => write!(f, "ask before {tool}"),
            Self::Deny { tool } => write!(f, "deny {tool}"),
        }
    }
}

/// The keys of a call's input that name paths.
const PATH_KEYS: &[&str] =
    &["path", "file", "dir", "directory", "from", "to", "source", "destination", "target"];

/// `path` as an absolute guest path with `.` and repeated `/` taken out and no trailing `/`;
/// `None` for a relative path or one with `..` (which a prefix rule must not be walked out of).
fn normalized(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            p => parts.push(p),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

/// Whether `arguments` (a call's JSON input) names at least one path, and every one is under
/// `prefix` (normalized).
fn all_under(arguments: &str, prefix: &str) -> bool {
    let Ok(serde_json::Value::Object(input)) = serde_json::from_str::<serde_json::Value>(arguments)
    else {
        return false;
    };
    let mut any = false;
    for key in PATH_KEYS {
        let Some(v) = input.get(*key) else { continue };
        let Some(path) = v.as_str() else { return false };
        let Some(path) = normalized(path) else { return false };
        let inside = prefix == "/" || path == prefix || path.starts_with(&format!("{prefix}/"));
        if !inside {
            return false;
        }
        any = true;
    }
    any
}

/// The directory of the first path a call names (`/out` for `{"path": "/out/report.md"}`):
/// the prefix chat's "always allow" offers.
pub fn call_directory(arguments: &str) -> Option<String> {
    let input: serde_json::Value = serde_json::from_str(arguments).ok()?;
    let path = PATH_KEYS.iter().find_map(|k| input.get(*k).and_then(|v| v.as_str()))?;
    let path = normalized(path)?;
    let dir = path.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
    Some(if dir.is_empty() { "/".to_string() } else { dir.to_string() })
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
            allow_under: Vec::new(),
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
        let mut allowed: Vec<String> = self.allow_tools.clone();
        allowed.extend(self.allow_under.iter().map(|r| format!("{} under {}", r.tool, r.prefix)));
        if !allowed.is_empty() {
            parts.push(format!("allow {}", allowed.join(", ")));
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

    /// The decision for a call of `tool`, whose effect class is `effect`, by the tool alone
    /// (a rule for calls under a path prefix does not apply: see
    /// [`decide_call`](Self::decide_call)).
    pub fn decide(&self, tool: &str, effect: Effect) -> PolicyDecision {
        self.decide_call(tool, effect, None)
    }

    /// The decision for a call of `tool` (effect class `effect`) with input `arguments`: as
    /// [`decide`](Self::decide), and a tool allowed under a prefix runs without asking when
    /// every path its input names is under it.
    pub fn decide_call(&self, tool: &str, effect: Effect, arguments: Option<&str>) -> PolicyDecision {
        let has = |list: &[String], x: &str| list.iter().any(|t| t == x);
        let under = || {
            arguments.is_some_and(|a| {
                self.allow_under.iter().any(|r| r.tool == tool && all_under(a, &r.prefix))
            })
        };
        if has(&self.deny_tools, tool) {
            PolicyDecision::Deny(format!("denied by policy (--deny {tool})"))
        } else if has(&self.allow_tools, tool) || under() {
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

    /// Applies `change`: an allow takes the tool out of the asked and denied ones (an allow
    /// under a prefix adds the rule and takes out nothing else); an ask or a deny takes out
    /// every allow of the tool. Returns whether the policy changed.
    pub fn apply(&mut self, change: &PolicyChange) -> bool {
        let before = self.clone();
        let tool = change.tool().to_string();
        match change {
            PolicyChange::Allow { under: None, .. } => {
                self.ask_tools.retain(|t| *t != tool);
                self.deny_tools.retain(|t| *t != tool);
                self.allow_under.retain(|r| r.tool != tool);
                if !self.allow_tools.contains(&tool) {
                    self.allow_tools.push(tool);
                }
            }
            PolicyChange::Allow { under: Some(prefix), .. } => {
                self.deny_tools.retain(|t| *t != tool);
                let rule = AllowUnder { tool, prefix: prefix.clone() };
                if !self.allow_under.contains(&rule) {
                    self.allow_under.push(rule);
                }
            }
            PolicyChange::Ask { .. } | PolicyChange::Deny { .. } => {
                self.allow_tools.retain(|t| *t != tool);
                self.allow_under.retain(|r| r.tool != tool);
                let list = match change {
                    PolicyChange::Ask { .. } => &mut self.ask_tools,
                    _ => &mut self.deny_tools,
                };
                if !list.contains(&tool) {
                    list.push(tool);
                }
            }
        }
        *self != before
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

    #[test]
    fn an_allow_under_a_prefix_holds_for_calls_whose_every_path_is_under_it() {
        let mut p = Policy::default();
        let w = "fs_write_file";
        let change = PolicyChange::Allow { tool: w.into(), under: Some("/out//./".into()) };
        let change = change.checked().unwrap();
        assert_eq!(change.to_string(), "allow fs_write_file under /out");
        assert!(p.apply(&change));
        assert!(!p.apply(&change), "applied twice, changed once");
        let asks = |p: &Policy, a: &str| {
            matches!(p.decide_call(w, Effect::Destructive, Some(a)), PolicyDecision::Ask(_))
        };
        let ask = |a: &str| asks(&p, a);
        assert!(!ask(r#"{"path":"/out/report.md"}"#));
        assert!(!ask(r#"{"path":"/out/a/b.md"}"#));
        assert!(!ask(r#"{"path":"/out"}"#));
        assert!(ask(r#"{"path":"/outside/x"}"#), "a sibling with the same start");
        assert!(ask(r#"{"path":"/out/../etc/passwd"}"#), "no walking out");
        assert!(ask(r#"{"path":"out/x"}"#), "relative");
        assert!(ask(r#"{"from":"/out/a","to":"/data/b"}"#), "every path, not one");
        assert!(ask(r#"{"content":"x"}"#), "no path, no rule");
        assert!(ask(r#"{"path":["/out/a"]}"#));
        assert!(matches!(p.decide(w, Effect::Destructive), PolicyDecision::Ask(_)));
        assert!(p.summary().contains("allow fs_write_file under /out"), "{}", p.summary());
        assert!(PolicyChange::Allow { tool: w.into(), under: Some("/a/../b".into()) }.checked().is_err());
        // Asking again undoes every allow of the tool; an allow everywhere takes out the ask.
        assert!(p.apply(&PolicyChange::Ask { tool: w.into() }));
        assert!(p.allow_under.is_empty() && p.ask_tools == [w]);
        assert!(asks(&p, r#"{"path":"/out/report.md"}"#));
        assert!(p.apply(&PolicyChange::Allow { tool: w.into(), under: None }));
        assert!(p.ask_tools.is_empty() && p.allow_tools == [w]);
        assert_eq!(call_directory(r#"{"path":"/out/r.md"}"#).as_deref(), Some("/out"));
        assert_eq!(call_directory(r#"{"path":"/r.md"}"#).as_deref(), Some("/"));
        assert_eq!(call_directory(r#"{"text":"x"}"#), None);
    }
}
