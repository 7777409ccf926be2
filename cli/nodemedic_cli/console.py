"""The one rich console of the CLI (150 columns when the output is not a terminal)."""

import sys

from rich.console import Console
from rich.markup import escape

console = Console(width=None if sys.stdout.isatty() else 150)


def plain(value: object) -> str:
    """``value`` to print as it is: square brackets in data (a reason's ``[fault table]``, an
    error's ``[/...]``) are text, not Rich markup, which would hide them or fail on them."""
    return escape(str(value))
