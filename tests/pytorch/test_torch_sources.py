"""PyTorch sources told apart without torch (``trtpack.sources.torch_sources``), their
identity by files, the errors a user meets, and ``import trtpack`` / ``BuildRequest`` from
Python. Builds of real models are in ``test_torch_models.py``."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, trtpack
from trtpack.api import BuildRequest
from trtpack.errors import UserInputError
from trtpack.sources.torch_sources import SourceFiles, torch_file_kind, torch_source


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small module saved every way a user saves one."""
    import torch

    class Small(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x)

    root = tmp_path_factory.mktemp("saved")
    module = Small().eval()
    example = (torch.randn(3, 4),)
    files = {"pt2": root / "small.pt2", "script": root / "small.pt",
             "weights": root / "weights.pt", "pickle": root / "module.pth",
             "unbounded": root / "unbounded.pt2"}
    torch.export.save(torch.export.export(module, example, dynamic_shapes=(
        {0: torch.export.Dim("batch", max=16)},)), str(files["pt2"]))
    torch.export.save(torch.export.export(module, example, dynamic_shapes=(
        {0: torch.export.Dim("b")},)), str(files["unbounded"]))
    torch.jit.save(torch.jit.script(module), str(files["script"]))
    torch.save(module.state_dict(), files["weights"])
    torch.save(module.state_dict(), files["pickle"], _use_new_zipfile_serialization=False)
    return files


def test_files_are_told_apart_by_content(saved: dict[str, Path], tmp_path: Path) -> None:
    assert torch_file_kind(saved["pt2"]) == "exported_program"
    assert torch_file_kind(saved["script"]) == "torchscript"
    renamed = tmp_path / "model.bin"  # a TorchScript archive named otherwise still is one
    renamed.write_bytes(saved["script"].read_bytes())
    assert torch_file_kind(renamed) == "torchscript"
    for pickle in (saved["weights"], saved["pickle"]):  # zip and legacy torch.save
        with pytest.raises(UserInputError, match=r"torch\.save pickle") as caught:
            torch_file_kind(pickle)
        assert "torch.export.save" in (caught.value.hint or "")
    text = tmp_path / "notes.pt"
    text.write_text("not a model")
    with pytest.raises(UserInputError, match="named like a PyTorch model"):
        torch_file_kind(text)
    other_zip = tmp_path / "other.pt2"
    with zipfile.ZipFile(other_zip, "w") as z:
        z.writestr("a/readme.txt", "hello")
    with pytest.raises(UserInputError, match=r"neither a torch\.export"):
        torch_file_kind(other_zip)


def test_model_strings(tmp_path: Path, saved: dict[str, Path]) -> None:
    factory = tmp_path / "make.py"
    factory.write_text("def make_model():\n    return None\n")
    assert torch_source(f"{factory}:make_model") == {"factory": f"{factory.resolve()}:make_model"}
    assert torch_source("my_pkg.models:make_model") == {"factory": "my_pkg.models:make_model"}
    assert torch_source(str(saved["pt2"])) == {"exported_program": str(saved["pt2"].resolve())}
    assert torch_source("minilm") is None and torch_source("org/name") is None
    with pytest.raises(UserInputError, match="does not exist"):
        torch_source(str(tmp_path / "absent.py") + ":make_model")
    with pytest.raises(UserInputError, match="does not exist"):
        torch_source(str(tmp_path / "absent.pt2"))


def test_source_files_follow_edits(tmp_path: Path) -> None:
    code, weights = tmp_path / "model.py", tmp_path / "weights.bin"
    code.write_text("A = 1\n")
    weights.write_bytes(b"\x00" * 64)
    recorded = SourceFiles.of([str(code), str(weights)])
    same = recorded.current()
    assert same is not None and same.key() == recorded.key()
    os.utime(code, ns=(1, 1))  # touched, content unchanged: still the same source
    touched = recorded.current()
    assert touched is not None and touched.key() == recorded.key()
    weights.write_bytes(b"\x01" + b"\x00" * 63)
    assert recorded.current() is None
    assert SourceFiles.of([str(code), str(weights)]).key() != recorded.key()


def test_build_request_from_python() -> None:
    request = BuildRequest(model=Path("model.pt2"), out="/tmp/x", profiles="1x4:2x8:4x16",
                           inputs="sr=16000", cache_dir="cache")
    assert request.out == Path("/tmp/x") and request.cache_dir == Path("cache")
    assert request.profiles == ["1x4:2x8:4x16"] and request.inputs == ["sr=16000"]
    assert request.model == "model.pt2"


def test_import_trtpack_is_light() -> None:
    code = ("import sys, trtpack; trtpack.BuildRequest; trtpack.build; trtpack.BuiltModel; "
            "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip() == "[]"


def _one_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    return result.stderr


def test_user_errors_name_what_is_missing(saved: dict[str, Path], tmp_path: Path) -> None:
    cache = ["--cache-dir", str(tmp_path / "cache"), "--target", "cpu",
             "--out", str(tmp_path / "out")]
    stderr = _one_error(trtpack("build", str(saved["weights"]), *cache, usage_error=True))
    assert "torch.save pickle" in stderr and "hint:" in stderr
    stderr = _one_error(trtpack("build", str(saved["unbounded"]), *cache, usage_error=True))
    assert "batch" in stderr and "--profile" in stderr
    stderr = _one_error(trtpack("build", str(saved["script"]), *cache, usage_error=True))
    assert "input 'x'" in stderr and "--input x=" in stderr
    stderr = _one_error(trtpack("build", str(saved["script"]), "--input",
                                "y=float32[batch,4]", *cache, usage_error=True))
    assert "no argument 'y'" in stderr and "x" in stderr
    assert not (tmp_path / "out").exists()


def test_python_build_of_a_recipe_name_serves_what_the_cli_serves(tmp_path: Path) -> None:
    """A built-in recipe by name through ``trtpack.build`` (as ``trtpack build tiny-bert``),
    with ``--serve text`` (minilm's tokenizer): the repository also holds the tokenizer's
    ``model.py`` and an ensemble, and the model's weights sit beside it in ``model.onnx.data``.
    ``served_model`` is the file the package stage recorded (a glob of ``*/1/model.*`` once took the
    tokenizer's ``model.py`` or the weights, by directory order), and ``run`` on it answers
    as the PyTorch reference the export recorded."""
    import numpy as np

    import trtpack as api
    from tests.hf_models import minilm_dir
    from trtpack.cases import load_cases

    built = api.build("tiny-bert", random_weights=True, target="cpu", profile="1x4:2x8:4x16",
                      set="config.vocab_size=30522", tokenizer=minilm_dir(), serve="text",
                      out=tmp_path / "out", cache_dir=tmp_path / "cache")
    version = built.model_repository / "tiny-bert" / "1"
    assert built.served_model == version / "model.onnx"
    assert (version / "model.onnx.data").is_file()  # external weights beside it
    assert (built.model_repository / "tiny-bert_tokenizer" / "1" / "model.py").is_file()
    case = load_cases(tmp_path / "out" / "artifacts" / "export" / "reference.npz")[-1]
    outputs = built.run(case.inputs)
    for name, want in case.outputs.items():
        np.testing.assert_allclose(outputs[name], want, atol=1e-4, err_msg=name)


def test_a_fraction_for_an_int_argument_is_named(tmp_path: Path) -> None:
    """``--input step=2.5`` for a TorchScript ``step: int`` names ``step`` (it was blamed on
    the tensor input ``x``); ``step=2.0`` is taken as the whole number it is."""
    import torch

    class Counter(torch.nn.Module):
        def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
            return torch.cumsum(x, dim=-1) * step

    model = tmp_path / "counter.pt"
    torch.jit.save(torch.jit.script(Counter()), str(model))
    cache = ["--cache-dir", str(tmp_path / "cache"), "--target", "cpu",
             "--out", str(tmp_path / "out"), "--input", "x=float32[batch,8]"]
    stderr = _one_error(trtpack("build", str(model), "--input", "step=2.5", *cache,
                                usage_error=True))
    assert "'step'" in stderr and "not a whole number" in stderr, stderr
    assert "described as x=" not in stderr
    assert not (tmp_path / "out").exists()
    done = trtpack("build", str(model), "--input", "step=2.0", *cache)
    assert done.returncode == 0, done.stderr


def test_a_range_for_an_int_argument_says_why_it_cannot_be_one(tmp_path: Path) -> None:
    """``--input step=0..10`` for a TorchScript ``step: int`` said "not described, give it
    --input step=VALUE" as if no value were given: it names the range, says that an ``int``
    argument is folded into the graph as one constant (no served input takes a range), and
    suggests one value. A range for a tensor input the user also describes still builds a
    description (the values apply later)."""
    import torch

    from trtpack.api.recipes import describe_torch

    class Counter(torch.nn.Module):
        def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
            return torch.cumsum(x, dim=-1) * step

    model = tmp_path / "counter.pt"
    torch.jit.save(torch.jit.script(Counter()), str(model))
    source = torch_source(str(model))
    assert source is not None

    def describe(*inputs: str) -> object:
        request = BuildRequest(model=str(model), inputs=list(inputs), cache_dir=tmp_path)
        return describe_torch(source, request, tmp_path / "cache")

    with pytest.raises(UserInputError) as refused:
        describe("x=float32[batch,8]", "step=0..10")
    message = str(refused.value)
    assert "--input step=0..10" in message and "as an int, not a tensor" in message, message
    assert "one constant" in message and "not described" not in message, message
    assert refused.value.hint == "give it one value, e.g. --input step=0"
    described = describe("x=float32[batch,8]=0..1", "step=3")
    assert described["kind"] == "module" and described["arguments"] == {"step": 3}
