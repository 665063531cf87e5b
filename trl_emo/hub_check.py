"""Every Hugging Face Hub id a run needs, checked before anything slow starts; a Hub failure is one line that names
the field, the id, and the fix.

A run names several Hub ids (the model, the chat template's tokenizer, the dataset, EMO's cost embedding, ASFT's
reference, an adapter's base model, the evaluation's policies, reward model and featurizers). When one of them cannot
be had, transformers and datasets end in a long traceback that does not say which field named it. So:

- `HubSource`: one Hub id and the field that named it. `sft_sources`, `dpo_sources` and `eval_sources` list those of
  a run (local paths are not Hub ids: `trl_emo.sources.locate` decides, and a missing path has its own error).
- `check_sources(sources)`: the preflight. Offline (`HF_HUB_OFFLINE`), each id must be in the local cache, as
  transformers and datasets then require; online, huggingface_hub's `repo_info` (a short timeout:
  `HF_HUB_ETAG_TIMEOUT`) and, for a gated repository, `auth_check`. Raises `HubAccessError`.
- `hub_errors(sources)`: the same error for a Hub failure that surfaces later, while loading (transformers' and
  datasets' errors keep huggingface_hub's exception as their cause).
- `check_hub_ids({field: id})`: the preflight for a command with its own options (`trl-emo demo --model`);
  `offline_unless_hub(*ids)` sets offline mode for such a command when none of its ids needs the Hub.

The commands print `HubAccessError` as one line on stderr and exit with status 2 (`trl_emo.cli_utils.run_command`
does it for any command's `main`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# Causes, from huggingface_hub's exception types (`classify`).
OFFLINE = "offline"  # HF_HUB_OFFLINE is set and the id is not in the local cache
UNREACHABLE = "unreachable"  # the Hub did not answer (network, proxy, HF_ENDPOINT, server error), and no cached copy
GATED = "gated"  # a gated repository this account has not been granted
NOT_FOUND = "not_found"  # no such repository (or a private one this account cannot see)
REVISION = "revision"  # the repository exists, the revision does not


@dataclass(frozen=True)
class HubSource:
    """A Hub id a run needs.

    Attributes:
        field: the field that named it, as the message shows it (`model_name_or_path`, `policies[ce]`...).
        repo_id: the Hub id.
        repo_type: `"model"` or `"dataset"`.
        revision: the revision asked for (None: the default branch).
        revision_field: the field that set `revision` (`model_revision`).
        filename: a file every usable copy has, to tell a cached copy offline (`config.json` for a model,
            `tokenizer_config.json` where only the tokenizer is read).
        fix: what to point at a local folder instead (default: `field`).
    """

    field: str
    repo_id: str
    repo_type: str = "model"
    revision: str | None = None
    revision_field: str | None = None
    filename: str = "config.json"
    fix: str | None = None


class HubAccessError(Exception):
    """A Hub id of the run that cannot be used: offline and not cached, Hub unreachable, gated, not found. Its
    message is one line naming the field, the id and the fix; `source` and `cause` hold them."""

    def __init__(self, source: HubSource, cause: str, detail: str = ""):
        self.source, self.cause, self.detail = source, cause, detail
        super().__init__(describe(source, cause, detail))

    def __reduce__(self):  # picklable across processes, like any exception
        return type(self), (self.source, self.cause, self.detail)


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT.rstrip("/")


def repo_url(source: HubSource) -> str:
    prefix = "datasets/" if source.repo_type == "dataset" else ""
    return f"{_endpoint()}/{prefix}{source.repo_id}"


def describe(source: HubSource, cause: str, detail: str = "") -> str:
    """The one-line message of a failed Hub id, with the fix for its cause."""
    what = "dataset" if source.repo_type == "dataset" else "model"
    path = "file or folder" if source.repo_type == "dataset" else "folder"
    fix = source.fix or source.field
    head = f"{source.field}: {source.repo_id!r}"
    if cause == OFFLINE:
        return (
            f"{head} is no local {path}, and as a Hub {what} id it has no copy in the local Hugging Face cache while "
            f"offline mode is on (HF_HUB_OFFLINE=1): run once with network access to download it, or unset "
            f"HF_HUB_OFFLINE, or point {fix} at a local {path}."
        )
    if cause == UNREACHABLE:
        reason = f" ({detail})" if detail else ""
        return (
            f"{head} is no local {path}, and the Hugging Face Hub ({_endpoint()}) could not be reached{reason} to "
            f"fetch it (no cached copy either): check the network connection, the proxy (HTTPS_PROXY) or HF_ENDPOINT, "
            f"or point {fix} at a local {path}."
        )
    if cause == GATED:
        return (
            f"{head} is a gated Hub repository this account has no access to: log in with `hf auth login` (or set "
            f"HF_TOKEN) and accept its licence at {repo_url(source)}."
        )
    if cause == REVISION:
        setting = f" ({source.revision_field})" if source.revision_field else ""
        return (
            f"{head} has no revision {source.revision!r}{setting} on the Hub: check the branch, tag or commit name at "
            f"{repo_url(source)}."
        )
    return (
        f"{head} is neither a local {path} nor a {what} repository on the Hugging Face Hub: check the id or path "
        "(a typo?); a private repository also needs `hf auth login`."
    )


# -- which Hub ids a run needs ------------------------------------------------------------------------------------------


def _hub_id(name) -> str | None:
    """`name` when it is a Hub id (`trl_emo.sources.locate`), else None (a local path, or nothing)."""
    from .sources import locate

    if not isinstance(name, str) or not name:
        return None
    kind, _ = locate(name)
    return name if kind == "hub" else None


def model_sources(field: str, name, revision: str | None = None, revision_field: str | None = None,
                  filename: str = "config.json") -> list[HubSource]:
    """`name` as a Hub model id; or, when it is a local LoRA adapter folder, the adapter's base model when that is a
    Hub id (its `adapter_config.json` names it)."""
    from .sources import SourceError, adapter_base

    repo_id = _hub_id(name)
    if repo_id is not None:
        return [HubSource(field, repo_id, revision=revision, revision_field=revision_field, filename=filename)]
    if not isinstance(name, str) or not name:
        return []
    try:
        base = adapter_base(name)
    except SourceError:
        return []  # reported where the adapter is loaded
    base_id = _hub_id(base)
    if base_id is None:
        return []
    config = os.path.join(os.path.expanduser(name), "adapter_config.json")
    return [HubSource(f"the base model of the adapter in {field}", base_id,
                      fix=f"base_model_name_or_path in {config}")]


def dataset_sources(field: str, name) -> list[HubSource]:
    repo_id = _hub_id(name)
    return [HubSource(field, repo_id, repo_type="dataset")] if repo_id else []


def _cost_embedding_sources(training_args) -> list[HubSource]:
    from .losses import get_loss
    from .losses.registry import TRL_LOSS_TYPES

    value = getattr(training_args, "emo_cost_embedding", None)
    loss_type = getattr(training_args, "loss_type", None)
    if value in (None, "frozen", "lm_head") or loss_type in TRL_LOSS_TYPES:
        return []
    try:
        uses_cost = get_loss(loss_type).uses_cost_embedding
    except (KeyError, ValueError):
        return []
    return model_sources("emo_cost_embedding", value) if uses_cost else []


def sft_sources(script_args, training_args, model_args) -> list[HubSource]:
    """The Hub ids a `trl_emo.sft` run loads: the model (at `model_revision`), the tokenizer whose chat template it
    clones (`chat_template_path`), the dataset, EMO's cost embedding and ASFT's reference model."""
    sources = model_sources("model_name_or_path", model_args.model_name_or_path, model_args.model_revision,
                            "model_revision")
    # A `.jinja` file is a path whatever its shape (`trl_emo.sources.locate`).
    sources += model_sources("chat_template_path", training_args.chat_template_path, filename="tokenizer_config.json")
    sources += dataset_sources("dataset_name", script_args.dataset_name)
    sources += _cost_embedding_sources(training_args)
    if getattr(training_args, "loss_type", None) == "asft":
        sources += model_sources("asft_ref_model", getattr(training_args, "asft_ref_model", None))
    return sources


def dpo_sources(script_args, model_args) -> list[HubSource]:
    """The Hub ids a `trl_emo.dpo` run loads: the starting model (or its adapter's base) and the dataset."""
    return [
        *model_sources("model_name_or_path", model_args.model_name_or_path, model_args.model_revision, "model_revision"),
        *dataset_sources("dataset_name", script_args.dataset_name),
    ]


def eval_sources(config) -> list[HubSource]:
    """The Hub ids an evaluation loads: each policy (or its adapter's base), the reward model, the prompt set (or the
    ICL benchmarks' datasets), the MAUVE featurizer, the sentence encoders, as far as the task uses them."""
    task = config.task_class()
    ignores, own = set(getattr(task, "ignores", ())), set(getattr(task, "fields", ()))
    sources = []
    for name, path in config.policies.items():
        sources += model_sources(f"policies[{name}]", path)
    if config.reward_model and "reward_model" not in ignores:
        sources += model_sources("reward_model", config.reward_model)
    if "icl_benchmarks" in own:
        from .evaluation import icl_data

        if config.prompts == icl_data.HUB:
            for benchmark in config.icl_benchmarks or list(icl_data.BENCHMARKS):
                if benchmark in icl_data.BENCHMARKS:
                    sources.append(HubSource(f"prompts (icl benchmark {benchmark})",
                                             icl_data.BENCHMARKS[benchmark].hub_id, repo_type="dataset"))
    else:
        sources += dataset_sources("prompts", config.prompts)
    if "mauve_featurizer" in own and config.mauve:
        from .evaluation.mauve_score import DEFAULT_FEATURIZER

        sources += model_sources("mauve_featurizer", config.mauve_featurizer or DEFAULT_FEATURIZER)
    if config.embedding_model and config.embedding_diversity and "embedding_model" not in ignores:
        sources += model_sources("embedding_model", config.embedding_model)
    if "icl_retriever" in own and config.icl_retriever:
        sources += model_sources("icl_retriever", config.icl_retriever)
    return sources


# -- checking them ------------------------------------------------------------------------------------------------------


def offline_unless_hub(*names: str | None) -> None:
    """Default to offline mode (`HF_HUB_OFFLINE`, `HF_DATASETS_OFFLINE`) when none of `names` is a Hub id (by
    `trl_emo.sources.locate`'s rule): nothing of the run needs the Hub, so no library waits on a network it cannot
    reach. A Hub id among them keeps the user's own setting. Call it before huggingface_hub is imported (it reads the
    variables once)."""
    if not any(_hub_id(name) for name in names):
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


def check_hub_ids(fields: Mapping[str, str | None], repo_type: str = "model") -> None:
    """The preflight of a command with options of its own: `{field: name}`, each name a local path (not checked) or
    a Hub id of `repo_type`. E.g. `check_hub_ids({"--model": args.model})`."""
    sources = []
    for field, name in fields.items():
        sources += dataset_sources(field, name) if repo_type == "dataset" else model_sources(field, name)
    check_sources(sources)


# -- the same errors, later ---------------------------------------------------------------------------------------------


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
