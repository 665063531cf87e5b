"""Keep the commands' output free of notices from optional packages they do not use.

Installed optional packages get imported by the libraries we build on whether a run uses them or not, and two
of them print a line at import on a machine without a GPU:

- bitsandbytes (PEFT imports it whenever it is installed, and transformers imports PEFT as soon as a training
  config is built) logs, on CPUs with AVX-512 bf16, that its optional CPU 4-bit kernel from the `kernels` package
  is missing. That only matters to a k-bit model on the CPU.
- DeepSpeed (imported by transformers' and accelerate's integrations when installed) logs that it falls back to
  the CPU accelerator. That only matters to a DeepSpeed run.

The commands hold those notices back (`quiet_optional_packages`, before the imports) and let them through
(`release`) when the run uses the package. The Python API does the same: `trl_emo.SFTConfig`, `SFTTrainer` and the
other lazily imported names call `quiet_optional_packages` before their first import (a k-bit model in your own script:
`trl_emo.core.noise.release("bitsandbytes")` shows the held notice).

They also drop the deprecation warnings that the libraries raise at each other (`quiet_library_deprecations`):
transformers 5.23 renamed its `gradient_checkpointing` methods to `activation_checkpointing` and warns on every use of
the old names, which PEFT 0.21 and TRL 1.16 still call themselves (`PeftModel.__init__` reads
`is_gradient_checkpointing`; TRL's DPO trainer toggles `gradient_checkpointing_disable`/`_enable` around its reference
forward), so each SFT or DPO run on a PEFT model printed `FutureWarning`s the user cannot act on. Only a warning whose
deprecated method was called from one of those libraries is dropped: the same warning from the user's own call still
shows. Nothing else is filtered: every other record of those loggers, and every other warning, still reaches the user.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings

# package -> (logger the notice is logged on, text it contains): bitsandbytes 0.50, DeepSpeed 0.19.
HELD_NOTICES = {
    "bitsandbytes": ("bitsandbytes.backends.cpu.ops", "kernels-community"),
    "deepspeed": ("DeepSpeed", "Setting accelerator to CPU"),
}


class _HoldNotice(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if self.text in record.getMessage():
            self.held.append(record)
            return False
        return True


_filters: dict[str, _HoldNotice] = {}


class _FirstOnly(logging.Filter):
    """Let through the first record whose message starts with `prefix`, drop the later ones."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix, self.seen = prefix, False

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith(self.prefix):
            return True
        first, self.seen = not self.seen, True
        return first


class _TiedHeadMissing(logging.Filter):
    """Drop transformers' "missing keys" warning on resume when the only key missing is the tied output head."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != TIED_HEAD_MISSING


# TRL 1.16's DPO warning says "This warning is shown once" but goes through `warning_once` with the example's text in
# the message, so it shows once per distinct example (5 times on a small set): only the first goes through.
ONCE_ONLY = {"trl.trainer.dpo_trainer": "The tokenized prompt is not a prefix of the tokenized prompt+completion"}
# A model whose output head is tied to its input embedding (SmolLM2, the tiny test models) saves one tensor for both;
# on resume transformers' Trainer loads the checkpoint with `strict=False` and warns about the head's key it did not
# find (transformers 5.23, `Trainer._issue_warnings_after_load`), although the tie gives the head its weights. Only that
# exact message is dropped: any other missing key still warns.
TIED_HEAD_MISSING = "There were missing keys in the checkpoint model loaded: ['lm_head.weight']."
_once_filters: dict[str, logging.Filter] = {}


def quiet_optional_packages() -> None:
    """Hold back the notices of `HELD_NOTICES` (call before the packages are imported; idempotent), the deprecation
    warnings the libraries raise at each other (`quiet_library_deprecations`), the repeats of TRL's DPO warning
    that says it is shown once (`ONCE_ONLY`) and the tied head's "missing keys" on resume (`TIED_HEAD_MISSING`).

    A run under `accelerate launch` with DeepSpeed keeps DeepSpeed's notices."""
    quiet_library_deprecations()
    for name, prefix in ONCE_ONLY.items():
        if name not in _once_filters:
            _once_filters[name] = _FirstOnly(prefix)
            logging.getLogger(name).addFilter(_once_filters[name])
    if "transformers.trainer" not in _once_filters:
        _once_filters["transformers.trainer"] = _TiedHeadMissing()
        logging.getLogger("transformers.trainer").addFilter(_once_filters["transformers.trainer"])
    for package, (name, text) in HELD_NOTICES.items():
        if package == "deepspeed" and os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
            continue
        if package not in _filters:
            _filters[package] = _HoldNotice(text)
            logging.getLogger(name).addFilter(_filters[package])


def release(package: str) -> None:
    """The run uses `package`: show what was held back and let its later notices through."""
    hold = _filters.pop(package, None)
    if hold is None:
        return
    logger = logging.getLogger(HELD_NOTICES[package][0])
    logger.removeFilter(hold)
    for record in hold.held:
        logger.handle(record)


def release_for(model_args, training_args) -> None:
    """Release the notices of the optional packages this run uses: bitsandbytes for a k-bit model on the CPU,
    DeepSpeed when it is configured."""
    import torch

    if (getattr(model_args, "load_in_4bit", False) or getattr(model_args, "load_in_8bit", False)) and not torch.cuda.is_available():
        release("bitsandbytes")
    if getattr(training_args, "deepspeed", None):
        release("deepspeed")


# The deprecated aliases of transformers 5.23 (`modeling_utils.PreTrainedModel`), each warning with this text from its
# own body (no `stacklevel`, so the warning's module is transformers' whatever the caller).
DEPRECATED_ALIASES = {
    "gradient_checkpointing_enable": "`gradient_checkpointing_enable` is deprecated and will be removed in v6.",
    "gradient_checkpointing_disable": "`gradient_checkpointing_disable` is deprecated and will be removed in v6.",
    "is_gradient_checkpointing": "`is_gradient_checkpointing` is deprecated and will be removed in v6.",
}
# Packages whose own calls of those aliases the user cannot act on.
LIBRARIES = ("transformers", "peft", "trl", "accelerate")
_WARNING_MODULE = "transformers.modeling_utils"


class _CalledByALibrary:
    """The message "regex" of a warnings filter: matches one alias's warning only when the alias was called by a
    library's code.

    A filter's module and message decide from the warning alone; who called the deprecated method is only on the call
    stack, which `match` reads (`warnings.warn` runs its filters on the caller's stack). An ignored warning leaves no
    mark in the module's warning registry, so the user's own call, later, still warns once as usual.
    """

    def __init__(self, alias: str, text: str):
        self.alias, self.text = alias, text

    def match(self, message: str) -> bool:
        if not message.startswith(self.text):
            return False
        frame = sys._getframe(1)
        while frame is not None and not (frame.f_code.co_name == self.alias and _module_of(frame) == _WARNING_MODULE):
            frame = frame.f_back
        if frame is None:
            return False
        caller = frame.f_back
        # Wrappers of the alias under the same name (a model's override calling `super()`, TRL's selective
        # checkpointing wrapper) pass a call through: whoever called them decides.
        while caller is not None and caller.f_code.co_name == self.alias:
            caller = caller.f_back
        return caller is not None and _module_of(caller).split(".")[0] in LIBRARIES

    def __repr__(self) -> str:
        return f"<{self.alias} called by {'/'.join(LIBRARIES)}>"


def _module_of(frame) -> str:
    return frame.f_globals.get("__name__") or ""


def quiet_library_deprecations() -> None:
    """Drop the `DEPRECATED_ALIASES` warnings raised by the libraries' own calls (idempotent; imports nothing).

    Checked against `warnings.filters` itself, which `warnings.catch_warnings` puts back as it was on exit."""
    installed = {entry[1].alias for entry in warnings.filters if isinstance(entry[1], _CalledByALibrary)}
    module = re.compile(re.escape(_WARNING_MODULE) + r"\Z")
    for alias, text in DEPRECATED_ALIASES.items():
        if alias not in installed:
            # `warnings.filterwarnings` takes a message pattern as text only; the list takes any object with `match`.
            warnings.filters.insert(0, ("ignore", _CalledByALibrary(alias, text), FutureWarning, module, 0))
            # What `filterwarnings` does after changing the list: the modules' registries of seen warnings restart.
            getattr(warnings, "_filters_mutated", lambda: None)()
