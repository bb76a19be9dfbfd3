//! What a component imports, read before it is compiled, and what the linker cannot satisfy.

use wasmtime::component::{Component, Linker};

use super::wasi::CallState;

/// Imports listed in a link refusal at most.
const MAX_UNLINKED_LISTED: usize = 64;

/// The names of the top-level imports of the component in `bytes` (nested modules' and
/// components' own imports are theirs, satisfied inside the component).
pub fn top_level_imports(bytes: &[u8]) -> Result<Vec<String>, wasmparser::BinaryReaderError> {
    Ok(top_level(bytes)?.0)
}

/// The names a component imports and exports at its top level, in its order.
pub fn top_level(
    bytes: &[u8],
) -> Result<(Vec<String>, Vec<String>), wasmparser::BinaryReaderError> {
    let (mut names, mut exports) = (Vec::new(), Vec::new());
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload? {
            wasmparser::Payload::ModuleSection { .. }
            | wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
            wasmparser::Payload::ComponentImportSection(reader) if depth == 0 => {
                for import in reader {
                    names.push(import?.name.name.to_string());
                }
            }
            wasmparser::Payload::ComponentExportSection(reader) if depth == 0 => {
                for export in reader {
                    exports.push(export?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok((names, exports))
}

/// Every import of `component` that `linker` cannot satisfy, found by linking a copy of the
/// linker again and again, standing in a trap for each missing function it reports.
pub fn unlinked(linker: &Linker<CallState>, component: &Component) -> Vec<String> {
    let mut probe = linker.clone();
    probe.allow_shadowing(true);
    let mut missing: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    while missing.len() < MAX_UNLINKED_LISTED {
        let Err(e) = probe.instantiate_pre(component) else { break };
        let text = format!("{e:#}");
        let instance = between(&text, "component imports instance `", "`");
        let function = between(&text, "component imports function `", "`");
        let export = between(&text, "instance export `", "`");
        let why = text.rsplit(": ").next().unwrap_or("").to_string();
        let stub = |_: wasmtime::StoreContextMut<'_, CallState>,
                    _: wasmtime::component::types::ComponentFunc,
                    _: &[wasmtime::component::Val],
                    _: &mut [wasmtime::component::Val]| {
            Err(wasmtime::format_err!("this import is not linked"))
        };
        let (label, stubbed) = match (instance, export, function) {
            (Some(i), Some(x), _) => (
                format!("`{i}`: `{x}` ({why})"),
                probe.instance(&i).and_then(|mut l| l.func_new(&x, stub)),
            ),
            (_, _, Some(f)) => (format!("`{f}` ({why})"), probe.root().func_new(&f, stub)),
            _ => break,
        };
        if !seen.insert(label.clone()) {
            break;
        }
        missing.push(label);
        if stubbed.is_err() {
            break;
        }
    }
    missing
}

fn between(text: &str, start: &str, end: &str) -> Option<String> {
    let from = text.find(start)? + start.len();
    let len = text[from..].find(end)?;
    Some(text[from..from + len].to_string())
}
