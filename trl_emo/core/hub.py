"""Where a name points (a local path or a Hugging Face Hub id), and every Hub id a run needs checked before anything
slow starts; a Hub failure is one line that names the field, the id, and the fix.

A run names several Hub ids (the model, the chat template's tokenizer, the dataset, EMO's cost embedding, ASFT's
reference, an adapter's base model, the evaluation's policies, reward model and featurizers). When one of them cannot
be had, transformers and datasets end in a long traceback that does not say which field named it. So:

- `locate(name)`: the one rule for "local path or Hub id?" that every layer follows (datasets, models, adapters,
  EMO's cost embedding, prompt sets): a name that exists on disk is local; a name shaped like a Hub id (`name` or
  `owner/name`) that does not is a Hub id; anything else is a local path that is missing.
- `check_sources(sources)`: the preflight of a list of `HubSource`s (`trl_emo.core.errors`). Each layer that loads
  something says which ids it will load (`trl_emo.models.hub_ids` for a model or dataset name,
  `trl_emo.commands.preflight` for a training command, each evaluation task's `hub_sources`); this module only checks
  the list. Offline (`HF_HUB_OFFLINE`), each id must be in the local cache, as transformers and datasets then
  require; online, huggingface_hub's `repo_info` (a short timeout: `HF_HUB_ETAG_TIMEOUT`) and, for a gated
  repository, `auth_check`. Raises `HubAccessError`.
- `hub_errors(sources)`: the same error for a Hub failure that surfaces later, while loading (transformers' and
  datasets' errors keep huggingface_hub's exception as their cause).
- `offline_unless_hub(*ids)` sets offline mode for a command when none of its ids needs the Hub.

The commands print `HubAccessError` as one line on stderr and exit with status 2
(`trl_emo.commands.command_line.run_command` does it for any command's `main`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

from .errors import GATED, NOT_FOUND, OFFLINE, REVISION, UNREACHABLE, HubAccessError, HubSource

logger = logging.getLogger(__name__)

# -- local path or Hub id -----------------------------------------------------------------------------------------------

# Extensions that mark a name as a file path even when nothing exists there, so the error is "not found" rather
# than a failed Hub download: data files, tensor files, archives.
PATH_SUFFIXES = {
    ".json", ".jsonl", ".parquet", ".csv", ".arrow", ".txt", ".tsv", ".gz", ".zip", ".xz", ".zst", ".pkl",
    ".safetensors", ".pt", ".pth", ".bin", ".npy", ".yaml", ".yml", ".jinja", ".j2", ".gguf",
}
# `name` or `owner/name`, letters, digits, `_`, `-` and `.` (the Hub's repository ids).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def looks_like_path(name: str) -> bool:
    """Whether `name` can only be a local path: it is not shaped like a Hub id (`name` or `owner/name`: it starts
    with `.`, `/` or `~`, holds a backslash, a space or a second `/`...), or it ends with a file extension."""
    return not _HUB_ID.match(name) or Path(name).suffix.lower() in PATH_SUFFIXES


def locate(name: str) -> tuple[str, str]:
    """`("local", path)` when `name` exists on disk (`~` expanded); `("hub", name)` when it does not but can be a Hub
    id; `("missing", path)` when it can only be a local path, and nothing is there."""
    path = os.path.expanduser(name)
    if os.path.exists(path):
        return "local", path
    if looks_like_path(name):
        return "missing", path
    return "hub", name


def hub_id(name) -> str | None:
    """`name` when it is a Hub id (`locate`), else None (a local path, or nothing)."""
    if not isinstance(name, str) or not name:
        return None
    kind, _ = locate(name)
    return name if kind == "hub" else None


# -- checking them ------------------------------------------------------------------------------------------------------


def offline_unless_hub(*names: str | None) -> None:
    """Default to offline mode (`HF_HUB_OFFLINE`, `HF_DATASETS_OFFLINE`) when none of `names` is a Hub id (by
    `trl_emo.core.hub.locate`'s rule): nothing of the run needs the Hub, so no library waits on a network it cannot
    reach. A Hub id among them keeps the user's own setting. Call it before huggingface_hub is imported (it reads the
    variables once)."""
    if not any(hub_id(name) for name in names):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def is_offline() -> bool:
    """huggingface_hub's offline mode (`HF_HUB_OFFLINE`), which transformers and datasets follow."""
    from huggingface_hub import is_offline_mode

    return is_offline_mode()


def is_cached(source: HubSource) -> bool:
    """Whether a usable copy of `source` is in the local cache, by the rule its loader follows offline: for a model,
    huggingface_hub's cache holds `filename` at the revision; for a dataset, datasets' cache holds a prepared copy."""
    if source.repo_type == "dataset":
        try:
            from datasets.load import CachedDatasetModuleFactory
        except ImportError:  # another datasets layout: let the loader decide (its failure is translated)
            return True
        quiet = logging.getLogger("datasets.load")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # it logs "Using the latest cached version" when it finds one
        try:
            CachedDatasetModuleFactory(source.repo_id).get_module()
        except (FileNotFoundError, AssertionError):
            return False
        finally:
            quiet.setLevel(level)
        return True
    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(source.repo_id, source.filename, revision=source.revision, repo_type=source.repo_type)
    return isinstance(path, str)


def _ask_hub(source: HubSource, timeout: float) -> None:
    """Raise huggingface_hub's own exception when the Hub refuses `source` (not found, revision not found, gated and
    not granted) or cannot be reached."""
    from huggingface_hub import HfApi

    api = HfApi()
    info = api.repo_info(source.repo_id, repo_type=source.repo_type, revision=source.revision, timeout=timeout)
    if getattr(info, "gated", False):
        # The metadata of a gated repository is public; whether this account may download it is `auth_check`'s.
        api.auth_check(source.repo_id, repo_type=source.repo_type)


def check_sources(sources: Iterable[HubSource], timeout: float | None = None) -> None:
    """Raise `HubAccessError` for the first of `sources` the run could not load.

    Offline, each must be in the local cache. Online, the Hub is asked about each; once it cannot be reached, the rest
    need a cached copy (transformers and datasets fall back to it), and an id that has one passes.
    """
    from huggingface_hub import constants

    timeout = float(constants.HF_HUB_ETAG_TIMEOUT) if timeout is None else timeout
    offline = is_offline()
    unreachable = None  # the reason the Hub could not be reached, once it could not
    seen = set()
    for source in sources:
        key = (source.repo_id, source.repo_type, source.revision, source.filename)
        if key in seen:
            continue
        seen.add(key)
        if offline:
            if not is_cached(source):
                raise HubAccessError(source, OFFLINE)
            continue
        if unreachable is None:
            try:
                _ask_hub(source, timeout)
                continue
            except Exception as exc:  # noqa: BLE001 - sorted by huggingface_hub's types; anything else is re-raised
                found = classify(exc)
                if found is None:
                    from huggingface_hub.errors import HfHubHTTPError

                    if not isinstance(exc, HfHubHTTPError):
                        raise
                    # An answer the check cannot read (an expired token...): the loader will ask again and say.
                    logger.warning("Could not check %s %r on the Hub: %s", source.field, source.repo_id,
                                   " ".join(str(exc).split()))
                    continue
                cause, detail = found
                if cause != UNREACHABLE:
                    raise HubAccessError(source, cause, detail) from exc
                unreachable = detail
        if not is_cached(source):
            raise HubAccessError(source, UNREACHABLE, unreachable)


def _chain(exc: BaseException):
    """`exc` and its causes and contexts (a `raise ... from None` hides the context, it does not drop it)."""
    seen, todo = set(), [exc]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [current.__cause__, current.__context__]


def classify(exc: BaseException) -> tuple[str, str] | None:
    """(cause, detail) of a failure whose chain holds one of huggingface_hub's exceptions; None for anything else."""
    from huggingface_hub import errors

    try:
        from httpx2 import TransportError  # huggingface_hub 2's HTTP client
    except ImportError:
        from httpx import TransportError

    chain = list(_chain(exc))

    def first(*types):
        return next((e for e in chain if isinstance(e, types)), None)

    if first(errors.GatedRepoError):
        return GATED, ""
    if first(errors.RevisionNotFoundError):
        return REVISION, ""
    if first(errors.RepositoryNotFoundError, errors.HFValidationError):  # HFValidationError: not a valid repo id
        return NOT_FOUND, ""
    if first(errors.OfflineModeIsEnabled) or (is_offline() and first(ConnectionError)):
        # datasets refuses with its own `OfflineModeIsEnabled`, a ConnectionError
        return OFFLINE, ""
    transport = first(TransportError)
    if transport is not None:
        reason = " ".join(str(transport).split())[:160]  # one line, however the client worded it
        return UNREACHABLE, f"{type(transport).__name__}: {reason}" if reason else type(transport).__name__
    if first(errors.LocalEntryNotFoundError):
        # Not in the cache, and the Hub was not asked (offline) or did not answer.
        return (OFFLINE, "") if is_offline() else (UNREACHABLE, "")
    server = first(errors.HfHubHTTPError)
    status = getattr(getattr(server, "response", None), "status_code", None)
    if status is not None and (status >= 500 or status == 429):
        return UNREACHABLE, f"HTTP {status}"
    return None


def _named_source(chain: list, sources: list[HubSource]) -> HubSource | None:
    """The source a failure is about: the repository huggingface_hub names, else the id the messages mention (the
    longest, so `gpt2` does not shadow `gpt2-large`), else the only one; None when several could be meant (naming
    one of them at random would send the user to the wrong field)."""
    for exc in chain:
        repo_id = getattr(exc, "repo_id", None)
        for source in sources:
            if repo_id and repo_id == source.repo_id:
                return source
    text = " ".join(str(exc) for exc in chain)
    for source in sorted(sources, key=lambda s: -len(s.repo_id)):
        if source.repo_id in text:
            return source
    return sources[0] if len(sources) == 1 else None


@contextlib.contextmanager
def hub_errors(sources: HubSource | Iterable[HubSource]):
    """Turn a Hub failure raised inside the block (transformers' or datasets' error, huggingface_hub's exception in its
    chain) into `HubAccessError` naming the field of the id it is about; anything else passes through unchanged."""
    sources = [sources] if isinstance(sources, HubSource) else list(sources)
    try:
        yield
    except HubAccessError:
        raise
    except Exception as exc:
        chain = list(_chain(exc))
        named = next((e for e in chain if isinstance(e, HubAccessError)), None)
        if named is not None:  # already translated deeper down, then wrapped (e.g. in an EvaluationError)
            raise named from exc
        found = classify(exc) if sources else None
        source = _named_source(chain, sources) if found is not None else None
        if source is None:
            raise
        raise HubAccessError(source, *found) from exc
