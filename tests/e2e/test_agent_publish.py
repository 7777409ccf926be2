"""``nodemedic agent publish`` against the local stack: the agent's wheelhouse goes to the stack's
bucket, the nodes' instance role (the stack's AgentPublishPolicy, held to it by the local IAM) can
fetch it there and nothing else, the doctor says whether one is published, and a file that is not
a wheelhouse is refused with nothing uploaded."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from nodemedic_cli.main import app
from nodemedic_cli.target import Target
from nodemedic_sandbox.embedded_aws import AGENT_KEY
from nodemedic_sandbox.local import LocalMode
from typer.testing import CliRunner

from tests.conftest import require_slurm
from tests.e2e.test_doctor import doctor


@pytest.fixture(scope="module")
def local() -> Iterator[LocalMode]:
    require_slurm()
    # the node role's refusals below are the point of a test: denials are expected
    with LocalMode(nodes=2, scheduler="slurm", retry_time_scale=0.01, expect_denials=True) as running:
        yield running


def publish(local: LocalMode, path: Path, code: int = 0) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["agent", "publish", str(path), "--json"],
                                obj=Target(local.stack.name, session=boto3.Session()))
    assert result.exit_code == code, result.output
    return json.loads(result.output)


def wheelhouse(path: Path, manifest: object | None) -> Path:
    """A tar.gz laid out as build-wheelhouse.sh makes it (a manifest and a wheel)."""
    with tarfile.open(path, "w:gz") as tar:
        members = {"nodemedic-agent-wheelhouse/nodemedic_agent-0.1.0-py3-none-any.whl": b"PK\x05\x06" + b"\0" * 18}
        if manifest is not None:
            members["nodemedic-agent-wheelhouse/wheelhouse.json"] = json.dumps(manifest).encode()
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def objects(local: LocalMode) -> list[str]:
    bucket = local.stack.outputs["AgentArtifactsBucketName"]
    return [o["Key"] for o in local.aws.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_a_published_wheelhouse_is_what_the_nodes_role_can_fetch_and_the_doctor_sees(local: LocalMode,
                                                                                   tmp_path: Path) -> None:
    assert doctor(local)[1]["agent wheelhouse"]["status"] == "warn"  # none published yet
    house = wheelhouse(tmp_path / "nodemedic-agent-wheelhouse-0.1.0.tar.gz",
                       {"agent": "0.1.0", "pythons": ["3.10", "3.12"], "archs": ["x86_64", "aarch64"]})
    out = publish(local, house)
    bucket = local.stack.outputs["AgentArtifactsBucketName"]
    assert out["s3_url"] == f"s3://{bucket}/agent/nodemedic-agent-wheelhouse-0.1.0.tar.gz"
    assert (out["agent"], out["pythons"], out["archs"]) == ("0.1.0", ["3.10", "3.12"], ["x86_64", "aarch64"])
    assert out["install"] == (f"install-agent.sh --cluster local --bus {local.stack.bus_name} --region us-east-1 "
                              f"--acknowledgements-table {local.stack.table_name} --wheelhouse {out['s3_url']}")
    head = local.aws.client("s3").head_object(Bucket=bucket, Key="agent/nodemedic-agent-wheelhouse-0.1.0.tar.gz")
    assert head["ServerSideEncryption"] == "AES256"
    row = doctor(local)[1]["agent wheelhouse"]
    assert row["status"] == "pass" and "agent/nodemedic-agent-wheelhouse-0.1.0.tar.gz" in row["detail"]

    # a GPU node, signed as its instance role: it fetches the wheelhouse, and can do nothing else there
    node = boto3.client("s3", region_name="us-east-1", aws_access_key_id=AGENT_KEY, aws_secret_access_key="local")
    body = node.get_object(Bucket=bucket, Key="agent/nodemedic-agent-wheelhouse-0.1.0.tar.gz")["Body"].read()
    assert body == house.read_bytes()
    local.aws.client("s3").put_object(Bucket=bucket, Key="private/notes.txt", Body=b"x")
    for refused in (lambda: node.put_object(Bucket=bucket, Key="agent/evil.tar.gz", Body=b"x"),
                    lambda: node.get_object(Bucket=bucket, Key="private/notes.txt")):
        with pytest.raises(ClientError, match="AccessDenied"):
            refused()
    assert {(d.action, d.resource.rsplit(":", 1)[-1]) for d in local.aws.denials} == {
        ("s3:PutObject", f"{bucket}/agent/evil.tar.gz"), ("s3:GetObject", f"{bucket}/private/notes.txt")}


@pytest.mark.parametrize(("manifest", "said"), [
    (None, "holds no nodemedic-agent-wheelhouse/wheelhouse.json"),
    ({"agent": "0.1.0", "pythons": [], "archs": ["x86_64"]}, "names no agent version, Pythons and architectures"),
    ([1, 2], "names no agent version"),
    ({"agent": "0.1.0", "pythons": ["3.12"], "archs": ["x86_64"], "pad": "x" * 70_000}, "not a wheelhouse manifest"),
])
def test_a_file_that_is_not_a_wheelhouse_is_refused_and_nothing_is_uploaded(local: LocalMode, tmp_path: Path,
                                                                            manifest: object, said: str) -> None:
    before = objects(local)
    out = publish(local, wheelhouse(tmp_path / "house.tar.gz", manifest), code=2)
    assert said in out["error"] and objects(local) == before


def test_a_file_that_is_not_a_tarball_or_not_there_is_refused(local: LocalMode, tmp_path: Path) -> None:
    before = objects(local)
    text = tmp_path / "notes.tar.gz"
    text.write_text("not a tarball")
    assert "is not a wheelhouse tar.gz" in publish(local, text, code=2)["error"]
    assert "no such file" in publish(local, tmp_path / "missing.tar.gz", code=2)["error"]
    assert objects(local) == before


def test_an_upload_aws_refuses_is_said_without_a_traceback(local: LocalMode, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's own credentials lack s3:PutObject: boto3 wraps the refusal in its own error."""
    from boto3.exceptions import S3UploadFailedError

    def refused(*_: object, **__: object) -> None:
        raise S3UploadFailedError("Failed to upload: An error occurred (AccessDenied) when calling the PutObject "
                                  "operation: Access Denied")

    monkeypatch.setattr("boto3.s3.inject.upload_file", refused)  # what boto3 gives each S3 client it makes
    before = objects(local)
    out = publish(local, wheelhouse(tmp_path / "nodemedic-agent-wheelhouse-0.1.0.tar.gz",
                                    {"agent": "0.1.0", "pythons": ["3.12"], "archs": ["x86_64"]}), code=2)
    assert "you need s3:PutObject there" in out["error"] and "AccessDenied" in out["error"]
    assert objects(local) == before
