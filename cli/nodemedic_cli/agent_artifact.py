"""``nodemedic agent publish``: the agent's self-contained wheelhouse (``make agent-wheelhouse``)
into the stack's bucket (``AgentArtifactsBucketName``, under ``agent/``), from where
``install-agent.sh --wheelhouse s3://...`` installs it on a node with no package index, with the
nodes' instance role (the stack's AgentPublishPolicy allows ``s3:GetObject`` there)."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

from boto3.exceptions import S3UploadFailedError
from nodemedic.contracts.problems import read_json
from nodemedic.errors import NodeMedicError

from nodemedic_cli.target import Target

MANIFEST = "nodemedic-agent-wheelhouse/wheelhouse.json"
PREFIX = "agent/"
MANIFEST_MAX_BYTES = 64 * 1024
DIST = Path("dist")


class ArtifactError(NodeMedicError):
    """The file is not a wheelhouse build-wheelhouse.sh made: nothing is published."""


def newest_wheelhouse(directory: Path = DIST) -> Path:
    found = sorted(directory.glob("nodemedic-agent-wheelhouse-*.tar.gz"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise ArtifactError(f"no nodemedic-agent-wheelhouse-*.tar.gz in {directory}/: build it with "
                            "`make agent-wheelhouse` (where PyPI or a mirror is reachable), or name the file")
    return found[-1]


def read_manifest(path: Path) -> dict[str, Any]:
    """The wheelhouse's ``wheelhouse.json`` (its agent version, Pythons and CPUs), read before anything
    is uploaded: what install-agent.sh reads first on the node."""
    if not path.is_file():
        raise ArtifactError(f"{path}: no such file (`make agent-wheelhouse` builds one into dist/)")
    try:
        with tarfile.open(path, "r:gz") as tar:
            info = tar.getmember(MANIFEST)
            if info.size > MANIFEST_MAX_BYTES:  # build-wheelhouse.sh writes one line
                raise ArtifactError(f"{path}: its {MANIFEST} is {info.size:,} bytes, not a wheelhouse manifest")
            member = tar.extractfile(info)
            manifest = read_json(member.read()) if member else None
    except KeyError:
        raise ArtifactError(f"{path} holds no {MANIFEST}: not a wheelhouse build-wheelhouse.sh made") from None
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        raise ArtifactError(f"{path} is not a wheelhouse tar.gz (build-wheelhouse.sh): {exc}") from None
    fields = manifest if isinstance(manifest, dict) else {}
    version, pythons, archs = fields.get("agent"), fields.get("pythons"), fields.get("archs")
    if not (isinstance(version, str) and version and _names(pythons) and _names(archs)):
        raise ArtifactError(f"{path}: its {MANIFEST} names no agent version, Pythons and architectures")
    return {"agent": version, "pythons": pythons, "archs": archs}


def _names(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and v for v in value)


def publish(target: Target, path: Path | None) -> dict[str, Any]:
    """Upload the wheelhouse (SSE-S3) and say how a node installs it."""
    path = path or newest_wheelhouse()
    manifest = read_manifest(path)
    bucket = target.output("AgentArtifactsBucketName")
    key = PREFIX + path.name
    url = f"s3://{bucket}/{key}"
    try:
        target.client("s3").upload_file(str(path), bucket, key, ExtraArgs={"ServerSideEncryption": "AES256"})
    except S3UploadFailedError as exc:  # AccessDenied, a bucket gone: boto3 wraps the refusal
        raise ArtifactError(f"cannot upload {path.name} to {url} (you need s3:PutObject there): {exc}") from None
    region = target.client("s3").meta.region_name
    install = (f"install-agent.sh --cluster {target.cluster} --bus {target.output('EventBusName')} --region {region} "
               f"--acknowledgements-table {target.output('IncidentsTableName')} --wheelhouse {url}")
    return {"s3_url": url, "bytes": path.stat().st_size, **manifest, "install": install}


def published(target: Target) -> list[dict[str, Any]]:
    """The wheelhouses in the stack's bucket, newest first (key, size, when)."""
    pages = target.client("s3").get_paginator("list_objects_v2").paginate(
        Bucket=target.output("AgentArtifactsBucketName"), Prefix=PREFIX)
    found = [o for page in pages for o in page.get("Contents", []) if o["Key"].endswith(".tar.gz")]
    return sorted(found, key=lambda o: o["LastModified"], reverse=True)
