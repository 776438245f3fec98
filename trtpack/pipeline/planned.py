"""A stage of one build as planned before anything runs (``PlannedStage``: its key, whether
a cache has it, and for an entry left in the remote cache which of its files are here), and
which remote entries' files the stages that will run read (``remote_entries_read``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from trtpack.options import BuildPlan
from trtpack.pipeline.stage import Stage

if TYPE_CHECKING:
    from trtpack.pipeline.remote_cache import RemoteEntry


@dataclass
class PlannedStage:
    """A stage of this build with its cache key, known before anything runs. ``cached``: in
    the local cache, or in the remote one (``remote``: its manifest, when its files were not
    downloaded because no stage that runs reads them)."""

    stage: Stage
    module: ModuleType
    key: str
    cached: bool
    remote: RemoteEntry | None = None
    # the entry found damaged in the remote cache (the stage runs again and replaces it)
    discarded: str | None = None
    # the artifacts its entry holds (by ``Artifacts`` field), where known
    made: frozenset[str] | None = None
    # an entry left in the remote cache of which only some artifacts' files were downloaded
    # (``RemoteCache.fetch``): those artifacts, and the folder holding their checked files
    part: Path | None = None
    part_names: frozenset[str] = frozenset()


def remote_entries_read(planned: list[PlannedStage], plan: BuildPlan
                        ) -> list[tuple[PlannedStage, frozenset[str] | None]]:
    """The planned stages whose entry is in the remote cache only and whose files a stage
    that runs reads (``Stage.reads``), in order, each with the artifacts read from it (None:
    all of them): walking back from the last stage, each stage that runs adds what it reads,
    and each entry met takes away what it made. Only entries made by stages upstream of a
    miss are downloaded (a hit needs no inputs), and of those only the artifacts read (an
    entry fetched in part already, ``PlannedStage.part``, only for more than that part)."""
    wanted: list[tuple[PlannedStage, frozenset[str] | None]] = []
    needed: set[tuple[str, ...]] | None = set()  # None: every artifact
    for p in reversed(planned):
        if p.cached and p.made is not None and needed is not None:
            read = {g for g in needed if p.made & set(g)}
            names = frozenset(n for g in read for n in g if n in p.made)
            if p.remote is not None and read and not names <= p.part_names:
                wanted.append((p, names))
            needed -= read
        elif p.remote is not None:  # what every stage that runs from here on reads
            wanted.append((p, None))
        elif not p.cached:
            reads = p.stage.reads(plan)
            needed = None if needed is None or reads is None else needed | set(reads)
    return wanted[::-1]
