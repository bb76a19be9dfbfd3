//! The wire: resolving a host once and checking every address, connecting before the
//! deadline, TLS, one HTTP/1.1 exchange, and a response body metered against the call's cap.

use super::*;

/// Resolves `host` once and checks every address it names.
pub(super) async fn resolve(
    plan: &EgressPlan,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, Stop> {
    let ips: Vec<IpAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => {
            let lookup = tokio::net::lookup_host((host, port));
            let found = tokio::time::timeout_at(plan.deadline.into(), lookup)
                .await
                .map_err(|_| {
                    fail(
                        format!("resolving {host} ran past the call's deadline"),
                        Error::DnsTimeout,
                    )
                })?
                .map_err(|e| {
                    fail(
                        format!("{host} cannot be resolved: {e}"),
                        Error::DnsError { rcode: Some(e.to_string()), info_code: None },
                    )
                })?;
            let mut ips: Vec<IpAddr> = found.map(|a| a.ip()).collect();
            ips.dedup();
            ips
        }
    };
    if ips.is_empty() {
        return Err(fail(format!("{host} resolves to no address"), Error::DestinationNotFound));
    }
    let excepted = plan.grants.loopback.iter().any(|l| l.host == host && l.port == port);
    for ip in &ips {
        if let Some(why) = addr::refusal(*ip) {
            if excepted && addr::is_loopback(*ip) {
                continue;
            }
            let hint = if addr::is_loopback(*ip) {
                " (a loopback test server needs --net-allow-loopback HOST:PORT)"
            } else {
                ""
            };
            return Err(deny(format!(
                "{host} resolves to {ip}, {why}: refused before connecting{hint}"
            )));
        }
    }
    Ok(ips.into_iter().map(|ip| SocketAddr::new(ip, port)).collect())
}

/// Connects to the first checked address that answers.
pub(super) async fn connect(
    addrs: &[SocketAddr],
    deadline: Instant,
) -> Result<tokio::net::TcpStream, Stop> {
    let mut last = None;
    for a in addrs {
        match tokio::time::timeout_at(deadline.into(), tokio::net::TcpStream::connect(a)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(e)) => last = Some(format!("{a}: {e}")),
            Err(_) => {
                return Err(fail(
                    format!("connecting to {a} ran past the call's deadline"),
                    Error::ConnectionTimeout,
                ));
            }
        }
    }
    Err(fail(
        format!("no address answered ({})", last.unwrap_or_default()),
        Error::ConnectionRefused,
    ))
}

trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// The process's TLS client settings: the platform's verifier, HTTP/1.1.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>> =
        std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            crate::tls::init();
            use rustls_platform_verifier::ConfigVerifierExt;
            let mut c =
                rustls::ClientConfig::with_platform_verifier().map_err(|e| e.to_string())?;
            c.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(c))
        })
        .clone()
}

/// TLS (for https), the HTTP/1.1 handshake, the request and the response head.
pub(super) async fn exchange(
    tcp: tokio::net::TcpStream,
    scheme: Scheme,
    host: &str,
    request: http::Request<Full<Bytes>>,
    deadline: Instant,
) -> Result<(http::Response<hyper::body::Incoming>, IoFuture), Stop> {
    let late =
        |what: &str| fail(format!("{what} ran past the call's deadline"), Error::ConnectionTimeout);
    let stream: Box<dyn Stream> = match scheme {
        Scheme::Http => Box::new(tcp),
        Scheme::Https => {
            let config = tls_config()
                .map_err(|e| fail(format!("TLS setup: {e}"), Error::TlsProtocolError))?;
            let name = match host.parse::<IpAddr>() {
                Ok(ip) => rustls::pki_types::ServerName::from(ip),
                Err(_) => {
                    rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| {
                        fail(
                            format!("{host} is not a TLS server name: {e}"),
                            Error::TlsProtocolError,
                        )
                    })?
                }
            };
            let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp);
            let tls = tokio::time::timeout_at(deadline.into(), tls)
                .await
                .map_err(|_| late("the TLS handshake"))?
                .map_err(|e| fail(format!("TLS with {host}: {e}"), Error::Tls(e)))?;
            Box::new(tls)
        }
    };
    let io = wasmtime_wasi_http::io::TokioIo::new(stream);
    let (mut sender, conn) =
        tokio::time::timeout_at(deadline.into(), hyper::client::conn::http1::handshake(io))
            .await
            .map_err(|_| late("the HTTP handshake"))?
            .map_err(|e| fail(format!("HTTP handshake: {e}"), Error::from(e)))?;
    let mut conn = Box::pin(conn);
    let mut conn_done = false;
    let send = sender.send_request(request);
    let mut send = std::pin::pin!(send);
    let response = tokio::time::timeout_at(deadline.into(), async {
        loop {
            tokio::select! {
                r = &mut send => break r,
                c = &mut conn, if !conn_done => {
                    conn_done = true;
                    if let Err(e) = c {
                        break Err(e);
                    }
                }
            }
        }
    })
    .await
    .map_err(|_| late("waiting for the response"))?
    .map_err(|e| fail(format!("the exchange failed: {e}"), Error::from(e)))?;
    let io: IoFuture = Box::new(async move {
        if !conn_done {
            conn.await.map_err(Error::from)?;
        }
        Ok(())
    });
    Ok((response, io))
}

/// A response body that counts what it hands on against the call's byte cap.
pub(super) struct Metered {
    pub(super) inner: hyper::body::Incoming,
    pub(super) ledger: Arc<Ledger>,
    pub(super) at: Option<usize>,
    pub(super) cap: u64,
}

impl Body for Metered {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    let (at, cap) = (self.at, self.cap);
                    self.ledger.update(at, |r| r.received += n);
                    if let Err(left) = self.ledger.take(n, cap) {
                        self.ledger.update(at, |r| {
                            r.outcome = "failed".into();
                            r.reason = Some(format!(
                                "the response body passed the call's network byte cap of {cap} bytes; the rest was not read"
                            ));
                        });
                        return Poll::Ready(Some(Err(Error::HttpResponseBodySize(Some(left)))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Error::from(e)))),
            other => other.map(|_| None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}
