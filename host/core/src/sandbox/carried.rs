//! What a component says of itself: its name and version, read from its custom sections
//! before anything else is done with it.
//!
//! - The version: a custom section `version` holding the version as UTF-8 text, the section
//!   the wasm metadata tools write (`wasm-tools metadata add --version`), at the component's
//!   top level or in one of its core modules (where keel-sdk's `export_tools!` puts the
//!   crate's version).
//! - The name: a custom section `keel:component` holding it (keel-sdk writes the crate's
//!   name; the Python and JavaScript scaffolds' builds write the project's), else the
//!   component's own name in its `component-name` section.
//!
//! A value that is not short, printable UTF-8 is ignored, as is a name that is not a valid
//! component name once lowercased with `_` as `-`.

use crate::names::valid_component_name;

/// The custom section a version is read from.
pub const VERSION_SECTION: &str = "version";
/// The custom section a component's name is read from.
pub const NAME_SECTION: &str = "keel:component";
/// Longest version or name read.
const MAX_CARRIED: usize = 64;

/// A component's name and version, as it carries them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Carried {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl Carried {
    /// The version as a semantic version (`v1.2.0` and `1.2.0` alike), when it is one.
    pub fn semver(&self) -> Option<semver::Version> {
        self.version.as_deref().and_then(parse_version)
    }
}

/// A version (`1.2.0`, `v1.2.0`) as a semantic version, when it is one.
pub fn parse_version(v: &str) -> Option<semver::Version> {
    semver::Version::parse(v.strip_prefix('v').unwrap_or(v)).ok()
}

/// What `bytes` say of themselves (nothing, for bytes that are not a component).
pub fn carried(bytes: &[u8]) -> Carried {
    let mut depth = 0usize;
    // (top level, nested) for each of: keel's name section, the version section.
    let (mut name, mut nested_name, mut version, mut nested_version) = (None, None, None, None);
    let mut component_name = None;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        let Ok(payload) = payload else { break };
        match payload {
            wasmparser::Payload::ModuleSection { .. }
            | wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
            wasmparser::Payload::CustomSection(c) => {
                let top = depth == 0;
                match c.name() {
                    NAME_SECTION => {
                        let slot = if top { &mut name } else { &mut nested_name };
                        if slot.is_none() {
                            *slot = text(c.data()).and_then(component_name_of);
                        }
                    }
                    VERSION_SECTION => {
                        let slot = if top { &mut version } else { &mut nested_version };
                        if slot.is_none() {
                            *slot = text(c.data());
                        }
                    }
                    "component-name" if top && component_name.is_none() => {
                        if let wasmparser::KnownCustom::ComponentName(r) = c.as_known() {
                            component_name = r.into_iter().flatten().find_map(|n| match n {
                                wasmparser::ComponentName::Component { name, .. } => {
                                    component_name_of(name.to_string())
                                }
                                _ => None,
                            });
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    Carried {
        name: name.or(nested_name).or(component_name),
        version: version.or(nested_version),
    }
}

/// Short, printable UTF-8 text, trimmed.
fn text(data: &[u8]) -> Option<String> {
    let t = std::str::from_utf8(data).ok()?.trim();
    let ok = !t.is_empty() && t.len() <= MAX_CARRIED && t.chars().all(|c| c.is_ascii_graphic());
    ok.then(|| t.to_string())
}

fn component_name_of(name: String) -> Option<String> {
    let name = name.to_ascii_lowercase().replace('_', "-");
    valid_component_name(&name).then_some(name)
}

/// A custom section `name` holding `data`, as bytes to append to a component or module.
pub fn custom_section(name: &str, data: &[u8]) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut body = Vec::new();
    leb(name.len(), &mut body);
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(data);
    let mut out = vec![0u8];
    leb(body.len(), &mut out);
    out.extend(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty component (`\0asm`, the component layer's version) with `sections` appended.
    fn component(sections: &[(&str, &[u8])]) -> Vec<u8> {
        let mut bytes = b"\0asm\x0d\0\x01\0".to_vec();
        for (name, data) in sections {
            bytes.extend(custom_section(name, data));
        }
        bytes
    }

    #[test]
    fn the_name_and_version_come_from_the_components_sections() {
        let c = carried(&component(&[("version", b"1.1.0"), ("keel:component", b"Log_Q")]));
        assert_eq!(c, Carried { name: Some("log-q".into()), version: Some("1.1.0".into()) });
        assert_eq!(c.semver(), Some(semver::Version::new(1, 1, 0)));
        assert_eq!(parse_version("v2.0.0-rc.1").unwrap().to_string(), "2.0.0-rc.1");
    }

    #[test]
    fn what_is_not_a_short_printable_value_or_a_valid_name_is_ignored() {
        let long = "1".repeat(65);
        for (section, data) in [
            ("version", &b"1.0 beta"[..]),
            ("version", long.as_bytes()),
            ("version", b"\xff"),
            ("keel:component", b"9lives"),
            ("keel:component", b""),
        ] {
            assert_eq!(carried(&component(&[(section, data)])), Carried::default(), "{section}");
        }
        assert_eq!(carried(b"not wasm"), Carried::default());
        assert_eq!(carried(&component(&[])), Carried::default());
    }

    #[test]
    fn the_first_section_of_each_kind_counts() {
        let c = carried(&component(&[("version", b"1.0.0"), ("version", b"2.0.0")]));
        assert_eq!(c.version.as_deref(), Some("1.0.0"));
    }
}
