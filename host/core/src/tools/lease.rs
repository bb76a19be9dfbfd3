//! Workspace execution leases: read-only calls on a directory share it, writers are exclusive.
//!
//! A call asks for all of its directories at once (shared or exclusive each) and gets all or
//! none, so two calls can never deadlock by taking them in different orders. Leases are held
//! for the duration of one sandbox run and released on drop.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

#[derive(Debug, Default, Clone, Copy)]
struct State {
    readers: usize,
    writer: bool,
}

#[derive(Default)]
struct Table {
    dirs: Mutex<HashMap<PathBuf, State>>,
    changed: Condvar,
}

/// The process's lease table. Clones share it.
#[derive(Clone, Default)]
pub struct Leases(Arc<Table>);

/// One directory a call needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRequest {
    pub dir: PathBuf,
    pub exclusive: bool,
}

/// Held leases; released when dropped.
pub struct LeaseGuard {
    table: Arc<Table>,
    held: Vec<LeaseRequest>,
}

/// The directories stayed busy past the wait limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("workspace {dir} is busy with another call (waited {waited:?}); try again")]
pub struct LeaseBusy {
    pub dir: String,
    pub waited: Duration,
}

impl Leases {
    /// Takes every requested lease, waiting at most `wait` for them to become free.
    pub fn acquire(
        &self,
        requests: Vec<LeaseRequest>,
        wait: Duration,
    ) -> Result<LeaseGuard, LeaseBusy> {
        let started = Instant::now();
        let mut dirs = self.0.dirs.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let blocked = requests.iter().find(|r| {
                let s = dirs.get(&r.dir).copied().unwrap_or_default();
                s.writer || (r.exclusive && s.readers > 0)
            });
            let Some(blocked) = blocked else { break };
            let waited = started.elapsed();
            if waited >= wait {
                return Err(LeaseBusy { dir: blocked.dir.display().to_string(), waited });
            }
            dirs = self
                .0
                .changed
                .wait_timeout(dirs, wait - waited)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        for r in &requests {
            let s = dirs.entry(r.dir.clone()).or_default();
            if r.exclusive {
                s.writer = true;
            } else {
                s.readers += 1;
            }
        }
        Ok(LeaseGuard { table: self.0.clone(), held: requests })
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        let mut dirs = self.table.dirs.lock().unwrap_or_else(PoisonError::into_inner);
        for r in &self.held {
            if let Some(s) = dirs.get_mut(&r.dir) {
                if r.exclusive {
                    s.writer = false;
                } else {
                    s.readers = s.readers.saturating_sub(1);
                }
                if !s.writer && s.readers == 0 {
                    dirs.remove(&r.dir);
                }
            }
        }
        self.table.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(dir: &str, exclusive: bool) -> Vec<LeaseRequest> {
        vec![LeaseRequest { dir: PathBuf::from(dir), exclusive }]
    }

    #[test]
    fn readers_share_writers_exclude() {
        let leases = Leases::default();
        let short = Duration::from_millis(20);
        let r1 = leases.acquire(req("/w", false), short).unwrap();
        let r2 = leases.acquire(req("/w", false), short).unwrap();
        assert!(leases.acquire(req("/w", true), short).is_err());
        drop((r1, r2));
        let w = leases.acquire(req("/w", true), short).unwrap();
        assert!(leases.acquire(req("/w", false), short).is_err());
        assert!(leases.acquire(req("/other", true), short).is_ok());
        drop(w);
        assert!(leases.acquire(req("/w", false), short).is_ok());
    }

    #[test]
    fn a_waiting_writer_gets_the_lease_when_readers_leave() {
        let leases = Leases::default();
        let reader = leases.acquire(req("/w", false), Duration::from_secs(1)).unwrap();
        let l2 = leases.clone();
        let t =
            std::thread::spawn(move || l2.acquire(req("/w", true), Duration::from_secs(5)).is_ok());
        std::thread::sleep(Duration::from_millis(50));
        drop(reader);
        assert!(t.join().unwrap());
    }
}
