"""One home for each fact: a module-level constant (an UPPER_CASE name bound to a literal), a
choice set (a tuple, list, set or frozenset of strings named by an assignment or a
``Literal[...]``, or written inline after ``in`` with three strings or more, or equal to a
named one) and a mapping (a module-level dict literal) are written once in trtpack, and
imported where else they are needed."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path

import trtpack

PACKAGE = Path(trtpack.__file__).parent
KNOWN: dict[str, str] = {}
"""Duplicates left on purpose, with the reason."""
SHARED_ITEMS = 3
"""Two mappings that hold this many equal entries write one table twice (one a part of the
other, say)."""


def duplicated_constants(sources: Mapping[str, str]) -> dict[str, list[str]]:
    """NAME=value -> the modules that each define it, for those defined in more than one."""
    homes: dict[str, list[str]] = defaultdict(list)
    for module, source in sources.items():
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper():
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    continue
                homes[f"{node.targets[0].id}={value!r}"].append(module)
    return {k: v for k, v in homes.items() if len(v) > 1}


def strings(node: ast.expr | None) -> frozenset[str] | None:
    """The strings of a literal choice set (two or more), else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in ("frozenset", "set", "tuple", "list") and len(node.args) == 1:
        return strings(node.args[0])
    if not isinstance(node, ast.Tuple | ast.List | ast.Set) or len(node.elts) < 2:
        return None
    values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
    if len(values) < len(node.elts) or not all(isinstance(v, str) for v in values):
        return None
    return frozenset(str(v) for v in values)


def choice_sets(tree: ast.Module) -> Iterator[tuple[int, frozenset[str], bool]]:
    """(line, strings, named) for each choice set: named by an assignment or a ``Literal``,
    or inline after ``in``."""
    for node in ast.walk(tree):
        named: ast.expr | None = None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                and node.value.id == "Literal":
            named = node.slice
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            named = node.value
        if found := strings(named):
            yield node.lineno, found, True
        if isinstance(node, ast.Compare) and any(
                isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            for comparator in node.comparators:
                if found := strings(comparator):
                    yield node.lineno, found, False


def duplicated_choice_sets(sources: Mapping[str, str]) -> dict[str, list[str]]:
    """The strings of a choice set -> where each copy is, for one written twice: two named
    ones, a named one and an inline copy, or two inline copies of three strings or more."""
    homes: dict[frozenset[str], list[tuple[str, bool]]] = defaultdict(list)
    for module, source in sources.items():
        for line, found, named in choice_sets(ast.parse(source)):
            homes[found].append((f"{module}:{line}", named))
    return {", ".join(sorted(found)): sorted(where for where, _ in places)
            for found, places in homes.items()
            if len(places) > 1 and (any(named for _, named in places) or len(found) >= 3)}


def mappings(tree: ast.Module) -> Iterator[tuple[int, dict[object, object]]]:
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            if len(value) >= 2:
                yield node.lineno, value


def duplicated_mappings(sources: Mapping[str, str]) -> list[tuple[str, str]]:
    """Pairs of module-level dict literals that share ``SHARED_ITEMS`` equal entries (or are
    equal)."""
    found = [(f"{module}:{line}", value) for module, source in sources.items()
             for line, value in mappings(ast.parse(source))]
    pairs = []
    for i, (here, mine) in enumerate(found):
        for there, theirs in found[i + 1:]:
            shared = sum(1 for k, v in mine.items() if k in theirs and theirs[k] == v)
            if shared >= min(SHARED_ITEMS, len(mine), len(theirs)):
                pairs.append((here, there))
    return pairs


def package_sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text(encoding="utf-8")
            for p in sorted(PACKAGE.rglob("*.py"))
            if not p.is_relative_to(PACKAGE / "serving" / "templates")}


def test_duplicates_are_found() -> None:
    assert duplicated_constants({"a.py": "X = '1'\nY = 2\n", "b.py": "X = '1'\nY = 3\n"}) \
        == {"X='1'": ["a.py", "b.py"]}


def test_a_choice_set_written_twice_is_found() -> None:
    """The serve modes once as a ``Literal`` and again, reordered, as a checked tuple; an
    inline pair is an ordinary test, a pair equal to a named set a copy."""
    sources = {"options.py": 'Serve = Literal["tensor", "text"]\n',
               "recipe.py": 'if x in ("a", "b"):\n    pass\n',
               "api.py": 'def f(s):\n    return s in ("text", "tensor")\n',
               "levels.py": 'ok = lambda v: v in ("none", "ampere+", "same")\n'
                            'Level = Literal["same", "ampere+", "none"]\n'}
    assert duplicated_choice_sets(sources) == {
        "tensor, text": ["api.py:2", "options.py:1"],
        "ampere+, none, same": ["levels.py:1", "levels.py:2"]}


def test_a_mapping_written_twice_is_found() -> None:
    """A table of ONNX element types, and a part of it again in another module."""
    sources = {"model_io.py": "ELEM = {1: 'float32', 6: 'int32', 7: 'int64', 10: 'float16'}\n",
               "onnx_recipe.py": "_ELEM = {1: 'float32', 7: 'int64', 10: 'float16'}\n",
               "other.py": "NAMES = {1: 'one', 6: 'six'}\n"}
    assert duplicated_mappings(sources) == [("model_io.py:1", "onnx_recipe.py:1")]


def test_each_constant_has_one_home() -> None:
    found = duplicated_constants(package_sources())
    assert {k: v for k, v in found.items() if k.split("=")[0] not in KNOWN} == {}


def test_each_choice_set_and_mapping_has_one_home() -> None:
    sources = package_sources()
    assert {k: v for k, v in duplicated_choice_sets(sources).items() if k not in KNOWN} == {}
    assert duplicated_mappings(sources) == []


JSON_HOME = "json_values.py"
"""The module of the one JSON value type (``JsonValue``, ``JsonObject``)."""
UNTYPED_KEYS = ("dict", "Dict", "Mapping", "MutableMapping")


def loose_json(sources: Mapping[str, str]) -> list[str]:
    """``module:line`` of each ``dict[str, Any]`` (or ``Mapping[str, Any]``) in an annotation or
    alias, where ``JsonObject`` or a typed record says what the data is; and of each second
    JSON type: a name that starts with ``Json`` bound at module level outside ``JSON_HOME``."""
    found = []
    for module, source in sources.items():
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple) \
                    and ast.unparse(node.value).split(".")[-1] in UNTYPED_KEYS \
                    and [ast.unparse(e).split(".")[-1] for e in node.slice.elts] == ["str", "Any"]:
                found.append(f"{module}:{node.lineno}")
        if module == JSON_HOME:
            continue
        for statement in tree.body:
            targets = statement.targets if isinstance(statement, ast.Assign) else \
                [statement.target] if isinstance(statement, ast.AnnAssign) else []
            found += [f"{module}:{statement.lineno}" for t in targets
                      if isinstance(t, ast.Name) and t.id.startswith("Json")]
    return sorted(found)


def test_loose_json_is_found() -> None:
    """A ``dict[str, Any]`` in a signature, a ``Mapping[str, typing.Any]`` in an alias, a
    second JSON value type; a ``dict[str, Any]`` in a docstring and ``JsonObject`` are not."""
    sources = {"views.py": "def rows(r: dict[str, Any]) -> None:\n    '''dict[str, Any]'''\n",
               "cache.py": "Meta = Mapping[str, typing.Any]\nok: dict[str, JsonValue] = {}\n",
               "metrics.py": "JsonValue: TypeAlias = str | int | None\nJSONL = '.jsonl'\n",
               JSON_HOME: "JsonValue = TypeAliasType('JsonValue', 'str | None')\n"}
    assert loose_json(sources) == ["cache.py:1", "metrics.py:1", "views.py:1"]


def test_json_data_has_one_type_and_no_loose_dicts() -> None:
    """JSON data is a ``JsonValue``/``JsonObject`` (``json_values.py``, the one JSON value
    type) read through its checked readers, or a typed record: no ``dict[str, Any]`` and no
    second JSON type."""
    assert loose_json(package_sources()) == []


def cpu_comparisons(sources: Mapping[str, str]) -> list[str]:
    """``module:line`` of each ``== "cpu"`` / ``!= "cpu"`` outside ``machine/``: whether a
    target is a GPU's is answered there (``Target.is_gpu``, ``is_gpu_target``), nowhere else."""
    found = []
    for module, source in sources.items():
        if module.startswith("machine/"):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Compare) \
                    and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops) \
                    and any(isinstance(c, ast.Constant) and c.value == "cpu"
                            for c in [node.left, *node.comparators]):
                found.append(f"{module}:{node.lineno}")
    return found


def test_a_cpu_comparison_is_found() -> None:
    assert cpu_comparisons({"a.py": 'x = t.target == "cpu"\n',
                            "b.py": 'if "cpu" != name:\n    pass\n',
                            "machine/t.py": 'y = n == "cpu"\n',
                            "c.py": 'z = device in ("cpu",)\n'}) == ["a.py:1", "b.py:1"]


def test_whether_a_target_is_a_gpu_is_answered_in_machine_only() -> None:
    assert cpu_comparisons(package_sources()) == []
