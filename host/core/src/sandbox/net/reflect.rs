//! Secret values in what a guest sends: a tool that read a secret (a server echoed it back)
//! must not send it on to a destination the secret is not bound to. The egress hook looks for
//! every granted secret's value in each request's URL, headers and body — as it is, and in its
//! URL-encoded, hex and base64 forms — and refuses the request when one is found on its way
//! elsewhere.

use base64::Engine as _;

use super::grant::{Scheme, SecretBinding};
use crate::secrets::Secret;

/// Shortest encoded form looked for (a shorter one would be found in ordinary text).
const MIN_FORM: usize = 8;

/// A matcher of every form of every granted secret's value.
pub struct Reflections {
    matcher: Option<aho_corasick::AhoCorasick>,
    /// Per pattern: the binding's index and the form's name.
    patterns: Vec<(usize, &'static str)>,
}

/// A secret value found in a request.
pub struct Found<'a> {
    pub binding: &'a SecretBinding,
    pub form: &'static str,
}

impl Reflections {
    pub fn new(secrets: &[(SecretBinding, Secret)]) -> Self {
        let mut texts: Vec<Vec<u8>> = Vec::new();
        let mut patterns = Vec::new();
        for (i, (_, value)) in secrets.iter().enumerate() {
            for (form, text) in forms(value.expose().as_bytes()) {
                if text.len() >= MIN_FORM && !texts.contains(&text) {
                    texts.push(text);
                    patterns.push((i, form));
                }
            }
        }
        let matcher = (!texts.is_empty())
            .then(|| {
                aho_corasick::AhoCorasick::builder()
                    .match_kind(aho_corasick::MatchKind::LeftmostLongest)
                    .build(&texts)
                    .ok()
            })
            .flatten();
        Self { matcher, patterns }
    }

    /// The first value in `haystack` of a secret that is not bound to (scheme, host, port).
    pub fn elsewhere<'a>(
        &self,
        secrets: &'a [(SecretBinding, Secret)],
        haystack: &[u8],
        scheme: Scheme,
        host: &str,
        port: u16,
    ) -> Option<Found<'a>> {
        let m = self.matcher.as_ref()?;
        for hit in m.find_iter(haystack) {
            let (i, form) = self.patterns[hit.pattern().as_usize()];
            let binding = &secrets[i].0;
            let bound_here =
                secrets.iter().any(|(b, _)| b.name == binding.name && b.binds(scheme, host, port));
            if !bound_here {
                return Some(Found { binding, form });
            }
        }
        None
    }
}

/// The forms a value travels in: as it is, URL-encoded, hex (both cases), and base64 (standard
/// and URL-safe) at each of the three alignments it can take inside a longer encoded text.
fn forms(value: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let mut out = vec![("as is", value.to_vec())];
    let mut encoded = String::new();
    for &b in value {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    out.push(("URL-encoded", encoded.clone().into_bytes()));
    out.push(("URL-encoded", encoded.to_ascii_lowercase().into_bytes()));
    out.push(("hex", hex::encode(value).into_bytes()));
    out.push(("hex", hex::encode_upper(value).into_bytes()));
    let engines: [(&'static str, &base64::engine::GeneralPurpose); 2] = [
        ("base64", &base64::engine::general_purpose::STANDARD_NO_PAD),
        ("base64", &base64::engine::general_purpose::URL_SAFE_NO_PAD),
    ];
    for (name, engine) in engines {
        for offset in 0..3usize {
            let mut bytes = vec![0u8; offset];
            bytes.extend_from_slice(value);
            let text = engine.encode(&bytes);
            // Characters that mix in the padding bytes before the value, or the missing bytes
            // after it, depend on what surrounds the value: drop them.
            let skip = [0, 2, 3][offset];
            let drop_end = usize::from(bytes.len() % 3 != 0);
            if text.len() > skip + drop_end {
                out.push((name, text.as_bytes()[skip..text.len() - drop_end].to_vec()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(name: &str, host: &str) -> SecretBinding {
        format!("{name}@{host}").parse().unwrap()
    }

    #[test]
    fn every_form_of_a_value_is_found_on_its_way_elsewhere_and_not_where_it_is_bound() {
        let value = "tok-3f9c0a1b2c4d5e6f/+=";
        let secrets = vec![(binding("T", "api.example.com"), Secret::new(value.into()))];
        let r = Reflections::new(&secrets);
        let b64 = base64::engine::general_purpose::STANDARD;
        let samples: Vec<(&str, Vec<u8>)> = vec![
            ("as is", format!("x={value}").into_bytes()),
            ("URL-encoded", b"q=tok-3f9c0a1b2c4d5e6f%2F%2B%3D".to_vec()),
            ("hex", format!("h={}", hex::encode(value)).into_bytes()),
            ("base64", b64.encode(format!("user:{value}")).into_bytes()),
            ("base64", b64.encode(format!("ab{value}xyz")).into_bytes()),
            ("base64", b64.encode(format!("a{value}")).into_bytes()),
        ];
        for (form, text) in &samples {
            let found = r
                .elsewhere(&secrets, text, Scheme::Https, "other.example.com", 443)
                .unwrap_or_else(|| panic!("{form} not found in {}", String::from_utf8_lossy(text)));
            assert_eq!((found.binding.name.as_str(), found.form), ("T", *form));
            assert!(r.elsewhere(&secrets, text, Scheme::Https, "api.example.com", 443).is_none());
        }
        assert!(r.elsewhere(&secrets, b"nothing here", Scheme::Https, "o.example", 443).is_none());
    }
}
