"""One readable line from a pydantic ValidationError: ``field.path: message; ...``."""

from __future__ import annotations

from pydantic import ValidationError


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
