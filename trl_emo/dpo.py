"""`python -m trl_emo.dpo --recipe dpo_ultrafeedback --model_name_or_path <SFT output>` (also `trl-emo dpo`): DPO on
top of an SFT model or adapter. The command lives in `trl_emo.commands.dpo`."""

from .commands import dpo as _command
from .commands.dpo import main, make_parser, run  # noqa: F401


def __getattr__(attribute):  # the rest of the command under this name too
    return getattr(_command, attribute)


if __name__ == "__main__":
    raise SystemExit(run())
