//! TLS for PostgreSQL connections: rustls, the server's certificate verified by the platform's
//! verifier (the system's trust store; `SSL_CERT_FILE` names another bundle). Used when the URL
//! says `sslmode=require`; otherwise keel connects without TLS (see [`super::pg::config`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

/// Makes a TLS connector per connection, for the host it connects to. The client asks for one
/// on every connection, TLS or not; the TLS settings — which read the system's trust store —
/// are built at the first handshake, so a connection without TLS reads no certificate.
#[derive(Clone)]
pub(crate) struct MakeRustls;

/// The process's TLS settings for PostgreSQL (built once, at the first handshake).
fn settings() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            crate::tls::init();
            use rustls_platform_verifier::ConfigVerifierExt;
            rustls::ClientConfig::with_platform_verifier()
                .map(Arc::new)
                .map_err(|e| format!("cannot set up TLS: {e}"))
        })
        .clone()
}

/// Connects one stream to `name`.
pub(crate) struct Rustls {
    name: ServerName<'static>,
}

/// A TLS stream to the server.
pub(crate) struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = Rustls;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, host: &str) -> Result<Rustls, Self::Error> {
        Ok(Rustls { name: ServerName::try_from(host.to_string())? })
    }
}

impl<S> TlsConnect<S> for Rustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let connector = tokio_rustls::TlsConnector::from(settings().map_err(io::Error::other)?);
            Ok(RustlsStream(connector.connect(self.name, stream).await?))
        })
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for RustlsStream<S> {
    /// No channel binding: SCRAM authenticates without it (`SCRAM-SHA-256`, not `-PLUS`).
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}
