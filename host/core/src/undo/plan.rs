//! What a rewind to a step would do, from the journal alone: for each path the calls after
//! the step changed, what was there before the first of them (what to put back) and what the
//! last of them left (what must be there now, or the path changed since and is a conflict);
//! and the calls whose effects no rewind can undo.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::policy::Effect;
use crate::session::{JournalEntry, JournalStatus};

/// What was at a path before the calls after the step: what a rewind puts back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Was {
    /// Nothing: a call after the step created it.
    Absent,
    /// A regular file: its content (a pre-image, by sha256) and permission bits.
    File { sha256: String, mode: u32 },
    /// A symbolic link, by its target.
    Link(String),
    /// A directory.
    Dir,
    /// Something that was not kept, and why.
    Lost(String),
}

/// What the last call after the step left at a path: what must be there now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Left {
    Absent,
    /// A regular file, by the sha256 of its content (`None`: too large to have been hashed).
    File(Option<String>),
    Link,
    Dir,
    Other,
    /// Not known: a rewind left it as it was then (it had changed since).
    Unknown,
}

/// One path of a rewind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPlan {
    pub was: Was,
    pub left: Left,
}

/// A call after the step whose effects a rewind does not undo, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotUndone {
    pub step: i64,
    pub call_id: String,
    pub tool: String,
    pub why: String,
}

/// What a rewind to a step undoes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// By guest path.
    pub paths: BTreeMap<String, PathPlan>,
    pub not_undone: Vec<NotUndone>,
}

/// A change set as the journal keeps it (the fields a rewind reads).
#[derive(Debug, Deserialize)]
struct SetRow {
    #[serde(default)]
    created: Vec<ChangeRow>,
    #[serde(default)]
    modified: Vec<ChangeRow>,
    #[serde(default)]
    deleted: Vec<ChangeRow>,
    #[serde(default = "yes")]
    complete: bool,
}

#[derive(Debug, Deserialize)]
struct ChangeRow {
    path: String,
    kind: String,
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default)]
    before_sha256: Option<String>,
    #[serde(default)]
    before_mode: Option<u32>,
    #[serde(default)]
    before_link: Option<String>,
    #[serde(default)]
    not_restorable: Option<String>,
}

fn yes() -> bool {
    true
}

impl ChangeRow {
    /// What this change found at its path (a modified or deleted object).
    fn was(&self) -> Was {
        if let Some(why) = &self.not_restorable {
            return Was::Lost(why.clone());
        }
        match self.kind.as_str() {
            "dir" => Was::Dir,
            "symlink" => match &self.before_link {
                Some(t) => Was::Link(t.clone()),
                None => Was::Lost("its link target was not kept".into()),
            },
            "file" => match &self.before_sha256 {
                Some(sha) => {
                    Was::File { sha256: sha.clone(), mode: self.before_mode.unwrap_or(0o644) }
                }
                None => Was::Lost("its content before the call was not kept".into()),
            },
            other => Was::Lost(format!("it was a {other}, which a rewind does not make")),
        }
    }

    /// What this change left at its path (a created or modified object).
    fn left(&self) -> Left {
        match self.kind.as_str() {
            "file" => Left::File(self.sha256.clone()),
            "dir" => Left::Dir,
            "symlink" => Left::Link,
            _ => Left::Other,
        }
    }
}

/// One change of one path, in the order they happened.
enum Op {
    /// A call (at `step`) found `was` there and left `left`.
    Call { step: i64, was: Was, left: Left },
    /// A rewind to step `to` put it back (`restored`), or left it as it was then.
    Rewind { to: i64, restored: bool },
}

/// The plan of a rewind of a session to step `to`, from every journal row of the session
/// (`calls`, oldest first) and the rewinds that ended before (`rewinds`, oldest first): for
/// each path a call after `to` changed, what the first of them found there (what to put
/// back) and what is there since — what the last call or rewind to touch it left.
pub fn plan(
    calls: &[(i64, JournalEntry)],
    rewinds: &[crate::session::PastRewind],
    to: i64,
) -> Result<Plan, String> {
    let mut plan = Plan::default();
    let mut history: BTreeMap<String, Vec<Op>> = BTreeMap::new();
    let mut rewinds = rewinds.iter().peekable();
    let mut place_rewinds = |before_step: i64, history: &mut BTreeMap<String, Vec<Op>>| {
        // The rewinds that ran after the calls up to `before_step - 1`.
        while let Some(r) = rewinds.next_if(|r| r.after_step < before_step) {
            for ops in history.values_mut() {
                ops.push(Op::Rewind { to: r.to, restored: false });
            }
            for path in &r.restored {
                if let Some(Some(Op::Rewind { restored, .. })) =
                    history.get_mut(path).map(|ops| ops.last_mut())
                {
                    *restored = true;
                }
            }
        }
    };
    for (step, e) in calls {
        place_rewinds(*step, &mut history);
        let after = *step > to;
        let mut not_undone = |why: &str| {
            if after {
                plan.not_undone.push(NotUndone {
                    step: *step,
                    call_id: e.call_id.to_string(),
                    tool: e.tool.clone(),
                    why: why.to_string(),
                })
            }
        };
        let writes = e.effect.is_some_and(|x| x != Effect::ReadOnly);
        if e.effect == Some(Effect::External) || e.net.is_some() {
            not_undone("it acted outside the grants (requests, messages, services)");
        }
        if e.status == JournalStatus::Unknown && writes {
            not_undone("its outcome is unknown (cut by a crash): what it changed was not recorded");
        }
        let Some(text) = &e.changes else { continue };
        let set: SetRow = serde_json::from_str(text).map_err(|err| {
            format!("the changes of call {} (step {step}) do not read: {err}", e.call_id)
        })?;
        if !set.complete {
            not_undone("its change set is incomplete (the walk of its grants stopped at a bound)");
        }
        // A path whose kind changed is in `deleted` (the old object) and `created` (the new):
        // one change, from what was deleted to what was created.
        let mut of_call: BTreeMap<&str, (Was, Left)> = BTreeMap::new();
        for c in &set.deleted {
            of_call.insert(&c.path, (c.was(), Left::Absent));
        }
        for c in &set.modified {
            of_call.insert(&c.path, (c.was(), c.left()));
        }
        for c in &set.created {
            let was = of_call.remove(c.path.as_str()).map_or(Was::Absent, |(w, _)| w);
            of_call.insert(&c.path, (was, c.left()));
        }
        for (path, (was, left)) in of_call {
            history.entry(path.to_string()).or_default().push(Op::Call { step: *step, was, left });
        }
    }
    place_rewinds(i64::MAX, &mut history);
    for (path, ops) in history {
        // What the first call after the step found: what to put back.
        let first_after = |after: i64| {
            ops.iter().find_map(|op| match op {
                Op::Call { step, was, .. } if *step > after => Some(was.clone()),
                _ => None,
            })
        };
        let Some(was) = first_after(to) else { continue };
        let mut left = Left::Unknown;
        for op in &ops {
            left = match op {
                Op::Call { left, .. } => left.clone(),
                Op::Rewind { to, restored: true } => first_after(*to).map_or(left, |w| w.left()),
                Op::Rewind { restored: false, .. } => left,
            };
        }
        if was == Was::Absent && left == Left::Absent {
            // Made and removed again after the step: nothing to do.
            continue;
        }
        plan.paths.insert(path, PathPlan { was, left });
    }
    Ok(plan)
}

impl Was {
    /// What a rewind that put this back left.
    fn left(&self) -> Left {
        match self {
            Was::Absent => Left::Absent,
            Was::File { sha256, .. } => Left::File(Some(sha256.clone())),
            Was::Link(_) => Left::Link,
            Was::Dir => Left::Dir,
            Was::Lost(_) => Left::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::CallId;

    fn call(id: &str, effect: Effect, changes: serde_json::Value) -> JournalEntry {
        JournalEntry {
            call_id: CallId::from(id),
            position: 0,
            tool: "fs_write_file".into(),
            input: "{}".into(),
            component_digest: None,
            effect: Some(effect),
            status: JournalStatus::Done,
            result: None,
            error_kind: None,
            changes: Some(changes.to_string()),
            duration_ms: None,
            idempotent: false,
            approval_id: None,
            net: None,
            logs: None,
            control_requests: Vec::new(),
            kept: Default::default(),
        }
    }

    #[test]
    fn the_first_call_says_what_was_there_and_the_last_what_must_be_there() {
        let w = Effect::WorkspaceWrite;
        let calls = vec![
            (1, call("a", w, serde_json::json!({"complete": true,
                "created": [{"path": "/w/new.txt", "kind": "file", "size": 1, "sha256": "n1"}],
                "modified": [{"path": "/w/a.txt", "kind": "file", "size": 2, "sha256": "a1",
                              "before_sha256": "a0", "before_mode": 420}]}))),
            (2, call("b", w, serde_json::json!({"complete": true,
                "modified": [{"path": "/w/a.txt", "kind": "file", "size": 2, "sha256": "a2",
                              "before_sha256": "a1", "before_mode": 420},
                             {"path": "/w/big.bin", "kind": "file", "size": 9, "sha256": "b1",
                              "not_restorable": "over the bound"}],
                "deleted": [{"path": "/w/new.txt", "kind": "file", "size": 1,
                             "before_sha256": "n1", "before_mode": 420}]}))),
            (3, call("c", Effect::External, serde_json::json!({"complete": false}))),
        ];
        let p = plan(&calls, &[], 0).unwrap();
        assert_eq!(
            p.paths["/w/a.txt"],
            PathPlan {
                was: Was::File { sha256: "a0".into(), mode: 420 },
                left: Left::File(Some("a2".into()))
            }
        );
        assert_eq!(p.paths["/w/big.bin"].was, Was::Lost("over the bound".into()));
        assert!(!p.paths.contains_key("/w/new.txt"), "created and removed after the step");
        let why: Vec<&str> = p.not_undone.iter().map(|n| n.why.as_str()).collect();
        assert_eq!(why.len(), 2, "{why:?}");
        assert!(why[0].contains("outside the grants") && why[1].contains("incomplete"));
        // To step 1: only what step 2 changed; step 3's effects are not undone.
        let p = plan(&calls, &[], 1).unwrap();
        assert_eq!(
            p.paths["/w/a.txt"],
            PathPlan {
                was: Was::File { sha256: "a1".into(), mode: 420 },
                left: Left::File(Some("a2".into()))
            }
        );
        assert_eq!(p.paths["/w/new.txt"].was, Was::File { sha256: "n1".into(), mode: 420 });
        // After a rewind to step 1 (which put a.txt back to a1), a rewind to step 0 expects
        // a1 there, not what the last call left.
        let past = crate::session::PastRewind {
            to: 1,
            after_step: 3,
            restored: vec!["/w/a.txt".into()],
        };
        let p = plan(&calls, &[past], 0).unwrap();
        assert_eq!(p.paths["/w/a.txt"].left, Left::File(Some("a1".into())));
        assert_eq!(p.paths["/w/big.bin"].left, Left::File(Some("b1".into())), "not put back");
    }
}
