"""Stage processes forked from warm templates, instead of started as fresh Pythons.

A fresh stage process (``python -m trtpack.pipeline.isolate``) spends seconds importing what
its stage needs (torch and transformers for the export) before it can begin, and a build
starts several. ``python -m trtpack.pipeline.stage_server FOLDER [STAGE ...]`` starts one
*template* process per stage (every isolated stage with no ``Stage.environment``, unless
named): each imports that stage's module and its ``warm_modules`` once, checks that it runs
one thread (forking a threaded process copies locks other threads held), and then listens
on ``FOLDER/STAGE.sock``. Each template holds what a fresh process of its stage would have
imported, and nothing more, so a served process's memory is that of a fresh one.

A build that finds ``TRTPACK_STAGE_SERVER=FOLDER`` asks the stage's template for its process
(``stage_client``). Per request the template forks a *monitor*, which receives the request
(the stage log's path, the build's environment and working directory, and its pipes and log
file passed with ``SCM_RIGHTS``), refuses it when the build's environment differs from the
template's in a variable that an import may have read (``pipeline.served_environment``),
and else forks the stage process: in a session of its own, its output to the log,
the build's environment and working directory, ``isolate.main``. The monitor sends its pid
back, waits for it (a pidfd), and sends its exit status; when the build's end of the
connection closes first (the build ended, even by SIGKILL), it kills the stage's process
group. The stage process dies with its monitor (``PR_SET_PDEATHSIG``), the templates with
the server, and the server with the process that started it. The server also runs the
templates of the ModelOpt worker and of a PyTorch source's description
(``pipeline.served_workers``), which serve those processes the same way.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import pickle
import re
import select
import signal
import socket
import struct
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from trtpack.pipeline import isolate, served_workers
from trtpack.pipeline.served_environment import environment_difference, requester
from trtpack.processes import become_served, die_with_parent, exit_with, kill_group

SOCKET_SUFFIX = ".sock"
ACCEPT_SECONDS = 1.0  # how often a template reaps its finished monitors while idle
WAIT_SECONDS = 10  # how long an ending template waits for its monitors
REQUEST_BYTES = 1 << 20  # the largest request: the build's environment, pickled
PASSED_FDS = 3  # the jobs pipe's read end, the messages pipe's write end, the log

# Packages whose import starts a thread of their own: ONNX Runtime's (1.32) telemetry thread,
# unless ``ORT_DISABLE_TELEMETRY`` is set as it is imported. A template imports them (and what
# its stage module's ``preload`` imports: onnxsim imports ONNX Runtime) with that variable set,
# and only once a throw-away fork has found that this leaves it one thread; else it leaves
# them to the stage process, which imports them as it starts (``isolate.main``), as a fresh one
# does. The variable is taken out of the environment again after the imports: a served
# process's environment is the build's, only its ONNX Runtime sends no telemetry. Any other
# thread makes a template refuse to serve.
STARTS_THREADS = frozenset({"onnxruntime", "onnxsim"})
NO_THREAD_ENVIRONMENT = {"ORT_DISABLE_TELEMETRY": "1"}

# The line a template writes to the server's log for each stage process it served
# (``Template.serve``), read back by ``served_in_log``.
SERVED_LINE = re.compile(r"stage server: (\w+) served, pid (\d+)")


def served_in_log(text: str) -> list[tuple[str, int]]:
    """(stage, pid) of each stage process a server's log (``text``) says it served."""
    return [(stage, int(pid)) for stage, pid in SERVED_LINE.findall(text)]


def socket_path(folder: Path, stage: str) -> Path:
    return folder / f"{stage}{SOCKET_SUFFIX}"


def servable_stages() -> list[str]:
    """The stages a template can serve: isolated, with nothing in their environment from the
    process's start (``Stage.environment``: the compile check's TensorRT-RTX switch)."""
    from trtpack.pipeline.stage import STAGES

    return [s.name for s in STAGES if s.isolated and not s.environment]


def template_names() -> list[str]:
    """Every template a server runs unless told which: the servable stages', the ModelOpt
    worker's and the description's (``served_workers.HELPERS``)."""
    return [*servable_stages(), *served_workers.HELPERS]


def threads_past_fork() -> int:
    """This process's threads once a fork's ``pthread_atfork`` handlers have run (a child
    forked and ended at once): OpenBLAS ends its thread pool in its handler (and starts it
    again at its next use), so its threads are no hazard; any thread still running is."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return len(os.listdir("/proc/self/task"))


def one_thread_after(modules: tuple[str, ...], stage_preload: Callable[[], None] | None
                     ) -> bool:
    """Whether importing ``modules`` and running ``stage_preload`` leaves this process one
    thread (once a fork's handlers have run): tried in a throw-away fork, so that a process
    where they would start one does not import them."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            isolate.import_quietly(modules)
            if stage_preload is not None:
                stage_preload()
            code = 0 if threads_past_fork() == 1 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


class Template:
    """One stage's template: its imports made, listening for requests."""

    def __init__(self, stage: str, listener: socket.socket, started_with: dict[str, str]):
        self.stage = stage
        self.listener = listener
        self.started_with = started_with  # the environment before the imports
        # what the imports set or changed in it: a fresh process would keep that too
        self.imports_set = {k: v for k, v in os.environ.items() if started_with.get(k) != v}

    def serve(self) -> None:
        self.listener.settimeout(ACCEPT_SECONDS)
        monitors: set[int] = set()

        def stop(signum: int, frame: object) -> None:
            """Wait for the monitors (their CPU time counts in this process's children's),
            a bounded time: one may still serve a build."""
            signal.alarm(WAIT_SECONDS)
            for pid in monitors:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            os._exit(0)

        signal.signal(signal.SIGTERM, stop)
        while True:
            monitors -= reaped(monitors)
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    self.listener.close()
                    code = self.monitor(connection)
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            monitors.add(pid)
            connection.close()

    def monitor(self, connection: socket.socket) -> int:
        """Serve one request on ``connection`` (in the monitor process)."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                            struct.calcsize("3i"))
        if struct.unpack("3i", credentials)[1] != os.getuid():
            return 1  # only this user's builds (the folder is theirs alone too)
        data, fds, _, _ = socket.recv_fds(connection, REQUEST_BYTES, PASSED_FDS)
        if len(fds) != PASSED_FDS or not data:
            for fd in fds:
                os.close(fd)
            return 1
        request = pickle.loads(data)
        env: dict[str, str] = request["environment"]
        differs = environment_difference(env, self.started_with, sys.modules, self.imports_set)
        if differs is not None:
            print(f"stage server: {self.stage} refused: the build's {differs} differs"
                  f"{requester(env)}", file=sys.stderr, flush=True)
            connection.send(pickle.dumps(("refused", f"{differs} differs")))
            return 0
        # its pid goes back once it leads its own session: the build may end its group at once
        in_session, led = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(in_session)
            if self.stage in served_workers.HELPERS:
                connection.close()
                served_workers.become_worker(self.stage, fds, led, request,
                                             {**env, **self.imports_set})
            self.stage_process(connection, fds, led, request["log_path"], request["cwd"], env)
        os.close(led)
        for fd in fds:
            os.close(fd)
        os.read(in_session, 1)  # end of file: it called setsid (or died)
        os.close(in_session)
        with contextlib.suppress(OSError):
            connection.send(pickle.dumps(("started", pid)))
        print(f"stage server: {self.stage} served, pid {pid}{requester(env)}", file=sys.stderr,
              flush=True)
        return watch(connection, pid)

    def stage_process(self, connection: socket.socket, fds: list[int], led: int,
                      log_path: str, cwd: str, env: dict[str, str]) -> None:
        """Become the stage process (never returns): ``isolate.main`` as a fresh process of
        the stage would run it."""
        code = 1
        try:
            connection.close()
            jobs, messages, log = fds
            become_served(led, (os.open(os.devnull, os.O_RDONLY), log, log), cwd,
                          {**env, **self.imports_set})
            argv = [str(jobs), str(messages), self.stage, log_path]
            sys.argv = [isolate.__file__, *argv]
            code = isolate.main(argv)
        except BaseException:
            traceback.print_exc()
        finally:
            isolate.end_process(code)


def reaped(children: set[int]) -> set[int]:
    """Those of ``children`` that have ended (and are reaped now)."""
    done = set()
    for pid in children:
        try:
            ended = os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            ended = True
        if ended:
            done.add(pid)
    return done


def watch(connection: socket.socket, pid: int) -> int:
    """Wait for the stage process ``pid`` and send its exit status; when the build's end of
    ``connection`` closes first, kill the stage's process group."""
    pidfd = os.pidfd_open(pid)
    while True:
        ready, _, _ = select.select([connection.fileno(), pidfd], [], [])
        if pidfd in ready:
            _, status = os.waitpid(pid, 0)
            with contextlib.suppress(OSError):
                connection.send(pickle.dumps(("exit", os.waitstatus_to_exitcode(status))))
            return 0
        try:
            closed = not connection.recv(16)
        except OSError:
            closed = True
        if closed:  # the build is gone, or done with it
            kill_group(pid)
            os.waitpid(pid, 0)
            kill_group(pid)  # what it started that still runs
            return 0


def start_template(stage: str, folder: Path, preload: tuple[str, ...]) -> int:
    """Fork the template of ``stage``: it imports, checks it runs one thread, then listens on
    its socket (made under another name, then renamed: a build never finds a socket that is
    not listening yet). Its pid."""
    pid = os.fork()
    if pid != 0:
        return pid

    def run() -> int:
        die_with_parent()
        return run_template(stage, folder, preload)

    exit_with(run)


def run_template(stage_name: str, folder: Path, preload: tuple[str, ...]) -> int:
    from trtpack.pipeline.stage import STAGES

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    stage_preload: Callable[[], None] | None
    threaded: tuple[str, ...] = ()
    if stage_name in served_workers.HELPERS:  # ModelOpt imports ONNX Runtime: below
        stage_preload = served_workers.prepare(folder, stage_name)
        started_with = dict(os.environ)
    else:
        started_with = dict(os.environ)
        stage = next(s for s in STAGES if s.name == stage_name)
        stage_module = importlib.import_module(stage.module)
        threaded = tuple(m for m in stage.warm_modules if m.split(".")[0] in STARTS_THREADS)
        isolate.import_quietly(tuple(m for m in stage.warm_modules if m not in threaded))
        stage_preload = getattr(stage_module, "preload", None)
    for module in preload:
        importlib.import_module(module)
    if threaded or stage_preload is not None:
        os.environ.update({k: v for k, v in NO_THREAD_ENVIRONMENT.items()
                           if k not in started_with})
        # a helper's template is of use only with its imports: it makes them without a
        # trial (a thread they leave ends it below, and its processes start fresh)
        if stage_name in served_workers.HELPERS or one_thread_after(threaded, stage_preload):
            isolate.import_quietly(threaded)
            if stage_preload is not None:
                stage_preload()
        for name in NO_THREAD_ENVIRONMENT:
            if name not in started_with:
                del os.environ[name]
    gc.collect()
    gc.freeze()  # the imports' objects stay shared with every fork, never collected there
    threads = threads_past_fork()
    if threads != 1:
        print(f"stage server: the {stage_name} template runs {threads} threads after its "
              "imports; forking it is unsafe, not serving", file=sys.stderr)
        return 1
    path = socket_path(folder, stage_name)
    listening = path.with_name(f".{path.name}.{os.getpid()}")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(listening))
    listener.listen(64)
    os.replace(listening, path)
    Template(stage_name, listener, started_with).serve()
    return 0


def main(argv: list[str]) -> int:
    """``FOLDER [--preload MODULE ...] [STAGE ...]``: a template per stage (each importing
    the ``--preload`` modules too), until SIGTERM or the end of the process that started it."""
    import argparse

    die_with_parent()
    parser = argparse.ArgumentParser(prog="python -m trtpack.pipeline.stage_server")
    parser.add_argument("folder", type=Path)
    parser.add_argument("stages", nargs="*")
    parser.add_argument("--preload", action="append", default=[])
    args = parser.parse_args(argv)
    folder: Path = args.folder
    preload = tuple(args.preload)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    stages = args.stages or template_names()
    unknown = set(stages) - set(template_names())
    if unknown:
        print(f"stage server: not servable: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    templates = {start_template(stage, folder, preload): stage for stage in stages}

    def end(signum: int, frame: object) -> None:
        for pid in templates:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid, stage in templates.items():
            socket_path(folder, stage).unlink(missing_ok=True)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)  # their CPU time counts in this process's children's
        os._exit(0)

    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGINT, end)
    while templates:  # a template that ends (refused to serve) is not started again
        with contextlib.suppress(ChildProcessError):
            pid, _ = os.wait()
            stage = templates.pop(pid, None)
            if stage is not None:
                socket_path(folder, stage).unlink(missing_ok=True)
    signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
