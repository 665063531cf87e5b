"""Whether a checkpoint without a manifest (TRL's scripts, an older trl_emo, a copy) is whole, from its structure.

Cheap checks only, no tensor loaded: each file is judged by what its format says about its own length.

- `*.json` parses (`trainer_state.json`, an index, the loss's side files);
- a safetensors file: its 8-byte header length and JSON header parse, and the tensors' byte ranges end exactly at the
  file's size (a short or padded file is caught without reading it);
- a `torch.save` file (`optimizer.pt`, `scheduler.pt`, `rng_state*.pth`, DeepSpeed's `*_states.pt`): its zip central
  directory, which sits at the end of the file, reads, and every member's local header is where it says (a truncated
  file has no directory; overwritten leading bytes break the first header);
- (a sharded index's shards being there is `checkpoints.missing_parts`'s check; each shard is checked as above);
- DeepSpeed: `latest` names a `global_step*` folder that exists;
- every per-rank file family (DeepSpeed's optimizer and model states, FSDP's `__<rank>_0.distcp`, `rng_state_<rank>.pth`)
  holds ranks 0 to the highest rank found;
- an FSDP (torch.distributed.checkpoint) folder has its `.metadata`, and every file it names reaches the byte ranges
  it lists.

What this cannot see: bytes changed inside a tensor's data (the sizes and headers are intact). Only a manifest's
checksum catches that (`checkpoint_manifest`); for what still fails to load, the trainer falls back to the previous
checkpoint (`AtomicCheckpoints`, docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import re
import zipfile

_RANKED = {
    "DeepSpeed optimizer states": re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$"),
    "DeepSpeed model states": re.compile(r"^zero_pp_rank_(\d+)_mp_rank_\d+_model_states\.pt$"),
    "RNG states": re.compile(r"^rng_state_(\d+)\.pth$"),
    "FSDP shards": re.compile(r"^__(\d+)_\d+\.distcp$"),
}
_TORCH_SAVE = (".pt", ".pth", ".bin")


def structure_problems(folder: str) -> list[str]:
    """What is broken in `folder` as its files' own formats tell (empty: nothing found)."""
    problems: list[str] = []
    ranked: dict[tuple[str, str], set[int]] = {}  # (family, folder) -> the ranks found there
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        rel_root = os.path.relpath(root, folder)
        for name in sorted(names):
            rel = name if rel_root == "." else os.path.join(rel_root, name).replace(os.sep, "/")
            problem = file_problem(os.path.join(root, name))
            if problem:
                problems.append(f"{rel} {problem}")
            for family, pattern in _RANKED.items():
                match = pattern.match(name)
                if match:
                    ranked.setdefault((family, rel_root), set()).add(int(match.group(1)))
        if ".metadata" in names or any(name.endswith(".distcp") for name in names):
            problems += _dcp_problems(root, rel_root)
    problems += _rank_gaps(ranked)
    problems += _deepspeed_problems(folder)
    return problems


def file_problem(path: str) -> str | None:
    """What is wrong with one file by its format (None: whole, or a format without a self-check)."""
    name = os.path.basename(path)
    try:
        if name.endswith(".json"):
            with open(path, encoding="utf-8") as handle:
                json.load(handle)
        elif name.endswith(".safetensors"):
            return _safetensors_problem(path)
        elif name.endswith(_TORCH_SAVE):
            return _torch_save_problem(path)
    except (OSError, ValueError) as exc:
        return f"unreadable ({_short(exc)})"
    return None


def _safetensors_problem(path: str) -> str | None:
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"is cut short ({size} bytes, no header)"
        length = int.from_bytes(head, "little")
        if length > size - 8:
            return f"has a broken header (says {length} bytes of header, the file has {size})"
        header = json.loads(handle.read(length))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    end = 0
    for key, entry in header.items():
        if key != "__metadata__":
            end = max(end, int(entry["data_offsets"][1]))
    if 8 + length + end != size:
        return f"is {size} bytes, its header says {8 + length + end}"
    return None


def _torch_save_problem(path: str) -> str | None:
    with open(path, "rb") as handle:
        first = handle.read(2)
    if first[:1] == b"\x80":  # torch.save's legacy (pickle) format: no directory to check
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                # Reads the member's local header only (its signature, its name): not its data.
                with archive.open(info):
                    pass
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, KeyError, NotImplementedError) as exc:
        return f"is not a whole torch.save file (zip: {_short(exc)})"
    return None


def _dcp_problems(root: str, rel_root: str) -> list[str]:
    where = "" if rel_root == "." else f"{rel_root}/"
    if not os.path.isfile(os.path.join(root, ".metadata")):
        return [f"{where}.metadata missing (an FSDP sharded checkpoint's index)"]
    try:
        from torch.distributed.checkpoint import FileSystemReader

        metadata = FileSystemReader(root).read_metadata()
        ends: dict[str, int] = {}
        for info in metadata.storage_data.values():
            ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    except Exception as exc:  # noqa: BLE001 - an unpickling error can be of any type
        return [f"{where}.metadata unreadable ({_short(exc)})"]
    problems = []
    for name, end in sorted(ends.items()):
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            problems.append(f"no {where}{name} (listed in {where}.metadata)")
        elif os.path.getsize(path) < end:
            problems.append(f"{where}{name} is {os.path.getsize(path)} bytes, {where}.metadata needs {end}")
    return problems


def _rank_gaps(ranked: dict[tuple[str, str], set[int]]) -> list[str]:
    """Every per-rank family holds every rank of the saved world size, the highest rank found in any of them plus one:
    a rank's optimizer state without its RNG state (or the reverse) is a torn save."""
    world = max((max(ranks) for ranks in ranked.values()), default=-1) + 1
    problems = []
    for (family, where), ranks in sorted(ranked.items()):
        missing = sorted(set(range(world)) - ranks)
        if missing:
            place = "" if where == "." else f" in {where}"
            problems.append(f"{family}{place} lack rank(s) {', '.join(map(str, missing))}")
    return problems


def _deepspeed_problems(folder: str) -> list[str]:
    steps = [name for name in os.listdir(folder) if name.startswith("global_step")
             and os.path.isdir(os.path.join(folder, name))]
    if not steps:
        return []
    latest = os.path.join(folder, "latest")
    if not os.path.isfile(latest):
        return ["no latest (DeepSpeed's pointer to its global_step folder)"]
    try:
        with open(latest, encoding="utf-8") as handle:
            tag = handle.read().strip()
    except (OSError, ValueError) as exc:
        return [f"latest unreadable ({_short(exc)})"]
    if not tag or not os.path.isdir(os.path.join(folder, tag)):
        return [f"latest names {tag!r}, which is not a folder of the checkpoint"]
    tag_folder = os.path.join(folder, tag)
    names = os.listdir(tag_folder)
    problems = []
    if not any(_RANKED["DeepSpeed optimizer states"].match(name) for name in names):
        problems.append(f"no DeepSpeed optimizer states in {tag}")
    if not any(name.endswith("model_states.pt") for name in names):
        problems.append(f"no DeepSpeed model states in {tag}")
    return problems


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
