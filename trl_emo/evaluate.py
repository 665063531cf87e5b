"""`python -m trl_emo.evaluate --recipe eval.yaml`: see docs/evaluation.md."""

from trl_emo.evaluation.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
