//! Signing keys that leave one home: a key exported sealed (with a passphrase, or to age
//! recipients), imported into another home, or handed to a CI job in the environment
//! (`KEEL_SIGNING_KEY`, with `KEEL_SIGNING_KEY_PASSPHRASE`), so a publisher's key does not have
//! to live in one developer's home.
//!
//! An export is an age file, ASCII-armored (`age --decrypt` opens it too), whose plaintext is
//! a small JSON document: `{"keel_signing_key": 1, "name": NAME, "secret": SECRET}`. Where a
//! home keeps its keys is the secrets store's ([`SecretStore::signing_keys`]); this module
//! seals, opens and finds them.

use std::path::Path;
use std::str::FromStr;

use age::secrecy::SecretString;
use zeroize::Zeroizing;

use crate::secrets::{Secret, SecretError, SecretStore};

/// The variable holding an exported key for a process that has no key in its home.
pub const KEY_VAR: &str = "KEEL_SIGNING_KEY";
/// The variable holding the passphrase of [`KEY_VAR`]'s key (and of `keel key export` and
/// `import` when no terminal asks for it).
pub const PASSPHRASE_VAR: &str = "KEEL_SIGNING_KEY_PASSPHRASE";
/// Largest export read (a key's export is well under 1 KiB).
pub const MAX_EXPORT_BYTES: usize = 64 * 1024;
/// The largest scrypt work factor an import accepts (2^22: a few seconds), so a crafted file
/// cannot make an import run for hours.
const MAX_WORK_FACTOR: u8 = 22;
/// Shortest passphrase accepted for an export.
pub const MIN_PASSPHRASE: usize = 12;

/// Why a key could not be exported, imported or found.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{0}")]
    Store(#[from] SecretError),
    #[error("no signing key `{name}`; see `keel key list`, make one with `keel key new {name}`, or import one (`keel key import {name} FILE`, or {KEY_VAR} in the environment)")]
    Missing { name: String },
    #[error("{KEY_VAR} holds the key `{held}`, not `{name}`")]
    OtherKey { held: String, name: String },
    #[error("a passphrase of at least {MIN_PASSPHRASE} characters is needed")]
    WeakPassphrase,
    #[error("`{0}` is not an age recipient (age1…)")]
    BadRecipient(String),
    #[error("the export cannot be opened: {0}")]
    Open(String),
    #[error("the export is not a keel signing key: {0}")]
    NotAKey(String),
    #[error("the export is sealed with a passphrase: give it in {PASSPHRASE_VAR} (or at the terminal)")]
    NeedsPassphrase,
    #[error("the export is sealed to age recipients: give the identity file with --identity")]
    NeedsIdentity,
}

impl KeyError {
    /// A stable name of the error's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Store(_) => "keys",
            Self::Missing { .. } | Self::OtherKey { .. } => "not_found",
            Self::WeakPassphrase | Self::BadRecipient(_) => "invalid_input",
            Self::Open(_) | Self::NotAKey(_) => "unreadable",
            Self::NeedsPassphrase | Self::NeedsIdentity => "needs_secret",
        }
    }
}

/// How an export is sealed.
pub enum Seal {
    /// With a passphrase (age's scrypt recipient).
    Passphrase(Zeroizing<String>),
    /// To age X25519 recipients (`age1…`): their identities open it.
    Recipients(Vec<String>),
}

/// What opens an export.
#[derive(Default)]
pub struct Unseal {
    pub passphrase: Option<Zeroizing<String>>,
    /// The text of an age identity file (`AGE-SECRET-KEY-1…` lines, `#` comments).
    pub identities: Option<Zeroizing<String>>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Exported {
    keel_signing_key: u32,
    name: String,
    secret: String,
}

/// The signing key `name` of the home `dir`, sealed as `seal` says: armored age text.
pub fn export(dir: &Path, name: &str, seal: &Seal) -> Result<String, KeyError> {
    let secret = SecretStore::signing_keys(dir)
        .get(&[name.to_string()])
        .map_err(|e| match e {
            SecretError::Missing { .. } => KeyError::Missing { name: name.to_string() },
            e => KeyError::Store(e),
        })?
        .pop()
        .map(|(_, s)| s)
        .ok_or_else(|| KeyError::Missing { name: name.to_string() })?;
    let doc = Exported { keel_signing_key: 1, name: name.to_string(), secret: secret.expose().to_string() };
    let plain = Zeroizing::new(serde_json::to_vec(&doc).unwrap_or_default());
    let sealed = match seal {
        Seal::Passphrase(p) => {
            if p.chars().count() < MIN_PASSPHRASE {
                return Err(KeyError::WeakPassphrase);
            }
            let r = age::scrypt::Recipient::new(SecretString::from(p.to_string()));
            age::encrypt_and_armor(&r, &plain)
        }
        Seal::Recipients(list) => {
            let recipients = list
                .iter()
                .map(|r| {
                    age::x25519::Recipient::from_str(r.trim())
                        .map_err(|_| KeyError::BadRecipient(r.clone()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let boxed: Vec<&dyn age::Recipient> =
                recipients.iter().map(|r| r as &dyn age::Recipient).collect();
            let encryptor = age::Encryptor::with_recipients(boxed.into_iter())
                .map_err(|e| KeyError::Open(e.to_string()))?;
            let mut out = Vec::new();
            let armored = age::armor::ArmoredWriter::wrap_output(&mut out, age::armor::Format::AsciiArmor)
                .map_err(|e| KeyError::Open(e.to_string()))?;
            let mut w = encryptor.wrap_output(armored).map_err(|e| KeyError::Open(e.to_string()))?;
            std::io::Write::write_all(&mut w, &plain).map_err(|e| KeyError::Open(e.to_string()))?;
            w.finish()
                .and_then(|a| a.finish())
                .map_err(|e| KeyError::Open(e.to_string()))?;
            return String::from_utf8(out).map_err(|e| KeyError::Open(e.to_string()));
        }
    };
    sealed.map_err(|e| KeyError::Open(e.to_string()))
}

/// Whether an export is sealed with a passphrase (else to recipients), from its header.
pub fn needs_passphrase(text: &str) -> Result<bool, KeyError> {
    let reader = age::armor::ArmoredReader::new(text.as_bytes());
    let d = age::Decryptor::new_buffered(reader).map_err(|e| KeyError::Open(e.to_string()))?;
    Ok(d.is_scrypt())
}

/// The key an export holds: its name and secret, the secret checked to be an ed25519 key.
pub fn open(text: &str, unseal: &Unseal) -> Result<(String, Secret), KeyError> {
    if text.len() > MAX_EXPORT_BYTES {
        return Err(KeyError::NotAKey(format!("it is over {MAX_EXPORT_BYTES} bytes")));
    }
    let plain = if needs_passphrase(text)? {
        let p = unseal.passphrase.as_ref().ok_or(KeyError::NeedsPassphrase)?;
        let mut id = age::scrypt::Identity::new(SecretString::from(p.to_string()));
        id.set_max_work_factor(MAX_WORK_FACTOR);
        age::decrypt(&id, text.as_bytes())
    } else {
        let ids = unseal.identities.as_ref().ok_or(KeyError::NeedsIdentity)?;
        let parsed: Vec<age::x25519::Identity> = ids
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(|l| age::x25519::Identity::from_str(l).ok())
            .collect();
        if parsed.is_empty() {
            return Err(KeyError::Open("the identity file holds no age key (AGE-SECRET-KEY-1…)".into()));
        }
        let reader = age::armor::ArmoredReader::new(text.as_bytes());
        let d = age::Decryptor::new_buffered(reader).map_err(|e| KeyError::Open(e.to_string()))?;
        let mut r = d
            .decrypt(parsed.iter().map(|i| i as &dyn age::Identity))
            .map_err(|e| KeyError::Open(e.to_string()))?;
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut r, &mut out).map_err(|e| KeyError::Open(e.to_string()))?;
        Ok(out)
    };
    let plain = Zeroizing::new(plain.map_err(|e| KeyError::Open(e.to_string()))?);
    let doc: Exported =
        serde_json::from_slice(&plain).map_err(|e| KeyError::NotAKey(e.to_string()))?;
    if doc.keel_signing_key != 1 {
        return Err(KeyError::NotAKey(format!("format {} is not one this keel reads", doc.keel_signing_key)));
    }
    crate::signing::public_of(&doc.secret).map_err(|e| KeyError::NotAKey(e.to_string()))?;
    let secret = Zeroizing::new(doc.secret);
    Ok((doc.name, Secret::new(secret.to_string())))
}

/// The signing key `name`: the home's, else the one [`KEY_VAR`] holds (opened with
/// [`PASSPHRASE_VAR`]) when it was exported under that name.
pub fn find(dir: &Path, name: &str) -> Result<Secret, KeyError> {
    match SecretStore::signing_keys(dir).get(&[name.to_string()]) {
        Ok(mut found) if !found.is_empty() => return Ok(found.remove(0).1),
        Ok(_) | Err(SecretError::Missing { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let Some(text) = std::env::var(KEY_VAR).ok().filter(|t| !t.trim().is_empty()) else {
        return Err(KeyError::Missing { name: name.to_string() });
    };
    let unseal = Unseal {
        passphrase: std::env::var(PASSPHRASE_VAR).ok().map(Zeroizing::new),
        identities: None,
    };
    let (held, secret) = open(&text, &unseal)?;
    if held != name {
        return Err(KeyError::OtherKey { held, name: name.to_string() });
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn home_with_key(name: &str) -> (tempfile::TempDir, String) {
        let home = tempfile::tempdir().unwrap();
        let (public, secret) = crate::signing::generate();
        SecretStore::signing_keys(home.path()).set(name, Secret::new(secret.to_string())).unwrap();
        (home, public.to_string())
    }

    #[test]
    fn an_export_opens_with_its_passphrase_or_identity_and_nothing_else() {
        let (home, public) = home_with_key("acme");
        let pass = Zeroizing::new("correct horse battery".to_string());
        let text = export(home.path(), "acme", &Seal::Passphrase(pass.clone())).unwrap();
        assert!(text.starts_with("-----BEGIN AGE ENCRYPTED FILE-----"), "{text}");
        assert!(needs_passphrase(&text).unwrap());
        let (name, secret) =
            open(&text, &Unseal { passphrase: Some(pass), identities: None }).unwrap();
        assert_eq!(name, "acme");
        assert_eq!(crate::signing::public_of(secret.expose()).unwrap().to_string(), public);
        let wrong = Unseal { passphrase: Some(Zeroizing::new("wrong horse battery".into())), identities: None };
        assert!(matches!(open(&text, &wrong), Err(KeyError::Open(_))));
        assert!(matches!(open(&text, &Unseal::default()), Err(KeyError::NeedsPassphrase)));

        let id = age::x25519::Identity::generate();
        let to = Seal::Recipients(vec![id.to_public().to_string()]);
        let text = export(home.path(), "acme", &to).unwrap();
        assert!(!needs_passphrase(&text).unwrap());
        assert!(matches!(open(&text, &Unseal::default()), Err(KeyError::NeedsIdentity)));
        let ids = Zeroizing::new(format!("# mine\n{}\n", age::secrecy::ExposeSecret::expose_secret(&id.to_string())));
        let (name, _) = open(&text, &Unseal { passphrase: None, identities: Some(ids) }).unwrap();
        assert_eq!(name, "acme");
    }

    #[test]
    fn a_short_passphrase_a_bad_recipient_and_a_missing_key_are_refused() {
        let (home, _) = home_with_key("acme");
        let short = Seal::Passphrase(Zeroizing::new("short".into()));
        assert!(matches!(export(home.path(), "acme", &short), Err(KeyError::WeakPassphrase)));
        let bad = Seal::Recipients(vec!["age1nope".into()]);
        assert!(matches!(export(home.path(), "acme", &bad), Err(KeyError::BadRecipient(_))));
        let pass = Seal::Passphrase(Zeroizing::new("long enough passphrase".into()));
        assert!(matches!(export(home.path(), "other", &pass), Err(KeyError::Missing { .. })));
        assert!(matches!(open("not age", &Unseal::default()), Err(KeyError::Open(_))));
    }
}
