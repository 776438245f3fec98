"""Library entry points; the CLI is a thin wrapper over these. ``resolve_options`` is the one
place a build's flags are validated (``api.plan``: the plan; ``api.recipes``: the recipe)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from trtpack.api.plan import check_plan, plan_build
from trtpack.options import BuildPlan, BuildRequest, check_choices
from trtpack.pipeline.runner import build as run_pipeline
from trtpack.report import BuildReport
from trtpack.stages.base import ProgressCallback

__all__ = ["BuildRequest", "BuildResult", "build", "resolve_options"]


def resolve_options(request: BuildRequest) -> tuple[BuildPlan, list[str]]:
    """Validate everything the build needs before any work starts, and plan it: the request
    becomes a recipe, a precision choice, profiles and a target (``plan_build``), then the
    plan's files and packages are checked (``check_plan``). The words of a choice
    (--precision FP16, --target CPU, --serve Text) are read case-insensitively
    (``options.check_choices``)."""
    plan, warnings = plan_build(check_choices(request))
    check_plan(plan)
    return plan, warnings


@dataclass(frozen=True)
class BuildResult:
    """A finished build: its report, and the output folder as the request named it."""

    report: BuildReport
    out_dir: Path  # --out, or build/<recipe name>


def build(request: BuildRequest, progress: ProgressCallback | None = None,
          on_warning: Callable[[str], None] | None = None) -> BuildResult:
    """Validate ``request`` (``resolve_options``), check the memory each profile corner
    needs against what this machine has (``pipeline.memory_check``), then run the pipeline.
    Warnings about the request go to ``on_warning`` before any work starts, and into the
    report."""
    plan, warnings = resolve_options(request)
    if not request.skip_memory_check:
        from trtpack.pipeline.memory_check import check_build_memory, traced_in_export

        # an absurd profile: exit 2 before any work
        warnings += check_build_memory(plan, trace_in_export=True)
        if traced_in_export(plan):
            plan = replace(plan, check_memory_in_export=True)
    for w in warnings:
        if on_warning is not None:
            on_warning(w)
    from trtpack.pipeline.cache_budget import cache_budget, keep_within_budget

    budget = cache_budget() if plan.use_cache else None  # a bad budget: exit 2 before work
    report = run_pipeline(plan, progress, warnings)
    pruned = keep_within_budget(plan.cache_dir, budget)
    if pruned is not None and on_warning is not None:
        on_warning(pruned)
    return BuildResult(report, plan.out_dir)
