"""The caller's side of ``pytorch.describe``: its process started (torch and the user's code
stay out of the caller's) or, where a stage server is named, forked from the server's
``describe`` template, which imported torch once (``pipeline.served_workers``), its result read
back, and the description kept beside the stage cache until one of the files it came from
changes."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from trtpack.errors import MissingEnvironmentError, StageError, UserInputError
from trtpack.processes import (
    checkout_environment,
    kill_group,
    python_module_command,
    served_process,
)
from trtpack.sources.torch_sources import (
    DescribedSource,
    DescribeRequest,
    SourceFiles,
    memo_path,
    read_memo,
    write_memo,
)

DESCRIBE_TIMEOUT_S = 900
DESCRIBE_TEMPLATE = "describe"
"""The stage server's template of the description's process (``pipeline.served_workers``)."""


def describe_in_process(request: DescribeRequest, cache_dir: Path) -> DescribedSource:
    """``describe(request)`` in a fresh Python process (torch and the user's code stay out
    of the caller's), recorded with its files beside the stage cache; a recorded
    description whose files are unchanged is returned without starting anything."""
    memo = memo_path(cache_dir, request)
    recorded = read_memo(memo)
    if recorded is not None:
        described, files = recorded
        described["source_files"] = files.key()
        return described
    memo.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trtpack-describe-") as tmp:
        request_path, result_path = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request_path.write_text(json.dumps(request), encoding="utf-8")
        log = memo.with_suffix(".log")
        returncode = run_describe(checkout_environment(os.environ),
                                  [str(request_path), str(result_path)], log)
        if not result_path.is_file():
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
            raise StageError("describe", f"loading the PyTorch model failed (exit "
                             f"{returncode}): {tail[-1] if tail else 'no output'}",
                             log_path=log)
        result = json.loads(result_path.read_text(encoding="utf-8"))
    if "error" in result:
        missing = result.get("exit_code") == MissingEnvironmentError.exit_code
        raise (MissingEnvironmentError if missing else UserInputError)(
            result["error"], hint=result.get("hint"))
    files = SourceFiles.of(result["ok"].pop("files"))
    description: DescribedSource = result["ok"]  # its files apart: they key the memo
    write_memo(memo, description, files)
    description["source_files"] = files.key()
    return description


def run_describe(env: dict[str, str], argv: list[str], log: Path) -> int:
    """``python -m trtpack.pytorch.describe ARGV`` in ``env``, its output in ``log``: forked
    from the stage server's template where one is named and serves it, else started. Its exit
    code; ``subprocess.TimeoutExpired`` (it killed) after ``DESCRIBE_TIMEOUT_S``."""
    with open(log, "wb") as out, open(os.devnull, "rb") as stdin:
        served = served_process(DESCRIBE_TEMPLATE,
                                {"cwd": os.getcwd(), "environment": env, "argv": argv},
                                [stdin.fileno(), out.fileno(), out.fileno()])
        if served is None:
            return subprocess.run(
                python_module_command("trtpack.pytorch.describe", *argv), stdout=out,
                stderr=subprocess.STDOUT, env=env, timeout=DESCRIBE_TIMEOUT_S,
                check=False).returncode
    try:
        return served.wait(DESCRIBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_group(served.pid)
        served.wait()
        raise
