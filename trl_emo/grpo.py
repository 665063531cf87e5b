"""`python -m trl_emo.grpo --recipe grpo_gsm8k --model_name_or_path <SFT output>` (also `accelerate launch -m
trl_emo.grpo`, `trl-emo grpo`): GRPO with verifiable rewards on top of an SFT model or adapter. The command lives in
`trl_emo.commands.grpo`."""

from .commands import grpo as _command
from .commands.grpo import main, make_parser, run  # noqa: F401


def __getattr__(attribute):  # the rest of the command under this name too
    return getattr(_command, attribute)


if __name__ == "__main__":
    raise SystemExit(run())
