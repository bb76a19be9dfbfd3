//! What a caller is shown of the host. The operator and admins see everything; a user sees
//! names, not where things are: a grant's guest path and access but not its host directory, a
//! component's name and digest but not where it was installed from (an MCP server's command
//! line or URL, which may carry a credential), a session's model by name but not its server's
//! address. Every front-end shows sessions, approvals, presets and tools through these
//! functions only, so the rule is the core's, once.

use serde_json::{Value, json};

use crate::caller::Caller;
use crate::grant::Grant;
use crate::meta::SessionMeta;
use crate::tools::ComponentRecord;

/// Grants: whole for an admin, `{guest, access}` for a user.
pub fn grants(caller: &Caller, grants: &[Grant]) -> Value {
    if caller.is_admin() {
        json!(grants)
    } else {
        grants.iter().map(|g| json!({"guest": g.guest, "access": g.access})).collect()
    }
}

/// A component record: without its `source` for a user.
pub fn component(caller: &Caller, c: &ComponentRecord) -> Value {
    let mut v = json!(c);
    if !caller.is_admin()
        && let Some(o) = v.as_object_mut()
    {
        o.remove("source");
    }
    v
}

/// The host details of a session a user is not shown, each with what they see in its place:
/// a model server's address (and its host and port) as `[model server]`, a grant's host
/// directory as its guest path. Applied to every text a user is shown of a session — its state
/// detail, its timeline, its events, a failure naming a grant — so that an error quoting one
/// does not show it. Empty for an admin.
pub struct Hidden(Vec<(String, String)>);

/// What a user sees in place of a model server's address.
pub const MODEL_SERVER: &str = "[model server]";

impl Hidden {
    /// The host details of models `models` and grants `grants`, for `caller`.
    pub fn new(caller: &Caller, models: &[&crate::model::ModelConfig], grants: &[Grant]) -> Self {
        if caller.is_admin() {
            return Self(Vec::new());
        }
        let mut pairs = Vec::new();
        for m in models {
            let url = m.base_url.trim_end_matches('/');
            pairs.push((url.to_string(), MODEL_SERVER.to_string()));
            let authority = url.split_once("://").map_or(url, |(_, rest)| rest);
            let authority = authority.split('/').next().unwrap_or_default();
            pairs.push((authority.to_string(), MODEL_SERVER.to_string()));
        }
        for g in grants {
            pairs.push((g.host.display().to_string(), g.guest.clone()));
        }
        // Nothing too short to be a detail (a grant of `/`, an empty address) is replaced.
        pairs.retain(|(k, _)| k.len() >= 4);
        pairs.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
        pairs.dedup_by(|a, b| a.0 == b.0);
        Self(pairs)
    }

    /// The host details of session `meta` (its model, its task understanding's, its grants).
    pub fn of_session(caller: &Caller, meta: &SessionMeta) -> Self {
        let mut models = vec![&meta.config.model];
        if let Some(p) = &meta.config.preprocess {
            models.push(&p.model);
        }
        Self::new(caller, &models, &meta.config.grants)
    }

    /// Whether nothing is hidden (an admin's view).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `text` with every hidden detail replaced.
    pub fn text<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        let mut out = std::borrow::Cow::Borrowed(text);
        for (detail, shown) in &self.0 {
            if out.contains(detail.as_str()) {
                out = std::borrow::Cow::Owned(out.replace(detail.as_str(), shown));
            }
        }
        out
    }

    /// Every string in `v` with the hidden details replaced.
    pub fn value(&self, v: &mut Value) {
        if self.is_empty() {
            return;
        }
        match v {
            Value::String(s) => {
                if let std::borrow::Cow::Owned(o) = self.text(s) {
                    *s = o;
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.value(x)),
            Value::Object(o) => o.values_mut().for_each(|x| self.value(x)),
            _ => {}
        }
    }
}

/// A session's settings: for a user, its grants without host directories and its model (and
/// task understanding's) without the server's address — in its state detail too.
pub fn session(caller: &Caller, meta: &SessionMeta) -> Value {
    let mut v = json!(meta);
    if !caller.is_admin() {
        Hidden::of_session(caller, meta).value(&mut v);
        v["grants"] = grants(caller, &meta.config.grants);
        for model in ["/model", "/preprocess/model"] {
            if let Some(o) = v.pointer_mut(model).and_then(Value::as_object_mut) {
                o.remove("base_url");
            }
        }
    }
    v
}

/// A session's timeline: its grants and its approvals' grants without host directories for a
/// user.
pub fn timeline(caller: &Caller, t: &crate::views::Timeline) -> Value {
    let mut v = json!(t);
    if !caller.is_admin() {
        // Its state detail, messages, tool results and events may quote a host detail.
        Hidden::new(caller, &[&t.model], &t.grants).value(&mut v);
        v["grants"] = grants(caller, &t.grants);
        if let Some(o) = v.pointer_mut("/model").and_then(Value::as_object_mut) {
            o.remove("base_url");
        }
        // An earlier model server is a host detail too.
        for c in v.get_mut("settings_changes").and_then(Value::as_array_mut).into_iter().flatten() {
            for side in ["from", "to"] {
                if let Some(o) = c.get_mut(side).and_then(Value::as_object_mut) {
                    o.remove("base_url");
                }
            }
        }
        if let Some(units) = v.get_mut("approvals").and_then(Value::as_array_mut) {
            for u in units {
                *u = approval(caller, u.take());
            }
        }
    }
    v
}

/// An approval unit (as JSON): for a user, the grants in force without host directories.
pub fn approval(caller: &Caller, mut unit: Value) -> Value {
    if !caller.is_admin()
        && let Some(gs) = unit.get_mut("grants").and_then(Value::as_array_mut)
    {
        for g in gs {
            if let Some(o) = g.as_object_mut() {
                o.remove("host");
                o.remove("id");
                o.remove("within");
            }
        }
    }
    unit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_see_names_and_admins_see_where() {
        let dir = tempfile::tempdir().unwrap();
        let g = Grant::new(dir.path(), "/work", crate::grant::Access::Rw).unwrap();
        let host = g.host.display().to_string();
        let user = Caller::Api(crate::caller::Principal {
            name: "u".into(),
            role: crate::caller::Role::User,
            source: crate::caller::Source::Token,
        });
        assert!(grants(&Caller::Operator, std::slice::from_ref(&g)).to_string().contains(&host));
        let shown = grants(&user, std::slice::from_ref(&g));
        assert!(!shown.to_string().contains(&host));
        assert_eq!(shown[0]["guest"], "/work");
        let unit = approval(&user, json!({"grants": [json!(g)], "tool": "t"}));
        assert!(!unit.to_string().contains(&host) && unit["tool"] == "t");
        let admin = approval(&Caller::Operator, json!({"grants": [json!(g)]}));
        assert!(admin.to_string().contains(&host));
    }

    #[test]
    fn a_user_is_not_shown_a_host_detail_quoted_in_a_text() {
        let dir = tempfile::tempdir().unwrap();
        let g = Grant::new(dir.path(), "/work", crate::grant::Access::Rw).unwrap();
        let host = g.host.display().to_string();
        let model = crate::model::ModelConfig::new("http://10.0.0.5:8080/v1", "m");
        let user = Caller::Api(crate::caller::Principal {
            name: "u".into(),
            role: crate::caller::Role::User,
            source: crate::caller::Source::Token,
        });
        let hidden = Hidden::new(&user, &[&model], std::slice::from_ref(&g));
        let mut v = json!({"state_detail": "cannot reach http://10.0.0.5:8080/v1/chat/completions \
            (10.0.0.5:8080: connection refused)", "events": [format!("{host}/a.txt moved")]});
        hidden.value(&mut v);
        let text = v.to_string();
        assert!(!text.contains("10.0.0.5") && !text.contains(&host), "{text}");
        assert!(text.contains("[model server]/chat/completions") && text.contains("/work/a.txt"));
        let admin = Hidden::new(&Caller::Operator, &[&model], std::slice::from_ref(&g));
        assert!(admin.is_empty() && admin.text(&host) == host);
    }
}
