//! Captured guest stdout/stderr with a hard cap.
//!
//! A guest may write any amount; the pipe keeps the first `capacity` bytes and counts the rest,
//! so a flood of output costs the host at most `capacity` bytes of memory and never traps the
//! guest (the call's own budget bounds how long it can keep writing).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Largest write a guest is told it may make at once.
const WRITE_PERMIT: usize = 64 * 1024;

#[derive(Default)]
struct Buffer {
    kept: Vec<u8>,
    dropped: u64,
}

/// A capped, shareable output buffer. Clones share the same buffer.
#[derive(Clone)]
pub struct CappedPipe {
    capacity: usize,
    buffer: Arc<Mutex<Buffer>>,
}

/// What a guest wrote to one stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Captured {
    /// The first bytes written, lossily decoded as UTF-8.
    pub text: String,
    /// Bytes written past the cap and dropped.
    pub dropped_bytes: u64,
}

impl Captured {
    /// The text with a truncation marker appended when bytes were dropped.
    pub fn display(&self) -> String {
        if self.dropped_bytes == 0 {
            self.text.clone()
        } else {
            format!(
                "{}\n[… {} more bytes dropped: output cap reached]",
                self.text, self.dropped_bytes
            )
        }
    }
}

impl CappedPipe {
    /// A pipe that keeps at most `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        Self { capacity, buffer: Arc::new(Mutex::new(Buffer::default())) }
    }

    fn push(&self, bytes: &[u8]) {
        let mut buf = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
        let room = self.capacity.saturating_sub(buf.kept.len());
        let keep = bytes.len().min(room);
        buf.kept.extend_from_slice(&bytes[..keep]);
        buf.dropped += (bytes.len() - keep) as u64;
    }

    /// What was written so far.
    pub fn captured(&self) -> Captured {
        let buf = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
        Captured {
            text: String::from_utf8_lossy(&buf.kept).into_owned(),
            dropped_bytes: buf.dropped,
        }
    }
}

impl IsTerminal for CappedPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedPipe {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl OutputStream for CappedPipe {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

impl AsyncWrite for CappedPipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
