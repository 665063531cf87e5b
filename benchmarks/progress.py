"""The studies' progress lines: "job i of N" with the time elapsed and an estimate of the time left."""

from __future__ import annotations

import time


def duration(seconds: float) -> str:
    """`42 s`, `13 min`, `2.1 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate(durations: list[float], done: int, total: int, elapsed: float, workers: int = 1) -> str:
    """`job 5 of 38 done; 43 min elapsed, about 2.1 h left`. The time left is the mean time of the jobs that did work
    (a job answered from a cache in under a second does not count) times the jobs left, shared by the workers; no
    estimate before such a job."""
    text = f"job {done} of {total} done; {duration(elapsed)} elapsed"
    worked = [d for d in durations if d >= 1.0]
    if worked and done < total:
        left = sum(worked) / len(worked) * (total - done) / max(1, min(workers, total - done))
        text += f", about {duration(left)} left"
    return text


class Progress:
    """A sequential study's jobs, counted: `step(name)` after each finished job returns its progress line."""

    def __init__(self, total: int):
        self.total = total
        self.started = self.last = time.time()
        self.durations: list[float] = []

    def step(self, name: str) -> str:
        now = time.time()
        self.durations.append(now - self.last)
        self.last = now
        return (f"{name} done in {duration(self.durations[-1])}: "
                + estimate(self.durations, len(self.durations), self.total, now - self.started))
