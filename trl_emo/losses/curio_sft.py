"""CurioSFT (Wang et al., arXiv 2602.02244): cross-entropy plus a pull toward a lagged copy of the model, read at a
per-token temperature chosen from that copy's own entropy.

Per target token, with the teacher's logits `z_t` (a lagged copy of the policy, see below):

    τ     = the temperature in [τ_min, τ_max] at which the entropy of softmax(top-k(z_t) / τ) reaches
            H* = H + ½ σ(2 (H − 1.2)),  H that entropy at τ = 1 (20 bisection steps);  τ_min where the full-vocabulary
            entropy of softmax(z_t) is ≤ 0.03
    r     = log softmax(z_t / τ)_y                      (the teacher's target log-probability at τ, a constant)
    ℓ     = −log p_y + α/2 (log p_y − r)²
    ∂ℓ/∂z = (1 − α (log p_y − r)) (p − e_y)

As `HaoooWang/CurioSFT` at 5a77394 computes it: the loss `custom_loss` with `algo_type="curio_sft"`
(`custom_verl/recipe/curio_sft/ppo/core_algos.py` L758-777, α fixed at 1 there), the teacher's log-probabilities from
its worker with `use_adaptive_tau` (`recipe/curio_sft/dp_actor.py` L201-206: `compute_tau_from_logits` at τ ∈ [1.1, 1.5]
on the top 512 logits, L544-595, then the floor on the full entropy, then `logits / τ`), token-mean over the response.
The teacher starts as the starting model and every 5 optimizer steps becomes `0.01 · teacher + 0.99 · policy`
(`recipe/curio_sft/fsdp_workers.py` L843-857, `ref_model_sync_steps: 5`, `ref_model_mixup_alpha: 0.99` in
`scripts/1_sft.sh`); the trainer keeps it (`LossSpec.lagged_reference`, `training/lagged_policy.py`) and hands the loss
its hidden states and head (`reference`), or nothing while it equals the policy (before the first optimizer step), when
the teacher's logits are the policy's own.

The temperature search reads the teacher only (no gradient): one pass per chunk of the teacher's logits (`prepare`)
takes their top-k with `torch.topk`, runs the bisection on those `[n, k]` values in PyTorch, the same code on both
backends (so every comparison of the search is decided alike given the same logits), and reduces each row over the
vocabulary for the full entropy and the log-normalizers at τ and τ_min (PyTorch per chunk on the CPU path, a Triton
statistics kernel on the GPU path); `r` follows. The loss pass is cross-entropy's two reads of each row with the
per-row weight `1 − α (log p_y − r)`.
"""

from __future__ import annotations

import math

import torch

from ._common import ce_grad_, check_number, check_positive_int, log_softmax, softmax_stats, target_log_prob, upcast
from ._triton import (
    RowLaunch,
    logits_block,
    register_launch_config,
    row_inputs,
    softmax_pass,
    softmax_sums,
    store_stats,
    tl,
    top_logits,
    triton,
    weighted_ce_grad,
)
from .asft import ReferenceHead
from .registry import LossSpec, RowTensors

# `compute_tau_from_logits` (dp_actor.py L544-595): the target entropy H* = H + SCALE · σ(SLOPE · (H − CENTER)), and
# the number of bisection steps.
TARGET_CENTER, TARGET_SLOPE, TARGET_SCALE = 1.2, 2.0, 0.5
BISECTION_STEPS = 20
# dp_actor.py L205: rows whose full-vocabulary entropy (at τ = 1) is at most this take τ_min.
ENTROPY_FLOOR = 0.03
METRICS = ("curio_tau", "curio_kd")
WEIGHT_FIELDS = ("ref_lp", "tau")
# The kernels' launch configurations, chosen as `_triton.LAUNCH_CONFIGS`' (2,048 columns x 4 warps on every target:
# 56-72 registers, no spill, 7-9 programs per SM by `python -m trl_emo.losses.aot_compile --losses curio_sft`).
for _kernel in ("curio_sft", "curio_sft_statistics"):
    register_launch_config(_kernel, {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)})


def check(hp: dict) -> None:
    check_number("curio_alpha", hp["alpha"], 0.0, math.inf)
    check_number("curio_tau_min", hp["tau_min"], 0.0, math.inf, low_open=True)
    check_number("curio_tau_max", hp["tau_max"], float(hp["tau_min"]), math.inf)
    check_positive_int("curio_topk", hp["topk"])
    check_positive_int("curio_teacher_sync_steps", hp["teacher_sync_steps"])
    check_number("curio_teacher_mixup_alpha", hp["teacher_mixup_alpha"], 0.0, 1.0)


# -- the teacher's temperature and target log-probability (no gradient) ----------------------------------------------


def _entropies(x: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(x / τ) per row, `x` a row's values minus its max (`[n, k]`, all ≤ 0), `τ` per row `[n]`:
    `log Σ e − Σ e·x / (τ Σ e)` with `e = exp(x / τ)`, three passes over the values where a log-softmax takes more."""
    e = torch.exp(x / tau[:, None])
    total = e.sum(dim=-1)
    return torch.log(total) - torch.linalg.vecdot(e, x) / (tau * total)


@torch.no_grad()
def temperatures(top: torch.Tensor, tau_min: float, tau_max: float) -> torch.Tensor:
    """Per row of the teacher's top-k logits `[n, k]` (in any float dtype), the authors' bisection iterate: the bracket
    starts at `[τ_min, τ_max]` (τ pinned at an end when the target entropy `H*` lies beyond it) and is halved 20 times
    toward the τ at which the top-k entropy reaches `H*`, comparing as theirs (`<=`, `>=`, `<`).

    A row pinned for good (`H* ≤ H(τ_min)`: every step keeps τ_min; `H* > H(τ_max)`: every step keeps τ_max) skips the
    20 steps, whose result is then exactly its start; the others run them. The same values in the same order give the
    same comparisons on both backends; against their log-softmax, the entropy here differs by rounding only."""
    n = top.shape[0]
    like = dict(device=top.device, dtype=top.dtype)
    x = top - top.max(dim=-1, keepdim=True).values
    h_now = _entropies(x, torch.ones(n, **like))
    h_star = h_now + torch.sigmoid((h_now - TARGET_CENTER) * TARGET_SLOPE) * TARGET_SCALE
    lo = torch.full((n,), tau_min, **like)
    hi = torch.full((n,), tau_max, **like)
    h_lo, h_hi = _entropies(x, lo), _entropies(x, hi)
    low = h_star <= h_lo
    high = ~low & (h_star >= h_hi)
    tau = torch.where(low, lo, torch.where(high, hi, (lo + hi) / 2))
    # `H* = H(τ_max)` exactly is not pinned: their first step then halves the bracket from τ_max.
    searched = ~low & ~(high & (h_hi < h_star))
    # The ahead-of-time compile records the launches on meta tensors, which have shapes only: every row there.
    searched = torch.arange(n, device=top.device) if top.is_meta else searched.nonzero().squeeze(-1)
    if searched.numel():
        xs, target, t, lo, hi = x[searched], h_star[searched], tau[searched], lo[searched], hi[searched]
        for _ in range(BISECTION_STEPS):
            go_up = _entropies(xs, t) < target
            lo = torch.where(go_up, t, lo)
            hi = torch.where(go_up, hi, t)
            t = (lo + hi) / 2
        tau[searched] = t
    return tau


@torch.no_grad()
def teacher_rows(zt: torch.Tensor, targets: torch.Tensor, tau_min: float, tau_max: float, topk: int) -> RowTensors:
    """`r` (`ref_lp`) and τ (`tau`) per row from the teacher's transformed logits `[n, V]` (the PyTorch path)."""
    top = zt.topk(min(topk, zt.shape[-1]), dim=-1).values
    tau = temperatures(top, tau_min, tau_max)
    logp = torch.log_softmax(zt, dim=-1)
    floor = -torch.linalg.vecdot(logp.exp(), logp) <= ENTROPY_FLOOR
    del logp
    tau = torch.where(floor, torch.full_like(tau, tau_min), tau)
    ref_lp = target_log_prob(torch.log_softmax(zt / tau[:, None], dim=-1), targets)
    return RowTensors({"ref_lp": ref_lp, "tau": tau})


def _teacher_logits(reference, policy_logits: torch.Tensor) -> torch.Tensor:
    """The teacher's logits: the reference's (logits, or a `ReferenceHead`), or the policy's own when it is None."""
    if reference is None:
        return policy_logits.detach()
    logits = reference.logits() if isinstance(reference, ReferenceHead) else upcast(reference)
    return logits.detach().to(policy_logits.dtype)


# -- the logits path (the reference implementation) -------------------------------------------------------------------


def per_token(logits, targets, alpha, tau_min, tau_max, topk, teacher_sync_steps, teacher_mixup_alpha, reference=None):
    """`−log p_y + α/2 (log p_y − r)²` per position, through autograd. `reference`: the teacher's logits `[N, V]`
    (logits path) or `ReferenceHead`; None: the teacher is the policy itself. The teacher's schedule
    (`teacher_sync_steps`, `teacher_mixup_alpha`) is the trainer's, not read here."""
    z = upcast(logits)
    logp = target_log_prob(log_softmax(z), targets)
    ref_lp = teacher_rows(_teacher_logits(reference, z), targets, tau_min, tau_max, topk)["ref_lp"]
    return -logp + alpha * 0.5 * (logp - ref_lp) ** 2


# -- the fused path ---------------------------------------------------------------------------------------------------


def prepare(statistics, hparams: dict) -> dict:
    """The teacher pass (`LossSpec.prepare`): `r` and τ of every row, chunk by chunk."""
    reference = hparams.get("reference")
    args = (hparams["tau_min"], hparams["tau_max"], hparams["topk"])
    if statistics.backend == "triton":
        return {**hparams, "weights": _triton_teacher_rows(statistics, reference, *args)}
    parts = []
    for start, end in statistics.chunks():
        zt = reference.rows(start, end).logits() if reference is not None else statistics.logits(start, end)
        parts.append(teacher_rows(zt, statistics.targets[start:end], *args))
        del zt
    return {**hparams, "weights": RowTensors({k: torch.cat([p[k] for p in parts]) for k in WEIGHT_FIELDS})}


def chunk(z, targets, want_grad, alpha, tau_min, tau_max, topk, teacher_sync_steps, teacher_mixup_alpha,
          reference=None, weights=None):
    if weights is None:  # called without the teacher pass: the teacher's rows from the chunk's own logits
        weights = teacher_rows(_teacher_logits(reference, z), targets, tau_min, tau_max, topk)
    s = softmax_stats(z, targets)
    diff = -s.nll - weights["ref_lp"].to(z.dtype)
    kd = alpha * 0.5 * diff**2
    grad = ce_grad_(s, targets).mul_((1.0 - alpha * diff)[:, None]) if want_grad else None
    return s.result(s.nll + kd, grad, curio_tau=weights["tau"].to(z.dtype), curio_kd=kd)


@triton.jit
def _statistics(
    Z, z_stride, BIAS, TAU, OUT, out_stride, V, logit_scale, softcap, tau_min,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, BLOCK: tl.constexpr,
):
    # One teacher row in one read: its entropy at τ = 1 and its log-normalizers at τ and at τ_min, all relative to the
    # one running max m (the max of z / τ is m / τ).
    row = tl.program_id(0).to(tl.int64)
    Z_row = Z + row * z_stride
    tau = tl.load(TAU + row)
    m = -1.0e30
    s = 0.0
    t = 0.0
    s_tau = 0.0
    s_min = 0.0
    for off in range(0, V, BLOCK):
        offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
        m_new = tl.maximum(m, tl.max(z, 0))
        s_tau = tl.exp((m - m_new) / tau) * s_tau + tl.sum(tl.exp((z - m_new) / tau), 0)
        s_min = tl.exp((m - m_new) / tau_min) * s_min + tl.sum(tl.exp((z - m_new) / tau_min), 0)
        s, t, _ = softmax_sums(m, m_new, s, t, z)
        m = m_new
    tl.store(OUT + row, tl.log(s) - t / s)
    tl.store(OUT + out_stride + row, m / tau + tl.log(s_tau))
    tl.store(OUT + 2 * out_stride + row, m / tau_min + tl.log(s_min))


def _launch_statistics(launch: RowLaunch, tau: torch.Tensor, out: torch.Tensor, tau_min: float) -> None:
    meta = launch.meta("curio_sft_statistics")  # it writes no gradient
    _statistics[(launch.rows,)](
        launch.z, launch.z.stride(0), launch.bias if launch.bias is not None else out, tau, out, out.stride(0),
        launch.vocab, float(launch.logit_scale), float(launch.softcap) if launch.softcap is not None else 1.0,
        float(tau_min), HAS_BIAS=launch.bias is not None, HAS_SOFTCAP=launch.softcap is not None,
        **{key: meta[key] for key in ("BLOCK", "num_warps") if key in meta},
    )


def _launch_teacher_rows(launch: RowLaunch, tau_min: float, tau_max: float, topk: int) -> RowTensors:
    """`r` and τ of the rows of one teacher chunk (`launch.z`: its raw logits, `launch.target_logits`: its transformed
    `z_y` in float32, `launch.scratch`: a buffer for the top-k with a bias)."""
    top = top_logits(launch, min(topk, launch.vocab))
    tau = temperatures(top, tau_min, tau_max)
    del top
    out = torch.empty(3, launch.rows, device=launch.z.device, dtype=torch.float32)
    _launch_statistics(launch, tau, out, tau_min)
    floor = out[0] <= ENTROPY_FLOOR
    tau = torch.where(floor, torch.full_like(tau, tau_min), tau)
    lse = torch.where(floor, out[2], out[1])
    return RowTensors({"ref_lp": launch.target_logits / tau - lse, "tau": tau})


def _triton_teacher_rows(statistics, reference, tau_min, tau_max, topk) -> RowTensors:
    """The teacher pass on the GPU path: the teacher's chunk in the compute dtype (the reference's product, or the
    policy's own), then `_launch_teacher_rows`."""
    from .fused import HeadTransform, _target_logits

    n, vocab = statistics.n_rows, statistics.vocab
    device, cd = statistics.hidden.device, statistics.compute_dtype
    rows = min(statistics.chunk_size, n)
    buffer = torch.empty(rows, vocab, device=device, dtype=cd)
    if reference is None:
        hidden, weight, bias, transform = statistics.hidden, statistics.weight.to(cd), statistics.bias, statistics.transform
    else:
        hidden, weight, bias = reference.hidden, reference.weight_as(cd), reference.bias
        transform = HeadTransform(reference.logit_scale, reference.softcap)
    # `top_logits` adds a bias in a part of the chunk at a time.
    scratch = torch.empty(min(rows, 64), vocab, device=device, dtype=cd) if bias is not None else None
    out = {name: torch.empty(n, device=device, dtype=torch.float32) for name in WEIGHT_FIELDS}
    for start, end in statistics.chunks():
        targets = statistics.targets[start:end]
        if reference is None:  # the policy's own chunk, as the loss pass builds it (a LoRA head's term included)
            z = statistics.raw_logits(start, end, buffer)
            target_logits = statistics.target_logits(start, end)
        else:
            h = hidden[start:end].to(cd)
            z = buffer[: end - start]
            torch.mm(h, weight.t(), out=z)
            target_logits = _target_logits(h, weight, bias, targets, transform)
        launch = RowLaunch(
            z=z, targets=targets, target_logits=target_logits, bias=bias,
            stats=z.new_empty(0, dtype=torch.float32), grad_scale=z.new_ones(1, dtype=torch.float32),
            logit_scale=transform.logit_scale, softcap=transform.softcap, write_grad=False, scratch=scratch,
        )
        part = _launch_teacher_rows(launch, tau_min, tau_max, topk)
        for name in WEIGHT_FIELDS:
            out[name][start:end] = part[name]
    return RowTensors(out)


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap, REF_LP, alpha,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    row, Z_row, y, z_y = row_inputs(Z, z_stride, Y, ZY)
    lse, entropy, idx = softmax_pass(Z_row, BIAS, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
    nll = lse - z_y
    diff = -nll - tl.load(REF_LP + row)
    kd = alpha * 0.5 * diff * diff
    store_stats(STATS, stats_stride, row, nll + kd, nll, entropy, (idx == y).to(tl.float32))
    tl.store(STATS + 5 * stats_stride + row, kd)
    if WRITE_GRAD:
        weighted_ce_grad(Z_row, BIAS, V, lse, y, 1.0 - alpha * diff, GRAD_SCALE, logit_scale, softcap, HAS_BIAS,
                         HAS_SOFTCAP, BLOCK)


def rows(launch: RowLaunch, alpha, tau_min, tau_max, topk, teacher_sync_steps, teacher_mixup_alpha, reference=None,
         weights=None):
    """The loss pass of one chunk with `weights` from `prepare`; without them, the teacher pass of the chunk first, the
    teacher being the policy (the chunk's own logits) or `reference` (its product into `launch.scratch`)."""
    if weights is None:
        weights = _chunk_teacher_rows(launch, reference, tau_min, tau_max, topk)
    ref_lp = weights["ref_lp"].to(torch.float32)
    _rows[(launch.rows,)](*launch.args(), ref_lp, float(alpha), **launch.meta("curio_sft"))
    launch.stats[4].copy_(weights["tau"])


def _chunk_teacher_rows(launch: RowLaunch, reference, tau_min, tau_max, topk) -> RowTensors:
    from dataclasses import replace

    from .fused import HeadTransform, _target_logits

    scratch = launch.scratch
    if scratch is None or scratch.shape[0] < min(launch.rows, 64):
        scratch = torch.empty(min(launch.rows, 64), launch.vocab, device=launch.z.device, dtype=launch.z.dtype)
    if reference is None:
        return _launch_teacher_rows(replace(launch, scratch=scratch), tau_min, tau_max, topk)
    weight = reference.weight_as(launch.z.dtype)
    h = reference.hidden.to(launch.z.dtype)
    z = torch.empty_like(launch.z)
    torch.mm(h, weight.t(), out=z)
    transform = HeadTransform(reference.logit_scale, reference.softcap)
    teacher = replace(launch, z=z, bias=reference.bias, scratch=scratch, logit_scale=reference.logit_scale,
                      softcap=reference.softcap,
                      target_logits=_target_logits(h, weight, reference.bias, launch.targets, transform))
    return _launch_teacher_rows(teacher, tau_min, tau_max, topk)


LOSS = LossSpec(
    name="curio_sft",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    config_fields={
        "alpha": "curio_alpha", "tau_min": "curio_tau_min", "tau_max": "curio_tau_max", "topk": "curio_topk",
        "teacher_sync_steps": "curio_teacher_sync_steps", "teacher_mixup_alpha": "curio_teacher_mixup_alpha",
    },
    # The authors' run (scripts/1_sft.sh and the code it runs): α = 1 (core_algos.py L771), τ ∈ [1.1, 1.5] and the top
    # 512 logits (dp_actor.py L202, L549), the teacher mixed every 5 steps with 0.99 of the policy.
    defaults={"alpha": 1.0, "tau_min": 1.1, "tau_max": 1.5, "topk": 512, "teacher_sync_steps": 5,
              "teacher_mixup_alpha": 0.99},
    validate=check,
    description="CurioSFT: cross-entropy + alpha/2 (log p_y - log q_y)^2 toward a lagged teacher at an "
    "entropy-chosen per-token temperature (arXiv 2602.02244)",
    metrics=METRICS,
    # The teacher is optional: None is the policy itself (before its first update).
    needs_reference=lambda hp: False,
    prepare=prepare,
    prepared_rows=WEIGHT_FIELDS,
    lagged_reference=lambda hp: (hp["teacher_sync_steps"], hp["teacher_mixup_alpha"]),
)
