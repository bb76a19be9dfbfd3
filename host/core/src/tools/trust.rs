//! The publishers an admin trusts: a name, an ed25519 public key, and the packages (a glob
//! over component names or registry repositories) the key may sign for. Install checks a
//! component's embedded signature against these keys before it compiles anything.

use crate::sql::{Connection, OptionalExtension, params};

use crate::signing::PublicKey;
use crate::store::StoreError;

/// One trusted publisher key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TrustedKey {
    pub name: String,
    /// `ed25519:` and 64 hex digits.
    pub public_key: String,
    /// The packages it may sign for: a glob matched a segment at a time ([`glob_matches`];
    /// `*`: every package).
    pub packages: String,
    pub added_at: String,
}

impl TrustedKey {
    /// Whether this key may sign for the package `name`.
    pub fn covers(&self, name: &str) -> bool {
        glob_matches(&self.packages, name)
    }

    /// The key, parsed (a stored key is checked when it is added).
    pub fn key(&self) -> Result<PublicKey, StoreError> {
        self.public_key
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("trusted key `{}`: {e}", self.name)))
    }
}

/// Whether `pattern` covers the package `name`, a `/`-separated segment at a time: within a
/// segment `*` matches any run of characters (never a `/`), and a last segment that is `*`
/// alone matches one or more whole segments (everything below). So `acme/*` covers `acme/x`
/// and `acme/x/y` but not `acme-evil/x`, and `*` covers every package.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let pat: Vec<&str> = pattern.split('/').collect();
    let parts: Vec<&str> = name.split('/').collect();
    match pat.split_last() {
        Some((&"*", head)) => {
            parts.len() > head.len() && head.iter().zip(&parts).all(|(p, n)| segment_matches(p, n))
        }
        _ => pat.len() == parts.len() && pat.iter().zip(&parts).all(|(p, n)| segment_matches(p, n)),
    }
}

/// `*` matches any run of characters; everything else matches itself.
fn segment_matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let [first, middle @ .., last] = parts.as_slice() else { return pattern == name };
    if parts.len() == 1 {
        return pattern == name;
    }
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

fn valid_glob(pattern: &str) -> bool {
    !pattern.is_empty()
        && pattern.len() <= 256
        && pattern
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "*-_./:".contains(c))
}

fn row(r: &crate::sql::Row<'_>) -> crate::sql::Result<TrustedKey> {
    Ok(TrustedKey {
        name: r.get(0)?,
        public_key: r.get(1)?,
        packages: r.get(2)?,
        added_at: r.get(3)?,
    })
}

/// Trusts `key` as `name` for `packages`. A name or key already trusted is refused (remove it
/// first), so a trust is never widened silently.
pub fn add_in(
    c: &Connection,
    name: &str,
    key: &str,
    packages: &str,
) -> Result<TrustedKey, StoreError> {
    if !crate::names::valid_component_name(name) {
        return Err(StoreError::Input(format!(
            "`{name}` is not a valid trust name: use lowercase letters, digits, `_` and `-`, starting with a letter"
        )));
    }
    let key: PublicKey = key.parse().map_err(|e| StoreError::Input(format!("{e}")))?;
    if !valid_glob(packages) {
        return Err(StoreError::Input(format!(
            "`{packages}` is not a package glob: use lowercase letters, digits, `-`, `_`, `.`, `/`, `:` and `*` (any run of characters)"
        )));
    }
    let public_key = key.to_string();
    let taken: Option<String> = c
        .query_row(
            "SELECT name FROM trusted_keys WHERE name = ?1 OR public_key = ?2",
            params![name, public_key],
            |r| r.get(0),
        )
        .optional()?;
    if let Some(other) = taken {
        return Err(StoreError::Conflict(if other == name {
            format!(
                "a key is already trusted as `{name}`; remove it first (`keel trust remove {name}`)"
            )
        } else {
            format!("this key is already trusted as `{other}`")
        }));
    }
    let t = TrustedKey {
        name: name.to_string(),
        public_key,
        packages: packages.to_string(),
        added_at: super::install_time(),
    };
    c.execute(
        "INSERT INTO trusted_keys (name, public_key, packages, added_at) VALUES (?1, ?2, ?3, ?4)",
        params![t.name, t.public_key, t.packages, t.added_at],
    )?;
    Ok(t)
}

/// Every trusted key, by name.
pub fn list_in(c: &Connection) -> Result<Vec<TrustedKey>, StoreError> {
    Ok(c.prepare("SELECT name, public_key, packages, added_at FROM trusted_keys ORDER BY name")?
        .query_map([], row)?
        .collect::<Result<_, _>>()?)
}

/// Stops trusting `name`. Components it signed stay installed (their record keeps the
/// signer); later installs no longer accept its signature.
pub fn remove_in(c: &Connection, name: &str) -> Result<TrustedKey, StoreError> {
    let t = c
        .query_row(
            "SELECT name, public_key, packages, added_at FROM trusted_keys WHERE name = ?1",
            [name],
            row,
        )
        .optional()?
        .ok_or_else(|| {
            StoreError::NotFound(format!("no key is trusted as `{name}`; see `keel trust list`"))
        })?;
    c.execute("DELETE FROM trusted_keys WHERE name = ?1", [name])?;
    Ok(t)
}

/// The trusted key whose scope covers `package` and that signed `bytes`, if any.
pub fn signer_in(
    c: &Connection,
    bytes: &[u8],
    package: &str,
) -> Result<Option<TrustedKey>, StoreError> {
    if !crate::signing::is_signed(bytes) {
        return Ok(None);
    }
    for t in list_in(c)?.into_iter().filter(|t| t.covers(package)) {
        if crate::signing::verify(bytes, &t.key()?).is_ok() {
            return Ok(Some(t));
        }
    }
    Ok(None)
}

/// Whether the key that signed `c` when it was installed is trusted still, for `c`'s package
/// (its registry package, else its name): a trusted key of the same name and the same public
/// key whose scope covers it. `None` when no trusted key signed it.
pub fn still_trusted(keys: &[TrustedKey], c: &super::ComponentRecord) -> Option<bool> {
    let (name, key) = (c.signer.as_ref()?, c.signer_key.as_ref()?);
    let package = match c.source.parse::<crate::oci::OciRef>() {
        Ok(r) => r.package(),
        Err(_) => c.name.clone(),
    };
    Some(keys.iter().any(|t| t.name == *name && t.public_key == *key && t.covers(&package)))
}

/// Why a registry artifact's signature does not let it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unverified {
    /// It carries no signature.
    Unsigned,
    /// Its signature is in several parts (it would verify copies cut short too).
    MultiPart,
    /// No trusted key made any of its signatures.
    Untrusted,
    /// A trusted key signed it, but its scope does not cover the package.
    OutOfScope { key: String, packages: String },
}

impl std::fmt::Display for Unverified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unsigned => f.write_str("it is not signed"),
            Self::MultiPart => f.write_str(
                "its signature is in several parts, which also verify copies cut short; keel \
                 accepts only a signature over the whole file",
            ),
            Self::Untrusted => f.write_str("it is signed, but by no key keel trusts"),
            Self::OutOfScope { key, packages } => write!(
                f,
                "it is signed by the trusted key `{key}`, whose scope ({packages}) does not \
                 cover this package"
            ),
        }
    }
}

/// The trusted key whose signature on `bytes` covers `package`, or why there is none: what a
/// component from a registry must have before anything compiles it.
pub fn verdict_in(
    c: &Connection,
    bytes: &[u8],
    package: &str,
) -> Result<Result<TrustedKey, Unverified>, StoreError> {
    if !crate::signing::is_signed(bytes) {
        return Ok(Err(Unverified::Unsigned));
    }
    if crate::signing::single_part(bytes).is_err() {
        return Ok(Err(Unverified::MultiPart));
    }
    let mut outside = None;
    for t in list_in(c)? {
        if crate::signing::verify(bytes, &t.key()?).is_ok() {
            if t.covers(package) {
                return Ok(Ok(t));
            }
            outside.get_or_insert(Unverified::OutOfScope { key: t.name, packages: t.packages });
        }
    }
    Ok(Err(outside.unwrap_or(Unverified::Untrusted)))
}

/// A skill bundle's detached signature, as it is kept beside the bundle.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SkillSignature {
    /// The digest of the bundle's manifest it signs.
    pub manifest: String,
    /// The signer's public key (`ed25519:…`), a hint: verification tries the trusted keys.
    pub public_key: String,
    /// The ed25519 signature, hex.
    pub signature: String,
}

impl SkillSignature {
    /// Signs the bundle `manifest_digest` with `secret`.
    pub fn make(manifest_digest: &str, secret: &str) -> Result<Self, crate::signing::SigningError> {
        let (signature, public) = crate::signing::sign_skill(manifest_digest, secret)?;
        Ok(Self {
            manifest: manifest_digest.to_string(),
            public_key: public.to_string(),
            signature,
        })
    }
}

/// The trusted key whose signature `document` (as the registry kept it; `None`: there is
/// none) covers the skill bundle `manifest_digest` of `package`, or why there is none.
pub fn skill_verdict_in(
    c: &Connection,
    document: Option<&[u8]>,
    manifest_digest: &str,
    package: &str,
) -> Result<Result<TrustedKey, Unverified>, StoreError> {
    let Some(doc) = document else { return Ok(Err(Unverified::Unsigned)) };
    let Ok(sig) = serde_json::from_slice::<SkillSignature>(doc) else {
        return Ok(Err(Unverified::Untrusted));
    };
    if sig.manifest != manifest_digest {
        return Ok(Err(Unverified::Untrusted));
    }
    let mut outside = None;
    for t in list_in(c)? {
        if crate::signing::verify_skill(manifest_digest, &sig.signature, &t.key()?).is_ok() {
            if t.covers(package) {
                return Ok(Ok(t));
            }
            outside.get_or_insert(Unverified::OutOfScope { key: t.name, packages: t.packages });
        }
    }
    Ok(Err(outside.unwrap_or(Unverified::Untrusted)))
}

#[cfg(test)]
mod tests {
    use super::glob_matches;

    #[test]
    fn a_glob_matches_runs_of_characters_at_its_stars_only() {
        for (p, n) in [
            ("*", "x"),
            ("acme-*", "acme-csv"),
            ("ghcr.io/acme/*", "ghcr.io/acme/a/b"),
            ("a*c*e", "abcde"),
            ("csv", "csv"),
            ("*", "ghcr.io/acme/x"),
            ("acme/*", "acme/x"),
            ("127.0.0.1:5000/acme/*", "127.0.0.1:5000/acme/skills/audit"),
            ("ghcr.io/*/csv", "ghcr.io/acme/csv"),
            ("ghcr.io/acme*", "ghcr.io/acme-evil"),
        ] {
            assert!(glob_matches(p, n), "{p} ~ {n}");
        }
        for (p, n) in [
            ("acme-*", "other"),
            ("csv", "csv2"),
            ("a*c", "ab"),
            ("*x", "y"),
            ("ab*ba", "aba"),
            ("acme/*", "acme-evil/x"),
            ("acme/*", "acme"),
            ("ghcr.io/acme*", "ghcr.io/acme/x"),
            ("*/acme/*", "evil.io/x/acme/y"),
            ("ghcr.io/*/csv", "ghcr.io/a/b/csv"),
        ] {
            assert!(!glob_matches(p, n), "{p} !~ {n}");
        }
    }
}
