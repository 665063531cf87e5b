"""A study's stages as jobs that several worker processes share, through files only.

Two processes of one torch thread each generate about a third more sequences per second than one process of two
threads on this 2-core machine (measured 2026-11-27: 144 sampled sequences of 64 tokens from SmolLM2-135M in 39.5 s
against 72 in 26.0 s), so a study runs its stages in `workers` processes. Each worker builds the same job list (it is a
function of the command line) and takes the first job whose dependencies are done and that no other worker has
claimed; a claim is a file created with `O_EXCL`, so two workers never take the same job. Every job is idempotent
(its outputs are cached and reused, see the study), so a study killed at any point is relaunched with the same command:
the claims and done-marks of the earlier invocation are cleared, and finished jobs return at once from their caches.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.progress import duration, estimate


@dataclass
class Job:
    name: str
    run: Callable[[], object]
    after: tuple[str, ...] = field(default_factory=tuple)


class JobBoard:
    """The claims, done-marks and failures of one invocation, in `folder`."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def reset(self, workers: int = 1) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        for part in ("claimed", "done", "failed"):
            (self.folder / part).mkdir(parents=True, exist_ok=True)
        # When this invocation started and how many workers share it: what the progress lines' estimates read.
        (self.folder / "started").write_text(json.dumps({"time": time.time(), "workers": workers}))

    def _mark(self, part: str, name: str) -> Path:
        return self.folder / part / name

    def claim(self, name: str) -> bool:
        try:
            handle = os.open(self._mark("claimed", name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.write(handle, str(os.getpid()).encode())  # who holds it: a relaunch refuses while that process lives
        os.close(handle)
        return True

    def live_claims(self) -> dict[str, int]:
        """Jobs whose claiming process is still alive, other than this one (an earlier invocation's orphans)."""
        live = {}
        for path in sorted((self.folder / "claimed").glob("*")):
            try:
                pid = int(path.read_text() or 0)
            except (OSError, ValueError):
                continue
            if pid and pid != os.getpid() and _alive(pid) and not self.done(path.name):
                live[path.name] = pid
        return live

    def claimed(self, name: str) -> bool:
        return self._mark("claimed", name).exists()

    def done(self, name: str) -> bool:
        return self._mark("done", name).exists()

    def finish(self, name: str, seconds: float = 0.0) -> None:
        self._mark("done", name).write_text(f"{seconds:.3f}")

    def progress(self, total: int) -> str:
        """This invocation's progress line (`benchmarks/progress.py`): the jobs done by every worker, the time since it
        started, and an estimate of the time left from the done jobs' times."""
        try:
            started = json.loads((self.folder / "started").read_text())
        except (OSError, ValueError):
            started = {"time": time.time(), "workers": 1}
        durations = []
        for path in (self.folder / "done").glob("*"):
            try:
                durations.append(float(path.read_text() or 0))
            except (OSError, ValueError):
                durations.append(0.0)
        return estimate(durations, len(durations), total, time.time() - started["time"], started["workers"])

    def fail(self, name: str, error: str) -> None:
        self._mark("failed", name).write_text(error)

    def failures(self) -> dict[str, str]:
        return {p.name: p.read_text() for p in sorted((self.folder / "failed").glob("*"))}


def work(jobs: list[Job], board: JobBoard, log: Callable[[str], None], poll: float = 5.0) -> None:
    """Take and run ready jobs until none is left to take (or a job failed anywhere: then stop taking new ones; or the
    parent that started this worker is gone: then a relaunch owns the board)."""
    names = {job.name for job in jobs}
    for job in jobs:
        unknown = set(job.after) - names
        if unknown:
            raise ValueError(f"job {job.name!r} waits for unknown jobs {sorted(unknown)}")
    parent = os.getppid()
    while True:
        if board.failures() or os.getppid() != parent:
            return
        open_jobs = [job for job in jobs if not board.claimed(job.name)]
        if not open_jobs:
            return
        ready = [job for job in open_jobs if all(board.done(name) for name in job.after)]
        taken = next((job for job in ready if board.claim(job.name)), None)
        if taken is None:
            time.sleep(poll)  # what is left waits for jobs other workers hold
            continue
        log(f"job {len(list((board.folder / 'claimed').glob('*')))} of {len(jobs)}: {taken.name} ...")
        began = time.time()
        try:
            taken.run()
        except BaseException as exc:  # noqa: BLE001 - recorded for the other workers and the parent, then re-raised
            board.fail(taken.name, "".join(traceback.format_exception_only(type(exc), exc)).strip())
            raise
        board.finish(taken.name, time.time() - began)
        log(f"{taken.name} done in {duration(time.time() - began)}: {board.progress(len(jobs))}")


def run_workers(jobs: list[Job], board: JobBoard, workers: int, worker_command: list[str],
                log: Callable[[str], None]) -> None:
    """Run `jobs` in this process (`workers` 1) or in `workers` processes started with `worker_command` (which must
    rebuild the same jobs and call `work`), one torch thread each; raise SystemExit naming a failed job. One
    invocation at a time owns the board (`<board>.lock`, the owner's pid): a second one, or a relaunch while the
    workers of a killed one still run, stops with one line instead of running their jobs a second time."""
    with _owning(board):
        board.reset(workers)
        if workers <= 1:
            try:
                work(jobs, board, log)
            except Exception:  # on the board: printed once here, then the one line below
                traceback.print_exc(file=sys.stderr)
        else:
            _supervise(workers, worker_command, board)
    failures = board.failures()
    if failures:
        raise SystemExit("study: error: " + "; ".join(f"job {name} failed: {error.splitlines()[-1]}"
                                                      for name, error in failures.items())
                         + " (the finished stages are kept: run the same command again to resume)")
    missing = [job.name for job in jobs if not board.done(job.name)]
    if missing:
        raise SystemExit(f"study: error: jobs not finished: {', '.join(missing)} (a worker stopped; see above)")


def _supervise(workers: int, worker_command: list[str], board: JobBoard, poll: float = 1.0) -> None:
    """Start the workers and wait for all of them; a worker that dies without a failure mark (killed, out of memory)
    gets one in its name, so the others stop instead of waiting for its jobs forever. SIGTERM on this process stops
    the workers with it (as Ctrl-C does)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def terminate(signum, frame):
        raise SystemExit(f"study: stopped by signal {signum}")

    previous = signal.signal(signal.SIGTERM, terminate)
    processes = [subprocess.Popen(worker_command, env=env) for _ in range(workers)]
    try:
        running = list(processes)
        while running:
            time.sleep(poll)
            for process in list(running):
                status = process.poll()
                if status is None:
                    continue
                running.remove(process)
                if status != 0 and not board.failures():
                    board.fail(f"worker-{process.pid}", f"the worker process exited with status {status}")
    finally:  # interrupted or failed: the workers stop with it
        signal.signal(signal.SIGTERM, previous)
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            process.wait()


@contextlib.contextmanager
def _owning(board: JobBoard):
    lock = board.folder.with_name(board.folder.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            handle = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                owner = int(lock.read_text() or 0)
            except (OSError, ValueError):
                owner = 0
            if owner and _alive(owner):
                raise SystemExit(f"study: error: another invocation (pid {owner}) is running this study in "
                                 f"{board.folder.parent}; wait for it or stop it (kill {owner}), then run again") from None
            lock.unlink(missing_ok=True)  # its owner is gone: a stale lock
            continue
        os.write(handle, str(os.getpid()).encode())
        os.close(handle)
        break
    else:
        raise SystemExit(f"study: error: could not take {lock}; another invocation is starting in the same folder")
    try:
        orphans = board.live_claims() if (board.folder / "claimed").is_dir() else {}
        if orphans:
            job, pid = next(iter(orphans.items()))
            raise SystemExit(f"study: error: job {job} is still running in process {pid}, a worker of an earlier "
                             f"invocation; wait for it or stop it (kill {pid}), then run again")
        yield
    finally:
        lock.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def worker_main(jobs: list[Job], board: JobBoard, log: Callable[[str], None]) -> int:
    try:
        work(jobs, board, log)
    except BaseException:  # noqa: BLE001 - the failure is on the board; the parent prints one line for it
        traceback.print_exc(file=sys.stderr)
        return 1
    return 0
