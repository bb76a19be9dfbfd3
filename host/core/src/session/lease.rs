//! Runner leases: the `runner_leases` table, which says which runner (process) runs a
//! session. A fact of the session's runtime, so SessionEngine owns the table: Brain decides
//! when to take, renew and give up a lease (through these functions), and a turn's last commit
//! releases it in its own transaction when Brain asked for that. This module reads no other
//! table.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use crate::store::{StoreError, now_ms};

/// A lease not renewed for this long is considered abandoned (its process died).
pub const LEASE_TTL: Duration = Duration::from_secs(15);

/// The holder of `id`'s lease and its last heartbeat, if any.
pub(crate) fn holder_in(c: &Connection, id: &str) -> Result<Option<(String, i64)>, StoreError> {
    Ok(c.prepare_cached("SELECT owner, heartbeat_ms FROM runner_leases WHERE session_id=?1")?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?)
}

/// Every lease: session, holder, last heartbeat.
pub(crate) fn all_in(c: &Connection) -> Result<Vec<(String, String, i64)>, StoreError> {
    Ok(c.prepare("SELECT session_id, owner, heartbeat_ms FROM runner_leases")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?)
}

/// Whether `owner` holds `id`'s lease.
pub(crate) fn holds_in(c: &Connection, id: &str, owner: &str) -> Result<bool, StoreError> {
    Ok(c.prepare_cached(
        "SELECT EXISTS(SELECT 1 FROM runner_leases WHERE session_id=?1 AND owner=?2)",
    )?
    .query_row(params![id, owner], |r| r.get(0))?)
}

/// Drops `id`'s lease, whoever holds it (its holder is gone).
pub(crate) fn drop_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    c.prepare_cached("DELETE FROM runner_leases WHERE session_id=?1")?.execute([id])?;
    Ok(())
}

/// Renews `owner`'s lease of `id`.
pub(crate) fn heartbeat_in(c: &Connection, id: &str, owner: &str) -> Result<(), StoreError> {
    c.prepare_cached("UPDATE runner_leases SET heartbeat_ms=?3 WHERE session_id=?1 AND owner=?2")?
        .execute(params![id, owner, now_ms()])?;
    Ok(())
}

/// Releases `owner`'s lease of `id`. The caller has checked that no input waits (a runner
/// keeps its lease while the inbox has work).
pub fn release_in(c: &Connection, id: &str, owner: &str) -> Result<(), StoreError> {
    c.prepare_cached("DELETE FROM runner_leases WHERE session_id=?1 AND owner=?2")?
        .execute(params![id, owner])?;
    Ok(())
}

/// Takes the runner lease of `id` for `owner` if it is free, abandoned, or already theirs.
pub(crate) fn acquire_in(c: &Connection, id: &str, owner: &str) -> Result<bool, StoreError> {
    let now = now_ms();
    let free = match holder_in(c, id)? {
        None => true,
        Some((o, _)) if o == owner => true,
        Some((o, beat)) => !lease_live(&o, beat, now),
    };
    if free {
        c.prepare_cached(
            "INSERT INTO runner_leases (session_id, owner, heartbeat_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT (session_id) DO UPDATE SET owner=excluded.owner, heartbeat_ms=excluded.heartbeat_ms",
        )?
        .execute(params![id, owner, now])?;
    }
    Ok(free)
}

/// A runner's identity: `host/pid/start/nonce`. On the same host, a lease whose process is gone
/// (or whose pid now belongs to a process started later) is abandoned at once; elsewhere it is
/// abandoned when its heartbeat is older than [`LEASE_TTL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunnerId {
    host: String,
    pid: u32,
    start: u64,
    nonce: String,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

/// The start time of process `pid` (clock ticks since boot), where the system tells it.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split(' ').nth(19)?.parse().ok()
}

impl RunnerId {
    pub(crate) fn current(nonce: &str) -> Self {
        let pid = std::process::id();
        Self {
            host: hostname(),
            pid,
            start: process_start(pid).unwrap_or(0),
            nonce: nonce.to_string(),
        }
    }

    fn parse(s: &str) -> Option<Self> {
        let mut p = s.rsplitn(4, '/');
        let nonce = p.next()?.to_string();
        let start = p.next()?.parse().ok()?;
        let pid = p.next()?.parse().ok()?;
        let host = p.next()?.to_string();
        Some(Self { host, pid, start, nonce })
    }
}

impl std::fmt::Display for RunnerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}/{}", self.host, self.pid, self.start, self.nonce)
    }
}

/// Whether the lease of `holder`, last renewed at `beat`, still binds its session.
pub(crate) fn lease_live(holder: &str, beat: i64, now: i64) -> bool {
    if let Some(h) = RunnerId::parse(holder)
        && h.host == hostname()
        && h.start != 0
    {
        if h.pid == std::process::id() {
            return true;
        }
        return process_start(h.pid) == Some(h.start);
    }
    now - beat <= LEASE_TTL.as_millis() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runner_ids_round_trip_and_dead_processes_release_their_leases() {
        let me = RunnerId::current("abc");
        assert_eq!(RunnerId::parse(&me.to_string()), Some(me.clone()));
        assert!(lease_live(&me.to_string(), 0, i64::MAX), "this process is alive");
        // A pid with another start time is a different (or no) process.
        let other = RunnerId { pid: me.pid, start: me.start + 1, ..me.clone() };
        let dead = RunnerId { pid: u32::MAX - 1, ..me.clone() };
        assert!(!lease_live(&dead.to_string(), now_ms(), now_ms()));
        assert!(lease_live(&other.to_string(), 0, 0), "same pid counts as this process");
        // Another host: the heartbeat decides.
        let remote = RunnerId { host: "elsewhere".into(), ..me };
        assert!(lease_live(&remote.to_string(), now_ms(), now_ms()));
        assert!(!lease_live(&remote.to_string(), 0, LEASE_TTL.as_millis() as i64 + 1));
    }
}
