"""A factory whose ``nn.Embedding`` has 100 rows and no Hugging Face config (issue 46): the
generated token ids stay inside the table, so it builds and verifies without ``--input
ids=0..99``; a stage's bad-input failure reaches ``trtpack.build`` callers as the
documented ``UserInputError`` (exit 2), not an internal type."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

FACTORY = '''
import torch


class Tagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(100, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, ids):
        return self.head(self.embed(ids)).softmax(-1)


def make():
    torch.manual_seed(0)
    return Tagger().eval(), (torch.randint(0, 100, (2, 12)),)
'''


@pytest.fixture
def factory(tmp_path: Path) -> str:
    path = tmp_path / "tagger_factory.py"
    path.write_text(FACTORY)
    return f"{path}:make"


def test_token_ids_stay_inside_the_embedding(factory: str, tmp_path: Path) -> None:
    import trtpack

    built = trtpack.build(factory, target="cpu", profile="1:2:4", out=tmp_path / "out",
                          cache_dir=tmp_path / "cache")
    assert built.ok
    rows = built.report.to_dict()["verification"]
    assert rows and all(r["passed"] for r in rows)
    ids = np.random.default_rng(0).integers(0, 100, (3, 12))
    probabilities = built.run({"ids": ids})["output"]
    assert probabilities.shape == (3, 12, 4)
    assert np.allclose(probabilities.sum(-1), 1.0, atol=1e-5)


def test_a_stage_bad_input_is_a_user_input_error(factory: str, tmp_path: Path) -> None:
    import trtpack
    from trtpack.errors import UserInputError

    with pytest.raises(UserInputError) as caught:  # ids past the table's 100 rows
        trtpack.build(factory, target="cpu", profile="1:2:4", input=["ids=0..150"],
                      out=tmp_path / "out", cache_dir=tmp_path / "cache")
    assert type(caught.value) is UserInputError
    assert caught.value.exit_code == 2 and "IndexError" in str(caught.value)
