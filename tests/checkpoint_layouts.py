"""The checkpoint layouts of the damage matrix (test_checkpoint_damage.py, test_recovery_launches.py), and the damage.

- single file: a trl_emo.sft run's own checkpoints (`model.safetensors`, `optimizer.pt`, ...);
- sharded index: the same checkpoints with their weights re-saved in two safetensors shards and an index, as
  `save_pretrained` writes a model above `max_shard_size` (their manifest written again);
- FSDP2 sharded: written by two processes over gloo with torch's `fully_shard` and Distributed Checkpoint, in the
  folders accelerate gives them (`pytorch_model_fsdp_0/`, `optimizer_0/`: one `__<rank>_0.distcp` per rank and a
  `.metadata`), beside the run's trainer state, scheduler, per-rank RNG states and side file. (accelerate runs FSDP
  only on accelerators: on a CPU the trainer cannot write this layout itself, docs/distributed.md.)
- DeepSpeed ZeRO-2: a real two-process run (test_recovery_launches.py).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from trl_emo.training import checkpoint_manifest as manifest

# What each damage does to a file; "overwrite" keeps the size (what only a checksum sees where the format cannot).
DAMAGES = ("delete", "empty", "half", "overwrite")


def damage(path: Path, how: str) -> None:
    if how == "delete":
        path.unlink()
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "half":
        os.truncate(path, path.stat().st_size // 2)
    else:  # its first 64 bytes (all of a shorter file) zeroed
        with open(path, "r+b") as handle:
            handle.write(bytes(min(64, path.stat().st_size)))


def drop_records(folder: Path) -> None:
    """The checkpoint as a writer without a manifest leaves it (TRL's scripts, an older trl_emo, a copy)."""
    for name in (manifest.MANIFEST, manifest.RECORD):
        (folder / name).unlink(missing_ok=True)


def copy_checkpoints(source: Path, target: Path, steps=(2, 4)) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for step in steps:
        shutil.copytree(source / f"checkpoint-{step}", target / f"checkpoint-{step}")
    return target


def reseal(folder: Path) -> None:
    """Write the manifest of a checkpoint whose files a test has changed on purpose (a layout derived from a run's)."""
    run = manifest.run_of(str(folder)) or "test-layout"
    (folder / manifest.MANIFEST).unlink(missing_ok=True)
    step = int(folder.name.split("-")[-1])
    manifest.write_record(str(folder), run, step)
    manifest.write_manifest(str(folder), run, step)


def shard_weights(folder: Path) -> None:
    """`model.safetensors` of `folder` re-saved as two shards and an index (the same tensors), manifest re-written."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for shard, keys in shards.items():
        save_file({key: tensors[key] for key in keys}, str(folder / shard), metadata={"format": "pt"})
        weight_map.update({key: shard for key in keys})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                      "weight_map": weight_map}))
    (folder / "model.safetensors").unlink()
    reseal(folder)


# -- FSDP2 --------------------------------------------------------------------------------------------------------


def _fsdp_rank(rank: int, store: str, folders: list[str]) -> None:
    """One of two processes: a tiny model sharded with `fully_shard`, trained one AdamW step before each save, each
    folder of `folders` written with Distributed Checkpoint as accelerate's `save_fsdp_model`/`save_fsdp_optimizer`
    lay a sharded state dict out."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for folder in folders:
            model(torch.randn(3, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            weights, optimizer_state = get_state_dict(model, optimizer)
            dcp.save({"model": weights}, checkpoint_id=os.path.join(folder, "pytorch_model_fsdp_0"))
            dcp.save({"optimizer": optimizer_state}, checkpoint_id=os.path.join(folder, "optimizer_0"))
            torch.save({"rank": rank, "cpu": torch.random.get_rng_state()}, os.path.join(folder, f"rng_state_{rank}.pth"))
    finally:
        dist.destroy_process_group()


def write_fsdp_checkpoints(target: Path, source: Path, steps=(2, 4)) -> Path:
    """checkpoint-2 and checkpoint-4 of the FSDP2 sharded layout under `target`: the shards from two processes, the
    trainer state, scheduler and side file of the run in `source` (a single-file run's folder), then the manifest."""
    from fault_injection import _context

    folders = [target / f"checkpoint-{step}" for step in steps]
    for folder in folders:
        folder.mkdir(parents=True)
    context = _context()
    store = str(target / "store")
    processes = [context.Process(target=_fsdp_rank, args=(rank, store, [str(f) for f in folders])) for rank in (0, 1)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0, f"an FSDP writer ended with {process.exitcode}"
    os.remove(store) if os.path.exists(store) else None
    for step, folder in zip(steps, folders):
        for name in ("trainer_state.json", "scheduler.pt", "trl_emo_gem_beta.json"):
            shutil.copy(source / f"checkpoint-{step}" / name, folder / name)
        reseal(folder)
    return target
