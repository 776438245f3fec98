"""The command lines of the GPU path that never run here: ``Dockerfile.ngc``, the Makefile's
instance-family targets and ``.github/workflows/*.yml``.

Every ``python -c`` snippet in them is parsed with ``ast`` and each name it imports from
trtpack is looked up in the real module (the NGC image once imported ``trtpack.gpu``, which
no longer existed: every GPU job failed at "Build the NGC image"). Every ``trtpack ...``
command is parsed by the real typer app (click's ``make_context``: unknown commands and
options, missing arguments, bad choices fail) without running anything.

The GPU families have one home, ``trtpack.machine.targets``: the Makefile's per-family targets, the
GPU workflow's matrix (and its ``fleet`` repositories of one engine per GPU model) and the
README's / docs' lists of families are checked against it.
"""

from __future__ import annotations

import ast
import importlib
import itertools
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile.ngc"
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
# what the shell variables of the workflow's steps hold in one matrix job
# typer vendors its own click: its UsageError, the base of every parsing error
UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__
                                   if c.__name__ == "UsageError")
WORKFLOW_VARIABLES = {"target": "g5", "NGC_TAG": "25.10-py3", "IMAGE": "trtpack-ngc:sha"}


def join_continuations(text: str) -> str:
    return re.sub(r"\\\n", " ", text)


def python_snippets(text: str) -> list[str]:
    """The code of every ``python -c "..."`` / ``python -c '...'`` in a shell text."""
    snippets = []
    for match in re.finditer(r"python3?\s+-c\s+", text):
        rest = text[match.end():]
        quote = rest[0] if rest and rest[0] in "\"'" else None
        if quote is None:
            continue
        end = rest.index(quote, 1)
        snippets.append(rest[1:end])
    return snippets


def trtpack_commands(text: str, variables: dict[str, str]) -> list[list[str]]:
    """The arguments of every ``trtpack ...`` command in a shell text (one command a line,
    continuations joined); a shell function's definition and ``trtpack "$@"`` are skipped."""
    commands = []
    text = join_continuations(text)
    for code in python_snippets(text):  # words inside Python code are not commands
        text = text.replace(code, "")
    for line in text.splitlines():
        for match in re.finditer(r"(?:^|[\s\"'/;&|(])trtpack\s+(?!\(\))", line):
            rest = line[match.end():]
            rest = re.split(r"\s*(?:&&|\|\||;|\||\))\s*", rest)[0]
            for name, value in variables.items():
                rest = rest.replace("${" + name + "}", value).replace("$" + name, value)
            rest = re.sub(r"\$\{\{\s*matrix\.target\s*\}\}", variables.get("target", ""), rest)
            words = shlex.split(rest)
            if not words or words == ["$@"]:
                continue
            commands.append(words)
    return commands


def dockerfile_shell() -> str:
    """The shell of the Dockerfile's ``RUN`` instructions, and its exec-form ``CMD``."""
    text = join_continuations(DOCKERFILE.read_text(encoding="utf-8"))
    lines = []
    for line in text.splitlines():
        instruction, _, rest = line.strip().partition(" ")
        if instruction == "RUN":
            lines.append(rest)
        elif instruction == "CMD" and rest.lstrip().startswith("["):
            lines.append(shlex.join(yaml.safe_load(rest)))
    return "\n".join(lines)


def workflow_runs() -> list[tuple[str, str]]:
    runs = []
    for path in WORKFLOWS:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        for job_name, job in data.get("jobs", {}).items():
            for step in job.get("steps", []):
                if "run" in step:
                    runs.append((f"{path.name}:{job_name}:{step.get('name', '?')}", step["run"]))
    return runs


def makefile_gpu_commands() -> str:
    """What ``make -n <family>`` (with and without ``FROM``) and ``make -n convert`` would
    run for every GPU family target (nothing runs)."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    from trtpack.machine.targets import TARGETS

    out = []
    # each family's whole build, its engine from a converted folder (FROM), and the convert
    forms = [["MODEL=minilm", "PROFILE=1x128:16x128:128x128"], ["FROM=build/minilm-onnx"]]
    for target in (t.name for t in TARGETS if t.is_gpu):
        for form in forms:
            done = subprocess.run([make, "-n", "-C", str(ROOT), target, *form],
                                  capture_output=True, text=True, check=True)
            out.append(done.stdout)
    done = subprocess.run([make, "-n", "-C", str(ROOT), "convert", *forms[0]],
                          capture_output=True, text=True, check=True)
    out.append(done.stdout)
    return "\n".join(out)


def check_imports(code: str) -> list[str]:
    """Names a snippet imports from trtpack that do not exist (module or attribute)."""
    problems = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.split(".")[0] == "trtpack":
            try:
                module = importlib.import_module(node.module)
            except ImportError as e:
                problems.append(f"from {node.module} import ...: {e}")
                continue
            problems += [f"{node.module} has no '{a.name}'" for a in node.names
                         if not hasattr(module, a.name)]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "trtpack":
                    try:
                        importlib.import_module(alias.name)
                    except ImportError as e:
                        problems.append(f"import {alias.name}: {e}")
    return problems


def parse_trtpack(args: list[str]) -> None:
    """Parse ``trtpack ARGS`` with the real CLI, down to the subcommand; runs nothing.
    Raises typer's ``UsageError`` (unknown command/option, missing argument, bad value)."""
    from trtpack.cli.app import app

    command: Any = typer.main.get_command(app)
    name, args, parent = "trtpack", list(args), None
    while hasattr(command, "get_command"):  # a group
        # the group's own options (--debug, --version) come before the subcommand
        split = next((i for i, a in enumerate(args) if not a.startswith("-")), len(args))
        ctx = command.make_context(name, args[:split], parent=parent, resilient_parsing=True)
        if split == len(args):
            return
        sub = command.get_command(ctx, args[split])
        if sub is None:
            raise UsageError(f"no such command '{args[split]}'", ctx)
        command, name, args, parent = sub, args[split], args[split + 1:], ctx
    command.make_context(name, args, parent=parent, resilient_parsing=False)


def all_sources() -> list[tuple[str, str, dict[str, str]]]:
    sources: list[tuple[str, str, dict[str, str]]] = [("Dockerfile.ngc", dockerfile_shell(), {})]
    sources += [(where, run, WORKFLOW_VARIABLES) for where, run in workflow_runs()]
    sources.append(("Makefile (make -n <family>)", makefile_gpu_commands(), {}))
    # the commands gpu.yml's engine jobs run from the matrix of `trtpack fleet plan fleet.yaml`
    sources.append(("fleet.yaml's plan (gpu.yml's matrix)", "\n".join(
        f"{job['convert']}\n{job['engine']}" for job in fleet_plan()["include"]), {}))
    return sources


def test_every_python_snippet_imports_names_that_exist() -> None:
    snippets = [(where, code) for where, text, _ in all_sources()
                for code in python_snippets(join_continuations(text))]
    assert any("trtpack" in code for _, code in snippets)  # the reader finds the NGC check
    problems = [f"{where}: {p}" for where, code in snippets for p in check_imports(code)]
    assert not problems, "\n".join(problems)


def test_every_trtpack_command_parses() -> None:
    commands = [(where, args) for where, text, variables in all_sources()
                for args in trtpack_commands(text, variables)]
    found = {args[0] for _, args in commands}
    # the reader finds the commands the files really run
    assert {"doctor", "build", "inspect", "fleet", "engine"} <= found, found
    assert any(where.startswith("Makefile") and args[0] == "build" for where, args in commands)
    problems = []
    for where, args in commands:
        try:
            parse_trtpack(args)
        except UsageError as e:
            problems.append(f"{where}: trtpack {shlex.join(args)}: {e}")
    assert not problems, "\n".join(problems)


def test_the_checks_catch_a_missing_name_and_an_unknown_option() -> None:
    """Both checks can fail: the snippet the NGC image ran before the fix, and a misspelt
    option, are reported."""
    old = "from trtpack.gpu import MIN_TENSORRT, parse_version, tensorrt_version; v = 1"
    assert check_imports(old) and "trtpack.gpu" in check_imports(old)[0]
    assert check_imports("from trtpack.machine.packages import MIN_TENSORRT, no_such_name") \
        == ["trtpack.machine.packages has no 'no_such_name'"]
    with pytest.raises(UsageError, match="--precison"):
        parse_trtpack(["build", "minilm", "--precison", "fp16"])
    with pytest.raises(UsageError):
        parse_trtpack(["no-such-command"])
    parse_trtpack(["build", "minilm", "--precision", "fp16", "--target", "g5"])
    text = 'docker run "$IMAGE" trtpack build m --target "$target"\n  trtpack "$@"\ntrtpack() {'
    assert trtpack_commands(text, {"target": "g6"}) == [["build", "m", "--target", "g6"]]


# The GPU family table (trtpack.machine.targets) against the files that repeat it.
FAMILY_WORD = re.compile(r"\b[gp]\d+[a-z]*\b")  # g4dn, p5en: an instance family's name
MAKEFILE = ROOT / "Makefile"
GPU_WORKFLOW = ROOT / ".github" / "workflows" / "gpu.yml"


def makefile_family_problems(text: str) -> list[str]:
    """Where the Makefile's per-family targets (the rule that runs ``--target $@``, and
    ``.PHONY``) differ from ``gpu_families()``."""
    from trtpack.machine.targets import gpu_families

    expected = [t.name for t in gpu_families()]
    lines = join_continuations(text).splitlines()
    phony = next((line.split(":", 1)[1].split() for line in lines
                  if line.startswith(".PHONY:")), [])
    rules = [line.split(":", 1)[0].split() for line, recipe in itertools.pairwise(lines)
             if re.match(r"^[\w ]+:", line) and "--target $@" in recipe]
    problems = []
    if rules != [expected]:
        problems.append(f"Makefile: the rule building --target $@ is for {rules}, "
                        f"trtpack.machine.targets has {expected}")
    if [w for w in phony if FAMILY_WORD.fullmatch(w)] != expected:
        problems.append(f"Makefile: .PHONY lists the families "
                        f"{[w for w in phony if FAMILY_WORD.fullmatch(w)]}, not {expected}")
    return problems


def workflow_family_problems(workflow: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """Where the GPU workflow's engine jobs (the matrix of ``trtpack fleet plan fleet.yaml``,
    one job per model and family, ``repository``: the fleet repository its engine is
    assembled into, 0 for none) differ from ``ci_families()`` / ``fleet_repositories()``."""
    from trtpack.machine.targets import ci_families, fleet_repositories

    slot = "${{ fromJSON(needs.fleet-plan.outputs.matrix) }}"
    if workflow["jobs"]["engines"]["strategy"]["matrix"] != slot:
        return [f"gpu.yml: the engines matrix is not the fleet plan's ({slot})"]
    fleet = {t.name: k for k, repo in enumerate(fleet_repositories(), 1) for t in repo}
    expected = [(t.name, fleet.get(t.name, 0)) for t in ci_families()]
    problems = []
    models = list(dict.fromkeys(j["model"] for j in plan["include"]))
    for model in models:
        found = [(j["instance_type"], j["repository"]) for j in plan["include"]
                 if j["model"] == model]
        if found != expected:
            problems.append(f"fleet.yaml: {model}'s engine jobs are {found}, "
                            f"trtpack.machine.targets says {expected}")
    return problems


def fleet_plan() -> dict[str, Any]:
    from trtpack.api.fleet import job_matrix, load_manifest

    return job_matrix(load_manifest(ROOT / "fleet.yaml"))


def family_listings(text: str) -> list[tuple[set[str], str]]:
    """(the families named, the paragraph) of each Markdown paragraph that names five
    families or more in backticks: a list of the families."""
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        named = set(FAMILY_WORD.findall(" ".join(re.findall(r"`([^`]*)`", paragraph))))
        if len(named) >= 5:
            found.append((named, paragraph.strip()))
    return found


def family_list_problems(name: str, text: str) -> list[str]:
    """Each list of the families in a Markdown page must be exactly ``gpu_families()``."""
    from trtpack.machine.targets import gpu_families

    expected = {t.name for t in gpu_families()}
    return [f"{name}: a paragraph names the families {sorted(named)}, trtpack.machine.targets has "
            f"{sorted(expected)}: {paragraph[:80]}..."
            for named, paragraph in family_listings(text) if named != expected]


def test_the_gpu_families_have_one_home() -> None:
    """The Makefile, the GPU workflow and the README / docs lists agree with
    ``trtpack.machine.targets``."""
    pages = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in
             [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))] if p.is_file()}
    problems = makefile_family_problems(MAKEFILE.read_text(encoding="utf-8"))
    problems += workflow_family_problems(yaml.safe_load(GPU_WORKFLOW.read_text("utf-8")),
                                         fleet_plan())
    for name, text in pages.items():
        problems += family_list_problems(name, text)
    assert not problems, "\n".join(problems)
    # the README (or a docs page) lists the families, so the check above read one
    assert any(family_listings(text) for text in pages.values())


def test_the_family_checks_catch_a_missing_or_extra_family() -> None:
    makefile = MAKEFILE.read_text(encoding="utf-8")
    assert makefile_family_problems(makefile) == []
    without_p3 = makefile.replace(" p3 p4d", " p4d")
    assert len(makefile_family_problems(without_p3)) == 2
    workflow = yaml.safe_load(GPU_WORKFLOW.read_text(encoding="utf-8"))
    plan = fleet_plan()
    assert workflow_family_problems(workflow, plan) == []
    include = plan["include"]
    assert include[3]["instance_type"] == "g6e"
    include.insert(4, {**include[4], "instance_type": "p3"})  # Volta: TensorRT 10.5 dropped it
    assert workflow_family_problems(workflow, plan)
    include.pop(4)
    include[3]["repository"] = 1  # g6e beside g6: two engines for compute capability 8.9
    assert workflow_family_problems(workflow, plan)
    include[3]["repository"] = 0  # g6e's L40S served by g6's L4 engine (issue 45, item 2)
    assert workflow_family_problems(workflow, plan)
    include[3]["repository"] = 2
    assert workflow_family_problems(workflow, plan) == []
    workflow["jobs"]["engines"]["strategy"]["matrix"] = {"include": include}  # by hand
    assert workflow_family_problems(workflow, plan)
    listing = "Build for `g4dn`, `g5`, `g6`, `g6e`, `p4d`, `p5` or `p7`."
    assert "p7" in family_list_problems("README.md", listing)[0]


def test_set_up_shows_its_costs() -> None:
    """The set-up's large downloads are not silent (torch from PyPI alone is a multi-GB CUDA
    build), and the README says how to reach the CLI after ``make run``, that ``make test``
    runs apt-get as root, and how long the suites take (issue 46)."""
    text = join_continuations(MAKEFILE.read_text())
    installs = [line for line in text.splitlines()
                if "$(PIP) install" in line and ("torch==" in line or '".[all' in line)]
    assert len(installs) >= 3, installs
    assert not [line for line in installs if "--quiet" in line or " -q " in line], installs
    readme = " ".join((ROOT / "README.md").read_text().split())
    for said in ("`source .venv/bin/activate`", "`.venv/bin/trtpack`", "`apt-get` (as root",
                 "`make test-fast`"):
        assert said in readme, said
