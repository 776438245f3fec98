"""What the machine did to a build, as one sentence: a full disk (ENOSPC, EDQUOT) names the
path, the free space and what the build needs; a stage process killed by SIGKILL says whether
the kernel's out-of-memory killer did it (the cgroup's ``memory.events`` counts its kills),
else the signal with the peak memory against what was available."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

from trtpack.errors import StageError, TrtpackError
from trtpack.onnx_tools.files import model_bytes
from trtpack.options import BuildPlan
from trtpack.out_files import ARTIFACTS, LOGS

# how many copies of the weights a build writes: export, simplify, precision or engine
WEIGHT_COPIES = 3


def weight_bytes(plan: BuildPlan, work: Path) -> int | None:
    """The model's weights in bytes, from what is known: the exported or imported ONNX, the
    user's ONNX, or the weight files of a local model directory."""
    for stage in ("export", "import"):
        onnx = work / ARTIFACTS / stage / "model.onnx"
        if (work / LOGS / f"{stage}.log").is_file() and onnx.is_file() and \
                (work / ARTIFACTS / stage / "reference.npz").is_file():  # the stage finished
            return model_bytes(onnx)
    source = plan.recipe.source
    if source.onnx and Path(source.onnx).is_file():
        return model_bytes(Path(source.onnx))
    if plan.random_weights:
        from trtpack.pytorch.models import random_weight_bytes

        try:
            return random_weight_bytes(plan.recipe)
        except (TrtpackError, ImportError, ValueError, TypeError, OSError):  # an estimate only
            return None
    folders = [Path(source.path)] if source.path else []
    if source.package:
        from trtpack.pytorch.models import source_directory

        with contextlib.suppress(TrtpackError, ImportError, OSError):
            folders += [p for p in [source_directory(source)] if p is not None]
    if source.hf_id:  # the local Hugging Face cache's snapshots of it
        hub = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
        folders += list((hub / f"models--{source.hf_id.replace('/', '--')}").glob(
            "snapshots/*"))
    sizes = [sum(p.stat().st_size for p in folder.iterdir()
                 if p.suffix in (".safetensors", ".bin", ".pt"))
             for folder in folders if folder.is_dir()]
    return max(sizes) if sizes and max(sizes) > 0 else None


def mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MB" if n >= 2**20 else f"{n / 2**10:,.0f} KB"


def disk_full_message(cause: OSError, where: Path, free_at: Path, weights: int | None,
                      written: int) -> str:
    """``where`` is the file or folder being written; ``free_at`` a path on its filesystem."""
    free = shutil.disk_usage(free_at).free
    what = "no space left on device" if cause.errno == errno.ENOSPC else "disk quota exceeded"
    if weights is not None:
        need = (f"the build needs about {mb(WEIGHT_COPIES * weights)} "
                f"({WEIGHT_COPIES} x the model's {mb(weights)} of weights)")
    else:
        need = f"the build needs more than the {mb(written)} it wrote before the disk filled"
    return f"{what} writing {where}: {mb(free)} free, {need}"


def _cgroup_dir() -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return Path("/sys/fs/cgroup") / line[3:].lstrip("/")
    return None


def oom_kills(cgroup: Path | None = None) -> int | None:
    """The cgroup's count of out-of-memory kills (``memory.events``' ``oom_kill``)."""
    folder = cgroup or _cgroup_dir()
    if folder is None:
        return None
    try:
        text = (folder / "memory.events").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return None


def available_bytes(cgroup: Path | None = None) -> int:
    """Memory this build may use: the cgroup's ``memory.max``, or the machine's."""
    import psutil

    total = int(psutil.virtual_memory().total)
    folder = cgroup or _cgroup_dir()
    if folder is not None:
        try:
            limit = (folder / "memory.max").read_text().strip()
        except OSError:
            limit = "max"
        if limit.isdigit():
            return min(total, int(limit))
    return total


def killed_message(stage: str, signal_number: int, oom_before: int | None,
                   oom_after: int | None, peak_mb: float | None,
                   cgroup: Path | None = None) -> str:
    """Why a stage's process ended by a signal, saying only what is known."""
    if oom_before is not None and oom_after is not None and oom_after > oom_before:
        return (f"the {stage} process was killed by the kernel's out-of-memory killer "
                f"(peak {(peak_mb or 0) / 1024:.1f} GB of "
                f"{available_bytes(cgroup) / 2**30:.1f} GB available)")
    peak = f"peak {peak_mb / 1024:.1f} GB" if peak_mb is not None else "peak unknown"
    return (f"the {stage} process was killed by signal {signal_number} ({peak} of "
            f"{available_bytes(cgroup) / 2**30:.1f} GB available)")


def disk_full_error(cause: OSError, plan: BuildPlan, work: Path, out: Path,
                    stage: str | None) -> StageError:
    """The sentence for a full disk; the partial artifacts are removed (the failed
    folder keeps the report and the logs)."""
    weights = weight_bytes(plan, work)
    written = sum(f.stat().st_size for f in work.rglob("*") if f.is_file())
    for entry in work.iterdir():  # all but the logs: the report is written next
        if entry.name != LOGS:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink()
    where: Path = Path(cause.filename) if cause.filename else work
    if where.is_relative_to(work):  # the build's temporary folder: name OUT
        where = out
    free_at = where if where.is_dir() else where.parent if where.parent.is_dir() \
        else out.parent
    message = disk_full_message(cause, where, free_at, weights, written)
    return StageError(stage or "write", message,
                      log_path=work / LOGS / f"{stage}.log"
                      if stage else None)
