//! Signatures of components: ed25519, embedded in the component as wasmsign2 writes and reads
//! them (a `signature` custom section first in the file, over the hash of every other
//! section), so other tools verify what keel signs and keel verifies what they sign.
//!
//! A leaf: bytes and keys in, verdicts out. Where a signing key's secret is kept is the
//! secrets store's (`SecretStore::signing_keys`); which public keys are trusted, for which
//! packages, is the ToolService's.

use std::fmt;
use std::str::FromStr;

use zeroize::Zeroizing;

/// Why signing or verifying failed.
#[derive(Debug, thiserror::Error)]
pub enum SigningError {
    #[error("the component has no signature")]
    Unsigned,
    #[error(
        "the signature does not verify with key {key}: the component was changed after it was signed, or another key signed it"
    )]
    Mismatch { key: String },
    #[error("the file cannot be read as a WebAssembly module or component: {0}")]
    Parse(String),
    #[error(
        "`{text}` is not a public key: give `ed25519:` and 64 hex digits, as `keel key list` prints it"
    )]
    BadPublicKey { text: String },
    #[error("the stored signing key is unreadable: {0}")]
    BadSecretKey(String),
    #[error(
        "the signature is in several parts (it would also verify copies of the file cut short); keel accepts only a signature over the whole file, as `keel tool sign` writes one"
    )]
    MultiPart,
}

/// An ed25519 public key, shown as `ed25519:` and its 32 bytes in hex.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey(wasmsign2::PublicKey);

/// The prefix of a public key's text.
const PREFIX: &str = "ed25519:";

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // wasmsign2's bytes are an algorithm byte, then the key.
        let bytes = self.0.to_bytes();
        write!(f, "{PREFIX}{}", hex::encode(bytes.get(1..).unwrap_or_default()))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl FromStr for PublicKey {
    type Err = SigningError;
    fn from_str(text: &str) -> Result<Self, SigningError> {
        let bad = || SigningError::BadPublicKey { text: text.chars().take(80).collect() };
        let raw = text.trim().strip_prefix(PREFIX).ok_or_else(bad)?;
        let bytes = hex::decode(raw).map_err(|_| bad())?;
        if bytes.len() != 32 {
            return Err(bad());
        }
        let mut tagged = vec![ED25519_ALGORITHM];
        tagged.extend_from_slice(&bytes);
        wasmsign2::PublicKey::from_bytes(&tagged).map(Self).map_err(|_| bad())
    }
}

/// wasmsign2's algorithm byte for ed25519 keys.
const ED25519_ALGORITHM: u8 = 0x01;

/// A new key pair: the public key, and the secret key's text (hex; keep it like a secret).
pub fn generate() -> (PublicKey, Zeroizing<String>) {
    let pair = wasmsign2::KeyPair::generate();
    let secret = Zeroizing::new(hex::encode(pair.sk.to_bytes()));
    (PublicKey(pair.pk), secret)
}

fn secret_key(secret: &str) -> Result<wasmsign2::SecretKey, SigningError> {
    let bytes = Zeroizing::new(
        hex::decode(secret.trim()).map_err(|e| SigningError::BadSecretKey(e.to_string()))?,
    );
    wasmsign2::SecretKey::from_bytes(&bytes).map_err(|e| SigningError::BadSecretKey(e.to_string()))
}

/// The public key of the secret key `secret` (as [`generate`] gives it).
pub fn public_of(secret: &str) -> Result<PublicKey, SigningError> {
    let sk = secret_key(secret)?;
    Ok(PublicKey(wasmsign2::PublicKey { pk: sk.sk.public_key(), key_id: None }))
}

fn parse_error(e: wasmsign2::WSError) -> SigningError {
    SigningError::Parse(e.to_string())
}

/// `bytes` signed with `secret`: the signature embedded first in the file (an earlier
/// signature is replaced).
pub fn sign(bytes: &[u8], secret: &str) -> Result<Vec<u8>, SigningError> {
    let sk = secret_key(secret)?;
    let module =
        wasmsign2::Module::deserialize(&mut std::io::Cursor::new(bytes)).map_err(parse_error)?;
    let signed = sk.sign(module, None).map_err(parse_error)?;
    let mut out = Vec::with_capacity(bytes.len() + 256);
    signed.serialize(&mut out).map_err(parse_error)?;
    Ok(out)
}

/// Whether `bytes` carry an embedded signature (first in the file, as wasmsign2 writes it).
pub fn is_signed(bytes: &[u8]) -> bool {
    let mut reader = std::io::Cursor::new(bytes);
    let Ok(stream) = wasmsign2::Module::init_from_reader(&mut reader) else {
        return false;
    };
    let Ok(mut sections) = wasmsign2::Module::iterate(stream) else { return false };
    matches!(sections.next(), Some(Ok(wasmsign2::Section::Custom(c))) if c.is_signature_header())
}

/// Whether the embedded signature covers the whole file as one part: one set of signed
/// hashes holding one hash, and no part delimiter anywhere. A multi-part signature signs the
/// hash of each part's prefix too, so it also verifies copies of the file cut at a delimiter:
/// keel accepts none.
pub fn single_part(bytes: &[u8]) -> Result<(), SigningError> {
    let mut reader = std::io::Cursor::new(bytes);
    let stream = wasmsign2::Module::init_from_reader(&mut reader).map_err(parse_error)?;
    let mut header = None;
    for (i, section) in wasmsign2::Module::iterate(stream).map_err(parse_error)?.enumerate() {
        let section = section.map_err(parse_error)?;
        if section.is_signature_delimiter() || (i > 0 && section.is_signature_header()) {
            return Err(SigningError::MultiPart);
        }
        if let wasmsign2::Section::Custom(c) = section
            && i == 0
            && c.is_signature_header()
        {
            header = Some(c);
        }
    }
    let data = header.ok_or(SigningError::Unsigned)?.signature_data().map_err(parse_error)?;
    match data.signed_hashes_set.as_slice() {
        [one] if one.hashes.len() == 1 => Ok(()),
        _ => Err(SigningError::MultiPart),
    }
}

/// What a skill bundle's detached signature signs: a fixed context, then the digest of the
/// bundle's manifest (which names every file by its digest).
fn skill_message(manifest_digest: &str) -> Vec<u8> {
    format!("keel skill signature v1\n{manifest_digest}").into_bytes()
}

/// A detached signature (hex) by `secret` over the skill bundle whose manifest is
/// `manifest_digest`, and the signer's public key.
pub fn sign_skill(
    manifest_digest: &str,
    secret: &str,
) -> Result<(String, PublicKey), SigningError> {
    let sk = secret_key(secret)?;
    let signature = sk.sk.sign(skill_message(manifest_digest), None);
    Ok((hex::encode(signature.as_ref()), public_of(secret)?))
}

/// Checks that `key` made `signature` (hex) over the skill bundle whose manifest is
/// `manifest_digest`.
pub fn verify_skill(
    manifest_digest: &str,
    signature: &str,
    key: &PublicKey,
) -> Result<(), SigningError> {
    let mismatch = || SigningError::Mismatch { key: key.to_string() };
    let bytes = hex::decode(signature.trim()).map_err(|_| mismatch())?;
    let sig = ed25519_compact::Signature::from_slice(&bytes).map_err(|_| mismatch())?;
    key.0.pk.verify(skill_message(manifest_digest), &sig).map_err(|_| mismatch())
}

/// Checks that `key` signed `bytes` as they are, whole, in one part.
pub fn verify(bytes: &[u8], key: &PublicKey) -> Result<(), SigningError> {
    if !is_signed(bytes) {
        return Err(SigningError::Unsigned);
    }
    single_part(bytes)?;
    key.0.verify(&mut std::io::Cursor::new(bytes), None).map_err(|e| match e {
        wasmsign2::WSError::VerificationFailed | wasmsign2::WSError::NoSignatures => {
            SigningError::Mismatch { key: key.to_string() }
        }
        other => parse_error(other),
    })
}

/// The keys among `keys` that signed `bytes` as they are (none for an unsigned file).
#[cfg(any(test, feature = "internals"))]
pub fn signers<'a, T>(bytes: &[u8], keys: &'a [(T, PublicKey)]) -> Vec<&'a T> {
    if !is_signed(bytes) {
        return Vec::new();
    }
    keys.iter().filter(|(_, k)| verify(bytes, k).is_ok()).map(|(t, _)| t).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest component: its header alone.
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\0\x01\0";

    #[test]
    fn a_signature_verifies_with_its_key_only_and_breaks_when_a_byte_changes() {
        let (public, secret) = generate();
        assert_eq!(public_of(&secret).unwrap(), public);
        let text = public.to_string();
        assert!(text.starts_with("ed25519:") && text.len() == 8 + 64, "{text}");
        assert_eq!(text.parse::<PublicKey>().unwrap(), public);
        let mut component = EMPTY_COMPONENT.to_vec();
        // A custom section (id 0) named "x" holding "data", after the header.
        component.extend_from_slice(&[0, 6, 1, b'x', b'd', b'a', b't', b'a']);
        assert!(!is_signed(&component));
        assert!(matches!(verify(&component, &public), Err(SigningError::Unsigned)));

        let signed = sign(&component, &secret).unwrap();
        assert!(is_signed(&signed) && signed.ends_with(&component[8..]));
        verify(&signed, &public).unwrap();
        let (other, _) = generate();
        assert!(matches!(verify(&signed, &other), Err(SigningError::Mismatch { .. })));
        let keys = [("mine", public.clone()), ("theirs", other)];
        assert_eq!(signers(&signed, &keys), vec![&"mine"]);
        assert!(signers(&component, &keys).is_empty());

        let mut tampered = signed.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert!(matches!(verify(&tampered, &public), Err(SigningError::Mismatch { .. })));
        // Signing again replaces the signature.
        let again = sign(&signed, &secret).unwrap();
        assert_eq!(again.len(), signed.len());
        verify(&again, &public).unwrap();
    }

    #[test]
    fn a_multi_part_signature_is_refused_though_its_key_made_it() {
        let (public, secret) = generate();
        let mut component = EMPTY_COMPONENT.to_vec();
        component.extend_from_slice(&[0, 6, 1, b'x', b'd', b'a', b't', b'a']);
        component.extend_from_slice(&[0, 6, 1, b'y', b'm', b'o', b'r', b'e']);
        let module = wasmsign2::Module::deserialize(&mut std::io::Cursor::new(&component)).unwrap();
        let sk = secret_key(&secret).unwrap();
        let (signed, _) = sk.sign_multi(module, None, false, true).unwrap();
        let mut bytes = Vec::new();
        signed.serialize(&mut bytes).unwrap();
        assert!(is_signed(&bytes));
        // wasmsign2's own check takes it (and copies of it cut at a delimiter); keel does not.
        assert!(public.0.verify(&mut std::io::Cursor::new(&bytes), None).is_ok());
        assert!(matches!(verify(&bytes, &public), Err(SigningError::MultiPart)), "multi-part");
        // A signature with two hashes in its one set is refused the same way.
        let single = sign(&component, &secret).unwrap();
        verify(&single, &public).unwrap();
    }

    #[test]
    fn a_skill_signature_covers_its_manifest_digest_only() {
        let (public, secret) = generate();
        let digest = format!("sha256:{}", "a".repeat(64));
        let (sig, signer) = sign_skill(&digest, &secret).unwrap();
        assert_eq!(signer, public);
        verify_skill(&digest, &sig, &public).unwrap();
        let other = format!("sha256:{}", "b".repeat(64));
        assert!(matches!(verify_skill(&other, &sig, &public), Err(SigningError::Mismatch { .. })));
        let (someone, _) = generate();
        assert!(verify_skill(&digest, &sig, &someone).is_err());
        assert!(verify_skill(&digest, "zz", &public).is_err());
    }

    #[test]
    fn malformed_keys_and_files_are_refused_with_what_to_give() {
        for bad in [
            "",
            "ed25519:",
            "ed25519:zz",
            "ssh-ed25519 AAAA",
            &format!("ed25519:{}", "0".repeat(62)),
        ] {
            let e = bad.parse::<PublicKey>().unwrap_err();
            assert!(e.to_string().contains("64 hex digits"), "{e}");
        }
        let (_, secret) = generate();
        assert!(matches!(sign(b"not wasm", &secret), Err(SigningError::Parse(_))));
        assert!(matches!(sign(EMPTY_COMPONENT, "00"), Err(SigningError::BadSecretKey(_))));
    }
}
