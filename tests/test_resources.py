"""resources: the one definition of activations (``activation_bytes``) and the memory this
machine still has (``available_memory``: the cgroup's room, else MemAvailable), read from a
fake /proc and cgroup tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trtpack.resources import Op, activation_bytes, available_memory


def test_a_chain_holds_at_most_one_input_and_one_output() -> None:
    # a -> b -> c: while b is written, a is alive; a is freed after its last read
    ops = [Op(("x",), ("a",)), Op(("a",), ("b",)), Op(("b",), ("c",))]
    sizes = {"x": 1000, "a": 10, "b": 20, "c": 5}
    assert activation_bytes(ops, sizes) == 30  # a + b; x is an input, not an activation


def test_a_tensor_read_later_stays_alive_and_outputs_stay_to_the_end() -> None:
    # a residual: a is read again by the last op; b and c come and go beside it
    ops = [Op(("x",), ("a",)), Op(("a",), ("b",)), Op(("b",), ("c",)), Op(("a", "c"), ("d",))]
    sizes = {"a": 100, "b": 10, "c": 10, "d": 100}
    assert activation_bytes(ops, sizes) == 210  # a + c + d at the last op
    # the first op's output kept as a model output: alive to the end
    assert activation_bytes(ops[:2], {"a": 100, "b": 10}, kept=["a", "b"]) == 110


def test_in_place_writes_and_weights_count_once_or_not_at_all() -> None:
    ops = [Op(("x", "w"), ("a",)), Op(("a",), ("a",)), Op(("a", "w"), ("b",))]
    assert activation_bytes(ops, {"a": 8, "b": 8}) == 16  # w has no size: a weight


def write_proc(root: Path, cgroup: str, available_kb: int) -> Path:
    proc = root / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {available_kb} kB\n")
    return proc


def test_cgroup_v2_limit_wins_when_it_is_smaller(tmp_path: Path) -> None:
    proc = write_proc(tmp_path, "0::/job\n", 16 * 2**20)  # 16 GiB free on the machine
    job = tmp_path / "cg" / "job"
    job.mkdir(parents=True)
    (job / "memory.max").write_text(f"{4 * 2**30}\n")
    (job / "memory.current").write_text(f"{2**30}\n")
    (job / "memory.stat").write_text(f"anon 1\ninactive_file {2**29}\n")
    found = available_memory(proc, tmp_path / "cg")
    assert found is not None
    assert found.bytes == 4 * 2**30 - 2**29  # limit - (usage - reclaimable cache)
    assert "cgroup v2" in found.source and "memory.max" in found.source


def test_cgroup_v1_limit_and_no_limit(tmp_path: Path) -> None:
    proc = write_proc(tmp_path, "4:memory:/box\n0::/\n", 8 * 2**20)
    box = tmp_path / "cg" / "memory" / "box"
    box.mkdir(parents=True)
    (box / "memory.limit_in_bytes").write_text(f"{2**30}\n")
    (box / "memory.usage_in_bytes").write_text(f"{2**28}\n")
    found = available_memory(proc, tmp_path / "cg")
    assert found is not None and found.bytes == 2**30 - 2**28
    assert "cgroup v1" in found.source
    (box / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    found = available_memory(proc, tmp_path / "cg")
    assert found is not None and found.source == "MemAvailable"
    assert found.bytes == 8 * 2**30


def test_cgroup_v2_max_means_no_limit(tmp_path: Path) -> None:
    proc = write_proc(tmp_path, "0::/\n", 2**20)
    (tmp_path / "cg").mkdir()
    (tmp_path / "cg" / "memory.max").write_text("max\n")
    (tmp_path / "cg" / "memory.current").write_text("5\n")
    found = available_memory(proc, tmp_path / "cg")
    assert found is not None and found.source == "MemAvailable" and found.bytes == 2**30


def test_the_memory_given_in_the_environment_is_used_when_smaller(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trtpack.resources import MEMORY_ENV, memory_from_env

    assert memory_from_env("16G") == 16 * 2**30
    assert memory_from_env("512mb") == 512 * 2**20
    assert memory_from_env("1.5G") == 3 * 2**29
    assert memory_from_env("4096") == 4096
    for bad in ("", "lots", "-1G", "G", "0"):
        with pytest.raises(ValueError, match=MEMORY_ENV):
            memory_from_env(bad)
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
    monkeypatch.setenv(MEMORY_ENV, "1G")
    found = available_memory(proc, tmp_path / "cg")
    assert found is not None and found.bytes == 2**30 and found.source == f"{MEMORY_ENV}=1G"
    monkeypatch.setenv(MEMORY_ENV, "64G")  # more than the machine has: the machine's figure
    found = available_memory(proc, tmp_path / "cg")
    assert found is not None and found.bytes == 4000000 * 1024 and found.source == "MemAvailable"


def _holder(megabytes: int) -> subprocess.Popen[bytes]:
    """A child process that allocates and touches ``megabytes`` MB, says so, and waits."""
    code = (f"import sys, time; b = bytearray({megabytes} * 2**20); b[::4096] = b'x' * "
            f"len(b[::4096]); print('ready', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
    return child


def test_the_meter_counts_a_child_started_while_it_runs_and_leaves_out_an_excluded_one(
) -> None:
    """The meter lists children only every RESCAN_EVERY samples (issue 47: listing reads every
    process on the machine), yet a child that appears while it runs is counted, and an
    excluded one (a later stage's process warming up) is not."""
    from trtpack.resources import RESCAN_EVERY, ResourceMeter

    excluded = _holder(300)
    try:
        with ResourceMeter(interval=0.01, exclude={excluded.pid}) as meter:
            before = meter.peak_mb
            assert before is not None
            counted = _holder(200)
            try:
                time.sleep(0.01 * (RESCAN_EVERY + 5) + 0.5)
                assert meter.peak_mb is not None
                assert meter.peak_mb - before >= 180  # the new child, found by a rescan
                assert meter.peak_mb - before < 450  # not the excluded one
            finally:
                counted.kill()
                counted.wait()
    finally:
        excluded.kill()
        excluded.wait()


def test_the_rss_the_meter_reads_matches_psutil() -> None:
    import psutil

    from trtpack.resources import ResourceMeter

    child = _holder(100)
    try:
        by_psutil = (psutil.Process().memory_info().rss + sum(
            c.memory_info().rss for c in psutil.Process().children(recursive=True))) / 2**20
        with ResourceMeter(interval=60) as meter:
            pass
        found = meter.peak_mb
        assert found is not None
        assert abs(found - by_psutil) < 20
        assert found > 100
    finally:
        child.kill()
        child.wait()


def test_a_process_excluded_while_the_meter_samples_does_not_stop_the_meter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``exclude_process`` (the build's thread) resets the listed children while the meter's
    thread samples them; the sample must read the list it started with. Made deterministic:
    the exclusion happens inside the sample, between its check and its sum (the CI run of
    291d23c caught the meter's thread dying there with "'NoneType' object is not iterable")."""
    import trtpack.resources as resources

    meter = resources.ResourceMeter(interval=3600)
    meter._pids = [os.getpid()]
    meter._since_scan = 1
    real = resources.rss_bytes

    def excluding_mid_sample(pid: int | str) -> int:
        if pid == "self":
            meter.exclude_process(999_999)
        return real(pid)

    monkeypatch.setattr(resources, "rss_bytes", excluding_mid_sample)
    meter._sample()
    assert meter.peak_mb is not None and meter.peak_mb > 0


REUSED_HEAP_PROBE = """
import ctypes, json, resource
from trtpack.resources import reused_heap, trim_heap

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
SIZE = 64 << 20  # a bert-large activation's size: above glibc's largest mmap threshold


def faults_per_block(blocks=4):
    counts = []
    for _ in range(blocks):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(SIZE)
        ctypes.memset(block, 1, SIZE)  # touched, as a tensor written by a kernel
        libc.free(block)
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return counts


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


before = faults_per_block()
with reused_heap() as applies:
    with reused_heap():  # another user leaving (a thread's forwards) keeps the setting
        pass
    inside = faults_per_block()
    rss_inside = rss()
after = faults_per_block()
rss_after = rss()
with reused_heap():  # a block freed inside, kept, until trim_heap gives it back
    block = libc.malloc(SIZE)
    ctypes.memset(block, 1, SIZE)
    libc.free(block)
    held = rss()
    trim_heap()
    trimmed = rss()
print(json.dumps({"applies": applies, "before": before, "inside": inside, "after": after,
                  "rss_inside": rss_inside, "rss_after": rss_after, "held": held,
                  "trimmed": trimmed}))
"""


def test_a_reused_heap_faults_a_large_block_in_once_and_gives_it_back_on_exit() -> None:
    # in a child process: the heap's settings are the whole process's
    import json

    out = subprocess.run([sys.executable, "-c", REUSED_HEAP_PROBE], capture_output=True,
                         text=True, check=True, timeout=120)
    found = json.loads(out.stdout)
    if not found["applies"]:
        pytest.skip("not glibc: nothing to tune")
    pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    # glibc's default: each 64 MB block is a fresh mapping, faulted in page by page each time
    assert min(found["before"]) > pages // 2, found
    # reused: the first block is faulted in, the next ones reuse its pages
    assert found["inside"][0] > pages // 2, found
    assert max(found["inside"][1:]) < pages // 100, found
    # on exit the defaults are back (a fresh mapping again) and the free pages went back
    assert min(found["after"]) > pages // 2, found
    assert found["rss_after"] < found["rss_inside"] - (32 << 20), found
    # trim_heap gives a freed block back inside too
    assert found["trimmed"] < found["held"] - (32 << 20), found
