//! The HTTP listener of keel's network front-ends (`keel serve`, `keel mcp serve --http`): it
//! accepts connections and serves each with hyper under bounds a slow or idle client cannot
//! outlast, so that what one client holds is bounded and everyone else is still served.
//!
//! - **Headers** must arrive within [`Bounds::header_timeout`] of a request's first byte.
//! - **A request body** must arrive whole within [`Bounds::body_timeout`]; past it the body
//!   reads fail with [`BodyTimeout`] (the front-end answers 408).
//! - **An idle connection** (no request in progress and no byte for
//!   [`Bounds::idle_timeout`]) is closed.
//! - **At most [`Bounds::max_connections`]** are open. A new connection past the cap takes the
//!   place of the connection idle the longest (a half-sent request counts as idle: no handler
//!   runs for it); when every connection is serving a request, the newcomer gets a 503.
//!
//! A request is "in progress" from the moment its handler starts until its response body
//! ends (an event stream stays in progress as long as it is open).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use http_body::{Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

pub use keel::config::Bounds;

/// A request body that took longer than [`Bounds::body_timeout`].
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTimeout(pub Duration);

/// Whether `e` (or what caused it) is a [`BodyTimeout`].
pub fn is_body_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.is::<BodyTimeout>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// A body with what the listener adds to it: a request body fails once its deadline passes;
/// a response body marks its connection's request finished when it ends or is dropped.
struct Guarded {
    inner: Body,
    /// The request body's limit and its deadline.
    deadline: Option<(Duration, Pin<Box<tokio::time::Sleep>>)>,
    /// Set once the request body was read to its end.
    read: Option<Arc<AtomicBool>>,
    _busy: Option<Busy>,
}

impl http_body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            if let Some(read) = &self.read
                && (frame.is_none() || self.inner.is_end_stream())
            {
                read.store(true, Ordering::Release);
            }
            return Poll::Ready(frame);
        }
        if let Some((limit, sleep)) = &mut self.deadline
            && sleep.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Some(Err(axum::Error::new(BodyTimeout(*limit)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// One open connection as the listener sees it.
struct Conn {
    /// Milliseconds since the listener started at the last byte read or request finished.
    active_at: AtomicU64,
    /// Requests in progress.
    busy: AtomicUsize,
    /// Told when the connection must close now (it was displaced).
    close: Notify,
}

/// A request in progress on a connection.
struct Busy(Arc<Conn>, Arc<Instant>);

impl Busy {
    fn new(conn: Arc<Conn>, epoch: Arc<Instant>) -> Self {
        conn.busy.fetch_add(1, Ordering::AcqRel);
        Self(conn, epoch)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.active_at.store(millis(&self.1), Ordering::Release);
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

fn millis(epoch: &Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The open connections.
struct Table {
    epoch: Arc<Instant>,
    next: AtomicU64,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    /// Connections displaced or refused for the cap (for the log and tests).
    displaced: AtomicU64,
}

impl Table {
    /// Admits a new connection; past `cap`, the one idle the longest is told to close. `None`
    /// when every connection is serving a request.
    fn admit(&self, cap: usize) -> Option<(u64, Arc<Conn>)> {
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        if conns.len() >= cap {
            if !Self::displace(&mut conns) {
                return None;
            }
            self.displaced.fetch_add(1, Ordering::Relaxed);
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            active_at: AtomicU64::new(millis(&self.epoch)),
            busy: AtomicUsize::new(0),
            close: Notify::new(),
        });
        conns.insert(id, conn.clone());
        Some((id, conn))
    }

    /// Tells the connection idle the longest to close; false if every one is busy.
    fn displace(conns: &mut HashMap<u64, Arc<Conn>>) -> bool {
        let idle = conns
            .iter()
            .filter(|(_, c)| c.busy.load(Ordering::Acquire) == 0)
            .min_by_key(|(_, c)| c.active_at.load(Ordering::Acquire))
            .map(|(id, _)| *id);
        match idle.and_then(|id| conns.remove(&id)) {
            Some(c) => {
                c.close.notify_one();
                true
            }
            None => false,
        }
    }

    /// Makes room for a connection the process could not accept (out of file descriptors).
    fn make_room(&self) {
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        if Self::displace(&mut conns) {
            self.displaced.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn remove(&self, id: u64) {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
    }

    #[cfg(test)]
    fn open(&self) -> usize {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// A stream that notes when it last read a byte.
struct Tracked<S> {
    inner: S,
    conn: Arc<Conn>,
    epoch: Arc<Instant>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.active_at.store(millis(&self.epoch), Ordering::Release);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// How long a stopping listener waits for requests in progress.
const DRAIN: Duration = Duration::from_secs(5);

/// The answer to a connection past the cap when every open one is serving a request.
const FULL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
connection: close\r\ncontent-length: 103\r\n\r\n\
{\"ok\":false,\"error\":{\"kind\":\"busy\",\"message\":\"the server is at its connection cap: try again\"}}\n";

/// Serves `router` on `listener` within `bounds` until `shutdown` completes; then stops
/// accepting, lets requests in progress finish (at most 5 s) and returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    bounds: Bounds,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let table = Arc::new(Table {
        epoch: Arc::new(Instant::now()),
        next: AtomicU64::new(0),
        conns: Mutex::new(HashMap::new()),
        displaced: AtomicU64::new(0),
    });
    let stopping = Arc::new(tokio::sync::watch::Sender::new(false));
    let mut shutdown = std::pin::pin!(shutdown);
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors (or another transient failure): make room by
                // closing the longest-idle connection, and try again shortly.
                tracing::warn!("accepting a connection failed: {e}");
                table.make_room();
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Some((id, conn)) = table.admit(bounds.max_connections) else {
            tasks.spawn(refuse_full(stream));
            continue;
        };
        let table = table.clone();
        let router = router.clone();
        let stopping = stopping.subscribe();
        tasks.spawn(async move {
            connection(stream, conn.clone(), table.epoch.clone(), router, bounds, stopping).await;
            table.remove(id);
        });
    }
    let _ = stopping.send(true);
    let _ = tokio::time::timeout(DRAIN + Duration::from_secs(1), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    let displaced = table.displaced.load(Ordering::Relaxed);
    if displaced > 0 {
        tracing::info!("{displaced} idle connections were closed for the connection cap");
    }
    Ok(())
}

async fn refuse_full(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(FULL)).await;
}

/// Serves one connection until the client closes it, it idles out, it is displaced, or the
/// listener stops.
async fn connection(
    stream: tokio::net::TcpStream,
    conn: Arc<Conn>,
    epoch: Arc<Instant>,
    router: axum::Router,
    bounds: Bounds,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let io = TokioIo::new(Tracked { inner: stream, conn: conn.clone(), epoch: epoch.clone() });
    let service = {
        let (conn, epoch) = (conn.clone(), epoch.clone());
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let busy = Busy::new(conn.clone(), epoch.clone());
            let router = router.clone();
            async move {
                let limit = bounds.body_timeout;
                let read = Arc::new(AtomicBool::new(http_body::Body::is_end_stream(req.body())));
                let req = req.map(|b| {
                    Body::new(Guarded {
                        inner: Body::new(b),
                        deadline: Some((limit, Box::pin(tokio::time::sleep(limit)))),
                        read: Some(read.clone()),
                        _busy: None,
                    })
                });
                let res = tower::ServiceExt::oneshot(router, req).await;
                res.map(|mut r| {
                    // Answered before its body was read (refused, say): the rest of the body
                    // is never read, so the connection cannot carry another request. Say so,
                    // so that the client does not send one on it.
                    if !read.load(Ordering::Acquire) {
                        r.headers_mut().insert(
                            axum::http::header::CONNECTION,
                            axum::http::HeaderValue::from_static("close"),
                        );
                    }
                    r.map(|b| {
                        Body::new(Guarded {
                            inner: b,
                            deadline: None,
                            read: None,
                            _busy: Some(busy),
                        })
                    })
                })
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(bounds.header_timeout);
    let served = builder.serve_connection(io, service);
    let mut served = std::pin::pin!(served);
    loop {
        let idle_left = if conn.busy.load(Ordering::Acquire) > 0 {
            bounds.idle_timeout
        } else {
            let since = millis(&epoch).saturating_sub(conn.active_at.load(Ordering::Acquire));
            bounds.idle_timeout.saturating_sub(Duration::from_millis(since))
        };
        tokio::select! {
            _ = served.as_mut() => return,
            () = conn.close.notified() => return,
            () = tokio::time::sleep(idle_left) => {
                let since = millis(&epoch).saturating_sub(conn.active_at.load(Ordering::Acquire));
                if conn.busy.load(Ordering::Acquire) == 0
                    && Duration::from_millis(since) >= bounds.idle_timeout
                {
                    return;
                }
            }
            _ = stopping.changed() => {
                served.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(DRAIN, served.as_mut()).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked() {
        Bounds::default().check().unwrap();
        let b = Bounds { header_timeout: Duration::ZERO, ..Default::default() };
        assert!(b.check().unwrap_err().contains("header_timeout_secs"));
        let b = Bounds { max_connections: 0, ..Default::default() };
        assert!(b.check().unwrap_err().contains("max_connections"));
    }

    #[test]
    fn the_longest_idle_connection_gives_way_and_busy_ones_never_do() {
        let t = Table {
            epoch: Arc::new(Instant::now()),
            next: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            displaced: AtomicU64::new(0),
        };
        let (a, ca) = t.admit(2).unwrap();
        let (_, cb) = t.admit(2).unwrap();
        ca.active_at.store(5, Ordering::Release);
        cb.active_at.store(10, Ordering::Release);
        let _busy = Busy::new(cb.clone(), t.epoch.clone());
        // A third connection displaces `a` (idle), not `b` (serving a request).
        let (_, _cc) = t.admit(2).unwrap();
        assert!(!t.conns.lock().unwrap().contains_key(&a));
        assert_eq!(t.open(), 2);
        let _busy_c = Busy::new(_cc.clone(), t.epoch.clone());
        assert!(t.admit(2).is_none(), "every connection serves a request");
        assert_eq!(t.displaced.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_timed_out_body_is_recognised_through_its_wrappers() {
        let e = axum::Error::new(BodyTimeout(Duration::from_secs(1)));
        assert!(is_body_timeout(&e));
        let other = std::io::Error::other("x");
        assert!(!is_body_timeout(&other));
    }
}
