"""The errors that several layers raise, at the bottom so that any layer may raise or catch them.

- `ConfigError`: a recipe, command line or configuration that cannot be used as given (the commands, the evaluation's
  configuration, the TRL seam's checks raise it; every command prints it as one line and exits with status 2).
- `HubAccessError`: a Hugging Face Hub id of the run that cannot be used (offline and not cached, Hub unreachable,
  gated, not found, no such revision), one line naming the field, the id and the fix. `HubSource` is the id and the
  field that named it. Raised wherever a Hub id is loaded: the preflight (`trl_emo.core.hub.check_sources`), the
  loaders (`hub_errors`), EMO's cost embedding at the first training step.

Each layer's own errors stay with it (`DataError` in `trl_emo.data`, `SourceError` in `trl_emo.models`,
`EvaluationError` in `trl_emo.evaluation`, `UnknownLossError` in `trl_emo.losses`).
"""

from __future__ import annotations

from dataclasses import dataclass


class ConfigError(ValueError):
    """A recipe or command line that cannot be used as given."""


# Causes of a Hub failure, from huggingface_hub's exception types (`trl_emo.core.hub.classify`).
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
