"""``nodemedic xid import``: NVIDIA's spreadsheet export becomes the catalog the pipeline reads."""

from __future__ import annotations

import csv
import io

import pytest
from nodemedic_cli.xid import CATALOG, COLUMNS, CatalogError, normalise


def nvidia_export(rows: list[dict[str, str]]) -> str:
    """The catalog as NVIDIA's 'Xids' sheet saved as CSV (their headers, a Type column, extra columns)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["Type (XID)", *COLUMNS, "Trigger Conditions"])
    for r in rows:
        writer.writerow(["XID", *(r[ours] for ours in COLUMNS.values()), "free text, with commas"])
    return out.getvalue()


def shipped() -> list[dict[str, str]]:
    return list(csv.DictReader(line for line in CATALOG.read_text().splitlines() if not line.startswith("#")))


def test_importing_nvidias_sheet_reproduces_the_shipped_catalog() -> None:
    text = normalise(nvidia_export(list(reversed(shipped()))), "2026-11-23")
    assert text == CATALOG.read_text()


def test_a_bucket_nodemedic_has_not_mapped_stops_the_import() -> None:
    rows = shipped()
    rows[45] = {**rows[45], "immediate": "RESTART_FABRIC"}
    with pytest.raises(CatalogError, match="bucket 'RESTART_FABRIC' is new"):
        normalise(nvidia_export(rows), "2026-11-23")


def test_another_sheet_is_refused_with_the_columns_it_lacks() -> None:
    with pytest.raises(CatalogError, match="no column 'Mnemonic'"):
        normalise("Code,Description\n1,x\n", "2026-11-23")
