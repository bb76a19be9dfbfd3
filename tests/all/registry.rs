//! Publishing and installing over OCI against a real registry on loopback (Debian's
//! `docker-registry`; the `registry` tier: `cargo test --release --test all -- --ignored
//! registry`). The order of an install's checks is counted: nothing reaches the compiler
//! before the digests and the signature pass.

use keel::api::{ApiError, Caller, RegistryInstall};
use keel::harness::Harness;
use keel::home::Home;
use keel::tools::ToolServiceError;
use keel_tests::oci_registry::{OciRegistry, PASSWORD, USER};
use keel_tests::{guests, test_limits};

const OP: &Caller = &Caller::Operator;

async fn harness(dir: &std::path::Path) -> Harness {
    let home = Home::at(dir).unwrap();
    Harness::open(home, test_limits(), None, Default::default(), &|_| {}).await.unwrap()
}

fn compiles(h: &Harness) -> u64 {
    h.internals().tools.sandbox().compiles()
}

/// A key pair: the public key's text and the signed copy of the effects guest.
fn signed_effects() -> (String, Vec<u8>) {
    let (public, secret) = keel::signing::generate();
    let bytes = std::fs::read(guests::EFFECTS_COMPONENT).unwrap();
    (public.to_string(), keel::signing::sign(&bytes, &secret).unwrap())
}

fn opts() -> RegistryInstall<'static> {
    RegistryInstall::default()
}

fn refused(e: ApiError) -> String {
    match &e {
        ApiError::Tools(ToolServiceError::Unverified { .. }) => e.to_string(),
        other => panic!("expected an unverified refusal, got {} ({other})", other.kind()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "registry tier: needs Debian's docker-registry"]
async fn registry_publish_then_install_by_tag_and_by_digest_recording_source_digest_and_signer() {
    let registry = OciRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path()).await;
    let (public, signed) = signed_effects();
    let reference = registry.reference("acme/effects:1.0.0");
    let pushed = h.publish_tool(OP, signed.clone(), &reference, None).await.unwrap();
    assert_eq!(pushed.reference, reference);
    assert!(pushed.pinned.ends_with(&pushed.digest) && pushed.pinned.contains("@sha256:"));
    assert_eq!(pushed.size, signed.len() as u64);

    let package = format!("{}/acme/*", registry.addr);
    h.trust_add(OP, "acme", &public, &package).unwrap();
    let r = h.install_tool_from(OP, &reference, &opts()).await.unwrap();
    let c = &r.component;
    assert_eq!(c.name, "effects");
    assert_eq!(c.source, reference);
    assert_eq!(c.manifest_digest.as_deref(), Some(pushed.digest.as_str()));
    assert_eq!(c.signer.as_deref(), Some("acme"));
    assert_eq!(c.signer_key.as_deref(), Some(public.as_str()));
    assert!(!c.unsigned_allowed);
    assert_eq!(c.digest, keel::sandbox::sha256_hex(&signed), "the bytes are the file's, unchanged");
    let (shown, tools) = h.tool(OP, "effects").unwrap();
    assert_eq!(shown, r.component);
    assert!(!tools.is_empty());

    // By digest, on another home: the same bytes.
    let other = tempfile::tempdir().unwrap();
    let h2 = harness(other.path()).await;
    h2.trust_add(OP, "acme", &public, &package).unwrap();
    let r2 = h2.install_tool_from(OP, &pushed.pinned, &opts()).await.unwrap();
    assert_eq!(r2.component.digest, c.digest);
    assert_eq!(r2.component.source, pushed.pinned);

    // A digest the repository does not hold is not found; a wrong kind of artifact is named.
    let missing = registry.reference(&format!("acme/effects@sha256:{}", "0".repeat(64)));
    let e = h2.install_tool_from(OP, &missing, &opts()).await.unwrap_err();
    assert_eq!(e.kind(), "not_found", "{e}");
    let skill_dir = tempfile::tempdir().unwrap();
    std::fs::write(
        skill_dir.path().join("SKILL.md"),
        "---\nname: audit\ndescription: Audits a CSV file.\n---\nRead it, then report.\n",
    )
    .unwrap();
    let skill_ref = registry.reference("acme/audit:1");
    h.publish_skill(OP, skill_dir.path(), &skill_ref, None, None).await.unwrap();
    let e = h2.install_tool_from(OP, &skill_ref, &opts()).await.unwrap_err();
    assert_eq!(e.kind(), "wrong_artifact", "{e}");
    assert!(e.to_string().contains("is not a wasm component"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "registry tier: needs Debian's docker-registry"]
async fn registry_refusals_come_before_compiling_and_name_what_failed() {
    let registry = OciRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path()).await;
    let (public, signed) = signed_effects();
    let package = format!("{}/acme/*", registry.addr);
    h.trust_add(OP, "acme", &public, &package).unwrap();
    let start = compiles(&h);

    // Unsigned, under a name the trusted key covers.
    let plain = std::fs::read(guests::EFFECTS_COMPONENT).unwrap();
    let unsigned_ref = registry.reference("acme/plain:1");
    h.publish_tool(OP, plain, &unsigned_ref, None).await.unwrap();
    let e = refused(h.install_tool_from(OP, &unsigned_ref, &opts()).await.unwrap_err());
    assert!(e.contains("it is not signed") && e.contains("--allow-unsigned"), "{e}");

    // Signed by a key keel does not trust.
    let (_, stranger) = signed_effects();
    let stranger_ref = registry.reference("acme/stranger:1");
    h.publish_tool(OP, stranger, &stranger_ref, None).await.unwrap();
    let e = refused(h.install_tool_from(OP, &stranger_ref, &opts()).await.unwrap_err());
    assert!(e.contains("by no key keel trusts"), "{e}");

    // Signed by the trusted key, in a repository outside its scope.
    let outside_ref = registry.reference("other/effects:1");
    h.publish_tool(OP, signed.clone(), &outside_ref, None).await.unwrap();
    let e = refused(h.install_tool_from(OP, &outside_ref, &opts()).await.unwrap_err());
    assert!(e.contains("trusted key `acme`") && e.contains("does not cover"), "{e}");

    // A tampered blob: the digest check fails, naming the component.
    let good_ref = registry.reference("acme/effects:1");
    h.publish_tool(OP, signed.clone(), &good_ref, None).await.unwrap();
    let layer = format!("sha256:{}", keel::sandbox::sha256_hex(&signed));
    registry.tamper(&layer);
    let e = h.install_tool_from(OP, &good_ref, &opts()).await.unwrap_err();
    assert_eq!(e.kind(), "digest_mismatch", "{e}");
    assert!(e.to_string().contains("digest check failed") && e.to_string().contains(&layer), "{e}");

    assert_eq!(compiles(&h), start, "nothing refused reached the compiler");
    assert!(h.components(OP).unwrap().iter().all(|c| c.manifest_digest.is_none()));

    // Unsigned on purpose: recorded as such, and compiled once.
    let allow = RegistryInstall { allow_unsigned: true, ..opts() };
    let r = h.install_tool_from(OP, &unsigned_ref, &allow).await.unwrap();
    assert!(r.component.unsigned_allowed && r.component.signer.is_none());
    assert_eq!(compiles(&h), start + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "registry tier: needs Debian's docker-registry"]
async fn registry_a_moved_tag_is_listed_as_outdated_and_needs_an_upgrade_that_shows_the_change() {
    let registry = OciRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path()).await;
    let (public, secret) = keel::signing::generate();
    let package = format!("{}/acme/*", registry.addr);
    h.trust_add(OP, "acme", &public.to_string(), &package).unwrap();
    let sign = |path: &str| keel::signing::sign(&std::fs::read(path).unwrap(), &secret).unwrap();
    let reference = registry.reference("acme/tool:stable");
    let first = h.publish_tool(OP, sign(guests::EFFECTS_COMPONENT), &reference, None).await;
    let first = first.unwrap();
    let named = RegistryInstall { name: Some("tool"), ..opts() };
    h.install_tool_from(OP, &reference, &named).await.unwrap();
    let rows = h.tools_outdated(OP, &[]).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert!(!rows[0].outdated && rows[0].current.as_deref() == Some(first.digest.as_str()));

    // The tag moves to other bytes with the same tools (a custom section more), signed.
    let plain = std::fs::read(guests::EFFECTS_COMPONENT).unwrap();
    let next = keel_tests::oci_registry::with_custom_section(&plain, "version", b"2");
    let moved = keel::signing::sign(&next, &secret).unwrap();
    let next = next.clone();
    let second = h.publish_tool(OP, moved, &reference, None).await.unwrap();
    assert_ne!(second.digest, first.digest);
    let rows = h.tools_outdated(OP, &[]).await.unwrap();
    assert!(rows[0].outdated, "{rows:?}");
    assert_eq!(rows[0].installed, first.digest);
    assert_eq!(rows[0].current.as_deref(), Some(second.digest.as_str()));

    // Never followed silently: a plain install is refused; --upgrade shows old and new.
    let e = h.install_tool_from(OP, &reference, &named).await.unwrap_err();
    assert_eq!(e.kind(), "already_installed", "{e}");
    let up = RegistryInstall { upgrade: true, ..named.clone() };
    let r = h.install_tool_from(OP, &reference, &up).await.unwrap();
    let diff = r.upgrade.expect("an upgrade diff");
    assert_ne!(diff.old_digest, diff.new_digest);
    assert!(diff.changed.is_empty() && diff.added.is_empty() && diff.removed.is_empty());
    assert_eq!(r.component.manifest_digest.as_deref(), Some(second.digest.as_str()));
    assert!(!h.tools_outdated(OP, &[]).await.unwrap()[0].outdated);

    // An unsigned copy pushed under the same tag: seen as moved, refused as an upgrade before
    // compiling, and the installed record is unchanged.
    let before = compiles(&h);
    let unsigned = h.publish_tool(OP, next, &reference, None).await.unwrap();
    assert!(h.tools_outdated(OP, &[]).await.unwrap()[0].outdated);
    let e = refused(h.install_tool_from(OP, &reference, &up).await.unwrap_err());
    assert!(e.contains("it is not signed"), "{e}");
    assert_eq!(compiles(&h), before);
    let (kept, _) = h.tool(OP, "tool").unwrap();
    assert_eq!(kept.manifest_digest.as_deref(), Some(second.digest.as_str()));
    assert_ne!(unsigned.digest, second.digest);

    // A registry that is gone is reported on the row, not as a failure of the whole list.
    drop(registry);
    let rows = h.tools_outdated(OP, &[]).await.unwrap();
    assert!(rows[0].error.as_deref().is_some_and(|e| e.contains("cannot reach")), "{rows:?}");
    let e = h.install_tool_from(OP, &reference, &up).await.unwrap_err();
    assert_eq!(e.kind(), "registry_unreachable", "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "registry tier: needs Debian's docker-registry"]
async fn registry_credentials_come_from_the_secrets_broker() {
    let registry = OciRegistry::start_with_auth();
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path()).await;
    let (_, signed) = signed_effects();
    let reference = registry.reference("acme/effects:1");
    let e = h.publish_tool(OP, signed.clone(), &reference, None).await.unwrap_err();
    assert_eq!(e.kind(), "registry_unauthorized", "{e}");
    assert!(e.to_string().contains("--auth SECRET"), "{e}");
    let e = h.publish_tool(OP, signed.clone(), &reference, Some("registry")).await.unwrap_err();
    assert!(e.to_string().contains("registry"), "a missing secret is named: {e}");
    keel::secrets::SecretStore::new(dir.path())
        .set("registry", keel::secrets::Secret::new(format!("{USER}:{PASSWORD}")))
        .unwrap();
    let pushed = h.publish_tool(OP, signed, &reference, Some("registry")).await.unwrap();
    let allow = RegistryInstall { allow_unsigned: true, auth: Some("registry"), ..opts() };
    let r = h.install_tool_from(OP, &pushed.pinned, &allow).await.unwrap();
    assert_eq!(r.component.manifest_digest.as_deref(), Some(pushed.digest.as_str()));
    // The password is in no record.
    let shown = serde_json::to_string(&h.components(OP).unwrap()).unwrap();
    assert!(!shown.contains(PASSWORD));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "registry tier: needs Debian's docker-registry"]
async fn registry_a_skill_bundle_round_trips_with_its_signed_component() {
    let registry = OciRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path()).await;
    // One publisher key: in the home's signing keys (for the bundle), and signing the component.
    let (public, secret) = keel::signing::generate();
    let public = public.to_string();
    keel::secrets::SecretStore::signing_keys(dir.path())
        .set("acme", keel::secrets::Secret::new(secret.to_string()))
        .unwrap();
    let bytes = std::fs::read(guests::EFFECTS_COMPONENT).unwrap();
    let signed = keel::signing::sign(&bytes, &secret).unwrap();
    let skill = tempfile::tempdir().unwrap();
    let s = skill.path();
    std::fs::write(
        s.join("SKILL.md"),
        "---\nname: audit\ndescription: Audits a CSV file.\n---\nRead it, then report.\n",
    )
    .unwrap();
    std::fs::create_dir(s.join("notes")).unwrap();
    std::fs::write(s.join("notes/checklist.md"), "- columns\n- rows\n").unwrap();
    std::fs::write(s.join("effects.wasm"), &signed).unwrap();
    let reference = registry.reference("acme/skills/audit:1");
    let published = h.publish_skill(OP, s, &reference, None, Some("acme")).await.unwrap();
    let pushed = published.publish;
    let sig = published.signature.unwrap();
    assert_eq!(sig.public_key, public);
    assert!(sig.signature.ends_with(".keel-sig"), "{sig:?}");

    // The bundle's signature is checked first, before any of its files is fetched.
    let e = h.install_skill_from(OP, &reference, &opts()).await.unwrap_err();
    assert_eq!(e.kind(), "unverified", "{e}");
    assert!(e.to_string().contains("by no key keel trusts"), "{e}");
    assert!(h.skills(OP).await.unwrap().is_empty());
    h.trust_add(OP, "acme", &public, &format!("{}/acme/*", registry.addr)).unwrap();
    let r = h.install_skill_from(OP, &reference, &opts()).await.unwrap();
    let skill = &r.installed.skill;
    assert_eq!(skill.name, "audit");
    assert_eq!(skill.source, reference);
    assert_eq!(skill.manifest_digest.as_deref(), Some(pushed.digest.as_str()));
    assert_eq!(skill.signer.as_deref(), Some("acme"));
    assert_eq!(skill.signer_key.as_deref(), Some(public.as_str()));
    assert!(!skill.unsigned_allowed);
    assert_eq!(skill.files.len(), 1);
    assert_eq!(skill.files[0].path, "notes/checklist.md");
    assert_eq!(r.components.len(), 1);
    assert_eq!(r.components[0].component.signer.as_deref(), Some("acme"));
    // The same content as installing the directory.
    let local = tempfile::tempdir().unwrap();
    let h2 = harness(local.path()).await;
    let l = h2.install_skill(OP, s, keel::tools::InstallMode::New).await.unwrap();
    assert_eq!(l.installed.skill.digest, skill.digest);

    // Published unsigned, then signed where it is with `sign_skill`.
    let later = registry.reference("acme/skills/later:1");
    let unsigned = h.publish_skill(OP, s, &later, None, None).await.unwrap();
    assert!(unsigned.signature.is_none());
    let other = tempfile::tempdir().unwrap();
    let h3 = harness(other.path()).await;
    h3.trust_add(OP, "acme", &public, &format!("{}/acme/*", registry.addr)).unwrap();
    let e = h3.install_skill_from(OP, &later, &opts()).await.unwrap_err();
    assert!(e.to_string().contains("it is not signed"), "{e}");
    let signed = h.sign_skill(OP, &later, "acme", None).await.unwrap();
    assert_eq!(
        signed.signs,
        format!("oci://{}/acme/skills/later@{}", registry.addr, unsigned.publish.digest)
    );
    let r = h3.install_skill_from(OP, &later, &opts()).await.unwrap();
    assert_eq!(r.installed.skill.signer.as_deref(), Some("acme"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_is_down_or_answers_garbage_is_a_clear_error_and_installs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path()).await;
    let before = compiles(&h);
    // Nothing listens on the port.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let down = format!("oci://127.0.0.1:{port}/acme/effects:1");
    let e = h.install_tool_from(OP, &down, &opts()).await.unwrap_err();
    assert_eq!(e.kind(), "registry_unreachable", "{e}");
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
    let bytes = std::fs::read(guests::EFFECTS_COMPONENT).unwrap();
    let e = h.publish_tool(OP, bytes, &down, None).await.unwrap_err();
    assert_eq!(e.kind(), "registry_unreachable", "{e}");
    // A server that answers `ok` to every request.
    let peer = keel_tests::web_peer::WebPeer::start().await;
    let garbage = format!("oci://127.0.0.1:{}/acme/effects:1", peer.port);
    let e = h.install_tool_from(OP, &garbage, &opts()).await.unwrap_err();
    assert!(matches!(e.kind(), "registry_protocol" | "wrong_artifact"), "{} {e}", e.kind());
    // A reference that is not one, and a file that is not a component, before any request.
    let e = h.install_tool_from(OP, "oci://acme/effects:1", &opts()).await.unwrap_err();
    assert_eq!(e.kind(), "invalid_reference", "{e}");
    let e = h.publish_tool(OP, b"not wasm".to_vec(), &garbage, None).await.unwrap_err();
    assert_eq!(e.kind(), "load", "{e}");
    assert_eq!(compiles(&h), before);
    assert!(h.components(OP).unwrap().iter().all(|c| c.manifest_digest.is_none()));
}
