//! The first-party tool components (`plugins/`), built for `wasm32-wasip2` by the build script
//! and embedded in the binary, so a fresh keel home has them without an install step.

include!(concat!(env!("OUT_DIR"), "/builtin.rs"));

/// The tools every session keeps, whatever it was created with: the control tools (the plan
/// of the phase) and the discovery tools (skills, tools, memory).
pub const ALWAYS_LOADED: &[&str] = &[
    "plan_create",
    "plan_update",
    "task_complete",
    "skills_find",
    "skills_load",
    "tools_find",
    "tools_select",
    "memory_write",
    "memory_find",
];

#[cfg(test)]
mod tests {
    /// The digests the build script wrote are those of the bytes embedded.
    #[test]
    fn each_digest_is_that_of_its_bytes() {
        for (name, bytes, digest) in super::BUILTIN_COMPONENTS {
            assert_eq!(crate::sandbox::sha256_hex(bytes), *digest, "{name}");
        }
    }
}
