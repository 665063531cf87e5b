"""`trl_emo.SFTConfig`: TRL's `SFTConfig` whose `loss_type` also accepts EMO, GEM and the baselines."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from trl import SFTConfig as _TRLSFTConfig

from ..losses import get_loss, list_losses
from ..losses._common import check_cost_source, check_positive_int
from ..losses.standalone import check_fused_options
from ..losses.registry import TRL_LOSS_TYPES

LOSS_IMPLEMENTATIONS = ("fused", "logits")


def _has_bf16_accelerator() -> bool:
    import torch

    if torch.cuda.is_available():
        return True
    return hasattr(torch, "xpu") and torch.xpu.is_available()


COST_EMBEDDING_SOURCES = ("frozen", "lm_head")


def _default(loss_type: str, keyword: str):
    """The default of a built-in loss's hyper-parameter, written once in its module (`LossSpec.defaults`)."""
    return get_loss(loss_type).defaults[keyword]


@dataclass
class SFTConfig(_TRLSFTConfig):
    r"""
    Configuration class for [`trl_emo.SFTTrainer`]: every field of [`trl.SFTConfig`], plus the
    objective's hyper-parameters. Switching from cross-entropy is one field: `loss_type="gem"`.

    Parameters:
        loss_type (`str`, *optional*, defaults to `"nll"`):
            Training objective. TRL's own: `"nll"` (cross-entropy) and `"dft"`, computed by TRL. Added by
            trl_emo: `"gem"`, `"emo"`, `"tailr"`, `"mixce"`, `"ce_entropy"`, `"eaft"`, `"asft"`, `"sed"`, `"eksft"`,
            `"psft"`, `"curio_sft"`, `"prob"`, `"iw_sft"`, `"gift"`, `"slm"`, and any loss registered with [`trl_emo.register_loss`].
        loss_implementation (`str`, *optional*, defaults to `"fused"`):
            How a trl_emo loss is computed. `"fused"`: from the final hidden states and the output embedding in
            chunks of positions, never building the whole batch's logits (the memory of TRL's own loss).
            `"logits"`: from the model's full logits, the reference implementation (more memory).
        fused_backend (`str`, *optional*, defaults to `"auto"`):
            Kernels of the fused implementation. `"auto"`: Triton kernels on a CUDA GPU when Triton is installed
            (logits in the compute dtype, one kernel per chunk writing the loss, the logged statistics and the
            gradient in place), the PyTorch chunk kernels otherwise (the CPU path). `"triton"` or `"torch"` force one.
            A loss registered without a Triton kernel always runs the PyTorch path.
        fused_chunk_size (`int`, *optional*):
            Target positions per chunk in the fused implementation. Overrides `fused_chunk_memory_mb`.
        fused_chunk_memory_mb (`float`, *optional*):
            Memory budget in MiB for one chunk's `[positions, vocabulary]` buffers; the chunk size follows from it.
            Defaults to 256 on the Triton path (1,024 positions of a bf16 128,256-token vocabulary; EMO, which needs a
            second buffer, 512) and 512 on the PyTorch path (four float32 buffers: 1,048 positions at 32,000 tokens).
            Larger chunks keep the products efficient and round a bf16 head's gradient fewer times; smaller ones
            save memory.
        fused_fp32_head_grad (`bool`, *optional*, defaults to `False`):
            On the Triton path with a half-precision head, accumulate the head's gradient over the chunks in float32
            and round it once at the end, instead of in the head's dtype once per chunk (what Liger's kernel does).
            More accurate (measured at 16,384 tokens x 128,256 vocabulary: 1.7e-3 relative error instead of 6e-3,
            see `docs/benchmarks.md`) for twice the head's size in memory (2 GiB at Llama-3's head). A float32 head
            (autocast training) is always accumulated in float32; a frozen head (LoRA) has no gradient.
        gem_beta (`float`, *optional*, defaults to `0.7`):
            GEM's `beta` in (0, 1]: the temperature of the stop-gradient copy of the model. `1.0` with
            `gem_h="linear"` gives exactly the cross-entropy gradient.
        gem_h (`str`, *optional*, defaults to `"linear"`):
            GEM's `h`: `"linear"` or `"logsigmoid"` (the GEM paper's UltraFeedback setting).
        gem_target_entropy (`float`, *optional*):
            Mean token entropy (nats per target token) GEM should keep. When set, `gem_beta` is only the starting value:
            after every optimizer step `log(gem_beta)` moves by `gem_beta_step` times the gap between the target and the
            step's mean entropy (over all processes), within `[gem_beta_min, 1]`; the current value is logged as
            `gem_beta` and restored on resume. Must be in `(0, ln V)`. Default: a fixed `gem_beta`. GEM can only keep at
            least cross-entropy's entropy (at `beta = 1` it is cross-entropy): a lower target pins `beta` at 1, which is
            reported once in the log.
        gem_beta_min (`float`, *optional*, defaults to `0.3`):
            Lower bound of the adaptive `gem_beta` (with `gem_target_entropy`).
        gem_beta_step (`float`, *optional*, defaults to `0.05`):
            Step of the adaptive `gem_beta`, in `log(beta)` per nat of entropy gap per optimizer step. 0.05 settles within a
            few dozen steps of ~1k tokens in the oracle study; 0.2 oscillates there.
        emo_cost_embedding (`str`, *optional*, defaults to `"frozen"`):
            Source of EMO's transport cost `1 - cos(e_i, e_j)`. `"frozen"`: a snapshot of the model's output
            embedding taken when training starts (after any token resizing), never updated (the paper's setting).
            `"lm_head"`: the current output embedding at every step (detached). Otherwise a path to a `[V, d']`
            tensor file (`.safetensors`, `.pt`, `.npy`) or to a model whose output embedding is used; `V` must
            equal the model's vocabulary size.
        emo_weighting (`str`, *optional*, defaults to `"mle"`):
            EMO's dynamic weighting with cross-entropy: `"mle"` (`0.5 (nll + sg(nll / emo) emo)`, the paper's
            default), `"emo"` (`emo + sg(emo / nll) nll`) or `"none"` (the EMO term alone).
        emo_demd (`str`, *optional*, defaults to `"reference"`):
            Value of the EMO term: `"paper"` is the DEMD of the paper (eq. 14); `"reference"` adds `sg(p_y)`, as the
            authors' code does. The EMO *term* has the same gradient either way, but the dynamic weights of `"mle"` and
            `"emo"` weighting read the term's value, so the total gradient differs (by 1% (`mle`) to 21% (`emo`) relative
            on random float64 logits); with `emo_weighting="none"` the two are identical.
        emo_ratio_cap (`float`, *optional*):
            Upper bound on EMO's dynamic weight (the authors' continual fine-tuning code uses `3.0`). No cap by
            default.
        tailr_gamma (`float`, *optional*, defaults to `0.8`):
            TaiLr's `gamma` in [0, 1] (the EMO paper sweeps 0.7-0.9).
        tailr_min_weight (`float`, *optional*):
            Floor on TaiLr's weight `p_y / (gamma + (1 - gamma) p_y)`. None (default) is the EMO paper's eq. 16. Without
            a floor, tokens the model finds unlikely get almost no gradient and TaiLr can collapse to a low-entropy
            model (seen in `docs/oracle_study.md`).
        tailr_formula (`str`, *optional*, defaults to `"paper"`):
            `"paper"`: the EMO paper's eq. 16 (with `tailr_min_weight` if set). `"authors"`: the TaiLr baseline of the
            EMO repository (the "tvd" mode of its GPT-2 script) at mixing ratio `g = 1 - tailr_gamma`:
            `g * nll + (1 - g) * TaiLr(tailr_gamma)` with the weight floored at 0.2 (or `tailr_min_weight`). The
            recipes that reproduce the EMO paper's baselines use it; `docs/losses.md` maps both to the authors' code.
        mixce_gamma (`float`, *optional*, defaults to `0.8`):
            MixCE's `gamma` in [0, 1] (the EMO paper sweeps 0.7-0.9).
        entropy_coef (`float`, *optional*, defaults to `0.1`):
            `lambda` of `ce_entropy`: `nll - lambda * entropy` (the GEM paper's baseline uses 0.1).
        eaft_alpha (`float`, *optional*, defaults to `1.0`):
            EAFT's exponent: each token's cross-entropy is weighted by `(H / H_max) ** eaft_alpha` (no gradient through
            the weight). `0` is plain cross-entropy.
        eaft_entropy (`str`, *optional*, defaults to `"topk"`):
            EAFT's entropy `H`: `"topk"`, the entropy of the softmax renormalised over the `eaft_topk` largest logits
            (`H_max = ln(eaft_topk)`; LLaMA-Factory divides by the constant 3.0 ≈ ln 20 instead), or `"full"`, the
            full-vocabulary entropy (`H_max = ln(V)`).
        eaft_topk (`int`, *optional*, defaults to `20`):
            `k` of `eaft_entropy="topk"` (axolotl's `eaft_k`); at least 2 and at most the vocabulary size.
        asft_alpha (`float`, *optional*, defaults to `0.1`):
            ASFT's anchor: `-sg(p_y) log p_y + asft_alpha * KL(pi_ref || pi_theta)` per token. `0` is DFT, and then no
            reference model is run at all.
        asft_ref_model (`str`, *optional*):
            ASFT's reference model, a local folder or a Hub id with the same vocabulary. Default: the model's own
            starting weights (under PEFT, the base model with the adapters disabled, no second copy in memory; in full
            fine-tuning, a frozen copy loaded once). Only valid with `loss_type="asft"`.
        sed_lambda (`float`, *optional*, defaults to `1.0`):
            SED-SFT's `lambda`: `-log p_y + sed_lambda * M * (p_y - 1/2)^2` per token, `M = 1` where the `sed_top_k`
            largest probabilities sum to less than `sed_threshold`. `1.0` is what the authors' released run used (their
            `TrainingArguments` default; the `0.2` default of their loss class is never reached). `0` is cross-entropy.
        sed_top_k (`int`, *optional*, defaults to `2`):
            `k` of SED's mask: the mass of the `k` most probable tokens is compared with `sed_threshold`.
        sed_threshold (`float`, *optional*):
            SED's `tau` in (0, 1]. Default: calibrated on the starting model before the first step, as the authors'
            `train.py` does (`sed_threshold_ratio`, `sed_threshold_top_k`, `sed_threshold_samples`); the value is
            logged as `sed_threshold` and kept in checkpoints, so a resumed run uses the same one.
        sed_threshold_ratio (`float`, *optional*, defaults to `0.7`):
            The calibration: `tau` is the value that this share of the positions' top-`sed_threshold_top_k` mass
            reaches or exceeds (the authors' `cumsum_ratio`, 0.7 in their script).
        sed_threshold_top_k (`int`, *optional*, defaults to `10`):
            `k` of the calibration's top-k mass. The authors calibrate on the top-10 mass and mask on the top-2 mass
            (`sed_top_k`); both are kept as they run them.
        sed_threshold_samples (`int`, *optional*, defaults to `100`):
            Examples the calibration reads: the first ones of the evaluation dataset, or of the training dataset when
            there is none (every position of each, prompt included, as the authors' calibration reads them); with
            `packing`, each example of a packed row counts and runs as its own sequence, as the loss sees it.
        eksft_ratio (`float`, *optional*, defaults to `0.2`):
            EKSFT's share of the micro-batch's tokens selected by entropy and, separately, by KL to the reference
            (`int(N * ratio)` tokens each, the authors' arithmetic: 62 of 90 at 0.7). `0` is cross-entropy, and then no
            reference model runs.
        eksft_lambda_entropy (`float`, *optional*, defaults to `0.05`):
            EKSFT's entropy bonus on the entropy-selected tokens (entropy divided by `ln V`).
        eksft_lambda_kl (`float`, *optional*, defaults to `0.05`):
            EKSFT's penalty `KL(pi_theta || pi_ref)` on the KL-selected tokens.
        eksft_mode (`str`, *optional*, defaults to `"union"`):
            Tokens left out of the cross-entropy: `"union"` of the two selections (the authors' script) or their
            `"intersection"` (their code's default).
        eksft_formula (`str`, *optional*, defaults to `"paper"`):
            `"paper"`: the objective as the paper and the authors' code comments state it. `"authors"`: what their code
            computes (`Σ p (p - log q)` for the KL term, `log(p + 1e-12)` in the entropy, λ times 1.05 or 0.95 at every
            micro-batch, the selection one position after each target); `docs/losses.md` measures each difference.
        eksft_target_entropy (`float`, *optional*, defaults to `0.5`):
            The authors' formula only: `eksft_lambda_entropy` is multiplied by 1.05 for a micro-batch whose entropy term
            is below this, by 0.95 otherwise.
        eksft_target_kl (`float`, *optional*, defaults to `2.0`):
            The authors' formula only: `eksft_lambda_kl` is multiplied by 1.05 for a micro-batch whose KL term is above
            this, by 0.95 otherwise.
        eksft_ref_model (`str`, *optional*):
            EKSFT's reference model, a local folder or a Hub id with the same vocabulary. Default: the model's own
            starting weights (under PEFT the base model with the adapters disabled; in full fine-tuning a frozen copy).
            Only valid with `loss_type="eksft"`.
        psft_clip_high (`float`, *optional*, defaults to `0.28`):
            PSFT's `epsilon_high`: a token whose probability ratio to the old policy `r = p_y / p_old(y)` is above
            `1 + psft_clip_high` gives no gradient; below, its gradient is cross-entropy's times `r`. 0.28 is the
            authors' script; the paper's symmetric `epsilon` is `psft_clip_high = psft_clip_low`.
        psft_clip_low (`float`, *optional*, defaults to `0.2`):
            PSFT's `epsilon_low` in [0, 1] (their script: 0.2). With PSFT's advantage of 1 the lower clip never binds
            (`min(r, clip(r, 1 - eps, ...)) = r` below it): kept so that a recipe states the authors' settings.
        psft_old_policy_steps (`int`, *optional*, defaults to `8`):
            PSFT's `K`: the old policy is the model as it was at the start of each window of this many optimizer steps
            (their script: 64 prompts per batch in mini-batches of 8). `1` makes every step's old policy the current
            model: `r = 1`, cross-entropy's gradient. Kept in checkpoints; under PEFT only the adapters are copied.
        curio_alpha (`float`, *optional*, defaults to `1.0`):
            CurioSFT's `alpha`: `-log p_y + alpha / 2 * (log p_y - log q_y)^2`, `q` the teacher at its per-token
            temperature. Their code fixes it at 1; `0` is cross-entropy.
        curio_tau_min (`float`, *optional*, defaults to `1.1`):
            Lower bound of the teacher's temperature (also the temperature of tokens the teacher is sure of: full
            entropy at most 0.03).
        curio_tau_max (`float`, *optional*, defaults to `1.5`):
            Upper bound of the teacher's temperature (at least `curio_tau_min`; equal bounds: a fixed temperature).
        curio_topk (`int`, *optional*, defaults to `512`):
            The teacher's largest logits whose entropy chooses its temperature (all of them on a smaller vocabulary).
        curio_teacher_sync_steps (`int`, *optional*, defaults to `5`):
            Every this many optimizer steps the teacher (the starting model at first) is mixed with the policy (their
            `ref_model_sync_steps`). Kept in checkpoints; under PEFT only the adapters are kept.
        curio_teacher_mixup_alpha (`float`, *optional*, defaults to `0.99`):
            The policy's share in each mix, `teacher <- (1 - a) * teacher + a * policy` (their `ref_model_mixup_alpha`),
            in [0, 1]: `0` keeps the starting model as the teacher.
        prob_q (`float`, *optional*, defaults to `10.0`):
            Beyond Log Likelihood's exponent `q >= 0`: `(1 - p_y^q) / q` per token ("GeneralFamily-q"; 10 in the
            authors' math script). `1` is `1 - p_y` (their "p"), `0` cross-entropy (the limit).
        prob_only (`str`, *optional*):
            Beyond Log Likelihood's thresholded variants: `"top"` keeps only the tokens with `p_y >= prob_threshold`,
            `"bottom"` those with `p_y <= prob_threshold`, averaged over the kept tokens of the micro-batch ("OnlyTopP-t"
            is `prob_q: 1, prob_only: top`; "OnlyTopLogP-t" `prob_q: 0`). Default: every token.
        prob_threshold (`float`, *optional*):
            The probability threshold of `prob_only`: in `[0, 1)` for `top`, `(0, 1]` for `bottom`.
        iw_sft_temperature (`float`, *optional*, defaults to `1.0`):
            iw-SFT's `temp`: each sequence's cross-entropy is weighted by `clamp(exp(temp * mean(log p - log p_ref)), 0,
            iw_sft_clip)` (no gradient through the weight). `1.0` is what the authors' trainer passes (their loss
            class's default, 2.0, is never reached); `0` is cross-entropy.
        iw_sft_clip (`float`, *optional*, defaults to `16.0`):
            iw-SFT's upper clamp of the sequence weight.
        iw_sft_sum_over_time (`bool`, *optional*, defaults to `True`):
            iw-SFT's `sum_over_time`: one weight per sequence from its mean log-ratio (the authors' run). `False`: their
            other branch, a weight per token, `clamp(exp(log p - log p_ref), 0.2, 1.8)`.
        iw_sft_ref_model (`str`, *optional*):
            iw-SFT's reference model, a local folder or a Hub id with the same vocabulary. Default: the model's own
            starting weights (under PEFT the base model with the adapters disabled; in full fine-tuning a frozen copy),
            as in the authors' run. Only valid with `loss_type="iw_sft"`.
        gift_beta (`float`, *optional*, defaults to `20.0`):
            GIFT's inverse-temperature gain: each token's target is `softmax(log p_ref + gift_beta * onehot(y))`
            (the authors' script). Larger is closer to cross-entropy.
        gift_smooth_lambda (`float`, *optional*, defaults to `0.0`):
            GIFT's smoothing of the reference's distribution toward uniform, `(1 - lambda) p_ref + lambda / V`, in
            `[0, 1]`.
        gift_formula (`str`, *optional*, defaults to `"authors"`):
            `"authors"`: their code's `log(p_ref + 1e-10)`. `"paper"`: `log p_ref` exactly (their algorithm).
        gift_ref_model (`str`, *optional*):
            GIFT's base model, a local folder or a Hub id with the same vocabulary. Default: the model's own starting
            weights (their setting). Only valid with `loss_type="gift"`.
        slm_keep_ratio (`float`, *optional*, defaults to `0.6`):
            SLM's (Rho-1's) share of a micro-batch's target tokens trained on, those of largest excess loss
            `CE_model - CE_ref` (`ceil(ratio * N)`; 0.6 is the paper's 1B setting, 0.7 its 7B one), in `(0, 1]`.
        slm_scope (`str`, *optional*, defaults to `"batch"`):
            Where SLM ranks: over the micro-batch (`"batch"`, the paper's text) or within each sequence
            (`"sequence"`, its Eq. 4).
        slm_ref_model (`str`, *optional*):
            SLM's reference model, a local folder or a Hub id with the same vocabulary: in the paper, a model trained
            on the data you trust. Default: the model's own starting weights (then every excess loss is 0 at the first
            step, and the earliest tokens are taken). Only valid with `loss_type="slm"`.
        loss_kwargs (`dict` or `str`, *optional*):
            Keyword arguments for a loss registered by a third party (a JSON string on the command line).
            Built-in losses take their hyper-parameters from the fields above.
        stop_on_non_finite_loss (`bool`, *optional*, defaults to `True`):
            Stop training with `trl_emo.NonFiniteLossError`, before the step's update, when a trl_emo loss is NaN or
            infinite. Never applies to `"nll"` and `"dft"`, which behave exactly as in TRL (training goes on).

    > [!NOTE]
    > One default differs from [`trl.SFTConfig`]: when `bf16` is not set, it is `True` only if a CUDA/XPU device is
    > available (TRL always turns it on, which fails on a CPU-only machine unless `use_cpu=True` is given).
    """

    _VALID_DICT_FIELDS = _TRLSFTConfig._VALID_DICT_FIELDS + ["loss_kwargs"]

    loss_type: str = field(
        default="nll",
        metadata={
            "help": "Training objective: TRL's 'nll' or 'dft', or a trl_emo loss: 'gem', 'emo', 'tailr', 'mixce', "
            "'ce_entropy', 'eaft', 'asft', 'sed', 'eksft', 'psft', 'curio_sft', 'prob', 'iw_sft', 'gift', 'slm' (or any registered loss)."
        },
    )
    loss_implementation: str = field(
        default="fused",
        metadata={
            "help": "'fused' (chunked from hidden states, never the full logits) or 'logits' (reference, from the full "
            "logits).",
        },
    )
    fused_backend: str = field(
        default="auto",
        metadata={"help": "Fused-loss kernels: 'auto' (Triton on CUDA, PyTorch otherwise), 'triton' or 'torch'."},
    )
    fused_chunk_size: int | None = field(
        default=None,
        metadata={"help": "Target positions per chunk of the fused loss (overrides fused_chunk_memory_mb)."},
    )
    fused_fp32_head_grad: bool = field(
        default=False,
        metadata={"help": "Accumulate a bf16/fp16 head's gradient in float32 (more accurate, 2x the head's memory)."},
    )
    fused_chunk_memory_mb: float | None = field(
        default=None,
        metadata={"help": "MiB for one chunk's [positions, vocab] buffers (default 256 with Triton, 512 with PyTorch)."},
    )
    gem_beta: float = field(default=_default("gem", "beta"), metadata={"help": "GEM beta in (0, 1]."})
    gem_h: str = field(default=_default("gem", "h"), metadata={"help": "GEM h: 'linear' or 'logsigmoid'."})
    gem_target_entropy: float | None = field(
        default=None, metadata={"help": "Adapt gem_beta toward this mean token entropy (nats); default: fixed beta."}
    )
    gem_beta_min: float = field(default=0.3, metadata={"help": "Lower bound of the adaptive gem_beta."})
    gem_beta_step: float = field(default=0.05, metadata={"help": "Step of the adaptive gem_beta (log beta per nat)."})
    emo_cost_embedding: str = field(
        default="frozen",
        metadata={
            "help": "EMO transport-cost embedding: 'frozen' (snapshot at the start), 'lm_head' (live, detached), or a "
            "path to a [V, d'] tensor or a model."
        },
    )
    emo_weighting: str = field(
        default=_default("emo", "weighting"), metadata={"help": "EMO dynamic weighting: 'mle', 'emo' or 'none'."}
    )
    emo_demd: str = field(default=_default("emo", "demd"), metadata={"help": "EMO term value: 'reference' or 'paper'."})
    emo_ratio_cap: float | None = field(
        default=_default("emo", "ratio_cap"), metadata={"help": "Cap on EMO's dynamic weight (none by default)."}
    )
    tailr_gamma: float = field(default=_default("tailr", "gamma"), metadata={"help": "TaiLr gamma in [0, 1]."})
    tailr_min_weight: float | None = field(
        default=_default("tailr", "min_weight"), metadata={"help": "Floor on TaiLr's weight (none: the paper's eq. 16)."}
    )
    tailr_formula: str = field(
        default=_default("tailr", "formula"),
        metadata={"help": "TaiLr: 'paper' (eq. 16) or 'authors' (the EMO repository's nll-mixed baseline)."},
    )
    mixce_gamma: float = field(default=_default("mixce", "gamma"), metadata={"help": "MixCE gamma in [0, 1]."})
    entropy_coef: float = field(
        default=_default("ce_entropy", "coef"), metadata={"help": "Entropy coefficient of 'ce_entropy'."}
    )
    eaft_alpha: float = field(
        default=_default("eaft", "alpha"), metadata={"help": "EAFT exponent of the normalised entropy (>= 0)."}
    )
    eaft_entropy: str = field(default=_default("eaft", "entropy"), metadata={"help": "EAFT entropy: 'topk' or 'full'."})
    eaft_topk: int = field(default=_default("eaft", "topk"), metadata={"help": "k of EAFT's top-k entropy."})
    asft_alpha: float = field(
        default=_default("asft", "alpha"), metadata={"help": "ASFT weight of KL(reference || model) (>= 0; 0 is DFT)."}
    )
    asft_ref_model: str | None = field(
        default=None,
        metadata={"help": "ASFT reference model (folder or Hub id); default: the model's starting weights."},
    )
    sed_lambda: float = field(
        default=_default("sed", "lam"), metadata={"help": "SED-SFT's penalty weight lambda (>= 0; 0 is cross-entropy)."}
    )
    sed_top_k: int = field(default=_default("sed", "top_k"), metadata={"help": "k of SED's top-k mass mask."})
    sed_threshold: float | None = field(
        default=_default("sed", "threshold"),
        metadata={"help": "SED's tau in (0, 1]; default: calibrated on the starting model, as the authors do."},
    )
    sed_threshold_ratio: float = field(
        default=0.7, metadata={"help": "Share of positions whose top-k mass reaches the calibrated tau (0, 1]."}
    )
    sed_threshold_top_k: int = field(default=10, metadata={"help": "k of the calibration's top-k mass."})
    sed_threshold_samples: int = field(default=100, metadata={"help": "Examples the tau calibration reads."})
    eksft_ratio: float = field(
        default=_default("eksft", "ratio"), metadata={"help": "EKSFT: share of tokens selected by entropy and by KL."}
    )
    eksft_lambda_entropy: float = field(
        default=_default("eksft", "lambda_entropy"), metadata={"help": "EKSFT entropy bonus on selected tokens."}
    )
    eksft_lambda_kl: float = field(
        default=_default("eksft", "lambda_kl"), metadata={"help": "EKSFT KL penalty on selected tokens."}
    )
    eksft_mode: str = field(
        default=_default("eksft", "mode"), metadata={"help": "EKSFT tokens left out: 'union' or 'intersection'."}
    )
    eksft_formula: str = field(
        default=_default("eksft", "formula"),
        metadata={"help": "EKSFT: 'paper' or 'authors' (the authors' code, differences in docs/losses.md)."},
    )
    eksft_target_entropy: float = field(
        default=_default("eksft", "target_entropy"), metadata={"help": "EKSFT authors' formula: entropy target of λ."}
    )
    eksft_target_kl: float = field(
        default=_default("eksft", "target_kl"), metadata={"help": "EKSFT authors' formula: KL target of λ."}
    )
    eksft_ref_model: str | None = field(
        default=None,
        metadata={"help": "EKSFT reference model (folder or Hub id); default: the model's starting weights."},
    )
    psft_clip_high: float = field(
        default=_default("psft", "clip_high"), metadata={"help": "PSFT epsilon_high: no gradient where r > 1 + it."}
    )
    psft_clip_low: float = field(
        default=_default("psft", "clip_low"), metadata={"help": "PSFT epsilon_low in [0, 1] (never binds at advantage 1)."}
    )
    psft_old_policy_steps: int = field(
        default=_default("psft", "old_policy_steps"),
        metadata={"help": "PSFT K: optimizer steps per old policy (1: every step, cross-entropy's gradient)."},
    )
    curio_alpha: float = field(
        default=_default("curio_sft", "alpha"), metadata={"help": "CurioSFT weight of the pull to the teacher (>= 0)."}
    )
    curio_tau_min: float = field(
        default=_default("curio_sft", "tau_min"), metadata={"help": "CurioSFT lower bound of the teacher's temperature."}
    )
    curio_tau_max: float = field(
        default=_default("curio_sft", "tau_max"), metadata={"help": "CurioSFT upper bound of the teacher's temperature."}
    )
    curio_topk: int = field(
        default=_default("curio_sft", "topk"), metadata={"help": "CurioSFT: teacher logits whose entropy sets tau."}
    )
    curio_teacher_sync_steps: int = field(
        default=_default("curio_sft", "teacher_sync_steps"),
        metadata={"help": "CurioSFT: optimizer steps between two mixes of the teacher with the policy."},
    )
    curio_teacher_mixup_alpha: float = field(
        default=_default("curio_sft", "teacher_mixup_alpha"),
        metadata={"help": "CurioSFT: the policy's share in each mix of the teacher, in [0, 1]."},
    )
    prob_q: float = field(default=_default("prob", "q"), metadata={"help": "Beyond-LL: (1 - p^q) / q per token (q >= 0)."})
    prob_only: str | None = field(
        default=_default("prob", "only"), metadata={"help": "Beyond-LL: keep only tokens 'top' or 'bottom' of prob_threshold."}
    )
    prob_threshold: float | None = field(
        default=_default("prob", "threshold"), metadata={"help": "Beyond-LL: the probability threshold of prob_only."}
    )
    iw_sft_temperature: float = field(
        default=_default("iw_sft", "temperature"), metadata={"help": "iw-SFT: temperature of the sequence weight."}
    )
    iw_sft_clip: float = field(default=_default("iw_sft", "clip"), metadata={"help": "iw-SFT: upper clamp of the weight."})
    iw_sft_sum_over_time: bool = field(
        default=_default("iw_sft", "sum_over_time"),
        metadata={"help": "iw-SFT: one weight per sequence (true) or per token (false)."},
    )
    iw_sft_ref_model: str | None = field(
        default=None, metadata={"help": "iw-SFT reference model (folder or Hub id); default: the starting weights."}
    )
    gift_beta: float = field(default=_default("gift", "beta"), metadata={"help": "GIFT: gain of the target token."})
    gift_smooth_lambda: float = field(
        default=_default("gift", "smooth_lambda"), metadata={"help": "GIFT: smoothing of p_ref toward uniform, [0, 1]."}
    )
    gift_formula: str = field(
        default=_default("gift", "formula"), metadata={"help": "GIFT: 'authors' (log(p + 1e-10)) or 'paper'."}
    )
    gift_ref_model: str | None = field(
        default=None, metadata={"help": "GIFT base model (folder or Hub id); default: the starting weights."}
    )
    slm_keep_ratio: float = field(
        default=_default("slm", "keep_ratio"), metadata={"help": "SLM: share of tokens kept by excess loss, (0, 1]."}
    )
    slm_scope: str = field(default=_default("slm", "scope"), metadata={"help": "SLM: rank over the 'batch' or 'sequence'."})
    slm_ref_model: str | None = field(
        default=None, metadata={"help": "SLM reference model (folder or Hub id); default: the starting weights."}
    )
    loss_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments of a third-party registered loss (JSON on the command line)."},
    )
    stop_on_non_finite_loss: bool = field(
        default=True,
        metadata={"help": "Stop with NonFiniteLossError when a trl_emo loss is NaN/inf (never for 'nll'/'dft')."},
    )

    def __post_init__(self):
        if isinstance(self.loss_kwargs, str):
            try:
                self.loss_kwargs = json.loads(self.loss_kwargs)
            except json.JSONDecodeError as exc:
                raise ValueError(f"loss_kwargs must be a JSON object, got {self.loss_kwargs!r}: {exc}") from exc
        if self.bf16 is None and not self.fp16 and not self.use_cpu and not _has_bf16_accelerator():
            # TRL turns bf16 on by default, which fails on a machine without a GPU unless `use_cpu`
            # is given; without an accelerator, full precision is the default that works.
            self.bf16 = False
        super().__post_init__()
        # YAML values reach here without argparse's `choices`, so everything is checked by hand.
        if self.loss_type not in TRL_LOSS_TYPES:
            get_loss(self.loss_type)  # raises with the list of registered names
        if self.loss_implementation not in LOSS_IMPLEMENTATIONS:
            raise ValueError(
                f"loss_implementation must be one of {', '.join(LOSS_IMPLEMENTATIONS)}, got {self.loss_implementation!r}."
            )
        # The checks `trl_emo.losses.FusedLinearLoss` shares (its arguments are these fields without `fused_`).
        check_fused_options(self.fused_chunk_size, self.fused_backend, self.fused_chunk_memory_mb, prefix="fused_")
        check_cost_source("emo_cost_embedding", self.emo_cost_embedding)
        if self.gem_target_entropy is not None:
            if self.loss_type != "gem":
                raise ValueError(
                    f"gem_target_entropy is set but loss_type is {self.loss_type!r}: it adapts GEM's beta. Remove it or "
                    "set loss_type: gem."
                )
            if not isinstance(self.gem_target_entropy, (int, float)) or isinstance(self.gem_target_entropy, bool) or not (
                self.gem_target_entropy > 0 and math.isfinite(self.gem_target_entropy)
            ):
                raise ValueError(f"gem_target_entropy must be a positive number of nats, got {self.gem_target_entropy!r}.")
        if not (isinstance(self.gem_beta_min, (int, float)) and 0 < self.gem_beta_min <= 1):
            raise ValueError(f"gem_beta_min must be in (0, 1], got {self.gem_beta_min!r}.")
        if not (isinstance(self.gem_beta_step, (int, float)) and self.gem_beta_step > 0 and math.isfinite(self.gem_beta_step)):
            raise ValueError(f"gem_beta_step must be a positive number, got {self.gem_beta_step!r}.")
        for loss in list_losses(include_trl=False):
            field_name = get_loss(loss).reference_field
            if field_name and getattr(self, field_name, None) is not None and self.loss_type != loss:
                raise ValueError(
                    f"{field_name} is set but loss_type is {self.loss_type!r}: the reference model is only used by "
                    f"loss_type='{loss}'. Remove {field_name} or set loss_type: {loss}."
                )
        if not (isinstance(self.sed_threshold_ratio, (int, float)) and not isinstance(self.sed_threshold_ratio, bool)
                and 0 < self.sed_threshold_ratio <= 1):
            raise ValueError(f"sed_threshold_ratio must be in (0, 1], got {self.sed_threshold_ratio!r}.")
        for name in ("sed_threshold_top_k", "sed_threshold_samples"):
            check_positive_int(name, getattr(self, name))
        if self.loss_kwargs is not None and not isinstance(self.loss_kwargs, dict):
            raise ValueError(f"loss_kwargs must be a mapping, got {type(self.loss_kwargs).__name__}.")
        # Every built-in hyper-parameter is checked whatever the loss, so a typo in a recipe fails
        # now rather than when someone switches `loss_type`.
        for name in list_losses(include_trl=False):
            spec = get_loss(name)
            if spec.validate is None:
                continue
            if name == self.loss_type:
                spec.validate(self.loss_hyperparameters())
            elif spec.config_fields and all(hasattr(self, attr) for attr in spec.config_fields.values()):
                spec.validate({kw: getattr(self, attr) for kw, attr in spec.config_fields.items()})

    def loss_hyperparameters(self) -> dict[str, Any]:
        """Keyword arguments of the selected trl_emo loss (its fields, plus `loss_kwargs`)."""
        spec = get_loss(self.loss_type)
        hparams = {kw: getattr(self, attr) for kw, attr in spec.config_fields.items()}
        overlap = set(hparams) & set(self.loss_kwargs or {})
        if overlap:
            raise ValueError(
                f"loss_kwargs sets {', '.join(sorted(overlap))}, which {self.loss_type!r} reads from its own config "
                f"field(s) {', '.join(spec.config_fields[k] for k in sorted(overlap))}; set those instead."
            )
        hparams.update(self.loss_kwargs or {})
        return hparams

    def checkpoint_side_files(self, head_trains: bool) -> list[str]:
        """The files a checkpoint of this run holds besides transformers' own, the loss's state a resume needs:
        EMO's frozen cost embedding (when the head trains: a frozen head is read again), GEM's beta (with a target
        entropy), SED's calibrated threshold, PSFT's old policy and CurioSFT's teacher (`lagged_policy.STATE_FILE`).
        What `trl_emo.training.checkpoints` checks a checkpoint for."""
        if self.loss_type in TRL_LOSS_TYPES:
            return []
        from . import gem_schedule, objective, sed_threshold

        spec = get_loss(self.loss_type)
        files = []
        if spec.uses_cost_embedding and self.emo_cost_embedding == "frozen" and head_trains:
            files.append(objective.COST_EMBEDDING_FILE)
        if self.gem_target_entropy is not None:
            files.append(gem_schedule.STATE_FILE)
        if spec.name == "sed" and self.loss_hyperparameters().get("threshold") is None:
            files.append(sed_threshold.STATE_FILE)
        if spec.lagged_reference is not None:
            from . import lagged_policy

            files.append(lagged_policy.STATE_FILE)
        return files


def loss_defaults(loss_type: str) -> dict[str, Any]:
    """The hyper-parameters of a registered loss as `SFTConfig` sets them by default (from `LossSpec.defaults` for the
    built-in losses, whose fields take them from there)."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(SFTConfig)}
    return {kw: fields[attr].default for kw, attr in get_loss(loss_type).config_fields.items()}
