"""The `trl-emo` console script (`trl-emo {sft,dpo,grpo,eval,demo,losses,recipes} [options]`). The dispatcher lives in
`trl_emo.commands.main`."""

from .commands import main as _module
from .commands.main import main  # noqa: F401


def __getattr__(attribute):  # the rest of the dispatcher under this name too
    return getattr(_module, attribute)


if __name__ == "__main__":
    raise SystemExit(main())
