"""`python -m trl_emo.sft --recipe FILE.yaml [--field value ...]` (also `accelerate launch -m trl_emo.sft`,
`trl-emo sft`): supervised fine-tuning with any loss. The command lives in `trl_emo.commands.sft`."""

from .commands import sft as _command
from .commands.sft import main, make_parser, run  # noqa: F401


def __getattr__(attribute):  # the rest of the command under this name too
    return getattr(_command, attribute)


if __name__ == "__main__":
    raise SystemExit(run())
