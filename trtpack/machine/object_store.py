"""The S3 client trtpack talks to an object store with (the remote stage cache,
``pipeline.remote_cache``; the shared TensorRT timing caches, ``engine.timing_caches``):
boto3, imported only when a build has a ``--cache-url``."""

from __future__ import annotations

import os
from typing import Any

# bounded: a store that does not answer costs seconds, not minutes
CONNECT_TIMEOUT_S = 3
READ_TIMEOUT_S = 60
MAX_ATTEMPTS = 3  # botocore's "standard" retry mode: the first try and two retries


def s3_client() -> Any:
    """A boto3 S3 client with bounded timeouts and retries; the endpoint from
    ``AWS_ENDPOINT_URL`` (boto3 reads it), path-style addressing when one is set (a local
    store has no per-bucket host names)."""
    import boto3
    from botocore.config import Config

    custom = bool(os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
    config = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                    retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
                    s3={"addressing_style": "path"} if custom else None)
    return boto3.session.Session().client("s3", config=config)
