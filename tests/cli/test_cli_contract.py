"""What the command line promises, run as a user runs it (``python -m trtpack.cli`` in a
process of its own): the documented exit codes, the same with and without ``--debug`` (its
traceback is extra output); usage errors on one line; ``--help`` readable at 80 columns;
rich markup never applied to text with brackets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import ROOT, trtpack

# A real model the ONNX exporter cannot trace (Python control flow on a tensor's values):
# the export stage fails, exit 4. Nothing is injected: this is torch.export's own failure.
BRANCHY_MODEL = '''
import torch


class SingularValues(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        # runs in PyTorch; no ONNX op translates linalg.svdvals (dynamo or TorchScript)
        return self.proj(features) * torch.linalg.svdvals(features).sum()


def make() -> torch.nn.Module:
    return SingularValues()
'''

BRANCHY_RECIPE = '''
name: branchy
description: a model neither ONNX exporter can translate
task: generic
tokenizer: false
source:
  factory: "branchy_model:make"
inputs:
  - {name: features, dtype: float32, axes: [batch, 8]}
outputs:
  - {name: output, axes: [batch, 8], metric: cosine}
profiles: ["1x8:2x8:4x8"]
precision: fp32
'''


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("contract-cache")


@pytest.fixture(scope="module")
def branchy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("branchy")
    (folder / "branchy_model.py").write_text(BRANCHY_MODEL)
    (folder / "branchy.yaml").write_text(BRANCHY_RECIPE)
    return folder


def _no_local_engine() -> bool:
    from trtpack.machine.gpus import detect_gpu
    from trtpack.machine.packages import tensorrt_available

    return detect_gpu() is None or not tensorrt_available()


# (name, arguments, expected exit code); OUT and CACHE are filled in per run
EXIT_PATHS = [
    ("bad input: a misspelt recipe", ["build", "minlm"], 2),
    ("bad input: an unknown option", ["build", "tiny-bert", "--seed", "3"], 2),
    ("accuracy: an impossible tolerance (FP32 ONNX equal to PyTorch to the bit)",
     ["build", "tiny-bert", "--target", "cpu", "--set", "verify.fp32.atol=0",
      "--out", "OUT", "--cache-dir", "CACHE"], 1),
    ("missing GPU: a GPU target here", ["build", "tiny-bert", "--target", "g5",
                                        "--out", "OUT"], 3),
    ("stage failure: a model neither ONNX exporter can translate (linalg.svdvals)",
     ["build", "BRANCHY", "--target", "cpu", "--out", "OUT", "--cache-dir", "CACHE"], 4),
]


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize(("case", "args", "code"), EXIT_PATHS, ids=[c[0].split(":")[0] + str(i)
                                                                   for i, c in
                                                                   enumerate(EXIT_PATHS)])
def test_exit_code_is_the_same_with_and_without_debug(case: str, args: list[str], code: int,
                                                      debug: bool, tmp_path: Path,
                                                      shared_cache: Path, branchy: Path) -> None:
    if code == 3 and not _no_local_engine():
        pytest.skip("this machine has a GPU with TensorRT: --target g5 may build here")
    filled = [{"OUT": str(tmp_path / "out"), "CACHE": str(shared_cache),
               "BRANCHY": str(branchy / "branchy.yaml")}.get(a, a) for a in args]
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(branchy)])}
    result = trtpack(*(["--debug"] if debug else []), *filled, env=env)
    assert result.returncode == code, f"{case}: {result.stderr[-3000:]}"
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, result.stderr[-3000:]
    if debug and "--seed" not in args:  # a usage error has no traceback to show
        assert "Traceback (most recent call last)" in result.stderr
    if not debug:
        assert "Traceback" not in result.stderr
        # the error is one line: nothing after it but its hint and where the report is
        after = result.stderr.split(error_lines[0], 1)[1].strip().splitlines()
        assert all(line.startswith(("hint:", "report and logs:")) for line in after), after


def test_usage_errors_are_one_line_naming_the_option() -> None:
    result = trtpack("build", "minilm", "--seed", "3")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: No such option: --seed (Possible options: --opset, --serve, --set) "
        "(see: trtpack build --help)"]
    missing = trtpack("recipes", "show")
    assert missing.returncode == 2
    assert missing.stderr.strip() == \
        "error: Missing argument 'name'. (see: trtpack recipes show --help)"


def commands() -> list[list[str]]:
    from typer.main import get_command

    from trtpack.cli.app import app

    found: list[list[str]] = [[]]
    group = get_command(app)
    stack: list[tuple[list[str], object]] = [([], group)]
    while stack:
        path, command = stack.pop()
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            found.append([*path, name])
            stack.append(([*path, name], sub))
    return found


def _options(words: list[str]) -> list[tuple[str, str]]:
    """(every option name, the first words of its help) of ``trtpack WORDS``."""
    from typer.main import get_command

    from trtpack.cli.app import app

    command = get_command(app)
    for word in words:
        command = command.commands[word]  # type: ignore[attr-defined]
    named = []
    for param in command.params:
        help_text = " ".join((getattr(param, "help", None) or "").split()[:3])
        for name in [*param.opts, *param.secondary_opts]:
            if name.startswith("-"):
                named.append((name, help_text))
    return named


@pytest.mark.parametrize("words", commands(), ids=lambda w: " ".join(w) or "trtpack")
def test_help_reads_in_80_columns(words: list[str]) -> None:
    result = trtpack(*words, "--help", env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    too_long = [line for line in lines if len(line) > 80]
    assert not too_long, f"trtpack {' '.join(words)} --help: lines over 80: {too_long}"
    text = result.stdout
    flat = " ".join(text.split())
    for name, first_words in _options(words):
        assert name in text.split() or f"{name}," in text or f"{name}/" in text \
            or f" {name} " in f" {flat} ", f"trtpack {' '.join(words)} --help lacks {name}"
        assert first_words in flat, f"{name}: '{first_words}' not in the help"
    assert not [line for line in lines if line.rstrip().endswith("…")]  # nothing cut to fit


def test_doctor_prints_text_in_brackets_as_it_is() -> None:
    from trtpack.diagnostics.doctor import environment_report

    result = trtpack("doctor", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    flat = " ".join(result.stdout.replace("│", " ").split())
    for component in environment_report()["components"]:
        assert " ".join(component["purpose"].split()) in flat, component["purpose"]
    if not any(c["name"] == "tensorrt" and c["version"] for c in
               environment_report()["components"]):
        assert "pip install 'trtpack[tensorrt-cu12]', or NGC" in flat
