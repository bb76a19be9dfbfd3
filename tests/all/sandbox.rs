//! RELIABILITY A1–A8: the sandbox under hostile guests.

use std::time::{Duration, Instant};

use keel::sandbox::{Budget, CallError, CancelToken, SandboxLimits, ToolErrorKind};
use keel::tools::CallRequest;
use keel_tests::{assert_healthy, call, service_in, shared, test_limits};
use serde_json::json;

fn budget_with(f: impl FnOnce(&mut Budget)) -> Budget {
    let mut b = Budget::default();
    f(&mut b);
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a1_infinite_loop_hits_the_deadline_and_other_calls_go_on() {
    let s = shared().await;
    let budget = budget_with(|b| b.timeout = Duration::from_millis(300));
    let started = Instant::now();
    let (spin, echo) = tokio::join!(call(s, "spin", json!({}), &[], budget.clone()), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t = Instant::now();
        let out = call(s, "echo", json!({"text": "other"}), &[], Budget::default()).await;
        (out, t.elapsed())
    });
    assert_eq!(spin.report.result, Err(CallError::Timeout { limit: Duration::from_millis(300) }));
    // The fuel it burned is reported, not the store's stale reading after the stop (a spin
    // loop burns hundreds of millions of units in 300 ms).
    assert!(spin.report.fuel_used > 10_000_000, "fuel_used {}", spin.report.fuel_used);
    assert!(spin.report.fuel_used < budget.fuel);
    // Stopped within the deadline plus a few epoch ticks of slack for a loaded machine.
    assert!(started.elapsed() < Duration::from_millis(300 + 500), "{:?}", started.elapsed());
    assert_eq!(echo.0.report.result, Ok(json!({"text": "other"})));
    assert!(echo.1 < Duration::from_millis(250), "a concurrent call waited {:?}", echo.1);
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a1_infinite_loop_runs_out_of_fuel() {
    let s = shared().await;
    let out = call(s, "spin", json!({}), &[], budget_with(|b| b.fuel = 5_000_000)).await;
    assert_eq!(out.report.result, Err(CallError::FuelExhausted { limit: 5_000_000 }));
    assert_eq!(out.report.fuel_used, 5_000_000);
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2_loop_through_a_host_import_still_hits_the_deadline() {
    let s = shared().await;
    let out = call(
        s,
        "spin_host",
        json!({}),
        &[],
        budget_with(|b| b.timeout = Duration::from_millis(200)),
    )
    .await;
    assert_eq!(out.report.result, Err(CallError::Timeout { limit: Duration::from_millis(200) }));
    assert_eq!(out.report.logs.len(), keel::sandbox::MAX_LOG_RECORDS);
    assert!(out.report.dropped_logs > 0);
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2_blocking_host_call_is_stopped_by_the_deadline() {
    let s = shared().await;
    let started = Instant::now();
    let out = call(
        s,
        "sleep",
        json!({"ms": 60_000}),
        &[],
        budget_with(|b| b.timeout = Duration::from_millis(200)),
    )
    .await;
    assert_eq!(out.report.result, Err(CallError::Timeout { limit: Duration::from_millis(200) }));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a3_unbounded_recursion_is_a_stack_overflow() {
    let s = shared().await;
    let out = call(s, "recurse", json!({}), &[], Budget::default()).await;
    assert_eq!(out.report.result, Err(CallError::StackOverflow));
    // Recursion through frames in linear memory runs off the bottom of the shadow stack: a
    // trap, never a silent corruption.
    let out = call(s, "recurse_frames", json!({}), &[], Budget::default()).await;
    match out.report.result {
        Err(CallError::Crashed { detail }) => assert!(detail.contains("out of bounds"), "{detail}"),
        other => panic!("expected a crash, got {other:?}"),
    }
    assert_healthy(s).await;
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a4_memory_bomb_hits_the_memory_limit() {
    let s = shared().await;
    let limit = 64 << 20;
    let before = rss_kib();
    let out = call(s, "grow", json!({"mib": 4096}), &[], budget_with(|b| b.memory = limit)).await;
    match &out.report.result {
        Err(CallError::MemoryLimit { detail }) => assert!(detail.contains("67108864"), "{detail}"),
        other => panic!("expected memory_limit, got {other:?}"),
    }
    assert!(out.report.memory_peak <= limit);
    let grown = rss_kib().saturating_sub(before);
    assert!(grown < (limit >> 10) + 32 * 1024, "host RSS grew by {grown} KiB");
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a5_huge_output_is_refused_before_the_host_copies_it() {
    let s = shared().await;
    let budget = budget_with(|b| b.max_output = 1 << 20);
    // Past the transfer cap (16 MiB): refused while it is lifted, its size unknown.
    let out = call(s, "huge_output", json!({"mib": 16}), &[], budget.clone()).await;
    assert_eq!(out.report.result, Err(CallError::OutputTooLarge { bytes: None, limit: 1 << 20 }));
    // Under the transfer cap, over the output cap: copied, measured, refused.
    let out = call(s, "huge_output", json!({"mib": 2}), &[], budget).await;
    assert_eq!(
        out.report.result,
        Err(CallError::OutputTooLarge { bytes: Some((2 << 20) + 2), limit: 1 << 20 })
    );
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a5_a_200_mb_output_is_output_too_large_not_a_crash() {
    let s = shared().await;
    let budget = budget_with(|b| b.memory = 1 << 30);
    let out = call(s, "huge_output", json!({"mib": 200}), &[], budget).await;
    assert_eq!(
        out.report.result,
        Err(CallError::OutputTooLarge { bytes: None, limit: Budget::default().max_output })
    );
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a5_error_messages_are_capped_like_output() {
    let s = shared().await;
    let budget = budget_with(|b| b.memory = 1 << 30);
    // 100 MiB of message: refused while it is lifted.
    let out = call(s, "huge_error", json!({"mib": 100}), &[], budget.clone()).await;
    assert_eq!(
        out.report.result,
        Err(CallError::OutputTooLarge { bytes: None, limit: Budget::default().max_output })
    );
    // 1 MiB of message: kept as a typed error, cut to MAX_ERROR_MESSAGE with a marker.
    let out = call(s, "huge_error", json!({"mib": 1}), &[], budget).await;
    let Err(CallError::Tool { kind: ToolErrorKind::Failed, message }) = out.report.result else {
        panic!("expected a typed error: {:?}", out.report.result);
    };
    let cut = (1 << 20) - keel::sandbox::MAX_ERROR_MESSAGE;
    assert_eq!(
        message,
        format!(
            "{} … [{cut} more bytes of the message cut]",
            "e".repeat(keel::sandbox::MAX_ERROR_MESSAGE)
        )
    );
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a6_stdout_and_stderr_floods_are_capped_with_a_marker() {
    let s = shared().await;
    for stream in ["stdout", "stderr"] {
        let out =
            call(s, "flood", json!({"mib": 64, "stream": stream}), &[], Budget::default()).await;
        assert_eq!(out.report.result, Ok(json!(64 << 20)));
        let captured = if stream == "stdout" { &out.report.stdout } else { &out.report.stderr };
        assert_eq!(captured.text.len(), 1 << 20);
        assert_eq!(captured.dropped_bytes, (64 << 20) - (1 << 20));
        assert!(captured.display().ends_with("bytes dropped: output cap reached]"));
    }
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a7_cancelled_call_stops_and_is_recorded_cancelled() {
    let s = shared().await;
    for (tool, input) in [("spin", json!({})), ("sleep", json!({"ms": 60_000}))] {
        let cancel = CancelToken::new();
        let trigger = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            trigger.cancel();
        });
        let input = input.to_string();
        let started = Instant::now();
        let req = CallRequest {
            tool,
            input: &input,
            grants: &[],
            net: keel::sandbox::net::NetGrants::none(),
            budget: Budget::default(),
            cancel: Some(cancel),
            loaded: None,
            policy: None,
            approval: None,
            control: None,
        };
        let out = s.call(req).await.unwrap();
        assert_eq!(out.report.result, Err(CallError::Cancelled), "{tool}");
        assert!(started.elapsed() < Duration::from_secs(2), "{tool} took {:?}", started.elapsed());
    }
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a8_every_call_gets_a_fresh_instance_even_after_a_trap() {
    let s = shared().await;
    let out = call(s, "boom", json!({}), &[], Budget::default()).await;
    match &out.report.result {
        Err(CallError::Crashed { detail }) => {
            assert!(detail.contains("unreachable"), "{detail}");
            assert!(detail.contains("boom: the tool panicked on purpose"), "{detail}");
        }
        other => panic!("expected a crash, got {other:?}"),
    }
    for _ in 0..3 {
        let out = call(s, "counter", json!({}), &[], Budget::default()).await;
        assert_eq!(out.report.result, Ok(json!(1)), "state carried over between calls");
    }
    assert_healthy(s).await;
}

/// A call's memory is reset before the next call may use its pooled slot, including where
/// only the pages a call wrote are reset (PAGEMAP_SCAN): each call dirties 3 MiB of freshly
/// grown pages — across the part of the slot reset by memset and the part given back to the
/// kernel — and the next call, on the same slot, must find them zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a8_no_call_sees_the_memory_a_previous_call_wrote() {
    let dir = tempfile::tempdir().unwrap();
    // One call at a time, so every call reuses the same slot.
    let s =
        service_in(dir.path(), SandboxLimits { max_concurrent_calls: 1, ..test_limits() }).await;
    for round in 0..4 {
        let out = call(&s, "residue", json!({"mib": 3}), &[], Budget::default()).await;
        let v = out.report.result.unwrap();
        assert_eq!(v["dirty_words"], 0, "round {round}: a previous call's data survived: {v}");
        assert_eq!(v["bytes"], 3 << 20);
    }
    assert_healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guest_sees_no_environment_arguments_or_preopens() {
    let s = shared().await;
    // SAFETY of the test: a canary in the host environment must not reach the guest.
    let out = call(s, "env", json!({}), &[], Budget::default()).await;
    assert_eq!(out.report.result, Ok(json!({"vars": [], "args": [], "cwd": "/"})));
    let out = call(s, "list", json!({"path": "/"}), &[], Budget::default()).await;
    assert!(out.report.result.is_err(), "{:?}", out.report.result);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a5_output_is_copied_before_the_guest_frees_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    let bytes = std::fs::read(keel_tests::guests::WIPING_COMPONENT).unwrap();
    s.install(&bytes, "wiping", "test", false).await.unwrap();
    let out =
        call(&s, "wiped_answer", json!({"text": "honest json here"}), &[], Budget::default()).await;
    assert_eq!(out.report.result, Ok(json!({"text": "honest json here", "words": 3})));
    let out = call(&s, "wiped_refusal", json!({"text": "no"}), &[], Budget::default()).await;
    assert_eq!(
        out.report.result,
        Err(CallError::Tool { kind: ToolErrorKind::InvalidInput, message: "refused: no".into() })
    );
    assert_healthy(&s).await;
}
