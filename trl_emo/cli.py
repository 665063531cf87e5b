"""The `trl-emo` console script: `trl-emo {sft,dpo,eval,demo,losses} [options]`."""

from __future__ import annotations

import sys

USAGE = """usage: trl-emo <command> [options]

commands:
  sft      supervised fine-tuning with any loss   (same as: python -m trl_emo.sft)
  dpo      DPO on top of an SFT model or adapter  (same as: python -m trl_emo.dpo)
  eval     best-of-n evaluation with a reward model (same as: python -m trl_emo.evaluate)
  demo     GEM vs cross-entropy on a tiny model, offline, a few minutes on CPU
  losses   list the registered loss types

Every command takes --recipe FILE.yaml (or --config) and --help."""


def _losses(argv) -> int:
    from .losses import get_loss, list_losses
    from .losses.registry import TRL_LOSS_TYPES

    for name in list_losses():
        if name in TRL_LOSS_TYPES and name != "nll":
            print(f"{name:<12} (TRL's own)")
            continue
        spec = get_loss(name)
        fields = ", ".join(spec.config_fields.values())
        note = "(computed by TRL in training) " if name in TRL_LOSS_TYPES else ""
        print(f"{name:<12} {note}{spec.description}" + (f"  [{fields}]" if fields else ""))
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "sft":
        from .sft import main as run
    elif command == "dpo":
        from .dpo import main as run
    elif command in ("eval", "evaluate"):
        from .evaluation.cli import main as run
    elif command == "demo":
        from .demo import main as run
    elif command == "losses":
        run = _losses
    else:
        print(f"trl-emo: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    raise SystemExit(main())
