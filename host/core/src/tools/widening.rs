//! What an upgrade widens: a tool whose effect class rises, a tool the old version did not
//! have, an interface that carries authority imported now and not before. An upgrade that
//! widens anything needs the admin's explicit word ([`super::InstallMode::UpgradeWider`]);
//! one that narrows or keeps what was there does not.

use crate::policy::Effect;

use super::ToolRecord;

/// The import packages that carry authority: the network, the filesystem, and keel's control
/// interfaces. (Clocks, random, streams and the CLI worlds' plumbing do not.)
const AUTHORITY: [&str; 4] = ["wasi:http/", "wasi:sockets/", "wasi:filesystem/", "keel:control/"];

/// One tool's effect class, before and after.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EffectChange {
    pub tool: String,
    pub old: Effect,
    pub new: Effect,
}

/// What an upgrade widens (empty: nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Widening {
    /// Tools whose effect class rose.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub effects: Vec<EffectChange>,
    /// Interfaces carrying authority that it imports now and did not before (versionless).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub imports: Vec<String>,
    /// Tools it offers now and did not before.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
}

fn rank(e: Effect) -> u8 {
    match e {
        Effect::ReadOnly => 0,
        Effect::WorkspaceWrite => 1,
        Effect::External => 2,
        Effect::Destructive => 3,
    }
}

/// `wasi:http/outgoing-handler@0.2.3` → `wasi:http/outgoing-handler`, when it carries authority.
fn authority(import: &str) -> Option<String> {
    let name = import.split('@').next().unwrap_or(import);
    AUTHORITY.iter().any(|p| name.starts_with(p)).then(|| name.to_string())
}

impl Widening {
    /// What going from `old` (its tools and imports) to `new` widens.
    pub fn between(
        old_tools: &[ToolRecord],
        new_tools: &[ToolRecord],
        old_imports: &[String],
        new_imports: &[String],
    ) -> Self {
        let mut w = Self::default();
        for t in new_tools {
            match old_tools.iter().find(|o| o.name == t.name) {
                None => w.tools.push(t.name.clone()),
                Some(o) if rank(t.effect) > rank(o.effect) => w.effects.push(EffectChange {
                    tool: t.name.clone(),
                    old: o.effect,
                    new: t.effect,
                }),
                Some(_) => {}
            }
        }
        let before: Vec<String> = old_imports.iter().filter_map(|i| authority(i)).collect();
        for i in new_imports.iter().filter_map(|i| authority(i)) {
            if !before.contains(&i) && !w.imports.contains(&i) {
                w.imports.push(i);
            }
        }
        w
    }

    pub fn is_empty(&self) -> bool {
        self.effects.is_empty() && self.imports.is_empty() && self.tools.is_empty()
    }

    /// One line per widening, old → new.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .effects
            .iter()
            .map(|c| format!("tool `{}`: effect {} → {}", c.tool, c.old, c.new))
            .collect();
        out.extend(self.imports.iter().map(|i| format!("imports {i} (not before)")));
        out.extend(self.tools.iter().map(|t| format!("new tool `{t}`")));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, effect: Effect) -> ToolRecord {
        ToolRecord {
            name: name.into(),
            component: "c".into(),
            description: String::new(),
            input_schema: serde_json::json!({}),
            output_schema: None,
            effect,
            idempotent: false,
            spec_digest: String::new(),
        }
    }

    #[test]
    fn effects_that_rise_new_tools_and_authority_imports_widen_and_nothing_else_does() {
        let old = [tool("read", Effect::ReadOnly), tool("put", Effect::External)];
        let new = [
            tool("read", Effect::External),
            tool("put", Effect::WorkspaceWrite),
            tool("wipe", Effect::Destructive),
        ];
        let old_imports =
            ["wasi:io/streams@0.2.0".to_string(), "wasi:filesystem/types@0.2.0".into()];
        let new_imports = [
            "wasi:io/streams@0.2.6".to_string(),
            "wasi:filesystem/types@0.2.6".into(),
            "wasi:http/outgoing-handler@0.2.6".into(),
            "wasi:random/random@0.2.6".into(),
        ];
        let w = Widening::between(&old, &new, &old_imports, &new_imports);
        assert_eq!(
            w.lines(),
            vec![
                "tool `read`: effect read-only → external".to_string(),
                "imports wasi:http/outgoing-handler (not before)".into(),
                "new tool `wipe`".into(),
            ]
        );
        let narrower = [tool("read", Effect::ReadOnly)];
        let same = Widening::between(&new, &narrower, &new_imports, &old_imports[..1]);
        assert!(same.is_empty(), "narrowing widens nothing: {same:?}");
    }
}
