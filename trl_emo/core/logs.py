"""The package's own log lines, shown by the commands as transformers' example scripts show theirs.

`trl_emo` logs through `logging.getLogger("trl_emo.<module>")` and, as a library, installs no handler: a program of
yours decides what it sees (`logging.basicConfig(level=logging.INFO)` shows everything). A command is a program, so it
sets the package's logger up the way transformers' examples (`run_clm.py`) set up theirs: the process's log level from
the training arguments (`TrainingArguments.get_process_log_level`: `log_level` on the main process, `log_level_replica`
on the others), INFO on the main process when `log_level` is left `passive`, so each process of a multi-GPU launch
does not repeat the same lines. INFO lines go to stdout (as the examples' handler sends them), warnings and errors to
stderr (where Python's last-resort handler sent them before); the handler looks the stream up at each record (a
test's captured stream, a redirected one).
"""

from __future__ import annotations

import logging
import sys

PACKAGE_LOGGER = "trl_emo"


class _StderrHandler(logging.StreamHandler):
    """A stream handler on whatever `sys.stdout` (INFO and below) or `sys.stderr` (warnings and errors, where Python's
    last-resort handler printed them before) is when a record comes."""

    def __init__(self):
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self._level = record.levelno
        super().emit(record)

    @property
    def stream(self):
        return sys.stdout if getattr(self, "_level", logging.WARNING) < logging.WARNING else sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ sets it; the property answers instead
        pass


def setup_command_logging(level: int) -> None:
    """Show the package's records of `level` and above on stderr (idempotent: one handler, its level updated)."""
    logger = logging.getLogger(PACKAGE_LOGGER)
    handler = next((h for h in logger.handlers if isinstance(h, _StderrHandler)), None)
    if handler is None:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)


def process_log_level(training_args) -> int:
    """The log level of this process, as transformers' examples choose it: INFO on the main process unless
    `log_level` says otherwise, `get_process_log_level()` elsewhere."""
    if getattr(training_args, "log_level", "passive") == "passive" and training_args.should_log:
        return logging.INFO
    return training_args.get_process_log_level()
