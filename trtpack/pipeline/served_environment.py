"""Which build environments a stage server's template may serve (``pipeline.stage_server``).

A template imported its stage's packages in the server's environment; a library may have read
a variable then (``OMP_NUM_THREADS`` by torch, ``HF_HOME`` by transformers, ...), so a build
whose environment differs in such a variable must start its stage process fresh. Only the
variables below may differ.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# Variables a build's environment may hold with another value than the template's: read by
# trtpack when a stage runs, never by an import (``test_stage_server`` checks this list
# against the names in trtpack/). Any other difference refuses the request: the libraries a
# template imported may have read it (OMP_NUM_THREADS, HF_HOME, PYTHONPATH, ...).
CALL_TIME_VARIABLES = frozenset({
    "PYTEST_CURRENT_TEST", "PWD", "OLDPWD", "SHLVL", "_",  # pytest's and the shell's notes
    "COLUMNS", "LINES",  # the terminal's size (readline sets them), read when printing
    "TRTPACK_BENCH_SECONDS", "TRTPACK_CACHE_BUDGET", "TRTPACK_CACHE_DIR", "TRTPACK_CACHE_URL",
    "TRTPACK_CPU_TIMING_SECONDS", "TRTPACK_INT8_QUANTIZER", "TRTPACK_MEMORY_AVAILABLE",
    "TRTPACK_NO_COMPILE_CHECK", "TRTPACK_NO_PRESTART", "TRTPACK_ONNXSIM_TIMEOUT",
    "TRTPACK_PERF_ANALYZER", "TRTPACK_STAGE_SERVER", "TRTPACK_TEST_KILL_AUTOCAST",
    "TRTPACK_TEST_KILL_STORE_DURING_UPLOAD",
})

# Variables (by prefix) read only by the libraries named, and by those only when they are
# called: a build's may differ from a template's while the template has not imported any of
# them (checked per request against the template's modules: one that has refuses, as for any
# other variable). AWS_*: botocore reads them when a session or client is made (endpoint,
# credentials, region, config files), never at import; trtpack makes those in the build's own
# process only (``pipeline.remote_cache``, ``engine.timing_caches``, ``machine.object_store``),
# and no stage module or warm module imports boto3 or botocore (test_stage_server checks the
# served templates). A stage process that imported them after its fork would read the build's
# environment, which it runs with.
# TORCHINDUCTOR_*: torch's compiler reads them (its cache folder) when it runs; a template
# without torch never has it imported (the export's template sets TORCHINDUCTOR_CACHE_DIR as
# it imports, see ``environment_difference``). TORCHINDUCTOR_CACHE_DIR itself is read by the
# compiler's own modules only (torch._inductor), which ``import torch`` does not load: the
# ModelOpt worker's template imports torch without them. A variable takes the readers of the
# longest prefix it starts with; a reader is a module and the modules under it.
READ_BY_UNIMPORTED: dict[str, tuple[str, ...]] = {
    "AWS_": ("boto3", "botocore", "s3transfer"),
    "TORCHINDUCTOR_": ("torch",),
    "TORCHINDUCTOR_CACHE_DIR": ("torch._inductor",),
}


def _unread(name: str, imported: frozenset[str]) -> bool:
    """Whether ``name`` belongs to ``READ_BY_UNIMPORTED`` and none of its readers is among the
    ``imported`` modules."""
    prefixes = [p for p in READ_BY_UNIMPORTED if name.startswith(p)]
    if not prefixes:
        return False
    readers = READ_BY_UNIMPORTED[max(prefixes, key=len)]
    return not any(m == r or m.startswith(r + ".") for r in readers for m in imported)


def environment_difference(build: Mapping[str, str], template: Mapping[str, str],
                           imported: Iterable[str] = (),
                           imports_set: Mapping[str, str] | None = None) -> str | None:
    """The first variable that the build's environment has with another value than the
    template's before its imports (``template``; or that only one has), outside
    ``CALL_TIME_VARIABLES``, ``READ_BY_UNIMPORTED``'s prefixes whose libraries are not among
    ``imported`` (the template's modules), and the variables its imports set
    (``imports_set``) to the value the build holds: the served process runs with that value,
    as a fresh one would (the export's imports compute torch's compiler cache folder and write
    it to ``TORCHINDUCTOR_CACHE_DIR``; a build whose own torch did the same holds that value).
    None: none."""
    loaded = frozenset(imported)
    computed = imports_set or {}
    for name in sorted(set(build) | set(template)):
        if name in CALL_TIME_VARIABLES or _unread(name, loaded):
            continue
        if name in computed and build.get(name) == computed[name]:
            continue
        if build.get(name) != template.get(name):
            return name
    return None


def requester(env: Mapping[str, str]) -> str:
    """Who asked, for the server's log: the test a build runs in, when pytest runs it
    (``PYTEST_CURRENT_TEST``), so that served and refused requests can be counted per test."""
    test = env.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    return f" for {test}" if test else ""
