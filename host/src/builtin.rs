//! The first-party tool components (`plugins/`), built for `wasm32-wasip2` by the build script
//! and embedded in the binary, so a fresh keel home has them without an install step.

include!(concat!(env!("OUT_DIR"), "/builtin.rs"));
