"""The objectives: one module per loss, the fused path, the registry, EMO's cost embedding.

Each built-in loss is one module holding its reference function (`per_token`), its PyTorch chunk
kernel (`chunk`, the CPU path), its Triton row kernel (the GPU path) and its hyper-parameter
check, and exporting them as `LOSS`; it is registered by one line below. Its hyper-parameters'
defaults are written once, in its `LOSS.defaults`; `trl_emo.SFTConfig`'s fields take them. `nll` and
`dft` are registered too: the trainer leaves them to TRL, but outside TRL (`FusedLinearLoss`,
`fused_lm_loss`, see `standalone.py`) nobody else computes them, and `nll` is the reference.

This package is the bottom of the layers above `trl_emo.core` (docs/architecture.md): pure tensor
functions and kernels, which import nothing of the trainer, the data, the models or the commands.

Adding a loss: a module like `mixce.py`, one `add_loss(...)` line here, and its `SFTConfig`
fields (`tests/test_fused.py` and `tests/test_triton_kernels.py` loop over the registry).
"""

from __future__ import annotations

from . import asft, ce_entropy, dft, eaft, eksft, emo, gem, mixce, nll, sed, tailr
from . import curio_sft, psft
from . import gift, iw_sft, prob, slm
from ._common import causal_lm_loss, select_targets, token_statistics
from .cost import CostEmbedding, load_cost_embedding
from .fused import BACKENDS, FusedLossOutput, HeadTransform, fused_linear_loss
from .asft import ReferenceHead
from .registry import (
    TRL_LOSS_TYPES,
    LossSpec,
    UnknownLossError,
    add_loss,
    get_loss,
    list_losses,
    register_loss,
    unregister_loss,
)
from .standalone import FusedLinearLoss, FusedLinearLossOutput, fused_lm_loss, logit_transform_of

add_loss(nll.LOSS)
add_loss(dft.LOSS)
add_loss(gem.LOSS)
add_loss(emo.LOSS)
add_loss(tailr.LOSS)
add_loss(mixce.LOSS)
add_loss(ce_entropy.LOSS)
add_loss(eaft.LOSS)
add_loss(asft.LOSS)
add_loss(sed.LOSS)
add_loss(eksft.LOSS)
add_loss(psft.LOSS)
add_loss(curio_sft.LOSS)
add_loss(prob.LOSS)
add_loss(iw_sft.LOSS)
add_loss(gift.LOSS)
add_loss(slm.LOSS)

# The reference per-token functions under descriptive names.
nll_per_token = nll.per_token
gem_per_token = gem.per_token
emo_per_token = emo.per_token
tailr_per_token = tailr.per_token
mixce_per_token = mixce.per_token
ce_entropy_per_token = ce_entropy.per_token
eaft_per_token = eaft.per_token
asft_per_token = asft.per_token
sed_per_token = sed.per_token
eksft_per_token = eksft.per_token
psft_per_token = psft.per_token
curio_sft_per_token = curio_sft.per_token
prob_per_token = prob.per_token
iw_sft_per_token = iw_sft.per_token
gift_per_token = gift.per_token
slm_per_token = slm.per_token

__all__ = [
    "BACKENDS",
    "TRL_LOSS_TYPES",
    "CostEmbedding",
    "FusedLinearLoss",
    "FusedLinearLossOutput",
    "FusedLossOutput",
    "HeadTransform",
    "LossSpec",
    "UnknownLossError",
    "add_loss",
    "causal_lm_loss",
    "asft_per_token",
    "ce_entropy_per_token",
    "curio_sft_per_token",
    "eaft_per_token",
    "eksft_per_token",
    "emo_per_token",
    "fused_linear_loss",
    "fused_lm_loss",
    "gem_per_token",
    "gift_per_token",
    "iw_sft_per_token",
    "get_loss",
    "list_losses",
    "load_cost_embedding",
    "logit_transform_of",
    "mixce_per_token",
    "nll_per_token",
    "psft_per_token",
    "prob_per_token",
    "ReferenceHead",
    "register_loss",
    "select_targets",
    "sed_per_token",
    "slm_per_token",
    "tailr_per_token",
    "token_statistics",
    "unregister_loss",
]
