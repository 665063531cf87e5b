"""What a checkpoint's manifest (every file's size and XXH3 checksums, `trl_emo.training.checkpoint_manifest`) costs
on a 1B-parameter checkpoint: at save time, and when a resume verifies it.

    python benchmarks/checkpoint_manifest.py --params 1e9 --dir /path/on/the/disk/of/your/checkpoints

The weights are written as a transformers checkpoint writes them (safetensors, `--shards` files), then:

- save, before: the write, then an fsync of every file (what a staged save did before the manifest);
- save, now: the write, then `write_manifest` (each file read back once for its checksums in the same pass that fsyncs
  it, one thread per file, then the manifest fsynced);
- the ratio of the two is the manifest's cost at save time (each measured on a fresh folder, `--repeats` times,
  alternating, the median kept);
- verify, page cache: `manifest_problems(content=True)` right after the save (what a resume on the same machine reads);
- verify, from disk: the same after the files are evicted from the page cache (`posix_fadvise(DONTNEED)`, which drops
  this file's clean pages only): a resume on a freshly booted machine, or one whose cache the save did not fit.

A whole checkpoint's bytes (the weights and AdamW's two fp32 states, each the weights' size) are written with
`--copies 3`: three files of the same tensors, from one buffer (this machine's memory holds one copy), so the disk
and the checksum see 12 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time

import torch
from safetensors.torch import save_file

from trl_emo.training import checkpoint_manifest as manifest


def evict(folder: str) -> None:
    """Drop `folder`'s files from the page cache (their clean pages only: flushed first)."""
    manifest.fsync_tree(folder)
    for root, _dirs, names in os.walk(folder):
        for name in names:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def write(tensors: list[dict], folder: str) -> float:
    os.makedirs(folder)
    start = time.perf_counter()
    for index, shard in enumerate(tensors):
        save_file(shard, os.path.join(folder, f"model-{index + 1:05d}-of-{len(tensors):05d}.safetensors"),
                  metadata={"format": "pt"})
    return time.perf_counter() - start


class Timed:
    """Wall-clock and CPU seconds (every thread of the process) of a block: the CPU time does not depend on how busy
    the disk (or, on a shared machine, the other processes) were."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=float, default=1e9)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--shards", type=int, default=1, help="safetensors files (transformers: one per 5 GB)")
    parser.add_argument("--tensor-params", type=float, default=50e6, help="parameters per tensor")
    parser.add_argument("--copies", type=int, default=1,
                        help="files of the same tensors: 3 writes the bytes of the weights and AdamW's two states "
                             "(each the weights' size in fp32) from one buffer, in this machine's memory")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", default="benchmark_checkpoints")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    dtype = getattr(torch, args.dtype)
    count = int(args.params // args.tensor_params)
    gen = torch.Generator().manual_seed(0)
    names = [f"layer.{i}.weight" for i in range(count)]
    tensors = [torch.randn(int(args.tensor_params), generator=gen).to(dtype) for _ in range(count)]
    per_shard = -(-count // args.shards)
    shards = [{n: t for n, t in zip(names[i:i + per_shard], tensors[i:i + per_shard])}
              for i in range(0, count, per_shard)] * args.copies
    size_gb = sum(t.numel() * t.element_size() for t in tensors) * args.copies / 1e9

    root = os.path.abspath(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    before, after, manifest_only, manifest_cpu, fsync_cpu, hot, hot_cpu, cold = ([] for _ in range(8))
    write(shards, os.path.join(root, "warm-up"))  # the first write of a run is slower (the allocator, the disk)
    manifest.fsync_tree(os.path.join(root, "warm-up"))
    shutil.rmtree(os.path.join(root, "warm-up"))
    for repeat in range(args.repeats):
        folder = os.path.join(root, f"before-{repeat}")
        seconds = write(shards, folder)
        with Timed() as timed:
            manifest.fsync_tree(folder)
        before.append(seconds + timed.wall)
        fsync_cpu.append(timed.cpu)
        shutil.rmtree(folder)

        folder = os.path.join(root, f"after-{repeat}")
        seconds = write(shards, folder)
        with Timed() as timed:
            manifest.write_manifest(folder, "benchmark", 1)
        manifest_only.append(timed.wall)
        manifest_cpu.append(timed.cpu)
        after.append(seconds + timed.wall)
        with Timed() as timed:
            assert manifest.manifest_problems(folder) == []
        hot.append(timed.wall)
        hot_cpu.append(timed.cpu)
        evict(folder)
        with Timed() as timed:
            assert manifest.manifest_problems(folder) == []
        cold.append(timed.wall)
        shutil.rmtree(folder)
    shutil.rmtree(root, ignore_errors=True)

    result = {
        "params": args.params, "dtype": args.dtype, "copies": args.copies, "size_gb": round(size_gb, 3),
        "files": len(shards),
        "save_before_s": round(statistics.median(before), 2), "save_with_manifest_s": round(statistics.median(after), 2),
        "save_ratio": round(statistics.median(after) / statistics.median(before), 3),
        "manifest_pass_s": round(statistics.median(manifest_only), 2),
        "manifest_pass_cpu_s": round(statistics.median(manifest_cpu), 2),
        "fsync_pass_cpu_s": round(statistics.median(fsync_cpu), 2),
        "verify_page_cache_cpu_s": round(statistics.median(hot_cpu), 2),
        "cpus": os.cpu_count(),
        "verify_page_cache_s": round(statistics.median(hot), 2), "verify_from_disk_s": round(statistics.median(cold), 2),
        "verify_page_cache_gb_per_s": round(size_gb / statistics.median(hot), 2),
        "verify_from_disk_gb_per_s": round(size_gb / statistics.median(cold), 2),
        "runs": {"before": before, "after": after, "manifest_pass": manifest_only, "hot": hot, "cold": cold},
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
