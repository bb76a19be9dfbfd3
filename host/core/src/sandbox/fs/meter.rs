//! The write meter of a call's filesystem: bytes charged against the write quota, shared by
//! the guard and the output streams it hands out, which charge each write — the bytes, plus
//! the hole when a write starts past the end of the file.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use wasmtime_wasi::p2::{DynOutputStream, OutputStream, Pollable, StreamError, StreamResult};

/// Bytes charged against the quota, shared by the guard and the streams it hands out.
#[derive(Debug)]
pub(super) struct Meter {
    pub(super) charged: AtomicU64,
    pub(super) quota: u64,
    pub(super) exceeded: AtomicBool,
}

impl Meter {
    /// Charges `n` bytes; false (nothing charged) when that would pass the quota.
    pub(super) fn charge(&self, n: u64) -> bool {
        let mut cur = self.charged.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(n).filter(|next| *next <= self.quota) else {
                self.exceeded.store(true, Ordering::Relaxed);
                return false;
            };
            match self.charged.compare_exchange_weak(
                cur,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }
}

/// An output stream on a file whose writes are charged to the call's quota: the bytes, plus
/// the hole when a write starts past the end of the file.
pub(super) struct MeteredStream {
    pub(super) inner: DynOutputStream,
    pub(super) meter: Arc<Meter>,
    /// Where the next write lands.
    pub(super) pos: u64,
    /// The file's size as far as this stream knows.
    pub(super) size: u64,
    pub(super) append: bool,
}

impl MeteredStream {
    fn charge(&mut self, n: u64) -> StreamResult<()> {
        if self.append {
            self.pos = self.size;
        }
        let cost = n.saturating_add(self.pos.saturating_sub(self.size));
        if !self.meter.charge(cost) {
            let err = std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error());
            return Err(StreamError::LastOperationFailed(err.into()));
        }
        self.pos = self.pos.saturating_add(n);
        self.size = self.size.max(self.pos);
        Ok(())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for MeteredStream {
    async fn ready(&mut self) {
        self.inner.ready().await;
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for MeteredStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.charge(bytes.len() as u64)?;
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.inner.check_write()
    }

    async fn blocking_write_and_flush(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.charge(bytes.len() as u64)?;
        self.inner.blocking_write_and_flush(bytes).await
    }

    fn write_zeroes(&mut self, nelem: usize) -> StreamResult<()> {
        self.charge(nelem as u64)?;
        self.inner.write_zeroes(nelem)
    }

    async fn write_ready(&mut self) -> StreamResult<usize> {
        self.inner.write_ready().await
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_meter_refuses_what_passes_the_quota_and_charges_nothing_for_it() {
        let m = Meter { charged: AtomicU64::new(0), quota: 10, exceeded: AtomicBool::new(false) };
        assert!(m.charge(6));
        assert!(!m.charge(5));
        assert!(m.exceeded.load(Ordering::Relaxed));
        assert!(m.charge(4));
        assert_eq!(m.charged.load(Ordering::Relaxed), 10);
        assert!(!m.charge(u64::MAX));
    }
}
