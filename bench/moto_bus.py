"""An EventBridge bus behind a real HTTP endpoint (moto's server in this process)."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import boto3
from moto.server import ThreadedMotoServer

FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def bus_endpoint(name: str = "bench") -> Iterator[str]:
    """Yield the endpoint URL of a running server that has a bus called ``name``."""
    os.environ.update(FAKE_CREDENTIALS)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        boto3.client("events", region_name="us-east-1", endpoint_url=url).create_event_bus(Name=name)
        yield url
    finally:
        server.stop()
