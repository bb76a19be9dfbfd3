#!/usr/bin/env bash
# Runs keel turns against an OpenAI-compatible model server you already have running — made
# for llama.cpp's llama-server started with a tool-capable chat template, e.g.
#
#   llama-server -m model.gguf --jinja -c 8192 --port 8080
#   scripts/check-llama.sh                       # or: scripts/check-llama.sh http://host:port/v1 [model]
#
# It checks, printing each step:
#   1. the server answers at the base URL;
#   2. a tool turn: the model calls csv_inspect on tests/data/orders.csv and answers;
#   3. a reply cut by a tiny token limit (--max-tokens 8) does not poison the session: the
#      next message in the same session still gets an answer (llama.cpp refuses a history
#      with a cut tool call in it, unless keel repairs it);
#   4. the tokens the server reported, per step and per turn (keel session show).
# Uses a fresh keel home in a temporary directory; the binary is built with cargo unless
# KEEL_BIN names one. Exit 0 when every check passed.
set -euo pipefail
cd "$(dirname "$0")/.."

URL="${1:-http://127.0.0.1:8080/v1}"
MODEL="${2:-local}"
HOME_DIR="$(mktemp -d)"
trap 'rm -rf "$HOME_DIR"' EXIT

if [[ -z "${KEEL_BIN:-}" ]]; then
  cargo build --release --quiet
  KEEL_BIN="target/release/keel"
fi
keel() { "$KEEL_BIN" --home "$HOME_DIR" "$@"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
field() { python3 -c 'import json,sys; v=json.load(sys.stdin); print(v.get(sys.argv[1]) if isinstance(v.get(sys.argv[1]), str) else json.dumps(v.get(sys.argv[1])))' "$1"; }

echo "== 1. the server at $URL"
curl -fsS --max-time 10 "$URL/models" >/dev/null || fail "no answer from $URL/models; is the server running, and is $URL the base URL (the part before /chat/completions)?"

echo "== 2. a tool turn"
out="$(keel run "Use the csv_inspect tool on /data/orders.csv (7 columns are expected) and tell me which lines are ragged." \
  --session tool --tools csv_inspect --grant tests/data=/data:ro --model-url "$URL" --model "$MODEL" \
  --model-timeout 5m --json)" || true
echo "$out"
[[ "$(field outcome <<<"$out")" == "answer" ]] || fail "the tool turn did not end with an answer"
calls="$(keel session show tool --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["tool_calls"]))')"
[[ "$calls" -ge 1 ]] || fail "the model made no tool call (is the chat template tool-capable? llama-server needs --jinja)"
echo "tool calls: $calls"

echo "== 3. a reply cut by the token limit, then the same session goes on"
out="$(keel run "Call csv_inspect on /data/orders.csv with expected_columns 7, then explain the result in detail." \
  --session cut --tools csv_inspect --grant tests/data=/data:ro --model-url "$URL" --model "$MODEL" \
  --max-tokens 8 --model-timeout 5m --json)" || true
echo "$out"
echo "finish_reason: $(field finish_reason <<<"$out")"
out="$(keel session send cut "Now just say hello." --json)" || true
echo "$out"
[[ "$(field outcome <<<"$out")" != "failed" ]] || fail "the session could not go on after a cut reply"

echo "== 4. tokens"
keel session show tool | sed -n '/^model calls:/,$p'
echo "OK: every check passed against $URL"
