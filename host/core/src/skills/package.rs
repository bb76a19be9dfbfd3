//! Reading a skill package from disk: `SKILL.md` (its front matter and body), its reference
//! files and bundled components, each within its size limits, and the digest of its content.

use super::*;

/// Checks a skill name: as for components — lowercase letters, digits, `-` and `_`, starting
/// with a letter, at most 64 characters.
pub fn valid_skill_name(name: &str) -> bool {
    crate::names::valid_component_name(name)
}

/// Splits `SKILL.md` into its front matter's `name`, `description`, the keys keel ignores,
/// and the body.
pub fn parse_skill_md(text: &str) -> Result<(String, String, Vec<String>, String), Vec<String>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let Some(rest) = text.strip_prefix("---\n").or_else(|| text.strip_prefix("---\r\n")) else {
        return Err(vec!["SKILL.md must begin with YAML front matter between `---` lines".into()]);
    };
    let (yaml, body) = match find_closing(rest) {
        Some(split) => split,
        None => return Err(vec!["SKILL.md's front matter has no closing `---` line".into()]),
    };
    let value: serde_yaml_ng::Value = match serde_yaml_ng::from_str(yaml) {
        Ok(v) => v,
        Err(e) => return Err(vec![format!("the front matter is not valid YAML: {e}")]),
    };
    let Some(map) = value.as_mapping() else {
        return Err(vec!["the front matter must be a mapping of keys to values".into()]);
    };
    let mut problems = Vec::new();
    let text_field = |key: &str, problems: &mut Vec<String>| -> String {
        match map.get(key) {
            None => {
                problems.push(format!("the front matter has no `{key}`"));
                String::new()
            }
            Some(v) => match v.as_str() {
                Some(s) => s.trim().to_string(),
                None => {
                    problems.push(format!("the front matter's `{key}` must be text"));
                    String::new()
                }
            },
        }
    };
    let name = text_field("name", &mut problems);
    let description = text_field("description", &mut problems);
    if !name.is_empty() && !valid_skill_name(&name) {
        problems.push(format!(
            "the name `{}` is not valid: use lowercase letters, digits, `-` and `_`, starting \
             with a letter, at most 64 characters",
            &name
        ));
    }
    if map.get("description").is_some_and(|v| v.is_string()) {
        let n = description.chars().count();
        if n == 0 {
            problems.push(
                "the description is empty: say what the skill is for and when to use it".into(),
            );
        } else if n > MAX_DESCRIPTION {
            problems.push(format!("the description is {n} characters, over {MAX_DESCRIPTION}"));
        }
    }
    let body = body.trim().to_string();
    if body.is_empty() {
        problems.push("the body is empty: a skill's body is its method".into());
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let ignored = map
        .keys()
        .filter_map(|k| k.as_str())
        .filter(|k| *k != "name" && *k != "description")
        .map(str::to_string)
        .collect();
    Ok((name, description, ignored, body))
}

/// The front matter and the body after its closing `---` line.
pub(super) fn find_closing(rest: &str) -> Option<(&str, &str)> {
    let mut at = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            return Some((&rest[..at], &rest[at + line.len()..]));
        }
        at += line.len();
    }
    None
}

/// Reads and checks a skill: a directory holding `SKILL.md`, or a `SKILL.md` file alone.
/// Symbolic links are refused (a skill's files are its own); hidden files and directories
/// (`.git`) are skipped.
pub fn read_package(path: &Path) -> Result<SkillPackage, SkillError> {
    let (all, problems) = read_files(path)?;
    package_of(&path.display().to_string(), all, problems)
}

/// A skill directory's files (or a `SKILL.md` alone), by relative path, in path order: their
/// counts and sizes checked before a byte is read. The problems found while listing them (a
/// symbolic link, a name that is not UTF-8) come back beside them, for [`package_of`] to
/// report with the rest.
#[allow(clippy::type_complexity)]
pub fn read_files(path: &Path) -> Result<(Vec<(String, Vec<u8>)>, Vec<String>), SkillError> {
    let shown = path.display().to_string();
    let meta = std::fs::symlink_metadata(path)
        .map_err(|source| SkillError::Read { path: shown.clone(), source })?;
    let invalid = |problems: Vec<String>| SkillError::Invalid { path: shown.clone(), problems };
    // First what the files are, from their metadata alone: counts and sizes are checked
    // before a byte is read, so a skill of many large (or sparse) files costs nothing.
    let mut found: Vec<(String, std::path::PathBuf, u64)> = Vec::new();
    let mut problems = Vec::new();
    if meta.is_file() {
        found.push(("SKILL.md".into(), path.to_path_buf(), meta.len()));
    } else if meta.is_dir() {
        walk(path, "", &mut found, &mut problems)
            .map_err(|source| SkillError::Read { path: shown.clone(), source })?;
    } else {
        return Err(invalid(vec!["give a skill directory or its SKILL.md file".into()]));
    }
    let mut oversized = Vec::new();
    check_sizes(&found, &mut oversized);
    if !oversized.is_empty() {
        problems.extend(oversized);
        return Err(invalid(problems));
    }
    let mut all: Vec<(String, Vec<u8>)> = Vec::with_capacity(found.len());
    for (rel, file, _) in &found {
        let bytes = read_limited(file, limit_of(rel), &mut problems)
            .map_err(|source| SkillError::Read { path: shown.clone(), source })?;
        all.push((rel.clone(), bytes));
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((all, problems))
}

/// A skill's files as a registry's manifest lists them (each named by its path, with the size
/// its descriptor gives), checked before any is fetched: the paths as a directory's would be
/// (relative, no hidden part, not too deep, none twice), then the counts and sizes.
pub fn check_listing(reference: &str, listed: &[(String, u64)]) -> Result<(), SkillError> {
    let mut problems = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (rel, _) in listed {
        let shown: String = rel.chars().take(120).collect();
        let parts: Vec<&str> = rel.split('/').collect();
        if rel.is_empty()
            || parts.iter().any(|p| p.is_empty() || p.starts_with('.') || p.contains('\\'))
        {
            problems.push(format!(
                "a file is named {shown:?}: a skill file's name is a relative path without \
                 hidden or empty parts"
            ));
        } else if parts.len() > 9 {
            problems.push(format!("`{shown}` is nested too deep"));
        } else if !seen.insert(rel.clone()) {
            problems.push(format!("`{shown}` is sent twice"));
        }
    }
    let found: Vec<(String, std::path::PathBuf, u64)> =
        listed.iter().map(|(r, n)| (r.clone(), std::path::PathBuf::new(), *n)).collect();
    check_sizes(&found, &mut problems);
    if !problems.is_empty() {
        return Err(SkillError::Invalid { path: reference.to_string(), problems });
    }
    Ok(())
}

/// A skill's files as a registry sent them, checked as [`check_listing`] checks a listing
/// (their sizes now the bytes' own), sorted by path.
pub fn files_from_registry(
    reference: &str,
    files: Vec<(String, Vec<u8>)>,
) -> Result<Vec<(String, Vec<u8>)>, SkillError> {
    let listed: Vec<(String, u64)> =
        files.iter().map(|(r, b)| (r.clone(), b.len() as u64)).collect();
    check_listing(reference, &listed)?;
    let mut files = files;
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(files)
}

/// Checks a skill's files (from [`read_files`] or [`files_from_registry`]) and reads them
/// into a package; `shown` names where they came from in errors, `problems` are those already
/// found (each is reported with the rest).
pub fn package_of(
    shown: &str,
    all: Vec<(String, Vec<u8>)>,
    mut problems: Vec<String>,
) -> Result<SkillPackage, SkillError> {
    let invalid = |problems: Vec<String>| SkillError::Invalid { path: shown.to_string(), problems };
    let Some(skill_md) = all.iter().find(|(p, _)| p == "SKILL.md").map(|f| f.1.clone()) else {
        problems.push("there is no SKILL.md at the top of the directory".into());
        return Err(invalid(problems));
    };
    if skill_md.len() > MAX_SKILL_MD {
        problems.push(format!("SKILL.md is {} bytes, over {MAX_SKILL_MD}", skill_md.len()));
    }
    let text = match String::from_utf8(skill_md) {
        Ok(t) => t,
        Err(_) => return Err(invalid(vec!["SKILL.md is not UTF-8 text".into()])),
    };
    let parsed = parse_skill_md(&text);
    let (mut files, mut components) = (Vec::new(), Vec::new());
    for (p, bytes) in &all {
        if p == "SKILL.md" {
            continue;
        }
        if let Some(stem) = p.strip_suffix(".wasm") {
            let name = stem.rsplit('/').next().unwrap_or(stem).to_string();
            if !crate::names::valid_component_name(&name) {
                problems.push(format!(
                    "the component file `{}` does not make a valid component name (lowercase \
                     letters, digits, `-`, `_`, starting with a letter)",
                    p
                ));
            } else if components.iter().any(|(n, _): &(String, Vec<u8>)| *n == name) {
                problems.push(format!("two component files are named `{name}.wasm`"));
            }
            components.push((name, bytes.clone()));
        } else {
            files.push((p.clone(), bytes.clone()));
        }
    }
    if files.len() > MAX_FILES {
        problems.push(format!("{} reference files, over {MAX_FILES}", files.len()));
    }
    let total: usize = files.iter().map(|f| f.1.len()).sum();
    if total > MAX_TOTAL_BYTES {
        problems.push(format!("the reference files hold {total} bytes, over {MAX_TOTAL_BYTES}"));
    }
    if components.len() > MAX_COMPONENTS {
        problems.push(format!("{} components, over {MAX_COMPONENTS}", components.len()));
    }
    let (name, description, ignored_keys, body) = match parsed {
        Ok(p) => p,
        Err(mut more) => {
            more.extend(problems);
            return Err(invalid(more));
        }
    };
    if !problems.is_empty() {
        return Err(invalid(problems));
    }
    Ok(SkillPackage {
        name,
        description,
        body,
        ignored_keys,
        files,
        components,
        digest: content_digest(&all),
    })
}

/// SHA-256 over every file, in path order: each path, a zero byte, its length and its bytes.
pub(super) fn content_digest(files: &[(String, Vec<u8>)]) -> String {
    let mut all = Vec::new();
    for (p, bytes) in files {
        all.extend_from_slice(p.as_bytes());
        all.push(0);
        all.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        all.extend_from_slice(bytes);
    }
    sha256_hex(&all)
}

/// Largest component file of a skill, in bytes (the tool install's own bound).
pub const MAX_COMPONENT_BYTES: u64 = 64 * 1024 * 1024;
/// Bytes a skill's component files may hold in all.
pub const MAX_COMPONENTS_TOTAL: u64 = 128 * 1024 * 1024;

/// The bound of one file of a skill.
pub(super) fn limit_of(rel: &str) -> u64 {
    if rel == "SKILL.md" {
        MAX_SKILL_MD as u64
    } else if rel.ends_with(".wasm") {
        MAX_COMPONENT_BYTES
    } else {
        MAX_FILE_BYTES as u64
    }
}

/// Counts and sizes of a skill's files, from their metadata, before any is read.
pub(super) fn check_sizes(found: &[(String, std::path::PathBuf, u64)], problems: &mut Vec<String>) {
    let wasm = |rel: &str| rel.ends_with(".wasm");
    let files = found.iter().filter(|f| f.0 != "SKILL.md" && !wasm(&f.0)).count();
    let components = found.iter().filter(|f| wasm(&f.0)).count();
    if files > MAX_FILES {
        problems.push(format!("{files} reference files, over {MAX_FILES}"));
    }
    if components > MAX_COMPONENTS {
        problems.push(format!("{components} components, over {MAX_COMPONENTS}"));
    }
    for (rel, _, len) in found {
        if *len > limit_of(rel) {
            problems.push(format!("`{rel}` is {len} bytes, over {}", limit_of(rel)));
        }
    }
    let sum = |pick: &dyn Fn(&str) -> bool| -> u64 {
        found.iter().filter(|f| f.0 != "SKILL.md" && pick(&f.0)).map(|f| f.2).sum()
    };
    let (refs, wasms) = (sum(&|r| !wasm(r)), sum(&|r| wasm(r)));
    if refs > MAX_TOTAL_BYTES as u64 {
        problems.push(format!("the reference files hold {refs} bytes, over {MAX_TOTAL_BYTES}"));
    }
    if wasms > MAX_COMPONENTS_TOTAL {
        problems.push(format!("the components hold {wasms} bytes, over {MAX_COMPONENTS_TOTAL}"));
    }
}

/// Reads `path` as a stream, never past `limit` bytes (a file that grew since its size was
/// checked is refused, not read whole).
pub(super) fn read_limited(
    path: &Path,
    limit: u64,
    problems: &mut Vec<String>,
) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    std::fs::File::open(path)?.take(limit + 1).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        problems.push(format!("{} is over {limit} bytes", path.display()));
        out.clear();
    }
    Ok(out)
}

/// Lists a skill directory's files (relative path, path, size) without reading them.
pub(super) fn walk(
    dir: &Path,
    prefix: &str,
    out: &mut Vec<(String, std::path::PathBuf, u64)>,
    problems: &mut Vec<String>,
) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            problems.push(format!("a file name in {} is not UTF-8", dir.display()));
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let rel = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
        let kind = e.file_type()?;
        if kind.is_symlink() {
            problems
                .push(format!("`{}` is a symbolic link: a skill's files must be its own", &rel));
        } else if kind.is_dir() {
            if rel.matches('/').count() >= 8 {
                problems.push(format!("`{}` is nested too deep", &rel));
                continue;
            }
            walk(&e.path(), &rel, out, problems)?;
        } else if kind.is_file() {
            if out.len() > MAX_FILES + MAX_COMPONENTS + 1 {
                problems.push("the skill holds too many files".into());
                return Ok(());
            }
            out.push((rel, e.path(), e.metadata()?.len()));
        }
    }
    Ok(())
}
