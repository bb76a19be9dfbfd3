//! A tool whose allocator wipes freed memory with `#`, as some language runtimes' allocators
//! do: the host must copy the returned string before the guest's post-return frees it.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};

use keel_sdk::{Effect, JsonSchema, Tool, ToolError};
use serde::Deserialize;
use serde_json::{Value, json};

struct Wiping;

// SAFETY: every call is forwarded to the system allocator; `dealloc` first overwrites the
// block it is given, which the caller owns until the call returns.
unsafe impl GlobalAlloc for Wiping {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe {
            std::ptr::write_bytes(ptr, b'#', layout.size());
            System.dealloc(ptr, layout)
        }
    }
}

#[global_allocator]
static ALLOC: Wiping = Wiping;

#[derive(Deserialize, JsonSchema)]
struct Text {
    text: String,
}

fn answer(i: Text) -> Result<Value, ToolError> {
    Ok(json!({"text": i.text, "words": i.text.split_whitespace().count()}))
}

fn refuse(i: Text) -> Result<Value, ToolError> {
    Err(ToolError::InvalidInput(format!("refused: {}", i.text)))
}

fn tools() -> Vec<Tool> {
    vec![
        Tool::new("wiped_answer", "Answers with JSON.", Effect::ReadOnly, answer),
        Tool::new("wiped_refusal", "Answers with a typed error.", Effect::ReadOnly, refuse),
    ]
}

keel_sdk::export_tools!(tools);
