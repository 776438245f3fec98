"""A real tritonserver for the tests: the binary that nvidia-pytriton bundles (Triton 2.51).

It lives in its own venv (``make triton-env`` -> ``.venv-triton``: nvidia-pytriton needs
numpy<2), and has only the Python backend: TensorRT and ONNX Runtime models cannot load.
How it starts without pytriton's own launcher: the Python backend's stub for this Python
version is linked beside the backend library in a private backends folder, the venv's
``bin`` goes first on PATH (so the stub's interpreter finds the venv's packages), and
LD_LIBRARY_PATH gets the Python installation's ``lib`` and the wheel's ``nvidia_pytriton.libs``.
The server listens on 127.0.0.1 only, on free ports; ``stop`` always ends it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


def triton_venv() -> Path:
    return Path(os.environ.get("TRTPACK_TRITON_VENV", str(ROOT / ".venv-triton")))


def _site_packages(venv: Path) -> Path | None:
    found = sorted(venv.glob("lib/python3.*/site-packages/pytriton"))
    return found[0].parent if found else None


def missing_reason() -> str | None:
    """Why the server cannot start here (None when it can)."""
    venv = triton_venv()
    site = _site_packages(venv)
    if site is None:
        return (f"no nvidia-pytriton venv at {venv}: run `make triton-env` (or set "
                "TRTPACK_TRITON_VENV)")
    if not (site / "pytriton" / "tritonserver" / "bin" / "tritonserver").is_file():
        return f"{site}/pytriton has no bundled tritonserver binary"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _python_version(venv: Path) -> str:
    site = _site_packages(venv)
    assert site is not None
    return site.parent.name.removeprefix("python")  # lib/python3.11/site-packages


def _backends_dir(site: Path, workdir: Path, version: str) -> Path:
    """backends/python/ with the library, its utils and the stub for this Python."""
    dist = site / "pytriton" / "tritonserver"
    backends = workdir / "backends"
    python = backends / "python"
    python.mkdir(parents=True, exist_ok=True)
    links = {
        "libtriton_python.so": dist / "backends" / "python" / "libtriton_python.so",
        "triton_python_backend_utils.py":
            dist / "backends" / "python" / "triton_python_backend_utils.py",
        "triton_python_backend_stub":
            dist / "python_backend_stubs" / version / "triton_python_backend_stub",
    }
    for name, target in links.items():
        link = python / name
        if not link.exists():
            link.symlink_to(target)
    for other in bundled_backends() - {"python"}:  # as they are, should a bundle ship more
        link = backends / other
        if not link.exists():
            link.symlink_to(dist / "backends" / other)
    return backends


def bundled_backends() -> set[str]:
    """The backends the bundled tritonserver has (Triton 2.51 in pytriton 0.7.0: python)."""
    site = _site_packages(triton_venv())
    folder = site / "pytriton" / "tritonserver" / "backends" if site else None
    return {p.name for p in folder.iterdir() if p.is_dir()} if folder and folder.is_dir() \
        else set()


@dataclass
class TritonServer:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log_path: Path
    start_seconds: float = 0.0

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def client(self):  # type: ignore[no-untyped-def]
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(self.http_url, network_timeout=60.0,
                                                connection_timeout=10.0)

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
            return int(r.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def hide_packages(folder: Path, names: Sequence[str]) -> Path:
    """Make ``import <name>`` fail in ``folder``'s Python processes, as if the package were
    not installed, for each of ``names``: a package of that name that raises
    ModuleNotFoundError, in ``folder``. The Python backend's stub embeds its interpreter
    with PYTHONPATH ignored, but its ``sys.path`` starts with ``''``, its working folder
    (the server's), so a package there shadows the venv's copy."""
    for name in names:
        package = folder / name
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}' (hidden by the test)\", "
            f"name={name!r})\n", encoding="utf-8")
    return folder


def start_tritonserver(repository: Path, workdir: Path, *, cache_bytes: int = 0,
                       explicit: bool = False, hidden: Sequence[str] = ()) -> TritonServer:
    """Start tritonserver on ``repository`` (every model loaded); wait until it is ready.

    ``cache_bytes`` > 0 starts the local response cache (for configs that enable it);
    ``explicit`` lets clients load models and config variants (``--model-control-mode
    explicit``, every model loaded at start); ``hidden`` packages cannot be imported by the
    Python-backend models (``hide_packages``: a stock Triton image's Python lacks them)."""
    reason = missing_reason()
    if reason is not None:
        raise RuntimeError(reason)
    venv = triton_venv()
    site = _site_packages(venv)
    assert site is not None
    workdir.mkdir(parents=True, exist_ok=True)
    backends = _backends_dir(site, workdir, _python_version(venv))
    binary = site / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    libdirs = [sysconfig.get_config_var("LIBDIR") or "", str(site / "nvidia_pytriton.libs")]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(p for p in [*libdirs, env.get("LD_LIBRARY_PATH", "")] if p)
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    env["HF_HUB_OFFLINE"] = "1"
    if hidden:
        hide_packages(workdir, hidden)  # the server's, so its stubs', working folder
    http_port, grpc_port, metrics_port = _free_port(), _free_port(), _free_port()
    log_path = workdir / "tritonserver.log"
    cmd = [
        str(binary), f"--model-repository={repository}", f"--backend-directory={backends}",
        "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
        f"--http-port={http_port}", f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}", "--allow-metrics=false", "--allow-gpu-metrics=false",
        "--strict-readiness=true", "--exit-timeout-secs=10",
        "--backend-config=python,shm-default-byte-size=4194304",
    ]
    if explicit:
        cmd += ["--model-control-mode=explicit", "--load-model=*"]
    if cache_bytes > 0:
        cmd += [f"--cache-directory={site / 'pytriton' / 'tritonserver' / 'caches'}",
                f"--cache-config=local,size={cache_bytes}"]
    started = time.perf_counter()
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   cwd=workdir, start_new_session=True)
    server = TritonServer(process, http_port, grpc_port, log_path)
    deadline = started + START_TIMEOUT_S
    while time.perf_counter() < deadline:
        if process.poll() is not None:
            errors = [line for line in server.log().splitlines() if line.startswith("E")]
            raise RuntimeError(f"tritonserver exited with {process.returncode}:\n"
                               + "\n".join(errors[:20]) + "\n...\n" + server.log()[-4000:])
        if _ready(http_port):
            server.start_seconds = time.perf_counter() - started
            return server
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"tritonserver not ready after {START_TIMEOUT_S:.0f} s:\n"
                       + server.log()[-4000:])
