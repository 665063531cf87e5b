"""Turn a `dataset_name` (Hub id, local file, local folder) and a split name into a `datasets.Dataset`.

Local layouts understood:
  - a single file (`.json` list or JSON lines, `.jsonl`, `.parquet`, `.csv`, `.arrow`): it is the train split,
    whatever the split is called, and there is no test split;
  - a folder with one file per split, named after the split (`train_sft.jsonl`, `test_sft.parquet`...), or sharded the
    way the Hub stores parquet (`train_sft-00000-of-00002.parquet`), directly in the folder or in its `data/`
    subfolder;
  - a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..core.hub import locate, looks_like_path  # noqa: F401 - `looks_like_path`: the one path-or-Hub rule
from .schemas import SCHEMAS, DataError, DataPathError

# Extension -> `datasets` packaged builder.
SUPPORTED_EXTENSIONS = {
    ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow",
    ".txt": "text",  # one row per line, in a `text` column (plain-text corpora)
}
_SHARD = re.compile(r"^(?P<split>.+?)-\d{5}-of-\d{5}$")


@dataclass
class DataSource:
    """Where a dataset comes from: `kind` is "hub", "file", "folder" or "saved" (a `save_to_disk` folder)."""

    kind: str
    location: str
    # For "folder": split name -> data files.
    split_files: dict[str, list[str]] = field(default_factory=dict)

    @property
    def is_local(self) -> bool:
        return self.kind != "hub"


def _split_files(folder: Path) -> dict[str, list[str]]:
    splits: dict[str, list[str]] = {}
    for directory in (folder, folder / "data"):
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            suffix = path.suffix.lower()
            if not path.is_file() or suffix not in SUPPORTED_EXTENSIONS or path.name.startswith("."):
                continue
            # `save_to_disk` leaves `state.json`/`dataset_info.json` next to arrow files; they are not splits.
            if path.name in ("state.json", "dataset_info.json", "dataset_dict.json"):
                continue
            match = _SHARD.match(path.stem)
            split = match.group("split") if match else path.stem
            splits.setdefault(split, []).append(str(path))
    for split, files in splits.items():
        builders = {SUPPORTED_EXTENSIONS[Path(file).suffix.lower()] for file in files}
        if len(builders) > 1:
            raise DataError(
                f"Split {split!r} in {folder} mixes file types: {', '.join(files)}. Keep one format per split."
            )
    return splits


def resolve_source(name: str | None) -> DataSource:
    """Decide whether `name` is a local file, a local folder or a Hub id (`trl_emo.core.hub.locate`), and check that a
    local path exists."""
    if not name:
        raise DataError("No dataset given: set `dataset_name` to a Hub id or a local file/folder.")
    kind, location = locate(name)
    if kind == "missing":
        raise DataPathError(f"Dataset path not found: {name}")
    if kind == "hub":
        return DataSource("hub", name)
    path = Path(location)
    if path.is_file():
        if path.suffix.lower() not in SUPPORTED_EXTENSIONS:
            raise DataError(
                f"Unsupported dataset file extension {path.suffix or '(none)'!r} for {name}; supported: "
                f"{', '.join(sorted(SUPPORTED_EXTENSIONS))}."
            )
        return DataSource("file", str(path))
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            return DataSource("saved", str(path))
        splits = _split_files(path)
        if not splits:
            raise DataError(
                f"No dataset files found in folder {name}: expected one file per split named after it "
                f"(e.g. train.jsonl, test.parquet; extensions {', '.join(sorted(SUPPORTED_EXTENSIONS))}), "
                "or a folder written by `save_to_disk`."
            )
        return DataSource("folder", str(path), splits)
    raise DataError(f"Dataset path {name} is neither a file nor a folder.")


def available_splits(source: DataSource) -> list[str] | None:
    """The split names of a local source (`None` for a Hub id: it would need the network to know)."""
    if source.kind == "file":
        return ["train"]
    if source.kind == "folder":
        return list(source.split_files)
    if source.kind == "saved":
        return list(_load_saved(source.location).keys())
    return None


def _load_saved(location: str):
    from datasets import Dataset, load_from_disk

    saved = load_from_disk(location)
    # A single saved `Dataset` behaves like a single file: it is the train split.
    return {"train": saved} if isinstance(saved, Dataset) else saved


def _missing_split_message(source: DataSource, split: str, found: list[str]) -> str:
    message = f"Split {split!r} not found in {source.location}; splits found: {', '.join(found) or '(none)'}."
    hints = [
        f"schema {schema.name!r} uses dataset_train_split={schema.train_split!r}"
        + (f" / dataset_test_split={schema.test_split!r}" if schema.test_split else "")
        for schema in SCHEMAS.values()
        if schema.train_split in found and schema.train_split != "train"
    ]
    if hints:
        message += " Hint: " + "; ".join(hints) + "."
    return message


def load_split(source: DataSource, split: str, config: str | None = None, required: bool = True):
    """Load one split of `source` as a `datasets.Dataset`.

    A missing split raises `DataError` (listing the splits found) when `required`, else returns `None`. A single local
    file is always the train split: asking it for any other split (when not required) gives `None`.
    """
    from datasets import load_dataset

    if source.kind == "hub":
        try:
            return load_dataset(source.location, config, split=split)
        except ValueError as exc:
            # `datasets` raises ValueError('Unknown split "x". Should be one of [...]').
            if not required and "unknown split" in str(exc).lower():
                return None
            raise
    if source.kind == "file":
        if not required:
            return None
        return _load_files([source.location], "dataset file")
    if source.kind == "saved":
        splits = _load_saved(source.location)
        if split not in splits:
            if required:
                raise DataError(_missing_split_message(source, split, list(splits)))
            return None
        return splits[split]
    files = source.split_files.get(split)
    if files is None:
        if required:
            raise DataError(_missing_split_message(source, split, list(source.split_files)))
        return None
    return _load_files(files, f"split {split!r} of {source.location}")


def _is_empty_file(path: str) -> bool:
    size = os.path.getsize(path)
    if size > 64:
        return False
    with open(path, "rb") as handle:
        return handle.read().strip() in (b"", b"[]")


def _load_files(files: list[str], what: str):
    """Read local data files of one split, turning the `datasets` failures on empty or malformed files into
    `DataError`s that name the files."""
    from datasets import Dataset, load_dataset

    if all(Path(file).suffix.lower() in (".json", ".jsonl", ".csv", ".txt") and _is_empty_file(file) for file in files):
        # `datasets` cannot even infer a schema from an empty file; report it like any other empty split.
        return Dataset.from_dict({})
    builder = SUPPORTED_EXTENSIONS[Path(files[0]).suffix.lower()]
    try:
        # Loaded under the name "train": `datasets` restricts split names, local file names are not.
        return load_dataset(builder, data_files={"train": files}, split="train")
    except Exception as exc:  # noqa: BLE001 - re-raised with the file names, the cause kept
        cause = exc.__cause__ or exc
        raise DataError(
            f"Could not read {what} ({', '.join(files)}) as {builder}: {type(cause).__name__}: {cause}"
        ) from exc
