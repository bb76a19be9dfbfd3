//! keel's process-wide share of file descriptors for tools.
//!
//! Every call is capped on its own (16 requests in flight, its byte and file quotas), but many
//! calls run at once — a workgroup of children and grandchildren, each flooding — and together
//! they could take every descriptor the process may open, so the store could not open its
//! database and the front-ends could not accept a connection. Tools therefore draw on one
//! share, sized from the process's limit of open files (`RLIMIT_NOFILE`, whose soft value keel
//! first raises to its hard one) less a reserve kept for the store, the front-ends and keel's
//! own files: a quarter of the limit, and at least [`MIN_RESERVE`].
//!
//! Drawn on: each directory grant of a call (its handle and the guest's preopen), each file or
//! directory a guest holds open, each outgoing connection. A call's grants and a connection
//! wait for room until the call's deadline (they queue behind other calls); a file a guest
//! opens past the share is refused at once with the reason in the call's report.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Descriptors kept out of the tools' share at least.
pub const MIN_RESERVE: usize = 128;

/// Descriptors the soft limit is raised to at most (the kernel's usual `nr_open`).
const MAX_RAISED: u64 = 1 << 20;

/// The share: a semaphore of descriptors.
#[derive(Debug)]
pub struct Descriptors {
    sem: Arc<Semaphore>,
    total: usize,
}

/// Room the share does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "keel's share of file descriptors for tools ({total}, of the process's limit of open files) is in use by other calls{waited}"
)]
pub struct Exhausted {
    pub total: usize,
    waited: &'static str,
}

impl Descriptors {
    /// The share of this process: `total` descriptors, else sized from the limit of open
    /// files (see the module docs).
    pub fn new(total: Option<usize>) -> Self {
        let total = total.unwrap_or_else(|| {
            let limit = raise_open_files_limit();
            let reserve = (limit / 4).max(MIN_RESERVE);
            limit.saturating_sub(reserve).max(1)
        });
        Self { sem: Arc::new(Semaphore::new(total)), total }
    }

    /// The share's size.
    #[cfg(any(test, feature = "internals"))]
    pub fn total(&self) -> usize {
        self.total
    }

    /// Descriptors free now.
    #[cfg(any(test, feature = "internals"))]
    pub fn available(&self) -> usize {
        self.sem.available_permits()
    }

    /// `n` descriptors now, or why not.
    pub fn try_take(&self, n: usize) -> Result<OwnedSemaphorePermit, Exhausted> {
        self.sem
            .clone()
            .try_acquire_many_owned(n as u32)
            .map_err(|_| Exhausted { total: self.total, waited: "; nothing was opened" })
    }

    /// `n` descriptors, waiting for them until `deadline`.
    pub async fn take(
        &self,
        n: usize,
        deadline: Instant,
    ) -> Result<OwnedSemaphorePermit, Exhausted> {
        if n == 0 {
            return self.try_take(0);
        }
        let n = (n.min(self.total)) as u32;
        let wait = self.sem.clone().acquire_many_owned(n);
        match tokio::time::timeout_at(deadline.into(), wait).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(Exhausted {
                total: self.total,
                waited: ", and stayed so until the call's deadline; nothing was opened",
            }),
        }
    }
}

/// Raises the soft limit of open files to the hard one (at most [`MAX_RAISED`]) and returns
/// the limit in force.
#[cfg(unix)]
fn raise_open_files_limit() -> usize {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    let soft = limit.current.unwrap_or(MAX_RAISED);
    let hard = limit.maximum.unwrap_or(MAX_RAISED).min(MAX_RAISED);
    if soft < hard {
        limit.current = Some(hard);
        if setrlimit(Resource::Nofile, limit).is_ok() {
            return hard as usize;
        }
    }
    soft.min(MAX_RAISED) as usize
}

#[cfg(not(unix))]
fn raise_open_files_limit() -> usize {
    1024
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_share_refuses_or_queues_past_its_size_and_frees_what_is_dropped() {
        let d = Descriptors::new(Some(3));
        let a = d.try_take(2).unwrap();
        let e = d.try_take(2).unwrap_err();
        assert!(e.to_string().contains("share of file descriptors for tools (3"), "{e}");
        let soon = Instant::now() + std::time::Duration::from_millis(50);
        assert!(d.take(2, soon).await.is_err());
        drop(a);
        assert_eq!(d.available(), 3);
        let _b = d.take(3, Instant::now() + std::time::Duration::from_secs(1)).await.unwrap();
        assert_eq!(d.available(), 0);
        // A limit read from the process leaves the reserve.
        let p = Descriptors::new(None);
        assert!(p.total() >= 1);
    }
}
