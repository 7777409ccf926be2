"""``nodemedic xid``: what NodeMedic does with an Xid, and the catalog's regeneration from
NVIDIA's spreadsheet."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from nodemedic.domain import xid as xid_data
from nodemedic.domain.classification import classify, fault_table

from nodemedic_cli.console import console, plain

app = typer.Typer(help="NVIDIA's Xid catalog: look a code up, or regenerate the table.", no_args_is_help=True,
                  rich_markup_mode="markdown")
CATALOG = Path(xid_data.__file__).with_name("xid_catalog.csv")
SOURCE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
COLUMNS = {  # NVIDIA's column header -> ours
    "Code": "code", "Mnemonic": "mnemonic", "Description": "description", "Applies to A100": "a100",
    "Applies to H100": "h100", "Applies to B100": "b100", "Applies to GB200": "gb200",
    "Resolution Bucket (Immediate Action)": "immediate",
    "Resolution Bucket (Investigatory Action)": "investigatory", "Xid 154 linkage": "xid154_linkage",
}


class CatalogError(Exception):
    """The spreadsheet export is not NVIDIA's Xids sheet, or names a bucket NodeMedic has not mapped."""


def normalise(export: str, retrieved: str) -> str:
    """NVIDIA's 'Xids' sheet exported as CSV -> ``xid_catalog.csv``. A resolution bucket the fault
    table does not map is an error: a person decides what NodeMedic does with it."""
    reader = csv.DictReader(io.StringIO(export))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise CatalogError(f"not NVIDIA's Xids sheet: no column {', '.join(repr(c) for c in missing)}")
    mapped = set(fault_table()["xid_buckets"]) - {"note"}
    out = io.StringIO()
    out.write("# NVIDIA Xid catalog for Ampere and newer GPUs, the 'Xids' sheet, one row per code.\n"
              f"# source: {SOURCE} (retrieved {retrieved})\n"
              "# regenerate: nodemedic xid import <the sheet exported as CSV>  (docs/xid.md)\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS.values())
    rows = []
    for row in reader:
        if (row.get("Type (XID)") or row.get("Type") or "XID").strip().upper() != "XID":
            continue
        values = {ours: " ".join((row.get(theirs) or "").split()) for theirs, ours in COLUMNS.items()}
        if not values["code"].isdigit():
            raise CatalogError(f"code {values['code']!r} is not a number")
        if values["immediate"] not in mapped:
            raise CatalogError(f"XID {values['code']}: bucket {values['immediate']!r} is new; map it in "
                               "fault_table.json xid_buckets first")
        rows.append(values)
    for values in sorted(rows, key=lambda v: int(v["code"])):
        writer.writerow(values.values())
    return out.getvalue()


@app.command("import")
def import_catalog(
    export: Annotated[Path, typer.Argument(help="NVIDIA's Xid catalog spreadsheet, its 'Xids' sheet saved as CSV.")],
    retrieved: Annotated[str, typer.Option(help="When it was downloaded (YYYY-MM-DD).")] = "",
    out: Annotated[Path, typer.Option(help="Where the catalog goes.")] = CATALOG,
) -> None:
    """Regenerate xid_catalog.csv from NVIDIA's spreadsheet (then run the tests: every code is walked)."""
    try:
        text = normalise(export.read_text(), retrieved or datetime.now(UTC).date().isoformat())
    except (OSError, CatalogError) as exc:
        console.print(f"[red]error:[/] {plain(exc)}")
        raise typer.Exit(2) from None
    out.write_text(text)
    console.print(f"wrote {plain(out)} ({text.count(chr(10)) - 4} codes)")


@app.command()
def explain(code: Annotated[str, typer.Argument(help="An Xid number (46) or any fault code (XID154_NODE_REBOOT).")]
            ) -> None:
    """What NodeMedic does with a fault code, and why (catalog bucket or fault table rule)."""
    fault_code = f"XID {int(code)}" if code.isdigit() else code.upper()
    c = classify(fault_code)
    console.print(f"[bold]{plain(fault_code)}[/] class {c.fault_class}, action [bold]{c.action}[/]"
                  f"{', ladder ' + ' > '.join(c.ladder) if c.ladder else ''}"
                  f"{' (needs a second signal)' if c.confidence == 'ambiguous' else ''}")
    console.print(plain(c.note))
