"""The agent reads instance metadata through IMDSv2 and keeps its session token: one ``PUT`` per
token, not one per read (the Spot notice is read every 5 seconds), a new one shortly before it
expires, and one more when IMDS no longer takes it."""

from __future__ import annotations

import threading
import urllib.error
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from nodemedic_agent.identity import InstanceMetadata


class Imds:
    """IMDSv2 as the EC2 user guide documents it: ``PUT /latest/api/token`` with a TTL header of 1
    to 21600 seconds gives a token; a read without a valid token is 401; an unknown path is 404."""

    def __init__(self) -> None:
        self.values = {"instance-id": "i-0123456789abcdef0", "instance-life-cycle": "spot"}
        self.tokens: set[str] = set()
        self.puts = 0
        self.gets = 0
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:  # noqa: N802 - http.server's name
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
                if self.path != "/latest/api/token" or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return self._answer(400, "")
                imds.puts += 1
                token = f"token-{imds.puts}"
                imds.tokens.add(token)
                self._answer(200, token)

            def do_GET(self) -> None:  # noqa: N802
                imds.gets += 1
                if self.headers.get("X-aws-ec2-metadata-token") not in imds.tokens:
                    return self._answer(401, "")
                value = imds.values.get(self.path.removeprefix("/latest/meta-data/"))
                self._answer(200, value) if value is not None else self._answer(404, "")

            def _answer(self, status: int, body: str) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}/latest"


@pytest.fixture
def imds() -> Iterator[Imds]:
    server = Imds()
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()
    thread.join()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_token_serves_every_read_until_shortly_before_it_expires(imds: Imds) -> None:
    clock = Clock()
    metadata = InstanceMetadata(imds.base, clock)
    for _ in range(20):
        assert metadata("instance-life-cycle") == "spot"
    assert metadata("instance-id") == "i-0123456789abcdef0"
    assert (imds.puts, imds.gets) == (1, 21)
    clock.now += InstanceMetadata.TOKEN_TTL_S - 2 * InstanceMetadata.RENEW_BEFORE_S
    metadata("instance-id")
    assert imds.puts == 1
    clock.now += InstanceMetadata.RENEW_BEFORE_S  # within a minute of the token's end: a new one first
    metadata("instance-id")
    assert imds.puts == 2


def test_a_token_imds_no_longer_takes_is_replaced_once(imds: Imds) -> None:
    metadata = InstanceMetadata(imds.base, Clock())
    metadata("instance-id")
    imds.tokens.clear()  # e.g. IMDS forgot it early
    assert metadata("instance-id") == "i-0123456789abcdef0"
    assert imds.puts == 2


def test_a_path_imds_does_not_have_is_its_404(imds: Imds) -> None:
    """The Spot notice's path answers 404 until EC2 warns: the reader must see that, not a retry."""
    metadata = InstanceMetadata(imds.base, Clock())
    with pytest.raises(urllib.error.HTTPError) as caught:
        metadata("spot/instance-action")
    assert caught.value.code == 404 and imds.puts == 1


def test_metadata_that_is_not_reachable_is_an_oserror() -> None:
    """Off EC2 (or with the hop limit too low for a container) the agent logs this and asks later."""
    metadata = InstanceMetadata("http://127.0.0.1:9/latest", Clock())
    with pytest.raises(OSError):
        metadata("instance-id", timeout_s=0.5)
