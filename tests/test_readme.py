"""The README (and docs/) as a test: every ``trtpack …`` command written there is either run
here exactly as written (on the recipes it names; placeholders filled from ``PLACEHOLDERS``),
or listed in ``NOT_ON_THIS_MACHINE`` with the reason and parsed against the real typer/click
app; synopsis lines (``[--option ...]``, ``a|b``, ``...``) have every option checked against
the command. A command in neither list fails, and so does an option the command does not
have: the failure names the file, line, command and option. The usage block of
``docs/cli.md`` shows every command and every option each has.

Commands come from fenced code blocks and from inline code spans (``trtpack doctor``) alike;
inline spans that start with an option (```--fallback off```) must be an option of some
trtpack command unless ``OTHER_TOOLS_OPTIONS`` says whose they are.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, trtpack

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
USAGE = ROOT / "docs" / "cli.md"  # its fenced block is the usage of every command

# Placeholders as the README writes them, and what they stand for when run here (relative
# to the working folder every command runs in, where `trtpack build minilm ...` writes
# build/minilm, the OUT the later commands read).
PLACEHOLDERS = {
    "OUT": "build/minilm",
    "PATH": "build/minilm",
    "DIR": "build/minilm",
    "MODEL": "minilm",
    "NAME": "minilm",
    "model.onnx": "model.onnx",  # a copy of OUT's served ONNX (made before it is built)
}

# Run here, in this order, exactly as written (after PLACEHOLDERS).
RUN = [
    "trtpack build minilm --target cpu --precision fp32",
    "trtpack recipes list",
    "trtpack recipes show MODEL",
    "trtpack recipes show NAME",
    "trtpack doctor",
    "trtpack targets",
    "trtpack inspect PATH",
    "trtpack inspect DIR",
    "trtpack report OUT",
    "trtpack build model.onnx",
    "trtpack build OUT/artifacts/export/model.onnx",
    "trtpack cache info",
    "trtpack cache verify",
    "trtpack cache constraints",
]
# Run too, but slowly (a timed benchmark of every profile corner): marked slow.
RUN_SLOW = [
    "trtpack bench OUT",
]
# Only parsed: what this machine cannot run, and why.
NOT_ON_THIS_MACHINE = {
    "trtpack build bert-large --profile 1x128:16x128:128x128 --target g5":
        "a TensorRT engine for an A10G: needs that GPU and TensorRT",
    "trtpack build MODEL --target g5": "a TensorRT engine for an A10G",
    "trtpack fleet plan MANIFEST": "a fleet manifest: tests/test_fleet.py runs it on the "
                                   "repository's fleet.yaml",
    "trtpack fleet plan fleet.yaml": "tests/test_fleet.py runs it",
    "trtpack fleet build MANIFEST --target cpu": "builds every model of a manifest: "
                                                 "tests/test_fleet_build.py runs it on a "
                                                 "small one (tiny-bert, two ONNX models)",
    "trtpack package DIR --sagemaker": "the fleet's folder: tests/test_fleet_build.py",
    "trtpack merge out/minilm-g4dn out/minilm-g5 out/minilm-p4d --out out/minilm-fleet":
        "merges engine builds for three GPU families (CPU builds are refused)",
    "trtpack bench OUT --served URL": "needs a running Triton server serving OUT",
    "trtpack build minilm --precision fp16 --target g5 --no-engine --out out/minilm-onnx":
        "the convert step; tests/pipeline/test_engine_from_build.py runs it (fp32, for time)",
    "trtpack engine out/minilm-onnx --target g4dn --out out/minilm-g4dn":
        "a TensorRT engine for a T4: needs that GPU and TensorRT (the flow runs with a "
        "labelled stand-in engine step in tests/pipeline/test_engine_from_build.py)",
    "trtpack engine out/minilm-onnx --target g5 --out out/minilm-g5":
        "a TensorRT engine for an A10G: needs that GPU and TensorRT",
    "trtpack engine BUILD_DIR --target T --out OUT": "a TensorRT engine for a GPU family",
    "trtpack merge out/minilm-g4dn out/minilm-g5 --out out/minilm-fleet":
        "merges engine builds for two GPU families (CPU builds are refused)",
    # PyTorch sources: the files they name are made by docs/any-model.md's Python blocks,
    # which build these same sources through trtpack.build (tests/test_docs_python.py)
    "trtpack build make.py:make_model --target cpu": "make.py: a Python block",
    "trtpack build mixer.pt2 --profile 1:4:32 --target cpu": "mixer.pt2: a Python block",
    "trtpack build counter.pt --input x=float32[batch,8] --input step=2 --target cpu":
        "counter.pt: a Python block",
}
# Inline options of other tools the README mentions (benchmark scripts, tritonserver).
OTHER_TOOLS_OPTIONS = {
    "--durations": "pytest (make test)",
    "--dist": "pytest-xdist (make test)",
    "--method": "benchmarks/int8_minilm.py",
    "--recipe": "benchmarks/int8_minilm.py",
    "--model-control-mode": "tritonserver",
    "--backend-config": "tritonserver",
    "--model-namespacing": "tritonserver",
    "--cache-config": "tritonserver",
    "--strict": "mkdocs build (make docs)",
}
SYNOPSIS_MARKS = ("[", "|", "...", "…")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


@dataclass(frozen=True)
class Mention:
    document: Path
    line: int
    text: str  # the command as written, comments dropped
    fenced: bool

    @property
    def where(self) -> str:
        shown = self.document.relative_to(ROOT) if self.document.is_relative_to(ROOT) \
            else self.document
        return f"{shown}:{self.line}"


def mentions() -> list[Mention]:
    """Every ``trtpack`` command (fenced lines and their continuation lines, inline spans)
    and every inline span that starts with an option, in order."""
    found: list[Mention] = []
    for document in DOCUMENTS:
        fenced = False
        for number, line in enumerate(document.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                code = re.sub(r"\s+#\s.*$", "", line).rstrip()
                if code.startswith("trtpack "):
                    found.append(Mention(document, number, code, True))
                elif code.lstrip().startswith("[") and found and found[-1].fenced \
                        and found[-1].document == document:  # a synopsis continues
                    last = found.pop()
                    found.append(Mention(document, last.line, f"{last.text} {code.strip()}",
                                         True))
                continue
            for span in re.findall(r"`([^`]+)`", line):
                if span.startswith(("trtpack ", "--")):
                    found.append(Mention(document, number, span.strip(), False))
    return found


def app_command(words: list[str]) -> tuple[list[str], Any, list[str]]:
    """(the command path, its click command, the words after it) of ``trtpack WORDS``;
    global options (--debug) are checked on the way."""
    from typer.main import get_command

    from trtpack.cli.app import app

    command: Any = get_command(app)
    path: list[str] = []
    rest = list(words)
    while hasattr(command, "commands"):
        options = {o for p in command.params for o in [*p.opts, *p.secondary_opts]}
        while rest and rest[0].startswith("-"):
            assert rest[0] in options, f"'trtpack {' '.join(path)}' has no option {rest[0]}"
            rest.pop(0)
        if not rest or rest[0] not in command.commands:
            break
        path.append(rest[0])
        command = command.commands[rest.pop(0)]
    return path, command, rest


def options_of(command: Any) -> set[str]:
    return {o for p in command.params for o in [*p.opts, *p.secondary_opts] if o.startswith("-")}


def check_synopsis(mention: Mention) -> None:
    """Each alternative (``a | b``) names a command, and every option it shows exists."""
    for alternative in mention.text.split(" | "):
        words = alternative.split()
        words = words[1:] if words[0] == "trtpack" else words
        path, command, _ = app_command([w for w in words if not w.startswith("[")])
        assert path or not words, f"{mention.where}: '{alternative}' names no trtpack command"
        shown = set(OPTION.findall(alternative)) - {"--debug"}
        unknown = sorted(shown - options_of(command))
        assert not unknown, (f"{mention.where}: 'trtpack {' '.join(path)}' has no option "
                             f"{', '.join(unknown)} (documented as: {alternative})")


def parse(mention: Mention) -> None:
    """Parse a concrete command with the real click command: unknown options, missing
    arguments and values of the wrong type fail here as they would for a user."""
    words = shlex.split(mention.text)[1:]
    path, command, rest = app_command(words)
    assert path, f"{mention.where}: '{mention.text}' names no trtpack command"
    try:
        command.make_context(f"trtpack {' '.join(path)}", rest)
    except Exception as e:  # click's UsageError and friends
        format_message = getattr(e, "format_message", None)
        message = format_message() if format_message is not None else str(e)
        raise AssertionError(f"{mention.where}: '{mention.text}': {message}") from None


def is_synopsis(mention: Mention) -> bool:
    words = mention.text.split()
    return any(mark in mention.text for mark in SYNOPSIS_MARKS) or (
        mention.text not in RUN and len(app_command(words[1:])[2]) == 0
        and not OPTION.search(mention.text))  # a command's name only: `trtpack bench`


def test_every_command_is_run_or_listed_and_every_option_exists() -> None:
    all_options = set().union(*(options_of(app_command(p)[1]) for p in _command_paths()))
    problems = []
    for mention in mentions():
        try:
            if mention.text.startswith("--"):
                for option in OPTION.findall(mention.text)[:1]:
                    assert option in all_options or option in OTHER_TOOLS_OPTIONS, (
                        f"{mention.where}: option {option} (in `{mention.text}`) belongs to "
                        "no trtpack command; name its tool in OTHER_TOOLS_OPTIONS if it is "
                        "another's")
            elif is_synopsis(mention):
                check_synopsis(mention)
            else:
                assert mention.text in RUN or mention.text in RUN_SLOW or \
                    mention.text in NOT_ON_THIS_MACHINE, (
                        f"{mention.where}: `{mention.text}` is neither run by this test (RUN) "
                        "nor listed in NOT_ON_THIS_MACHINE with its reason")
                parse(mention)
        except AssertionError as e:
            problems.append(str(e).splitlines()[0])
    assert not problems, "README commands:\n" + "\n".join(problems)


def usage_shown(document: Path) -> dict[tuple[str, ...], set[str]]:
    """The options each command shows in DOCUMENT's fenced blocks (the usage block), by
    command path; a command written without options maps to an empty set."""
    shown: dict[tuple[str, ...], set[str]] = {}
    for mention in mentions():
        if mention.document != document or not mention.fenced:
            continue
        for alternative in mention.text.split(" | "):
            words = alternative.split()
            words = words[1:] if words[0] == "trtpack" else words
            path, _, _ = app_command([w for w in words if not w.startswith("[")])
            shown.setdefault(tuple(path), set()).update(OPTION.findall(alternative))
    return shown


def test_the_usage_block_shows_every_command_and_option() -> None:
    """The usage block in docs/cli.md (the synopsis of each command) shows every command
    the CLI has and every option of each: a command or option added to the CLI is
    documented there."""
    shown = usage_shown(USAGE)
    leaves = [tuple(p) for p in _command_paths() if not hasattr(app_command(p)[1], "commands")]
    absent = ", ".join(f"'trtpack {' '.join(p)}'" for p in leaves if p not in shown)
    assert not absent, f"{USAGE.relative_to(ROOT)} usage block: no {absent}"
    for path in leaves:
        command = app_command(list(path))[1]
        missing = sorted(
            next(o for o in p.opts if o.startswith("--")) for p in command.params
            if any(o.startswith("--") for o in p.opts) and p.opts != ["--help"]
            and not {*p.opts, *p.secondary_opts} & shown[path])
        assert not missing, (f"{USAGE.relative_to(ROOT)} usage block: 'trtpack "
                             f"{' '.join(path)}' does not show {', '.join(missing)}")


def test_no_command_is_listed_that_the_readme_no_longer_has() -> None:
    written = {m.text for m in mentions()}
    stale = [c for c in [*RUN, *RUN_SLOW, *NOT_ON_THIS_MACHINE] if c not in written]
    assert not stale, f"listed in tests/test_readme.py but not in the docs: {stale}"


def _command_paths() -> list[list[str]]:
    from tests.cli.test_cli_contract import commands

    return commands()


def substitute(command: str) -> list[str]:
    def substituted(word: str) -> str:
        head, sep, rest = word.partition("/")
        return PLACEHOLDERS.get(word) or (PLACEHOLDERS[head] + sep + rest
                                          if sep and head in PLACEHOLDERS else word)

    return [substituted(word) for word in shlex.split(command)[1:]]


@pytest.fixture(scope="module")
def readme_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working folder every README command runs in, with one stage cache."""
    return tmp_path_factory.mktemp("readme")


@pytest.fixture(scope="module")
def readme_runs(readme_folder: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    """RUN, in order, as a user types them (python -m trtpack.cli), sharing a cache."""
    env = {"TRTPACK_CACHE_DIR": str(readme_folder / "cache")}
    results = {}
    for command in RUN:
        if command == "trtpack build model.onnx":  # the ONNX file the command names
            version = readme_folder / "build" / "minilm" / "model_repository" / "minilm" / "1"
            for file in version.glob("model.onnx*"):
                shutil.copyfile(file, readme_folder / file.name)
        results[command] = trtpack(*substitute(command), env=env, cwd=readme_folder)
    return results


@pytest.mark.parametrize("command", RUN)
def test_readme_command_runs(command: str,
                             readme_runs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    result = readme_runs[command]
    assert result.returncode == 0, f"`{command}`: exit {result.returncode}\n{result.stderr}"


def test_readme_claims_about_the_build_hold(
        readme_runs: dict[str, subprocess.CompletedProcess[str]], readme_folder: Path) -> None:
    """What the README says the minilm build prints and writes."""
    built = readme_runs["trtpack build minilm --target cpu --precision fp32"]
    assert 'worst sample: "' in " ".join(built.stdout.split())  # "prints ... the worst text"
    out = readme_folder / "build" / "minilm"
    for name in ("report.json", "report.html", "recipe.yaml", "tuning/perf_analyzer.sh",
                 "model_repository/minilm/config.pbtxt", "model_repository/minilm/1/model.onnx",
                 "logs/export.log"):
        assert (out / name).is_file(), name
    assert "trtpack[tensorrt-cu12]" in " ".join(readme_runs["trtpack doctor"].stdout.split()) \
        or "tensorrt" not in readme_runs["trtpack doctor"].stdout
    shown = readme_runs["trtpack recipes show MODEL"].stdout
    assert shown.startswith("name: minilm\n")


@pytest.mark.slow
@pytest.mark.parametrize("command", RUN_SLOW)
def test_readme_bench_command_runs(command: str, readme_runs: dict[str, Any],
                                   readme_folder: Path) -> None:
    # as written; TRTPACK_BENCH_SECONDS: 0.2 s a row, not 2 (what it prints is the subject)
    env = {"TRTPACK_CACHE_DIR": str(readme_folder / "cache"), "TRTPACK_BENCH_SECONDS": "0.2"}
    result = trtpack(*substitute(command), env=env, cwd=readme_folder, timeout=600)
    assert result.returncode == 0, f"`{command}`: exit {result.returncode}\n{result.stderr}"
    assert "vs eager" in result.stdout


def test_a_wrong_option_in_a_command_is_named(tmp_path: Path) -> None:
    """The checks above name the option a document gets wrong (as --seed once was)."""
    document = tmp_path / "doc.md"
    document.write_text("```\ntrtpack build minilm --seed 3 --target g5\n```\n"
                        "Use `trtpack build MODEL [--seed N]`.\n")
    fenced, inline = (Mention(document, 2, "trtpack build minilm --seed 3 --target g5", True),
                      Mention(document, 4, "trtpack build MODEL [--seed N]", False))
    with pytest.raises(AssertionError, match=r"No such option: --seed"):
        parse(fenced)
    with pytest.raises(AssertionError, match=r"'trtpack build' has no option --seed"):
        check_synopsis(inline)


if __name__ == "__main__":  # list what the test finds, for whoever edits the README
    for m in mentions():
        print(m.where, m.text, file=sys.stdout)
