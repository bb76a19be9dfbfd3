//! Publishing and installing from the command line, against a real registry on loopback
//! (Debian's `docker-registry`; the `registry` tier), and interoperability with `wkg`, the
//! Bytecode Alliance's package tool (the `wkg` tier: `wkg` on the PATH, or `KEEL_TEST_WKG`).

use std::path::Path;
use std::process::{Command, Output};

use keel_tests::oci_registry::OciRegistry;
use serde_json::json;

use super::{json_of, keel};

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A signing key `acme` in `home`, and `guest` signed by it into `dir`: (public key, file).
fn signed(home: &Path, dir: &Path, guest: &str, name: &str) -> (String, String) {
    let out = keel(home, &["key", "list", "--json"]);
    let listed = json_of(&out)["keys"].as_array().cloned().unwrap_or_default();
    let public = match listed.iter().find(|k| k["name"] == json!("acme")) {
        Some(k) => k["public_key"].as_str().unwrap().to_string(),
        None => {
            let out = keel(home, &["key", "new", "acme", "--json"]);
            ok(&out);
            json_of(&out)["public_key"].as_str().unwrap().to_string()
        }
    };
    let file = dir.join(format!("{name}.wasm"));
    let file_s = file.to_str().unwrap().to_string();
    ok(&keel(home, &["tool", "sign", guest, "--key", "acme", "--out", &file_s]));
    (public, file_s)
}

#[test]
#[ignore = "registry tier: needs Debian's docker-registry"]
fn registry_publish_install_list_inspect_outdated_and_a_skill_from_the_command_line() {
    let registry = OciRegistry::start();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let work = tempfile::tempdir().unwrap();
    let (public, file) = signed(h, work.path(), keel_tests::guests::EFFECTS_COMPONENT, "effects");
    let reference = registry.reference("acme/effects:1.0.0");

    // Published: the digest reference printed last, alone on its line.
    let out = keel(h, &["tool", "publish", &file, &reference]);
    ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let pinned = stdout.lines().last().unwrap().to_string();
    assert!(
        pinned.starts_with(&format!("oci://{}/acme/effects@sha256:", registry.addr)),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("manifest {}", pinned.rsplit('@').next().unwrap())));
    // The version is the one the component carries (keel-sdk writes its crate's), and the tag
    // that says otherwise is pointed out.
    assert!(
        text(&out).contains("is not the version the component carries (0.1.0)"),
        "{}",
        text(&out)
    );
    // The same bytes again: nothing is pushed, the tag does not move.
    let out = keel(h, &["tool", "publish", &file, &reference, "--json"]);
    ok(&out);
    let again = json_of(&out);
    assert_eq!(again["publish"]["unchanged"], json!(true), "{again}");
    assert_eq!(again["publish"]["pinned"], json!(pinned), "{again}");
    assert_eq!(again["publish"]["version"], json!("0.1.0"), "{again}");
    // Under another tag, the same manifest: it depends only on the bytes and their version.
    let out =
        keel(h, &["tool", "publish", &file, &registry.reference("acme/effects:latest"), "--json"]);
    ok(&out);
    let latest = json_of(&out);
    assert_eq!(latest["publish"]["unchanged"], json!(false), "{latest}");
    assert_eq!(latest["publish"]["digest"].as_str(), pinned.rsplit('@').next(), "{latest}");
    let out = keel(h, &["tool", "publish", &file, &reference]);
    assert!(text(&out).contains("already holds these bytes"), "{}", text(&out));
    let out = keel(h, &["tool", "publish", &file, "oci://nowhere/x:1", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_of(&out)["error"]["kind"], json!("invalid_reference"));

    // Not trusted yet: refused before compiling, saying what to do.
    let out = keel(h, &["tool", "install", &reference, "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let v = json_of(&out);
    assert_eq!(v["error"]["kind"], json!("unverified"));
    assert!(v["error"]["message"].as_str().unwrap().contains("keel trust add"), "{v}");

    let scope = format!("{}/acme/*", registry.addr);
    ok(&keel(h, &["trust", "add", "acme", &public, "--packages", &scope]));
    let out = keel(h, &["tool", "install", &reference]);
    ok(&out);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("installed component `effects`"), "{shown}");
    assert!(shown.contains("signer   acme"), "{shown}");
    let out = keel(h, &["tool", "inspect", "effects"]);
    ok(&out);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains(&format!("source     {reference}")), "{shown}");
    assert!(
        shown.contains(&format!("manifest   {}", pinned.rsplit('@').next().unwrap())),
        "{shown}"
    );
    assert!(shown.contains("signer     acme (ed25519:"), "{shown}");

    // Another publisher's component, installed unsigned on purpose: tool list says so.
    let plain = registry.reference("community/hostile:1");
    ok(&keel(h, &["tool", "publish", keel_tests::guests::HOSTILE_COMPONENT, &plain]));
    let out = keel(h, &["tool", "install", &plain]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("it is not signed"), "{}", text(&out));
    ok(&keel(h, &["tool", "install", &plain, "--allow-unsigned"]));
    let out = keel(h, &["tool", "list"]);
    let listed = String::from_utf8_lossy(&out.stdout).to_string();
    let row = |tool: &str| listed.lines().find(|l| l.starts_with(tool)).unwrap_or("").to_string();
    assert!(row("echo").contains("unsigned!"), "{listed}");
    assert!(listed.contains("--allow-unsigned"), "{listed}");
    let tools = json_of(&keel(h, &["tool", "list", "--json"]));
    let effects_row = tools.as_array().unwrap().iter().find(|t| t["component"] == json!("effects"));
    assert_eq!(effects_row.unwrap()["signer"], json!("acme"));

    // Up to date; then the tag moves, and outdated says so with the upgrade command.
    let out = keel(h, &["tool", "outdated", "--json"]);
    ok(&out);
    let rows = json_of(&out)["components"].clone();
    assert_eq!(rows.as_array().unwrap().len(), 2, "{rows}");
    assert!(rows.as_array().unwrap().iter().all(|r| r["outdated"] == json!(false)), "{rows}");
    let next = work.path().join("effects-next.wasm");
    let bytes = std::fs::read(keel_tests::guests::EFFECTS_COMPONENT).unwrap();
    std::fs::write(
        &next,
        keel_tests::oci_registry::with_custom_section(&bytes, "version", b"2.0.0"),
    )
    .unwrap();
    let (_, resigned) = signed(h, work.path(), next.to_str().unwrap(), "effects-2");
    ok(&keel(h, &["tool", "publish", &resigned, &reference]));
    ok(&keel(h, &["tool", "publish", &resigned, &registry.reference("acme/effects:2.0.0")]));
    let out = keel(h, &["tool", "outdated"]);
    ok(&out);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("(moved)"), "{shown}");
    assert!(shown.contains(&format!("keel tool install --upgrade {reference}")), "{shown}");
    // The newer versions the repository has, by their tags, above the installed 0.1.0.
    assert!(shown.contains("newer versions: 1.0.0, 2.0.0"), "{shown}");
    let rows = json_of(&keel(h, &["tool", "outdated", "--json"]))["components"].clone();
    let effects =
        rows.as_array().unwrap().iter().find(|r| r["name"] == json!("effects")).unwrap().clone();
    assert_eq!(effects["version"], json!("0.1.0"), "{rows}");
    assert_eq!(effects["newer"], json!(["1.0.0", "2.0.0"]), "{rows}");
    let out = keel(h, &["tool", "install", &reference]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("--upgrade"), "{}", text(&out));
    let out = keel(h, &["tool", "install", &reference, "--upgrade"]);
    ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("upgraded sha256:"), "{}", text(&out));

    // A skill: published from its directory, installed by reference.
    let skill = work.path().join("audit");
    std::fs::create_dir(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: audit\ndescription: Audits a CSV file.\n---\nRead it, then report.\n",
    )
    .unwrap();
    // A bundled component that is not signed is named before the push, as a tool's is.
    let bundle = work.path().join("bundle");
    std::fs::create_dir(&bundle).unwrap();
    std::fs::copy(skill.join("SKILL.md"), bundle.join("SKILL.md")).unwrap();
    std::fs::copy(keel_tests::guests::HOSTILE_COMPONENT, bundle.join("echo.wasm")).unwrap();
    let bundle_ref = registry.reference("acme/skills/bundle:1");
    let out = keel(h, &["skill", "publish", bundle.to_str().unwrap(), &bundle_ref, "--json"]);
    ok(&out);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("echo.wasm is not signed") && said.contains("--allow-unsigned"),
        "{said}"
    );
    let skill_ref = registry.reference("acme/skills/audit:1");
    let dir = skill.to_str().unwrap();
    let out = keel(h, &["skill", "publish", dir, &skill_ref, "--json"]);
    ok(&out);
    assert!(json_of(&out)["publish"]["pinned"].as_str().unwrap().contains("@sha256:"));
    // Unsigned: refused before any file is fetched, saying so.
    let out = keel(h, &["skill", "install", &skill_ref, "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(json_of(&out)["error"]["message"].as_str().unwrap().contains("it is not signed"));
    // Signed where it is, by the trusted key: installed, and its record names the signer.
    let out = keel(h, &["skill", "sign", &skill_ref, "--key", "acme", "--json"]);
    ok(&out);
    assert!(json_of(&out)["signed"]["signature"].as_str().unwrap().ends_with(".keel-sig"));
    let out = keel(h, &["skill", "install", &skill_ref, "--json"]);
    ok(&out);
    let installed = json_of(&out)["install"]["skill"].clone();
    assert_eq!(installed["source"], json!(skill_ref));
    assert_eq!(installed["signer"], json!("acme"), "{installed}");
    // Published signed in one step, with --key.
    let next = registry.reference("acme/skills/audit:2");
    let out = keel(h, &["skill", "publish", dir, &next, "--key", "acme"]);
    ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("signed with `acme`"), "{}", text(&out));
    ok(&keel(h, &["skill", "install", &next, "--upgrade"]));

    // The registry gone: a clear error, nothing changed.
    drop(registry);
    let out = keel(h, &["tool", "install", &reference, "--upgrade", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_of(&out)["error"]["kind"], json!("registry_unreachable"));
}

fn wkg() -> String {
    std::env::var("KEEL_TEST_WKG").unwrap_or_else(|_| "wkg".into())
}

fn run_wkg(args: &[&str]) -> Output {
    let out = Command::new(wkg()).args(args).env("WKG_CONFIG_FILE", "/dev/null").output();
    out.unwrap_or_else(|e| panic!("cannot run `{}` ({e}): cargo install --locked wkg", wkg()))
}

#[test]
#[ignore = "wkg tier: needs wkg and Debian's docker-registry"]
fn wkg_pulls_what_keel_publishes_byte_identical_and_keel_installs_what_wkg_pushes() {
    let registry = OciRegistry::start();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let work = tempfile::tempdir().unwrap();
    let (public, file) = signed(h, work.path(), keel_tests::guests::EFFECTS_COMPONENT, "effects");
    let scope = format!("{}/acme/*", registry.addr);
    ok(&keel(h, &["trust", "add", "acme", &public, "--packages", &scope]));

    // keel → wkg.
    let reference = registry.reference("acme/effects:1.0.0");
    ok(&keel(h, &["tool", "publish", &file, &reference]));
    let pulled = work.path().join("pulled.wasm");
    let plain_ref = format!("{}/acme/effects:1.0.0", registry.addr);
    let out = run_wkg(&[
        "oci",
        "pull",
        &plain_ref,
        "--insecure",
        &registry.addr,
        "-o",
        pulled.to_str().unwrap(),
    ]);
    ok(&out);
    assert_eq!(std::fs::read(&pulled).unwrap(), std::fs::read(&file).unwrap());

    // wkg → keel: the signature travels in the component's bytes.
    let pushed_ref = format!("{}/acme/by-wkg:2.0.0", registry.addr);
    let out = run_wkg(&["oci", "push", &pushed_ref, &file, "--insecure", &registry.addr]);
    ok(&out);
    let out = keel(h, &["tool", "install", &format!("oci://{pushed_ref}"), "--json"]);
    ok(&out);
    let v = json_of(&out);
    assert_eq!(v["install"]["component"]["name"], json!("by-wkg"));
    assert_eq!(v["install"]["component"]["signer"], json!("acme"));
}
