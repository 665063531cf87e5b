"""What running model-written code costs: programs per second through the sandbox, layer by layer.

A HumanEval-like job (a solution, a `check(candidate)` with a few asserts) is checked `--programs` times:
- `bare`: `python -c` in a subprocess, nothing else (the floor: interpreter start-up);
- `sandbox`: the sandbox without any confinement layer (limits, empty directory and environment, output
  capture, group kill and /proc sweep, verdict harness);
- `+drop`, `+landlock`, `+landlock+netns`, `+landlock+netns+drop`, `+landlock+netns+drop+bwrap`: with the
  confinement layers this machine supports (the privilege drop and bubblewrap need root). As root,
  `+landlock+netns` is what ran before the privilege drop existed; the last line gives the cost of the drop
  (and of bubblewrap) as a ratio to it.
Each at 1 worker and at `--workers` (default: the CPU count).

    python benchmarks/sandbox_bench.py                   # 200 programs per row
    python benchmarks/sandbox_bench.py --programs 1000 --json sandbox.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trl_emo.evaluation.sandbox import CodeJob, Sandbox, SandboxLimits, confinement, run_checks  # noqa: E402

SOLUTION = "def add(a, b):\n    return a + b\n"
SETUP = "def check(candidate):\n" + "".join(f"    assert candidate({i}, {i}) == {2 * i}\n" for i in range(20))


def time_bare(programs: int, workers: int) -> float:
    from concurrent.futures import ThreadPoolExecutor

    source = SOLUTION + SETUP + "check(add)\n"

    def one(_):
        subprocess.run([sys.executable, "-s", "-S", "-c", source], check=True, capture_output=True)

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(programs)))
    return time.perf_counter() - start


def time_sandbox(programs: int, workers: int, landlock: bool, network: bool, drop: bool, bwrap: bool) -> float:
    # Our own trusted program: running it without a layer is accepted here.
    sandbox = Sandbox(
        SandboxLimits(timeout=30), workers=workers, landlock=landlock, network=network, drop_privileges=drop,
        bubblewrap=bwrap, allow_unconfined=True,
    )
    jobs = [CodeJob(SOLUTION, SETUP, "check(add)\n")] * programs
    start = time.perf_counter()
    verdicts = [verdict for _, verdict in run_checks(sandbox, jobs)]
    elapsed = time.perf_counter() - start
    assert all(v["passed"] for v in verdicts), verdicts[:3]
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", default=None, help="also write the raw numbers here")
    args = parser.parse_args(argv)
    layers = confinement()
    variants = [("bare", None, None, None, None), ("sandbox", False, False, False, False)]
    if layers["drop"]:
        variants.append(("+drop", False, False, True, False))
    if layers["landlock"]:
        variants.append(("+landlock", True, False, False, False))
    if layers["landlock"] and layers["network"]:
        variants.append(("+landlock+netns", True, True, False, False))
        if layers["drop"]:
            variants.append(("+landlock+netns+drop", True, True, True, False))
        if layers["bubblewrap"]:
            variants.append(("+landlock+netns+drop+bwrap", True, True, True, True))
    results = []
    for workers in sorted({1, args.workers}):
        for name, landlock, network, drop, bwrap in variants:
            if name == "bare":
                seconds = time_bare(args.programs, workers)
            else:
                seconds = time_sandbox(args.programs, workers, landlock, network, drop, bwrap)
            results.append({"variant": name, "workers": workers, "programs": args.programs, "seconds": seconds})
    print(f"{args.programs} programs per row, {os.cpu_count()} CPUs, Landlock ABI {layers['landlock']}, "
          f"network namespace {'yes' if layers['network'] else 'no'}, privilege drop "
          f"{'yes' if layers['drop'] else 'no'}, bubblewrap {'yes' if layers['bubblewrap'] else 'no'}\n")
    print("| variant | workers | programs/s | ms per program (per worker) |")
    print("|---|---:|---:|---:|")
    for row in results:
        rate = row["programs"] / row["seconds"]
        print(f"| {row['variant']} | {row['workers']} | {rate:.1f} | {1000 * row['workers'] / rate:.1f} |")
    seconds = {(row["variant"], row["workers"]): row["seconds"] for row in results}
    for variant in ("+landlock+netns+drop", "+landlock+netns+drop+bwrap"):
        ratios = [f"{seconds[variant, w] / seconds['+landlock+netns', w]:.2f} at {w} worker(s)"
                  for w in sorted({1, args.workers}) if (variant, w) in seconds]
        if ratios:
            print(f"\n{variant} / +landlock+netns (time per program): {', '.join(ratios)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"confinement": layers, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
