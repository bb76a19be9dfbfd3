//! What a session did and holds, read: the list of sessions, a session's timeline, its
//! request evidence, events (read after N, or followed), its model calls and token estimate.

use super::events::{self, EventRow};
use super::{SessionEngine, facts, lease};
use crate::ids::SessionId;
use crate::store::StoreError;

/// What the store holds now, for the metrics page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreGauges {
    /// Sessions by state (`idle`, `running`, `waiting_approval` …).
    pub sessions: Vec<(String, i64)>,
    /// Approval units waiting for a decision, and when the oldest was asked for (ms).
    pub approvals_pending: i64,
    pub oldest_pending_ms: Option<i64>,
    /// Runner leases renewed within their time to live (sessions a host is running now).
    pub live_leases: i64,
    /// The store's clock when read (ms).
    pub now_ms: i64,
}

/// How long a follower waits out a database it cannot reach before it gives its reader the
/// error, and the waits between its tries.
const FOLLOW_OUTAGE: std::time::Duration = std::time::Duration::from_secs(60);
const FOLLOW_BACKOFF_MIN: std::time::Duration = std::time::Duration::from_millis(50);
const FOLLOW_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(2);

impl SessionEngine {
    /// What the store holds now: sessions by state, approvals waiting, live leases.
    pub async fn gauges(&self) -> Result<StoreGauges, StoreError> {
        self.db
            .read(|c| {
                let sessions = c
                    .prepare("SELECT state, COUNT(*) FROM sessions GROUP BY state ORDER BY state")?
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                let (approvals_pending, oldest_pending_ms) = c
                    .prepare(
                        "SELECT COUNT(*), MIN(created_at) FROM approvals WHERE status='pending'",
                    )?
                    .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
                let now_ms = lease::db_now_in(c)?;
                let ttl = i64::try_from(lease::lease_ttl().as_millis()).unwrap_or(i64::MAX);
                let live_leases = c
                    .prepare(
                        "SELECT COUNT(*) FROM runner_leases WHERE owner <> '' AND heartbeat_ms > ?1",
                    )?
                    .query_row([now_ms.saturating_sub(ttl)], |r| r.get(0))?;
                Ok(StoreGauges {
                    sessions,
                    approvals_pending,
                    oldest_pending_ms,
                    live_leases,
                    now_ms,
                })
            })
            .await
    }

    /// Events of session `id` after sequence number `after`, oldest first, at most `limit`.
    /// An unknown session is an error (a session without events yet has none).
    pub async fn events_after(
        &self,
        id: &SessionId,
        after: i64,
        limit: usize,
    ) -> Result<Vec<EventRow>, StoreError> {
        let id = id.clone();
        self.db
            .read_inline(move |c| {
                facts::load_counters(c, &id)?;
                events::after(c, &id, after, limit)
            })
            .await
    }

    /// Follows session `id`'s events after sequence number `after`, whichever process
    /// commits them: the receiver gets each new event once, in order, until it is dropped.
    /// Every commit of this process wakes the follower at once; the store is also polled every
    /// `every` for other processes' commits (one indexed read of the rows after the last one
    /// seen; no busy loop). A database that cannot be reached (a server restarting) is waited
    /// out for up to a minute, the follower catching up when it answers again; the receiver
    /// gets an error only after that, or for any other failure.
    pub fn follow(
        &self,
        id: &SessionId,
        after: i64,
        every: std::time::Duration,
    ) -> tokio::sync::mpsc::Receiver<Result<EventRow, StoreError>> {
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let engine = self.clone();
        let id = id.clone();
        let mut commits = self.db.commits();
        tokio::spawn(async move {
            let mut last = after;
            // Since when reads have failed (none while they succeed), and the wait before the
            // next try.
            let mut failing: Option<tokio::time::Instant> = None;
            let mut backoff = FOLLOW_BACKOFF_MIN;
            loop {
                match engine.events_after(&id, last, 256).await {
                    Ok(rows) => {
                        failing = None;
                        backoff = FOLLOW_BACKOFF_MIN;
                        let full = rows.len() == 256;
                        for row in rows {
                            last = row.seq;
                            if tx.send(Ok(row)).await.is_err() {
                                return;
                            }
                        }
                        if full {
                            continue;
                        }
                    }
                    // A lost connection (the server restarted) is waited out: the next read
                    // connects again and catches up from the last event sent.
                    Err(e)
                        if e.is_unreachable()
                            && failing.get_or_insert_with(tokio::time::Instant::now).elapsed()
                                < FOLLOW_OUTAGE =>
                    {
                        tracing::debug!(session = %id, "following waits for the database: {e}");
                        tokio::select! {
                            () = tokio::time::sleep(backoff) => {}
                            () = tx.closed() => return,
                        }
                        backoff = (backoff * 2).min(FOLLOW_BACKOFF_MAX);
                        continue;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
                // This process's commits wake the follower at once; another process's are
                // seen at the next poll.
                tokio::select! {
                    () = tokio::time::sleep(every) => {}
                    changed = commits.changed() => {
                        if changed.is_err() {
                            tokio::time::sleep(every).await;
                        }
                    }
                    () = tx.closed() => return,
                }
            }
        });
        rx
    }

    /// The last event's sequence number of session `id` (0 when it has none).
    pub async fn last_event(&self, id: &SessionId) -> Result<i64, StoreError> {
        let id = id.clone();
        self.db.read_inline(move |c| events::last_seq(c, &id)).await
    }
}
