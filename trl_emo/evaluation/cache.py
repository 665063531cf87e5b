"""Append-only JSONL caches that let an interrupted evaluation resume where it stopped.

Every row carries the fingerprint of the settings it was produced with; the settings themselves
sit next to the file in `<name>.settings.json`. Opening a cache whose rows were made with other
settings is an error naming the settings that differ (or, with `overwrite`, the stale file is
deleted): a changed model, sampling parameter or reward model never silently reuses old rows.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from .errors import EvaluationError


def fingerprint(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


class JsonlCache:
    """Rows keyed by `key_fields`, appended and flushed as they are produced."""

    def __init__(self, path: str | os.PathLike, settings: dict, key_fields: tuple[str, ...], overwrite: bool = False):
        self.path = Path(path)
        self.settings = json.loads(json.dumps(settings, sort_keys=True, default=str))
        self.fingerprint = fingerprint(self.settings)
        self.key_fields = key_fields
        self.settings_path = self.path.with_name(self.path.stem + ".settings.json")
        self.rows: dict[tuple, dict] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._load(overwrite)
        header = {"fingerprint": self.fingerprint, "settings": self.settings}
        self.settings_path.write_text(json.dumps(header, indent=2, sort_keys=True))

    def key(self, row: dict) -> tuple:
        return tuple(row[name] for name in self.key_fields)

    def __contains__(self, key: tuple) -> bool:
        return key in self.rows

    def __len__(self) -> int:
        return len(self.rows)

    def _load(self, overwrite: bool) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        # A kill during a write leaves a last line without its newline: drop it, or the next append
        # would be glued to it.
        complete = data[: data.rfind(b"\n") + 1]
        if len(complete) != len(data):
            with open(self.path, "r+b") as handle:
                handle.truncate(len(complete))
        rows = [json.loads(line) for line in complete.decode("utf-8").splitlines() if line.strip()]
        stale = [row for row in rows if row.get("fingerprint") != self.fingerprint]
        if stale:
            if overwrite:
                self.path.unlink()
                return
            raise EvaluationError(self._mismatch_message())
        for row in rows:
            self.rows[self.key(row)] = row

    def _mismatch_message(self) -> str:
        lines = [f"{self.path} was written with different settings"]
        try:
            old = json.loads(self.settings_path.read_text())["settings"]
        except (OSError, ValueError, KeyError):
            old = None
        if isinstance(old, dict):
            for name in sorted(set(old) | set(self.settings)):
                if old.get(name) != self.settings.get(name):
                    lines.append(f"  - {name}: cached {old.get(name)!r}, now {self.settings.get(name)!r}")
        lines.append("Use another output_dir, or set `overwrite: true` to discard the cached rows and start over.")
        return "\n".join(lines)

    def append(self, rows: Iterable[dict]) -> None:
        rows = [{**row, "fingerprint": self.fingerprint} for row in rows]
        if not rows:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
            handle.flush()
        for row in rows:
            self.rows[self.key(row)] = row


def file_signature(path: str) -> dict | str:
    """What identifies a model for the cache: its resolved folder plus the size and mtime of its weights.

    Retraining into the same folder changes the weights' mtime, so old generations are not reused
    for a new model. A Hub id is identified by its name.
    """
    if not os.path.isdir(path):
        return path
    files = {}
    for name in sorted(os.listdir(path)):
        if name.endswith((".safetensors", ".bin", ".pt")):
            stat = os.stat(os.path.join(path, name))
            files[name] = [stat.st_size, stat.st_mtime_ns]
    return {"path": os.path.abspath(path), "files": files}
