//! What a caller is shown of the host. Admins see everything; a user sees names, not where
//! things are: a grant's guest path and access but not its host directory, a component's name
//! and digest but not where it was installed from (an MCP server's command line or URL, which
//! may carry a credential), a session's model by name but not its server's address. The API
//! and the console show sessions, approvals, presets and tools through these functions only.

use serde_json::{Value, json};

use keel::sandbox::Grant;
use keel::session::SessionMeta;
use keel::tools::ComponentRecord;

/// Grants: whole for an admin, `{guest, access}` for a user.
pub fn grants(admin: bool, grants: &[Grant]) -> Value {
    if admin {
        json!(grants)
    } else {
        grants.iter().map(|g| json!({"guest": g.guest, "access": g.access})).collect()
    }
}

/// A component record: without its `source` for a user.
pub fn component(admin: bool, c: &ComponentRecord) -> Value {
    let mut v = json!(c);
    if !admin && let Some(o) = v.as_object_mut() {
        o.remove("source");
    }
    v
}

/// A session's settings: for a user, its grants without host directories and its model (and
/// task understanding's) without the server's address.
pub fn session(admin: bool, meta: &SessionMeta) -> Value {
    let mut v = json!(meta);
    if !admin {
        v["grants"] = grants(false, &meta.grants);
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
pub fn timeline(admin: bool, t: &keel::session::Timeline) -> Value {
    let mut v = json!(t);
    if !admin {
        v["grants"] = grants(false, &t.grants);
        if let Some(units) = v.get_mut("approvals").and_then(Value::as_array_mut) {
            for u in units {
                *u = approval(false, u.take());
            }
        }
    }
    v
}

/// An approval unit (as JSON): for a user, the grants in force without host directories.
pub fn approval(admin: bool, mut unit: Value) -> Value {
    if !admin && let Some(gs) = unit.get_mut("grants").and_then(Value::as_array_mut) {
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
        let g = Grant::new(dir.path(), "/work", keel::sandbox::Access::Rw).unwrap();
        let host = g.host.display().to_string();
        assert!(grants(true, std::slice::from_ref(&g)).to_string().contains(&host));
        let user = grants(false, std::slice::from_ref(&g));
        assert!(!user.to_string().contains(&host));
        assert_eq!(user[0]["guest"], "/work");
        let unit = approval(false, json!({"grants": [json!(g)], "tool": "t"}));
        assert!(!unit.to_string().contains(&host) && unit["tool"] == "t");
        assert!(approval(true, json!({"grants": [json!(g)]})).to_string().contains(&host));
    }
}
