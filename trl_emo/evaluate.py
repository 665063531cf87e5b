"""`python -m trl_emo.evaluate --recipe eval.yaml` (also `trl-emo eval`): evaluate models side by side; see
docs/evaluation.md. The command lives in `trl_emo.commands.evaluate`."""

from .commands import evaluate as _command
from .commands.evaluate import main, make_parser, run  # noqa: F401


def __getattr__(attribute):  # the rest of the command under this name too
    return getattr(_command, attribute)


if __name__ == "__main__":
    raise SystemExit(run())
