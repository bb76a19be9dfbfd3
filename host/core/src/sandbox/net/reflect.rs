//! Secret values in what a guest sends: a tool that read a secret (a server echoed it back, an
//! earlier call left it in a file) must not send it on to a destination the secret is not
//! bound to. The egress hook looks for the value of **every** secret of the home — bound to
//! the call or not — in each request's URL, headers and body, as it is and in its
//! URL-encoded, hex and base64 forms, and refuses the request when one is found on its way to
//! a destination the call does not bind it to.
//!
//! What is looked in is first put in the form the receiving server's own parser will read:
//! percent-escapes decoded (a URL, a header, a form body: a value written with every byte
//! escaped), and a JSON body's strings unescaped (`\uXXXX`). A tool that encodes a value in a
//! way no parser undoes (encryption, a few characters per request) is not caught: see the
//! security model.

use base64::Engine as _;

use super::grant::{Scheme, SecretBinding};
use crate::secrets::Secret;

/// Shortest encoded form looked for (a shorter one would be found in ordinary text).
const MIN_FORM: usize = 8;

/// A matcher of every form of every secret's value.
pub struct Reflections {
    matcher: Option<aho_corasick::AhoCorasick>,
    /// Per pattern: the secret's name and the form's name.
    patterns: Vec<(String, &'static str)>,
}

/// A secret value found in a request.
pub struct Found<'a> {
    pub name: String,
    /// Where the secret is bound in this call (`None`: nowhere).
    pub binding: Option<&'a SecretBinding>,
    pub form: &'static str,
}

impl Reflections {
    /// The forms of `secrets`: every secret of the home, by name.
    pub fn new(secrets: &[(String, Secret)]) -> Self {
        let mut texts: Vec<Vec<u8>> = Vec::new();
        let mut patterns = Vec::new();
        for (name, value) in secrets {
            for (form, text) in forms(value.expose().as_bytes()) {
                if text.len() >= MIN_FORM && !texts.contains(&text) {
                    texts.push(text);
                    patterns.push((name.clone(), form));
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

    /// The first value in `haystack` — or in what the server will read of it ([`readings`]) —
    /// of a secret that `bindings` (the call's) do not bind to (scheme, host, port).
    pub fn elsewhere<'a>(
        &self,
        bindings: &'a [(SecretBinding, Secret)],
        haystack: &[u8],
        scheme: Scheme,
        host: &str,
        port: u16,
    ) -> Option<Found<'a>> {
        let m = self.matcher.as_ref()?;
        for text in readings(haystack) {
            for hit in m.find_iter(&*text) {
                let (name, form) = &self.patterns[hit.pattern().as_usize()];
                let bound_here =
                    bindings.iter().any(|(b, _)| &b.name == name && b.binds(scheme, host, port));
                if !bound_here {
                    let binding = bindings.iter().map(|(b, _)| b).find(|b| &b.name == name);
                    return Some(Found { name: name.clone(), binding, form });
                }
            }
        }
        None
    }
}

/// `bytes` as they are, then as the receiving server's parser reads them: percent-escapes
/// decoded (when there are any), and, for a JSON text, its strings and keys unescaped.
fn readings(bytes: &[u8]) -> Vec<std::borrow::Cow<'_, [u8]>> {
    let mut out: Vec<std::borrow::Cow<'_, [u8]>> = vec![bytes.into()];
    if bytes.contains(&b'%') {
        out.push(percent_decoded(bytes).into());
    }
    if bytes.contains(&b'\\')
        && let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes)
    {
        let mut strings = Vec::new();
        json_strings(&v, &mut strings);
        out.push(strings.into());
    }
    out
}

/// `bytes` with every `%XX` decoded (other bytes, and a `%` not followed by two hex digits,
/// as they are).
fn percent_decoded(bytes: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) =
                (bytes.get(i + 1).and_then(|b| hex(*b)), bytes.get(i + 2).and_then(|b| hex(*b)))
        {
            out.push(h << 4 | l);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// Every string and key of `v`, unescaped, each followed by a NUL.
fn json_strings(v: &serde_json::Value, out: &mut Vec<u8>) {
    match v {
        serde_json::Value::String(s) => {
            out.extend_from_slice(s.as_bytes());
            out.push(0);
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| json_strings(x, out)),
        serde_json::Value::Object(o) => {
            for (k, x) in o {
                out.extend_from_slice(k.as_bytes());
                out.push(0);
                json_strings(x, out);
            }
        }
        _ => {}
    }
}

/// The forms a value travels in: as it is, URL-encoded, hex (both cases), and base64 (standard
/// and URL-safe) at each of the three alignments it can take inside a longer encoded text.
fn forms(value: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let mut out = vec![("as is", value.to_vec())];
    let encoded = crate::secrets::url_encoded(&String::from_utf8_lossy(value));
    out.push(("URL-encoded", encoded.into_bytes()));
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
        let r = Reflections::new(&[("T".into(), Secret::new(value.into()))]);
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
            assert_eq!((found.name.as_str(), found.form), ("T", *form));
            assert!(r.elsewhere(&secrets, text, Scheme::Https, "api.example.com", 443).is_none());
        }
        assert!(r.elsewhere(&secrets, b"nothing here", Scheme::Https, "o.example", 443).is_none());
    }

    #[test]
    fn what_the_server_decodes_is_looked_in_and_unbound_secrets_are_found_anywhere() {
        let value = "tok-3f9c0a1b2c4d5e6f/+=";
        let secrets = vec![(binding("T", "api.example.com"), Secret::new(value.into()))];
        let r = Reflections::new(&[
            ("T".into(), Secret::new(value.into())),
            ("U".into(), Secret::new("unbound-secret-9d8c7b".into())),
        ]);
        let every_byte: String = value.bytes().map(|b| format!("%{b:02x}")).collect();
        let json_escaped: String = value.chars().map(|c| format!("\\u{:04x}", c as u32)).collect();
        for text in [
            format!("/search?q={every_byte}"),
            format!("a=1&b={every_byte}"),
            format!("{{\"k\": \"{json_escaped}\"}}"),
        ] {
            let found = r
                .elsewhere(&secrets, text.as_bytes(), Scheme::Https, "evil.example", 443)
                .unwrap_or_else(|| panic!("not found in {text}"));
            assert_eq!(found.name, "T");
            assert!(
                r.elsewhere(&secrets, text.as_bytes(), Scheme::Https, "api.example.com", 443)
                    .is_none()
            );
        }
        // A secret the call binds nowhere is refused on its way to any destination.
        let found = r
            .elsewhere(&secrets, b"x=unbound-secret-9d8c7b", Scheme::Https, "api.example.com", 443)
            .unwrap();
        assert_eq!((found.name.as_str(), found.binding.is_none()), ("U", true));
    }
}
