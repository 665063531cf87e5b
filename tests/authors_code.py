"""Test copies of the authors' losses, rewritten in plain PyTorch step by step from their code (the CUDA-only
pieces replaced by the plain PyTorch they compute), each step citing the line it mirrors. `tests/test_sed_eksft.py`
compares trl_emo's logits and fused paths with them in float64.

- SED-SFT: `pppa2019/SED-SFT` at 6a89ea3 — `utils/sed_triton_loss.py` (`SEDLoss.forward`, cited `L:`),
  `utils/sed_triton_ops.py` (flash-attention's Triton cross-entropy, `OPS:`; here `logsumexp - z_y`, what it
  computes, with the same gradient), `sft_trainer_v2.py` (`sed_loss_triton`, `compute_loss`, `TR:`), `train.py`
  (argument defaults and the threshold calibration, `TRAIN:`).
- EKSFT: `MINE-USTC/EKSFT` at 0908ab2 — `src/llamafactory/train/eksft/trainer.py` (`T:`) and
  `src/llamafactory/hparams/finetuning_args.py` (`FA:`); HF's `ForCausalLMLoss` (pad, shift, mean over non-ignored
  targets) for their cross-entropy call.
- PSFT: `zwhong714/PSFT` at 569b1ba (verl) — `verl/verl/trainer/ppo/core_algos.py` (`CA:`: `agg_loss`,
  `compute_policy_loss_vanilla`), `verl/verl/trainer/ppo/ray_trainer.py` (`RT:`, the PSFT advantage),
  `verl/verl/utils/torch_functional.py` (`TF:`, `masked_mean`), `verl/recipe/psft/run_psft.sh` (`SH:`).
- CurioSFT: `HaoooWang/CurioSFT` at 5a77394 (verl) — `custom_verl/recipe/curio_sft/ppo/core_algos.py` (`CC:`,
  `custom_loss`), `custom_verl/recipe/curio_sft/dp_actor.py` (`DA:`, `_forward_micro_batch`, `compute_tau_from_logits`),
  `custom_verl/verl/utils/torch_functional.py` (`TF:`, `entropy_from_logits`, `masked_mean`), `scripts/1_sft.sh`.
- Beyond Log Likelihood (`prob`): `GaotangLi/Beyond-Log-Likelihood` at 220589d — `main_verl/trainer/fsdp_sft_trainer.py`
  (`BL:`). iw-SFT: `emmyqin/iw_sft` at 9a3e4e4 — `bounding_trainers.py` (`IW:`; no licence, re-derived). GIFT:
  `zzy1127/GIFT` at ba91084 — `verl/verl/trainer/fsdp_gift_trainer.py` (`G:`). SLM: the Rho-1 paper's formula (no code
  released). `tests/test_prob_iw_gift_slm.py` compares them with trl_emo.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def _topk_indices(values: torch.Tensor, k: int, largest: bool) -> torch.Tensor:
    order = torch.sort(values, descending=largest, stable=True).indices
    return order[:k]


# -- SED-SFT ----------------------------------------------------------------------------------------------------------


def sed_authors_forward(
    logits: torch.Tensor,
    labels: torch.Tensor,
    entropy_penalty_scale: float = 1.0,
    top_k: int = 2,
    cumsum_threshold: float = 0.95,
    *,
    ignore_index: int = -100,
    num_items_in_batch: Optional[float] = None,
    num_processes: int = 1,
    probs_dtype: Optional[torch.dtype] = None,
    return_metrics: bool = False,
):
    """SED-SFT loss exactly as in SEDLoss.forward (+ the trainer's reduction).

    Args:
      logits: [N, V] already *shifted* logits (row t predicts labels[t]); the trainer does the
        shift and drops ignored rows before calling SEDLoss (TR:303-308). Any float dtype.
      labels: [N] long, ignore_index (-100) marks ignored rows.
      entropy_penalty_scale: lambda. Run-time value in the authors' script is 1.0
        (TRAIN:78-81 default, not overridden by train_scripts/train_cumsum_numina.sh);
        SEDLoss's own default of 0.2 (L:28) is always overridden by the trainer (TR:419/428).
      top_k: k of the top-k mass. Run-time value 2 (TR:429, args.top_k is None -> 2).
      cumsum_threshold: tau. At run time it is *computed* by train.py (TRAIN:304-316) as a
        quantile of the base model's top-10 mass on held-out data (cumsum_ratio=0.7);
        the 0.95 default (L:41, TR:258) is never used for loss='sed_with_topk_cumsum_ratio'.
      num_items_in_batch: if given, mirrors reduction='none' + sum/num_items_in_batch (TR:289,317-318);
        if None, mirrors reduction='mean' = sum / #non-ignored rows (L:115-119).
      num_processes: the trainer multiplies the loss by accelerator.num_processes (TR:455).
      probs_dtype: dtype in which the softmax / top-k / penalty branch is evaluated. The authors run
        it in the dtype of the model logits (L:83-84: plain F.softmax on `input`), i.e. bf16 under
        --bf16 with transformers>=4.45 (their CE part is always fp32 inside Triton, OPS:50-52,69).
        None = use logits.dtype (exact math in float64). Pass torch.bfloat16 to emulate rounding.
      return_metrics: also return (correct_pred_rate, mask_rate, extra_loss_mean) like L:143.
    """
    assert logits.dim() == 2 and labels.dim() == 1 and labels.shape[0] == logits.shape[0]
    n_rows, vocab = logits.shape
    valid = labels != ignore_index                                   # L:95  (mask of non-ignored rows)
    safe_labels = torch.where(valid, labels, torch.zeros_like(labels))
    # (authors index probs with the raw -100 at L:93, which wraps to column V-100; that value is
    #  discarded at L:100, so using column 0 here changes nothing.)

    # ---- 1. cross-entropy part: flash-attn Triton kernel, temperature 1 ----------------------
    # OPS:44-58 online log-sum-exp in fp32; OPS:77 loss = lse - logit[label]; OPS:63-65 ignored -> 0.
    # SEDLoss calls it with logit_scale=1.0 (L:23 default, never changed), lse_square_scale=0.0
    # (L:77, so no z-loss), label_smoothing=0 (OPS:292 default).
    # Its backward (OPS:129-142) is dloss * (softmax(z) - onehot(y)) with dloss=0 on ignored rows:
    # exactly what autograd of (logsumexp - gather) gives below.
    ce_dtype = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
    z_ce = logits.to(ce_dtype)
    lse = torch.logsumexp(z_ce, dim=-1)                                                  # OPS:58
    z_y = z_ce.gather(1, safe_labels.unsqueeze(1)).squeeze(1)                           # OPS:69
    ce = torch.where(valid, lse - z_y, torch.zeros_like(lse))                            # OPS:63-64,77

    # ---- 2. probabilities for the penalty / mask (plain torch, autograd ON) ------------------
    p_dtype = probs_dtype if probs_dtype is not None else logits.dtype
    scaled = logits.to(p_dtype) * 1.0                                  # L:83 (logit_scale = 1.0)
    probs = torch.softmax(scaled, dim=-1)                              # L:84  temperature 1

    # ---- 3. top-k probability mass -----------------------------------------------------------
    # L:88-89 torch.topk(probs, k, largest=True, sorted=True) then sum. Ties cannot change the sum
    # (tied entries have equal values), so tie-breaking is irrelevant. This value only feeds the
    # boolean comparison below, so no gradient ever flows through it.
    topk_mass = torch.topk(probs, k=top_k, dim=-1, largest=True, sorted=True).values.sum(dim=-1)

    # ---- 4. target probability (gradient flows through it) -----------------------------------
    p_y = probs.gather(1, safe_labels.unsqueeze(1)).squeeze(1)         # L:92-93

    # ---- 5. "dynamic" penalty term  p(p-1) + 1/4 = (p - 1/2)^2, zero on ignored rows ----------
    penalty = torch.where(valid, p_y * (p_y - 1) + 0.25, torch.zeros_like(p_y))   # L:96-100

    # ---- 6. selective mask: strict '<' on the top-k mass, bool -> no gradient ----------------
    # L:104. NB: with bf16 probs, a python-float threshold is rounded to bf16 for the comparison.
    m = topk_mass < cumsum_threshold

    # ---- 7. combine ----------------------------------------------------------------------------
    extra = penalty * m * entropy_penalty_scale                        # L:111
    per_token = ce + extra                                             # L:112 (fp32 CE + extra -> promoted)

    # ---- 8. reduction --------------------------------------------------------------------------
    n_valid = valid.sum()
    if num_items_in_batch is None:                                     # L:115-119 (reduction='mean', TR:289)
        loss = per_token.sum() / n_valid if n_valid > 0 else per_token.sum() * 0.0
    else:                                                              # TR:289 'none' + TR:317-318
        loss = per_token.sum() / num_items_in_batch
    loss = loss * num_processes                                        # TR:455

    if not return_metrics:
        return loss
    with torch.no_grad():
        # L:103,107: argmax hit-rate over ALL rows (denominator includes ignored rows, if any)
        correct_pred_rate = (probs.argmax(dim=-1) == labels).sum() / n_rows
        # L:108: 1 - fraction of rows that RECEIVE the penalty (i.e. share of rows masked out)
        mask_rate = 1 - m.sum() / n_rows
        extra_mean = extra.mean()                                      # L:143 extra_loss.mean()
    return loss, correct_pred_rate, mask_rate, extra_mean


# -- EKSFT ---------------------------------------------------------------------------------------------------------------


def eksft_dynamic_lambdas(
    entropy_loss_value: float,
    kl_loss_value: float,
    lambda_entropy: float,
    lambda_kl: float,
    target_entropy: float = 0.5,  # FA:380-383 default; not set by examples/example_eksft/eksft.sh
    target_kl: float = 2.0,  # FA:384-387 default; not set by the script
) -> tuple[float, float]:
    """Per-call multiplicative nudge. Inputs are the CLI lambdas (re-read every call, T:378-379), and the
    *current micro-batch's* detached entropy / KL loss values (``.item()``, T:383, T:388).  Outputs are used only
    for this micro-batch's total loss (T:395) and are never written back, so the effective lambda is always
    base*1.05 or base*0.95 -- it cannot drift over training.
    """
    lam_e = lambda_entropy * (1.05 if entropy_loss_value < target_entropy else 0.95)  # strict "<" (T:383)
    lam_k = lambda_kl * (1.05 if kl_loss_value > target_kl else 0.95)  # strict ">" (T:388)
    return lam_e, lam_k


# ----------------------------------------------------------------------------------------------------------------
# shared pieces
# ----------------------------------------------------------------------------------------------------------------
def _topk_masks(kl_stat, ent_stat, valid, k, largest_kl, largest_entropy, union):
    """Mirror of ``create_intersection_mask`` (T:168-249).

    Scope: the whole micro-batch, flattened over B*T (T:215, T:221, T:224) -- not per sequence, not per process
    group (no all-gather is involved in selection).  Exactly ``k`` positions per criterion via torch.topk;
    ties are resolved by topk's unspecified internal order (no threshold / no ">=").
    Non-candidates are pushed to -inf (largest) / +inf (smallest) so they are never picked while k <= #valid
    (T:204-212).
    """
    kl = kl_stat.clone()
    ent = ent_stat.clone()
    kl[~valid] = float("-inf") if largest_kl else float("inf")  # T:205-208
    ent[~valid] = float("-inf") if largest_entropy else float("inf")  # T:209-212
    n = kl.numel()
    kk = min(k, n)  # T:218
    # T:221, T:224 call torch.topk, whose order among tied values is unspecified; this copy takes the earlier
    # positions first (one of the orders torch.topk may return), as trl_emo does, so that ties compare exactly.
    kl_idx = _topk_indices(kl.reshape(-1), kk, largest_kl)  # T:221
    ent_idx = _topk_indices(ent.reshape(-1), kk, largest_entropy)  # T:224
    kl_mask = torch.zeros(n, dtype=torch.bool, device=kl.device)
    kl_mask[kl_idx] = True  # T:233-234 (the "safe" filter at T:227-230 never removes anything)
    ent_mask = torch.zeros(n, dtype=torch.bool, device=kl.device)
    ent_mask[ent_idx] = True  # T:237-238
    drop = (kl_mask | ent_mask) if union else (kl_mask & ent_mask)  # T:241-244
    return drop.view_as(kl_stat), kl_mask.view_as(kl_stat), ent_mask.view_as(kl_stat)


def _num_selected(n_valid: int, ratio: float) -> int:
    # T:312-313: Python float product then int() -> floor (with float rounding of n*ratio), clipped at 0.
    return max(0, int(n_valid * ratio))


# ----------------------------------------------------------------------------------------------------------------
# authors' code, literally
# ----------------------------------------------------------------------------------------------------------------
def eksft_authors_forward(
    logits: torch.Tensor,  # [B,T,V] training-pass logits (requires_grad)
    ref_logits: torch.Tensor,  # [B,T,V] frozen reference logits
    labels: torch.Tensor,  # [B,T] UNshifted HF labels (label[t] is the token at input position t), -100 ignored
    ratio: float = 0.2,
    lambda_entropy: float = 0.05,
    lambda_kl: float = 0.05,
    mode: str = "union",  # "union" (script) | "intersection" (code default, FA:388-391)
    *,
    largest_kl: bool = True,
    largest_entropy: bool = True,
    target_entropy: float = 0.5,
    target_kl: float = 2.0,
    dynamic_lambda: bool = True,
    raise_on_zero_k: bool = False,
    return_parts: bool = False,
):
    assert mode in ("union", "intersection")
    B, T, V = logits.shape

    # ---- candidate mask: UNshifted labels != -100 (T:270-271). Position t is a candidate iff label[t] is a
    # supervised token, but the statistics read at position t come from logits[t], which predict label[t+1].
    valid = labels.ne(IGNORE_INDEX)

    # ---- selection statistics: separate no-grad forward of policy and reference (T:142-145). With identical
    # weights and no dropout these equal the training-pass logits, so we use logits.detach().
    with torch.no_grad():
        lp = F.log_softmax(logits.detach(), dim=-1)  # T:148
        lq = F.log_softmax(ref_logits.detach(), dim=-1)  # T:149
        p = lp.exp()  # T:152
        ent_stat = -(p * lp).sum(-1)  # T:155: full-vocab Shannon entropy, NOT normalized
        kl_stat = (p * (lp - lq).clamp(-1e10, 1e10)).sum(-1)  # T:159-160: full-vocab KL(pi_theta || pi_ref)
        kl_stat = kl_stat * valid  # T:163
        ent_stat = ent_stat * valid  # T:164

        # ---- how many: k from the micro-batch's valid-label count (T:311-313)
        n_valid = int(valid.sum().item())
        k = _num_selected(n_valid, ratio)
        if k > 0:  # T:315-318
            drop, kl_mask, ent_mask = _topk_masks(
                kl_stat, ent_stat, valid, k, largest_kl, largest_entropy, union=(mode == "union")
            )
        else:  # T:319-322
            drop = valid
            kl_mask = torch.zeros_like(valid)
            ent_mask = torch.zeros_like(valid)
        lq_const = lq  # reference log-probs, a constant in the loss (T:166, used at T:367)

    # ---- training pass (T:336-339): probabilities of the grad-carrying logits
    probs = torch.softmax(logits, dim=-1)

    # ---- CE on the NOT-dropped tokens (T:346-351). The drop mask is applied to UNshifted labels; HF's
    # ForCausalLMLoss then pads+shifts (logits[t] vs label[t+1]) and averages over the remaining non-ignored
    # targets of this micro-batch (reduction "mean" because num_items_in_batch is not passed).
    labels_ce = labels.masked_fill(drop, IGNORE_INDEX) if k > 0 else labels.clone()
    shift_labels = F.pad(labels_ce, (0, 1), value=IGNORE_INDEX)[..., 1:]
    ce_loss = F.cross_entropy(
        logits.reshape(-1, V), shift_labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="mean"
    )  # (ForCausalLMLoss also does logits.float(): an upcast from bf16 in their runs; skipped here for float64)

    # ---- entropy bonus on the entropy-selected positions (T:357-363). Differentiable; normalized by log V of
    # the (padded) logits width; log V literally computed as float32 (torch.log of an int tensor).
    if bool(ent_mask.any()) and lambda_entropy > 0:
        max_entropy = torch.log(torch.tensor(V, device=logits.device))  # T:358 (float32 scalar)
        tok_ent = -(probs * torch.log(probs + 1e-12)).sum(-1) / max_entropy  # T:359
        entropy_loss = (tok_ent * ent_mask.float()).sum() / (ent_mask.sum() + 1e-12)  # T:361: mean over k
    else:
        entropy_loss = torch.tensor(0.0, device=logits.device, dtype=logits.dtype)

    # ---- "KL" penalty on the KL-selected positions (T:366-374). NOTE the bug: probs - log q_ref instead of
    # log p - log q_ref, i.e. per token  sum_v p_v * (p_v - log q_v) = sum_v p_v^2 + H(p, q_ref)
    #                                      = KL(p||q) + H(p) + sum_v p_v^2.
    if bool(kl_mask.any()) and lambda_kl > 0:
        log_diff = (probs - lq_const).clamp(-1e10, 1e10)  # T:367
        kl_tok = (probs * log_diff).sum(-1) * valid  # T:369-370
        kl_loss = (kl_tok * kl_mask.float()).sum() / (kl_mask.sum() + 1e-12)  # T:372: mean over k
    else:
        kl_loss = torch.tensor(0.0, device=logits.device, dtype=logits.dtype)

    # ---- dynamic lambda (T:376-391): recomputed from the CLI values every call, never persisted
    if dynamic_lambda:
        lam_e, lam_k = eksft_dynamic_lambdas(
            entropy_loss.item(), kl_loss.item(), lambda_entropy, lambda_kl, target_entropy, target_kl
        )
    else:
        lam_e, lam_k = lambda_entropy, lambda_kl

    total = ce_loss - lam_e * entropy_loss + lam_k * kl_loss  # T:395

    # T:398 divides by (kl_mask | ent_mask).sum() for a logged IoU: with k == 0 this is a Python
    # ZeroDivisionError, i.e. the authors' run crashes on micro-batches with < ceil(1/ratio) valid labels.
    if k == 0 and raise_on_zero_k:
        raise ZeroDivisionError("authors' code: IoU logging divides by zero when k == 0 (T:398)")

    if return_parts:
        return total, dict(
            ce=ce_loss, entropy=entropy_loss, kl=kl_loss, lam_e=lam_e, lam_k=lam_k, k=k,
            drop=drop, kl_mask=kl_mask, ent_mask=ent_mask,
        )
    return total


# ----------------------------------------------------------------------------------------------------------------
# intended / "paper" objective
# ----------------------------------------------------------------------------------------------------------------
def eksft_paper_forward(
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
    labels: torch.Tensor,  # UNshifted HF labels
    ratio: float = 0.2,
    lambda_entropy: float = 0.05,
    lambda_kl: float = 0.05,
    mode: str = "union",
    *,
    largest_kl: bool = True,
    largest_entropy: bool = True,
    normalize_entropy: bool = True,  # code normalizes the loss-side entropy by log V (T:358-359)
    lambda_rule: Optional[Callable[[float, float, float, float], tuple[float, float]]] = None,
    return_parts: bool = False,
):
    """Objective as stated in the code's own comments/docstring (T:154-157, T:256-260) and the abstract:

        L = CE over kept tokens  -  lam_H * mean_{t in S_H} H(pi_theta(.|t))  +  lam_KL * mean_{t in S_KL} KL_t,
        KL_t = sum_v pi_theta(v|t) [log pi_theta(v|t) - log pi_ref(v|t)]   (forward KL from the policy, full vocab)
        S_H / S_KL = top-floor(ratio*N) positions by entropy / KL over the micro-batch's N supervised positions,
        kept = supervised positions not in (S_H u S_KL) [union] or not in (S_H n S_KL) [intersection].

    Differences from ``eksft_authors_forward``: log-probs in KL; every position t refers to logits[t] and its
    target label[t+1] (selection, CE drop and regularizers on the same logit row); fixed lambdas unless
    ``lambda_rule`` is given (e.g. ``lambda H, K, le, lk: eksft_dynamic_lambdas(H, K, le, lk)``).
    The paper body was not available, so the exact paper text for lambda adaptation / entropy normalization is
    unverified.
    """
    assert mode in ("union", "intersection")
    B, T, V = logits.shape
    lg = logits[:, :-1]
    rl = ref_logits[:, :-1]
    tgt = labels[:, 1:]
    valid = tgt.ne(IGNORE_INDEX)

    with torch.no_grad():
        lp = F.log_softmax(lg.detach(), -1)
        lq = F.log_softmax(rl.detach(), -1)
        p = lp.exp()
        ent_stat = -(p * lp).sum(-1)
        kl_stat = (p * (lp - lq)).sum(-1)
        k = _num_selected(int(valid.sum().item()), ratio)
        if k > 0:
            drop, kl_mask, ent_mask = _topk_masks(
                kl_stat, ent_stat, valid, k, largest_kl, largest_entropy, union=(mode == "union")
            )
        else:
            drop = torch.zeros_like(valid)
            kl_mask = torch.zeros_like(valid)
            ent_mask = torch.zeros_like(valid)

    logp = F.log_softmax(lg, -1)
    pr = logp.exp()
    keep = valid & ~drop
    nll = -logp.gather(-1, tgt.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    ce_loss = (nll * keep).sum() / keep.sum().clamp_min(1)

    if k > 0:
        tok_ent = -(pr * logp).sum(-1)
        if normalize_entropy:
            tok_ent = tok_ent / math.log(V)
        entropy_loss = (tok_ent * ent_mask).sum() / k
        kl_tok = (pr * (logp - lq)).sum(-1)
        kl_loss = (kl_tok * kl_mask).sum() / k
    else:
        entropy_loss = logits.new_zeros(())
        kl_loss = logits.new_zeros(())

    lam_e, lam_k = lambda_entropy, lambda_kl
    if lambda_rule is not None:
        lam_e, lam_k = lambda_rule(entropy_loss.item(), kl_loss.item(), lambda_entropy, lambda_kl)
    total = ce_loss - lam_e * entropy_loss + lam_k * kl_loss
    if return_parts:
        return total, dict(ce=ce_loss, entropy=entropy_loss, kl=kl_loss, lam_e=lam_e, lam_k=lam_k, k=k,
                           drop=drop, kl_mask=kl_mask, ent_mask=ent_mask)
    return total


# -- PSFT and CurioSFT (verl): shared pieces ------------------------------------------------------------------------


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # TF: masked_mean: sum(values * mask) / (mask.sum() + 1e-8), the "token-mean" of agg_loss (CA:719-720).
    return (values * mask).sum() / (mask.sum() + 1e-8)


def _response_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's response log-probabilities: the logits of the positions before each response token, `log_softmax` and
    gather (its PyTorch `logprobs_from_logits`; the flash-attention kernel computes the same), with the response mask.
    The HF labels' shift stands in for their `[:, -response_length - 1 : -1]` slice."""
    lg = logits[:, :-1]
    tgt = labels[:, 1:]
    mask = tgt.ne(IGNORE_INDEX)
    logp = torch.log_softmax(lg, dim=-1).gather(-1, tgt.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    return logp, mask


# -- PSFT --------------------------------------------------------------------------------------------------------------


def psft_authors_forward(
    logits: torch.Tensor,  # [B, T, V] the policy's (with gradient)
    old_logits: Optional[torch.Tensor],  # [B, T, V] the old policy's, no gradient; None: the policy's own (first step)
    labels: torch.Tensor,  # [B, T] unshifted HF labels, -100 ignored
    clip_ratio_low: float = 0.2,  # SH: clip_ratio_low=0.2
    clip_ratio_high: float = 0.28,  # SH: clip_ratio_high=0.28
    clip_ratio_c: float = 10.0,  # SH: actor.clip_ratio_c=10.0
    loss_agg_mode: str = "token-mean",  # SH: loss_agg_mode="token-mean"
):
    """`compute_policy_loss_vanilla` (CA:816-890) with the PSFT advantage (RT:274-276: 1 on every response token)."""
    log_prob, response_mask = _response_log_probs(logits, labels)
    mask = response_mask.to(logits.dtype)
    if old_logits is None:  # the old log-probs are computed by a no-grad forward of the same weights
        old_log_prob = log_prob.detach()
    else:
        old_log_prob, _ = _response_log_probs(old_logits.detach(), labels)
    advantages = torch.ones_like(mask) * mask  # RT:275
    assert clip_ratio_c > 1.0  # CA:857-860
    negative_approx_kl = log_prob - old_log_prob  # CA:862
    negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)  # CA:864
    ratio = torch.exp(negative_approx_kl)  # CA:865
    pg_losses1 = -advantages * ratio  # CA:868
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)  # CA:873-875
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)  # CA:876-878
    pg_losses3 = -advantages * clip_ratio_c  # CA:881
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)  # CA:882
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)  # CA:887
    assert loss_agg_mode == "token-mean"
    return _masked_mean(pg_losses, mask)  # CA:888 agg_loss


# -- CurioSFT ----------------------------------------------------------------------------------------------------------


@torch.no_grad()
def curio_compute_tau(logits: torch.Tensor, tau_min: float = 1.1, tau_max: float = 1.5, topk: int = 512,
                      iters: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """DA:544-595 `compute_tau_from_logits`, step by step: (H_now, tau) per row of the teacher's logits `[N, V]`."""
    assert logits.dim() == 2
    N, V = logits.shape
    K = min(topk, V)  # DA:556
    z = logits

    def entropy_topk(z_, tau_):  # DA:559-567
        if K >= V:
            logp = torch.log_softmax(z_ / tau_, dim=-1)
            p = logp.exp()
            return -(p * logp).sum(dim=-1)
        vals, _ = torch.topk(z_, k=K, dim=-1)
        logp_k = torch.log_softmax(vals / tau_, dim=-1)
        p_k = logp_k.exp()
        return -(p_k * logp_k).sum(dim=-1)

    ones = torch.ones(N, 1, device=z.device, dtype=z.dtype)  # DA:569
    H_now = entropy_topk(z, ones)  # DA:570
    c = 1.2  # DA:573
    delta = torch.sigmoid((H_now - c) * 2.0) * 0.5  # DA:574
    H_star = H_now + delta  # DA:575
    tau_lo = torch.full((N, 1), tau_min, device=z.device, dtype=z.dtype)  # DA:577
    tau_hi = torch.full((N, 1), tau_max, device=z.device, dtype=z.dtype)  # DA:578
    H_lo = entropy_topk(z, tau_lo)  # DA:579
    H_hi = entropy_topk(z, tau_hi)  # DA:580
    tau = torch.where(  # DA:582-586
        H_star <= H_lo, tau_lo.squeeze(-1),
        torch.where(H_star >= H_hi, tau_hi.squeeze(-1), (tau_lo.squeeze(-1) + tau_hi.squeeze(-1)) / 2),
    ).unsqueeze(-1)
    for _ in range(iters):  # DA:588-593
        H_mid = entropy_topk(z, tau)
        go_hi = (H_mid < H_star).unsqueeze(-1)
        tau_lo = torch.where(go_hi, tau, tau_lo)
        tau_hi = torch.where(go_hi, tau_hi, tau)
        tau = (tau_lo + tau_hi) / 2
    return H_now.squeeze(-1), tau.squeeze(-1)  # DA:595


def curio_teacher_log_probs(teacher_logits: torch.Tensor, labels: torch.Tensor, tau_min: float = 1.1,
                            tau_max: float = 1.5, topk: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher worker's `_forward_micro_batch` with `use_adaptive_tau` (DA:201-226): `(ref_log_prob, tau)` of the
    response tokens."""
    B, T, V = teacher_logits.shape
    logits_rmpad = teacher_logits[:, :-1].reshape(-1, V).detach().clone()  # the rows before each token
    _, tau_rmpad = curio_compute_tau(logits_rmpad, tau_min=tau_min, tau_max=tau_max, topk=topk)  # DA:202-203
    pd = torch.softmax(logits_rmpad, dim=-1)  # TF: entropy_from_logits
    entropy_rmpad = torch.logsumexp(logits_rmpad, dim=-1) - torch.sum(pd * logits_rmpad, dim=-1)  # DA:204
    tau_rmpad[entropy_rmpad <= 0.03] = tau_min  # DA:205
    logits_rmpad.div_(tau_rmpad.unsqueeze(-1))  # DA:206
    tgt = labels[:, 1:].reshape(-1).clamp_min(0)
    log_probs = torch.log_softmax(logits_rmpad, dim=-1).gather(-1, tgt[:, None]).squeeze(-1)  # DA:222-226
    return log_probs.view(B, T - 1), tau_rmpad.view(B, T - 1)


def curio_authors_forward(
    logits: torch.Tensor,  # [B, T, V] the policy's (with gradient), at temperature 1 (rollout.temperature=1.0)
    teacher_logits: Optional[torch.Tensor],  # [B, T, V] the teacher's, no gradient; None: the policy's own
    labels: torch.Tensor,  # [B, T] unshifted HF labels, -100 ignored
    tau_min: float = 1.1,
    tau_max: float = 1.5,
    topk: int = 512,
    alpha: float = 1.0,  # CC:771 fixes it at 1; the argument stands for the paper's alpha
    return_tau: bool = False,
):
    """`custom_loss` with `algo_type="curio_sft"` (CC:758-777) on the teacher's `ref_log_prob`."""
    teacher = (logits if teacher_logits is None else teacher_logits).detach()
    ref_log_prob, tau = curio_teacher_log_probs(teacher, labels, tau_min, tau_max, topk)
    log_prob, response_mask = _response_log_probs(logits, labels)
    eos_mask = response_mask.to(logits.dtype)
    mse_loss = -log_prob  # CC:772
    kd_loss = alpha * 0.5 * (log_prob - ref_log_prob) ** 2  # CC:773
    pg_losses = mse_loss + kd_loss  # CC:774
    pg_loss = _masked_mean(pg_losses, eos_mask)  # CC:777
    return (pg_loss, tau[response_mask]) if return_tau else pg_loss
# ----------------------------------------------------------------------------------------------------------------
# Beyond Log Likelihood: `GaotangLi/Beyond-Log-Likelihood` at 220589d, `main_verl/trainer/fsdp_sft_trainer.py`,
# `_compute_loss_and_backward` (cited `BL:`), the branch without sequence parallelism (BL:351-412; the Ulysses branch,
# BL:413-466, computes plain cross-entropy whatever `objective_trans` says).
# ----------------------------------------------------------------------------------------------------------------
def beyond_ll_authors_forward(
    shift_logits: torch.Tensor,  # [N, V] logits of the positions (already shifted and flattened, BL:359-363)
    shift_labels: torch.Tensor,  # [N] the next token of each position (their `input_ids[:, 1:]`, never -100)
    loss_mask: torch.Tensor,  # [N] float, 1 on the trained positions (their `loss_mask[:, :-1]`, BL:345)
    objective_trans: str,  # "original", "p", "logp", "GeneralFamily-q", "OnlyTopP-t", ... (BL:368-412)
    dp_size: int = 1,
):
    loss_fct = torch.nn.CrossEntropyLoss(reduction="none")  # BL:346
    if objective_trans == "original":
        loss = loss_fct(shift_logits, shift_labels) * loss_mask  # BL:368-370
    else:
        # BL:373 takes `shift_logits.float()`: an upcast from their bf16 logits, skipped here for float64.
        log_p_true = F.log_softmax(shift_logits, dim=-1).gather(1, shift_labels.unsqueeze(-1)).squeeze(-1)
        prob = log_p_true.exp()  # BL:374, "prob_coefficients" (with gradient)
        family, _, number = objective_trans.partition("-")
        if objective_trans == "p":
            loss = (1 - prob) * loss_mask  # BL:376-378
        elif objective_trans == "logp":
            loss = -log_p_true * loss_mask  # BL:379-381
        elif "GeneralFamily" in family:
            q = float(number)  # BL:383
            loss = -(torch.exp(q * log_p_true) - 1) / q * loss_mask  # BL:384-385
        else:
            threshold = float(number)
            # The comparison multiplies the mask itself, so the count below is of the kept tokens (BL:389, 395, ...).
            keep = prob >= threshold if "Top" in family else prob <= threshold
            loss_mask = loss_mask * keep
            if family in ("OnlyTopP", "OnlyBottomP"):
                loss = (1 - prob) * loss_mask  # BL:386-398
            elif family in ("OnlyTopLogP", "OnlyBottomLogP"):
                loss = loss_fct(shift_logits, shift_labels) * loss_mask  # BL:399-410
            else:
                raise ValueError(f"Unknown objective transformation: {objective_trans}")  # BL:411-412
    valid = loss_mask.sum()  # BL:468 (balance_dp_token off, their default: no all-reduce, dp_size 1, BL:470-474)
    return loss.sum() / (valid + 1e-8) * dp_size  # BL:476


# ----------------------------------------------------------------------------------------------------------------
# iw-SFT: `emmyqin/iw_sft` at 9a3e4e4, `bounding_trainers.py` (cited `IW:`): `IwSFTLoss.__call__` (IW:29-72) and the
# reference's log-probabilities in `BoundingTrainer.compute_loss` (IW:190-205). The repository has no licence: what
# follows re-derives the computation step by step (same operations, same shapes, so the same broadcasting), it is not
# their text.
# ----------------------------------------------------------------------------------------------------------------
def iw_sft_reference_log_probs(ref_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`[B, T-1, 1]`: the reference's log-probability of each next label (IW:196-205: drop the last position, a
    max-subtracted softmax then its log, gathered at the labels clamped to >= 0)."""
    shifted = ref_logits[:, :-1, :].detach()
    normalized = shifted - shifted.max(dim=-1, keepdim=True).values
    probs = normalized.exp()
    log_probs = (probs / probs.sum(dim=-1, keepdim=True)).log()
    index = labels[..., 1:].clamp(min=0).unsqueeze(-1)
    return log_probs.gather(dim=-1, index=index)


def iw_sft_authors_forward(
    logits: torch.Tensor,  # [B, T, V] the policy's logits of the batch (their `outputs["logits"]`)
    labels: torch.Tensor,  # [B, T] unshifted labels, -100 ignored
    ref_log_probs: torch.Tensor,  # [B, T-1, 1] (`iw_sft_reference_log_probs`)
    num_items_in_batch: Optional[float] = None,
    sum_over_time: bool = True,  # what compute_loss passes (IW:211)
    temp: float = 1.0,  # what compute_loss passes (IW:211); the loss's own default is 2.0 (IW:30)
):
    logits = logits[..., :-1, :]  # IW:32-34
    labels = labels[..., 1:].unsqueeze(-1)  # IW:34, 37-38
    negative_log_probs = -F.log_softmax(logits, dim=-1)  # IW:35
    ignored = labels.eq(IGNORE_INDEX)  # IW:40
    nll = negative_log_probs.gather(dim=-1, index=labels.clamp(min=0))  # IW:43-44, [B, T-1, 1]
    with torch.no_grad():  # IW:47
        if sum_over_time:
            # IW:49-51: both masked in place (the no-grad fill of `nll` changes its values, not its graph).
            ref_log_probs.masked_fill_(ignored, 0.0)
            nll.masked_fill_(ignored, 0.0)
            diff = -ref_log_probs - nll
            diff = diff.sum(axis=1) / (1.0 - 1.0 * ignored).sum(axis=1)  # IW:52, [B, 1]
            iw = torch.clamp(torch.exp(temp * diff), 0.0, 16.0)  # IW:53-54
        else:
            iw = torch.clamp(torch.exp(-ref_log_probs - nll.detach()), 1 - 0.8, 1 + 0.8)  # IW:56-57
    nll *= iw  # IW:61-62: [B, T-1, 1] times [B, 1] (or [B, T-1, 1]); in place, as theirs
    nll.masked_fill_(ignored, 0.0)  # IW:64
    if num_items_in_batch:  # IW:68-71
        return nll.sum() / num_items_in_batch
    return nll.mean()


# ----------------------------------------------------------------------------------------------------------------
# GIFT: `zzy1127/GIFT` at ba91084, `verl/verl/trainer/fsdp_gift_trainer.py`, `_compute_loss_and_backward` (cited
# `G:`), its training branch without sequence parallelism (G:412-450) and its reduction (G:512-522).
# ----------------------------------------------------------------------------------------------------------------
def gift_authors_forward(
    student_logits: torch.Tensor,  # [N, V] the policy's logits of the positions (G:420, shifted and flattened)
    ref_logits: torch.Tensor,  # [N, V] the base model's (G:427-428)
    labels: torch.Tensor,  # [N] the next token of each position (G:418, 421)
    loss_mask: torch.Tensor,  # [N] float (G:397)
    beta: float = 20.0,  # G:111, their script's trainer.beta
    smooth_lambda: float = 0.0,  # G:112, their script's trainer.smooth_lambda
    eps: float = 1e-10,  # G:434; 0 for the algorithm as written (log p_ref)
    dp_size: int = 1,
):
    vocab_size = student_logits.shape[-1]
    with torch.no_grad():  # G:425
        ref_probs = F.softmax(ref_logits, dim=-1)  # G:432
        mixed_ref_probs = (1 - smooth_lambda) * ref_probs + smooth_lambda * (1.0 / vocab_size)  # G:433
        log_p_ref = torch.log(mixed_ref_probs + eps)  # G:434
        target_logits = log_p_ref.clone()  # G:438
        gain = torch.tensor(beta, dtype=target_logits.dtype).expand(labels.size(0), 1)  # G:439-440
        target_logits.scatter_add_(1, labels.unsqueeze(1), gain)  # G:441
        target_probs = F.softmax(target_logits, dim=-1)  # G:444
    student_log_probs = F.log_softmax(student_logits, dim=-1)  # G:448
    loss_per_token = -torch.sum(target_probs * student_log_probs, dim=-1)  # G:449
    loss_final = loss_per_token * loss_mask  # G:450
    valid_token_count = torch.sum(loss_mask)  # G:513 (balance_dp_token off: dp_size 1, G:514-518)
    return torch.sum(loss_final) / (valid_token_count + 1e-8) * dp_size  # G:520-522


# ----------------------------------------------------------------------------------------------------------------
# SLM (Rho-1, arXiv 2404.07965): no training code was released; the paper's selective loss written out. The number of
# tokens kept, `k`, is given (trl_emo takes ceil(ratio * N)).
# ----------------------------------------------------------------------------------------------------------------
def slm_paper_forward(
    logits: torch.Tensor,  # [N, V] the model's logits of the target positions
    ref_logits: torch.Tensor,  # [N, V] the reference model's
    labels: torch.Tensor,  # [N]
    k: int,
    groups: Optional[list] = None,  # per-sequence ranking: a list of (row indices, k) per sequence
):
    ce = F.cross_entropy(logits, labels, reduction="none")  # the model's token losses
    with torch.no_grad():
        excess = ce.detach() - F.cross_entropy(ref_logits, labels, reduction="none")  # the excess loss, a ranking
    if groups is None:
        groups = [(torch.arange(len(labels)), k)]
    chosen = []
    for rows, k_rows in groups:
        # The top k by excess loss; among equal ones the earlier positions (an order torch.topk may return).
        chosen.append(rows[_topk_indices(excess[rows], k_rows, largest=True)])
    chosen = torch.cat(chosen)
    return ce[chosen].sum() / len(chosen)  # the mean over the selected tokens
