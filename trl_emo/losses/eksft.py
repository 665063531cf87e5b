"""EKSFT (Liu et al., arXiv 2605.29303): cross-entropy that leaves out the tokens where the model is most uncertain
or has moved furthest from a frozen reference, with an entropy bonus and a KL penalty on those tokens.

Per micro-batch on one process (the scope of the authors' code, `MINE-USTC/EKSFT`,
`src/llamafactory/train/eksft/trainer.py`): with `N` candidate tokens and `k = int(N · ratio)` (the product in double
precision, as their code takes it: ⌊ratio·N⌋ except where the product rounds just below an integer, 0.7 · 90 → 62),
`S_H` are the `k` tokens of largest entropy `H_t` and `S_KL` the `k` of largest `KL_t = KL(π_θ ‖ π_ref)` (full
vocabulary, no gradient through the choice; values within `TIE_QUANTUM` of each other are ties, taken in position
order); `D = S_H ∪ S_KL` (`mode="union"`) or `S_H ∩ S_KL` (`"intersection"`) is dropped from the cross-entropy:

    L = mean_{t ∉ D} (−log p_{y_t})  −  λ_H · mean_{t ∈ S_H} H_t / ln V  +  λ_KL · mean_{t ∈ S_KL} KL_t

(each mean over its own set; `k = 0` is plain cross-entropy). Both regularizers carry gradient to the policy; the
reference is a constant. `formula="paper"` is this objective. `formula="authors"` is what the authors' code computes,
which differs in four ways (docs/losses.md measures each): its "KL" is `Σ_v p_v (p_v − log q_v)` (probabilities where
log-probabilities belong: `KL + H + Σ p²`); its entropy term is `−Σ p log(p + 1e-12) / ln V` with `ln V` in float32; its
λs are recomputed at every micro-batch from the configured values, times 1.05 or 0.95 by comparing the terms with
`target_entropy` / `target_kl`, and never kept; and its selection reads the position *after* each target (its labels
are LLaMA-Factory's, aligned with the inputs, while its cross-entropy shifts them): the candidates are the label rows
(`LossSpec.label_rows`), the entropy bonus and the KL penalty fall on those rows, and a selected row drops the
cross-entropy of the target one position before it.

In the trainer's token-weighted reduction (`Σ_rows ℓ / num_items_in_batch`) each row gets the weight that makes one
micro-batch contribute `T · L` for its `T` target tokens: the micro-batch's `L` when it is the whole step, and each
micro-batch's `L` weighted by its share of the step's tokens under gradient accumulation or several processes.

Fused, the loss is two passes over the chunks (`prepare`, then the loss): the first computes `H_t` and `KL_t` (and the
other per-row sums the gradient needs) from the policy's and the reference's logits chunk by chunk, selects, and turns
the selection into per-row weights; the second computes the loss and its gradient with those weights. The authors'
extra no-gradient forward of the policy is not needed: its logits are the training pass's.

Per-token loss weights (`LossSpec.token_weights = "loss"`: EKSFT applies them itself): a token of weight 0 is no
candidate (it is masked before the loss sees it), the selection counts the other candidates (`k = int(N · ratio)`
over them, whatever their weights), and every mean becomes a weighted mean: the cross-entropy's over the kept tokens,
each regularizer's over its set, the candidates weighing what their token weighs (the label row's own token with the
authors' formula); the micro-batch contributes `W · L` for the sum `W` of its target tokens' weights. Weight 1
everywhere is the unweighted loss, bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from ._common import check_choice, check_number, softmax_stats, upcast
from ._triton import RowLaunch, load_logits, logits_block, softmax_pass, store_grad, store_stats, tl, triton
from .asft import ReferenceHead
from .nll import rows as nll_rows
from .registry import ROLES, TOKEN_WEIGHTS, LossSpec, RowTensors

FORMULAS = ("paper", "authors")
MODES = ("union", "intersection")
# The authors' entropy term: `−Σ p log(p + 1e-12)` (trainer.py, the entropy regularizer).
ENTROPY_EPS = 1e-12
# Their denominators: `mask.sum() + 1e-12`.
COUNT_EPS = 1e-12
# The authors' λ rule: `× 1.05` when the term is on the wrong side of its target, `× 0.95` otherwise.
LAMBDA_UP, LAMBDA_DOWN = 1.05, 0.95
# The selection compares entropies and KLs (nats) rounded to this multiple (2.4e-4): about a hundred times the float32
# rounding of a sum over the vocabulary (up to 2e-6 measured between duplicated rows across chunk sizes and backends),
# and small against what the bf16 rounding of the authors' logits moves their statistics by (up to 0.1 on peaked rows).
# Statistics within it rank as ties.
TIE_QUANTUM = 2.0**-12
# Per-row quantities `prepare` computes (the `weights` hyper-parameter of the loss pass).
WEIGHT_FIELDS = ("w_ce", "w_h", "w_kl", "h_term", "kl_term", "c_h", "c_kl", "lse_r")
METRICS = ("eksft_dropped", "eksft_entropy_selected", "eksft_kl_selected", "eksft_overlap", "eksft_kl")


def check(hp: dict) -> None:
    check_number("eksft_ratio", hp["ratio"], 0.0, 1.0)
    check_number("eksft_lambda_entropy", hp["lambda_entropy"], 0.0, math.inf)
    check_number("eksft_lambda_kl", hp["lambda_kl"], 0.0, math.inf)
    check_choice("eksft_mode", hp["mode"], MODES)
    check_choice("eksft_formula", hp["formula"], FORMULAS)
    check_number("eksft_target_entropy", hp["target_entropy"], -math.inf, math.inf)
    check_number("eksft_target_kl", hp["target_kl"], -math.inf, math.inf)


def log_vocab(vocab: int, formula: str) -> float:
    """`ln V` as each formula divides by it: the authors take `torch.log(torch.tensor(V))`, a float32 value."""
    if formula == "authors":
        return float(torch.log(torch.tensor(vocab, dtype=torch.float32)))
    return math.log(vocab)


# -- per-row statistics -----------------------------------------------------------------------------------------------


@torch.no_grad()
def row_statistics(z: torch.Tensor, zr: torch.Tensor, formula: str) -> dict[str, torch.Tensor]:
    """Per row of the policy's logits `z` and the reference's `zr` (`[n, V]`, float32 or float64): the entropy `H`
    (nats) and `KL(p ‖ q)` that select, the two regularizers' values (`h_term`, `kl_term`, before `1/ln V` and λ),
    the sums their gradients subtract (`c_h`, `c_kl`), and the reference's log-normalizer `lse_r`. Reductions are
    dot products over the vocabulary (`vecdot`), so few `[n, V]` temporaries live at once."""
    # `log p` and `log q` by the same operation, and KL as `Σ p (log p − log q)`: identical rows of `z` and `zr` (the
    # policy is the reference, as at the first step) give exactly 0, as the Triton kernel does, so that ties are ties
    # on both backends (`Σ p log p − Σ p log q` left ±1e-6 of rounding here).
    logp = torch.log_softmax(z, dim=-1)
    p = logp.exp()
    lse_r = torch.logsumexp(zr, dim=-1)
    logq = torch.log_softmax(zr, dim=-1)
    entropy = -torch.linalg.vecdot(p, logp)
    if formula == "authors":
        # The authors clamp `p - log q` to ±1e10 (an infinite log q would make 0 · inf); finite logits never reach it.
        pq = torch.linalg.vecdot(p, logq.clamp_(-1e10, 1e10))
    kl = torch.linalg.vecdot(p, logq.neg_().add_(logp))  # log p − log q, in the place of log q
    del logq, logp
    if formula == "authors":
        pe = p + ENTROPY_EPS
        log_pe = torch.log(pe)
        p_log_pe = torch.linalg.vecdot(p, log_pe)
        del log_pe
        ratio = torch.div(p, pe, out=pe)
        c_h = p_log_pe + torch.linalg.vecdot(p, ratio)
        del ratio, pe
        pp = torch.linalg.vecdot(p, p)
        h_term, kl_term, c_kl = -p_log_pe, pp - pq, 2.0 * pp - pq
    else:
        h_term, c_h, kl_term, c_kl = entropy, -entropy, kl, kl
    return {"entropy": entropy, "kl": kl, "h_term": h_term, "kl_term": kl_term, "c_h": c_h, "c_kl": c_kl, "lse_r": lse_r}


def _top(values: torch.Tensor, candidates: torch.Tensor, k: int) -> torch.Tensor:
    """The `k` candidates of largest value, as a mask.

    Ranked by the value rounded to a multiple of `TIE_QUANTUM`, earlier positions first among equal keys (a stable
    sort): values equal in exact arithmetic but not in floating point (the same row's statistics from another chunk
    size, whose product with the head rounds differently, or from the other backend's formula: ~1e-6 apart in float32)
    then rank alike everywhere, so that the same rows are selected for the same inputs whatever the chunk size and
    backend. `torch.topk`, which the authors call, leaves the order of ties unspecified."""
    key = torch.round(values.double() / TIE_QUANTUM) + 0.0  # + 0.0: -0.0 is 0.0 for every sort (CUDA's radix sort)
    ranked = torch.where(candidates, key, torch.full_like(key, -math.inf))
    chosen = torch.sort(ranked, descending=True, stable=True).indices[:k]
    mask = torch.zeros_like(candidates)
    mask[chosen] = True
    return mask


def _lambda(base: float, term: float, target: float, above: bool) -> float:
    """The authors' λ for this micro-batch: the configured value × 1.05 or × 0.95 (never carried to the next one)."""
    wrong_side = term > target if above else term < target
    return base * (LAMBDA_UP if wrong_side else LAMBDA_DOWN)


@torch.no_grad()
def plan_rows(
    stats: dict[str, torch.Tensor], hp: dict, vocab: int, roles: RowTensors | None = None,
    token_weights: RowTensors | None = None,
) -> RowTensors:
    """The selection of one micro-batch and the per-row weights that turn it into the loss (see the module docstring).

    `roles`: which rows are target positions and which are label rows (`LossSpec.label_rows`); without it every row is
    a target and its own candidate (the paper's alignment, and the authors' formula on rows given without their
    neighbours). `token_weights`: the per-token loss weights (`registry.TOKEN_WEIGHTS`), None for all 1."""
    formula, ratio = hp["formula"], hp["ratio"]
    n = stats["entropy"].shape[0]
    device = stats["entropy"].device
    dtype = stats["entropy"].dtype
    target = torch.ones(n, dtype=torch.bool, device=device) if roles is None else roles["target"].bool()
    shifted = roles is not None and formula == "authors"
    candidates = roles["label"].bool() if shifted else target
    # Each row's weight as a target (`w_t`) and as a candidate (`w_c`: its label token's with the authors' formula).
    w_t = w_c = None
    if token_weights is not None:
        w_t = token_weights["target"].to(dtype) * target
        w_c = token_weights["label"].to(dtype) if shifted else w_t
        candidates = candidates & (w_c > 0)
    # The authors' `int(total_valid_tokens * top_k_ratio)` (trainer.py T:311-313): a Python int times a float, so a
    # product that rounds just below an integer gives one less than ⌊ratio·N⌋ (0.7 · 90 = 62.99999999999999 → 62).
    k = max(0, int(int(candidates.sum()) * ratio))
    if k > 0:
        sel_h = _top(stats["entropy"], candidates, k)
        sel_kl = _top(stats["kl"], candidates, k)
        dropped = sel_h | sel_kl if hp["mode"] == "union" else sel_h & sel_kl
    else:
        sel_h = sel_kl = dropped = torch.zeros(n, dtype=torch.bool, device=device)
    if shifted:
        # A selected label row drops the cross-entropy of the target row before it (the authors' off-by-one): rows
        # are in position order, and a target position's label row is always the next row.
        dropped = torch.cat([dropped[1:], dropped.new_zeros(1)]) & target
    keep = target & ~dropped
    lam_h, lam_kl = float(hp["lambda_entropy"]), float(hp["lambda_kl"])
    log_v = log_vocab(vocab, formula)
    use_h = k > 0 and lam_h > 0
    use_kl = k > 0 and lam_kl > 0
    # Unweighted: counts (ints), each set's mask as is. Weighted: sums of weights, each mask times its weights (for
    # weights of 1 the same numbers: whole floats, and products by 1).
    if w_t is None:
        tokens, kept, n_h, n_kl = int(target.sum()), int(keep.sum()), k, k
        m_ce, m_h, m_kl = keep.to(dtype), sel_h.to(dtype), sel_kl.to(dtype)
    else:
        m_ce, m_h, m_kl = keep.to(dtype) * w_t, sel_h.to(dtype) * w_c, sel_kl.to(dtype) * w_c
        tokens, kept, n_h, n_kl = (float(x.sum()) for x in (w_t, m_ce, m_h, m_kl))
    if formula == "authors":
        entropy_loss = float((stats["h_term"] * m_h).sum()) / log_v / (n_h + COUNT_EPS) if use_h else 0.0
        kl_loss = float((stats["kl_term"] * m_kl).sum()) / (n_kl + COUNT_EPS) if use_kl else 0.0
        lam_h = _lambda(lam_h, entropy_loss, hp["target_entropy"], above=False)
        lam_kl = _lambda(lam_kl, kl_loss, hp["target_kl"], above=True)
    w_ce = m_ce * (tokens / kept) if kept else torch.zeros(n, dtype=dtype, device=device)
    w_h = m_h * (lam_h * tokens / (n_h + COUNT_EPS) / log_v) if use_h else torch.zeros_like(w_ce)
    w_kl = m_kl * (lam_kl * tokens / (n_kl + COUNT_EPS)) if use_kl else torch.zeros_like(w_ce)

    def at_targets(flags: torch.Tensor) -> torch.Tensor:
        # Logged per target token: the authors' selection is on the row after it.
        flags = flags.to(dtype)
        return (torch.cat([flags[1:], flags.new_zeros(1)]) if shifted else flags) * target

    tensors = {
        "w_ce": w_ce, "w_h": w_h, "w_kl": w_kl,
        **{name: stats[name].to(dtype) for name in ("h_term", "kl_term", "c_h", "c_kl", "lse_r")},
        "eksft_dropped": (dropped & target).to(dtype),
        "eksft_entropy_selected": at_targets(sel_h),
        "eksft_kl_selected": at_targets(sel_kl),
        "eksft_overlap": at_targets(sel_h & sel_kl),
        "eksft_kl": at_targets(stats["kl"]),
    }
    return RowTensors(tensors)


def _reference_logits(reference, like: torch.Tensor) -> torch.Tensor:
    if reference is None:
        raise ValueError("EKSFT needs the reference model's logits or hidden states (eksft_ratio > 0).")
    logits = reference.logits() if isinstance(reference, ReferenceHead) else upcast(reference)
    return logits.detach().to(like.dtype)


# -- the logits path (the reference implementation) -------------------------------------------------------------------


def per_token(logits, targets, ratio, lambda_entropy, lambda_kl, mode, formula, target_entropy, target_kl,
              reference=None, roles=None, token_weights=None):
    """Per row: `w_ce (−log p_y) − w_H H_term + w_KL KL_term`, the weights from this call's rows (one micro-batch),
    the terms through autograd. `reference`: the reference logits (logits path) or a `ReferenceHead`; `roles`,
    `token_weights`: see `plan_rows`."""
    hp = {"ratio": ratio, "lambda_entropy": lambda_entropy, "lambda_kl": lambda_kl, "mode": mode, "formula": formula,
          "target_entropy": target_entropy, "target_kl": target_kl}
    check_choice("eksft formula", formula, FORMULAS)
    z = upcast(logits)
    logp = torch.log_softmax(z, dim=-1)
    nll = -logp.gather(-1, targets[:, None]).squeeze(-1)
    if ratio == 0 or z.shape[0] == 0:
        return nll if token_weights is None else nll * token_weights["target"].to(nll.dtype)
    zr = _reference_logits(reference, z)
    weights = plan_rows(row_statistics(z.detach(), zr, formula), hp, z.shape[-1], roles, token_weights)
    p = logp.exp()
    logq = torch.log_softmax(zr, dim=-1)
    if formula == "authors":
        h_term = -(p * torch.log(p + ENTROPY_EPS)).sum(-1)
        kl_term = (p * (p - logq).clamp(-1e10, 1e10)).sum(-1)
    else:
        h_term = -(p * logp).sum(-1)
        kl_term = (p * (logp - logq)).sum(-1)
    return weights["w_ce"] * nll - weights["w_h"] * h_term + weights["w_kl"] * kl_term


# -- the fused path ---------------------------------------------------------------------------------------------------


def prepare(statistics, hparams: dict) -> dict:
    """The first pass: per-row statistics over every chunk, the selection, the weights (`LossSpec.prepare`)."""
    if hparams["ratio"] == 0:
        return {**hparams, "weights": None}
    reference = hparams.get("reference")
    if reference is None:
        raise ValueError("EKSFT needs the reference model's hidden states (eksft_ratio > 0).")
    n, vocab = statistics.n_rows, statistics.vocab
    formula = hparams["formula"]
    if statistics.backend == "triton":
        stats = _triton_statistics(statistics, reference, formula)
    else:
        parts = []
        for start, end in statistics.chunks():
            z = statistics.logits(start, end)
            zr = reference.rows(start, end).logits().to(z.dtype)
            parts.append(row_statistics(z, zr, formula))
        stats = {name: torch.cat([part[name] for part in parts]) for name in parts[0]} if parts else {}
    roles = hparams.get(ROLES)
    weights = plan_rows(stats, hparams, vocab, roles if isinstance(roles, RowTensors) else None,
                        hparams.get(TOKEN_WEIGHTS))
    assert weights["w_ce"].shape[0] == n
    return {**hparams, "weights": weights}


def chunk(z, targets, want_grad, ratio, lambda_entropy, lambda_kl, mode, formula, target_entropy, target_kl,
          reference=None, roles=None, weights=None, token_weights=None):
    s = softmax_stats(z, targets)
    if weights is None:  # eksft_ratio = 0: cross-entropy, nothing selected
        grad = None
        if want_grad:
            grad = s.p
            grad[s.rows, targets] -= 1.0
        zero = torch.zeros_like(s.nll)
        values = s.nll.clone()
        if token_weights is not None:
            w = token_weights["target"].to(values.dtype)
            values.mul_(w)
            if grad is not None:
                grad.mul_(w[:, None])
        return s.result(values, grad, **{m: zero for m in METRICS})
    w_ce, w_h, w_kl = weights["w_ce"], weights["w_h"], weights["w_kl"]
    values = w_ce * s.nll - w_h * weights["h_term"] + w_kl * weights["kl_term"]
    grad = None
    if want_grad:
        # Cross-entropy's part on every row, then the regularizers' on the selected rows only (a ratio of them): there
        # −w_H ∂H_term + w_KL ∂KL_term, with ∂H_term/∂z_j = −p_j (g_j − c_H) and ∂KL_term/∂z_j = p_j (a_j − c_KL): the
        # paper's g = log p, a = log p − log q; the authors' g = log(p + ε) + p / (p + ε), a = 2p − log q. The
        # reference's logits are built for those rows alone.
        selected = ((w_h != 0) | (w_kl != 0)).nonzero().squeeze(-1)
        extra = None
        if selected.numel():
            p = s.p[selected]
            logq = _reference_logits(_rows_of(reference, selected), z)
            logq -= weights["lse_r"][selected, None]
            if formula == "authors":
                pe = p + ENTROPY_EPS
                g = torch.log(pe).add_(torch.div(p, pe, out=pe))
                del pe
                a = logq.clamp_(-1e10, 1e10).neg_().add_(p, alpha=2.0)
            else:
                g = s.logp[selected]
                a = g - logq
            del logq
            g.sub_(weights["c_h"][selected, None]).mul_(w_h[selected, None])
            a.sub_(weights["c_kl"][selected, None]).mul_(w_kl[selected, None])
            extra = g.add_(a).mul_(p)
            del a, p
        grad = s.p.mul_(w_ce[:, None])
        grad[s.rows, targets] -= w_ce
        if extra is not None:
            grad.index_add_(0, selected, extra)
    return s.result(values, grad, **{m: weights[m] for m in METRICS})


def _rows_of(reference, rows: torch.Tensor):
    """The reference restricted to some rows of the chunk (a `ReferenceHead`, or logits on the logits path)."""
    if isinstance(reference, ReferenceHead):
        return replace(reference, hidden=reference.hidden[rows])
    return reference[rows]


@triton.jit
def _statistics(
    Z, z_stride, BIAS, R, r_stride, OUT, out_stride, V, logit_scale, softcap, ref_scale, ref_softcap, eps,
    AUTHORS: tl.constexpr, HAS_REF_SOFTCAP: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, BLOCK: tl.constexpr,
):
    # One row of the first pass: H and KL(p || q) in one read of both rows (sums relative to the running maxima),
    # and, for the authors' formula, a second read for Σ p log(p + ε), Σ p², Σ p log q.
    row = tl.program_id(0).to(tl.int64)
    Z_row = Z + row * z_stride
    R_row = R + row * r_stride
    m = -1.0e30
    s = 0.0
    t = 0.0
    v = 0.0  # Σ e (z - z_r)
    m_r = -1.0e30
    s_r = 0.0
    for off in range(0, V, BLOCK):
        offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
        zr = load_logits(R_row, BIAS, offs, mask, ref_scale, ref_softcap, False, HAS_REF_SOFTCAP)
        m_new = tl.maximum(m, tl.max(z, 0))
        alpha = tl.exp(m - m_new)
        e = tl.exp(z - m_new)
        t = alpha * (t + s * (m - m_new)) + tl.sum(e * (z - m_new), 0)
        s = alpha * s + tl.sum(e, 0)
        v = alpha * v + tl.sum(e * (z - zr), 0)
        m = m_new
        mr_new = tl.maximum(m_r, tl.max(zr, 0))
        s_r = tl.exp(m_r - mr_new) * s_r + tl.sum(tl.exp(zr - mr_new), 0)
        m_r = mr_new
    log_s = tl.log(s)
    lse = m + log_s
    lse_r = m_r + tl.log(s_r)
    entropy = log_s - t / s
    # KL = Σ p (z − z_r) − (lse − lse_r), the difference of the normalizers taken as (m − m_r) + log(s / s_r): exactly
    # 0 for identical rows (as the PyTorch path), and without the rounding of two large log-normalizers for close ones.
    kl = v / s - (m - m_r) - tl.log(s / s_r)
    if AUTHORS:
        p_log_pe = 0.0
        p_g = 0.0
        pp = 0.0
        pq = 0.0
        for off in range(0, V, BLOCK):
            offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
            zr = load_logits(R_row, BIAS, offs, mask, ref_scale, ref_softcap, False, HAS_REF_SOFTCAP)
            p = tl.exp(z - lse)
            pe = p + eps
            log_pe = tl.log(pe)
            p_log_pe += tl.sum(p * log_pe, 0)
            p_g += tl.sum(p * (log_pe + p / pe), 0)
            pp += tl.sum(p * p, 0)
            pq += tl.sum(p * (zr - lse_r), 0)
        h_term = -p_log_pe
        kl_term = pp - pq
        c_h = p_g
        c_kl = 2.0 * pp - pq
    else:
        h_term = entropy
        kl_term = kl
        c_h = -entropy
        c_kl = kl
    tl.store(OUT + row, entropy)
    tl.store(OUT + out_stride + row, kl)
    tl.store(OUT + 2 * out_stride + row, h_term)
    tl.store(OUT + 3 * out_stride + row, kl_term)
    tl.store(OUT + 4 * out_stride + row, c_h)
    tl.store(OUT + 5 * out_stride + row, c_kl)
    tl.store(OUT + 6 * out_stride + row, lse_r)


_STAT_NAMES = ("entropy", "kl", "h_term", "kl_term", "c_h", "c_kl", "lse_r")


def _reference_chunk(reference: ReferenceHead, out: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """The reference's raw logits `h_r W_r^T + b_r` of rows `start:end` into `out` (compute dtype)."""
    r = out[: end - start]
    torch.mm(reference.hidden[start:end].to(r.dtype), reference.weight_as(r.dtype).t(), out=r)
    if reference.bias is not None:
        r.add_(reference.bias.to(r.dtype))
    return r


def _launch_statistics(launch: RowLaunch, reference: ReferenceHead, r: torch.Tensor, out: torch.Tensor, formula: str):
    meta = launch.meta("eksft_statistics")  # BLOCK and warps of its own; it writes no gradient
    _statistics[(launch.rows,)](
        launch.z, launch.z.stride(0), launch.bias if launch.bias is not None else out, r, r.stride(0), out,
        out.stride(0), launch.vocab, float(launch.logit_scale),
        float(launch.softcap) if launch.softcap is not None else 1.0, float(reference.logit_scale),
        float(reference.softcap) if reference.softcap is not None else 1.0, ENTROPY_EPS,
        AUTHORS=formula == "authors", HAS_REF_SOFTCAP=reference.softcap is not None,
        HAS_BIAS=launch.bias is not None, HAS_SOFTCAP=launch.softcap is not None,
        **{key: meta[key] for key in ("BLOCK", "num_warps") if key in meta},
    )


def _triton_statistics(statistics, reference: ReferenceHead, formula: str) -> dict[str, torch.Tensor]:
    n, vocab = statistics.n_rows, statistics.vocab
    device, cd = statistics.hidden.device, statistics.compute_dtype
    rows = statistics.chunk_size
    buffer = torch.empty(min(rows, n), vocab, device=device, dtype=cd)
    scratch = torch.empty(min(rows, n), vocab, device=device, dtype=cd)
    out = torch.empty(len(_STAT_NAMES), n, device=device, dtype=torch.float32)
    for start, end in statistics.chunks():
        z = statistics.raw_logits(start, end, buffer)
        r = _reference_chunk(reference, scratch, start, end)
        launch = RowLaunch(
            z=z, targets=statistics.targets[start:end], target_logits=z.new_zeros(0, dtype=torch.float32),
            bias=statistics.bias, stats=out[:, start:end], grad_scale=z.new_ones(1, dtype=torch.float32),
            logit_scale=statistics.transform.logit_scale, softcap=statistics.transform.softcap, write_grad=False,
        )
        _launch_statistics(launch, reference, r, out[:, start:end], formula)
    return {name: out[i] for i, name in enumerate(_STAT_NAMES)}


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap,
    R, r_stride, ref_scale, ref_softcap, W, w_stride, eps,
    AUTHORS: tl.constexpr, HAS_REF_SOFTCAP: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    # The second pass, one row: W holds the row's weights and first-pass sums (rows of WEIGHT_FIELDS).
    row = tl.program_id(0).to(tl.int64)
    Z_row = Z + row * z_stride
    R_row = R + row * r_stride
    y = tl.load(Y + row)
    z_y = tl.load(ZY + row)
    w_ce = tl.load(W + row)
    w_h = tl.load(W + w_stride + row)
    w_kl = tl.load(W + 2 * w_stride + row)
    lse, entropy, idx = softmax_pass(Z_row, BIAS, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
    nll = lse - z_y
    value = w_ce * nll - w_h * tl.load(W + 3 * w_stride + row) + w_kl * tl.load(W + 4 * w_stride + row)
    store_stats(STATS, stats_stride, row, value, nll, entropy, (idx == y).to(tl.float32))
    if WRITE_GRAD:
        grad_scale = tl.load(GRAD_SCALE)
        c_h = tl.load(W + 5 * w_stride + row)
        c_kl = tl.load(W + 6 * w_stride + row)
        lse_r = tl.load(W + 7 * w_stride + row)
        for off in range(0, V, BLOCK):
            offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
            p = tl.exp(z - lse)
            g = w_ce * (p - tl.where(offs == y, 1.0, 0.0))
            if w_h != 0.0:
                if AUTHORS:
                    pe = p + eps
                    gj = tl.log(pe) + p / pe
                else:
                    gj = z - lse
                g += w_h * p * (gj - c_h)
            if w_kl != 0.0:
                zr = load_logits(R_row, BIAS, offs, mask, ref_scale, ref_softcap, False, HAS_REF_SOFTCAP)
                log_q = zr - lse_r
                if AUTHORS:
                    a = 2.0 * p - log_q
                else:
                    a = z - lse - log_q
                g += w_kl * p * (a - c_kl)
            store_grad(Z_row, offs, mask, g, z, grad_scale, logit_scale, softcap, HAS_SOFTCAP)


def rows(launch: RowLaunch, ratio, lambda_entropy, lambda_kl, mode, formula, target_entropy, target_kl,
         reference=None, roles=None, weights=None, token_weights=None):
    """The loss pass of one chunk (`weights` from `prepare`); without `weights`, the first pass's statistics of the
    chunk, written into `launch.stats` (how `prepare` and the ahead-of-time compile launch `_statistics`)."""
    if weights is None and ratio == 0:
        nll_rows(launch)
        launch.stats[4 : 4 + len(METRICS)].zero_()
        if token_weights is not None:  # plain cross-entropy, weighted (a pass over the chunk, for this case only)
            w = token_weights["target"].to(torch.float32)
            launch.stats[0].mul_(w)
            if launch.write_grad:
                launch.z.mul_(w[:, None])
        return
    # The chunk's reference logits (this chunk's rows of `reference`) into the loss's extra buffer.
    r = _reference_chunk(reference, launch.scratch, 0, launch.rows)
    if weights is None:
        _launch_statistics(launch, reference, r, launch.stats, formula)
        return
    table = torch.stack([weights[name].to(torch.float32) for name in WEIGHT_FIELDS])
    _rows[(launch.rows,)](
        *launch.args(), r, r.stride(0), float(reference.logit_scale),
        float(reference.softcap) if reference.softcap is not None else 1.0, table, table.stride(0), ENTROPY_EPS,
        AUTHORS=formula == "authors", HAS_REF_SOFTCAP=reference.softcap is not None, **launch.meta("eksft"),
    )
    for i, name in enumerate(METRICS):
        launch.stats[4 + i].copy_(weights[name])


LOSS = LossSpec(
    name="eksft",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    scratch_rows=1.0,
    config_fields={
        "ratio": "eksft_ratio", "lambda_entropy": "eksft_lambda_entropy", "lambda_kl": "eksft_lambda_kl",
        "mode": "eksft_mode", "formula": "eksft_formula", "target_entropy": "eksft_target_entropy",
        "target_kl": "eksft_target_kl",
    },
    # The authors' script (examples/example_eksft/eksft.sh): ratio 0.2, λ 0.05 / 0.05, union. Their code's defaults
    # differ (λ 1.0 / 0.5, intersection); the README calls the script's values the defaults. The λ targets are only
    # read by the authors' formula.
    defaults={"ratio": 0.2, "lambda_entropy": 0.05, "lambda_kl": 0.05, "mode": "union", "formula": "paper",
              "target_entropy": 0.5, "target_kl": 2.0},
    validate=check,
    description="EKSFT: cross-entropy without the top-ratio tokens by entropy and by KL to a reference, with an "
    "entropy bonus and a KL penalty on them (arXiv 2605.29303)",
    metrics=METRICS,
    needs_reference=lambda hp: hp["ratio"] != 0,
    reference_field="eksft_ref_model",
    prepare=prepare,
    prepared_rows=WEIGHT_FIELDS + METRICS,
    # Its selections and per-set means are no sum of per-token terms: it takes per-token weights itself.
    token_weights="loss",
    # Only a selection reads the label rows; with ratio 0 they would be scored as targets of token 0.
    label_rows=lambda hp: hp["formula"] == "authors" and hp["ratio"] != 0,
)
