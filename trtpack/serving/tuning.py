"""Tuning hand-off: perf_analyzer command lines and a Model Analyzer config.

Shapes come from the shape profiles, so the measured requests are ones the engine accepts:
one perf_analyzer run per profile at its opt and its max shape (batch from ``-b``, the other
dims from ``--shape``, which leaves the batch out), and, for text serving, one run of the
ensemble with real sentences. One Model Analyzer config per profile sweeps the serving
options the recipe sets (instances, queue delay) around the recipe's values, at that
profile's opt shape and batches.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.report import JsonObject
from trtpack.serving.config import CONFIG_FILE, read_config
from trtpack.serving.triton_rules import preferred_batch_sizes
from trtpack.shapes import ShapeProfile
from trtpack.sources.recipe import TritonSettings

if TYPE_CHECKING:
    from trtpack.cases import Case
    from trtpack.serving.layout import ModelRepository

PERF_SCRIPT = "perf_analyzer.sh"
TEXT_INPUT_DATA = "perf_text_inputs.json"
README = "README.md"
SAMPLE_SENTENCES = (
    "A man is playing a guitar on a stage.",
    "The quarterly report shows revenue grew by eight percent.",
    "How do I reset my password?",
    "Triton serves the same model to many clients at once, batching their requests.",
)


def _shape_flags(profile: ShapeProfile, corner: str, batched: bool) -> tuple[int, list[str]]:
    flags: list[str] = []
    batch = 1
    for name, r in profile.shapes.items():
        shape = r.corner(corner)
        if batched:
            batch = shape[0]
            shape = shape[1:]
        if shape:
            flags.append(f"{name}:{','.join(str(d) for d in shape)}")
    return batch, flags


def perf_analyzer_commands(model: str, profiles: Sequence[ShapeProfile], max_batch_size: int,
                           *, integer_inputs: bool, url: str = "${TRITON_URL}",
                           concurrency: str = "1:8:1",
                           input_data: Mapping[tuple[int, str], str] | None = None
                           ) -> list[list[str]]:
    """One perf_analyzer argv per profile and corner (opt, max). ``input_data``: the
    ``--input-data`` file of (profile index, corner), the inputs the build was verified on."""
    commands: list[list[str]] = []
    batched = max_batch_size > 0
    seen: set[str] = set()
    for index, profile in enumerate(profiles):
        for corner in ("opt", "max"):
            batch, shapes = _shape_flags(profile, corner, batched)
            batch = min(batch, max_batch_size) if batched else 1
            cmd = ["perf_analyzer", "-m", model, "-i", "grpc", "-u", url, "-b", str(batch)]
            for s in shapes:
                cmd += ["--shape", s]
            verified = (input_data or {}).get((index, corner))
            if verified is not None:
                cmd += ["--input-data", verified]
            elif integer_inputs:
                # random integers would index past the vocabulary; zeros are valid token ids
                cmd += ["--input-data", "zero"]
            cmd += ["--concurrency-range", concurrency, "--percentile", "95",
                    "--measurement-interval", "5000"]
            key = " ".join(cmd)
            if key not in seen:
                seen.add(key)
                commands.append(cmd)
    return commands


def _quote(cmd: list[str]) -> str:
    # keep ${TRITON_URL} and "$HERE/..." expandable by the shell
    return " ".join(a if a.startswith("${") else f'"{a}"' if a.startswith("$HERE/")
                    else shlex.quote(a) for a in cmd)


def model_analyzer_config_name(profile: int) -> str:
    """The Model Analyzer config of one profile (``profile_models`` is keyed by model name, so
    one file sweeps one profile)."""
    return f"model_analyzer_p{profile}.yaml"


def model_analyzer_configs(repo: ModelRepository, model: str, profiles: Sequence[ShapeProfile],
                           settings: TritonSettings, *, kind: str, integer_inputs: bool,
                           repository_path: str) -> dict[int, JsonObject]:
    """One Model Analyzer config per profile (keyed by its index), each asking only for shapes
    that profile holds: its opt shape, batch sizes inside its batch range (its min, opt and
    max batch, capped at ``max_batch_size``), ``max_batch_size`` capped at its max batch, and
    (engines) an instance group with that profile alone. Model Analyzer sends every batch size
    with the one ``--shape`` (``perf_analyzer_flags``) and the dynamic batcher merges those
    requests into any batch up to ``max_batch_size``: with profile 0's length at every batch
    up to the largest profile's max, batches above profile 0's range hold no profile, and
    Triton fails them ("request specifies invalid shape", tensorrt_backend ``src/instance_state.cc``
    line 4293 at e2ef6d7). ``repository_path`` as Model Analyzer will see it (relative to
    where it runs)."""
    config = read_config(repo.root / model / CONFIG_FILE)
    mbs = int(config.max_batch_size)
    batched = mbs > 0
    listed = {int(p) for g in config.instance_group for p in g.profile}
    delays = sorted({0, settings.max_queue_delay_us, 100, 500, 1000})
    counts = sorted({1, 2, settings.instance_count})
    configs: dict[int, JsonObject] = {}
    for index, profile in enumerate(profiles):
        if listed and index not in listed:
            continue  # the written config never serves it
        _, shapes = _shape_flags(profile, "opt", batched)
        flags: JsonObject = {"shape": shapes}
        if integer_inputs:
            flags["input-data"] = "zero"
        group: JsonObject = {"kind": kind, "count": counts}
        # Model Analyzer replaces a list-valued field whole (base_model_config_generator.py,
        # _apply_value_to_dict); a list of strings is one value of the repeated field, not a
        # sweep (ConfigSweep): the instances serve this profile alone
        if listed:
            group["profile"] = [str(index)]
        params: JsonObject = {"instance_group": [group]}
        batch_sizes = [1]
        if batched:
            low, opt, high = profile.axis_range(0)
            cap = min(high, mbs)
            batch_sizes = sorted({b for b in (low, opt, cap) if low <= b <= cap})
            params["max_batch_size"] = [cap]
            params["dynamic_batching"] = {
                "max_queue_delay_microseconds": delays,
                # the base config's sizes reach the largest profile's max batch, and Triton
                # refuses a preferred size above max_batch_size
                "preferred_batch_size": preferred_batch_sizes([profile], cap)}
        warmups = [w for w in config.model_warmup if w.name == f"profile_{index}_opt"]
        if config.model_warmup:
            # the other profiles' warm-up shapes are outside this instance's one profile
            from google.protobuf import json_format

            params["model_warmup"] = [json_format.MessageToDict(
                w, preserving_proto_field_name=True) for w in warmups]
        configs[index] = {
            "model_repository": repository_path,
            "output_model_repository_path": f"./model_analyzer_repository_p{index}",
            "override_output_model_repository": True,
            "export_path": f"./model_analyzer_results_p{index}",
            "run_config_search_disable": True,
            "batch_sizes": batch_sizes,
            "concurrency": [1, 2, 4, 8, 16],
            "profile_models": {
                model: {"perf_analyzer_flags": flags, "model_config_parameters": params},
            },
        }
    return configs


def write_tuning_files(dest: Path, repo: ModelRepository, profiles: Sequence[ShapeProfile],
                       settings: TritonSettings, repository_ref: str | None = None,
                       cases: Sequence[Case] = ()) -> list[Path]:
    """Write the perf_analyzer script, a Model Analyzer config per profile and a README into
    ``dest``.

    ``repository_ref`` is how they name the repository, relative to ``dest`` (default: the
    path from ``dest`` to ``repo.root`` now; give the final one when both are renamed later).
    ``cases``: the verified inputs, written as ``perf_inputs_p<profile>_<corner>.json`` and
    fed to the perf_analyzer runs of those corners.
    """
    import yaml

    dest.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    # relative: the build folder is renamed into place after this is written
    rel = repository_ref or os.path.relpath(repo.root.resolve(), dest.resolve())
    main = repo.by_role("model")[0]
    main_config = read_config(main.path / CONFIG_FILE)
    mbs = int(main_config.max_batch_size)
    integer_inputs = any(t.data_type in (8, 9) for t in main_config.input)  # INT32, INT64
    written += write_perf_input_data(dest, cases, batched=mbs > 0)
    input_data = {(c.profile, c.corner): f"$HERE/{perf_input_data_name(c.profile, c.corner)}"
                  for c in cases}
    lines = [
        "#!/usr/bin/env bash",
        f"# perf_analyzer runs for the Triton model repository {rel}/ (from this folder)",
        "# written by trtpack: one run per shape profile at its opt and max shape, sending",
        "# the inputs the build was verified on where it has them (perf_inputs_*.json). Start",
        "# tritonserver on that repository first; TRITON_URL is its gRPC address.",
        "set -euo pipefail",
        'TRITON_URL="${TRITON_URL:-localhost:8001}"',
        'HERE="$(cd "$(dirname "$0")" && pwd)"',
        "",
    ]
    tensor_models = [main, *repo.by_role("cpu_fallback")]
    for m in tensor_models:
        lines.append(f"# {m.name} ({m.backend})")
        for cmd in perf_analyzer_commands(m.name, profiles, mbs, integer_inputs=integer_inputs,
                                          input_data=input_data):
            lines.append(_quote(cmd))
        lines.append("")
    ensembles = repo.by_role("ensemble")
    if ensembles:
        data = {"data": [{"TEXT": {"content": [s], "shape": [1]}} for s in SAMPLE_SENTENCES]}
        data_path = dest / TEXT_INPUT_DATA
        data_path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        written.append(data_path)
        batch = min(profiles[0].axis_range(0)[1], mbs) if mbs > 0 else 1
        for e in ensembles:
            lines.append(f"# {e.name}: text in, through {', '.join(e.members)}")
            cmd = ["perf_analyzer", "-m", e.name, "-i", "grpc", "-u", "${TRITON_URL}",
                   "-b", str(batch), "--input-data", f"$HERE/{TEXT_INPUT_DATA}",
                   "--concurrency-range", "1:8:1", "--percentile", "95",
                   "--measurement-interval", "5000"]
            lines.append(_quote(cmd))
            lines.append("")
    script = dest / PERF_SCRIPT
    script.write_text("\n".join(lines), encoding="utf-8")
    script.chmod(0o755)
    written.append(script)

    kind = main_config.instance_group[0].kind if main_config.instance_group else 0
    kind_name = "KIND_GPU" if kind == 1 else "KIND_CPU"
    configs = model_analyzer_configs(repo, main.name, profiles, settings, kind=kind_name,
                                     integer_inputs=integer_inputs, repository_path=rel)
    for index, ma in configs.items():
        name = model_analyzer_config_name(index)
        ma_path = dest / name
        ma_path.write_text(
            f"# Model Analyzer sweep of profile {index} ({profiles[index]}) of the model trtpack\n"
            f"# built; run from this folder with\n#   model-analyzer profile -f {name}\n"
            + yaml.safe_dump(ma, sort_keys=False), encoding="utf-8")
        written.append(ma_path)

    readme = dest / README
    sweeps = [model_analyzer_config_name(i) for i in configs]
    readme.write_text(_readme(repo, mbs, rel, sweeps), encoding="utf-8")
    written.append(readme)
    return written


def _readme(repo: ModelRepository, mbs: int, rel: str, sweeps: Sequence[str]) -> str:
    rows = "\n".join(f"| `{m.name}` | {m.role} | {m.backend} |" for m in repo.models)
    python = [m.name for m in repo.models if m.backend == "python"]
    deps = ""
    if python:
        carried = all((m.path / "1" / "vendor" / "tokenizers").is_dir()
                      for m in repo.models if m.role == "tokenizer")
        tokenizers = (
            "`tokenizers` ships with the tokenizer model (its `1/vendor/` folder, an abi3 "
            "build for Python 3.10+ on Linux)" if carried else
            "`tokenizers` must be installed there too (`pip install tokenizers` in the "
            "tritonserver container, or a conda-pack environment named by the "
            "`EXECUTION_ENV_PATH` parameter)")
        deps = (
            f"\nThe Python-backend models ({', '.join(python)}) need `numpy` in the "
            f"server's Python environment, which Triton images have; {tokenizers}.\n"
        )
    from trtpack.serving.layout import engine_triton_serving

    serving = engine_triton_serving(repo.by_role("model")[0].path)
    flags = "".join(f" {f}" for f in serving.backend_config) if serving else ""
    engine = f"\nThe engine is {serving.summary()}.\n" if serving else ""
    return (
        "# Serving and tuning\n\n"
        f"Model repository: `{rel}/` from this folder (max_batch_size {mbs}). Run the "
        "commands below from this folder.\n\n"
        "| model | role | backend |\n| --- | --- | --- |\n"
        f"{rows}\n{deps}\n"
        "Serve it:\n\n"
        f"    tritonserver --model-repository $PWD/{rel}{flags}"
        " --cache-config local,size=268435456   # the cache only if response_cache is on\n"
        f"{engine}\n"
        f"Measure it: `./{PERF_SCRIPT}` (perf_analyzer, one run per profile corner).\n"
        "Sweep the serving options, one shape profile per Model Analyzer config (each asks "
        "only for shapes its profile holds): "
        + ", ".join(f"`model-analyzer profile -f {name}`" for name in sweeps) + ".\n"
    )


def perf_input_data_name(profile: int, corner: str) -> str:
    return f"perf_inputs_p{profile}_{corner}.json"


def write_perf_input_data(dest: Path, cases: Sequence[Case], batched: bool = True
                          ) -> list[Path]:
    """perf_analyzer ``--input-data`` files, one per profile corner, holding the inputs the
    build was verified on (real token ids where the recipe has a tokenizer, never zeros).
    Batched models: one entry per row of the corner's batch, without the batch dimension
    (perf_analyzer sends ``-b`` of them per request); unbatched: the whole tensor."""
    import numpy as np

    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for case in cases:
        first = next(iter(case.inputs.values()))
        rows = range(first.shape[0]) if batched else [None]
        entries = []
        for i in rows:
            entry = {}
            for name, value in case.inputs.items():
                v = np.asarray(value if i is None else value[i])
                entry[name] = {"content": v.reshape(-1).tolist(), "shape": list(v.shape)}
            entries.append(entry)
        path = dest / perf_input_data_name(case.profile, case.corner)
        path.write_text(json.dumps({"data": entries}) + "\n", encoding="utf-8")
        written.append(path)
    return written
