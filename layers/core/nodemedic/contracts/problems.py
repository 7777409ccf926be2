"""One readable line from a pydantic ValidationError: ``field.path: message; ...``."""

from __future__ import annotations

from pydantic import ValidationError


def describe(exc: ValidationError, top: str, limit: int | None = 5) -> str:
    """The first ``limit`` problems, each named by its field path (``top`` for the whole input)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or top}: {err['msg']}"
        for err in exc.errors(include_url=False)[:limit]
    )
