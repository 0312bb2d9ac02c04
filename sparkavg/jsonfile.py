"""The one reader of the JSON files sparkavg reads from disk: bounded
memory, the file named on every error.

A checkpoint's ``trainer.json`` and a saved ml stage's ``sparkavg.json``
are small records (a configuration and a history of per-epoch summaries);
:func:`parse_json` refuses more than :data:`MAX_JSON_BYTES` before parsing,
and text that is not JSON, nests too deep, or is not the expected type, with
an error that says which file and what was expected.
"""
from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["MAX_JSON_BYTES", "parse_json", "read_json"]

#: The largest JSON record read (a history of ~20,000 epochs fits).
MAX_JSON_BYTES = 8 << 20


def parse_json(data: bytes, name: str, *, error: type = ValueError, expect: type = dict,
               max_bytes: int = MAX_JSON_BYTES) -> Any:
    """``data`` (the bytes of file ``name``, at most ``max_bytes`` + 1 of
    them read) as JSON of type ``expect``; ``error`` naming the file
    otherwise."""
    if len(data) > max_bytes:
        raise error(f"{name}: more than {max_bytes:,} bytes; expected a JSON record of at most {max_bytes:,} bytes")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise error(f"{name}: expected JSON text, got unreadable data ({type(exc).__name__}: {exc})") from None
    if expect is not None and not isinstance(value, expect):
        kind = {dict: "a JSON object", list: "a JSON array"}.get(expect, expect.__name__)
        raise error(f"{name}: expected {kind}, got {type(value).__name__} {str(value)[:80]!r}")
    return value


def read_json(path, *, error: type = ValueError, expect: type = dict, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The local JSON file ``path`` read in bounded memory (see :func:`parse_json`).

    Raises ``error`` for a file that is too large or not the JSON expected;
    ``OSError`` when it cannot be opened."""
    path = os.fspath(path)
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    return parse_json(data, path, error=error, expect=expect, max_bytes=max_bytes)
