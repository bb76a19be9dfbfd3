//! The read-only [`Discovery`] a session's control calls search through: the skill and tool
//! catalogs, and the memories of the session's user — through the store's read pool, never
//! the writer.

use crate::control::{ControlError, Discovery, MemoryHit, SkillHit, SkillPage, ToolHit, ToolNames};
use crate::store::Db;

/// Discovery for the calls of one session, whose user is `user`.
pub struct SessionDiscovery {
    db: Db,
    user: String,
}

impl SessionDiscovery {
    pub fn new(db: Db, user: String) -> Self {
        Self { db, user }
    }
}

fn words(query: &str) -> Result<Vec<&str>, ControlError> {
    if query.chars().count() > crate::search::MAX_QUERY {
        return Err(ControlError::Invalid(format!(
            "the query is over {} characters",
            crate::search::MAX_QUERY
        )));
    }
    if crate::search::fts_query(&[query]).is_none() {
        return Err(ControlError::Invalid("the query has no words to search for".into()));
    }
    Ok(vec![query])
}

fn store(e: crate::store::StoreError) -> ControlError {
    ControlError::Failed(format!("the catalog could not be read: {e}"))
}

impl Discovery for SessionDiscovery {
    fn find_skills(&self, query: &str, limit: usize) -> Result<Vec<SkillHit>, ControlError> {
        let terms = words(query)?;
        let hits =
            self.db.read_blocking(|c| crate::skills::recall_in(c, &terms, limit)).map_err(store)?;
        Ok(hits
            .into_iter()
            .map(|h| SkillHit { name: h.item.name, description: h.item.description })
            .collect())
    }

    fn skill_page(
        &self,
        name: &str,
        offset: u64,
        file: Option<&str>,
    ) -> Result<SkillPage, ControlError> {
        let found = self
            .db
            .read_blocking(|c| {
                let Some(record) = crate::skills::get_in(c, name)? else { return Ok(None) };
                let version = crate::skills::version_in(c, &record.digest)?;
                let content = match file {
                    Some(f) => crate::skills::file_in(c, &record.digest, f)?.map(Some),
                    None => Some(None),
                };
                Ok(Some((version, content)))
            })
            .map_err(store)?;
        let Some((Some(version), content)) = found else {
            return Err(ControlError::Invalid(format!(
                "no skill named `{name}` is installed; skills_find lists the installed ones"
            )));
        };
        let files: Vec<String> = version.files.iter().map(|f| f.path.clone()).collect();
        let (text, next_offset) = match (file, content) {
            (Some(f), None) | (Some(f), Some(None)) => {
                return Err(ControlError::Invalid(format!(
                    "skill `{name}` has no file `{f}`; its files: {}",
                    if files.is_empty() { "none".to_string() } else { files.join(", ") }
                )));
            }
            (_, Some(Some(bytes))) => {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                let (page, next) = crate::skills::page(&text, offset as usize);
                (page.to_string(), next.map(|n| n as u64))
            }
            (None, _) => {
                let (page, next) = crate::skills::page(&version.body, offset as usize);
                (page.to_string(), next.map(|n| n as u64))
            }
        };
        Ok(SkillPage {
            name: version.name,
            description: version.description,
            text,
            next_offset,
            files,
            tools: version.tools,
        })
    }

    fn find_tools(&self, query: &str, limit: usize) -> Result<Vec<ToolHit>, ControlError> {
        let terms = words(query)?;
        let hits =
            self.db.read_blocking(|c| crate::tools::recall_in(c, &terms, limit)).map_err(store)?;
        Ok(hits
            .into_iter()
            .map(|h| ToolHit {
                name: h.item.name,
                toolset: h.item.component,
                description: h.item.description,
                effect: h.item.effect,
            })
            .collect())
    }

    fn tool_names(&self, names: &[String]) -> Result<ToolNames, ControlError> {
        if names.len() > 64 {
            return Err(ControlError::Invalid("name at most 64 tools or tool sets at once".into()));
        }
        self.db
            .read_blocking(|c| {
                let mut out = ToolNames::default();
                let mut unknown = Vec::new();
                for n in names {
                    if crate::tools::tool_in(c, n)?.is_some() {
                        out.tools.push(n.clone());
                    } else if crate::tools::toolset_in(c, n)?.is_some() {
                        out.toolsets.push(n.clone());
                    } else {
                        unknown.push(n.clone());
                    }
                }
                Ok(if unknown.is_empty() { Ok(out) } else { Err(unknown) })
            })
            .map_err(store)?
            .map_err(|unknown| {
                ControlError::Invalid(format!(
                    "not installed: {}; tools_find searches the installed tools",
                    unknown.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
                ))
            })
    }

    fn find_memories(&self, query: &str, limit: usize) -> Result<Vec<MemoryHit>, ControlError> {
        let terms = words(query)?;
        let hits = self
            .db
            .read_blocking(|c| crate::memory::recall_in(c, &self.user, &terms, limit))
            .map_err(store)?;
        Ok(hits
            .into_iter()
            .map(|h| MemoryHit { id: h.item.id, text: h.item.text, tags: h.item.tags })
            .collect())
    }
}
