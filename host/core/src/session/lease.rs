//! Runner leases: the `runner_leases` table, which says which runner (process) runs a
//! session. A fact of the session's runtime, so SessionEngine owns the table: Brain decides
//! when to take, renew and give up a lease (through these functions), and a turn's last commit
//! releases it in its own transaction when Brain asked for that. This module reads no other
//! table.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::sql::{Backend, Connection, OptionalExtension, params};
use crate::store::{StoreError, now_ms};

pub(crate) use crate::store::lease_ttl;

/// How often a runner renews its lease: a third of the TTL, so two renewals may be lost
/// before the lease expires.
pub fn heartbeat_every() -> Duration {
    lease_ttl() / 3
}

/// A lease as held: its holder and the fencing token its acquisition was given. Every write a
/// runner makes to its session's state checks the token against the lease row in the same
/// transaction; a newer acquisition (by another runner, after this one stopped renewing) has a
/// greater token, and the stale runner's writes are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub owner: Arc<str>,
    pub token: i64,
}

/// The fences this process's runners hold, by session. One per SessionEngine: a runner
/// registers its fence when it takes a lease and removes it when it gives the lease up.
#[derive(Debug, Default)]
pub(crate) struct Fences {
    held: Mutex<HashMap<String, Fence>>,
}

impl Fences {
    pub(crate) fn hold(&self, id: &str, fence: Fence) {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).insert(id.to_string(), fence);
    }

    pub(crate) fn drop_held(&self, id: &str, owner: &str) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.get(id).is_some_and(|f| &*f.owner == owner) {
            held.remove(id);
        }
    }

    pub(crate) fn of(&self, id: &str) -> Option<Fence> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).get(id).cloned()
    }
}

/// The time by the database's clock, in milliseconds since the Unix epoch: lease expiry is
/// judged by one clock for every host (PostgreSQL's; SQLite's store has one host).
pub(crate) fn db_now_in(c: &Connection) -> Result<i64, StoreError> {
    match c.backend() {
        Backend::Sqlite => Ok(now_ms()),
        Backend::Postgres => Ok(c
            .prepare_cached("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")?
            .query_row([], |r| r.get(0))?),
    }
}

/// The holder of `id`'s lease and its last heartbeat, if any.
pub(crate) fn holder_in(c: &Connection, id: &str) -> Result<Option<(String, i64)>, StoreError> {
    Ok(c.prepare_cached(
        "SELECT owner, heartbeat_ms FROM runner_leases WHERE session_id=?1 AND owner <> ''",
    )?
    .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
    .optional()?)
}

/// A held lease: session, holder, last heartbeat.
pub(crate) type Held = (String, String, i64);

/// Every held lease.
pub(crate) fn all_in(c: &Connection) -> Result<Vec<Held>, StoreError> {
    Ok(c.prepare("SELECT session_id, owner, heartbeat_ms FROM runner_leases WHERE owner <> ''")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?)
}

/// What recovery may look at: the held leases it locked, and the sessions whose lease row
/// another transaction has locked (a host taking or checking that lease right now), which it
/// must leave alone. On PostgreSQL the rows are locked `FOR UPDATE SKIP LOCKED`, so several
/// hosts recovering at once each claim different sessions and none waits for another; SQLite's
/// one writer sees no locked row.
pub(crate) fn for_recovery_in(c: &Connection) -> Result<(Vec<Held>, HashSet<String>), StoreError> {
    if c.backend() == Backend::Sqlite {
        return Ok((all_in(c)?, Default::default()));
    }
    let locked: Vec<Held> = c
        .prepare_cached(
            "SELECT session_id, owner, heartbeat_ms FROM runner_leases FOR UPDATE SKIP LOCKED",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    let mine: HashSet<&str> = locked.iter().map(|l| l.0.as_str()).collect();
    let busy = c
        .prepare_cached("SELECT session_id FROM runner_leases")?
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|id| !mine.contains(id.as_str()))
        .collect();
    let held = locked.into_iter().filter(|l| !l.1.is_empty()).collect();
    Ok((held, busy))
}

/// Makes session `id`'s lease row, free, if it has none (PostgreSQL: a row to lock before
/// deciding; a row being made by another transaction is waited for).
fn free_row_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    c.prepare_cached(
        "INSERT INTO runner_leases (session_id, owner, heartbeat_ms, fence)
         VALUES (?1, '', 0, 0) ON CONFLICT DO NOTHING",
    )?
    .execute_pipelined([id])?;
    Ok(())
}

/// The lease row of session `id`, which recovery found with work in flight but no lease it
/// could lock: on PostgreSQL the row is made if the session never had one, then locked
/// `FOR UPDATE SKIP LOCKED`. `None` when another transaction holds it (a host taking the
/// session right now); else its holder (empty when free) and heartbeat. A host taking the
/// session's first lease while this runs is waited for, so recovery never mistakes a turn
/// that host just began for one whose runner is gone. SQLite's one writer needs no lock.
pub(crate) fn lock_unheld_in(
    c: &Connection,
    id: &str,
) -> Result<Option<(String, i64)>, StoreError> {
    if c.backend() == Backend::Sqlite {
        return Ok(Some((String::new(), 0)));
    }
    free_row_in(c, id)?;
    Ok(c.prepare_cached(
        "SELECT owner, heartbeat_ms FROM runner_leases WHERE session_id=?1
             FOR UPDATE SKIP LOCKED",
    )?
    .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
    .optional()?)
}

/// Whether `owner` holds `id`'s lease.
pub(crate) fn holds_in(c: &Connection, id: &str, owner: &str) -> Result<bool, StoreError> {
    Ok(c.prepare_cached(
        "SELECT EXISTS(SELECT 1 FROM runner_leases WHERE session_id=?1 AND owner=?2)",
    )?
    .query_row(params![id, owner], |r| r.get(0))?)
}

/// Drops `id`'s lease, whoever holds it (its holder is gone), and moves its token on: a
/// holder that was only paused finds its token stale. The row stays, so the next
/// acquisition's token is greater than every earlier one.
pub(crate) fn drop_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    c.prepare_cached("UPDATE runner_leases SET owner='', fence=fence+1 WHERE session_id=?1")?
        .execute([id])?;
    Ok(())
}

/// Renews `owner`'s lease of `id`; false when `owner` no longer holds it (another runner took
/// it after this one stopped renewing: this runner must stop).
pub(crate) fn heartbeat_in(c: &Connection, id: &str, owner: &str) -> Result<bool, StoreError> {
    let now = db_now_in(c)?;
    Ok(c.prepare_cached(
        "UPDATE runner_leases SET heartbeat_ms=?3 WHERE session_id=?1 AND owner=?2",
    )?
    .execute(params![id, owner, now])?
        == 1)
}

/// Gives up every lease `owner` holds (a host stopping cleanly), moving each token on as
/// [`drop_in`] does: what the stopping process still tries to write is refused, and other
/// hosts take the sessions over at their next look instead of after the TTL. Returns how many.
pub(crate) fn release_all_in(c: &Connection, owner: &str) -> Result<usize, StoreError> {
    Ok(c.prepare_cached("UPDATE runner_leases SET owner='', fence=fence+1 WHERE owner=?1")?
        .execute([owner])?)
}

/// Releases `owner`'s lease of `id`. The caller has checked that no input waits (a runner
/// keeps its lease while the inbox has work).
pub(crate) fn release_in(c: &Connection, id: &str, owner: &str) -> Result<(), StoreError> {
    c.prepare_cached("UPDATE runner_leases SET owner='' WHERE session_id=?1 AND owner=?2")?
        .execute(params![id, owner])?;
    Ok(())
}

/// A lease taken: the fencing token it is held with, and whether it was taken from another
/// runner that is gone (its process dead, or its lease expired) — whose work on the session
/// then needs recovering before anything else runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acquired {
    pub token: i64,
    pub from_gone: bool,
}

/// Takes the runner lease of `id` for `owner` if it is free, abandoned, or already theirs. A
/// new holder's token is one more than the last (a holder taking its own lease again keeps its
/// token). On PostgreSQL the lease row is locked first, so two hosts deciding at once decide
/// one after the other.
pub(crate) fn acquire_in(
    c: &Connection,
    id: &str,
    owner: &str,
) -> Result<Option<Acquired>, StoreError> {
    let (now, current): (i64, Option<(String, i64)>) = match c.backend() {
        Backend::Sqlite => (
            now_ms(),
            c.prepare_cached("SELECT owner, heartbeat_ms FROM runner_leases WHERE session_id=?1")?
                .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?,
        ),
        Backend::Postgres => {
            // The row exists after `free_row_in`; the server's clock is read with its lock.
            free_row_in(c, id)?;
            let (owner, beat, now) = c
                .prepare_cached(
                    "SELECT owner, heartbeat_ms,
                            (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                     FROM runner_leases WHERE session_id=?1 FOR UPDATE",
                )?
                .query_row([id], |r| Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?)))?;
            (now, Some((owner, beat)))
        }
    };
    let free = match &current {
        None => true,
        Some((o, _)) if o.is_empty() || o == owner => true,
        Some((o, beat)) => !lease_live(o, *beat, now),
    };
    if !free {
        return Ok(None);
    }
    let from_gone = current.as_ref().is_some_and(|(o, _)| !o.is_empty() && o != owner);
    let token = c
        .prepare_cached(
            "INSERT INTO runner_leases (session_id, owner, heartbeat_ms, fence) VALUES (?1, ?2, ?3, 1)
             ON CONFLICT (session_id) DO UPDATE SET owner=excluded.owner,
                 heartbeat_ms=excluded.heartbeat_ms,
                 fence = CASE WHEN runner_leases.owner = excluded.owner THEN runner_leases.fence
                              ELSE runner_leases.fence + 1 END
             RETURNING fence",
        )?
        .query_row(params![id, owner, now], |r| r.get(0))?;
    Ok(Some(Acquired { token, from_gone }))
}

/// Refuses the write it runs in unless `fence` is still the lease of `id`: the lease row is
/// read under a lock that conflicts with an acquisition's update (PostgreSQL's `FOR SHARE`;
/// `FOR KEY SHARE` would not conflict with an update of the token and would let a stale write
/// through), so no acquisition can commit between this check and the write's commit.
pub(crate) fn check_fence_in(c: &Connection, id: &str, fence: &Fence) -> Result<(), StoreError> {
    let sql = match c.backend() {
        Backend::Sqlite => "SELECT owner, fence FROM runner_leases WHERE session_id=?1",
        Backend::Postgres => "SELECT owner, fence FROM runner_leases WHERE session_id=?1 FOR SHARE",
    };
    let row: Option<(String, i64)> =
        c.prepare_cached(sql)?.query_row([id], |r| Ok((r.get(0)?, r.get(1)?))).optional()?;
    match row {
        Some((owner, token)) if owner == *fence.owner && token == fence.token => Ok(()),
        Some((owner, token)) => Err(StoreError::Fenced(format!(
            "session {id}: this runner's lease (token {}) was taken over{} (token {token}); \
             it stops without writing",
            fence.token,
            if owner.is_empty() { String::new() } else { format!(" by {owner}") },
        ))),
        None => Err(StoreError::Fenced(format!(
            "session {id}: this runner holds no lease (token {}); it stops without writing",
            fence.token
        ))),
    }
}

/// A runner's identity: `host/pid/start/nonce`. On the same host, a lease whose process is gone
/// (or whose pid now belongs to a process started later) is abandoned at once; elsewhere it is
/// abandoned when its heartbeat is older than the lease TTL ([`lease_ttl`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunnerId {
    host: String,
    pid: u32,
    start: u64,
    nonce: String,
}

/// This host's name in runner ids: `KEEL_HOST_ID`, else the kernel's host name. Hosts that
/// share a store must have different names (containers given one host name each need
/// `KEEL_HOST_ID`): a lease held on this host is judged by its process being alive, a lease
/// held elsewhere by its heartbeat.
pub fn host_id() -> String {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        std::env::var("KEEL_HOST_ID")
            .ok()
            .map(|h| h.trim().replace('/', "_"))
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .unwrap_or_else(|_| "unknown-host".into())
            })
    })
    .clone()
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
            host: host_id(),
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
        && h.host == host_id()
        && h.start != 0
    {
        if h.pid == std::process::id() {
            return true;
        }
        return process_start(h.pid) == Some(h.start);
    }
    now - beat <= lease_ttl().as_millis() as i64
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
        assert!(!lease_live(&remote.to_string(), 0, crate::store::LEASE_TTL.as_millis() as i64 + 1));
    }
}
