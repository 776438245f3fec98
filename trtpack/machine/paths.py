"""Where trtpack keeps its files: this machine's stage cache, and the remote one that many
machines share (``--cache-url``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from trtpack.errors import UserInputError

CACHE_URL_VARIABLE = "TRTPACK_CACHE_URL"


def default_cache_dir() -> Path:
    """The stage cache: ``$TRTPACK_CACHE_DIR``, else ``$XDG_CACHE_HOME/trtpack``, else
    ``~/.cache/trtpack``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("TRTPACK_CACHE_DIR", str(Path(base) / "trtpack")))


@dataclass(frozen=True)
class CacheUrl:
    """``s3://BUCKET/PREFIX``: where the shared entries live."""

    bucket: str
    prefix: str  # without a slash at either end; "" for the bucket's root

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)


def parse_cache_url(text: str, flag: str = "--cache-url") -> CacheUrl:
    """``s3://BUCKET[/PREFIX]``. Credentials in the URL (``s3://KEY:SECRET@bucket``) are
    refused without repeating them: they would end up in shell histories and CI logs."""
    parts = urlsplit(text.strip())
    if parts.scheme != "s3":
        shown = text.split("://", 1)[0] if "://" in text else "a path"
        raise UserInputError(f"{flag} takes s3://BUCKET/PREFIX, not {shown}"
                             + ("://..." if "://" in text else ""))
    if "@" in parts.netloc:
        bucket = parts.netloc.rsplit("@", 1)[1]
        raise UserInputError(
            f"{flag} s3://***@{bucket}/... carries credentials in the URL: they are refused",
            hint="give them through the AWS environment (AWS_ACCESS_KEY_ID, "
                 "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or a role), and the store's address "
                 "through AWS_ENDPOINT_URL")
    bucket = parts.netloc
    if not bucket or parts.query or parts.fragment:
        raise UserInputError(f"{flag} '{text}' names no bucket: write s3://BUCKET/PREFIX")
    return CacheUrl(bucket, parts.path.strip("/"))


def cache_url_from(given: str | None) -> CacheUrl | None:
    """The ``--cache-url`` given, else ``TRTPACK_CACHE_URL``, parsed (None: no remote
    cache)."""
    if given:
        return parse_cache_url(given)
    from_env = os.environ.get(CACHE_URL_VARIABLE, "").strip()
    return parse_cache_url(from_env, CACHE_URL_VARIABLE) if from_env else None
