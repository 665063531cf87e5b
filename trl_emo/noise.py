"""Keep the commands' output free of notices from optional packages they do not use.

Installed optional packages get imported by the libraries we build on whether a run uses them or not, and two
of them print a line at import on a machine without a GPU:

- bitsandbytes (PEFT imports it whenever it is installed, and transformers imports PEFT as soon as a training
  config is built) logs, on CPUs with AVX-512 bf16, that its optional CPU 4-bit kernel from the `kernels` package
  is missing. That only matters to a k-bit model on the CPU.
- DeepSpeed (imported by transformers' and accelerate's integrations when installed) logs that it falls back to
  the CPU accelerator. That only matters to a DeepSpeed run.

The commands hold those notices back (`quiet_optional_packages`, before the imports) and let them through
(`release`) when the run uses the package. Nothing else is filtered: every other record of those loggers, and
every warning, still reaches the user.
"""

from __future__ import annotations

import logging
import os

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


def quiet_optional_packages() -> None:
    """Hold back the notices of `HELD_NOTICES` (call before the packages are imported; idempotent).

    A run under `accelerate launch` with DeepSpeed keeps DeepSpeed's notices."""
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
