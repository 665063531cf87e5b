"""The losses the kernel tests run: every registered loss at its `SFTConfig` defaults, plus variants.

Looping over the registry means a new loss is tested by `test_fused.py` and
`test_triton_kernels.py` as soon as it is registered with its config fields.
"""

from __future__ import annotations

from trl_emo.training.config import loss_defaults
from trl_emo.losses import get_loss, list_losses

# Settings other than the defaults that exercise other branches of a kernel.
VARIANTS = {
    "gem": [{"beta": 0.5, "h": "logsigmoid"}, {"beta": 1.0}],
    "emo": [
        {"weighting": "emo", "demd": "paper", "ratio_cap": 3.0},
        {"weighting": "none"},
        {"weighting": "mle", "ratio_cap": 0.5},
    ],
    "tailr": [{"gamma": 0.7, "min_weight": 0.2}, {"gamma": 0.9, "formula": "authors"}],
    "mixce": [{"gamma": 0.5}],
    "ce_entropy": [{"coef": 0.3}],
    "eaft": [{"entropy": "full"}, {"alpha": 0.5, "topk": 5}, {"alpha": 0.0}],
    "asft": [{"alpha": 1.0}, {"alpha": 0.0}],
    # SEDLoss's own defaults (lambda 0.2, top-10 mass against 0.95), and a top-1 mask.
    "sed": [{"lam": 0.2, "top_k": 10, "threshold": 0.95}, {"top_k": 1, "threshold": 0.5}],
    "eksft": [
        {"formula": "authors"},
        {"mode": "intersection", "ratio": 0.5, "lambda_entropy": 1.0, "lambda_kl": 0.5},
        {"ratio": 0.0},
    ],
    # The paper's symmetric clip; the clip edge at r = 1 (every token at or past it).
    "psft": [{"clip_high": 0.2}, {"clip_low": 0.0, "clip_high": 0.0}],
    # A top-k smaller than the test vocabularies (the default 512 is all of them); the paper's alpha at a fixed τ.
    "curio_sft": [{"topk": 8}, {"alpha": 0.5, "tau_min": 1.3, "tau_max": 1.3}],
    # "p" (q = 1), "OnlyTopP-0.02" and "OnlyBottomLogP-0.02" (the first pass and a weighted loss pass).
    "prob": [{"q": 1.0}, {"q": 1.0, "only": "top", "threshold": 0.02}, {"q": 0.0, "only": "bottom", "threshold": 0.02}],
    # The loss class's default temperature, and the per-token branch.
    "iw_sft": [{"temperature": 2.0}, {"sum_over_time": False}],
    "gift": [{"beta": 2.0, "smooth_lambda": 0.1}, {"beta": 3.0, "formula": "paper"}],
    "slm": [{"keep_ratio": 0.3, "scope": "sequence"}],
}

# SED's threshold defaults to "calibrate on the starting model" (the trainer does it); the kernels get a number.
_CALIBRATED = {"sed": {"threshold": 0.9}}


def default_hparams(name: str) -> dict:
    """The loss's `SFTConfig` defaults, with a value where the trainer computes the default before the first step."""
    hp = loss_defaults(name)
    return {**hp, **{k: v for k, v in _CALIBRATED.get(name, {}).items() if hp.get(k) is None}}


def cases(require_row_kernel: bool = False) -> list[tuple[str, dict]]:
    out = []
    for name in list_losses(include_trl=False):
        spec = get_loss(name)
        if require_row_kernel and spec.row_kernel is None:
            continue
        base = default_hparams(name)
        out.append((name, base))
        out.extend((name, {**base, **variant}) for variant in VARIANTS.get(name, []))
    return out


def case_id(name: str, hp: dict) -> str:
    return "-".join([name, *(str(v) for v in hp.values())])
