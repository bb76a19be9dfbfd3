#!/usr/bin/env bash
# Builds the example tool components into OUT_DIR (default target/examples):
#   python_tool.wasm  from examples/python-tool (componentize-py, pinned in requirements.txt)
#   js_tool.wasm      from examples/js-tool     (componentize-js, pinned in package.json)
# The toolchains are installed from PyPI and npm into target/examples-toolchains on first use
# and reused after. Needs python3 (with venv) and node/npm.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/target/examples}"
tools="$root/target/examples-toolchains"
mkdir -p "$out" "$tools"

if [ ! -x "$tools/venv/bin/componentize-py" ]; then
  echo "examples: installing componentize-py into $tools/venv" >&2
  python3 -m venv "$tools/venv"
  "$tools/venv/bin/pip" install --quiet -r "$root/examples/python-tool/requirements.txt"
fi
echo "examples: building python_tool.wasm" >&2
(cd "$tools" && "$tools/venv/bin/componentize-py" -d "$root/wit" -w tool componentize \
  -p "$root/examples/python-tool" app -o "$out/python_tool.wasm" >&2)

if [ ! -d "$tools/js/node_modules/@bytecodealliance/componentize-js" ]; then
  echo "examples: installing componentize-js into $tools/js" >&2
  mkdir -p "$tools/js"
  cp "$root/examples/js-tool/package.json" "$tools/js/"
  (cd "$tools/js" && npm install --no-audit --no-fund --loglevel=error >&2)
fi
echo "examples: building js_tool.wasm" >&2
cp "$root/examples/js-tool/tool.js" "$root/examples/js-tool/build.mjs" "$tools/js/"
node "$tools/js/build.mjs" "$out/js_tool.wasm" "$root/wit" >&2
ls -l "$out"/*.wasm >&2
