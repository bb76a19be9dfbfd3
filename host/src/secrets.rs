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
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use age::secrecy::ExposeSecret;
use zeroize::Zeroizing;

pub use crate::sandbox::net::grant::{MAX_SECRET_NAME, valid_secret_name};

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
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> SecretError {
    let context = context.into();
    move |source| SecretError::Io { context, source }
}

/// The encrypted store in a keel home.
#[derive(Debug, Clone)]
pub struct SecretStore {
    dir: PathBuf,
}

/// The decrypted contents: name → value (wiped when dropped).
type Plain = BTreeMap<String, Zeroizing<String>>;

impl SecretStore {
    /// The store of the keel home `dir`.
    pub fn new(dir: &Path) -> Self {
        Self { dir: dir.to_path_buf() }
    }

    fn file(&self) -> PathBuf {
        self.dir.join("secrets.age")
    }

    fn key_file(&self) -> PathBuf {
        self.dir.join("secrets.key")
    }

    /// Runs `f` holding the store's lock (one writer at a time across processes).
    fn locked<T>(&self, f: impl FnOnce() -> Result<T, SecretError>) -> Result<T, SecretError> {
        std::fs::create_dir_all(&self.dir).map_err(io("creating the keel home"))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join("secrets.lock"))
            .map_err(io("opening secrets.lock"))?;
        lock.lock().map_err(io("locking secrets.lock"))?;
        let out = f();
        let _ = lock.unlock();
        out
    }

    /// The key, created (0600) on first use when `create`.
    fn identity(&self, create: bool) -> Result<Option<age::x25519::Identity>, SecretError> {
        let path = self.key_file();
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                check_private(&path)?;
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
                let text = Zeroizing::new(format!(
                    "# keel secrets key: decrypts secrets.age. Keep it private.\n{}\n",
                    id.to_string().expose_secret()
                ));
                write_private(&path, text.as_bytes())?;
                Ok(Some(id))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(format!("reading {}", path.display()))(e)),
        }
    }

    fn read(&self) -> Result<Plain, SecretError> {
        let bytes = match std::fs::read(self.file()) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Plain::new()),
            Err(e) => return Err(io("reading secrets.age")(e)),
        };
        let id = self.identity(false)?.ok_or_else(|| {
            SecretError::Corrupt(format!(
                "secrets.age exists but its key {} is missing; the secrets cannot be read (remove secrets.age to start over)",
                self.key_file().display()
            ))
        })?;
        let plain =
            Zeroizing::new(age::decrypt(&id, &bytes).map_err(|e| {
                SecretError::Corrupt(format!("secrets.age cannot be decrypted: {e}"))
            })?);
        let map: BTreeMap<String, String> = serde_json::from_slice(&plain)
            .map_err(|e| SecretError::Corrupt(format!("secrets.age holds no secrets map: {e}")))?;
        Ok(map.into_iter().map(|(k, v)| (k, Zeroizing::new(v))).collect())
    }

    fn write(&self, plain: &Plain) -> Result<(), SecretError> {
        let id = self.identity(true)?.ok_or_else(|| SecretError::Corrupt("no key".into()))?;
        let map: BTreeMap<&str, &str> =
            plain.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let text = Zeroizing::new(
            serde_json::to_vec(&map).map_err(|e| SecretError::Corrupt(e.to_string()))?,
        );
        let sealed = age::encrypt(&id.to_public(), &text)
            .map_err(|e| SecretError::Corrupt(format!("encrypting: {e}")))?;
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

    /// The values of `names` (each once), or the first one missing.
    pub fn get(&self, names: &[String]) -> Result<Vec<(String, Secret)>, SecretError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let plain = self.read()?;
        names
            .iter()
            .map(|n| match plain.get(n) {
                Some(v) => Ok((n.clone(), Secret(v.clone()))),
                None => Err(SecretError::Missing { name: n.clone() }),
            })
            .collect()
    }
}

/// Refuses a key file that others can read.
fn check_private(path: &Path) -> Result<(), SecretError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(io("reading the key file's mode"))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(SecretError::Corrupt(format!(
                "{} is readable by others (mode {:o}); run `chmod 600 {}`",
                path.display(),
                mode & 0o777,
                path.display()
            )));
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` through a private temporary file renamed into place.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), SecretError> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let what = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut f = opts.open(&tmp).map_err(io(format!("creating {what}")))?;
    f.write_all(bytes).map_err(io(format!("writing {what}")))?;
    f.sync_all().map_err(io(format!("syncing {what}")))?;
    std::fs::rename(&tmp, path).map_err(io(format!("publishing {what}")))
}

/// Replaces every exact occurrence of a secret's value by `[secret:NAME]`.
#[derive(Clone, Default)]
pub struct Redactor {
    matcher: Option<std::sync::Arc<(aho_corasick::AhoCorasick, Vec<String>)>>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.matcher.as_ref().map(|m| m.1.clone()).unwrap_or_default();
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
        let built = aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostLongest)
            .build(secrets.iter().map(|(_, s)| s.expose()));
        match built {
            Ok(ac) => {
                let marks = secrets.iter().map(|(n, _)| format!("[secret:{n}]")).collect();
                Self { matcher: Some(std::sync::Arc::new((ac, marks))) }
            }
            // Values are bounded in size and number; a matcher that cannot be built is a bug,
            // and nothing is shown rather than something unredacted.
            Err(_) => Self { matcher: None },
        }
    }

    pub fn is_empty(&self) -> bool {
        self.matcher.is_none()
    }

    /// `text` with every secret value replaced.
    pub fn redact<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        let Some(m) = &self.matcher else { return text.into() };
        if !m.0.is_match(text) {
            return text.into();
        }
        m.0.replace_all(text, &m.1).into()
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

#[cfg(test)]
mod tests {
    use super::*;

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
            assert!(store.names().unwrap_err().to_string().contains("chmod 600"));
        }
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
