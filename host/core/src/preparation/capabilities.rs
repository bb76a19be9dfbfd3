//! The capabilities a session has loaded — tools and skills — and how each arrived (the
//! orchestration record of each turn that prepared them is `orchestration.rs`).
//!
//! `add_in` is AddSelectedCapabilities, the only way capabilities are added after a
//! session's creation (by the Orchestrator, `skills_load`, `tools_select`, or an admin): it
//! keeps what is loaded, adds only, pins what it adds (a tool to its component's digest, a
//! skill to its content's), and never touches goals, model or identity. `unload_in` is the
//! explicit removal path (`keel session unload`).

use crate::sql::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::memory::Memory;
use crate::skills::SkillRef;
use crate::store::{StoreError, now_ms};

use crate::session::events::{self, SessionEvent};

pub use crate::session::events::{CapabilityKind as Kind, Via};

/// One loaded capability and how it arrived.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Capability {
    pub kind: Kind,
    pub name: String,
    pub via: Via,
    /// The turn it arrived in (none: at the session's creation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn: Option<i64>,
    pub at_ms: i64,
    /// A skill's pinned content digest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The call that loaded it (`skills_load`, `tools_select`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
}

/// A skill loaded in a session, at the version it loaded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadedSkill {
    pub name: String,
    pub description: String,
    pub digest: String,
    /// The first page of its body (what a request shows).
    pub shown: String,
    /// Bytes of the whole body.
    pub body_bytes: usize,
}

/// What a session has loaded: its tools (with the digest each is pinned to), its skills, and
/// what the last orchestration found and recalled. Changed only by `add_in` and
/// `unload_in` (and an upgrade of pins); read by `loaded_in`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadedCapabilities {
    pub loaded_tools: Vec<String>,
    /// The skills the session loaded, at the versions it loaded.
    pub skills: Vec<LoadedSkill>,
    /// Skills the last orchestration found and did not load (named in requests by name and
    /// description only).
    pub found_skills: Vec<SkillRef>,
    /// The user's memories the last orchestration recalled (a request's "relevant memory").
    pub memories: Vec<Memory>,
    /// The component digest of each loaded tool, pinned when it was loaded: the session runs
    /// those versions, even after an upgrade, until it is told to upgrade. A tool without a
    /// pin (a session older than pins) runs the installed version.
    pub tool_pins: std::collections::BTreeMap<String, String>,
}

const TOOLS: &str = "SELECT loaded_tools, tool_pins FROM session_config WHERE session_id=?1";
const SKILLS: &str = "SELECT v.name, v.description, v.digest, substr(v.body, 1, ?2),
        octet_length(v.body)
     FROM session_capabilities s JOIN skill_versions v ON v.digest = s.digest
     WHERE s.session_id=?1 AND s.kind='skill' ORDER BY v.name";

/// Sends the reads of [`tools_in`] and [`skills_in`] ahead (see [`Connection::prefetch`]).
pub(super) fn prefetch_loaded_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    c.prefetch(TOOLS, [id])?;
    c.prefetch(SKILLS, params![id, crate::skills::BODY_SHOWN as i64])?;
    Ok(())
}

/// The tools and their pins session `id` has loaded.
pub(super) fn tools_in(
    c: &Connection,
    id: &str,
) -> Result<(Vec<String>, crate::tools::ToolPins), StoreError> {
    let (tools, pins): (String, String) = c
        .prepare_cached(TOOLS)?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .ok_or_else(|| crate::session::no_session(id))?;
    Ok((crate::session::parse(&tools, "tool list")?, crate::session::parse(&pins, "tool pins")?))
}

/// The one writer of session `id`'s loaded tools and their pins.
fn set_tools_in(
    c: &Connection,
    id: &str,
    loaded: &[String],
    pins: &crate::tools::ToolPins,
) -> Result<(), StoreError> {
    c.prepare_cached(
        "UPDATE session_config SET loaded_tools=?2, tool_pins=?3 WHERE session_id=?1",
    )?
    .execute(params![id, crate::store::json(&loaded)?, crate::store::json(pins)?])?;
    Ok(())
}

/// Pins session `id`'s loaded tools to component digests: `pins` holds the digest each tool
/// resolves to now. Without `upgrade` only tools not pinned yet are pinned (what a session
/// loaded it keeps); with it every given pin replaces the old one. Returns the pins that
/// changed, as (tool, old digest, new digest).
pub(crate) fn pin_in(
    c: &Connection,
    id: &str,
    pins: crate::tools::ToolPins,
    upgrade: bool,
) -> Result<Vec<(String, Option<String>, String)>, StoreError> {
    let (loaded, mut current) = tools_in(c, id)?;
    let mut changed = Vec::new();
    for (tool, digest) in pins {
        if !loaded.contains(&tool) {
            continue;
        }
        let old = current.get(&tool).cloned();
        if old.as_deref() == Some(digest.as_str()) || (old.is_some() && !upgrade) {
            continue;
        }
        current.insert(tool.clone(), digest.clone());
        changed.push((tool, old, digest));
    }
    if !changed.is_empty() {
        set_tools_in(c, id, &loaded, &current)?;
    }
    Ok(changed)
}

/// What to add: tool sets (components, every tool of each), single tools, skills — by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Selection {
    pub toolsets: Vec<String>,
    pub tools: Vec<String>,
    pub skills: Vec<String>,
}

impl Selection {
    pub fn is_empty(&self) -> bool {
        self.toolsets.is_empty() && self.tools.is_empty() && self.skills.is_empty()
    }
}

/// What `add_in` added (what was loaded already, or is not installed, is not in it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Added {
    pub tools: Vec<String>,
    pub skills: Vec<String>,
    /// Names that are not installed (any more), left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
}

impl Added {
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty() && self.skills.is_empty()
    }
}

/// AddSelectedCapabilities: adds `selection` to session `id`, add-only, pinned, in the
/// caller's transaction. `turn` and `call_id` say where it came from.
pub(crate) fn add_in(
    c: &Connection,
    id: &str,
    selection: &Selection,
    via: Via,
    turn: Option<i64>,
    call_id: Option<&str>,
) -> Result<Added, StoreError> {
    let (mut loaded, mut pins) = tools_in(c, id)?;
    let mut added = Added::default();
    let mut wanted: Vec<String> = Vec::new();
    for set in &selection.toolsets {
        let mut stmt =
            c.prepare_cached("SELECT name FROM tools WHERE component=?1 ORDER BY name")?;
        let tools: Vec<String> = stmt.query_map([set], |r| r.get(0))?.collect::<Result<_, _>>()?;
        if tools.is_empty() {
            added.missing.push(set.clone());
        }
        wanted.extend(tools);
    }
    wanted.extend(selection.tools.iter().cloned());
    let at = now_ms();
    for tool in wanted {
        if loaded.contains(&tool) {
            continue;
        }
        let digest: Option<String> = c
            .prepare_cached(
                "SELECT c.digest FROM tools t JOIN components c ON c.name = t.component
                 WHERE t.name = ?1",
            )?
            .query_row([&tool], |r| r.get(0))
            .optional()?;
        match digest {
            Some(digest) => {
                pins.entry(tool.clone()).or_insert(digest);
            }
            // An admin's addition was resolved by ToolService, host tools included (they are
            // not in the catalog's tables, and run as registered: nothing to pin).
            None if via == Via::Admin => {}
            None => {
                added.missing.push(tool);
                continue;
            }
        }
        loaded.push(tool.clone());
        insert(c, id, Kind::Tool, &tool, via, turn, at, None, call_id)?;
        added.tools.push(tool);
    }
    let have: Vec<String> = skills_in(c, id)?.into_iter().map(|s| s.name).collect();
    for skill in &selection.skills {
        if have.contains(skill) || added.skills.contains(skill) {
            continue;
        }
        let digest: Option<String> = c
            .prepare_cached("SELECT digest FROM skills WHERE name=?1")?
            .query_row([skill], |r| r.get(0))
            .optional()?;
        let Some(digest) = digest else {
            added.missing.push(skill.clone());
            continue;
        };
        insert(c, id, Kind::Skill, skill, via, turn, at, Some(&digest), call_id)?;
        added.skills.push(skill.clone());
    }
    if !added.tools.is_empty() {
        set_tools_in(c, id, &loaded, &pins)?;
    }
    if !added.is_empty() {
        events::append(
            c,
            id,
            &SessionEvent::CapabilitiesAdded {
                via,
                tools: added.tools.clone(),
                skills: added.skills.clone(),
            },
        )?;
    }
    Ok(added)
}

/// The creation reaction (see [`crate::session::reactions`]): records how each tool session
/// `id` was created with arrived.
pub(crate) fn on_create(
    c: &Connection,
    id: &str,
    new: &crate::session::NewSession,
) -> Result<(), StoreError> {
    let origins: Vec<(String, Via)> = new
        .tools
        .iter()
        .map(|t| {
            let via = if new.named_tools && !crate::builtin::ALWAYS_LOADED.contains(&t.as_str()) {
                Via::Flag
            } else {
                Via::Default
            };
            (t.clone(), via)
        })
        .collect();
    created_in(c, id, &origins)
}

/// Records how the tools a session was created with arrived.
pub(crate) fn created_in(
    c: &Connection,
    id: &str,
    tools: &[(String, Via)],
) -> Result<(), StoreError> {
    let at = now_ms();
    for (tool, via) in tools {
        insert(c, id, Kind::Tool, tool, *via, None, at, None, None)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn insert(
    c: &Connection,
    id: &str,
    kind: Kind,
    name: &str,
    via: Via,
    turn: Option<i64>,
    at_ms: i64,
    digest: Option<&str>,
    call_id: Option<&str>,
) -> Result<(), StoreError> {
    c.prepare_cached(
        "INSERT INTO session_capabilities
             (session_id, kind, name, via, turn, at_ms, digest, call_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT DO NOTHING",
    )?
    .execute(params![id, kind, name, via, turn, at_ms, digest, call_id])?;
    Ok(())
}

/// Removes a loaded tool or skill from session `id` (the explicit unload path). The tools
/// every session keeps (control and discovery) cannot be unloaded.
pub(crate) fn unload_in(
    c: &Connection,
    id: &str,
    kind: Kind,
    name: &str,
) -> Result<(), StoreError> {
    let (loaded, mut pins) = tools_in(c, id)?;
    match kind {
        Kind::Tool => {
            if crate::builtin::ALWAYS_LOADED.contains(&name) {
                return Err(StoreError::Input(format!(
                    "`{name}` is always loaded: the control and discovery tools stay with every session"
                )));
            }
            if !loaded.iter().any(|t| t == name) {
                return Err(StoreError::NotFound(format!(
                    "session `{id}` has no tool `{name}` loaded"
                )));
            }
            let loaded: Vec<String> = loaded.into_iter().filter(|t| t != name).collect();
            pins.remove(name);
            set_tools_in(c, id, &loaded, &pins)?;
        }
        Kind::Skill => {}
    }
    let removed = c.execute(
        "DELETE FROM session_capabilities WHERE session_id=?1 AND kind=?2 AND name=?3",
        params![id, kind, name],
    )?;
    if removed == 0 && kind == Kind::Skill {
        return Err(StoreError::NotFound(format!("session `{id}` has no skill `{name}` loaded")));
    }
    events::append(
        c,
        id,
        &SessionEvent::CapabilityUnloaded { capability: kind, name: name.to_string() },
    )?;
    Ok(())
}

/// Every capability of session `id` with how it arrived, in the order they arrived.
pub fn of_session(c: &Connection, id: &str) -> Result<Vec<Capability>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT kind, name, via, turn, at_ms, digest, call_id FROM session_capabilities
         WHERE session_id=?1 ORDER BY at_ms, kind, name",
    )?;
    let rows = stmt.query_map([id], |r| {
        Ok(Capability {
            kind: r.get(0)?,
            name: r.get(1)?,
            via: r.get(2)?,
            turn: r.get(3)?,
            at_ms: r.get(4)?,
            digest: r.get(5)?,
            call_id: r.get(6)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The skills session `id` has loaded, by name, at the versions it loaded.
pub(crate) fn skills_in(c: &Connection, id: &str) -> Result<Vec<LoadedSkill>, StoreError> {
    let mut stmt = c.prepare_cached(SKILLS)?;
    let rows = stmt.query_map(params![id, crate::skills::BODY_SHOWN as i64], |r| {
        let body: String = r.get(3)?;
        Ok(LoadedSkill {
            name: r.get(0)?,
            description: r.get(1)?,
            digest: r.get(2)?,
            shown: crate::skills::page(&body, 0).0.to_string(),
            body_bytes: r.get::<_, i64>(4)? as usize,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}
