#!/bin/sh
# keel as the client of the MCP conformance suite's client scenarios. The suite runs this
# with the server's URL as the last argument and the scenario in MCP_CONFORMANCE_SCENARIO;
# KEEL (the binary) and KEEL_HOME (a home with the first-party tools installed) come from
# the test that runs the suite.
set -eu
for url in "$@"; do :; done
name="conf_$$"
"$KEEL" --home "$KEEL_HOME" mcp add "$name" --effect read-only --url "$url"
case "${MCP_CONFORMANCE_SCENARIO:-}" in
  tools_call)
    "$KEEL" --home "$KEEL_HOME" tool call "${name}__add_numbers" --input '{"a": 2, "b": 3}'
    ;;
esac
"$KEEL" --home "$KEEL_HOME" mcp remove "$name"
