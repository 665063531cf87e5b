"""What a checkpoint written by trl_emo holds, written last and checked by content: its manifest.

A folder renamed into place is complete when it is renamed; what happens to it afterwards (a copy cut short, a disk or
network-filesystem fault, a file truncated or overwritten by hand) is not seen by a check of which files are present.
So each checkpoint the commands write carries two records of its own:

- `trl_emo_checkpoint.json`, written first, when the staging folder is created: "trl_emo wrote this; a manifest must
  be here" (the run's identity and the step), so that a checkpoint whose manifest was deleted is not taken for a
  checkpoint of another writer;
- `trl_emo_manifest.json`, written last (after every process has written its part, before the rename that publishes
  the folder) and fsynced: every other file of the folder, subfolders included (DeepSpeed's `global_step*/`, FSDP's
  sharded folders, the loss's side files, whatever a trainer adds), with its size and an XXH3 checksum per 64 MiB
  block, and a CRC-32 of that list. A checkpoint with a manifest is complete only when every file it lists is there
  with that size and those checksums.

Why XXH3-64 (`xxhash`, which `datasets` already requires: every install of TRL has it): it catches accidental damage (a
torn copy, a bad block, a truncation, bytes overwritten) at 22 GB/s on one core here, at the speed of reading the page
cache. zlib's CRC-32 (the first format of this manifest, still read) runs at 2.5-4 GB/s here, which made the manifest
30% of a 12 GB save on two vCPUs (docs/reliability.md); a cryptographic hash (SHA-256 1.7 GB/s, BLAKE2b 0.8 GB/s here)
buys resistance to deliberate forgery, which a checkpoint folder on the run's own disk does not need. The files are
read back once after they are written (from the page cache, while the fsyncs run on other threads meanwhile), one
checksum per 64 MiB block so that the blocks of every file are checksummed in parallel (both hashes release the GIL on
large buffers). The cost on a 1B-parameter checkpoint is in docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

RECORD = "trl_emo_checkpoint.json"
MANIFEST = "trl_emo_manifest.json"
# Written into a checkpoint that failed to load (`trl_emo.training.checkpoints`), after its manifest: not listed.
UNUSABLE = "trl_emo_unusable.json"
FORMAT = 2  # 1: CRC-32 blocks under "crc32" (still read); 2: XXH3-64 blocks under "blocks"
CHECKSUMS = ("xxh3_64", "crc32")
_NOT_LISTED = {MANIFEST, UNUSABLE}
BLOCK = 64 * 2**20  # one checksum per 64 MiB of a file: the blocks of one large file are checksummed in parallel
_CHUNK = 8 * 2**20  # read size
_LOCAL = threading.local()


class ManifestError(ValueError):
    """A manifest (or the record that announces one) that cannot be read: the checkpoint is torn."""


@dataclass(frozen=True)
class Manifest:
    run: str
    step: int | None
    saved_at: float
    files: dict  # relative path (with "/") -> {"size": int, "blocks": [hex digest per BLOCK bytes]}
    checksum: str = "xxh3_64"  # which hash the blocks are (CHECKSUMS)


def has_records(folder: str) -> bool:
    """Whether trl_emo wrote this checkpoint (its record or its manifest is there): it is then judged by its manifest."""
    return os.path.exists(os.path.join(folder, RECORD)) or os.path.exists(os.path.join(folder, MANIFEST))


def write_record(folder: str, run: str, step: int) -> None:
    """The first file of a staged checkpoint: trl_emo writes it, and a manifest is to follow."""
    _write_json(os.path.join(folder, RECORD), {"format": FORMAT, "writer": "trl_emo", "run": run, "step": step,
                                               "manifest": MANIFEST})


def _files(folder: str) -> list[str]:
    found = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if rel not in _NOT_LISTED:
                found.append(rel)
    return found


def _block_hash(path: str, offset: int, length: int, checksum: str) -> str:
    """The checksum of `length` bytes of `path` from `offset`, read in chunks into one buffer of this thread."""
    buffer = getattr(_LOCAL, "buffer", None)
    if buffer is None:
        buffer = _LOCAL.buffer = bytearray(_CHUNK)
    view, crc = memoryview(buffer), 0
    state = None
    if checksum == "xxh3_64":
        import xxhash  # a dependency of `datasets` (and of ours): imported here, where a checkpoint is checksummed

        state = xxhash.xxh3_64()
    fd = os.open(path, os.O_RDONLY)
    try:
        end = offset + length
        while offset < end:
            want = min(_CHUNK, end - offset)
            if hasattr(os, "preadv"):
                count = os.preadv(fd, [view[:want]], offset)
            else:  # no preadv (Windows): a copy
                data = os.pread(fd, want, offset)
                count = len(data)
                view[:count] = data
            if not count:
                raise OSError(f"{path} ended at byte {offset}")
            if state is not None:
                state.update(view[:count])
            else:
                crc = zlib.crc32(view[:count], crc)
            offset += count
    finally:
        os.close(fd)
    return state.hexdigest() if state is not None else f"{crc:08x}"


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _checksums(folder: str, sizes: dict[str, int], fsync: bool = False,
               checksum: str = "xxh3_64") -> dict[str, list[str]]:
    """Every file's checksums, one per `BLOCK` bytes, the blocks of all files computed side by side on threads
    (both hashes release the GIL on large buffers: a large file is no longer one core's work); with `fsync`, every
    file is flushed to disk on the same threads meanwhile (I/O waits, which the checksums overlap)."""
    tasks = [(rel, offset) for rel, size in sizes.items() for offset in range(0, size, BLOCK)]
    workers = min(32, (os.cpu_count() or 1) + (4 if fsync else 0), max(1, len(tasks) + (len(sizes) if fsync else 0)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        flushed = [pool.submit(_fsync_file, os.path.join(folder, *rel.split("/"))) for rel in sizes] if fsync else []
        futures = [pool.submit(_block_hash, os.path.join(folder, *rel.split("/")), offset,
                               min(BLOCK, sizes[rel] - offset), checksum) for rel, offset in tasks]
        crcs: dict[str, list[str]] = {rel: [] for rel in sizes}
        for (rel, _offset), future in zip(tasks, futures):
            crcs[rel].append(future.result())
        for future in flushed:
            future.result()
    return crcs


def _digest(files: dict) -> str:
    return f"{zlib.crc32(json.dumps(files, sort_keys=True).encode()):08x}"


def write_manifest(folder: str, run: str, step: int | None) -> Manifest:
    """Checksum and fsync every file of `folder`, then write its manifest and fsync it and every folder: the last
    write of a checkpoint before the rename that publishes it."""
    sizes = {rel: os.path.getsize(os.path.join(folder, *rel.split("/"))) for rel in _files(folder)}
    crcs = _checksums(folder, sizes, fsync=True)
    files = {rel: {"size": size, "blocks": crcs[rel]} for rel, size in sizes.items()}
    manifest = Manifest(run, step, time.time(), files)
    _write_json(os.path.join(folder, MANIFEST), {
        "format": FORMAT, "writer": "trl_emo", "run": run, "step": step, "saved_at": manifest.saved_at,
        "checksum": "xxh3_64", "block_bytes": BLOCK, "files": files, "files_crc32": _digest(files),
    })
    for root, _dirs, _names in os.walk(folder):
        fsync_dir(root)
    return manifest


def read_manifest(folder: str) -> Manifest:
    """The manifest of `folder`; a `ManifestError` saying why when it is missing (while the record announces one),
    unreadable, or does not match its own checksum."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        if os.path.exists(os.path.join(folder, RECORD)):
            raise ManifestError(f"no {MANIFEST} (its {RECORD} says it was written with one)")
        raise ManifestError(f"no {MANIFEST}")
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        files = data["files"]
        if not isinstance(files, dict) or data.get("files_crc32") != _digest(files):
            raise ValueError("its list of files does not match its checksum")
        if data.get("block_bytes", BLOCK) != BLOCK:
            raise ValueError(f"written with {data.get('block_bytes')}-byte blocks, this version reads {BLOCK}")
        checksum = data.get("checksum", "crc32")
        if checksum not in CHECKSUMS:
            raise ValueError(f"checksum {checksum!r}, this version reads {', '.join(CHECKSUMS)}")
        key = "crc32" if data.get("format", 1) == 1 else "blocks"  # format 1 kept its CRC-32 blocks under "crc32"
        files = {rel: {"size": entry["size"], "blocks": entry[key]} for rel, entry in files.items()}
        for entry in files.values():
            if not isinstance(entry["size"], int) or len(entry["blocks"]) != -(-entry["size"] // BLOCK):
                raise ValueError("an entry does not match its size")
        return Manifest(str(data["run"]), data.get("step"), float(data.get("saved_at", 0.0)), files, checksum)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ManifestError(f"{MANIFEST} unreadable ({_short(exc)})") from exc


def manifest_problems(folder: str, content: bool = True) -> list[str]:
    """What does not match the manifest of `folder` (empty: complete): a file missing, of another size, or (with
    `content`: every file read once) of another checksum; or the manifest itself missing or unreadable. Sizes are
    checked first, for every file, and the checksums only when they all match."""
    try:
        manifest = read_manifest(folder)
    except ManifestError as exc:
        return [str(exc)]
    problems = []
    for rel, entry in manifest.files.items():
        path = os.path.join(folder, *rel.split("/"))
        try:
            size = os.path.getsize(path)
        except OSError:
            problems.append(f"no {rel}")
            continue
        if size != entry["size"]:
            problems.append(f"{rel} is {size} bytes, its manifest says {entry['size']}")
    if problems or not content:
        return problems
    try:
        crcs = _checksums(folder, {rel: entry["size"] for rel, entry in manifest.files.items()},
                          checksum=manifest.checksum)
    except OSError as exc:
        return [f"unreadable ({_short(exc)})"]
    return [f"{rel} differs from its checksum in the manifest" for rel, entry in manifest.files.items()
            if crcs[rel] != entry["blocks"]]


def run_of(folder: str) -> str | None:
    """The run that wrote `folder` (its manifest's, else its record's), or None."""
    for name in (MANIFEST, RECORD):
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                return str(json.load(handle)["run"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def _write_json(path: str, data: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with open(fd, "w", encoding="utf-8", closefd=False) as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.write("\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: str) -> None:
    """Every file and folder of `folder` flushed to disk."""
    for root, _dirs, names in os.walk(folder):
        for name in names:
            _fsync_file(os.path.join(root, name))
        fsync_dir(root)


def fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a filesystem that cannot open folders: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
