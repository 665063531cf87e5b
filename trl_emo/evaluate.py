"""`python -m trl_emo.evaluate --recipe eval.yaml`: see docs/evaluation.md."""

from trl_emo.evaluation.cli import run

if __name__ == "__main__":
    raise SystemExit(run())
