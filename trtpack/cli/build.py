"""``trtpack build``: a typer command over ``trtpack.api.build``; ``trtpack.cli.console`` shows
its progress and summary."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from trtpack.cli.console import ProgressView, err, print_build_summary, print_warning
from trtpack.cli.exits import handle_errors
from trtpack.sources.heads import task_help

commands = typer.Typer()


@commands.command()
@handle_errors
def build(
    model: Annotated[str, typer.Argument(
        metavar="MODEL",
        help="A recipe name (trtpack recipes list), a recipe YAML file, an ONNX file, a "
        "local Hugging Face model directory, an org/name id in the local Hugging Face "
        "cache, a PyTorch factory (path/to/file.py:make_model or my_pkg.models:make_model), "
        "a torch.export file (model.pt2) or a TorchScript file (model.pt, model.jit).")],
    profile: Annotated[list[str] | None, typer.Option(
        "--profile", "-p", metavar="MIN:OPT:MAX",
        help="Shape profile MIN:OPT:MAX over the dynamic axes, e.g. 1x128:16x128:128x128 "
        "(batch x sequence), or per input: 'input_ids=1x128:16x128:128x128,...'. Repeat for "
        "several optimization profiles. Default: the recipe's.")] = None,
    precision: Annotated[str | None, typer.Option(
        metavar="fp32|fp16|int8|auto",
        help="fp32, fp16 (ModelOpt AutoCast), int8 (ModelOpt Q/DQ), or auto (CPU: build fp32 "
        "and int8, time both, keep the fastest that passes). Default: the recipe's."
    )] = None,
    target: Annotated[str, typer.Option(
        metavar="TARGET",
        help="cpu, an instance family (g4dn, g5, p4d, p5 …; see trtpack targets), or auto "
        "(the local GPU if it has TensorRT, else cpu).")] = "auto",
    opset: Annotated[int | None, typer.Option(
        metavar="N", help="ONNX opset. Default: the recipe's.")] = None,
    random_weights: Annotated[bool, typer.Option(
        "--random-weights", help="Build from the recipe's architecture config with random "
        "weights (no weight download).")] = False,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", metavar="DIR",
        help="Output folder (default build/<name>); replaced only when the build succeeds.")
    ] = None,
    no_engine: Annotated[bool, typer.Option(
        "--no-engine", help="Stop before the TensorRT engine (everything else is built).")
    ] = False,
    calibration: Annotated[Path | None, typer.Option(
        metavar="FILE",
        help="INT8 calibration data: a text file (one sample a line), a "
        ".jsonl (its \"text\" field, one object a line) or a .npz of inputs.")
    ] = None,
    fallback: Annotated[str, typer.Option(
        metavar="auto|off",
        help="auto: keep sensitive nodes in higher precision until verification passes; off."
    )] = "auto",
    serve: Annotated[str | None, typer.Option(
        metavar="tensor|text",
        help="tensor: clients send tensors; text: add a tokenizer and post-processing "
        "ensemble so clients send text. Default: the recipe's (triton.serve).")] = None,
    fallback_cpu: Annotated[bool | None, typer.Option(
        "--fallback-cpu/--no-fallback-cpu", help="Also emit an ONNX Runtime model with CPU "
        "instances beside a TensorRT model. Default: the recipe's.")] = None,
    portable: Annotated[str | None, typer.Option(
        metavar="MODE",
        help="Engine hardware compatibility: ampere+ (runs on any GPU of compute capability "
        "8.0+, a little slower) or same_compute_capability. Default: the recipe's.")] = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE",
        help="Override a recipe setting; repeatable, VALUE is YAML. E.g. "
        "triton.instance_count=2, triton.max_queue_delay_us=500, triton.response_cache=true; "
        "every key: trtpack recipes show NAME.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(
        metavar="DIR",
        help="Stage cache folder (default ~/.cache/trtpack, or $TRTPACK_CACHE_DIR).")] = None,
    task: Annotated[str | None, typer.Option(metavar="TASK", help=task_help())] = None,
    no_cache: Annotated[bool, typer.Option(
        "--no-cache", help="Rebuild every stage.")] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the report as JSON instead of the summary.")] = False,
    timing_cache: Annotated[Path | None, typer.Option(
        "--timing-cache", metavar="DIR",
        help="A TensorRT timing-cache folder to share (e.g. across a CI matrix): one file per "
        "GPU (model and compute capability) and TensorRT version, read and updated; sha256 "
        "before/after in the report. Default: under --cache-dir.")] = None,
    calibration_method: Annotated[str | None, typer.Option(
        metavar="max|entropy|percentile",
        help="INT8 activation ranges: max, entropy or percentile (99.99th). Default: the "
        "recipe's (precision_options.int8.calibration_method).")] = None,
    tokenizer: Annotated[Path | None, typer.Option(
        metavar="PATH",
        help="The tokenizer, when it is not beside the model (e.g. an ONNX file from "
        "elsewhere): a folder with tokenizer.json or vocab.txt, or that file. Verification "
        "then draws real token ids, and --serve text works.")] = None,
    min_int8_share: Annotated[float, typer.Option(
        metavar="SHARE",
        help="INT8: ship only when at least this share of the served model's MatMul/Gemm "
        "runs in INT8, counted as it runs (GPU: MatMul/Gemm with Q/DQ inputs; CPU: weight "
        "MatMuls on ONNX Runtime's integer kernels), else exit 1 naming the share.")] = 0.5,
    force: Annotated[bool, typer.Option(
        "--force", help="Build into an --out that holds files trtpack did not write: they are "
        "kept (never deleted), the build's files are written beside them.")] = False,
    input_options: Annotated[list[str] | None, typer.Option(
        "--input", metavar="NAME=...",
        help="What an input is and which values it takes; repeatable. NAME=DTYPE[DIM,...] "
        "(input=float32[batch,3,224,224]: a DIM a size or an axis name, [] a scalar), "
        "NAME=VALUE (a constant: sr=16000), NAME=LOW..HIGH (a range: pixels=0..1; whole "
        "numbers for an integer input), or NAME=DTYPE[DIM,...]=VALUE. A constant stays a "
        "served input: it is fed in verification and calibration and to perf_analyzer.")
    ] = None,
    sample_inputs: Annotated[Path | None, typer.Option(
        "--sample-inputs", metavar="FILE.npz",
        help="Real inputs for verification (and INT8 calibration unless --calibration is "
        "given): one array per input named by it, the batch on the first axis, a scalar as a "
        "0-d array. Used at each profile corner its sizes fit; checked before any work.")
    ] = None,
    skip_memory_check: Annotated[bool, typer.Option(
        "--skip-memory-check", help="Build even when the memory estimate of a profile corner "
        "(weights plus activations at its shapes, per stage) exceeds the memory available "
        "here (the cgroup's limit, else MemAvailable).")] = False,
    bench: Annotated[bool, typer.Option(
        "--bench", help="After packaging, measure latency per profile corner against PyTorch "
        "(trtpack bench).")] = False,
) -> None:
    """Export, simplify, convert precision, build the engine, verify and package a model.

    \b
    Examples (on any machine, offline):
      trtpack build minilm --target cpu
      trtpack build minilm --precision int8 --calibration lines.txt --target cpu
      trtpack build minilm --serve text --set triton.instance_count=2 --target cpu
      trtpack build silero_vad.onnx --input sr=16000 --target cpu
    With an NVIDIA GPU and TensorRT:
      trtpack build bert-large --random-weights --profile 1x128:16x128:128x128 \\
        --target g5
    """
    from trtpack.api import BuildRequest
    from trtpack.api import build as build_model

    request = BuildRequest(
        model=model, profiles=profile or [], precision=precision, target=target, opset=opset,
        random_weights=random_weights, out=out_dir, build_engine=not no_engine,
        calibration=calibration, fallback=fallback, serve=serve, fallback_cpu=fallback_cpu,
        cache_dir=cache_dir, use_cache=not no_cache, portable=portable,
        overrides=overrides or [], timing_cache=timing_cache, task=task,
        calibration_method=calibration_method, tokenizer=tokenizer,
        min_int8_share=min_int8_share,
        force=force, skip_memory_check=skip_memory_check, inputs=input_options or [],
        sample_inputs=sample_inputs,
    )
    view = ProgressView(err, enabled=not as_json)
    try:
        built = build_model(request, view, on_warning=print_warning)
    finally:
        view.stop()
    if as_json:
        report = built.report
        if bench:
            from trtpack.cli.outputs import run_bench

            report = run_bench(built.out_dir, show=False)
        sys.stdout.write(report.to_json() + "\n")
        return
    print_build_summary(built.report, built.out_dir)
    if bench:
        from trtpack.cli.outputs import run_bench

        run_bench(built.out_dir)

