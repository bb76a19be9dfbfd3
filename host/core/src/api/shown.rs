//! What a caller is shown of the host. The operator and admins see everything; a user sees
//! names, not where things are: a grant's guest path and access but not its host directory, a
//! component's name and digest but not where it was installed from (an MCP server's command
//! line or URL, which may carry a credential), a session's model by name but not its server's
//! address. Every front-end shows sessions, approvals, presets and tools through these
//! functions only, so the rule is the core's, once.

use serde_json::{Value, json};

use crate::caller::Caller;
use crate::grant::Grant;
use crate::session::SessionMeta;
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

/// A session's settings: for a user, its grants without host directories and its model (and
/// task understanding's) without the server's address.
pub fn session(caller: &Caller, meta: &SessionMeta) -> Value {
    let mut v = json!(meta);
    if !caller.is_admin() {
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
pub fn timeline(caller: &Caller, t: &crate::session::Timeline) -> Value {
    let mut v = json!(t);
    if !caller.is_admin() {
        v["grants"] = grants(caller, &t.grants);
        if let Some(o) = v.pointer_mut("/model").and_then(Value::as_object_mut) {
            o.remove("base_url");
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
}
