"""The export stage's PyTorch reference pass and ONNX export one after the other, and the
exporter with the forwards beside it (``stages.reference_pass.reference_beside``, issue 47), in
rotation in one process on one loaded model: wall and CPU seconds of each.

    python benchmarks/export_beside.py [--recipe bert-large] \
        [--profile 1x128:16x128:128x128] [--rounds 2] [--variant NAME]... [--work DIR] \
        [--json FILE]

The exporter is Python on one core; beside it the other core computes the smaller corners'
PyTorch outputs at one intra-op thread. Then the largest corner either runs after the export
at every thread (``largest after``: the stage before the row pieces) or, as the stage does
now where its batch splits, in row pieces (``RowPieces``) that the forwards' thread takes
while the exporter runs, the rest after it (``largest in row pieces``). The CPU seconds are
about the same work either way: the wall time is what changes, so only a quiet machine
measures it (a loaded one lends the idle core to others anyway).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, self_usage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="bert-large")
    parser.add_argument("--profile", default="1x128:16x128:128x128")
    parser.add_argument("--set", action="append", default=[], help="a recipe KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variant", action="append", default=[],
                        help="run only these variants (default: all three)")
    parser.add_argument("--work", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import torch

    from trtpack.api import BuildRequest, resolve_options
    from trtpack.pytorch.models import load_model
    from trtpack.stages.export import build_cases, output_selector
    from trtpack.stages.reference_pass import (
        RowPieces,
        beside_cases,
        copy_sharing_weights,
        reference_beside,
        run_torch,
    )
    from trtpack.stages.torch_export import export_onnx

    plan, _ = resolve_options(BuildRequest(args.recipe, profiles=[args.profile], target="cpu",
                                           random_weights=True, overrides=args.set))
    recipe = plan.recipe
    loaded = load_model(recipe, random_weights=True, seed=plan.seed)
    wrapper = output_selector(loaded.module, recipe)
    log = logging.getLogger("export_beside")
    work = args.work or Path(tempfile.mkdtemp(prefix="export-beside-"))

    def sequential(out: Path) -> None:
        cases, _, _ = build_cases(plan, loaded)
        run_torch(wrapper, recipe, cases)
        export_onnx(wrapper, plan, out / "model.onnx", log)

    def beside(out: Path) -> None:
        cases, _, _ = build_cases(plan, loaded)
        largest = max(cases, key=lambda c: sum(a.size for a in c.inputs.values()))
        copy = copy_sharing_weights(wrapper)
        assert copy is not None
        reference_beside(wrapper, recipe, [c for c in cases if c is not largest],
                         lambda: export_onnx(copy, plan, out / "model.onnx", log))
        run_torch(wrapper, recipe, [largest])

    parameters = sum(p.numel() for p in loaded.module.parameters())

    def pieces(out: Path) -> None:  # as the export stage runs them
        cases, _, _ = build_cases(plan, loaded)
        besides = beside_cases(cases, parameters)
        left = [c for c in cases if all(c is not b for b in besides)]
        split = RowPieces.of(left[0], recipe, parameters) if len(left) == 1 else None
        copy = copy_sharing_weights(wrapper)
        assert copy is not None
        reference_beside(wrapper, recipe, besides,
                         lambda: export_onnx(copy, plan, out / "model.onnx", log), split)
        if left and split is None:
            run_torch(wrapper, recipe, left)

    variants = {"one after the other": sequential, "largest after": beside,
                "largest in row pieces": pieces}
    unknown = set(args.variant) - set(variants)
    if unknown:
        sys.exit(f"error: no variant {sorted(unknown)}; the variants: {list(variants)}")
    if args.variant:
        variants = {name: variants[name] for name in args.variant}
    rows: list[dict[str, Any]] = []
    threads = torch.get_num_threads()
    for index in range(args.rounds):
        for name, variant in variants.items():
            out = work / f"{index}-{len(rows)}"
            out.mkdir(parents=True)
            before = self_usage()
            variant(out)
            after = self_usage()
            assert torch.get_num_threads() == threads  # the forwards' thread kept its own
            shutil.rmtree(out)
            row = {"round": index, "variant": name, "wall": round(after[1] - before[1], 2),
                   "cpu": round(after[0] - before[0], 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    for name in variants:
        mine = [r for r in rows if r["variant"] == name]
        print(f"{name}: wall s " + " / ".join(str(r["wall"]) for r in mine)
              + ", CPU s " + " / ".join(str(r["cpu"]) for r in mine))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine(), "command": " ".join(["python", *sys.argv]),
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "recipe": args.recipe, "profile": args.profile, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
