//! Undo: putting back on disk what a session's calls after a step changed, from the change
//! sets the journal keeps and the pre-images the sandbox took ([`crate::sandbox::PreImages`]).
//!
//! A path is put back only when it is as the session's last call left it: anything else
//! changed it since (a person, another program), and it is a **conflict** — nothing is
//! written for it unless forced. Every path is reached through the session's grants (opened
//! and checked as a call's are: a grant that moved refuses, one narrowed to read-only
//! refuses its paths), never by a host path. Each file is put back atomically — its content
//! written beside it and renamed onto it — so a rewind cut short leaves each file either as
//! it was or as it is, and running it again finishes it (a path already as it was counts as
//! done).
//!
//! The work on files is blocking; [`check`] and [`apply`] are run off the async threads.

mod plan;
pub mod scratch;

use std::collections::HashMap;
use std::io::{Read, Write};

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions};
use serde::Serialize;
use sha2::{Digest, Sha256};

pub use plan::{Left, NotUndone, Plan, Was, plan};


use crate::grant::{Access, Opened};

/// Bytes of a file read at most to compare it with what the session left (a larger one is
/// compared by its hash all the same: read in pieces).
const TEXT_FOR_DIFF: usize = 1 << 20;

/// Which paths changed since the session's last call a rewind puts back anyway.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Force {
    #[default]
    None,
    All,
    /// These guest paths.
    Paths(Vec<String>),
}

impl Force {
    /// The force a front-end's flags ask for: every conflict with `all`, else the `paths`
    /// named (none: no force).
    pub fn from_flags(all: bool, paths: Vec<String>) -> Self {
        match (all, paths.is_empty()) {
            (true, _) => Self::All,
            (false, false) => Self::Paths(paths),
            (false, true) => Self::None,
        }
    }

    fn covers(&self, path: &str) -> bool {
        match self {
            Self::None => false,
            Self::All => true,
            Self::Paths(p) => p.iter().any(|x| x.trim_end_matches('/') == path),
        }
    }
}

/// What a rewind did (or, in a dry run, would do) to one path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PathRewind {
    pub path: String,
    /// `restore` (a file's content or a link), `remove` (made after the step), `remove_dir`,
    /// `recreate` (a directory).
    pub action: &'static str,
    /// `done`, `would` (a dry run), `already` (it is as it was), `conflict` (changed since
    /// the session's last call), `not_restorable`, `refused` (its grant), `failed`.
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A dry run's unified diff from the file now to the file as it was (text files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
    /// Put back although it changed since the session's last call.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub forced: bool,
    /// Where it is: the grant's index and the path inside it.
    #[serde(skip)]
    at: Option<(usize, String)>,
    #[serde(skip)]
    was: Option<Was>,
}

/// What is at a path now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Now {
    Absent,
    File { sha256: String, text: Option<String> },
    Link(String),
    Dir,
    Other,
    Unreadable(String),
}

/// The grant `path` lies in (the deepest that holds it) and the path inside it.
fn locate(grants: &[Opened], path: &str) -> Option<(usize, String)> {
    grants
        .iter()
        .enumerate()
        .filter_map(|(i, g)| {
            let rest = if g.guest == "/" {
                path.strip_prefix('/')
            } else {
                path.strip_prefix(g.guest.as_str()).and_then(|r| r.strip_prefix('/'))
            }?;
            Some((g.guest.len(), i, rest.to_string()))
        })
        .filter(|(_, _, rest)| !rest.is_empty() && !rest.split('/').any(|c| c == ".." || c.is_empty()))
        .max_by_key(|(len, _, _)| *len)
        .map(|(_, i, rest)| (i, rest))
}

/// What is at `rel` in `dir` now (a final link is not followed).
fn now_at(dir: &Dir, rel: &str) -> Now {
    let meta = match dir.symlink_metadata(rel) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Now::Absent,
        Err(e) => return Now::Unreadable(e.to_string()),
    };
    if meta.is_symlink() {
        return match dir.read_link(rel) {
            Ok(t) => Now::Link(t.to_string_lossy().into_owned()),
            Err(e) => Now::Unreadable(e.to_string()),
        };
    }
    if meta.is_dir() {
        return Now::Dir;
    }
    if !meta.is_file() {
        return Now::Other;
    }
    let mut opts = OpenOptions::new();
    opts.read(true).follow(FollowSymlinks::No);
    let mut file = match dir.open_with(rel, &opts) {
        Ok(f) => f,
        Err(e) => return Now::Unreadable(e.to_string()),
    };
    let mut hasher = Sha256::new();
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buf[..n]);
                if kept.len() <= TEXT_FOR_DIFF {
                    kept.extend_from_slice(&buf[..n]);
                }
            }
            Err(e) => return Now::Unreadable(e.to_string()),
        }
    }
    let text = (kept.len() <= TEXT_FOR_DIFF).then(|| String::from_utf8(kept).ok()).flatten();
    Now::File { sha256: hex::encode(hasher.finalize()), text }
}

/// Whether `now` is what the session's last call left.
fn as_left(left: &Left, now: &Now) -> Result<(), String> {
    let same = match (left, now) {
        (Left::Absent, Now::Absent) | (Left::Dir, Now::Dir) | (Left::Other, Now::Other) => true,
        (Left::Link, Now::Link(_)) => true,
        (Left::Unknown, _) => {
            return Err("an earlier rewind left it as it was then, so what should be there now \
                        is not known"
                .into());
        }
        (Left::File(Some(a)), Now::File { sha256, .. }) => a == sha256,
        (Left::File(None), Now::File { .. }) => {
            return Err("what the session's last call left there was too large to hash, so a \
                        change since cannot be seen"
                .into());
        }
        _ => false,
    };
    if same {
        Ok(())
    } else {
        Err(format!("it changed since the session's last call changed it (now {})", describe(now)))
    }
}

fn describe(now: &Now) -> String {
    match now {
        Now::Absent => "absent".into(),
        Now::File { sha256, .. } => format!("a file, sha256 {}", &sha256[..12.min(sha256.len())]),
        Now::Link(t) => format!("a link to {t}"),
        Now::Dir => "a directory".into(),
        Now::Other => "neither a file nor a directory".into(),
        Now::Unreadable(e) => format!("unreadable: {e}"),
    }
}

/// Whether `now` is already what a rewind puts back.
fn as_was(was: &Was, now: &Now) -> bool {
    match (was, now) {
        (Was::Absent, Now::Absent) | (Was::Dir, Now::Dir) => true,
        (Was::File { sha256, .. }, Now::File { sha256: now, .. }) => sha256 == now,
        (Was::Link(a), Now::Link(b)) => a == b,
        _ => false,
    }
}

/// Checks each path of `plan` against the disk, through `grants`: what a rewind would do to
/// it, or why it would not. `blobs` (the pre-images, by sha256) give a dry run its diffs.
pub fn check(
    plan: &Plan,
    grants: &[Opened],
    force: &Force,
    step: i64,
    blobs: &HashMap<String, Vec<u8>>,
) -> Vec<PathRewind> {
    let mut out = Vec::new();
    for (path, p) in &plan.paths {
        let at = locate(grants, path);
        let now = at.as_ref().map(|(i, rel)| now_at(&grants[*i].dir, rel));
        let action = match (&p.was, &now) {
            (Was::Absent, Some(Now::Dir)) => "remove_dir",
            (Was::Absent, _) => "remove",
            (Was::Dir, _) => "recreate",
            _ => "restore",
        };
        let mut item = PathRewind {
            path: path.clone(),
            action,
            outcome: "would",
            reason: None,
            diff: None,
            forced: false,
            at: at.clone(),
            was: Some(p.was.clone()),
        };
        let refuse = |item: &mut PathRewind, outcome: &'static str, why: String| {
            item.outcome = outcome;
            item.reason = Some(why);
        };
        match (&at, &now) {
            (None, _) | (_, None) => {
                refuse(&mut item, "refused", "it is in none of the session's grants now".into())
            }
            (Some((i, _)), Some(now)) => {
                if grants[*i].access != Access::Rw {
                    refuse(&mut item, "refused", "its grant is read-only".into());
                } else if as_was(&p.was, now) {
                    item.outcome = "already";
                } else if let Was::Lost(why) = &p.was {
                    refuse(&mut item, "not_restorable", why.clone());
                } else if let Err(why) = as_left(&p.left, now) {
                    if force.covers(path) {
                        item.forced = true;
                        item.reason = Some(why);
                    } else {
                        refuse(&mut item, "conflict", why);
                    }
                }
                if item.outcome == "would"
                    && let (Was::File { sha256, .. }, Now::File { text: Some(now), .. }) =
                        (&p.was, now)
                    && let Some(Ok(was)) = blobs.get(sha256).map(|b| std::str::from_utf8(b))
                {
                    let label = format!("at step {step}");
                    let (diff, too_large) =
                        crate::change::labeled_diff(path, now, was, "now", &label);
                    item.diff = Some(match too_large {
                        Some(n) => format!("(diff too large: {n} lines changed)"),
                        None => diff,
                    });
                }
            }
        }
        out.push(item);
    }
    out
}

/// Puts back each path `check` found ready (`would`), through `grants`: directories to
/// recreate first (shallow first), then files and links, then what the calls made, then the
/// directories they made (deepest first). `blobs` are the pre-images, by sha256.
pub fn apply(items: &mut [PathRewind], grants: &[Opened], blobs: &HashMap<String, Vec<u8>>) {
    let depth = |p: &PathRewind| p.path.matches('/').count();
    let mut order: Vec<usize> = (0..items.len()).collect();
    let rank = |p: &PathRewind| match p.action {
        "recreate" => (0, depth(p) as i64),
        "restore" => (1, 0),
        "remove" => (2, 0),
        _ => (3, -(depth(p) as i64)),
    };
    order.sort_by_key(|&i| rank(&items[i]));
    for i in order {
        let item = &mut items[i];
        if item.outcome != "would" {
            continue;
        }
        let (Some((g, rel)), Some(was)) = (item.at.clone(), item.was.clone()) else { continue };
        match put_back(&grants[g].dir, &rel, &was, blobs) {
            Ok(()) => item.outcome = "done",
            Err(e) => {
                item.outcome = "failed";
                item.reason = Some(e);
            }
        }
        crate::crash::point("mid_rewind");
    }
}

/// Removes what a rewind cut short may have left beside `name`: its half-written copies.
fn remove_stale(holder: &Dir, name: &str) {
    let prefix = format!(".{name}.keel-rewind-");
    let Ok(entries) = holder.entries() else { return };
    for entry in entries.flatten() {
        if let Some(n) = entry.file_name().to_str()
            && n.starts_with(&prefix)
        {
            let _ = holder.remove_file(n);
        }
    }
}

/// `rel` split into its directory (`""`: the grant's root) and name.
fn split(rel: &str) -> (&str, &str) {
    rel.rsplit_once('/').unwrap_or(("", rel))
}

/// A name beside `name` for a file being written, unique to this process and moment.
fn temporary(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(".{name}.keel-rewind-{}-{nanos}", std::process::id())
}

/// Makes `rel` in `dir` what `was` says.
fn put_back(
    dir: &Dir,
    rel: &str,
    was: &Was,
    blobs: &HashMap<String, Vec<u8>>,
) -> Result<(), String> {
    let (parent, name) = split(rel);
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let holder = if parent.is_empty() {
        dir.try_clone().map_err(|e| io("the grant", e))?
    } else {
        if !matches!(was, Was::Absent) {
            dir.create_dir_all(parent).map_err(|e| io("its directory could not be made", e))?;
        }
        match dir.open_dir(parent) {
            Ok(d) => d,
            // Its directory is gone: what was made there is gone with it.
            Err(e) if matches!(was, Was::Absent) && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(());
            }
            Err(e) => return Err(io("its directory could not be opened", e)),
        }
    };
    remove_stale(&holder, name);
    match was {
        Was::Absent => match holder.symlink_metadata(name) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Ok(m) if m.is_dir() => holder.remove_dir(name).map_err(|e| {
                io("the directory could not be removed (it holds what the session did not make)", e)
            }),
            _ => holder.remove_file(name).map_err(|e| io("it could not be removed", e)),
        },
        Was::Dir => match holder.symlink_metadata(name) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err("something else is there now".into()),
            Err(_) => holder.create_dir(name).map_err(|e| io("it could not be made", e)),
        },
        Was::File { sha256, mode } => {
            let bytes = blobs
                .get(sha256)
                .ok_or_else(|| format!("its pre-image (sha256 {sha256}) is not in the store"))?;
            let tmp = temporary(name);
            let write = || -> std::io::Result<()> {
                let mut opts = OpenOptions::new();
                opts.write(true).create_new(true).follow(FollowSymlinks::No);
                let mut f = holder.open_with(&tmp, &opts)?;
                f.write_all(bytes)?;
                use cap_std::fs::PermissionsExt;
                f.set_permissions(cap_std::fs::Permissions::from_mode(*mode))?;
                f.sync_all()
            };
            if let Err(e) = write() {
                let _ = holder.remove_file(&tmp);
                return Err(io("it could not be written", e));
            }
            replace(&holder, &tmp, name)
        }
        Was::Link(target) => {
            let tmp = temporary(name);
            holder.symlink(target, &tmp).map_err(|e| io("the link could not be made", e))?;
            replace(&holder, &tmp, name)
        }
        Was::Lost(why) => Err(why.clone()),
    }
}

/// Renames `tmp` onto `name` in `dir` (an empty directory there is removed first).
fn replace(dir: &Dir, tmp: &str, name: &str) -> Result<(), String> {
    if dir.symlink_metadata(name).is_ok_and(|m| m.is_dir()) {
        dir.remove_dir(name).map_err(|e| {
            let _ = dir.remove_file(tmp);
            format!("a directory is there now and could not be removed: {e}")
        })?;
    }
    dir.rename(tmp, dir, name).map_err(|e| {
        let _ = dir.remove_file(tmp);
        format!("it could not be put in place: {e}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::plan::PathPlan;
    use crate::grant::Grant;

    #[test]
    fn a_path_is_found_in_the_deepest_grant_that_holds_it() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let grants = [
            Grant::new(a.path(), "/w", Access::Rw).unwrap().opened().unwrap(),
            Grant::new(b.path(), "/w/sub", Access::Ro).unwrap().opened().unwrap(),
        ];
        assert_eq!(locate(&grants, "/w/x.txt"), Some((0, "x.txt".into())));
        assert_eq!(locate(&grants, "/w/sub/y.txt"), Some((1, "y.txt".into())));
        assert_eq!(locate(&grants, "/elsewhere/y.txt"), None);
        assert_eq!(locate(&grants, "/w/../etc/passwd"), None);
    }

    #[test]
    fn a_file_is_put_back_a_made_one_removed_and_a_changed_one_is_a_conflict() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "after\n").unwrap();
        std::fs::write(dir.path().join("new.txt"), "made\n").unwrap();
        std::fs::write(dir.path().join("edited.txt"), "someone else\n").unwrap();
        let sha = |t: &str| hex::encode(Sha256::digest(t.as_bytes()));
        let grants = [Grant::new(dir.path(), "/w", Access::Rw).unwrap().opened().unwrap()];
        let mut plan = Plan::default();
        plan.paths.insert(
            "/w/a.txt".into(),
            PathPlan {
                was: Was::File { sha256: sha("before\n"), mode: 0o600 },
                left: Left::File(Some(sha("after\n"))),
            },
        );
        plan.paths.insert(
            "/w/new.txt".into(),
            PathPlan { was: Was::Absent, left: Left::File(Some(sha("made\n"))) },
        );
        plan.paths.insert(
            "/w/edited.txt".into(),
            PathPlan {
                was: Was::File { sha256: sha("v1\n"), mode: 0o644 },
                left: Left::File(Some(sha("v2\n"))),
            },
        );
        let blobs: HashMap<String, Vec<u8>> = [
            (sha("before\n"), b"before\n".to_vec()),
            (sha("v1\n"), b"v1\n".to_vec()),
        ]
        .into();
        let mut items = check(&plan, &grants, &Force::None, 2, &blobs);
        let outcome = |items: &[PathRewind], p: &str| {
            items.iter().find(|i| i.path == p).map(|i| i.outcome).unwrap()
        };
        assert_eq!(outcome(&items, "/w/a.txt"), "would");
        let diff = items.iter().find(|i| i.path == "/w/a.txt").unwrap().diff.clone().unwrap();
        assert!(diff.contains("-after") && diff.contains("+before"), "{diff}");
        assert_eq!(outcome(&items, "/w/edited.txt"), "conflict");
        apply(&mut items, &grants, &blobs);
        assert_eq!(std::fs::read_to_string(dir.path().join("a.txt")).unwrap(), "before\n");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("a.txt")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!dir.path().join("new.txt").exists());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("edited.txt")).unwrap(),
            "someone else\n",
            "a conflict is left alone"
        );
        // Again: everything is as it was already; forced, the conflict is put back too.
        let again = check(&plan, &grants, &Force::Paths(vec!["/w/edited.txt".into()]), 2, &blobs);
        assert_eq!(outcome(&again, "/w/a.txt"), "already");
        assert_eq!(outcome(&again, "/w/new.txt"), "already");
        let mut again = again;
        apply(&mut again, &grants, &blobs);
        assert_eq!(std::fs::read_to_string(dir.path().join("edited.txt")).unwrap(), "v1\n");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.contains("keel-rewind"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
