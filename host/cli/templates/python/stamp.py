"""Appends the project's name and version (pyproject.toml) to the built component as the
custom sections keel reads (`keel:component`, `version`): `python3 stamp.py FILE.wasm`."""

import re
import sys


def leb(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def section(name: str, data: str) -> bytes:
    body = leb(len(name)) + name.encode() + data.encode()
    return b"\x00" + leb(len(body)) + body


def field(text: str, key: str) -> str:
    m = re.search(rf'^{key}\s*=\s*"([^"]+)"', text, re.M)
    if not m:
        sys.exit(f"stamp.py: pyproject.toml has no {key} = \"...\"")
    return m.group(1)


if __name__ == "__main__":
    project = open("pyproject.toml", encoding="utf-8").read()
    with open(sys.argv[1], "ab") as f:
        f.write(section("keel:component", field(project, "name")))
        f.write(section("version", field(project, "version")))
