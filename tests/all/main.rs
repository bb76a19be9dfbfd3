//! keel's integration tests: one binary, one module per area. Each hostile case asserts its
//! typed error **and** that the host serves the next call normally.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent;
mod api;
mod approvals;
mod boundaries;
mod capabilities;
mod compaction;
mod direct;
mod effects;
mod events;
mod examples;
mod grants;
mod install;
mod layers;
mod model;
mod net;
mod peers;
mod plans;
mod plugins;
mod postgres;
mod reach;
mod registry;
mod sandbox;
mod sources;
mod spans;
mod store;
mod understand;
mod windows;
mod workgroup;
