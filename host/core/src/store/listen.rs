//! Wake-ups on PostgreSQL: one connection per process that `LISTEN`s on `keel_events`, which
//! every appended session event notifies when its transaction commits. A notification is only
//! a hint — it bumps the same counter this process's own commits bump, and followers then read
//! the event table by sequence number, which stays the truth. When the connection is lost the
//! listener connects and listens again (backing off up to [`MAX_BACKOFF`]) and wakes every
//! follower once, so each re-reads from its last sequence and misses nothing; followers keep
//! their fallback poll meanwhile.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::StreamExt;

use super::{DbStats, StoreError};

/// The channel session events are notified on.
pub const CHANNEL: &str = "keel_events";
/// The application name of listener connections (so an operator can tell them apart).
pub const APPLICATION: &str = "keel-listener";
/// The longest wait between two attempts to connect again.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Starts the listener of `config`'s database; it wakes `wake` and stops when no follower is
/// left to wake (every receiver of `wake` dropped).
pub(super) fn start(
    mut config: tokio_postgres::Config,
    wake: Arc<tokio::sync::watch::Sender<u64>>,
    stats: Arc<DbStats>,
) -> Result<(), StoreError> {
    config.application_name(APPLICATION);
    let runtime = crate::sql::pg::runtime()?;
    runtime.spawn(async move {
        let mut backoff = Duration::from_millis(50);
        while !wake.is_closed() {
            match listen_once(&config, &wake, &stats).await {
                Ok(()) => backoff = Duration::from_millis(50),
                Err(e) => tracing::debug!(error = %e, "the event listener lost its connection"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    });
    Ok(())
}

/// Connects, listens, and wakes on every notification until the connection ends (an error) or
/// nobody is left to wake (`Ok`).
async fn listen_once(
    config: &tokio_postgres::Config,
    wake: &tokio::sync::watch::Sender<u64>,
    stats: &DbStats,
) -> Result<(), String> {
    let tls = crate::sql::pg::tls();
    let (client, mut connection) =
        config.connect(tls).await.map_err(|e| crate::sql::pg::describe(&e))?;
    let (notified, mut notifications) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(tokio_postgres::AsyncMessage::Notification(_)) => {
                    if notified.send(()).is_err() {
                        return Ok(());
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(crate::sql::pg::describe(&e)),
            }
        }
        Err("the server closed the connection".to_string())
    });
    client
        .batch_execute(&format!("LISTEN {CHANNEL}"))
        .await
        .map_err(|e| crate::sql::pg::describe(&e))?;
    stats.listens.fetch_add(1, Ordering::Relaxed);
    // Listening again after a loss: what was committed meanwhile was never notified here, so
    // every follower reads after its last sequence now.
    wake.send_modify(|n| *n = n.wrapping_add(1));
    loop {
        tokio::select! {
            got = notifications.recv() => match got {
                Some(()) => {
                    stats.notifications.fetch_add(1, Ordering::Relaxed);
                    // Several notifications waiting are one wake-up.
                    while notifications.try_recv().is_ok() {
                        stats.notifications.fetch_add(1, Ordering::Relaxed);
                    }
                    wake.send_modify(|n| *n = n.wrapping_add(1));
                }
                None => break,
            },
            () = wake.closed() => {
                driver.abort();
                return Ok(());
            }
        }
    }
    drop(client);
    match driver.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e),
        Err(e) => Err(format!("the listener's task failed: {e}")),
    }
}
