"""What the component's tools do: each is a function marked @tool, tested natively by
test_logic.py. Their schemas come from the annotations (see keel_tool.py)."""

from typing import Annotated, TypedDict

from keel_tool import tool

MAX_BYTES = 1 << 20


class Counts(TypedDict):
    words: Annotated[int, "Words: runs of characters between whitespace."]
    characters: Annotated[int, "Characters (Unicode code points)."]


@tool(name="{{tool}}", effect="{{effect}}")
def count(text: Annotated[str, "The text to count."]) -> Counts:
    """Counts the words and characters of a text."""
    if len(text.encode()) > MAX_BYTES:
        raise ValueError("`text` is over 1 MiB: give a shorter text")
    return {"words": len(text.split()), "characters": len(text)}
