"""Served throughput: perf_analyzer against a running Triton that serves a build's repository.

For every profile corner, the main model is measured over a concurrency sweep with the real
token ids trtpack wrote under ``tuning/`` (``perf_inputs_p<profile>_<corner>.json``), and a
``--serve text`` ensemble with the sentences in ``tuning/perf_text_inputs.json``. With
``compare_batching`` the sweep is repeated after loading a variant of the served config
without ``dynamic_batching`` (Triton's repository API with a config override; the server must
run with ``--model-control-mode=explicit``); the original config is loaded back afterwards.

The server is checked first (a few seconds at most): unreachable, or not serving the model,
is a one-line ``MissingEnvironmentError`` (exit 3); a malformed URL is exit 2.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from trtpack.bench.timing import ProgressFn
from trtpack.cases import load_cases
from trtpack.errors import MissingEnvironmentError, UserInputError
from trtpack.pipeline.build_folder import BuildFolder
from trtpack.report import JsonObject, JsonValue, ServedResult, ServedRow
from trtpack.shapes import CORNERS

CHECK_TIMEOUT_S = 3.0
DEFAULT_CONCURRENCY = (1, 2, 4)
PERF_ANALYZER_ENV = "TRTPACK_PERF_ANALYZER"
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")
# perf_analyzer's words for "these windows do not agree / hold no request": run again with a
# longer window (Model Analyzer's rule, see run_perf_analyzer)
UNSTABLE_MESSAGES = ("Failed to obtain stable measurement", "Please use a larger time window")
STABILITY_RETRIES = 3
WINDOW_STEP_MS = 1000


def normalize_url(url: str) -> str:
    """``host:port`` (what perf_analyzer takes) from ``http://host:port`` or ``host:port``."""
    parsed = urllib.parse.urlsplit(url if "//" in url else f"http://{url}")
    if parsed.scheme != "http":
        raise UserInputError(f"--served '{url}': only Triton's HTTP endpoint (http://host:port) "
                             "is supported")
    try:
        port = parsed.port
    except ValueError:
        port = None
    if not parsed.hostname or port is None or parsed.path not in ("", "/"):
        raise UserInputError(f"--served '{url}' is not host:port (e.g. localhost:8000)")
    return f"{parsed.hostname}:{port}"


class TritonHttp:
    """The few calls of Triton's HTTP/REST API bench needs, each with a short timeout."""

    def __init__(self, hostport: str, timeout: float = CHECK_TIMEOUT_S) -> None:
        self.base = f"http://{hostport}"
        self.timeout = timeout
        # straight to the server, as perf_analyzer is sent (no proxy from the environment)
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def request(self, path: str, body: JsonValue = None, timeout: float | None = None
                ) -> tuple[int, JsonValue]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data,
                                     method="GET" if body is None else "POST")
        try:
            with self.opener.open(req, timeout=timeout or self.timeout) as r:
                raw = r.read()
                status = int(r.status)
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        text = raw.decode(errors="replace")
        try:
            return status, json.loads(text) if text else None
        except json.JSONDecodeError:
            return status, text

    def check_model(self, model: str) -> JsonObject:
        """The model's config as the server has it; exit 3 when the server or model is not
        there."""
        try:
            status, _ = self.request("/v2/health/live")
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            raise MissingEnvironmentError(
                f"no Triton server answers at {self.base} ({reason})",
                hint="start tritonserver on the build's model_repository, or pass its HTTP "
                "address (default port 8000)") from None
        if status != 200:
            raise MissingEnvironmentError(f"{self.base} is not a live Triton server (HTTP "
                                          f"{status} on /v2/health/live)")
        status, _ = self.request(f"/v2/models/{urllib.parse.quote(model)}/ready")
        if status != 200:
            raise MissingEnvironmentError(
                f"the Triton server at {self.base} does not serve model '{model}' (not "
                "ready)", hint="start it on the build's model_repository")
        status, config = self.request(f"/v2/models/{urllib.parse.quote(model)}/config")
        if status != 200 or not isinstance(config, dict):
            raise MissingEnvironmentError(f"cannot read the config of '{model}' from "
                                          f"{self.base} (HTTP {status})")
        return config

    def load(self, model: str, config: JsonObject | None) -> None:
        body: JsonObject = {}
        if config is not None:
            body = {"parameters": {"config": json.dumps(config)}}
        status, reply = self.request(f"/v2/repository/models/{urllib.parse.quote(model)}/load",
                                     body, timeout=120.0)
        if status != 200:
            error = reply.get("error") if isinstance(reply, dict) else reply
            raise MissingEnvironmentError(
                f"the server did not load a config variant of '{model}' ({error})",
                hint="--compare-batching needs tritonserver --model-control-mode=explicit")


def perf_analyzer_path() -> str:
    """perf_analyzer: ``$TRTPACK_PERF_ANALYZER``, else the ``perf-analyzer`` package's
    (beside this Python), else the one on PATH."""
    given = os.environ.get(PERF_ANALYZER_ENV)
    if given:
        if not os.access(given, os.X_OK):
            raise MissingEnvironmentError(f"{PERF_ANALYZER_ENV}={given} is not an executable")
        return given
    beside = Path(sys.executable).parent / "perf_analyzer"
    found = str(beside) if beside.is_file() else shutil.which("perf_analyzer")
    if found is None:
        raise MissingEnvironmentError(
            "perf_analyzer is not installed here",
            hint="pip install 'trtpack[bench]' (perf-analyzer needs glibc 2.38+), or set "
            f"{PERF_ANALYZER_ENV} (make perf-analyzer-env builds one for older systems)")
    return found


def input_data_files(build: BuildFolder, dest: Path) -> dict[tuple[int, str], Path]:
    """The perf_analyzer input files per (profile, corner): the ones the package stage wrote
    under tuning/, else written now to ``dest`` from the same reference cases."""
    from trtpack.serving.tuning import perf_input_data_name, write_perf_input_data

    cases = load_cases(build.reference)
    tuning = build.root / "tuning"
    files = {(c.profile, c.corner): tuning / perf_input_data_name(c.profile, c.corner)
             for c in cases}
    if all(p.is_file() for p in files.values()):
        return files
    written = write_perf_input_data(dest, cases)
    return {(c.profile, c.corner): p for c, p in zip(cases, written, strict=True)}


def run_perf_analyzer(binary: str, hostport: str, model: str, batch: int, data: Path,
                      concurrency: int, window_ms: int, workdir: Path,
                      say: ProgressFn | None = None) -> tuple[dict[str, float], int]:
    """One perf_analyzer measurement: the CSV row of that concurrency, and the window (ms) it
    was measured on.

    perf_analyzer exits 2 when its windows do not agree ("Failed to obtain stable
    measurement") or hold no request ("Please use a larger time window"), which a busy
    machine causes: as Model Analyzer does (``_auto_adjust_parameters`` in
    model_analyzer/perf_analyzer/perf_analyzer.py), it runs again with a window
    ``WINDOW_STEP_MS`` longer, ``STABILITY_RETRIES`` times at most; any other failure is not
    retried."""
    csv_path = workdir / f"pa-{model}-{batch}-{concurrency}-{data.stem}.csv"
    for attempt in range(STABILITY_RETRIES + 1):
        csv_path.unlink(missing_ok=True)
        cmd = [binary, "-m", model, "-u", hostport, "-i", "http", "-b", str(batch),
               "--input-data", str(data), "--concurrency-range", f"{concurrency}:{concurrency}",
               "--measurement-interval", str(window_ms), "--stability-percentage", "100",
               "--max-trials", "5", "-f", str(csv_path)]
        timeout = 30 + 10 * window_ms / 1000
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  cwd=workdir, env=_without_proxies(os.environ))
        except subprocess.TimeoutExpired:
            raise MissingEnvironmentError(f"perf_analyzer on '{model}' did not finish in "
                                          f"{timeout:.0f} s") from None
        output = done.stdout + done.stderr
        if done.returncode == 0 and csv_path.is_file():
            break
        if attempt < STABILITY_RETRIES and any(m in output for m in UNSTABLE_MESSAGES):
            window_ms += WINDOW_STEP_MS
            if say is not None:
                say(f"perf_analyzer found no stable measurement on '{model}' (concurrency "
                    f"{concurrency}): again with a {window_ms} ms window")
            continue
        tail = output.strip().splitlines()[-3:]
        raise MissingEnvironmentError(f"perf_analyzer failed on '{model}' (exit "
                                      f"{done.returncode}): {' | '.join(tail)}")
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise MissingEnvironmentError(f"perf_analyzer wrote no measurement for '{model}'")
    row = rows[-1]
    us = 1e-3  # perf_analyzer's CSV is in microseconds

    def ms(column: str) -> float:
        return float(row.get(column) or "nan") * us

    return {"throughput": float(row["Inferences/Second"]), "p50_ms": ms("p50 latency"),
            "p90_ms": ms("p90 latency"), "p99_ms": ms("p99 latency"),
            "server_queue_ms": ms("Server Queue"),
            "server_infer_ms": ms("Server Compute Infer")}, window_ms


def _without_proxies(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k.lower() not in PROXY_VARIABLES}


def _backend(config: JsonObject) -> str:
    return str(config.get("backend") or config.get("platform") or "unknown")


def served_benchmark(build: BuildFolder, url: str, *,
                     concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
                     seconds: float = 2.0, compare_batching: bool = False,
                     corners: Sequence[str] = ("min", "opt", "max"),
                     progress: ProgressFn | None = None) -> ServedResult:
    """Throughput and latency of the served model through Triton at every profile corner
    and concurrency (and the ensemble's, for ``--serve text``); the report's
    ``benchmark.served`` section."""
    say = progress or (lambda message: None)
    if len(concurrency) < 1 or any(c < 1 for c in concurrency):
        raise UserInputError("--concurrency takes positive integers, e.g. 1,2,4")
    unknown = [c for c in corners if c not in CORNERS]
    if unknown or not corners:
        raise UserInputError(f"--corners takes min, opt and max, not {', '.join(unknown)}")
    hostport = normalize_url(url)
    server = TritonHttp(hostport)
    model = build.report.model
    config = server.check_model(model)
    binary = perf_analyzer_path()
    ensembles = [p.name for p in sorted((build.root / "model_repository").iterdir())
                 if p.name.endswith("_ensemble") and p.name.startswith(model)]
    for ensemble in ensembles:
        server.check_model(ensemble)
    window_ms = max(200, int(seconds * 1000))
    declared = config.get("max_batch_size")  # a JSON number (0: not batched)
    max_batch = int(declared) if isinstance(declared, int | float | str) else 0
    configured = "dynamic" if config.get("dynamic_batching") is not None else "none"
    variants: list[tuple[str, JsonObject | None]] = [(configured, None)]
    if compare_batching:
        if config.get("dynamic_batching") is None:
            raise UserInputError(f"'{model}' is served without dynamic batching: nothing to "
                                 "compare (--compare-batching)")
        variants.append(("none", {k: v for k, v in config.items()
                                  if k != "dynamic_batching"}))
    rows: list[ServedRow] = []
    with tempfile.TemporaryDirectory(prefix="trtpack-bench-") as tmp:
        workdir = Path(tmp)
        data_files = input_data_files(build, workdir)
        cases = {(c.profile, c.corner): c for c in load_cases(build.reference)}
        try:
            for batching, variant in variants:
                if variant is not None:
                    say(f"loading '{model}' without dynamic batching")
                    server.load(model, variant)
                for (profile, corner), data in data_files.items():
                    if corner not in corners:
                        continue
                    first = next(iter(cases[(profile, corner)].inputs.values()))
                    batch = int(first.shape[0]) if max_batch > 0 else 1
                    for c in concurrency:
                        say(f"perf_analyzer {model} p{profile} {corner} batch {batch}, "
                            f"concurrency {c} ({batching} batching)")
                        m, used_ms = run_perf_analyzer(binary, hostport, model, batch, data,
                                                       c, window_ms, workdir, say)
                        rows.append(ServedRow(model, _backend(config),
                                              batching if max_batch > 0 else "unbatched model",
                                              profile, corner, batch, c, **m,
                                              window_ms=used_ms))
        finally:
            if compare_batching:
                say(f"loading '{model}' with its own config again")
                server.load(model, config)
        text_data = build.root / "tuning" / "perf_text_inputs.json"
        for ensemble in ensembles if text_data.is_file() else []:
            for c in concurrency:
                say(f"perf_analyzer {ensemble} (text in), concurrency {c}")
                m, used_ms = run_perf_analyzer(binary, hostport, ensemble, 1, text_data, c,
                                               window_ms, workdir, say)
                rows.append(ServedRow(ensemble, "ensemble", "as configured", None, "text", 1,
                                      c, **m, window_ms=used_ms))
    return ServedResult(hostport, rows, perf_analyzer=_version(binary), window_ms=window_ms,
                        concurrency=list(concurrency))


def _version(binary: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version("perf-analyzer")
    except metadata.PackageNotFoundError:
        return os.path.basename(binary)
