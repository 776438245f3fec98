"""Triton's TensorRT-backend rules for shape profiles, mirrored in pure Python.

Read in ``triton-inference-server/tensorrt_backend`` at commit e2ef6d7 (main, 2026-07-17).
Triton's TensorRT backend (``src/instance_state.cc``) makes one execution context per
optimization profile listed in the instance group (``InitOptimizationProfiles``; none
listed: profile 0 alone, named "default", and ``model_state.cc``'s ``GetProfileIndices``
likewise defaults to ``{0}``) and, at load time, runs
``TRTv3Interface::ConfigureInputDimensions`` for every input of every context: the config's
dims with the batch dimension set to ``max_batch_size`` are checked against the profile
(``ValidateDimension`` with the batch as a wildcard), each wildcard dim becomes the
profile's max and the batch becomes ``min(profile max batch, max_batch_size)``
(``MaximumDims`` and the "WAR" after it), and ``setBindingDimensions`` of that shape must
succeed, so it must not be below the profile's min: a profile whose min batch is above
``max_batch_size`` fails the whole model's load. At run time, with more than one context,
``GetMostOptimizedProfile`` (line 1832) keeps the first context of the smallest
``EvaluateTensorRTContext`` distance among those whose [min, max] holds every input shape;
that distance is Triton's own arithmetic, quirk included (``triton_distance``). With one
context nothing is evaluated: a shape outside its profile fails in
``SetBindingDimensions`` ("request specifies invalid shape", line 4293). The dynamic
batcher forms any batch from 1 to ``max_batch_size`` out of requests of the same
non-batch shape.

``triton_view`` applies these rules to a written ``config.pbtxt`` and the engine's
profiles; ``batch_coverage_problem`` is the build-time refusal of profile sets that leave
some batch from 1 to ``max_batch_size`` to no profile; ``served_lengths`` is what a text
model's tokenizer may pad to so that any batch the batcher forms has a profile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtpack.engine.provenance import PLAN_FILENAME
from trtpack.shapes import Shape, ShapeProfile, ShapeRange

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


RULE = ("Triton's TensorRT backend serves a batch only with a profile whose batch range holds "
        "it, and its dynamic batcher forms every batch from 1 to max_batch_size")
"""The rule a refused profile set breaks, named in the error."""


@dataclass(frozen=True)
class TritonView:
    """What Triton would do with a model: whether it loads, and each profile's served
    [min, max] shape per input (None for a profile that fails to load)."""

    load_errors: tuple[str, ...]
    served: tuple[dict[str, tuple[Shape, Shape]] | None, ...]
    opt: tuple[dict[str, Shape], ...]
    max_batch_size: int

    @property
    def loads(self) -> bool:
        return not self.load_errors

    def select_profile(self, shapes: dict[str, Shape]) -> int | None:
        """The profile Triton runs a batch of these input shapes on, or None (an error):
        among the profiles whose [min, max] holds every shape, the first of the smallest
        ``triton_distance`` (``GetMostOptimizedProfile``: ``current_distance <
        shortest_distance``, contexts in profile order)."""
        if self.max_batch_size > 0 and any(s[0] > self.max_batch_size
                                           for s in shapes.values()):
            return None
        best: tuple[int, int] | None = None  # (distance, index)
        for index, served in enumerate(self.served):
            if served is None:
                continue
            distance = 0
            for name, shape in shapes.items():
                low, high = served[name]
                if len(shape) != len(low) or any(
                        not lo <= d <= hi for d, lo, hi in zip(shape, low, high, strict=True)):
                    break
                distance += triton_distance(self.opt[index][name], shape,
                                            batched=self.max_batch_size > 0)
            else:
                if best is None or distance < best[0]:
                    best = (distance, index)
        return None if best is None else best[1]

    def reachable_profiles(self) -> set[int]:
        """Profiles some batch selects: each profile's own opt shape (its batch clamped to
        what it serves) is tried."""
        found: set[int] = set()
        for index, served in enumerate(self.served):
            if served is None:
                continue
            shapes = {name: tuple(min(max(d, lo), hi) for d, lo, hi in
                                  zip(self.opt[index][name], low, high, strict=True))
                      for name, (low, high) in served.items()}
            chosen = self.select_profile(shapes)
            if chosen is not None:
                found.add(chosen)
        return found


def triton_distance(opt: Shape, shape: Shape, batched: bool) -> int:
    """``EvaluateTensorRTContext``'s distance of one input (tensorrt_backend
    ``src/instance_state.cc``, lines 1908-1910 and 1977-1983 at e2ef6d7): with batching,
    the request's shape vector holds the full shape with its first entry replaced by the
    batch (``input_shape_vec[0] = total_batch_size``), and the sum is
    ``|opt[0] - batch| + sum over idx >= 1 of |opt[idx] - input_shape_vec[idx - 1]|``: the
    index is off by one, so opt's second dimension (the sequence length of a text model)
    is compared with the batch, not with the request's own second dimension. Without
    batching the vector is the request's shape and the batch is 1 (one request)."""
    vec = list(shape)
    batch = shape[0] if batched else 1
    if batched:
        vec[0] = batch
    return abs(opt[0] - batch) + sum(abs(opt[idx] - vec[idx - 1]) for idx in range(1, len(opt)))


def _config_profiles(config: ModelConfig) -> list[int]:
    """The profiles an instance gets a context for: those listed in the instance groups,
    else profile 0 alone (``InitOptimizationProfiles``: ``("default", 0)``)."""
    listed = [int(p) for group in config.instance_group for p in group.profile]
    return sorted(set(listed)) if listed else [0]


def triton_view(config: ModelConfig, profiles: Sequence[ShapeProfile]) -> TritonView:
    """Triton's load and profile-selection rules applied to a ``ModelConfig`` (Triton's
    schema) and the engine's optimization profiles (in the engine's order)."""
    mbs = int(config.max_batch_size)
    errors: list[str] = []
    served: list[dict[str, tuple[Shape, Shape]] | None] = []
    opts: list[dict[str, Shape]] = []
    used = _config_profiles(config)
    for index, profile in enumerate(profiles):
        opts.append({name: r.opt for name, r in profile.shapes.items()})
        if index not in used:
            served.append(None)
            continue
        ranges: dict[str, tuple[Shape, Shape]] = {}
        for tensor in config.input:
            r = profile.shapes.get(tensor.name)
            if r is None:
                errors.append(f"profile {index} has no shape for input '{tensor.name}'")
                continue
            dims = ([-1] if mbs > 0 else []) + [int(d) for d in tensor.dims]
            if len(dims) != len(r.max):
                errors.append(f"input '{tensor.name}': config rank {len(dims)}, profile {index} "
                              f"rank {len(r.max)}")
                continue
            maximum = []
            for axis, (d, lo, hi) in enumerate(zip(dims, r.min, r.max, strict=True)):
                if d == -1:
                    top = min(hi, mbs) if axis == 0 and mbs > 0 else hi
                elif not lo <= d <= hi:
                    errors.append(f"input '{tensor.name}': config dim {d} outside profile "
                                  f"{index}'s [{lo}, {hi}]")
                    top = d
                else:
                    top = d
                maximum.append(top)
            if any(m < lo for m, lo in zip(maximum, r.min, strict=True)):
                errors.append(
                    f"profile {index}: input '{tensor.name}' min {list(r.min)} is above the "
                    f"shape Triton sets at load, {maximum} (batch = min(profile max batch, "
                    f"max_batch_size {mbs}))")
            ranges[tensor.name] = (tuple(r.min), tuple(maximum))
        served.append(ranges)
    if errors:
        served = [None] * len(profiles)
    return TritonView(tuple(errors), tuple(served), tuple(opts), mbs)


def _batch(profile: ShapeProfile) -> tuple[int, int, int]:
    return profile.axis_range(0)


def engine_max_batch_size(profiles: Sequence[ShapeProfile]) -> int:
    """The ``max_batch_size`` that lets every profile load and be used: the largest
    profile max batch (with the smallest, a profile whose min batch is above it fails
    Triton's load, and larger profiles are never used)."""
    return max(_batch(p)[2] for p in profiles)


def batch_coverage_problem(profiles: Sequence[ShapeProfile], batched: bool = True) -> str | None:
    """Why Triton cannot serve these profiles' batch ranges, or None: every batch from 1
    (``batched``: the dynamic batcher forms any batch from 1 to ``max_batch_size``; else
    from the smallest min batch) to the largest max batch must fall in some profile's
    range."""
    ranges = sorted((_batch(p)[0], _batch(p)[2]) for p in profiles)
    first = min(profiles, key=lambda p: _batch(p)[0])
    if batched and ranges[0][0] > 1:
        low = ranges[0][0]
        return (f"the profiles' batch ranges leave batch 1"
                f"{'' if low == 2 else f'-{low - 1}'} to no profile: {RULE} "
                f"({_ranges_text(ranges)}), and a request below batch {low} fails "
                f"(\"request specifies invalid shape\"); add a profile that starts at batch 1, "
                f"e.g. --profile {_profile_from_batch_one(first, low)}")
    reach = ranges[0][1]
    for low, high in ranges[1:]:
        if low > reach + 1:
            return (f"the profiles' batch ranges leave batch {reach + 1}"
                    f"{'' if low - 1 == reach + 1 else f'-{low - 1}'} to no profile: {RULE} "
                    f"({_ranges_text(ranges)}); make the ranges meet, e.g. start the next "
                    f"profile at batch {reach + 1}")
        reach = max(reach, high)
    return None


def _profile_from_batch_one(profile: ShapeProfile, up_to: int) -> str:
    """``profile``'s shapes with the batch range 1..``up_to``, as a ``--profile`` value."""
    def text(r: ShapeRange) -> str:
        opt_batch = max(1, up_to // 2)
        return ":".join("x".join(str(d) for d in (b, *s[1:]))
                        for b, s in ((1, r.min), (opt_batch, r.opt), (up_to, r.max)))

    parts = {name: text(r) for name, r in profile.shapes.items()}
    if len(set(parts.values())) == 1:
        return next(iter(parts.values()))
    return ",".join(f"{name}={t}" for name, t in parts.items())


def _ranges_text(ranges: Sequence[tuple[int, int]]) -> str:
    return "batch " + ", ".join(f"{lo}-{hi}" for lo, hi in ranges)


def preferred_batch_sizes(profiles: Sequence[ShapeProfile], max_batch_size: int) -> list[int]:
    """Batch sizes the dynamic batcher should aim for: every profile's opt batch above 1
    (an opt batch of 1 as a preferred size sends requests on one at a time) and the
    largest batch, all within ``max_batch_size``."""
    sizes = {_batch(p)[1] for p in profiles if _batch(p)[1] > 1} | {max_batch_size}
    return sorted(s for s in sizes if 1 < s <= max_batch_size)


def served_lengths(profiles: Sequence[ShapeProfile], input_name: str,
                   max_batch_size: int) -> list[int]:
    """Sequence lengths (axis 1 of ``input_name``) at which every batch from 1 to
    ``max_batch_size`` has a profile: the lengths a tokenizer may pad requests to, since
    the dynamic batcher merges requests of one length into any batch."""
    spans = []
    for p in profiles:
        r = p.shapes.get(input_name)
        if r is None or len(r.min) < 2:
            continue
        spans.append((r.min[0], min(r.max[0], max_batch_size), r.min[1], r.max[1]))
    if not spans:
        return []
    lengths = []
    for length in range(min(s[2] for s in spans), max(s[3] for s in spans) + 1):
        batches = sorted((b0, b1) for b0, b1, s0, s1 in spans if s0 <= length <= s1)
        reach = 0
        for b0, b1 in batches:
            if b0 > reach + 1:
                break
            reach = max(reach, b1)
        if reach >= max_batch_size:
            lengths.append(length)
    return lengths


def no_served_length_problem(profiles: Sequence[ShapeProfile], input_name: str) -> str | None:
    """Why a tokenizer could pad to no length (``served_lengths`` is empty), or None."""
    mbs = engine_max_batch_size(profiles)
    if served_lengths(profiles, input_name, mbs):
        return None
    return (f"--serve text: no sequence length of '{input_name}' is served by these profiles "
            f"at every batch from 1 to {mbs}: {RULE}; give the profiles a common sequence "
            "length (e.g. one profile's max sequence inside another's range)")


def partly_served_lengths_warning(profiles: Sequence[ShapeProfile],
                                  input_name: str) -> str | None:
    """A warning naming the sequence lengths of ``input_name`` that some batch up to
    ``max_batch_size`` cannot be served at, or None when every length is served at every
    batch."""
    mbs = engine_max_batch_size(profiles)
    served = set(served_lengths(profiles, input_name, mbs))
    low = min(p.shapes[input_name].min[1] for p in profiles if input_name in p.shapes)
    high = max(p.shapes[input_name].max[1] for p in profiles if input_name in p.shapes)
    missing = [n for n in range(low, high + 1) if n not in served]
    if not missing:
        return None
    spans: list[list[int]] = []
    for n in missing:
        if spans and spans[-1][1] == n - 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    return (f"sequence lengths {text} of '{input_name}' are not served at every batch up to "
            f"max_batch_size {mbs} (Triton's dynamic batcher merges requests of one shape into "
            "any batch, and a batch no profile holds fails): clients should pad to a served "
            "length (--serve text does), or give profiles that cover every length at every "
            "batch")


def padding_buckets(lengths: Sequence[int]) -> list[int]:
    """The lengths a tokenizer pads to, out of ``lengths`` (served at every batch): the
    shortest, every power of two between, the longest. Few distinct lengths let the
    dynamic batcher merge requests of different text lengths; padding at most doubles a
    request's tokens."""
    if not lengths:
        return []
    served = set(lengths)
    buckets = {lengths[0], lengths[-1]}
    power = 1
    while power < lengths[-1]:
        if power in served:
            buckets.add(power)
        power *= 2
    return sorted(buckets)


def engine_file(config: ModelConfig, compute_capability: tuple[int, int]) -> str:
    """The file of the version folder a TensorRT-backend instance on a GPU of this compute
    capability loads: ``cc_model_filenames["<major>.<minor>"]``, else
    ``default_model_filename``, else ``model.plan`` (Triton core's ``ArtifactFilename``;
    tensorrt_backend ``ModelInstanceState::Create``, which fails the load with "unable to
    find '<path>'" when that file is absent)."""
    key = f"{compute_capability[0]}.{compute_capability[1]}"
    if key in config.cc_model_filenames:
        return str(config.cc_model_filenames[key])
    return str(config.default_model_filename or PLAN_FILENAME)


def shared_graph_shapes(profiles: Sequence[ShapeProfile]) -> list[dict[str, Shape]]:
    """The CUDA-graph shapes every profile's context can capture: each profile's opt shape
    clamped into the shapes that every profile holds, without repeats; empty when the
    profiles hold no shape in common. tensorrt_backend ``InitializeCudaGraph``
    (``src/instance_state.cc`` line 3667 at e2ef6d7) captures every graph spec on every
    context ("CUDA graph will be captured for every TRT contexts"), and a spec outside a
    context's profile fails there with "Failed to set cuda graph shape" (an error logged
    per spec and context, ``BuildCudaGraph``)."""
    names = [n for n in profiles[0].shapes if all(n in p.shapes for p in profiles)]
    low = {n: [max(d) for d in zip(*(p.shapes[n].min for p in profiles), strict=True)]
           for n in names}
    high = {n: [min(d) for d in zip(*(p.shapes[n].max for p in profiles), strict=True)]
            for n in names}
    if any(lo > hi for n in names for lo, hi in zip(low[n], high[n], strict=True)):
        return []
    shapes: list[dict[str, Shape]] = []
    for p in profiles:
        shape = {n: tuple(min(max(d, lo), hi) for d, lo, hi in
                          zip(p.shapes[n].opt, low[n], high[n], strict=True)) for n in names}
        if shape not in shapes:
            shapes.append(shape)
    return shapes
