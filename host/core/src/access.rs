//! Who may use keel over the network: API tokens, each with a role, and the grant presets an
//! admin defines for users. Owns the `api_tokens` and `grant_presets` tables.
//!
//! A token is 32 random bytes shown once when it is made (`keel_` and 64 hex digits); only its
//! SHA-256 is stored, so a copy of the database lets nobody in. A token's name is the
//! principal's identity: it owns the sessions it creates, it is recorded as the decider of the
//! approvals it decides, and for a `user` token it is the user whose memory its sessions use.

use std::path::{Path, PathBuf};

use crate::sql::{Connection, OptionalExtension, params};

pub use crate::caller::{AccessError, ENV_TOKEN_NAME, Owner, Principal, Role, };
use crate::sandbox::{Access, Grant};
use crate::store::{StoreError, now_ms};

/// A stored token, without its secret.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TokenRecord {
    pub name: String,
    pub role: Role,
    pub created_at: i64,
}

/// Grants an admin named for users to use: a user creating a session names a preset instead
/// of host directories.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Preset {
    pub name: String,
    pub grants: Vec<Grant>,
    /// Whether the user who created a session with this preset may decide its approvals.
    pub user_decides: bool,
    pub created_at: i64,
}

impl From<AccessError> for StoreError {
    fn from(e: AccessError) -> Self {
        match e {
            AccessError::Exists(m) => StoreError::Conflict(m),
            AccessError::NotFound(m) => StoreError::NotFound(m),
            AccessError::Store(m) => StoreError::Task(m),
            other => StoreError::Input(other.to_string()),
        }
    }
}

/// The prefix of every token keel makes (so a leaked one is recognisable in a scan).
pub const TOKEN_PREFIX: &str = "keel_";

/// A new random token: [`TOKEN_PREFIX`] and 32 random bytes in hex.
pub fn new_token() -> Result<String, AccessError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| {
        AccessError::Store(format!("the operating system gave no random bytes: {e}"))
    })?;
    Ok(format!("{TOKEN_PREFIX}{}", hex::encode(bytes)))
}

/// The shortest token keel accepts from its operator (`KEEL_API_TOKEN`, `KEEL_MCP_TOKEN`,
/// `[mcp] token`).
pub const MIN_SUPPLIED_TOKEN: usize = 16;

/// The fewest different characters such a token must have: `aaaaaaaaaaaaaaaa` or
/// `abababababababab` is long but guessable.
pub const MIN_TOKEN_DISTINCT: usize = 8;

/// Checks a token the operator chose (`source` names where it came from): at least
/// [`MIN_SUPPLIED_TOKEN`] characters, at least [`MIN_TOKEN_DISTINCT`] of them different, no
/// spaces or control characters. Tokens keel makes pass by construction.
pub fn check_supplied_token(source: &str, token: &str) -> Result<(), AccessError> {
    let token = token.trim();
    let len = token.chars().count();
    let distinct = token.chars().collect::<std::collections::BTreeSet<_>>().len();
    let why = if len < MIN_SUPPLIED_TOKEN {
        format!("is {len} characters long; it needs at least {MIN_SUPPLIED_TOKEN}")
    } else if distinct < MIN_TOKEN_DISTINCT {
        format!("has only {distinct} different characters; it needs at least {MIN_TOKEN_DISTINCT}")
    } else if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        "contains spaces or control characters".to_string()
    } else {
        return Ok(());
    };
    Err(AccessError::Input(format!(
        "{source} {why}: anyone who can reach the server could guess it. Use a random one, \
         e.g. `head -c 32 /dev/urandom | base64`, or leave it unset and let keel make one"
    )))
}

/// What is stored of a token: its SHA-256 in hex.
pub fn token_hash(token: &str) -> String {
    crate::digest::sha256_hex(token.trim().as_bytes())
}

/// Token and preset names: what a user name may be ([`crate::memory::USER_NAME_RULE`]).
pub fn check_name(what: &str, name: &str) -> Result<(), AccessError> {
    if crate::memory::valid_user(name) {
        Ok(())
    } else {
        Err(AccessError::Input(format!(
            "{what} name `{}` is not valid: use {}",
            name.escape_debug(),
            crate::memory::USER_NAME_RULE
        )))
    }
}

/// Names of the admin principals keel makes itself (`keel serve`'s home token and
/// `KEEL_API_TOKEN`), never given to a token added by hand: a person reading a decision's
/// record or a session's owner must not mistake one for the other.
pub const RESERVED_TOKEN_NAMES: &[&str] = &["keel-serve", ENV_TOKEN_NAME];

/// Stores a new token `name` with `role`; returns its secret (shown once, stored hashed).
pub fn add_token_in(c: &Connection, name: &str, role: Role) -> Result<String, StoreError> {
    check_name("token", name)?;
    if RESERVED_TOKEN_NAMES.contains(&name) {
        return Err(AccessError::Exists(format!(
            "`{name}` names keel's own admin token; choose another name"
        ))
        .into());
    }
    let exists: bool =
        c.query_row("SELECT EXISTS(SELECT 1 FROM api_tokens WHERE name=?1)", [name], |r| r.get(0))?;
    if exists {
        return Err(AccessError::Exists(format!(
            "a token named `{name}` exists: revoke it first (`keel token revoke {name}`)"
        ))
        .into());
    }
    // A name that owns data (sessions or memories of an earlier token of that name) is not
    // given to a new token: it would see what it never made.
    let principal = match c.backend() {
        crate::sql::Backend::Sqlite => "json_extract(owner, '$.principal')",
        crate::sql::Backend::Postgres => "(owner::json ->> 'principal')",
    };
    let owns: bool = c.query_row(
        &format!(
            "SELECT EXISTS(SELECT 1 FROM session_config WHERE {principal} = 'token:' || ?1)
                 OR EXISTS(SELECT 1 FROM memories WHERE \"user\" = 'token:' || ?1)"
        ),
        [name],
        |r| r.get(0),
    )?;
    if owns {
        return Err(AccessError::Exists(format!(
            "the name `{name}` already owns sessions or memories (of an earlier token of that name); a new token gets a name of its own"
        ))
        .into());
    }
    let token = new_token()?;
    put_token_in(c, name, role, &token_hash(&token))?;
    Ok(token)
}

/// Stores (or replaces) token `name` by its hash.
pub fn put_token_in(c: &Connection, name: &str, role: Role, hash: &str) -> Result<(), StoreError> {
    c.execute(
        "INSERT INTO api_tokens (name, role, hash, created_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT(name) DO UPDATE SET role=excluded.role, hash=excluded.hash,
                                        created_at=excluded.created_at",
        params![name, role.as_str(), hash, now_ms()],
    )?;
    Ok(())
}

/// Every token, by name.
pub fn tokens_in(c: &Connection) -> Result<Vec<TokenRecord>, StoreError> {
    let mut stmt =
        c.prepare_cached("SELECT name, role, created_at FROM api_tokens ORDER BY name")?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get(2)?)))?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter()
        .map(|(name, role, created_at)| {
            let role = role.parse().map_err(|_| {
                StoreError::Corrupt(format!("token `{name}` has an unknown role `{role}`"))
            })?;
            Ok(TokenRecord { name, role, created_at })
        })
        .collect()
}

/// Removes token `name`: requests carrying it are refused from now on.
pub fn revoke_in(c: &Connection, name: &str) -> Result<TokenRecord, StoreError> {
    let Some(record) = tokens_in(c)?.into_iter().find(|t| t.name == name) else {
        return Err(AccessError::NotFound(format!(
            "no token is named `{}` (see `keel token list`)",
            name.escape_debug()
        ))
        .into());
    };
    c.execute("DELETE FROM api_tokens WHERE name=?1", [name])?;
    Ok(record)
}

/// The version of the tokens: it moves with every token added, replaced or revoked, by any
/// process.
pub fn access_version_in(c: &Connection) -> Result<i64, StoreError> {
    Ok(c.prepare_cached("SELECT version FROM access_version WHERE id = 1")?
        .query_row([], |r| r.get(0))?)
}

/// The principal whose token hashes to `hash`, if any.
pub fn principal_in(c: &Connection, hash: &str) -> Result<Option<Principal>, StoreError> {
    let row = c
        .prepare_cached("SELECT name, role FROM api_tokens WHERE hash=?1")?
        .query_row([hash], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .optional()?;
    match row {
        None => Ok(None),
        Some((name, role)) => {
            let role = role.parse().map_err(|_| {
                StoreError::Corrupt(format!("token `{name}` has an unknown role `{role}`"))
            })?;
            Ok(Some(Principal::token(&name, role)))
        }
    }
}

/// Stores preset `name`; `replace` overwrites one of that name.
pub fn add_preset_in(
    c: &Connection,
    name: &str,
    grants: &[Grant],
    user_decides: bool,
    replace: bool,
) -> Result<Preset, StoreError> {
    check_name("preset", name)?;
    if grants.is_empty() {
        return Err(AccessError::Input(
            "a preset needs at least one grant: DIR[=GUEST][:ro|:rw]".into(),
        )
        .into());
    }
    Grant::check_disjoint(grants).map_err(|e| AccessError::Input(e.to_string()))?;
    if !replace && preset_in(c, name)?.is_some() {
        return Err(AccessError::Exists(format!(
            "a preset named `{name}` exists: remove it first, or add it again with --replace"
        ))
        .into());
    }
    let preset = Preset {
        name: name.to_string(),
        grants: grants.to_vec(),
        user_decides,
        created_at: now_ms(),
    };
    let grants = serde_json::to_string(&preset.grants)
        .map_err(|e| StoreError::Task(format!("cannot store the preset's grants: {e}")))?;
    c.execute(
        "INSERT INTO grant_presets (name, grants, user_decides, created_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT(name) DO UPDATE SET grants=excluded.grants,
             user_decides=excluded.user_decides, created_at=excluded.created_at",
        params![name, grants, user_decides, preset.created_at],
    )?;
    Ok(preset)
}

fn preset_row(r: &crate::sql::Row<'_>) -> crate::sql::Result<(String, String, bool, i64)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
}

fn preset_from(row: (String, String, bool, i64)) -> Result<Preset, StoreError> {
    let (name, grants, user_decides, created_at) = row;
    let grants = serde_json::from_str(&grants)
        .map_err(|e| StoreError::Corrupt(format!("preset `{name}` does not read back: {e}")))?;
    Ok(Preset { name, grants, user_decides, created_at })
}

/// Preset `name`, if defined.
pub fn preset_in(c: &Connection, name: &str) -> Result<Option<Preset>, StoreError> {
    c.prepare_cached(
        "SELECT name, grants, user_decides, created_at FROM grant_presets WHERE name=?1",
    )?
    .query_row([name], preset_row)
    .optional()?
    .map(preset_from)
    .transpose()
}

/// Every preset, by name.
pub fn presets_in(c: &Connection) -> Result<Vec<Preset>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT name, grants, user_decides, created_at FROM grant_presets ORDER BY name",
    )?;
    let rows = stmt.query_map([], preset_row)?.collect::<Result<Vec<_>, _>>()?;
    rows.into_iter().map(preset_from).collect()
}

/// Removes preset `name` (sessions created with it keep their grants).
pub fn remove_preset_in(c: &Connection, name: &str) -> Result<Preset, StoreError> {
    let Some(p) = preset_in(c, name)? else {
        return Err(AccessError::NotFound(format!(
            "no preset is named `{}` (see `keel grant preset list`)",
            name.escape_debug()
        ))
        .into());
    };
    c.execute("DELETE FROM grant_presets WHERE name=?1", [name])?;
    Ok(p)
}

/// The directories under which an admin may grant host directories over the API, each
/// canonical (a root that does not exist is an error naming it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantRoots(Vec<PathBuf>);

impl GrantRoots {
    pub fn new(roots: &[PathBuf]) -> Result<Self, AccessError> {
        roots
            .iter()
            .map(|r| {
                r.canonicalize().map_err(|e| {
                    AccessError::Input(format!(
                        "[serve] grant_roots: {} cannot be used: {e}",
                        r.display()
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    pub fn roots(&self) -> &[PathBuf] {
        &self.0
    }

    /// Whether `dir` (canonical) is one of the roots or inside one.
    pub fn contains(&self, dir: &Path) -> bool {
        self.0.iter().any(|r| dir.starts_with(r))
    }

    /// Checks that every grant's host directory is inside a root; the refusal names the roots.
    pub fn check(&self, grants: &[Grant]) -> Result<(), AccessError> {
        for g in grants {
            if !self.contains(&g.host) {
                let roots = if self.0.is_empty() {
                    "none are set: list them in keel.toml `[serve] grant_roots`".to_string()
                } else {
                    self.0.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
                };
                return Err(AccessError::Forbidden(format!(
                    "grant of {} is outside the grant roots ({roots})",
                    g.host.display()
                )));
            }
        }
        Ok(())
    }
}

/// A grant as the API takes it: `{"host", "guest", "access": "ro"|"rw"}` (the shape approvals
/// show), checked as `--grant` is.
pub fn grant_of(
    host: &str,
    guest: Option<&str>,
    access: Option<Access>,
) -> Result<Grant, AccessError> {
    let path = Path::new(host);
    if !path.is_absolute() {
        return Err(AccessError::Input(format!(
            "grant host `{}` must be an absolute path",
            host.escape_debug()
        )));
    }
    let guest = match guest {
        Some(g) => g.to_string(),
        None => match path.file_name().and_then(|n| n.to_str()) {
            Some(n) => format!("/{n}"),
            None => {
                return Err(AccessError::Input(format!(
                    "grant host `{}` needs a guest path",
                    host.escape_debug()
                )));
            }
        },
    };
    Grant::new(path, &guest, access.unwrap_or(Access::Ro))
        .map_err(|e| AccessError::Input(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_stored_hashed() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() == TOKEN_PREFIX.len() + 64);
        assert_eq!(token_hash(&a), token_hash(&format!("{a}\n")));
        assert_ne!(token_hash(&a), a);
    }

    #[test]
    fn short_or_repetitive_supplied_tokens_are_refused() {
        for bad in [
            "a",
            "short-token",
            "aaaaaaaaaaaaaaaaaaaaaaaa",
            "abababababababababab",
            "has space in it 0123456789",
        ] {
            let e = check_supplied_token("KEEL_API_TOKEN", bad).unwrap_err();
            assert!(e.to_string().starts_with("KEEL_API_TOKEN "), "{e}");
        }
        check_supplied_token("KEEL_MCP_TOKEN", "correct-horse-battery-staple").unwrap();
        check_supplied_token("x", &new_token().unwrap()).unwrap();
    }

    #[test]
    fn grant_roots_refuse_what_is_outside_and_name_the_roots() {
        let dir = tempfile::tempdir().unwrap();
        let inside = dir.path().join("in");
        std::fs::create_dir(&inside).unwrap();
        let other = tempfile::tempdir().unwrap();
        let roots = GrantRoots::new(&[dir.path().to_path_buf()]).unwrap();
        let ok = Grant::new(&inside, "/in", Access::Rw).unwrap();
        roots.check(&[ok]).unwrap();
        let out = Grant::new(other.path(), "/o", Access::Ro).unwrap();
        let e = roots.check(&[out]).unwrap_err();
        assert_eq!(e.kind(), "forbidden");
        assert!(e.to_string().contains(&dir.path().canonicalize().unwrap().display().to_string()));
        // A symlink inside a root that points outside it is judged by where it points.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(other.path(), &link).unwrap();
        let via_link = Grant::new(&link, "/l", Access::Ro).unwrap();
        assert!(roots.check(&[via_link]).is_err());
        let none = GrantRoots::default();
        let e = none.check(&[Grant::new(&inside, "/in", Access::Ro).unwrap()]).unwrap_err();
        assert!(e.to_string().contains("grant_roots"), "{e}");
        assert!(GrantRoots::new(&[dir.path().join("missing")]).is_err());
    }
}
