"""NVIDIA's Xid catalog as data, and the two Xids whose action is in the message itself.

``xid_catalog.csv`` is NVIDIA's catalog for Ampere and newer GPUs, one row per code with its
resolution bucket (regenerated from NVIDIA's spreadsheet with ``nodemedic xid import``);
``nvlink5_decode.csv`` is the catalog's decode of the NVLink5 Xids 144-150. The fault table maps
each bucket to NodeMedic's action and ladder (``fault_table.json``, ``xid_buckets``).

Two kinds of Xid cannot be classified by their number, so the agent names them by what the
driver says (a fault code of their own, which operators can override like any other):

- Xid 154 states the recovery action the GPU needs: ``XID154_GPU_RESET``, ``XID154_NODE_REBOOT``,
  ``XID154_DRAIN_AND_RESET``, ``XID154_DRAIN_P2P``, ``XID154_NONE`` (``XID154_UNKNOWN`` if the text
  is new).
- Xids 144-150 carry a unit, a Fatal/Nonfatal word, IntrInfo and an error status word:
  ``NVLINK5_RESET_GPU``, ``NVLINK5_XID_154_EVAL`` (the Xid 154 that follows carries the action),
  ``NVLINK5_IGNORE``.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import NamedTuple

NVLINK5_XIDS = range(144, 151)
RECOVERY_ACTION = re.compile(r"recovery action changed from .*? to (0x[0-9A-Fa-f]+) \(([^)]*)\)", re.I)
RECOVERY_CODES = {  # the texts the catalog lists for Xid 154, and NVML's nvmlDeviceGpuRecoveryAction_t values
    "none": "XID154_NONE", "gpu reset required": "XID154_GPU_RESET",
    "node reboot required": "XID154_NODE_REBOOT", "drain p2p": "XID154_DRAIN_P2P",
    "drain and reset": "XID154_DRAIN_AND_RESET",
}
RECOVERY_VALUES = {0: "XID154_NONE", 1: "XID154_GPU_RESET", 2: "XID154_NODE_REBOOT", 3: "XID154_DRAIN_P2P",
                   4: "XID154_DRAIN_AND_RESET"}
RECOVERY_NAMES = {code: text for text, code in RECOVERY_CODES.items()}  # XID154_NODE_REBOOT -> "node reboot required"
# "149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 ...)"; before R575 the words may
# be spaced ("XC 1 i 2") and the registers bracketed ("[0x0000000a]")
NVLINK5_DETAIL = re.compile(
    r"^\s*(?P<unit>[A-Z][A-Z0-9_]*(?:/[A-Z0-9_]+)?)\s+(?P<severity>Fatal|Nonfatal|Non-fatal)\b"
    r".*?[(\[](?P<words>\s*0x[0-9A-Fa-f]+(?:\s+0x[0-9A-Fa-f]+)*)\s*[)\]]", re.I)
_SEVERITY = {"IGNORE": 0, "XID_154_EVAL": 1, "RESET_GPU": 2}


@dataclass(frozen=True)
class XidEntry:
    code: int
    mnemonic: str
    description: str
    applies_to: tuple[str, ...]
    immediate: str  # NVIDIA's resolution bucket (immediate action); "" where the catalog gives none
    investigatory: str


@dataclass(frozen=True)
class Nvlink5Decode:
    """What the catalog says of one NVLink5 Xid message; ``basis`` says how it was found."""

    bucket: str
    unit: str
    fatal: bool
    intr_info: int | None
    error_status: int | None
    basis: str

    @property
    def fault_code(self) -> str:
        return f"NVLINK5_{self.bucket}"


def _rows(name: str) -> list[dict[str, str]]:
    text = resources.files("nodemedic.domain").joinpath(name).read_text()
    return list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))


@lru_cache(maxsize=1)
def catalog() -> dict[int, XidEntry]:
    products = ("a100", "h100", "b100", "gb200")
    return {int(r["code"]): XidEntry(int(r["code"]), r["mnemonic"], r["description"],
                                     tuple(p.upper() for p in products if r[p] == "YES"),
                                     r["immediate"], r["investigatory"])
            for r in _rows("xid_catalog.csv")}


class DecodeRow(NamedTuple):
    """One row of ``nvlink5_decode.csv``; None matches any value."""

    xid: int
    units: frozenset[str]
    error_status: int | None
    reason: int | None
    bucket: str


@lru_cache(maxsize=1)
def _nvlink5_rows() -> list[DecodeRow]:
    return [DecodeRow(int(r["xid"]), frozenset(r["unit"].upper().split("/")),
                      None if r["error_status"] == "*" else int(r["error_status"], 16),
                      None if r["reason"] == "*" else int(r["reason"]), r["bucket"])
            for r in _rows("nvlink5_decode.csv")]


def recovery_action_code(message: str) -> str | None:
    """The fault code of an Xid 154 message: the recovery action the driver states."""
    m = RECOVERY_ACTION.search(message)
    if not m:
        return None
    return RECOVERY_CODES.get(m.group(2).strip().lower()) or recovery_value_code(int(m.group(1), 16))


def recovery_value_code(value: int) -> str:
    """The fault code of a recovery action value (nvmlDeviceGpuRecoveryAction_t), as Xid 154 states
    it or NVML reads it; one the catalog does not know is ``XID154_UNKNOWN``."""
    return RECOVERY_VALUES.get(value, "XID154_UNKNOWN")


def _bucket(xid: int, unit: str, status: int, reason: int) -> str | None:
    rows = [r for r in _nvlink5_rows() if r.xid == xid and unit in r.units]
    exact = [r for r in rows if r.error_status == status and r.reason in (None, reason)]
    if exact:
        return exact[0].bucket
    by_reason = [r for r in rows if r.error_status is None and r.reason == reason]
    if by_reason:
        return by_reason[0].bucket
    wildcard = [r for r in rows if r.error_status is None and r.reason is None]
    if wildcard:
        return wildcard[0].bucket
    if status and rows:  # a status word of several bits: the most severe bit decides, if all are known
        buckets = [next((r.bucket for r in rows if r.error_status == 1 << bit), None)
                   for bit in range(32) if status >> bit & 1]
        if buckets and None not in buckets:
            return max(buckets, key=lambda b: _SEVERITY[b or "IGNORE"])
    return None


def decode_nvlink5(xid: int, detail: str) -> Nvlink5Decode | None:
    """Decode the text after ``<xid>,`` of an NVLink5 Xid (144-150) with the catalog's table.

    A fatal report is never ignored: where the table says IGNORE (or has no row) but the driver
    calls the error Fatal, the GPU is reset. Returns None when the text has no unit/severity."""
    if xid not in NVLINK5_XIDS:
        return None
    m = NVLINK5_DETAIL.search(detail)
    if not m:
        return None
    unit = m.group("unit").upper()
    fatal = m.group("severity").lower() == "fatal"
    words = [int(w, 16) for w in m.group("words").split()]
    intr = words[0] if words else None
    status = words[1] if len(words) > 1 else None
    bucket = _bucket(xid, unit, status or 0, (intr or 0) >> 20 & 0x3F)
    basis = "catalog decode"
    if bucket is None:
        bucket, basis = ("RESET_GPU" if fatal else "IGNORE"), "not in the catalog's decode: the driver's severity word"
    elif fatal and bucket == "IGNORE":
        bucket, basis = "RESET_GPU", "catalog says IGNORE, the driver says Fatal"
    return Nvlink5Decode(bucket, unit, fatal, intr, status, basis)
