//! Signing keys, signatures and trust from the command line: a publisher makes a key and
//! signs a component; an admin trusts the key for some packages; verify and install see who
//! signed what, and a changed byte, another key or a package outside the scope fail, naming
//! what failed.

use std::path::Path;

use serde_json::json;

use super::{json_of, keel};

fn ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn new_key(home: &Path, name: &str) -> String {
    let out = keel(home, &["key", "new", name, "--json"]);
    ok(&out);
    json_of(&out)["public_key"].as_str().unwrap().to_string()
}

#[test]
fn a_signed_component_verifies_installs_with_its_signer_and_fails_when_changed() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("effects.wasm");
    std::fs::copy(keel_tests::guests::EFFECTS_COMPONENT, &plain).unwrap();
    let signed = dir.path().join("effects-signed.wasm");
    let (plain_s, signed_s) = (plain.to_str().unwrap(), signed.to_str().unwrap());

    // A key: made once, listed with its public key, never shown as a secret.
    let public = new_key(h, "acme-release");
    assert!(public.starts_with("ed25519:") && public.len() == 72, "{public}");
    let out = keel(h, &["key", "new", "acme-release", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_of(&out)["error"]["kind"], json!("conflict"));
    let listed = json_of(&keel(h, &["key", "list", "--json"]));
    assert_eq!(listed["keys"], json!([{"name": "acme-release", "public_key": public}]));
    let secrets = json_of(&keel(h, &["secret", "list", "--json"]));
    assert_eq!(secrets["secrets"], json!([]), "a signing key is not a secret a session can bind");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(h.join("signing-keys.age")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    // Signed into another file; the original is untouched.
    let before = std::fs::read(&plain).unwrap();
    let out =
        keel(h, &["tool", "sign", plain_s, "--key", "acme-release", "--out", signed_s, "--json"]);
    ok(&out);
    assert_eq!(std::fs::read(&plain).unwrap(), before);
    let v = json_of(&out);
    assert_eq!(v["public_key"], json!(public));
    let out = keel(h, &["tool", "sign", plain_s, "--key", "nobody"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no signing key `nobody`"));

    // Verified by the key given.
    ok(&keel(h, &["tool", "verify", signed_s, "--key", &public]));
    let other = new_key(h, "someone-else");
    let out = keel(h, &["tool", "verify", signed_s, "--key", &other, "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_of(&out)["error"]["kind"], json!("signature"));
    let out = keel(h, &["tool", "verify", plain_s, "--key", &public]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no signature"));

    // By the trusted keys: none yet, then one whose scope covers `effects*` only.
    let out = keel(h, &["tool", "verify", signed_s, "--as", "effects"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("by no trusted key"));
    let out = keel(h, &["trust", "add", "acme", &public, "--packages", "effects*", "--json"]);
    ok(&out);
    assert_eq!(json_of(&out)["trusted"]["packages"], json!("effects*"));
    let v = json_of(&keel(h, &["tool", "verify", signed_s, "--as", "effects", "--json"]));
    assert_eq!(v["signer"]["name"], json!("acme"));
    let out = keel(h, &["tool", "verify", signed_s, "--as", "billing"]);
    assert_eq!(out.status.code(), Some(2), "outside the key's scope");
    let out = keel(h, &["tool", "verify", plain_s]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not signed"));

    // Installed, it records its signer; it runs as the unsigned file does.
    ok(&keel(h, &["tool", "install", signed_s, "--name", "effects"]));
    let v = json_of(&keel(h, &["tool", "inspect", "effects", "--json"]));
    assert_eq!(v["component"]["signer"], json!("acme"));
    assert_eq!(v["component"]["signer_key"], json!(public));
    let text =
        String::from_utf8_lossy(&keel(h, &["tool", "inspect", "effects"]).stdout).to_string();
    assert!(text.contains(&format!("signer     acme ({public})")), "{text}");
    let out = keel(h, &["tool", "inspect", "--wasm", signed_s, "--as", "effects2", "--json"]);
    assert_eq!(json_of(&out)["signed"], json!(true));
    let v = json_of(&keel(
        h,
        &["tool", "call", "effect_peek", "--input", r#"{"label":"x"}"#, "--json"],
    ));
    assert_eq!(v["output"], json!({"label": "x", "lines": 0}), "the signed component runs: {v}");

    // One byte changed after signing: the signature no longer verifies.
    let mut bytes = std::fs::read(&signed).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    let tampered = dir.path().join("tampered.wasm");
    std::fs::write(&tampered, bytes).unwrap();
    let out = keel(h, &["tool", "verify", tampered.to_str().unwrap(), "--key", &public]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not verify"));
}

#[test]
fn trust_refuses_bad_keys_duplicates_and_unknown_names() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let out = keel(h, &["trust", "add", "acme", "ed25519:nothex", "--packages", "*", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v = json_of(&out);
    assert_eq!(v["error"]["kind"], json!("input"));
    assert!(v["error"]["message"].as_str().unwrap().contains("64 hex digits"));
    let public = new_key(h, "k");
    let out = keel(h, &["trust", "add", "Acme Corp", &public, "--packages", "*"]);
    assert_eq!(out.status.code(), Some(2));
    let out = keel(h, &["trust", "add", "acme", &public, "--packages", "Bad Glob"]);
    assert_eq!(out.status.code(), Some(2));
    // Without --packages: refused, saying how to mean everything; nothing trusted.
    let out = keel(h, &["trust", "add", "acme", &public, "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v = json_of(&out);
    assert_eq!(v["error"]["kind"], json!("input"));
    assert!(v["error"]["message"].as_str().unwrap().contains("--packages '*'"), "{v}");
    assert_eq!(json_of(&keel(h, &["trust", "list", "--json"]))["trusted"], json!([]));
    ok(&keel(h, &["trust", "add", "acme", &public, "--packages", "*"]));
    let out = keel(h, &["trust", "add", "acme2", &public, "--packages", "*", "--json"]);
    assert_eq!(json_of(&out)["error"]["kind"], json!("conflict"), "the same key twice");
    let v = json_of(&keel(h, &["trust", "list", "--json"]));
    assert_eq!(v["trusted"][0]["packages"], json!("*"));
    ok(&keel(h, &["trust", "remove", "acme"]));
    let out = keel(h, &["trust", "remove", "acme", "--json"]);
    assert_eq!(json_of(&out)["error"]["kind"], json!("not_found"));
    assert_eq!(json_of(&keel(h, &["trust", "list", "--json"]))["trusted"], json!([]));
}

#[test]
fn a_component_whose_signer_lost_its_trust_is_shown_so() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let dir = tempfile::tempdir().unwrap();
    let signed = dir.path().join("effects.wasm");
    let signed_s = signed.to_str().unwrap();
    let public = new_key(h, "acme-release");
    let sign = ["tool", "sign", keel_tests::guests::EFFECTS_COMPONENT, "--key", "acme-release"];
    ok(&keel(h, &[&sign[..], &["--out", signed_s]].concat()));
    ok(&keel(h, &["trust", "add", "acme", &public, "--packages", "effects"]));
    ok(&keel(h, &["tool", "install", signed_s]));
    let shown = |h: &Path| {
        let list = String::from_utf8_lossy(&keel(h, &["tool", "list"]).stdout).to_string();
        let row = list.lines().find(|l| l.starts_with("effect_peek")).unwrap().to_string();
        let inspect = json_of(&keel(h, &["tool", "inspect", "effects", "--json"]));
        (row, list, inspect["component"]["signer_trusted"].clone())
    };
    let (row, _, trusted) = shown(h);
    assert!(row.contains(" acme "), "{row}");
    assert_eq!(trusted, json!(true));

    // Removed: shown untrusted in the list, the inspect text and JSON.
    ok(&keel(h, &["trust", "remove", "acme"]));
    let (row, list, trusted) = shown(h);
    assert!(row.contains("untrusted!"), "{row}");
    assert!(list.contains("(untrusted!: its signer's trust was removed"), "{list}");
    assert_eq!(trusted, json!(false));
    let text =
        String::from_utf8_lossy(&keel(h, &["tool", "inspect", "effects"]).stdout).to_string();
    assert!(text.contains("NO LONGER TRUSTED"), "{text}");

    // The name given to another key is not the same trust.
    let other = new_key(h, "someone-else");
    ok(&keel(h, &["trust", "add", "acme", &other, "--packages", "*"]));
    assert_eq!(shown(h).2, json!(false));
    // The same key again, but for other packages only: still not covered.
    ok(&keel(h, &["trust", "remove", "acme"]));
    ok(&keel(h, &["trust", "add", "acme", &public, "--packages", "billing-*"]));
    assert_eq!(shown(h).2, json!(false));
    // Trusted again for it: shown trusted.
    ok(&keel(h, &["trust", "remove", "acme"]));
    ok(&keel(h, &["trust", "add", "acme", &public, "--packages", "effects"]));
    assert_eq!(shown(h).2, json!(true));
}

#[test]
fn signing_never_writes_through_a_file_or_link_planted_at_its_temporary_name() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let dir = tempfile::tempdir().unwrap();
    new_key(h, "k");
    let file = dir.path().join("tool.wasm");
    std::fs::copy(keel_tests::guests::EFFECTS_COMPONENT, &file).unwrap();
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "keep me").unwrap();
    let planted = dir.path().join(".tool.wasm.signing");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let before = std::fs::read(&file).unwrap();
    let out = keel(h, &["tool", "sign", file.to_str().unwrap(), "--key", "k"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("in the way"), "{out:?}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert_eq!(std::fs::read(&file).unwrap(), before, "the file is unchanged");
    // Without the planted link, signing in place works.
    std::fs::remove_file(&planted).unwrap();
    ok(&keel(h, &["tool", "sign", file.to_str().unwrap(), "--key", "k"]));
    assert!(!planted.exists());
}

fn keel_env(home: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_keel"));
    cmd.arg("--home").arg(home).args(args).stdin(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// A publisher's key leaves its home sealed: exported with a passphrase (or to an age
/// recipient), imported into another home, or given to a CI job in KEEL_SIGNING_KEY; what
/// each signs verifies with the one public key. A wrong passphrase, another key's name, a
/// short passphrase and an export that is not one are refused, and nothing is stored.
#[test]
fn a_signing_key_is_exported_sealed_imported_elsewhere_and_used_from_the_environment() {
    let publisher = tempfile::tempdir().unwrap();
    let public = new_key(publisher.path(), "acme-release");
    let pass = [("KEEL_SIGNING_KEY_PASSPHRASE", "a long passphrase for ci")];
    let out = keel_env(publisher.path(), &["key", "export", "acme-release", "--json"], &pass);
    ok(&out);
    let export = json_of(&out)["export"].as_str().unwrap().to_string();
    assert!(export.starts_with("-----BEGIN AGE ENCRYPTED FILE-----"), "{export}");
    let secret_text =
        std::fs::read_to_string(publisher.path().join("signing-keys.age")).unwrap_or_default();
    assert!(!export.contains(&secret_text) || secret_text.is_empty());
    let short = [("KEEL_SIGNING_KEY_PASSPHRASE", "short")];
    let out = keel_env(publisher.path(), &["key", "export", "acme-release", "--json"], &short);
    assert_eq!(out.status.code(), Some(2));
    assert!(json_of(&out)["error"]["message"].as_str().unwrap().contains("at least 12"));

    // Into another home, from a file (0600 when written by export).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("acme.age");
    let f = file.to_str().unwrap();
    ok(&keel_env(publisher.path(), &["key", "export", "acme-release", "--out", f], &pass));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let other = tempfile::tempdir().unwrap();
    let wrong = [("KEEL_SIGNING_KEY_PASSPHRASE", "not the passphrase at all")];
    let out = keel_env(other.path(), &["key", "import", f, "--json"], &wrong);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_of(&out)["error"]["kind"], json!("unreadable"));
    assert_eq!(json_of(&keel(other.path(), &["key", "list", "--json"]))["keys"], json!([]));
    let out = keel_env(other.path(), &["key", "import", f, "--json"], &pass);
    ok(&out);
    assert_eq!(json_of(&out), json!({"ok": true, "key": "acme-release", "public_key": public}));
    let out = keel_env(other.path(), &["key", "import", f, "--json"], &pass);
    assert_eq!(json_of(&out)["error"]["kind"], json!("conflict"));
    let not_an_export = dir.path().join("x.age");
    std::fs::write(&not_an_export, "hello").unwrap();
    let out = keel_env(
        other.path(),
        &["key", "import", not_an_export.to_str().unwrap(), "--json"],
        &pass,
    );
    assert_eq!(out.status.code(), Some(2));

    // A CI job: a fresh home, the export and its passphrase in the environment.
    let ci = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("effects.wasm");
    std::fs::copy(keel_tests::guests::EFFECTS_COMPONENT, &wasm).unwrap();
    let w = wasm.to_str().unwrap();
    let env = [("KEEL_SIGNING_KEY", export.as_str()), pass[0]];
    let out = keel_env(ci.path(), &["tool", "sign", w, "--key", "acme-release", "--json"], &env);
    ok(&out);
    assert_eq!(json_of(&out)["public_key"], json!(public));
    ok(&keel(ci.path(), &["tool", "verify", w, "--key", &public]));
    let out = keel_env(ci.path(), &["tool", "sign", w, "--key", "other", "--json"], &env);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        json_of(&out)["error"]["message"]
            .as_str()
            .unwrap()
            .contains("holds the key `acme-release`, not `other`")
    );
    let env = [("KEEL_SIGNING_KEY", export.as_str())];
    let out = keel_env(ci.path(), &["tool", "sign", w, "--key", "acme-release", "--json"], &env);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        json_of(&out)["error"]["message"].as_str().unwrap().contains("KEEL_SIGNING_KEY_PASSPHRASE")
    );
    assert!(!ci.path().join("signing-keys.age").exists(), "the CI home keeps no key");

    // Sealed to an age recipient instead: its identity file opens it.
    let identity = "AGE-SECRET-KEY-1GFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPQ4EGAEX";
    let recipient = "age1zvkyg2lqzraa2lnjvqej32nkuu0ues2s82hzrye869xeexvn73equnujwj";
    let out =
        keel(publisher.path(), &["key", "export", "acme-release", "--to", recipient, "--json"]);
    ok(&out);
    let sealed = dir.path().join("to.age");
    std::fs::write(&sealed, json_of(&out)["export"].as_str().unwrap()).unwrap();
    let third = tempfile::tempdir().unwrap();
    let s = sealed.to_str().unwrap();
    let out = keel(third.path(), &["key", "import", s, "--json"]);
    assert_eq!(json_of(&out)["error"]["kind"], json!("needs_secret"));
    let id = dir.path().join("id.txt");
    std::fs::write(&id, format!("# key\n{identity}\n")).unwrap();
    let out = keel(
        third.path(),
        &["key", "import", s, "--name", "ci", "--identity", id.to_str().unwrap(), "--json"],
    );
    ok(&out);
    assert_eq!(json_of(&out)["key"], json!("ci"));
    assert_eq!(json_of(&out)["public_key"], json!(public));
}
