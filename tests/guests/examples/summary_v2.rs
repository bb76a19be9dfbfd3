//! Version 2 of the `summary` component, for replay's regression check (see `summary.rs`).

#[path = "../summary.rs"]
mod summary;

fn tools() -> Vec<keel_sdk::Tool> {
    summary::tools(2)
}

keel_sdk::export_tools!(tools);
