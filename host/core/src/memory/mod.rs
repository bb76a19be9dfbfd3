//! Long-term memory: what a user asked keel to remember, owned here, by user.
//!
//! A memory belongs to a user (a session's `user`, `keel run --user`), never to a session:
//! one written in one session is recalled in another session of the same user, and never in a
//! session of another user. Memory text is untrusted content, like skill text: it informs the
//! model, it grants nothing. A full-text index (`memories_fts`, FTS5 with bm25) follows the
//! table by triggers.

use crate::sql::{Backend, Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::search::Scored;
use crate::store::{StoreError, now_ms};

/// Characters of one memory, at most.
pub const MAX_TEXT: usize = 2000;
/// Tags of one memory, at most.
pub const MAX_TAGS: usize = 8;
/// Characters of one tag, at most.
pub const MAX_TAG: usize = 40;
/// Characters of a user name, at most.
pub const MAX_USER: usize = 64;
/// Memories recalled into a request's "relevant memory" block, at most.
pub const RECALLED: usize = 8;

/// One remembered fact.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Memory {
    pub id: i64,
    pub user: String,
    pub text: String,
    pub tags: Vec<String>,
    pub at_ms: i64,
    /// The session that wrote it (none when added with `keel memory add`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// What a user (and token) name may be, for error messages.
pub const USER_NAME_RULE: &str = "ASCII letters, digits, `-`, `_` and `.` (at most 64)";

/// Checks a user name: [`USER_NAME_RULE`]. ASCII only, so no two names look alike (a Cyrillic
/// `а` beside a Latin `a`, a fullwidth letter) and a person reading a record knows who it is.
pub fn valid_user(user: &str) -> bool {
    !user.is_empty()
        && user.len() <= MAX_USER
        && user.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// The user a session belongs to when none is named: the operating-system user (`USER`, else
/// `LOGNAME`), else `default`.
pub fn default_user() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .filter_map(|k| std::env::var(k).ok())
        .find(|u| valid_user(u))
        .unwrap_or_else(|| "default".to_string())
}

/// The kinds of principal a session works for, and whose memories it recalls. A name means
/// one principal only within its kind: the CLI's user `local:alice` and the API token
/// `token:alice` share no sessions and no memories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A user of this machine (the CLI, `keel mcp serve`, a library caller).
    Local,
    /// An API token of `keel serve`.
    Token,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Self::Local => "local:",
            Self::Token => "token:",
        }
    }
}

/// `name` as a typed principal: kept when it is typed already (`local:NAME`, `token:NAME`),
/// else given `kind`. The name itself is checked by [`valid_principal`] where it is stored.
pub fn typed(name: &str, kind: Kind) -> String {
    if [Kind::Local, Kind::Token].iter().any(|k| name.starts_with(k.prefix())) {
        name.to_string()
    } else {
        format!("{}{name}", kind.prefix())
    }
}

/// Whether `principal` is a typed principal with a valid name.
pub fn valid_principal(principal: &str) -> bool {
    [Kind::Local, Kind::Token]
        .iter()
        .any(|k| principal.strip_prefix(k.prefix()).is_some_and(valid_user))
}

/// Checks a memory's text and tags; returns them trimmed.
pub fn check(text: &str, tags: &[String]) -> Result<(String, Vec<String>), String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("the memory is empty: say what to remember".into());
    }
    let n = text.chars().count();
    if n > MAX_TEXT {
        return Err(format!("the memory is {n} characters, over {MAX_TEXT}: remember less"));
    }
    if tags.len() > MAX_TAGS {
        return Err(format!("{} tags, over {MAX_TAGS}", tags.len()));
    }
    let mut out: Vec<String> = Vec::new();
    for t in tags {
        let t = t.trim();
        if t.is_empty() || t.chars().count() > MAX_TAG || t.chars().any(char::is_control) {
            return Err(format!("a tag must be 1 to {MAX_TAG} printable characters"));
        }
        if !out.iter().any(|o| o == t) {
            out.push(t.to_string());
        }
    }
    Ok((text.to_string(), out))
}

/// Stores a memory of `user`; with `call` (a session and call id), at most once per call —
/// a call's result may be written more than once, its memory is not. Returns its id.
pub fn add_in(
    c: &Connection,
    user: &str,
    text: &str,
    tags: &[String],
    call: Option<(&str, &str)>,
) -> Result<i64, StoreError> {
    let user = &typed(user, Kind::Local);
    if !valid_principal(user) {
        return Err(StoreError::Input(format!(
            "the user `{user}` is not valid: local:NAME or token:NAME, the name of {USER_NAME_RULE}"
        )));
    }
    let (text, tags) = check(text, tags).map_err(StoreError::Input)?;
    if let Some((session, call_id)) = call
        && let Some(id) = c
            .prepare_cached("SELECT id FROM memories WHERE session_id=?1 AND call_id=?2")?
            .query_row(params![session, call_id], |r| r.get(0))
            .optional()?
    {
        return Ok(id);
    }
    let tags = serde_json::to_string(&tags).map_err(|e| StoreError::Input(e.to_string()))?;
    Ok(c.prepare_cached(
        "INSERT INTO memories (\"user\", text, tags, at_ms, session_id, call_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING id",
    )?
    .query_row(params![user, text, tags, now_ms(), call.map(|c| c.0), call.map(|c| c.1)], |r| {
        r.get(0)
    })?)
}

fn row(r: &crate::sql::Row<'_>) -> crate::sql::Result<Memory> {
    let tags: String = r.get(3)?;
    Ok(Memory {
        id: r.get(0)?,
        user: r.get(1)?,
        text: r.get(2)?,
        tags: serde_json::from_str(&tags).map_err(|e| crate::sql::Error::conversion(3, e))?,
        at_ms: r.get(4)?,
        session_id: r.get(5)?,
    })
}

/// The memories of `user` (of every user when `None`), oldest first. Here and in every
/// function of this module, a user named without a kind is a local one (`alice` is
/// `local:alice`).
pub fn list_in(c: &Connection, user: Option<&str>) -> Result<Vec<Memory>, StoreError> {
    let user = user.map(|u| typed(u, Kind::Local));
    let mut stmt = c.prepare_cached(
        "SELECT id, \"user\", text, tags, at_ms, session_id FROM memories
         WHERE CAST(?1 AS TEXT) IS NULL OR \"user\" = ?1 ORDER BY id",
    )?;
    let rows = stmt.query_map([user], row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Removes memory `id` of `user`.
pub fn remove_in(c: &Connection, user: &str, id: i64) -> Result<Memory, StoreError> {
    let user = &typed(user, Kind::Local);
    let found = c
        .prepare_cached(
            "SELECT id, \"user\", text, tags, at_ms, session_id FROM memories WHERE id=?1 AND \"user\"=?2",
        )?
        .query_row(params![id, user], row)
        .optional()?;
    let Some(m) = found else {
        return Err(StoreError::NotFound(format!("user `{user}` has no memory {id}")));
    };
    c.execute("DELETE FROM memories WHERE id=?1", [id])?;
    Ok(m)
}

/// The memories of `user` best matching `terms` (bm25 over text and tags), at most `limit`,
/// best first.
pub fn recall_in<S: AsRef<str>>(
    c: &Connection,
    user: &str,
    terms: &[S],
    limit: usize,
) -> Result<Vec<Scored<Memory>>, StoreError> {
    let user = &typed(user, Kind::Local);
    let (sql, query, min_rowid) = match c.backend() {
        Backend::Postgres => {
            let Some(query) = crate::search::ts_query(terms) else {
                return Ok(Vec::new());
            };
            let sql = "SELECT m.id, m.\"user\", m.text, m.tags, m.at_ms, m.session_id,
                        -ts_rank(m.fts, q) AS score
                 FROM memories m, to_tsquery('english', ?1) q
                 WHERE m.fts @@ q AND m.\"user\" = ?2 ORDER BY score, m.id DESC LIMIT ?3";
            (sql, query, None)
        }
        Backend::Sqlite => {
            let Some(plan) = crate::search::plan_in(
                c,
                "memories_fts",
                "memories_vocab",
                Some("{text tags}"),
                Some(crate::search::Scope {
                    join: "JOIN memories m ON m.id = memories_fts.rowid AND m.\"user\" = ?3",
                    owner: user,
                }),
                terms,
            )?
            else {
                return Ok(Vec::new());
            };
            let sql = "SELECT m.id, m.\"user\", m.text, m.tags, m.at_ms, m.session_id,
                        bm25(memories_fts, 0.0, 1.0, 2.0) AS score
                 FROM memories_fts JOIN memories m ON m.id = memories_fts.rowid
                 WHERE memories_fts MATCH ?1 AND memories_fts.rowid >= ?4 AND m.\"user\" = ?2
                 ORDER BY score LIMIT ?3";
            (sql, plan.query, Some(plan.min_rowid))
        }
    };
    let mut stmt = c.prepare_cached(sql)?;
    let scored = |r: &crate::sql::Row<'_>| Ok(Scored { item: row(r)?, score: r.get(6)? });
    let rows = match min_rowid {
        Some(min) => stmt.query_map(params![query, user, limit as i64, min], scored)?,
        None => stmt.query_map(params![query, user, limit as i64], scored)?,
    };
    Ok(rows.collect::<Result<_, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memories_and_users_are_checked() {
        assert!(valid_user("alice") && valid_user("a.b-c_d9"));
        assert!(
            // A Cyrillic `а`, accents, fullwidth letters, `@`.
            !valid_user("\u{430}lice")
                && !valid_user("Ünï")
                && !valid_user("\u{ff41}lice")
                && !valid_user("a@b")
                && !valid_user("")
                && !valid_user("a b")
                && !valid_user("a\u{1b}")
                && !valid_user(&"a".repeat(65))
        );
        assert!(check("  ", &[]).unwrap_err().contains("empty"));
        assert!(check(&"x".repeat(MAX_TEXT + 1), &[]).unwrap_err().contains("over"));
        let tags: Vec<String> = (0..9).map(|i| format!("t{i}")).collect();
        assert!(check("x", &tags).unwrap_err().contains("tags"));
        assert!(check("x", &["".into()]).is_err());
        let (text, tags) = check(" keep ", &["a".into(), "a".into(), " b ".into()]).unwrap();
        assert_eq!((text.as_str(), tags), ("keep", vec!["a".to_string(), "b".to_string()]));
    }

    #[test]
    fn principals_are_typed_and_one_name_is_two_principals() {
        assert_eq!(typed("alice", Kind::Local), "local:alice");
        assert_eq!(typed("alice", Kind::Token), "token:alice");
        assert_eq!(typed("token:alice", Kind::Local), "token:alice");
        assert!(valid_principal("local:alice") && valid_principal("token:a.b-c"));
        assert!(!valid_principal("alice") && !valid_principal("other:alice"));
        assert!(!valid_principal("local:a b") && !valid_principal("local:"));
        let dir = tempfile::tempdir().unwrap();
        let c = crate::store::open(&dir.path().join("keel.db")).unwrap();
        add_in(&c, "alice", "local fact", &[], None).unwrap();
        add_in(&c, "token:alice", "token fact", &[], None).unwrap();
        let local = list_in(&c, Some("alice")).unwrap();
        assert_eq!((local.len(), local[0].user.as_str()), (1, "local:alice"));
        assert_eq!(recall_in(&c, "token:alice", &["fact"], 8).unwrap().len(), 1);
        assert!(remove_in(&c, "alice", local[0].id + 1).is_err(), "not alice's own");
    }
}
