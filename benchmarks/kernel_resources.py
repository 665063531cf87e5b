"""What ptxas allots each Triton row kernel on sm_80/86/89/90, compiled here without a GPU.

    python benchmarks/kernel_resources.py                      # the table, JSON in docs/kernel_resources.json
    python benchmarks/kernel_resources.py --docs docs/benchmarks.md   # ... and the table into the docs
    python benchmarks/kernel_resources.py --full               # every switch combination (~8x the builds)
    python benchmarks/kernel_resources.py --sweep              # how LAUNCH_CONFIGS was chosen (slow)

For each kernel x target: BLOCK, warps, registers per thread, spill bytes, shared memory and resident
programs per SM, the worst over the kernel's variants (its switches, bias, soft-cap, gradient, bf16/fp16;
all pairs of them by default, every combination with `--full`) and the vocabularies that share it;
and what that predicts for the memory-bound row pass (bytes per row against the GPU's bandwidth).
The compiles are `benchmarks/aot_compile.py`'s, the ones `tests/test_kernel_compile.py` checks.

`--sweep` compiles the same variants at each candidate (BLOCK, warps) and applies the rule written
beside `LAUNCH_CONFIGS` in `trl_emo/losses/_triton.py`: no spill in any variant, then the most
resident programs per SM in the worst variant, then the larger BLOCK.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS_START = "<!-- kernel-resources:start -->"
DOCS_END = "<!-- kernel-resources:end -->"
# Candidates of the sweep: 16 to 32 columns per thread (see `_triton.LAUNCH_CONFIGS`).
CANDIDATES = [(b, w) for b in (2048, 4096, 8192, 16384) for w in (4, 8, 16) if 16 <= b // (32 * w) <= 32]
# Kernels whose switch picks another `LAUNCH_CONFIGS` entry (and another table row).
SPLITS = {"gem": ("LOGSIGMOID", {True: "gem_logsigmoid", False: "gem"}), "asft": ("HAS_REF", {True: "asft (reference)", False: "asft (alpha=0)"})}
# Bytes per row of the row pass, in units of the vocabulary, bf16 logits, gradient written: pass 1
# reads the logits, pass 2 reads them again and writes the gradient over them (3 x 2 bytes); EMO and
# ASFT also read their second [n, V] buffer (cost products, reference logits) in both passes (2 x 2).
# Vectors shared by every row (bias, EMO's inverse norms) stay in L2 and are not counted.
BYTES_PER_COLUMN = {"emo": 10, "asft (reference)": 10}
# The measured H100 anchor (../shared/docs/gpu.md): 16,384 tokens x 128,256 vocab x 4,096 hidden, bf16.
H100_TOKENS, H100_VOCAB = 16_384, 128_256


def label(result: dict) -> str:
    """The table's name for a kernel: its loss module (split by `SPLITS`), or a third-party kernel's full name."""
    module, _, function = result["kernel"].rpartition(".")
    if function != "_rows" or "." in module:
        return result["kernel"]
    if module in SPLITS:
        switch, names = SPLITS[module]
        return names[result["switches"][switch]]
    return module


def worst(summary: dict) -> list[dict]:
    """One row per kernel (split as `SPLITS` says) x target x launch configuration: the worst variant."""
    rows: dict[tuple, dict] = {}
    for r in summary["results"]:
        key = (label(r), r["target"], r["block"], r["num_warps"])
        row = rows.setdefault(key, dict(kernel=key[0], target=key[1], block=key[2], warps=key[3], variants=0, failed=0,
                                        registers=0, spill=0, shared=0, programs=None, vocabs=set()))
        row["variants"] += 1
        row["vocabs"].update(v for use in r["uses"] for v in use["vocabs"])
        if not r["ok"]:
            row["failed"] += 1
            continue
        row["registers"] = max(row["registers"], r["registers"])
        row["spill"] = max(row["spill"], r["spill_stores"] + r["spill_loads"])
        row["shared"] = max(row["shared"], r["shared"])
        row["programs"] = r["programs_per_sm"] if row["programs"] is None else min(row["programs"], r["programs_per_sm"])
    out = []
    for row in rows.values():
        row["vocabs"] = sorted(row["vocabs"])
        out.append(row)
    return sorted(out, key=lambda r: (r["kernel"], r["target"]))


def _vocabs(vocabs: list[int], all_vocabs: list[int]) -> str:
    return "all three" if vocabs == sorted(all_vocabs) else ", ".join(f"{v:,}" for v in vocabs)


def table(summary: dict) -> str:
    from aot_compile import TARGETS

    names = {t["name"]: t for t in TARGETS.values()}
    lines = [
        "| kernel | target | vocabularies | BLOCK x warps | registers | spill bytes | shared bytes | programs / SM | warps / SM | variants |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in worst(summary):
        programs = "-" if r["programs"] is None else r["programs"]
        warps = "-" if r["programs"] is None else r["programs"] * r["warps"]
        failed = f" ({r['failed']} failed)" if r["failed"] else ""
        lines.append(
            f"| {r['kernel']} | {r['target']} ({names[r['target']]['gpus']}) | {_vocabs(r['vocabs'], summary['vocabs'])} | "
            f"{r['block']:,} x {r['warps']} | {r['registers']} | {r['spill']} | {r['shared']} | {programs} | {warps} | "
            f"{r['variants']}{failed} |"
        )
    return "\n".join(lines)


def prediction(summary: dict) -> str:
    """The row pass at the measured H100 shape, if it ran at the bandwidth: bytes per row and time."""
    from aot_compile import TARGETS

    h100 = TARGETS[90]
    rows = [r for r in worst(summary) if r["target"] == h100["name"]]
    lines = [
        f"| kernel | bytes per row (V = {H100_VOCAB:,}, bf16) | row pass at {H100_TOKENS:,} tokens | at {h100['bandwidth_gbs']:,} GB/s | "
        "programs / SM on sm_90 | bytes in flight per SM (one block per program) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        per_column = BYTES_PER_COLUMN.get(r["kernel"], 6)
        per_row = per_column * H100_VOCAB
        total = per_row * H100_TOKENS
        ms = total / (h100["bandwidth_gbs"] * 1e9) * 1e3
        in_flight = "-" if r["programs"] is None else f"{r['programs'] * r['block'] * 2 / 1024:.0f} KiB"
        lines.append(f"| {r['kernel']} | {per_row / 2**20:.2f} MiB | {total / 2**30:.1f} GiB | {ms:.1f} ms | "
                     f"{r['programs']} | {in_flight} |")
    return "\n".join(lines)


def markdown(summary: dict) -> str:
    problems = sum(1 for r in summary["results"] if not r["ok"] or r["spill_stores"] or r["spill_loads"])
    return "\n".join([
        f"`python benchmarks/kernel_resources.py{' --full' if summary['mode'] == 'full product' else ''}`, "
        f"{date.today().isoformat()}, Triton {summary['triton']} (its bundled ptxas), no GPU: "
        f"{summary['builds']} compiles from {summary['settings']} of the {summary['settings_in_full_product']} "
        f"launcher settings ({summary['mode']}), {problems} failing or spilling, "
        f"{summary['compile_seconds']:.0f} s on {os.cpu_count()} cores. Each row is the worst variant of the kernel on "
        "that target; programs / SM is the occupancy calculator's count (registers in units of 256 per warp "
        "from four 16K sub-partitions, the target's warp, program and shared-memory limits).",
        "",
        table(summary),
        "",
        "What it predicts for the row pass (memory-bound: each row is read twice and its gradient written once):",
        "",
        prediction(summary),
    ])


def write_docs(path: Path, text: str) -> None:
    """Replace the marked block of `path` (the rest of the file is left as it is)."""
    content = path.read_text()
    if DOCS_START not in content or DOCS_END not in content:
        raise SystemExit(f"{path} has no {DOCS_START} ... {DOCS_END} block to fill.")
    head, rest = content.split(DOCS_START, 1)
    _, tail = rest.split(DOCS_END, 1)
    path.write_text(f"{head}{DOCS_START}\n{text}\n{DOCS_END}{tail}")


def sweep(jobs: int | None) -> dict:
    """Every candidate configuration over the same variants, and the rule's choice per kernel and target."""
    import aot_compile
    from trl_emo.losses import _triton

    saved = {k: dict(v) for k, v in _triton.LAUNCH_CONFIGS.items()}
    settings = aot_compile.covering_settings(aot_compile.all_settings(aot_compile.switch_cases()))
    per_candidate = {}
    try:
        for block, warps in CANDIDATES:
            aot_compile.force_launch_config(block, warps)
            summary = aot_compile.check(settings, full=True, jobs=jobs)
            per_candidate[f"{block}x{warps}"] = worst(summary)
            print(f"{block} x {warps}: {summary['builds']} builds in {summary['compile_seconds']:.0f} s", file=sys.stderr)
    finally:
        _triton.LAUNCH_CONFIGS.clear()
        _triton.LAUNCH_CONFIGS.update(saved)
    choice = {}
    for candidate, rows in per_candidate.items():
        block, warps = (int(x) for x in candidate.split("x"))
        for r in rows:
            fits = r["failed"] == 0 and r["spill"] == 0
            score = (fits, r["programs"] or 0, block)
            key = f"{r['kernel']} {r['target']}"
            if key not in choice or score > choice[key]["score"]:
                choice[key] = {"score": score, "config": [block, warps], "fits": fits}
    return {"candidates": per_candidate, "choice": {k: v["config"] if v["fits"] else None for k, v in choice.items()}}


def sweep_table(result: dict) -> str:
    candidates = list(result["candidates"])
    cells: dict[str, dict[str, str]] = {}
    for candidate, rows in result["candidates"].items():
        for r in rows:
            spill = f", spills {r['spill']}" if r["spill"] else ""
            cells.setdefault(f"{r['kernel']} {r['target']}", {})[candidate] = f"{r['programs']} ({r['registers']} reg{spill})"
    lines = ["| kernel target | " + " | ".join(c.replace("x", " x ") for c in candidates) + " | chosen |",
             "|---|" + "---:|" * len(candidates) + "---|"]
    for key in sorted(cells):
        chosen = result["choice"].get(key)
        lines.append(f"| {key} | " + " | ".join(cells[key].get(c, "") for c in candidates) + " | "
                     + (f"{chosen[0]:,} x {chosen[1]}" if chosen else "none spill-free") + " |")
    return "\n".join(lines)


def table_json(summary: dict) -> dict:
    """The table as data: one row per kernel x target x vocabulary, with the run's provenance."""
    rows = [{"kernel": r["kernel"], "target": r["target"], "vocab": v, "block": r["block"], "warps": r["warps"],
             "registers": r["registers"], "spill_bytes": r["spill"], "shared_bytes": r["shared"],
             "programs_per_sm": r["programs"], "variants": r["variants"], "failed": r["failed"]}
            for r in worst(summary) for v in r["vocabs"]]
    keep = ("triton", "torch", "mode", "targets", "vocabs", "launch_configs", "settings", "settings_in_full_product",
            "launch_errors", "builds", "compile_seconds", "compile_cpu_seconds")
    return {"date": date.today().isoformat(), **{k: summary[k] for k in keep if k in summary}, "rows": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="every switch combination instead of all pairs")
    parser.add_argument("--json", default=None,
                        help="write the result as JSON here (default: docs/kernel_resources.json for the table; "
                        "outputs/kernel_launch_sweep.json for --sweep, so a sweep never replaces the table)")
    parser.add_argument("--raw", default=None, help="also write every compile's result here")
    parser.add_argument("--from-raw", default=None, help="render a saved --raw file instead of compiling")
    parser.add_argument("--docs", default=None, help="fill the marked kernel-resources block of this Markdown file")
    parser.add_argument("--sweep", action="store_true", help="compile every candidate launch configuration (slow)")
    parser.add_argument("--jobs", type=int, default=None, help="compile processes (default: one per core)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") and not args.from_raw:
        parser.error("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    sys.path.insert(0, str(ROOT))
    import aot_compile

    if args.sweep:
        result = sweep(args.jobs)
        print(sweep_table(result))
        target = Path(args.json or ROOT / "outputs" / "kernel_launch_sweep.json")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(result, indent=1, default=str))
        return 0
    args.json = args.json or str(ROOT / "docs" / "kernel_resources.json")
    if args.from_raw:
        summary = json.loads(Path(args.from_raw).read_text())
    else:
        summary = aot_compile.check(full=args.full, jobs=args.jobs)
    if args.raw:
        Path(args.raw).write_text(json.dumps(summary, default=str))
    text = markdown(summary)
    print(text)
    for line in aot_compile.problems(summary):
        print(line, file=sys.stderr)
    Path(args.json).write_text(json.dumps(table_json(summary), indent=1, default=str) + "\n")
    if args.docs:
        write_docs(Path(args.docs), text)
    return 1 if aot_compile.problems(summary) else 0


if __name__ == "__main__":
    sys.exit(main())
