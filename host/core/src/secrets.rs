//! The secrets broker: credentials a tool's requests carry on the wire, and that a guest, a
//! log, the database and the model never see.
//!
//! Secrets live in one `age` file in the keel home (`secrets.age`), encrypted to an x25519
//! key kept beside it in `secrets.key` (mode 0600). A value read from it is a [`Secret`]: it
//! cannot be printed, formatted or serialized, and its memory is wiped when it is dropped.
//! Only the egress hook reads a value (to write it into a request bound to its destination);
//! everything a call produces passes a [`Redactor`] that replaces every exact occurrence of a
//! value by `[secret:NAME]` before it is stored or shown.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use age::secrecy::ExposeSecret;
use zeroize::Zeroizing;

/// Longest secret name.
pub const MAX_SECRET_NAME: usize = 64;

/// Whether `name` can name a secret: letters, digits, `_` and `-`, at most 64 characters.
pub fn valid_secret_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SECRET_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Shortest secret value accepted: a shorter one would be redacted out of ordinary text.
pub const MIN_SECRET_BYTES: usize = 8;
/// Largest secret value accepted.
pub const MAX_SECRET_BYTES: usize = 64 * 1024;

/// A secret value. It has no `Display`, no `Serialize`, and its `Debug` shows no value.
pub struct Secret(Zeroizing<String>);

impl Secret {
    /// A secret from its value (checked by [`SecretStore::set`] when it is stored).
    pub fn new(value: String) -> Self {
        Self(Zeroizing::new(value))
    }

    /// The value, for the one place that needs it: writing it into a request.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl Clone for Secret {
    fn clone(&self) -> Self {
        Self(Zeroizing::new(String::from(self.0.as_str())))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([hidden])")
    }
}

/// Why the secrets broker could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error(
        "`{name}` is not a secret name: use 1 to {MAX_SECRET_NAME} letters, digits, `_` or `-`"
    )]
    BadName { name: String },
    #[error(
        "the value of `{name}` is {len} bytes; a secret is {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes (a shorter one would be redacted out of ordinary text)"
    )]
    BadLength { name: String, len: usize },
    #[error(
        "the value of `{name}` holds a line break or another control character; a secret is one line"
    )]
    ControlCharacter { name: String },
    #[error(
        "there is no secret `{name}` (see `keel secret list`; set it with `keel secret set {name}`)"
    )]
    Missing { name: String },
    #[error("secrets store: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("secrets store: {0}")]
    Corrupt(String),
    #[error(
        "the secrets key {path} is readable by other users (mode {mode:o}): it may already have been read, and with it every stored secret, so keel will not use it. Retire it with `keel secret rotate-key` (a new key; the stores re-encrypted to it), then change each secret's value at its service and store it again with `keel secret set NAME`"
    )]
    LooseKey { path: String, mode: u32 },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> SecretError {
    let context = context.into();
    move |source| SecretError::Io { context, source }
}

/// The encrypted store in a keel home.
#[derive(Debug, Clone)]
pub struct SecretStore {
    dir: PathBuf,
    /// The encrypted file's name in the home.
    file: &'static str,
}

/// The decrypted contents: name → value (wiped when dropped).
type Plain = BTreeMap<String, Zeroizing<String>>;

impl SecretStore {
    /// The store of the keel home `dir`.
    pub fn new(dir: &Path) -> Self {
        Self { dir: dir.to_path_buf(), file: "secrets.age" }
    }

    /// The signing keys of the keel home `dir` (`keel key`): `signing-keys.age`, sealed with
    /// the same key as the secrets and kept apart from them, so no session can bind a signing
    /// key to a destination as it binds a secret.
    pub fn signing_keys(dir: &Path) -> Self {
        Self { dir: dir.to_path_buf(), file: "signing-keys.age" }
    }

    fn file(&self) -> PathBuf {
        self.dir.join(self.file)
    }

    fn key_file(&self) -> PathBuf {
        self.dir.join("secrets.key")
    }

    /// Runs `f` holding the store's lock (one writer at a time across processes).
    fn locked<T>(&self, f: impl FnOnce() -> Result<T, SecretError>) -> Result<T, SecretError> {
        crate::home::create_private_dir(&self.dir).map_err(io("creating the keel home"))?;
        let path = self.dir.join("secrets.lock");
        crate::home::touch_private(&path).map_err(io("creating secrets.lock"))?;
        let lock = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io("opening secrets.lock"))?;
        lock.lock().map_err(io("locking secrets.lock"))?;
        let out = f();
        let _ = lock.unlock();
        out
    }

    /// The key, created (0600) on first use when `create`. A key others can read is refused.
    fn identity(&self, create: bool) -> Result<Option<age::x25519::Identity>, SecretError> {
        self.identity_checked(create, true)
    }

    fn identity_checked(
        &self,
        create: bool,
        private: bool,
    ) -> Result<Option<age::x25519::Identity>, SecretError> {
        let path = self.key_file();
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                if private {
                    check_private(&path)?;
                }
                let line = text.lines().find(|l| !l.starts_with('#') && !l.trim().is_empty());
                let id = line
                    .and_then(|l| age::x25519::Identity::from_str(l.trim()).ok())
                    .ok_or_else(|| {
                        SecretError::Corrupt(format!(
                            "{} does not hold an age x25519 key",
                            path.display()
                        ))
                    })?;
                Ok(Some(id))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                let id = age::x25519::Identity::generate();
                write_private(&path, key_text(&id).as_bytes())?;
                Ok(Some(id))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(format!("reading {}", path.display()))(e)),
        }
    }

    fn read(&self) -> Result<Plain, SecretError> {
        let Some(bytes) = self.sealed()? else { return Ok(Plain::new()) };
        let id = self.identity(false)?.ok_or_else(|| {
            SecretError::Corrupt(format!(
                "{} exists but its key {} is missing; it cannot be read (remove {} to start over)",
                self.file,
                self.key_file().display(),
                self.file
            ))
        })?;
        self.open(&id, &bytes)
    }

    /// The encrypted file's bytes (`None`: there is none yet).
    fn sealed(&self) -> Result<Option<Vec<u8>>, SecretError> {
        match std::fs::read(self.file()) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(format!("reading {}", self.file))(e)),
        }
    }

    fn open(&self, id: &age::x25519::Identity, bytes: &[u8]) -> Result<Plain, SecretError> {
        let plain = Zeroizing::new(age::decrypt(id, bytes).map_err(|e| {
            SecretError::Corrupt(format!("{} cannot be decrypted: {e}", self.file))
        })?);
        let map: BTreeMap<String, String> = serde_json::from_slice(&plain).map_err(|e| {
            SecretError::Corrupt(format!("{} holds no map of names: {e}", self.file))
        })?;
        Ok(map.into_iter().map(|(k, v)| (k, Zeroizing::new(v))).collect())
    }

    fn write(&self, plain: &Plain) -> Result<(), SecretError> {
        let id = self.identity(true)?.ok_or_else(|| SecretError::Corrupt("no key".into()))?;
        self.seal(plain, &[id.to_public()])
    }

    /// Writes `plain` encrypted to `recipients`.
    fn seal(
        &self,
        plain: &Plain,
        recipients: &[age::x25519::Recipient],
    ) -> Result<(), SecretError> {
        let map: BTreeMap<&str, &str> =
            plain.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let text = Zeroizing::new(
            serde_json::to_vec(&map).map_err(|e| SecretError::Corrupt(e.to_string()))?,
        );
        let sealed = encrypt_to(recipients, &text)?;
        write_private(&self.file(), &sealed)
    }

    /// Stores `value` as secret `name` (replacing an earlier value). Returns whether it
    /// replaced one.
    pub fn set(&self, name: &str, value: Secret) -> Result<bool, SecretError> {
        if !valid_secret_name(name) {
            return Err(SecretError::BadName { name: name.to_string() });
        }
        let len = value.expose().len();
        if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&len) {
            return Err(SecretError::BadLength { name: name.to_string(), len });
        }
        if value.expose().chars().any(char::is_control) {
            return Err(SecretError::ControlCharacter { name: name.to_string() });
        }
        self.locked(|| {
            let mut plain = self.read()?;
            let replaced = plain.insert(name.to_string(), value.0.clone()).is_some();
            self.write(&plain)?;
            Ok(replaced)
        })
    }

    /// Removes secret `name`.
    pub fn remove(&self, name: &str) -> Result<(), SecretError> {
        self.locked(|| {
            let mut plain = self.read()?;
            if plain.remove(name).is_none() {
                return Err(SecretError::Missing { name: name.to_string() });
            }
            self.write(&plain)
        })
    }

    /// The names of the stored secrets, sorted.
    pub fn names(&self) -> Result<Vec<String>, SecretError> {
        Ok(self.read()?.into_keys().collect())
    }

    /// Every stored secret, name and value: what keel redacts from every call's output and
    /// looks for in every request, bound to the call or not.
    pub fn all(&self) -> Result<Vec<(String, Secret)>, SecretError> {
        Ok(self.read()?.into_iter().map(|(n, v)| (n, Secret(v))).collect())
    }

    /// The values of `names` (each once), or the first one missing.
    pub fn get(&self, names: &[String]) -> Result<Vec<(String, Secret)>, SecretError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        pick(&self.all()?, names)
    }
}

/// The key file's text.
fn key_text(id: &age::x25519::Identity) -> Zeroizing<String> {
    Zeroizing::new(format!(
        "# keel secrets key: decrypts secrets.age and signing-keys.age. Keep it private.\n{}\n",
        id.to_string().expose_secret()
    ))
}

/// `text` encrypted to every one of `recipients`.
fn encrypt_to(recipients: &[age::x25519::Recipient], text: &[u8]) -> Result<Vec<u8>, SecretError> {
    use std::io::Write as _;
    let failed = |e: &dyn fmt::Display| SecretError::Corrupt(format!("encrypting: {e}"));
    let encryptor =
        age::Encryptor::with_recipients(recipients.iter().map(|r| r as &dyn age::Recipient))
            .map_err(|e| failed(&e))?;
    let mut out = Vec::with_capacity(text.len() + 256);
    let mut writer = encryptor.wrap_output(&mut out).map_err(|e| failed(&e))?;
    writer.write_all(text).map_err(|e| failed(&e))?;
    writer.finish().map_err(|e| failed(&e))?;
    Ok(out)
}

/// What [`rotate_key`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotated {
    /// The stores re-encrypted to the new key (`secrets.age`, `signing-keys.age`), those that
    /// exist.
    pub stores: Vec<&'static str>,
    /// Secrets in them (their values were unchanged; change them at their services if the
    /// old key may have been read).
    pub secrets: usize,
}

/// Replaces the secrets key of the home `dir` with a new one and re-encrypts the secrets and
/// signing-key stores to it. This is how a key that others could read is retired: it works
/// whatever the old key's mode (the one command that reads a loose key), and every step leaves
/// a home that decrypts — the stores are first sealed to both keys, then the new key replaces
/// the old, then the stores are sealed to the new key alone.
pub fn rotate_key(dir: &Path) -> Result<Rotated, SecretError> {
    let secrets = SecretStore::new(dir);
    secrets.locked(|| {
        let stores = [SecretStore::new(dir), SecretStore::signing_keys(dir)];
        let old = secrets.identity_checked(false, false)?;
        let mut opened: Vec<(&SecretStore, Plain)> = Vec::new();
        for store in &stores {
            if let Some(bytes) = store.sealed()? {
                let id = old.as_ref().ok_or_else(|| {
                    SecretError::Corrupt(format!(
                        "{} exists but the key {} is missing; it cannot be re-encrypted",
                        store.file,
                        store.key_file().display()
                    ))
                })?;
                opened.push((store, store.open(id, &bytes)?));
            }
        }
        let new = age::x25519::Identity::generate();
        if let Some(old) = &old {
            for (store, plain) in &opened {
                store.seal(plain, &[old.to_public(), new.to_public()])?;
            }
        }
        write_private(&secrets.key_file(), key_text(&new).as_bytes())?;
        for (store, plain) in &opened {
            store.seal(plain, &[new.to_public()])?;
        }
        Ok(Rotated {
            stores: opened.iter().map(|(s, _)| s.file).collect(),
            secrets: opened
                .iter()
                .filter(|(s, _)| s.file == "secrets.age")
                .map(|(_, p)| p.len())
                .sum(),
        })
    })
}

/// Refuses a key file that others can read: it may already have been read, and with it every
/// secret it decrypts. (keel never loosens it; nothing tightens it behind the admin's back.)
fn check_private(path: &Path) -> Result<(), SecretError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(io("reading the key file's mode"))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(SecretError::LooseKey {
                path: path.display().to_string(),
                mode: mode & 0o777,
            });
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` through a private temporary file renamed into place.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), SecretError> {
    let what = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    crate::home::write_private(path, bytes).map_err(io(format!("writing {what}")))
}

/// The values of `names` among `all` (each once), or the first one missing.
pub fn pick(
    all: &[(String, Secret)],
    names: &[String],
) -> Result<Vec<(String, Secret)>, SecretError> {
    names
        .iter()
        .map(|n| match all.iter().find(|(k, _)| k == n) {
            Some((_, v)) => Ok((n.clone(), v.clone())),
            None => Err(SecretError::Missing { name: n.clone() }),
        })
        .collect()
}

/// `value` percent-encoded as keel writes a secret into a URL's query (`:in=query`): every
/// byte but ASCII letters, digits and `-._~` as `%XX`, upper-case hex.
pub fn url_encoded(value: &str) -> String {
    percent_encoded(value, true)
}

/// `value` percent-encoded as [`url_encoded`], with upper- or lower-case hex.
fn percent_encoded(value: &str, upper: bool) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else if upper {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

/// Replaces every exact occurrence of a secret's value by `[secret:NAME]`, and every cut-off
/// start of one — at least [`MIN_PARTIAL`] bytes of its beginning where the text ends or
/// where a character follows that is neither a letter nor a digit (a cut and the marker after
/// it) — by `[secret:NAME…]`. The forms keel itself encodes a value in on the wire (its
/// percent-encoded form, in either case of hex) are replaced the same way, so a server that
/// echoes a query keel filled does not bring the value back.
#[derive(Clone, Default)]
pub struct Redactor {
    matcher: Option<std::sync::Arc<Matcher>>,
}

struct Matcher {
    /// The values, longest match first.
    full: aho_corasick::AhoCorasick,
    marks: Vec<String>,
    /// The first [`MIN_PARTIAL`] bytes of each value, where a cut-off start is looked for.
    starts: Option<aho_corasick::AhoCorasick>,
    /// Per start pattern: the value and its partial mark.
    partial: Vec<(Zeroizing<String>, String)>,
}

/// Shortest cut-off start of a secret that is redacted (shorter ones would match ordinary
/// text).
pub const MIN_PARTIAL: usize = 6;

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.matcher.as_ref().map(|m| m.marks.clone()).unwrap_or_default();
        f.debug_struct("Redactor").field("secrets", &names).finish()
    }
}

impl Redactor {
    /// A redactor of `secrets` (none: one that changes nothing).
    pub fn new(secrets: &[(String, Secret)]) -> Self {
        let secrets: Vec<&(String, Secret)> =
            secrets.iter().filter(|(_, s)| !s.expose().is_empty()).collect();
        if secrets.is_empty() {
            return Self::default();
        }
        // Each value, and the encoded forms keel writes it in, each with its name's mark.
        let mut patterns: Vec<String> = Vec::new();
        let mut marks: Vec<String> = Vec::new();
        for (n, s) in &secrets {
            let encoded = url_encoded(s.expose());
            let lower = percent_encoded(s.expose(), false);
            for form in [s.expose().to_string(), encoded, lower] {
                if !patterns.contains(&form) {
                    patterns.push(form);
                    marks.push(format!("[secret:{n}]"));
                }
            }
        }
        let built = aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostLongest)
            .build(&patterns);
        drop(Zeroizing::new(patterns));
        let partial: Vec<(Zeroizing<String>, String)> = secrets
            .iter()
            .filter(|(_, s)| s.expose().len() > MIN_PARTIAL)
            .map(|(n, s)| (Zeroizing::new(s.expose().to_string()), format!("[secret:{n}…]")))
            .collect();
        let starts = aho_corasick::AhoCorasick::new(
            partial.iter().map(|(v, _)| &v.as_bytes()[..MIN_PARTIAL]),
        );
        match (built, starts) {
            (Ok(full), Ok(starts)) => {
                let starts = (!partial.is_empty()).then_some(starts);
                Self {
                    matcher: Some(std::sync::Arc::new(Matcher { full, marks, starts, partial })),
                }
            }
            // Values are bounded in size and number; a matcher that cannot be built is a bug,
            // and nothing is shown rather than something unredacted.
            _ => Self { matcher: None },
        }
    }

    pub fn is_empty(&self) -> bool {
        self.matcher.is_none()
    }

    /// `text` with every secret value, and every cut-off start of one, replaced.
    pub fn redact<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        let Some(m) = &self.matcher else { return text.into() };
        let text: std::borrow::Cow<'a, str> = if m.full.is_match(text) {
            m.full.replace_all(text, &m.marks).into()
        } else {
            text.into()
        };
        match m.partial_cuts(&text) {
            None => text,
            Some(cut) => cut.into(),
        }
    }

    /// Redacts `s` in place.
    pub fn redact_string(&self, s: &mut String) {
        if let std::borrow::Cow::Owned(r) = self.redact(s) {
            *s = r;
        }
    }

    /// Redacts every string (and key) in a JSON value, in place.
    pub fn redact_json(&self, v: &mut serde_json::Value) {
        if self.is_empty() {
            return;
        }
        match v {
            serde_json::Value::String(s) => self.redact_string(s),
            serde_json::Value::Array(a) => a.iter_mut().for_each(|x| self.redact_json(x)),
            serde_json::Value::Object(o) => {
                let entries = std::mem::take(o);
                for (k, mut x) in entries {
                    self.redact_json(&mut x);
                    o.insert(self.redact(&k).into_owned(), x);
                }
            }
            _ => {}
        }
    }
}

impl Matcher {
    /// `text` with each cut-off start of a value replaced, or `None` when there is none.
    fn partial_cuts(&self, text: &str) -> Option<String> {
        let starts = self.starts.as_ref()?;
        let bytes = text.as_bytes();
        let mut out = String::new();
        let mut copied = 0;
        for hit in starts.find_overlapping_iter(text) {
            if hit.start() < copied {
                continue;
            }
            let (value, mark) = &self.partial[hit.pattern().as_usize()];
            let value = value.as_bytes();
            let same = bytes[hit.start()..].iter().zip(value).take_while(|(a, b)| a == b).count();
            let end = hit.start() + same;
            let cut_here = match bytes.get(end) {
                None => true,
                Some(next) => !next.is_ascii_alphanumeric() && Some(next) != value.get(same),
            };
            // A whole value was replaced already; only a strict start is a cut one.
            if same < value.len() && cut_here && text.is_char_boundary(end) {
                out.push_str(&text[copied..hit.start()]);
                out.push_str(mark);
                copied = end;
            }
        }
        (copied > 0).then(|| {
            out.push_str(&text[copied..]);
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_off_start_of_a_secret_is_redacted_where_the_text_ends_or_a_marker_follows() {
        let r = Redactor::new(&[("T".into(), Secret::new("canary-3f9c0a1b2c4d5e6f7a8b9".into()))]);
        // Cut one byte before the end, at the end of the text and before a marker.
        assert_eq!(r.redact("echo: canary-3f9c0a1b2c4d5e6f7a8"), "echo: [secret:T…]");
        assert_eq!(
            r.redact("echo: canary-3f9c0a1b2c4d5e6f7a8\n[body truncated at 30 bytes]"),
            "echo: [secret:T…]\n[body truncated at 30 bytes]"
        );
        assert_eq!(
            r.redact("x canary-3f9c … [12 more bytes cut]"),
            "x [secret:T…] … [12 more bytes cut]"
        );
        // The whole value, as before; a short start, or one running on into other letters,
        // stays.
        assert_eq!(r.redact("canary-3f9c0a1b2c4d5e6f7a8b9!"), "[secret:T]!");
        assert_eq!(r.redact("a canar"), "a canar");
        assert_eq!(r.redact("canary-3f9cZZZ"), "canary-3f9cZZZ");
        let mut v = serde_json::json!({"body": "…canary-3f9c0a1b2c4d5", "truncated": true});
        r.redact_json(&mut v);
        assert_eq!(v["body"], "…[secret:T…]");
    }

    #[test]
    fn values_round_trip_encrypted_and_the_file_holds_no_plaintext() {
        let dir = tempfile::tempdir().unwrap();
        let store = SecretStore::new(dir.path());
        assert!(store.names().unwrap().is_empty());
        assert!(!store.set("API_KEY", Secret::new("canary-0123456789".into())).unwrap());
        assert!(store.set("API_KEY", Secret::new("canary-9876543210".into())).unwrap());
        store.set("other", Secret::new("another-value".into())).unwrap();
        assert_eq!(store.names().unwrap(), ["API_KEY", "other"]);
        let got = store.get(&["API_KEY".into()]).unwrap();
        assert_eq!(got[0].1.expose(), "canary-9876543210");
        let raw = std::fs::read(dir.path().join("secrets.age")).unwrap();
        assert!(!raw.windows(6).any(|w| w == b"canary"));
        assert!(format!("{:?}", got[0].1).contains("hidden"));
        store.remove("other").unwrap();
        assert!(matches!(store.remove("other"), Err(SecretError::Missing { .. })));
        assert!(matches!(store.get(&["nope".into()]), Err(SecretError::Missing { .. })));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for f in ["secrets.key", "secrets.age"] {
                let mode = std::fs::metadata(dir.path().join(f)).unwrap().permissions().mode();
                assert_eq!(mode & 0o777, 0o600, "{f}");
            }
        }
    }

    #[test]
    fn bad_names_and_values_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = SecretStore::new(dir.path());
        assert!(matches!(
            store.set("a b", Secret::new("12345678".into())),
            Err(SecretError::BadName { .. })
        ));
        assert!(matches!(
            store.set("k", Secret::new("short".into())),
            Err(SecretError::BadLength { .. })
        ));
        assert!(matches!(
            store.set("k", Secret::new("line\nbreak!".into())),
            Err(SecretError::ControlCharacter { .. })
        ));
    }

    #[test]
    fn a_key_readable_by_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = SecretStore::new(dir.path());
        store.set("k", Secret::new("12345678".into())).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let key = dir.path().join("secrets.key");
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
            let e = store.names().unwrap_err().to_string();
            assert!(e.contains("mode 644") && e.contains("keel secret rotate-key"), "{e}");
            // Rotating retires it: a new private key, the same secrets readable.
            let rotated = rotate_key(dir.path()).unwrap();
            assert_eq!((rotated.stores, rotated.secrets), (vec!["secrets.age"], 1));
            let mode = std::fs::metadata(&key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            assert_eq!(store.get(&["k".into()]).unwrap()[0].1.expose(), "12345678");
        }
    }

    #[test]
    fn the_forms_keel_encodes_a_value_in_are_redacted_too() {
        let r = Redactor::new(&[("T".into(), Secret::new("tok/Abc+def=".into()))]);
        assert_eq!(r.redact("q=tok%2FAbc%2Bdef%3D&x"), "q=[secret:T]&x");
        assert_eq!(r.redact("q=tok%2fAbc%2bdef%3d"), "q=[secret:T]");
        assert_eq!(r.redact("tok/Abc+def="), "[secret:T]");
    }

    #[test]
    fn the_redactor_replaces_every_occurrence_in_text_and_json() {
        let r = Redactor::new(&[
            ("A".into(), Secret::new("sk-abcdef".into())),
            ("B".into(), Secret::new("sk-abcdef-long".into())),
        ]);
        assert_eq!(r.redact("x sk-abcdef-long y sk-abcdef"), "x [secret:B] y [secret:A]");
        let mut v =
            serde_json::json!({"sk-abcdef": ["echo sk-abcdef", 1, {"k": "sk-abcdef-long"}]});
        r.redact_json(&mut v);
        assert_eq!(v.to_string(), r#"{"[secret:A]":["echo [secret:A]",1,{"k":"[secret:B]"}]}"#);
        assert_eq!(Redactor::default().redact("sk-abcdef"), "sk-abcdef");
    }
}
