//! Skills: installed methods, owned here.
//!
//! A skill follows the Agent Skills convention: a directory holding `SKILL.md` — YAML front
//! matter with at least `name` and `description`, then the body, the method itself (steps,
//! rules, output requirements) — and optionally reference files and tool components
//! (`*.wasm`) the skill relies on. A skill is **content, never authority**: installing one
//! grants nothing, a tool it mentions is not loaded by the mention, and its bundled components
//! go through the normal tool install and then follow each session's grants and policy like
//! any other tool.
//!
//! Every version is kept by the SHA-256 of its whole content (`skill_versions`, with its
//! reference files in `skill_files`); the installed version of each name is in `skills`, which
//! a full-text index (`skills_fts`, FTS5 with bm25 over name, description and body) follows by
//! triggers. A session that loaded a skill keeps the version it loaded.

use std::path::Path;

use crate::sql::{Backend, Connection, OptionalExtension, params};
use serde::Serialize;

use crate::digest::sha256_hex;
use crate::search::Scored;
use crate::store::StoreError;

/// Characters of a description, at most.
pub const MAX_DESCRIPTION: usize = 1024;
/// Bytes of `SKILL.md`, at most.
pub const MAX_SKILL_MD: usize = 256 * 1024;
/// Reference files of one skill, at most.
pub const MAX_FILES: usize = 64;
/// Bytes of one reference file, at most.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;
/// Bytes of all reference files together, at most.
pub const MAX_TOTAL_BYTES: usize = 8 * 1024 * 1024;
/// Bytes a skill bundle from a registry may hold in all: its `SKILL.md`, reference files and
/// components at their limits.
pub const MAX_SKILL_BUNDLE_BYTES: u64 =
    (MAX_SKILL_MD + MAX_TOTAL_BYTES) as u64 + package::MAX_COMPONENTS_TOTAL;
/// Tool components one skill may bundle, at most.
pub const MAX_COMPONENTS: usize = 16;
/// Bytes of a loaded skill's body that enter a request; the rest is paged with `skills_load`.
pub const BODY_SHOWN: usize = 8 * 1024;

mod package;

pub use package::*;

/// Why a skill cannot be installed or read.
#[derive(Debug, thiserror::Error)]
pub enum SkillError {
    /// The skill's files break a rule; each problem is named.
    #[error("the skill at {path} cannot be installed:\n  - {}", problems.join("\n  - "))]
    Invalid { path: String, problems: Vec<String> },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no skill named `{0}` is installed")]
    NotInstalled(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl SkillError {
    /// A stable name of the error's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Invalid { .. } => "invalid_skill",
            Self::Read { .. } => "input",
            Self::NotInstalled(_) => "not_installed",
            Self::Store(e) => e.kind(),
        }
    }
}

/// A skill as read from disk, checked, not yet installed.
#[derive(Debug, Clone)]
pub struct SkillPackage {
    pub name: String,
    pub description: String,
    pub body: String,
    /// Front-matter keys keel reads but does not act on (`allowed-tools`, say), named so that
    /// an admin sees a skill cannot widen anything.
    pub ignored_keys: Vec<String>,
    /// Reference files by relative path (`/`-separated), `SKILL.md` itself not among them.
    pub files: Vec<(String, Vec<u8>)>,
    /// Bundled tool components: (component name, the file's bytes).
    pub components: Vec<(String, Vec<u8>)>,
    /// SHA-256 over every file of the skill.
    pub digest: String,
}

/// A reference file of a skill version.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct SkillFile {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

/// An installed skill.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkillRecord {
    pub name: String,
    pub description: String,
    pub digest: String,
    pub source: String,
    pub installed_at: String,
    /// Bytes of the body.
    pub body_bytes: usize,
    pub files: Vec<SkillFile>,
    /// The components it bundles (installed as tools).
    pub tools: Vec<String>,
    /// Installed from a registry (`source` is the `oci://` reference): the digest of the
    /// manifest it named then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
    /// From a registry: the trusted key (by its trust name, and the key) whose signature
    /// covered the bundle when it was installed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signer_key: Option<String>,
    /// Installed from a registry without a trusted signature, on purpose (`--allow-unsigned`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unsigned_allowed: bool,
}

/// What a skill from a registry was installed at, and who vouched for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provenance {
    /// The digest of the bundle's manifest.
    pub manifest_digest: String,
    /// The trusted key whose signature covered it (name and key).
    pub signer: Option<(String, String)>,
    /// Installed without one, on purpose.
    pub unsigned_allowed: bool,
}

/// One stored version of a skill, with its body.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkillVersion {
    pub name: String,
    pub description: String,
    pub digest: String,
    pub body: String,
    pub files: Vec<SkillFile>,
    pub tools: Vec<String>,
}

/// A skill as recall and search name it: enough for a model to decide on it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
pub struct SkillRef {
    pub name: String,
    pub description: String,
    pub digest: String,
}

/// The refusal of other content under the installed skill `name` (at `digest`) without an
/// upgrade.
pub fn installed_already(name: &str, digest: &str) -> StoreError {
    StoreError::Conflict(format!(
        "a skill named `{name}` is installed already (sha256 {}): use --upgrade to replace it",
        &digest[..12.min(digest.len())]
    ))
}

/// What installing a skill did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkillInstalled {
    pub skill: SkillRecord,
    /// The digest of the version this one replaced.
    pub replaced: Option<String>,
    /// The same content was installed already.
    pub unchanged: bool,
    /// Front-matter keys keel does not act on.
    pub ignored_keys: Vec<String>,
}

/// Stores `pkg` as the installed version of its name (`source`: where it came from).
/// Replacing an installed skill of another content needs `upgrade`.
#[cfg(any(test, feature = "internals"))]
pub fn install_in(
    c: &Connection,
    pkg: &SkillPackage,
    source: &str,
    upgrade: bool,
) -> Result<SkillInstalled, StoreError> {
    install_from_in(c, pkg, source, None, upgrade)
}

/// [`install_in`], recording the digest of the registry manifest it was pulled from.
pub fn install_from_in(
    c: &Connection,
    pkg: &SkillPackage,
    source: &str,
    provenance: Option<&Provenance>,
    upgrade: bool,
) -> Result<SkillInstalled, StoreError> {
    let manifest_digest = provenance.map(|p| p.manifest_digest.as_str());
    let signer = provenance.and_then(|p| p.signer.as_ref().map(|s| s.0.as_str()));
    let signer_key = provenance.and_then(|p| p.signer.as_ref().map(|s| s.1.as_str()));
    let unsigned_allowed = provenance.is_some_and(|p| p.unsigned_allowed);
    let current: Option<String> = c
        .query_row("SELECT digest FROM skills WHERE name=?1", [&pkg.name], |r| r.get(0))
        .optional()?;
    if let Some(old) = &current
        && *old != pkg.digest
        && !upgrade
    {
        return Err(installed_already(&pkg.name, old));
    }
    let files: Vec<SkillFile> = pkg
        .files
        .iter()
        .map(|(p, b)| SkillFile { path: p.clone(), bytes: b.len() as u64, sha256: sha256_hex(b) })
        .collect();
    let tools: Vec<&str> = pkg.components.iter().map(|(n, _)| n.as_str()).collect();
    c.execute(
        "INSERT INTO skill_versions (digest, name, description, body, files, tools)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
        params![pkg.digest, pkg.name, pkg.description, pkg.body, json(&files)?, json(&tools)?],
    )?;
    for (p, b) in &pkg.files {
        c.execute(
            "INSERT INTO skill_files (digest, path, content) VALUES (?1, ?2, ?3)
             ON CONFLICT DO NOTHING",
            params![pkg.digest, p, b],
        )?;
    }
    let unchanged = current.as_deref() == Some(pkg.digest.as_str());
    let at = crate::names::now();
    if current.is_some() {
        c.execute(
            "UPDATE skills SET digest=?2, source=?3, installed_at=?4, manifest_digest=?5,
                    signer=?6, signer_key=?7, unsigned_allowed=?8
             WHERE name=?1",
            params![
                pkg.name,
                pkg.digest,
                source,
                at,
                manifest_digest,
                signer,
                signer_key,
                unsigned_allowed
            ],
        )?;
    } else {
        c.execute(
            "INSERT INTO skills (name, digest, source, installed_at, manifest_digest, signer,
                                 signer_key, unsigned_allowed)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                pkg.name,
                pkg.digest,
                source,
                at,
                manifest_digest,
                signer,
                signer_key,
                unsigned_allowed
            ],
        )?;
    }
    let skill = get_in(c, &pkg.name)?
        .ok_or_else(|| StoreError::NotFound(format!("skill `{}` vanished", pkg.name)))?;
    Ok(SkillInstalled {
        skill,
        replaced: current.filter(|d| *d != pkg.digest),
        unchanged,
        ignored_keys: pkg.ignored_keys.clone(),
    })
}

fn json<T: Serialize + ?Sized>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Input(e.to_string()))
}

fn parse_list<T: serde::de::DeserializeOwned>(text: &str) -> crate::sql::Result<T> {
    serde_json::from_str(text).map_err(|e| crate::sql::Error::conversion(0, e))
}

const RECORD: &str = "SELECT s.name, v.description, s.digest, s.source, s.installed_at,
    octet_length(v.body), v.files, v.tools, s.manifest_digest, s.signer, s.signer_key,
    s.unsigned_allowed
    FROM skills s JOIN skill_versions v ON v.digest = s.digest";

fn record(r: &crate::sql::Row<'_>) -> crate::sql::Result<SkillRecord> {
    Ok(SkillRecord {
        name: r.get(0)?,
        description: r.get(1)?,
        digest: r.get(2)?,
        source: r.get(3)?,
        installed_at: r.get(4)?,
        body_bytes: r.get::<_, i64>(5)? as usize,
        files: parse_list(&r.get::<_, String>(6)?)?,
        tools: parse_list(&r.get::<_, String>(7)?)?,
        manifest_digest: r.get(8)?,
        signer: r.get(9)?,
        signer_key: r.get(10)?,
        unsigned_allowed: r.get(11)?,
    })
}

/// The installed skill named `name`.
pub fn get_in(c: &Connection, name: &str) -> Result<Option<SkillRecord>, StoreError> {
    Ok(c.prepare_cached(&format!("{RECORD} WHERE s.name = ?1"))?
        .query_row([name], record)
        .optional()?)
}

/// Every installed skill, by name.
pub fn list_in(c: &Connection) -> Result<Vec<SkillRecord>, StoreError> {
    let mut stmt = c.prepare_cached(&format!("{RECORD} ORDER BY s.name"))?;
    let rows = stmt.query_map([], record)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The stored version `digest` of a skill, with its body.
pub fn version_in(c: &Connection, digest: &str) -> Result<Option<SkillVersion>, StoreError> {
    Ok(c.prepare_cached(
        "SELECT name, description, digest, body, files, tools FROM skill_versions WHERE digest=?1",
    )?
    .query_row([digest], |r| {
        Ok(SkillVersion {
            name: r.get(0)?,
            description: r.get(1)?,
            digest: r.get(2)?,
            body: r.get(3)?,
            files: parse_list(&r.get::<_, String>(4)?)?,
            tools: parse_list(&r.get::<_, String>(5)?)?,
        })
    })
    .optional()?)
}

/// A reference file of skill version `digest`.
pub fn file_in(c: &Connection, digest: &str, path: &str) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(c.prepare_cached("SELECT content FROM skill_files WHERE digest=?1 AND path=?2")?
        .query_row(params![digest, path], |r| r.get(0))
        .optional()?)
}

/// Removes the installed skill `name`; its versions stay for the sessions that loaded them.
pub fn remove_in(c: &Connection, name: &str) -> Result<SkillRecord, StoreError> {
    let Some(record) = get_in(c, name)? else {
        return Err(StoreError::NotFound(format!("no skill named `{name}` is installed")));
    };
    c.execute("DELETE FROM skills WHERE name=?1", [name])?;
    Ok(record)
}

/// The installed skills best matching `terms` (bm25 over name, description and body), at most
/// `limit`, best first.
pub fn recall_in<S: AsRef<str>>(
    c: &Connection,
    terms: &[S],
    limit: usize,
) -> Result<Vec<Scored<SkillRef>>, StoreError> {
    let (sql, query, min_rowid) = match c.backend() {
        Backend::Postgres => {
            let Some(query) = crate::search::ts_query(terms) else {
                return Ok(Vec::new());
            };
            let sql = "SELECT s.name, v.description, s.digest, -ts_rank(v.fts, q) AS score
                 FROM skills s JOIN skill_versions v ON v.digest = s.digest,
                      to_tsquery('english', ?1) q
                 WHERE v.fts @@ q ORDER BY score, s.name LIMIT ?2";
            (sql, query, None)
        }
        Backend::Sqlite => {
            let Some(plan) =
                crate::search::plan_in(c, "skills_fts", "skills_vocab", None, None, terms)?
            else {
                return Ok(Vec::new());
            };
            let sql =
                "SELECT s.name, v.description, s.digest, bm25(skills_fts, 10.0, 5.0, 1.0) AS score
                 FROM skills_fts JOIN skills s ON s.rowid = skills_fts.rowid
                 JOIN skill_versions v ON v.digest = s.digest
                 WHERE skills_fts MATCH ?1 AND skills_fts.rowid >= ?3 ORDER BY score LIMIT ?2";
            (sql, plan.query, Some(plan.min_rowid))
        }
    };
    let mut stmt = c.prepare_cached(sql)?;
    let scored = |r: &crate::sql::Row<'_>| {
        Ok(Scored {
            item: SkillRef { name: r.get(0)?, description: r.get(1)?, digest: r.get(2)? },
            score: r.get(3)?,
        })
    };
    let rows = match min_rowid {
        Some(min) => stmt.query_map(params![query, limit as i64, min], scored)?,
        None => stmt.query_map(params![query, limit as i64], scored)?,
    };
    Ok(rows.collect::<Result<_, _>>()?)
}

/// A page of a skill's body: `BODY_SHOWN` bytes from `offset` (cut at a character boundary),
/// and the offset of the next page, if any.
pub fn page(body: &str, offset: usize) -> (&str, Option<usize>) {
    let mut start = offset.min(body.len());
    while !body.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = (start + BODY_SHOWN).min(body.len());
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    (&body[start..end], (end < body.len()).then_some(end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_matter_is_read_strictly() {
        let ok = "---\nname: csv-audit\ndescription: >\n  Audit a CSV file.\nallowed-tools: fs_write_file\n---\n# Method\n1. Read it.\n";
        let (name, description, ignored, body) = parse_skill_md(ok).unwrap();
        assert_eq!((name.as_str(), description.as_str()), ("csv-audit", "Audit a CSV file."));
        assert_eq!(ignored, vec!["allowed-tools".to_string()]);
        assert_eq!(body, "# Method\n1. Read it.");
        for (text, needle) in [
            ("# no front matter", "must begin"),
            ("---\nname: a\n", "no closing"),
            ("---\n[1, 2]\n---\nbody", "mapping"),
            ("---\nname: a: b: c\n---\nbody", "not valid YAML"),
            ("---\ndescription: d\n---\nbody", "no `name`"),
            ("---\nname: Bad Name\ndescription: d\n---\nbody", "not valid"),
            ("---\nname: a\ndescription: [x]\n---\nbody", "must be text"),
            ("---\nname: a\ndescription: \"\"\n---\nbody", "description is empty"),
            ("---\nname: a\ndescription: d\n---\n  \n", "body is empty"),
        ] {
            let problems = parse_skill_md(text).unwrap_err().join("; ");
            assert!(problems.contains(needle), "{text:?}: {problems}");
        }
        let long =
            format!("---\nname: a\ndescription: {}\n---\nbody", "x".repeat(MAX_DESCRIPTION + 1));
        assert!(parse_skill_md(&long).unwrap_err()[0].contains("over 1024"));
    }

    #[test]
    fn pages_cut_at_character_boundaries() {
        let body = "é".repeat(BODY_SHOWN);
        let (first, next) = page(&body, 0);
        assert!(first.len() <= BODY_SHOWN && next == Some(first.len()));
        let (second, next) = page(&body, first.len());
        assert_eq!(first.len() + second.len(), body.len());
        assert_eq!(next, None);
        assert_eq!(page("short", 99), ("", None));
    }
}
