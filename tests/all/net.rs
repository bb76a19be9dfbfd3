//! Network egress and the secrets broker: `http_fetch` through keel's hook against a real
//! HTTP server on loopback. No test sends traffic anywhere but loopback: every refusal below
//! happens before a connection is made, and the server counts the connections it accepts.

use std::time::{Duration, Instant};

use keel::api::Caller;
use keel::sandbox::Budget;
use keel::sandbox::net::NetGrants;
use keel::secrets::{Secret, SecretStore};
use keel::tools::{CallOutcome, ToolService, ToolServiceError};
use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::web_peer::WebPeer;
use keel_tests::{guests, service_in, test_limits};
use serde_json::{Value, json};

const CANARY: &str = "canary-s3cr3t-0042-zz";

fn net(allow: &[String], loopback: &[String], secrets: &[String]) -> NetGrants {
    NetGrants {
        allow: allow.iter().map(|s| s.parse().unwrap()).collect(),
        loopback: loopback.iter().map(|s| s.parse().unwrap()).collect(),
        secrets: secrets.iter().map(|s| s.parse().unwrap()).collect(),
        ..NetGrants::default()
    }
}

async fn fetch_with(s: &ToolService, input: Value, net: &NetGrants, budget: Budget) -> CallOutcome {
    keel_tests::try_call_net(s, "http_fetch", &input.to_string(), net, budget).await.unwrap()
}

async fn fetch(s: &ToolService, input: Value, net: &NetGrants) -> CallOutcome {
    fetch_with(s, input, net, Budget::default()).await
}

fn error_of(o: &CallOutcome) -> (String, String) {
    let e = o.report.result.as_ref().expect_err("the call should have failed");
    (e.kind().to_string(), e.to_string())
}

fn reasons(o: &CallOutcome) -> Vec<String> {
    o.report.net.records.iter().filter_map(|r| r.reason.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_host_reaches_a_loopback_server_only_with_its_exception() {
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    let peer = WebPeer::start().await;
    let p = peer.port;
    let url = format!("http://localhost:{p}/echo?q=1");
    let with = net(&[format!("http://localhost:{p}")], &[format!("localhost:{p}")], &[]);
    let o = fetch(&s, json!({"url": url}), &with).await;
    let out = o.report.result.as_ref().unwrap();
    assert_eq!(out["status"], 200, "{out}");
    assert_eq!(out["json"]["method"], "GET");
    assert_eq!(out["json"]["path"], "/echo?q=1");
    assert_eq!(peer.connections(), 1);
    let r = &o.report.net.records[0];
    assert_eq!(
        (r.method.as_str(), r.host.as_str(), r.port, r.path.as_str(), r.status, r.outcome.as_str()),
        ("GET", "localhost", p, "/echo", Some(200), "ok")
    );
    assert!(r.received > 0, "{r:?}");

    // The same grant without the exception: refused before connecting.
    let without = net(&[format!("http://localhost:{p}")], &[], &[]);
    let o = fetch(&s, json!({"url": url}), &without).await;
    let (kind, message) = error_of(&o);
    assert_eq!(kind, "denied", "{message}");
    assert!(message.contains("HTTP-request-denied"), "{message}");
    let why = reasons(&o).join(" ");
    assert!(why.contains("loopback") && why.contains("--net-allow-loopback"), "{why}");
    assert_eq!(o.report.net.records[0].outcome, "denied");
    assert_eq!(peer.connections(), 1, "a refused request made a connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_and_address_forms_that_reach_private_space_are_refused_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    let peer = WebPeer::start().await;
    let p = peer.port;
    for host in [
        "127.0.0.1",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "[64:ff9b::7f00:1]",
        "169.254.169.254",
        "10.0.0.1",
        "[fd00::1]",
        "0.0.0.0",
    ] {
        let grants = net(&[format!("http://{host}:{p}")], &[], &[]);
        let o = fetch(&s, json!({"url": format!("http://{host}:{p}/")}), &grants).await;
        assert_eq!(error_of(&o).0, "denied", "{host}");
        let why = reasons(&o).join(" ");
        assert!(why.contains("refused before connecting"), "{host}: {why}");
    }
    // An exception is keyed on the name and the port: the address of that name, reached
    // under another name, stays refused.
    let grants = net(
        &[format!("http://localhost:{p}"), format!("http://127.0.0.1:{p}")],
        &[format!("localhost:{p}")],
        &[],
    );
    let o = fetch(&s, json!({"url": format!("http://127.0.0.1:{p}/")}), &grants).await;
    assert_eq!(error_of(&o).0, "denied");
    let other_port =
        net(&[format!("http://localhost:{}", p + 1)], &[format!("localhost:{}", p + 1)], &[]);
    let o = fetch(&s, json!({"url": format!("http://localhost:{p}/")}), &other_port).await;
    assert!(
        reasons(&o).join(" ").contains("no --net grant allows http://localhost"),
        "{:?}",
        reasons(&o)
    );
    assert_eq!(peer.connections(), 0, "a refused request made a connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_grant_every_request_is_refused_and_https_is_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    let peer = WebPeer::start().await;
    let p = peer.port;
    let url = format!("http://localhost:{p}/");
    let o = fetch(&s, json!({"url": url}), NetGrants::none()).await;
    assert_eq!(error_of(&o).0, "denied");
    assert!(reasons(&o)[0].contains("no network is granted"), "{:?}", reasons(&o));
    // A grant without a scheme is https: plain http to the same host and port is refused.
    let https_only = net(&[format!("localhost:{p}")], &[format!("localhost:{p}")], &[]);
    let o = fetch(&s, json!({"url": url}), &https_only).await;
    assert!(reasons(&o)[0].contains("no --net grant allows http://localhost"), "{:?}", reasons(&o));
    assert_eq!(peer.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_cap_and_the_call_deadline_stop_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    let peer = WebPeer::start().await;
    let p = peer.port;
    let mut grants = net(&[format!("http://localhost:{p}")], &[format!("localhost:{p}")], &[]);
    grants.max_bytes = 4096;
    let o = fetch(&s, json!({"url": format!("http://localhost:{p}/big?n=100000")}), &grants).await;
    let (kind, message) = error_of(&o);
    assert_eq!(kind, "failed", "{message}");
    assert!(message.contains("byte cap"), "{message}");
    assert!(reasons(&o)[0].contains("network byte cap of 4096 bytes"), "{:?}", reasons(&o));
    // A request body over the cap is refused before anything is sent.
    let seen = peer.seen().len();
    let body = "y".repeat(5000);
    let o = fetch(
        &s,
        json!({"url": format!("http://localhost:{p}/echo"), "method": "POST", "body": body}),
        &grants,
    )
    .await;
    assert!(error_of(&o).1.contains("byte cap"), "{}", error_of(&o).1);
    assert_eq!(peer.seen().len(), seen, "an over-cap body was sent");

    // The call's deadline bounds the wait for a server that does not answer.
    let started = Instant::now();
    let budget = Budget { timeout: Duration::from_millis(1500), ..Budget::default() };
    let o = fetch_with(
        &s,
        json!({"url": format!("http://localhost:{p}/slow?ms=20000")}),
        &grants,
        budget,
    )
    .await;
    assert!(o.report.result.is_err());
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_followed_only_to_a_granted_destination() {
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    let peer = WebPeer::start().await;
    let p = peer.port;
    let grants = net(&[format!("http://localhost:{p}")], &[format!("localhost:{p}")], &[]);
    let o =
        fetch(&s, json!({"url": format!("http://localhost:{p}/redirect?to=/echo")}), &grants).await;
    let out = o.report.result.as_ref().unwrap();
    assert_eq!(out["status"], 200);
    assert_eq!(out["redirects"][0], format!("http://localhost:{p}/echo"));

    let before = peer.connections();
    let away = format!("http://localhost:{p}/redirect?to=http://127.0.0.1:{p}/echo");
    let o = fetch(&s, json!({"url": away}), &grants).await;
    assert_eq!(error_of(&o).0, "denied");
    let outcomes: Vec<(&str, Option<u16>)> =
        o.report.net.records.iter().map(|r| (r.outcome.as_str(), r.status)).collect();
    assert_eq!(outcomes, [("ok", Some(302)), ("denied", None)]);
    assert_eq!(peer.connections(), before + 1, "the refused hop connected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_goes_only_to_its_bound_destination_and_never_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    SecretStore::new(dir.path()).set("TOKEN", Secret::new(CANARY.into())).unwrap();
    let peer = WebPeer::start().await;
    let p = peer.port;
    let grants = net(
        &[format!("http://localhost:{p}"), format!("http://127.0.0.1:{p}")],
        &[format!("localhost:{p}"), format!("127.0.0.1:{p}")],
        &[format!("TOKEN@http://localhost:{p}:in=header,query,body")],
    );
    let o = fetch(
        &s,
        json!({
            "url": format!("http://localhost:{p}/echo?key={{{{secret:TOKEN}}}}"),
            "method": "POST",
            "headers": {"Authorization": "Bearer guest-own", "X-Echo": "{{secret:TOKEN}}"},
            "body": "key={{secret:TOKEN}}",
        }),
        &grants,
    )
    .await;
    let out = o.report.result.as_ref().unwrap();
    let got = peer.seen().pop().unwrap();
    assert_eq!(got.header("authorization"), Some(format!("Bearer {CANARY}").as_str()));
    assert_eq!(got.header("x-echo"), Some(CANARY));
    assert_eq!(got.body, format!("key={CANARY}"));
    assert_eq!(got.path, format!("/echo?key={CANARY}"));
    assert_eq!(
        got.headers.iter().filter(|(k, _)| k == "authorization").count(),
        1,
        "the guest's own was kept"
    );
    // The server echoed the secret back: the call's output holds only its mark.
    let text = out.to_string();
    assert!(!text.contains(CANARY), "{text}");
    assert!(text.contains("[secret:TOKEN]"), "{text}");
    assert!(!format!("{:?}", o.report.net).contains(CANARY));

    // The placeholder sent anywhere else: refused, nothing sent.
    let before = peer.seen().len();
    let o = fetch(
        &s,
        json!({"url": format!("http://127.0.0.1:{p}/echo"), "headers": {"X-Key": "{{secret:TOKEN}}"}}),
        &grants,
    )
    .await;
    assert_eq!(error_of(&o).0, "denied");
    assert!(reasons(&o)[0].contains("not bound to this destination"), "{:?}", reasons(&o));
    assert_eq!(peer.seen().len(), before);
    // Another destination gets no credential, and the guest's own header goes through.
    fetch(
        &s,
        json!({"url": format!("http://127.0.0.1:{p}/echo"), "headers": {"Authorization": "Bearer guest-own"}}),
        &grants,
    )
    .await;
    let got = peer.seen().pop().unwrap();
    assert_eq!(got.header("authorization"), Some("Bearer guest-own"));
    // A secret not in the store refuses the call before it runs.
    let missing = net(
        &[format!("http://localhost:{p}")],
        &[format!("localhost:{p}")],
        &[format!("NOPE@http://localhost:{p}")],
    );
    let input = json!({"url": format!("http://localhost:{p}/")}).to_string();
    let e = keel_tests::try_call_net(&s, "http_fetch", &input, &missing, Budget::default())
        .await
        .unwrap_err();
    assert!(matches!(e, ToolServiceError::Secret(_)), "{e}");
    assert!(e.to_string().contains("keel secret set NOPE"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_importing_wasi_http_must_declare_external() {
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    let bytes = std::fs::read(guests::NET_READONLY_COMPONENT).unwrap();
    let e = s.install(&bytes, "net-readonly", "test", false).await.unwrap_err();
    assert!(matches!(e, ToolServiceError::InvalidSpecs { .. }), "{e}");
    assert!(
        e.to_string().contains("must declare the `external` effect; it declares `read-only`"),
        "{e}"
    );
    assert!(s.resolve("net_peek").is_err());
    // The first-party client is external.
    assert_eq!(s.resolve("http_fetch").unwrap().record.effect, keel::policy::Effect::External);
}

/// A canary secret echoed back by the server, through a whole session: the model, the
/// journal, the history and the database files only ever see its mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_secret_never_reaches_the_model_the_journal_or_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let peer = WebPeer::start().await;
    let p = peer.port;
    let args = json!({"url": format!("http://localhost:{p}/echo")}).to_string();
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "http_fetch", args.as_str())]),
        Reply::text("The server answered."),
    ])
    .await;
    let home = keel::home::Home::at(dir.path()).unwrap();
    let h = keel::harness::Harness::open(home, test_limits(), None, Default::default(), &|_| {})
        .await
        .unwrap();
    SecretStore::new(dir.path()).set("TOKEN", Secret::new(CANARY.into())).unwrap();
    let mut spec =
        keel_tests::session_spec(&model.url(), "s", Vec::new(), Some(vec!["http_fetch".into()]));
    spec.preprocess = None;
    spec.allow = vec!["http_fetch".into()];
    spec.net = net(
        &[format!("http://localhost:{p}")],
        &[format!("localhost:{p}")],
        &[format!("TOKEN@http://localhost:{p}")],
    );
    h.create_session(&Caller::Operator, spec).await.unwrap();
    let cancel = keel::cancel::CancelToken::new();
    let done = h
        .send(&Caller::Operator, "s", "Fetch the echo.", &cancel, &keel_tests::no_events())
        .await
        .unwrap();
    assert_eq!(keel_tests::answered(done), "The server answered.");
    assert_eq!(peer.seen()[0].header("authorization"), Some(format!("Bearer {CANARY}").as_str()));
    let requests = model.requests();
    let second = String::from_utf8_lossy(&requests[1]).into_owned();
    assert!(second.contains("[secret:TOKEN]"), "{second}");
    assert!(!second.contains(CANARY));
    // The database, its WAL and shared memory, while the harness still has them open.
    let read = files_without(dir.path(), CANARY);
    let db = keel_tests::store_of(&dir.path().join("keel.db"));
    if db.backend() == keel::sql::Backend::Postgres {
        // The database is not in the home: every row of every table, as text.
        for table in keel::store::copy::TABLES {
            let rows: Option<String> = db
                .query_row(&format!("SELECT string_agg(t::text, '') FROM {table} t"), [], |r| {
                    r.get(0)
                })
                .unwrap();
            assert!(!rows.unwrap_or_default().contains(CANARY), "the canary is in {table}");
        }
    } else {
        assert!(read.iter().any(|n| n == "keel.db-wal"), "{read:?}");
    }
    drop(h);
    let (result, records): (String, String) = db
        .query_row("SELECT result, net FROM tool_calls WHERE session_id='s'", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert!(result.contains("[secret:TOKEN]"), "{result}");
    let records: Value = serde_json::from_str(&records).unwrap();
    assert_eq!(records[0]["status"], 200);
    assert_eq!(records[0]["host"], "localhost");
    let marked: i64 = db
        .query_row(
            "SELECT count(*) FROM messages WHERE session_id='s' AND body LIKE '%[secret:TOKEN]%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(marked >= 1);
    drop(db);
    files_without(dir.path(), CANARY);
}

/// The names of the `keel.db*` files in `dir` that were read (a file that vanished while the
/// last connection closed is skipped); panics if one holds `needle`.
fn files_without(dir: &std::path::Path, needle: &str) -> Vec<String> {
    let mut read = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("keel.db") {
            continue;
        }
        let Ok(bytes) = std::fs::read(entry.path()) else { continue };
        assert!(
            !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "{name} holds the secret"
        );
        read.push(name);
    }
    read
}

/// An `external` call waits for a person by default; the approval shows where it may send
/// requests, and nothing is sent before the decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_shows_where_the_call_may_reach_and_nothing_is_sent_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let peer = WebPeer::start().await;
    let p = peer.port;
    let args = json!({"url": format!("http://localhost:{p}/echo")}).to_string();
    let model = MockModel::start(vec![Reply::calls(&[("c1", "http_fetch", args.as_str())])]).await;
    let home = keel::home::Home::at(dir.path()).unwrap();
    let h = keel::harness::Harness::open(home, test_limits(), None, Default::default(), &|_| {})
        .await
        .unwrap();
    let mut spec =
        keel_tests::session_spec(&model.url(), "s", Vec::new(), Some(vec!["http_fetch".into()]));
    spec.preprocess = None;
    spec.net = net(&[format!("http://localhost:{p}")], &[format!("localhost:{p}")], &[]);
    h.create_session(&Caller::Operator, spec).await.unwrap();
    let cancel = keel::cancel::CancelToken::new();
    let ran = h
        .send(&Caller::Operator, "s", "Fetch the echo.", &cancel, &keel_tests::no_events())
        .await
        .unwrap();
    assert!(
        matches!(ran, keel::brain::Submitted::Ran(keel::agent::TurnOutcome::WaitingApproval(_))),
        "{ran:?}"
    );
    let units: Vec<_> = h
        .approvals(&Caller::Operator, Some("s"), true)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.unit)
        .collect();
    assert_eq!(units[0].tool, "http_fetch");
    assert_eq!(
        units[0].net,
        [
            format!("net http://localhost:{p}"),
            format!("net loopback exception localhost:{p} (testing)"),
            format!("net at most {} bytes per call", keel::sandbox::net::DEFAULT_NET_MAX_BYTES)
        ]
    );
    assert_eq!(peer.connections(), 0);
}

/// A service with the `net_probe` guest (a hostile networked tool) installed.
async fn probe_service(dir: &std::path::Path) -> ToolService {
    let s = service_in(dir, test_limits()).await;
    let bytes = std::fs::read(guests::NET_PROBE_COMPONENT).unwrap();
    s.install(&bytes, "net-probe", "test", false).await.unwrap();
    s
}

async fn probe(s: &ToolService, tool: &str, input: Value, net: &NetGrants) -> CallOutcome {
    keel_tests::try_call_net(s, tool, &input.to_string(), net, Budget::default()).await.unwrap()
}

/// Runs the guest's `net_flood` (many requests at once) with `input`.
async fn flood(s: &ToolService, input: Value, net: &NetGrants) -> CallOutcome {
    probe(s, "net_flood", input, net).await
}

fn outcomes(o: &CallOutcome, outcome: &str) -> usize {
    o.report.net.records.iter().filter(|r| r.outcome == outcome).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j4_a_cut_off_secret_is_redacted_and_an_echoed_value_is_never_sent_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let s = probe_service(dir.path()).await;
    SecretStore::new(dir.path()).set("TOKEN", Secret::new(CANARY.into())).unwrap();
    let peer = WebPeer::start().await;
    let p = peer.port;
    let grants = net(
        &[format!("http://localhost:{p}"), format!("http://127.0.0.1:{p}")],
        &[format!("localhost:{p}"), format!("127.0.0.1:{p}")],
        &[format!("TOKEN@http://localhost:{p}")],
    );
    // `/auth` answers `Bearer CANARY`; cut one byte before the secret's end, and at several
    // shorter lengths: no start of the secret longer than the minimum comes back.
    let whole = "Bearer ".len() + CANARY.len();
    for cut in [whole - 1, whole - 5, "Bearer ".len() + 8] {
        let o = fetch(
            &s,
            json!({"url": format!("http://localhost:{p}/auth"), "max_bytes": cut}),
            &grants,
        )
        .await;
        let text = o.report.result.as_ref().unwrap().to_string();
        let shown = &CANARY[..cut - "Bearer ".len()];
        assert!(!text.contains(shown), "{cut}: {text}");
        assert!(text.contains("[secret:TOKEN…]"), "{cut}: {text}");
    }
    // A tool that read the echoed value sends it on to another granted destination — in the
    // URL, a header or the body, as it is, base64 or hex: refused, nothing reaches the server.
    for (place, encoding) in [
        ("query", "plain"),
        ("header", "plain"),
        ("body", "plain"),
        ("body", "base64"),
        ("header", "hex"),
    ] {
        let before = peer.seen().len();
        let o = probe(
            &s,
            "net_relay",
            json!({
                "from": format!("http://localhost:{p}/auth"),
                "to": format!("http://127.0.0.1:{p}/echo"),
                "place": place, "encoding": encoding, "after": "Bearer ",
            }),
            &grants,
        )
        .await;
        let out = o.report.result.as_ref().unwrap();
        assert!(out["sent"]["Err"].is_string(), "{place}/{encoding}: {out}");
        let reasons = reasons(&o);
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("value of secret `TOKEN`")
                    && r.contains("not to this destination")),
            "{place}/{encoding}: {reasons:?}"
        );
        assert_eq!(
            peer.seen().len(),
            before + 1,
            "{place}/{encoding}: only the read reached the server"
        );
        assert!(!out.to_string().contains(CANARY));
    }
    // Back to the destination it is bound to, it goes.
    let o = probe(
        &s,
        "net_relay",
        json!({"from": format!("http://localhost:{p}/auth"), "to": format!("http://localhost:{p}/echo"), "place": "body", "after": "Bearer "}),
        &grants,
    )
    .await;
    assert_eq!(o.report.result.as_ref().unwrap()["sent"]["Ok"], 200, "{:?}", o.report.result);

    // A placeholder goes into headers only unless the grant says where else.
    let before = peer.seen().len();
    let o = fetch(
        &s,
        json!({"url": format!("http://localhost:{p}/echo"), "method": "POST", "body": "k={{secret:TOKEN}}"}),
        &grants,
    )
    .await;
    assert_eq!(error_of(&o).0, "denied");
    assert!(
        reasons(&o)[0].contains("in its body, where its grant does not let keel write it"),
        "{:?}",
        reasons(&o)
    );
    assert_eq!(peer.seen().len(), before);
    // Request records never show a secret, whatever field it is put in.
    let o = fetch(&s, json!({"url": format!("http://127.0.0.1:{p}/{CANARY}/x")}), &grants).await;
    assert!(!format!("{:?}", o.report.net).contains(CANARY), "{:?}", o.report.net);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j5_a_call_is_bounded_in_requests_at_once_in_all_and_in_header_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let s = probe_service(dir.path()).await;
    let peer = WebPeer::start().await;
    let p = peer.port;
    let mut grants = net(&[format!("http://localhost:{p}")], &[format!("localhost:{p}")], &[]);
    // Forty at once to a slow server: sixteen in flight, the rest refused without a connection.
    let o =
        flood(&s, json!({"url": format!("http://localhost:{p}/slow?ms=3000"), "n": 40}), &grants)
            .await;
    let out = o.report.result.as_ref().unwrap();
    assert_eq!(out["answered"], 16, "{out}");
    assert_eq!(outcomes(&o, "ok"), 16);
    assert_eq!(outcomes(&o, "denied"), 24);
    assert!(reasons(&o).iter().all(|r| r.contains("16 requests in flight")), "{:?}", reasons(&o));
    assert_eq!(peer.connections(), 16);
    // --net-max-requests bounds the requests of a call in all.
    grants.max_requests = 5;
    let before = peer.connections();
    let o = flood(&s, json!({"url": format!("http://localhost:{p}/echo"), "n": 8}), &grants).await;
    assert_eq!(outcomes(&o, "ok"), 5, "{:?}", o.report.net);
    assert!(reasons(&o).iter().all(|r| r.contains("5 requests in all")), "{:?}", reasons(&o));
    assert_eq!(peer.connections(), before + 5);
    // The request line and headers count against the byte cap: a large header is refused
    // before anything is sent, and what is sent is counted.
    grants.max_requests = 256;
    grants.max_bytes = 1000;
    let before = peer.connections();
    let o = flood(
        &s,
        json!({"url": format!("http://localhost:{p}/echo"), "n": 1, "header_bytes": 3000}),
        &grants,
    )
    .await;
    assert_eq!(outcomes(&o, "denied"), 1);
    assert!(reasons(&o)[0].contains("request line and headers"), "{:?}", reasons(&o));
    assert_eq!(o.report.net.records[0].sent, 0);
    assert_eq!(peer.connections(), before);
    grants.max_bytes = 1 << 20;
    let o = flood(&s, json!({"url": format!("http://localhost:{p}/echo"), "n": 1}), &grants).await;
    assert!(o.report.net.records[0].sent > 40, "{:?}", o.report.net);
    // An authority with userinfo is refused.
    let before = peer.connections();
    let o = flood(&s, json!({"url": format!("http://a.test@localhost:{p}/echo"), "n": 1}), &grants)
        .await;
    assert_eq!(outcomes(&o, "ok"), 0, "{:?}", o.report.net);
    assert_eq!(peer.connections(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j5_requests_left_in_flight_are_cancelled_and_recorded_when_the_call_ends() {
    let dir = tempfile::tempdir().unwrap();
    let s = probe_service(dir.path()).await;
    let peer = WebPeer::start().await;
    let p = peer.port;
    let grants = net(&[format!("http://localhost:{p}")], &[format!("localhost:{p}")], &[]);
    // Three POSTs to a slow server, left in flight: the tool returns a second later, long before
    // any answer.
    let o = flood(
        &s,
        json!({"url": format!("http://localhost:{p}/slow?ms=3000"), "n": 3, "forget": true,
               "linger_ms": 1000, "body_bytes": 100}),
        &grants,
    )
    .await;
    assert_eq!(o.report.result.as_ref().unwrap()["started"], 3);
    // The server read all three; each is in the report, cancelled, with what it sent.
    assert_eq!(peer.seen().len(), 3);
    assert_eq!(o.report.net.records.len(), 3, "{:?}", o.report.net);
    assert_eq!(outcomes(&o, "cancelled"), 3, "{:?}", o.report.net);
    assert!(o.report.net.records.iter().all(|r| r.sent > 100), "{:?}", o.report.net);
    // A request started just as the call returns is cancelled too; any the server read is
    // in the report.
    let before = peer.seen().len();
    let o = flood(
        &s,
        json!({"url": format!("http://localhost:{p}/slow?ms=3000"), "n": 3, "forget": true}),
        &grants,
    )
    .await;
    assert!(o.report.net.records.iter().all(|r| r.outcome == "cancelled"), "{:?}", o.report.net);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = o.report.net.records.iter().filter(|r| r.sent > 0).count();
    assert!(
        peer.seen().len() - before <= sent,
        "{} read, {sent} recorded",
        peer.seen().len() - before
    );
    // Nothing more reaches the server after the call.
    let seen = peer.connections();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(peer.connections(), seen);
}
