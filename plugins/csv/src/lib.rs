//! `csv`: keel's first-party CSV acceptance check.
//!
//! `csv_inspect` parses a CSV file with a real parser (quoted fields, embedded delimiters and
//! newlines) and reports its shape: header, row count, how many columns each row has, rows
//! whose column count differs from the header (with line numbers), and empty required fields.
//! It is the independent check the agent uses before calling a CSV "done".

use std::collections::BTreeMap;

use keel_sdk::{Effect, JsonSchema, Tool, ToolError};
use serde::{Deserialize, Serialize};

/// Problems of each kind listed at most (counts are always complete).
const MAX_LISTED: usize = 100;

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct InspectInput {
    /// Path of the CSV file.
    path: String,
    /// Field delimiter, one ASCII character. Default `,`.
    #[serde(default)]
    delimiter: Option<String>,
    /// Number of columns every row must have. Default: the header's column count.
    #[serde(default)]
    expected_columns: Option<usize>,
    /// Header names of the columns that must not be empty. Default: every column.
    #[serde(default)]
    required: Option<Vec<String>>,
}

#[derive(Serialize, JsonSchema)]
struct RaggedRow {
    /// Line of the file where the row starts (1-based).
    line: u64,
    columns: usize,
}

#[derive(Serialize, JsonSchema)]
struct EmptyField {
    /// Line of the file where the row starts (1-based).
    line: u64,
    column: String,
}

#[derive(Serialize, JsonSchema)]
struct InspectOutput {
    path: String,
    header: Vec<String>,
    /// Data rows (the header is not counted).
    rows: u64,
    /// Columns the rows were checked against.
    expected_columns: usize,
    /// How many rows have each column count, e.g. {"7": 120, "8": 3}.
    column_counts: BTreeMap<usize, u64>,
    /// Rows (and the header, at line 1) whose column count differs from `expected_columns`.
    ragged_rows: Vec<RaggedRow>,
    ragged_count: u64,
    empty_required: Vec<EmptyField>,
    empty_required_count: u64,
    /// True when the header and every row have `expected_columns` columns and no required
    /// field is empty.
    ok: bool,
}

fn inspect(input: InspectInput) -> Result<InspectOutput, ToolError> {
    let delimiter = match input.delimiter.as_deref() {
        None => b',',
        Some(d) if d.len() == 1 && d.is_ascii() => d.as_bytes()[0],
        Some("\\t") => b'\t',
        Some(d) => {
            return Err(ToolError::InvalidInput(format!(
                "`delimiter` must be one ASCII character, got {d:?}"
            )));
        }
    };
    let file = std::fs::File::open(&input.path).map_err(|e| ToolError::io(&input.path, &e))?;
    let mut reader = csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .flexible(true)
        .has_headers(false)
        .from_reader(file);
    let mut records = reader.records();
    let header: Vec<String> = match records.next() {
        None => return Err(ToolError::Failed(format!("{}: the file is empty", input.path))),
        Some(r) => r
            .map_err(|e| ToolError::Failed(format!("{}: {e}", input.path)))?
            .iter()
            .map(str::to_string)
            .collect(),
    };
    let expected = input.expected_columns.unwrap_or(header.len());
    let required: Vec<usize> = match &input.required {
        None => (0..header.len()).collect(),
        Some(names) => {
            let mut idx = Vec::new();
            for name in names {
                match header.iter().position(|h| h == name) {
                    Some(i) => idx.push(i),
                    None => {
                        return Err(ToolError::InvalidInput(format!(
                            "required column {name:?} is not in the header {header:?}"
                        )));
                    }
                }
            }
            idx
        }
    };
    let mut out = InspectOutput {
        path: input.path.clone(),
        expected_columns: expected,
        header,
        rows: 0,
        column_counts: BTreeMap::new(),
        ragged_rows: Vec::new(),
        ragged_count: 0,
        empty_required: Vec::new(),
        empty_required_count: 0,
        ok: true,
    };
    if out.header.len() != expected {
        out.ragged_count += 1;
        out.ragged_rows.push(RaggedRow { line: 1, columns: out.header.len() });
    }
    for record in records {
        let record = record.map_err(|e| ToolError::Failed(format!("{}: {e}", input.path)))?;
        let line = record.position().map(|p| p.line()).unwrap_or(0);
        out.rows += 1;
        *out.column_counts.entry(record.len()).or_insert(0) += 1;
        if record.len() != expected {
            out.ragged_count += 1;
            if out.ragged_rows.len() < MAX_LISTED {
                out.ragged_rows.push(RaggedRow { line, columns: record.len() });
            }
        }
        for &i in &required {
            if record.get(i).is_none_or(|v| v.trim().is_empty()) {
                out.empty_required_count += 1;
                if out.empty_required.len() < MAX_LISTED {
                    out.empty_required.push(EmptyField { line, column: out.header[i].clone() });
                }
            }
        }
    }
    out.ok = out.ragged_count == 0 && out.empty_required_count == 0;
    Ok(out)
}

fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            "csv_inspect",
            "Parses a CSV file and reports header, row count, column count per row, ragged rows with line numbers and empty required fields.",
            Effect::ReadOnly,
            inspect,
        )
        .idempotent(),
    ]
}

keel_sdk::export_tools!(tools);
