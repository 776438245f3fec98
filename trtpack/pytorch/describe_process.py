"""The caller's side of ``pytorch.describe``: its process started (torch and the user's code
stay out of the caller's), its result read back, and the description kept beside the stage cache
until one of the files it came from changes."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from trtpack.errors import MissingEnvironmentError, StageError, UserInputError
from trtpack.processes import python_module_command
from trtpack.sources.torch_sources import (
    DescribedSource,
    DescribeRequest,
    SourceFiles,
    memo_path,
    read_memo,
    write_memo,
)

DESCRIBE_TIMEOUT_S = 900


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
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        with open(log, "wb") as out:
            done = subprocess.run(
                python_module_command("trtpack.pytorch.describe", str(request_path),
                                      str(result_path)),
                stdout=out, stderr=subprocess.STDOUT, env=env, timeout=DESCRIBE_TIMEOUT_S,
                check=False)
        if not result_path.is_file():
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
            raise StageError("describe", f"loading the PyTorch model failed (exit "
                             f"{done.returncode}): {tail[-1] if tail else 'no output'}",
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
