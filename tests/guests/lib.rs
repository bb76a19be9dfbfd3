//! Test guests: each example is one component, built for `wasm32-wasip2` by the test crate's
//! build script. This library is empty.
