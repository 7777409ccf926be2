"""The one rich console of the CLI (150 columns when the output is not a terminal)."""

import sys

from rich.console import Console

console = Console(width=None if sys.stdout.isatty() else 150)
