"""A stage's log: each line carries its process's CPU seconds so far (issue 47: a stage's
phases read in CPU time, which a loaded machine moves far less than wall time)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from trtpack.stages.base import stage_logger


def test_each_line_carries_the_process_cpu_seconds_and_they_grow_with_work(
        tmp_path: Path) -> None:
    log_path = tmp_path / "stage.log"
    logger, handler = stage_logger(f"trtpack.test.{id(tmp_path)}", log_path)
    try:
        logger.info("before")
        started = time.process_time()
        while time.process_time() - started < 0.3:  # 0.3 s of this process's CPU
            sum(i * i for i in range(10_000))
        logger.info("after")
    finally:
        logger.removeHandler(handler)
        handler.close()
    lines = log_path.read_text().splitlines()
    found = [re.fullmatch(r"\S+ \S+ cpu (\d+\.\d) INFO (\w+)", line) for line in lines]
    assert all(found), lines
    before, after = (float(m.group(1)) for m in found if m)
    assert after - before >= 0.2
