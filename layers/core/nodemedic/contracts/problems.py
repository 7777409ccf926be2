"""Input anyone may write, read without surprises, and what is wrong with it in one readable line
(``field.path: message; ...`` from a pydantic ValidationError)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError


def read_json(text: str | bytes) -> Any:
    """``json.loads``; text nested deeper than Python's decoder goes (an operator's policy, a node's
    report, a cluster's annotation) is a ``json.JSONDecodeError`` like any other text that is not
    JSON, never a RecursionError that escapes the handling of bad input."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to read", text if isinstance(text, str) else "", 0) from None


def describe(exc: ValidationError, top: str, limit: int | None = 5) -> str:
    """The first ``limit`` problems, each named by its field path (``top`` for the whole input)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or top}: {err['msg']}"
        for err in exc.errors(include_url=False)[:limit]
    )


def not_unicode(value: object, top: str) -> str | None:
    """The path of the first string (or key) in parsed JSON that is no Unicode text: a lone
    surrogate, which JSON's ``\\u`` escapes can write (RFC 8259 section 8.2) but UTF-8 cannot
    encode, so DynamoDB, Step Functions and the logs cannot take it."""
    stack: list[tuple[str, object]] = [(top, value)]
    while stack:
        path, item = stack.pop()
        texts = [item] if isinstance(item, str) else list(item) if isinstance(item, dict) else []
        for text in texts:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return path if isinstance(item, str) else f"{path} (a key)"
        if isinstance(item, dict):
            stack.extend((f"{path}.{key}", child) for key, child in item.items())
        elif isinstance(item, list):
            stack.extend((f"{path}.{i}", child) for i, child in enumerate(item))
    return None
