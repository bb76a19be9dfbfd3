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
#   3. a tool call cut by the token limit does not poison the session: the token limit is
#      raised from 8 until a reply is cut inside its tool call (a limit of 8 usually stops
#      before any call starts), then the next message in the same session still gets an
#      answer (llama.cpp refuses a history with a cut tool call in it, unless keel repairs it);
#   4. the tokens the server reported, per step and per turn (keel session show);
#   5. a small window: turns that each read a 2-3 KB file in one session, with the server's
#      own context (`n_ctx` of /props) given to keel as --context-window — the share of turns
#      answered is printed (run the server with -c 2048 and with -c 4096 to see both).
#      COMPACTION_TURNS sets how many turns (default 6);
#   6. the prompt cache: the same turns again with the goals, plan and summary in the first
#      system message (`[model] notes_message = false`) — the prompt tokens of each session's
#      calls, and how many of them the server evaluated again (those its cache did not hold).
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
keel() { "$KEEL_BIN" --home "${KH:-$HOME_DIR}" "$@"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
field() { python3 -c 'import json,sys; v=json.load(sys.stdin); print(v.get(sys.argv[1]) if isinstance(v.get(sys.argv[1]), str) else json.dumps(v.get(sys.argv[1])))' "$1"; }

echo "== 1. the server at $URL"
curl -fsS --max-time 10 "$URL/models" >/dev/null || fail "no answer from $URL/models; is the server running, and is $URL the base URL (the part before /chat/completions)?"

# llama-server's /props is at the root, beside /v1: what its chat template can do.
ROOT="${URL%/}"; ROOT="${ROOT%/v1}"
PROPS="$(curl -fsS --max-time 10 "$ROOT/props" 2>/dev/null || true)"
prop() { python3 -c 'import json,sys
try: v=json.loads(sys.stdin.read() or "{}")
except Exception: v={}
for k in sys.argv[1].split("."): v=v.get(k) if isinstance(v, dict) else None
print("" if v is None else json.dumps(v))' "$1"; }
TOOL_CAPS="$(prop chat_template_caps.supports_tool_calls <<<"$PROPS")"
N_CTX="$(prop default_generation_settings.n_ctx <<<"$PROPS")"
echo "chat template supports tool calls: ${TOOL_CAPS:-unknown (no /props)}; context: ${N_CTX:-unknown}"

echo "== 2. a tool turn"
out="$(keel run "Use the csv_inspect tool on /data/orders.csv (7 columns are expected) and tell me which lines are ragged." \
  --session tool --tools csv_inspect --grant tests/data=/data:ro --model-url "$URL" --model "$MODEL" \
  --model-timeout 5m --json)" || true
echo "$out"
[[ "$(field outcome <<<"$out")" == "answer" ]] || fail "the tool turn did not end with an answer"
calls="$(keel session show tool --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["tool_calls"]))')"
if [[ "$calls" -lt 1 ]]; then
  # A call written as text that the server did not parse is the template's fault; an answer
  # without any attempt is the model's choice.
  if grep -qiE '<tool_call>|"name" *: *"csv_inspect"|csv_inspect\(' <<<"$out"; then
    # The template is to blame only when the server says it cannot do tool calls.
    if [[ "$TOOL_CAPS" == "true" ]]; then
      fail "the model wrote a tool call as prose although the server's chat template supports tool calls (/props): the model did not use the template's format; try a larger model"
    fi
    fail "the model wrote a tool call as text that the server did not parse: the chat template is not tool-capable (${TOOL_CAPS:+/props says supports_tool_calls=$TOOL_CAPS; }llama-server needs --jinja, and a model whose template has tools)"
  fi
  fail "the model answered without calling a tool: it chose not to (not a template problem); run again, or try a larger model"
fi
echo "tool calls: $calls"

echo "== 3. a tool call cut by the token limit, then the same session goes on"
cut_in_call=""
for limit in 8 12 16 24 32 48 64; do
  session="cut-$limit"
  out="$(keel run "Call csv_inspect on /data/orders.csv with expected_columns 7, then explain the result in detail." \
    --session "$session" --tools csv_inspect --grant tests/data=/data:ro --model-url "$URL" --model "$MODEL" \
    --max-tokens "$limit" --model-timeout 5m --json)" || true
  # Cut inside a call: the first step stopped at the limit with a call in its stored message.
  inside="$(keel session show "$session" --json | python3 -c '
import json, sys
t = json.load(sys.stdin)
first = next((m for m in t.get("messages", []) if m.get("role") == "assistant"), None)
print("yes" if first and first.get("calls") else "no")')"
  echo "--max-tokens $limit: finish_reason $(field finish_reason <<<"$out"), a call in the cut reply: $inside"
  if [[ "$inside" == "yes" && "$(field finish_reason <<<"$out")" == "length" ]]; then
    cut_in_call="$session"
    break
  fi
done
if [[ -z "$cut_in_call" ]]; then
  echo "NOTE: no limit up to 64 tokens cut a reply inside a tool call; checking the last cut session instead"
  cut_in_call="$session"
fi
out="$(keel session send "$cut_in_call" "Now just say hello." --json)" || true
echo "$out"
[[ "$(field outcome <<<"$out")" != "failed" ]] || fail "the session could not go on after a cut reply"

echo "== 4. tokens"
keel session show tool | sed -n '/^model calls:/,$p'
echo "== 5. a small window: turns that read 2-3 KB files"
TURNS="${COMPACTION_TURNS:-6}"
WINDOW="${N_CTX:-4096}"
mkdir -p "$HOME_DIR/files"
for i in $(seq 1 "$TURNS"); do
  python3 -c 'import sys; n=int(sys.argv[1]); print("\n".join(f"line {k}: order {1000+k*n} shipped to warehouse {k%7}" for k in range(60+n*6)))' "$i" \
    >"$HOME_DIR/files/part$i.txt"
done
# Runs the small-window turns in session $1 of keel home $KH; prints each turn's outcome and
# sets ANSWERED.
small_window() {
  ANSWERED=0
  for i in $(seq 1 "$TURNS"); do
    if [[ "$i" == 1 ]]; then
      out="$(keel run "Read /files/part$i.txt with fs_read_file and tell me its last line." --session "$1" \
        --tools fs_read_file --grant "$HOME_DIR/files=/files:ro" --model-url "$URL" --model "$MODEL" \
        --context-window "$WINDOW" --model-timeout 5m --json)" || true
    else
      out="$(keel session send "$1" "Read /files/part$i.txt with fs_read_file and tell me its last line." --json)" || true
    fi
    outcome="$(field outcome <<<"$out")"
    echo "turn $i: $outcome"
    [[ "$outcome" == "answer" ]] && ANSWERED=$((ANSWERED + 1))
  done
}
# The prompt tokens of session $1's model calls, and of them the ones the server's prompt
# cache held (prompt_tokens_details.cached_tokens, where the server reports it).
prompt_tokens() {
  keel session show "$1" --json | python3 -c '
import json, sys
calls = json.load(sys.stdin).get("model_calls", [])
used = [c["usage"] for c in calls if c.get("usage")]
p = sum(u.get("prompt_tokens", 0) for u in used)
cached = [u["cached_tokens"] for u in used if u.get("cached_tokens") is not None]
if cached:
    print("%d calls: %d prompt tokens, %d evaluated again (%.0f a call)" % (len(used), p, p - sum(cached), (p - sum(cached)) / max(len(used), 1)))
else:
    print("%d calls: %d prompt tokens (the server reports no cached tokens)" % (len(used), p))'
}
small_window small
compactions="$(keel session show small --json | python3 -c '
import json, sys
c = json.load(sys.stdin).get("checkpoints", [])
m = sum(1 for x in c if (x.get("summary") or {}).get("mechanical"))
print("%d compactions (%d mechanical)" % (len(c), m))')"
echo "small window ($WINDOW tokens): $ANSWERED of $TURNS turns answered; $compactions"
keel session show small | grep '^room:' || true
[[ "$ANSWERED" == "$TURNS" ]] || fail "$((TURNS - ANSWERED)) of $TURNS turns in a $WINDOW-token window were not answered"

echo "== 6. the prompt cache: the notes in a second system message, and in the first"
echo "notes apart (the default): $(prompt_tokens small)"
ONE_HOME="$(mktemp -d)"
trap 'rm -rf "$HOME_DIR" "$ONE_HOME"' EXIT
printf '[model]\nnotes_message = false\n' >"$ONE_HOME/keel.toml"
KH="$ONE_HOME" small_window one >/dev/null
echo "one system message:         $(KH="$ONE_HOME" prompt_tokens one)"

echo "OK: every check passed against $URL"
