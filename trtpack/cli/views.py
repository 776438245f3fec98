"""What the commands other than ``build`` show: doctor, targets, inspect, package, merge,
bench. Each view takes what the library returned and prints it on ``trtpack.cli.console``'s
consoles."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rich.markup import escape
from rich.table import Table

from trtpack.cli.console import fitted_table, out
from trtpack.machine.targets import engine_serves
from trtpack.report import BenchRow, ServedResult
from trtpack.shapes import ShapeProfile
from trtpack.timing import SLICES

if TYPE_CHECKING:
    from trtpack.bench.benchmark import BenchOutcome
    from trtpack.diagnostics.doctor import EnvironmentReport
    from trtpack.diagnostics.inspection import ConfigTensor, Inspection
    from trtpack.machine.local_targets import TargetRow
    from trtpack.serving.merge import MergeResult
    from trtpack.serving.package_formats import PackageResult


def print_json(data: object) -> None:  # json.dumps refuses what is not JSON
    """Plain JSON on stdout, never wrapped to the terminal's width."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def print_doctor(report: EnvironmentReport) -> None:
    table = Table(title="trtpack doctor")
    for col in ("component", "found", "needed for"):
        table.add_column(col)
    for item in report["components"]:
        found = f"[green]{item['version']}[/]" if item["version"] else "[red]missing[/]"
        # escape: purposes name extras in brackets ('trtpack[tensorrt-cu12]'), not markup
        table.add_row(escape(item["name"]), found, escape(item["purpose"]))
    out.print(table)
    for line in report["summary"]:
        out.print(f"• {line}", markup=False)


def print_targets(rows: list[TargetRow]) -> None:
    table = Table(title="targets (--target)")
    for col in ("target", "GPU", "sm", "architecture", "also", "here", "engines"):
        table.add_column(col)
    problems = []
    for r in rows:
        gpu = f"{r.gpu} {r.memory_gb} GB" if r.is_gpu else r.gpu
        engines = "—" if not r.is_gpu else "yes" if r.engine_problem is None else "no *"
        if r.engine_problem is not None:
            problems.append(r.engine_problem)
        table.add_row(r.name, gpu, r.compute_capability, r.architecture, ", ".join(r.aliases),
                      "[green]✓[/]" if r.local else "", engines)
    out.print(table)
    out.print("--target also takes an instance type (g5.xlarge), or 'auto' (this machine's "
              "GPU when it has TensorRT, else cpu). 'here': engines this machine can build.",
              markup=False)
    for problem in problems:
        out.print(f"* {problem}", markup=False)


class _ConfigTensor:
    """A config.pbtxt tensor (name, TYPE_*, dims) as ``io_table`` shows it."""

    def __init__(self, tensor: ConfigTensor, batched: bool) -> None:
        self.name = tensor["name"]
        dtype = tensor["data_type"].removeprefix("TYPE_").lower()  # as ONNX's view names it
        self.dtype = {"fp32": "float32", "fp16": "float16", "fp64": "float64",
                      "bf16": "bfloat16"}.get(dtype, dtype)
        axes = tensor.get("axes", tensor["dims"])  # named dynamic dims (older JSON: none)
        self.shape: list[str | int] = ["batch", *axes] if batched else [*axes]


class _ShownTensor(Protocol):
    """What ``io_table`` shows of a tensor (a ``TensorIO``, a config.pbtxt tensor)."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> Sequence[str | int]: ...


def io_table(inputs: Sequence[_ShownTensor], outputs: Sequence[_ShownTensor]) -> Table:
    table = Table(show_header=True, box=None, pad_edge=False)
    for col in ("", "tensor", "dtype", "shape"):
        table.add_column(col)
    for kind, tensors in (("input", inputs), ("output", outputs)):
        for t in tensors:
            table.add_row(kind, t.name, t.dtype,
                          escape(f"[{', '.join(str(d) for d in t.shape)}]"))
    return table


def print_inspection(result: Inspection) -> None:
    """What ``trtpack.diagnostics.inspection.inspect_path`` found: what the path is, where it
    came from, what each model serves (precision, inputs and outputs), whether it runs here."""
    from trtpack.diagnostics.inspection import KINDS

    mark = {True: "[green]yes[/]", False: "[red]no[/]", None: "[yellow]unknown[/]"}
    out.print(f"[bold]{escape(result.path)}[/]: {KINDS[result.kind]}")
    if result.build is not None:
        b = result.build
        out.print(f"  built by trtpack {b.trtpack_version or '?'} ({b.written_at}): "
                  f"{escape(b.model)}, precision {b.precision}, target {b.target}, "
                  f"profiles {escape(' '.join(b.short_profiles())) or '-'}, status {b.status}  "
                  f"[dim]{escape(b.root)}[/]")
        if b.served is not None:
            out.print(f"  serves {escape(b.served)}")
        for line in b.compile_check:
            out.print(f"  compile check: {escape(line)}", soft_wrap=True)  # as tests read it
    if result.onnx is not None:
        o = result.onnx
        weights = f"{o.weights_bytes / 2**20:,.1f} MB" if o.weights_bytes >= 2**20 else \
            f"{o.weights_bytes / 1024:,.1f} KB"
        out.print(f"  precision {o.precision}; opset {o.opset}, {o.nodes:,} nodes, weights "
                  f"{weights}; produced by {escape(o.producer)}")
        out.print(io_table(o.inputs, o.outputs))
        out.print(f"  runs on this machine (ONNX Runtime loads it): {mark[o.runs_here]}"
                  + "".join(f"\n    - {escape(r)}" for r in o.reasons))
    for model in result.models:
        instance_profiles = f", instance profiles {','.join(model.profiles)}" \
            if model.profiles else ""
        out.print(f"[bold]{model.name}[/] ({model.platform}, serves "
                  f"{model.precision or 'an unknown precision'}, max_batch_size "
                  f"{model.max_batch_size}, {model.instance_kind}{instance_profiles})  "
                  f"{escape(model.path)}")
        batched = model.max_batch_size > 0
        out.print(io_table([_ConfigTensor(t, batched) for t in model.inputs],
                           [_ConfigTensor(t, batched) for t in model.outputs]))
        if model.gpu_families:
            out.print("  serves GPU families (cc_model_filenames):")
            for fam in model.gpu_families:
                where = ", ".join(fam.targets) + (f" ({', '.join(fam.gpus)})" if fam.gpus else "")
                out.print(f"    compute capability {fam.compute_capability}: {fam.filename}"
                          f"  {escape(where) or 'no listed instance family'}"
                          + ("" if fam.present else "  [red]file missing[/]"))
                if fam.serves is not None:
                    out.print(f"      meant for {escape(fam.serves)}"
                              + (f"; not for {', '.join(fam.not_for)}" if fam.not_for else ""),)
        for problem in model.problems:
            out.print(f"  [red]config does not match the engine:[/] {problem}")
        if model.onnx is not None:
            loads = "[green]yes[/]" if model.onnx.runs_here else "[red]no[/]"
            out.print(f"  runs on this machine (ONNX Runtime loads {escape(model.onnx.path)}): "
                      f"{loads}" + "".join(f"\n    - {escape(r)}" for r in model.onnx.reasons))
        elif not model.engines and model.platform in ("onnxruntime_onnx", "onnxruntime"):
            out.print("  runs on this machine: [yellow]not checked[/] (inspect --check loads "
                      "it in ONNX Runtime)")
    for engine in result.all_engines():
        prov = engine.provenance
        out.print(f"[bold]engine[/] {engine.path}")
        if prov is not None:
            out.print(f"  built for {prov.target}: {prov.gpu_name} (sm {prov.compute_capability})"
                      f", TensorRT {prov.tensorrt_version}, CUDA {prov.cuda_runtime_version}, "
                      f"{prov.precision}, {prov.built_at}")
            out.print("  profiles " + escape(" ".join(
                str(ShapeProfile.from_dict(p)) for p in prov.profiles) or "-"))
            out.print(f"  plan sha256 {prov.plan_sha256[:16]}…, onnx sha256 "
                      f"{prov.onnx_sha256[:16]}…, options {prov.build_options}")
            out.print(f"  Triton: {escape(prov.triton_serving().summary())}")
            meant = engine_serves(prov.hardware_compatibility, prov.gpu_name, prov.cc)
            out.print(f"  meant for {escape(meant)}")
        if engine.io is not None:
            out.print(io_table(list(engine.io.inputs), list(engine.io.outputs)))
        out.print(f"  runs on this machine: {mark[engine.runs_here]}"
                  + "".join(f"\n    - {r}" for r in engine.reasons))


def print_sagemaker_package(result: PackageResult) -> None:
    for archive in result.archives:
        others = [m for m in archive.members if m != archive.entry]
        holds = f" (with {', '.join(others)})" if others else ""
        out.print(f"{archive.path}  [dim]serves model {archive.entry}{holds}[/]",
                  soft_wrap=True)
    out.print(f"container environment: {result.note}", soft_wrap=True)


def print_merge(result: MergeResult, as_json: bool) -> None:
    if as_json:
        print_json({"out_dir": str(result.out_dir), "model": result.name,
                    "engines": result.engines, "targets": result.targets,
                    "models": result.models})
        return
    for cc, file in result.engines.items():
        out.print(f"compute capability {cc} ({escape(result.targets[cc])}): {file}")
    out.print(f"[bold green]merged[/] → {escape(str(result.repository))}/{escape(result.name)}"
              f"  (models: {escape(', '.join(result.models))})", soft_wrap=True)


def _figure(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def benchmark_table(rows: Sequence[BenchRow]) -> Table:
    """Runtime rows per corner, with the speed-up against PyTorch eager when it was timed; a
    row whose timing is not to be trusted, and a ratio against one, marked ``?``
    (``unreliable_notes`` says why). Rows not timed are left to ``untimed_notes``."""
    timed = [r for r in rows if r.status == "ok"]
    ratios = any(r.speedup_vs_pytorch is not None for r in timed)
    table = fitted_table("benchmark: latency per request (ms) at every profile corner",
                         [("corner", "key"), ("runtime", "text"), ("p50", "num"),
                          ("spread", "num"), ("p99", "num"), ("per s", "num"),
                          *([("vs eager", "num")] if ratios else [])])
    previous = None
    for r in timed:
        shape = r.shapes.split(",")[0].split("=", 1)[-1]
        corner = f"p{r.profile} {r.corner}\n{shape}"
        shown, previous = ("" if corner == previous else corner), corner
        speed = "" if r.speedup_vs_pytorch is None else f"{r.speedup_vs_pytorch:.2f}x"
        if speed and r.speedup_unreliable:
            speed = f"[yellow]{speed}?[/]"
        elif r.runtime == "served" and speed:
            speed = f"[bold]{speed}[/]"
        p50 = _figure(r.p50_ms, ".2f") + ("[yellow]?[/]" if r.unreliable else "")
        throughput = r.throughput or 0.0
        per_s = f"{throughput:,.0f}" if throughput >= 100 else f"{throughput:.1f}"
        table.add_row(shown, escape(r.engine), p50, _figure(r.spread, ".0%"),
                      _figure(r.p99_ms, ".2f"), per_s, *([speed] if ratios else []))
    return table


def untimed_notes(rows: Sequence[BenchRow]) -> list[str]:
    """One line per runtime and reason of the rows not timed (skipped or failed), with the
    corners they cover: ``PyTorch eager: skipped at every corner: not asked for``."""
    corners = {(r.profile, r.corner) for r in rows}
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        if r.status != "ok":
            grouped.setdefault((r.engine, r.status, r.reason), []).append(
                f"p{r.profile} {r.corner}")
    return [f"{engine}: {status} at "
            f"{'every corner' if len(where) == len(corners) else ', '.join(where)}: {reason}"
            for (engine, status, reason), where in grouped.items()]


def unreliable_notes(rows: Sequence[BenchRow]) -> list[str]:
    """One line per row marked ``?``: which row, and why its timing is not to be trusted."""
    return [f"p{r.profile} {r.corner} {r.engine}: {r.unreliable}"
            for r in rows if r.status == "ok" and r.unreliable]


def served_table(served: ServedResult) -> Table:
    table = Table(title=f"served through Triton at {served.url} (perf_analyzer)")
    for col in ("model", "backend", "batching", "corner", "batch", "concurrency", "infer/s",
                "p50 ms", "p99 ms"):
        table.add_column(col, justify="right" if col in ("batch", "concurrency", "infer/s",
                                                         "p50 ms", "p99 ms") else "left")
    for r in served.rows:
        table.add_row(r.model, r.backend, r.batching, str(r.corner), str(r.batch),
                      str(r.concurrency), f"{r.throughput:,.1f}", f"{r.p50_ms:.2f}",
                      f"{r.p99_ms:.2f}")
    return table


def print_benchmark(measured: BenchOutcome, out_dir: Path) -> None:
    """What ``trtpack bench`` measured."""
    result, served = measured.result, measured.served
    if result is not None:
        m = result.machine
        out.print(f"machine: {m['cpu']}, {m['logical_cores']} cores, "
                  f"{'GPU ' + m['gpu'] if m['gpu'] else 'no GPU'}; {result.threads} threads, "
                  f"{result.seconds_per_row:g} s per row in {SLICES} rounds taken in rotation; "
                  f"load average {m['load_average']}", markup=False)
        out.print(f"threads: {result.thread_policy}", markup=False)
        rows = result.rows
        out.print(benchmark_table(rows))
        for line in untimed_notes(rows):
            out.print(escape(line))
        doubts = unreliable_notes(rows)
        if doubts:
            out.print("[bold yellow]?[/] not to be trusted, nor any ratio against it "
                      "(re-run on a quieter machine):")
            for line in doubts:
                out.print(f"  {escape(line)}")
        for note in result.notes:
            out.print(f"[bold yellow]note:[/] {escape(note)}")
    if served is not None:
        out.print(served_table(served))
    out.print(f"saved in {out_dir}/report.json (benchmark) and {out_dir}/report.html")
