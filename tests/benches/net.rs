//! The cost of network egress through keel's hook, against a loopback HTTP server (plain
//! http, a new connection per request, a 2 KiB body), measured in one run:
//!
//! - a direct request from the host (hyper's HTTP/1.1 client on a fresh connection): the
//!   baseline;
//! - the same request through the egress hook (grant match, the name resolved once and every
//!   address classified, the connection to the checked address, the metered body), from the
//!   host — the hook's own cost over the baseline;
//! - a refused request (a destination no grant allows): the cost of a denial;
//! - a whole `http_fetch` tool call (fresh instance, the guest's `wasi:http` request through
//!   the hook, the JSON output), and a refused one.
//!
//! `cargo bench -p keel-tests --bench net`. `KEEL_BENCH_REQUESTS` sets the requests per
//! series (default 400). Prints p50/p99; asserts nothing about time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use keel::sandbox::Budget;
use keel::sandbox::net::{Egress, EgressPlan, NetGrants};
use keel_tests::web_peer::WebPeer;

#[global_allocator]
static ALLOCATOR: keel::Allocator = keel::Allocator;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn report(name: &str, mut ms: Vec<f64>, baseline: Option<f64>) -> f64 {
    ms.sort_by(|a, b| a.total_cmp(b));
    let (p50, p99) = (percentile(&ms, 0.5), percentile(&ms, 0.99));
    let ratio = baseline.map(|b| format!("  ({:.2}× the direct p50)", p50 / b)).unwrap_or_default();
    println!("{name:<44} p50 {:>8.1} µs   p99 {:>8.1} µs{ratio}", p50 * 1e3, p99 * 1e3);
    p50
}

async fn direct(port: u16, path: &str) -> usize {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let io = hyper_util::rt::TokioIo::new(tcp);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    let driver = tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", format!("localhost:{port}"))
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let res = sender.send_request(req).await.unwrap();
    let n = res.into_body().collect().await.unwrap().to_bytes().len();
    let _ = driver.await;
    n
}

fn grants(port: u16) -> NetGrants {
    NetGrants {
        allow: vec![format!("http://localhost:{port}").parse().unwrap()],
        loopback: vec![format!("localhost:{port}").parse().unwrap()],
        ..NetGrants::default()
    }
}

fn egress(port: u16) -> Egress {
    Egress::new(
        EgressPlan {
            grants: grants(port),
            secrets: Vec::new(),
            known: Vec::new(),
            deadline: Instant::now() + Duration::from_secs(3600),
        },
        std::sync::Arc::new(keel::sandbox::descriptors::Descriptors::new(None)),
    )
}

fn main() {
    let n: usize =
        std::env::var("KEEL_BENCH_REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(400);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let peer = WebPeer::start().await;
        let port = peer.port;
        let path = "/big?n=2048";
        let url = format!("http://localhost:{port}{path}");
        println!(
            "egress: {n} requests per series, loopback server, new connection each, 2 KiB body"
        );
        // Warm up both paths.
        for _ in 0..20 {
            direct(port, path).await;
            egress(port).get(&url).await.unwrap();
        }
        let mut base = Vec::with_capacity(n);
        let mut hook = Vec::with_capacity(n);
        // Interleaved, so both series see the same machine.
        for _ in 0..n {
            let t = Instant::now();
            assert_eq!(direct(port, path).await, 2048);
            base.push(t.elapsed().as_secs_f64() * 1e3);
            let e = egress(port);
            let t = Instant::now();
            assert_eq!(e.get(&url).await.unwrap(), (200, 2048));
            hook.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let b = report("direct request (host, hyper)", base, None);
        report("through the egress hook (host)", hook, Some(b));
        let mut denied = Vec::with_capacity(n);
        let before = peer.connections();
        for _ in 0..n {
            let e = egress(port);
            let t = Instant::now();
            assert!(e.get(&format!("http://localhost:{}/", port + 1)).await.is_err());
            denied.push(t.elapsed().as_secs_f64() * 1e3);
        }
        assert_eq!(peer.connections(), before);
        report("refused by the hook (no grant)", denied, Some(b));

        // Whole tool calls.
        let dir = tempfile::tempdir().unwrap();
        let service = keel_tests::service_in(dir.path(), keel_tests::test_limits()).await;
        let g = grants(port);
        let input = serde_json::json!({"url": url}).to_string();
        let refused =
            serde_json::json!({"url": format!("http://localhost:{}/", port + 1)}).to_string();
        let call = |input: String, g: NetGrants| {
            let service = &service;
            async move {
                let o =
                    keel_tests::try_call_net(service, "http_fetch", &input, &g, Budget::default())
                        .await
                        .unwrap();
                o.report.result.is_ok()
            }
        };
        for _ in 0..10 {
            call(input.clone(), g.clone()).await;
        }
        let calls = (n / 2).max(10);
        let mut ok = Vec::with_capacity(calls);
        let mut no = Vec::with_capacity(calls);
        for _ in 0..calls {
            let t = Instant::now();
            assert!(call(input.clone(), g.clone()).await);
            ok.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            assert!(!call(refused.clone(), g.clone()).await);
            no.push(t.elapsed().as_secs_f64() * 1e3);
        }
        report("http_fetch tool call, allowed", ok, Some(b));
        report("http_fetch tool call, refused", no, Some(b));
    });
}
