"""SED-SFT and EKSFT against the authors' code (`tests/authors_code.py`), in float64, value and gradient: the logits
path, the fused PyTorch path and (in Triton's interpreter, or on a GPU) the fused Triton path; on random and on
adversarial rows (ties in the top-k, all-masked rows, a one-token batch, a row whose mask flips); and EKSFT's
selection scope (one micro-batch on one process) under gradient accumulation."""

from __future__ import annotations

import math

import pytest
import torch

from authors_code import eksft_authors_forward, eksft_paper_forward, sed_authors_forward
from trl_emo.losses import _triton, fused_linear_loss, get_loss
from trl_emo.losses._common import select_label_rows, select_targets
from trl_emo.losses.asft import ReferenceHead
from trl_emo.losses.eksft import TIE_QUANTUM, row_statistics

torch.set_default_dtype(torch.float32)
B, T, H, V = 3, 14, 8, 40


def grads(loss, *tensors):
    return torch.autograd.grad(loss, tensors, allow_unused=True)


def assert_same(got, want, what, rtol=1e-12):
    """Equal to float64 rounding: the largest difference relative to the largest value."""
    for g, w in zip(got, want, strict=True):
        g, w = g.detach(), w.detach()
        scale = w.abs().max().clamp_min(1e-30)
        assert float((g - w).abs().max() / scale) < rtol, (what, float((g - w).abs().max() / scale))


def model_inputs(seed, scale=0.8, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g, dtype=dtype).requires_grad_(True)
    weight = (scale * torch.randn(V, H, generator=g, dtype=dtype)).requires_grad_(True)
    ref_weight = weight.detach() + 0.3 * torch.randn(V, H, generator=g, dtype=dtype)
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[0, :4] = -100  # a prompt
    labels[1, 9:] = -100  # padding
    labels[2, :2] = -100
    return hidden, weight, ref_weight, labels


# -- SED --------------------------------------------------------------------------------------------------------------

SED_CASES = [
    {"lam": 1.0, "top_k": 2, "threshold": 0.6},  # what the authors ran (tau calibrated; a mid value here)
    {"lam": 0.2, "top_k": 10, "threshold": 0.95},  # SEDLoss's own defaults
    {"lam": 3.0, "top_k": 1, "threshold": 0.3},
]


def sed_three_ways(hidden, weight, labels, hp, chunk_size=5):
    """(authors, logits path, fused path) losses of one micro-batch, `Σ ℓ / N`."""
    targets, mask = select_targets(labels)
    authors = sed_authors_forward((hidden @ weight.t())[:, :-1][mask], targets[mask], hp["lam"], hp["top_k"],
                                  hp["threshold"])
    spec = get_loss("sed")
    z = (hidden @ weight.t())[:, :-1][mask]
    logits = spec.per_token(z, targets[mask], **hp).sum() / mask.sum().clamp(min=1) if mask.any() else z.sum() * 0
    fused = fused_linear_loss(hidden[:, :-1][mask], weight, targets[mask], spec, hp, chunk_size=chunk_size).loss
    return authors, logits, fused


@pytest.mark.parametrize("hp", SED_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_sed_equals_the_authors_code(hp, seed):
    hidden, weight, _, labels = model_inputs(seed, scale=1.5 if seed else 0.8)
    authors, logits, fused = sed_three_ways(hidden, weight, labels, hp)
    want = grads(authors, hidden, weight)
    # The case must exercise both sides of the mask.
    targets, mask = select_targets(labels)
    z = (hidden @ weight.t())[:, :-1][mask].detach()
    masked = (z.softmax(-1).topk(hp["top_k"], -1).values.sum(-1) < hp["threshold"]).float().mean()
    assert 0 < masked < 1 or seed == 1
    assert_same([logits], [authors], "logits value")
    assert_same([fused], [authors], "fused value")
    assert_same(grads(logits, hidden, weight), want, "logits gradient")
    assert_same(grads(fused, hidden, weight), want, "fused gradient")


def test_sed_adversarial_rows():
    hp = {"lam": 1.0, "top_k": 2, "threshold": 0.5}
    g = torch.Generator().manual_seed(3)
    # Ties in the top-k: several equal largest logits; a row with mass exactly split; a row just under / just over tau.
    z = torch.randn(6, V, generator=g, dtype=torch.float64)
    z[0, :4] = 5.0  # four tied maxima: the top-2 sum does not depend on which two
    z[1] = 0.0  # uniform: every token tied
    base = torch.full((V,), -30.0, dtype=torch.float64)
    for row, mass in ((2, 0.5 - 1e-6), (3, 0.5 + 1e-6)):  # the mask flips between these two rows
        logits = base.clone()
        logits[0] = math.log(mass / 2)
        logits[1] = math.log(mass / 2)
        logits[2:] = math.log((1 - mass) / (V - 2))
        z[row] = logits
    z = z.requires_grad_(True)
    targets = torch.tensor([0, 3, 0, 0, 5, 7])
    authors = sed_authors_forward(z, targets, hp["lam"], hp["top_k"], hp["threshold"])
    spec = get_loss("sed")
    ours = spec.per_token(z, targets, **hp).sum() / 6
    chunk = spec.chunk_kernel(z.detach().clone(), targets, True, **hp)
    assert chunk.metrics["sed_mask"][2:4].tolist() == [1.0, 0.0]  # just under tau: penalized; just over: not
    want = grads(authors, z)
    assert_same([ours], [authors], "value")
    assert_same(grads(ours, z), want, "gradient")
    assert_same([chunk.grad / 6], want, "chunk gradient")


def test_sed_reference_is_finite_for_a_target_far_down_in_float32():
    """A target 120 nats below the top: its probability underflows in float32, its log-probability does not."""
    z = torch.zeros(2, 16)
    z[:, 0] = 120.0
    z.requires_grad_(True)
    targets = torch.tensor([3, 0])
    loss = get_loss("sed").per_token(z, targets, lam=1.0, top_k=2, threshold=0.9)
    assert torch.isfinite(loss).all() and abs(loss[0].item() - 120.0) < 1e-3
    assert torch.isfinite(torch.autograd.grad(loss.sum(), z)[0]).all()


def test_top_logits_with_a_bias_in_bf16_are_the_float32_sums():
    """SED's (and EAFT's) top-k logits with a head bias: the values the row kernel's log-normalizer sees (raw + bias
    in float32), not their bf16-rounded sum."""
    from types import SimpleNamespace

    from trl_emo.losses._triton import top_logits

    g = torch.Generator().manual_seed(0)
    raw = (18 + torch.randn(4, 64, generator=g)).to(torch.bfloat16)
    bias = torch.randn(64, generator=g).to(torch.bfloat16)
    launch = SimpleNamespace(rows=4, z=raw, bias=bias, scratch=torch.empty(4, 64, dtype=torch.bfloat16),
                             logit_scale=1.0, softcap=None)
    exact = raw.float() + bias.float()
    top = top_logits(launch, 3)
    # Each value is an exact float32 sum of the row (a bf16 sum would be a multiple of 1/8 here, off by up to 1/16) ...
    assert all(bool((exact[i][None, :] == top[i][:, None]).any(1).all()) for i in range(4))
    # ... at the top positions, up to a near-tie that the bf16 sum cannot order (one bf16 step at 18-20: 1/8).
    assert torch.allclose(top, exact.topk(3, dim=-1).values, atol=0.125)
    assert not torch.equal(top, (raw + bias).float().topk(3, dim=-1).values)  # what it returned before


def test_sed_all_masked_and_one_token_batches():
    hp = {"lam": 1.0, "top_k": 2, "threshold": 0.9}
    hidden, weight, _, labels = model_inputs(4)
    none = torch.full_like(labels, -100)
    out = fused_linear_loss(hidden[:, :-1][none[:, 1:] != -100], weight, none[:, 1:][none[:, 1:] != -100],
                            get_loss("sed"), hp)
    assert float(out.loss) == 0.0 and all(g is not None for g in grads(out.loss, hidden, weight))
    one = torch.full_like(labels, -100)
    one[1, 5] = 7
    authors, logits, fused = sed_three_ways(hidden, weight, one, hp)
    assert_same([logits, fused], [authors, authors], "one-token value")
    assert_same(grads(fused, hidden, weight), grads(authors, hidden, weight), "one-token gradient")


# -- EKSFT ------------------------------------------------------------------------------------------------------------

EKSFT_CASES = [
    {"ratio": 0.2, "lambda_entropy": 0.05, "lambda_kl": 0.05, "mode": "union"},  # the authors' script
    {"ratio": 0.3, "lambda_entropy": 1.0, "lambda_kl": 0.5, "mode": "intersection"},  # their code's defaults
    {"ratio": 0.5, "lambda_entropy": 0.7, "lambda_kl": 2.0, "mode": "union"},
]


def eksft_three_ways(hidden, weight, ref_weight, labels, hp, formula, chunk_size=5, backend="torch"):
    """(authors' or paper copy, logits path, fused path) for one micro-batch."""
    full = {**hp, "formula": formula, "target_entropy": 0.5, "target_kl": 2.0}
    logits = hidden @ weight.t()
    ref_logits = (hidden @ ref_weight.t()).detach()
    args = (hp["ratio"], hp["lambda_entropy"], hp["lambda_kl"], hp["mode"])
    if formula == "authors":
        copy = eksft_authors_forward(logits, ref_logits, labels, *args)
        rows, targets, roles = select_label_rows(labels)
        extra, count = {"roles": roles}, roles["target"].sum()
    else:
        copy = eksft_paper_forward(logits, ref_logits, labels, *args)
        shifted, mask = select_targets(labels)
        rows = torch.cat([mask, torch.zeros_like(mask[:, :1])], dim=1)
        targets, extra, count = shifted[mask], {}, mask.sum()
    spec = get_loss("eksft")
    ours = spec.per_token((hidden @ weight.t())[rows], targets, **full, reference=ref_logits[rows], **extra)
    ours = ours.sum() / count
    fused = fused_linear_loss(hidden[rows], weight, targets, spec,
                              {**full, "reference": ReferenceHead(hidden.detach()[rows], ref_weight), **extra},
                              chunk_size=chunk_size, backend=backend)
    return copy, ours, fused


@pytest.mark.parametrize("formula", ["authors", "paper"])
@pytest.mark.parametrize("hp", EKSFT_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_eksft_equals_the_authors_code(formula, hp, seed):
    hidden, weight, ref_weight, labels = model_inputs(seed)
    copy, ours, fused = eksft_three_ways(hidden, weight, ref_weight, labels, hp, formula)
    want = grads(copy, hidden, weight)
    assert_same([ours.detach(), fused.loss.detach()], [copy.detach(), copy.detach()], "value", rtol=1e-13)
    assert_same(grads(ours, hidden, weight), want, "logits gradient")
    assert_same(grads(fused.loss, hidden, weight), want, "fused gradient")
    # The selection is on: some tokens dropped, some kept, both regularizers active.
    assert 0 < float(fused.metrics["eksft_dropped"].sum()) < float(fused.target_rows.sum() if fused.target_rows
                                                                     is not None else fused.nll.numel())


def _candidate_positions(labels, formula):
    """The (batch, position) of each candidate row, in row order."""
    if formula == "authors":
        rows, _, roles = select_label_rows(labels)
        return rows.nonzero()[roles["label"]]
    _, mask = select_targets(labels)
    return mask.nonzero()


@pytest.mark.parametrize("formula", ["authors", "paper"])
def test_eksft_ties_all_masked_rows_and_a_flipping_selection(formula):
    hp = {"ratio": 0.3, "lambda_entropy": 1.0, "lambda_kl": 0.0, "mode": "intersection"}
    hidden, weight, ref_weight, labels = model_inputs(5)
    labels[1] = -100  # an all-masked row inside the batch
    positions = _candidate_positions(labels, formula)
    with torch.no_grad():
        entropy = torch.stack([-(lambda lp: (lp.exp() * lp).sum())((hidden[b, t] @ weight.t()).log_softmax(-1))
                               for b, t in positions.tolist()])
    k = int(len(positions) * hp["ratio"])
    order = torch.sort(entropy, descending=True, stable=True).indices
    last_in, first_out = int(order[k - 1]), int(order[k])
    i, j = sorted((last_in, first_out))
    (bi, ti), (bj, tj) = positions[i].tolist(), positions[j].tolist()

    def selected(fused):
        # Which of the two positions the entropy selection took (logged on the target row: one before, for the authors).
        rows = fused.metrics["eksft_entropy_selected"]
        targets = rows if fused.target_rows is None else rows[fused.target_rows.bool()]
        flags = targets.tolist()
        shift = 1 if formula == "authors" else 0
        _, mask = select_targets(labels)
        where = {tuple(p): n for n, p in enumerate(mask.nonzero().tolist())}
        return flags[where[(bi, ti - shift)]], flags[where[(bj, tj - shift)]]

    # Ties: the same hidden state at both positions, equal entropy and KL, on the selection's boundary: the earlier
    # position is taken, as the authors' copy does.
    with torch.no_grad():
        hidden[bj, tj] = hidden[bi, ti]
    copy, ours, fused = eksft_three_ways(hidden, weight, ref_weight, labels, hp, formula)
    assert_same([ours.detach(), fused.loss.detach()], [copy.detach(), copy.detach()], "value with ties", rtol=1e-13)
    assert_same(grads(fused.loss, hidden, weight), grads(copy, hidden, weight), "gradient with ties")
    assert selected(fused) == (1.0, 0.0)
    # The selection flips: a flatter distribution at the later position takes the place.
    with torch.no_grad():
        hidden[bj, tj] = 0.5 * hidden[bi, ti]
    copy, ours, fused = eksft_three_ways(hidden, weight, ref_weight, labels, hp, formula)
    assert selected(fused) == (0.0, 1.0)
    assert_same([ours.detach(), fused.loss.detach()], [copy.detach(), copy.detach()], "value after the flip", rtol=1e-13)
    assert_same(grads(fused.loss, hidden, weight), grads(copy, hidden, weight), "gradient after the flip")


@pytest.mark.parametrize("formula", ["authors", "paper"])
def test_eksft_one_token_batch_is_cross_entropy(formula):
    """One target token: ⌊0.2 · 1⌋ = 0 tokens selected, plain cross-entropy (where the authors' logging line then
    divides by zero and stops their run; the loss itself is their k = 0 branch)."""
    hp = {"ratio": 0.2, "lambda_entropy": 1.0, "lambda_kl": 1.0, "mode": "union"}
    hidden, weight, ref_weight, labels = model_inputs(6)
    one = torch.full_like(labels, -100)
    one[2, 7] = 11
    copy, ours, fused = eksft_three_ways(hidden, weight, ref_weight, one, hp, formula)
    nll = torch.nn.functional.cross_entropy((hidden[2, 6] @ weight.t())[None], torch.tensor([11]))
    assert_same([ours.detach(), fused.loss.detach(), nll.detach()], [copy.detach()] * 3, "value", rtol=1e-13)
    assert_same(grads(fused.loss, hidden, weight), grads(copy, hidden, weight), "gradient")


def test_eksft_every_token_dropped_is_finite_where_the_authors_divide_by_zero():
    """Union with ratio 1: every target is dropped. The authors' cross-entropy is then a mean over no token (NaN);
    trl_emo's is 0 (documented in docs/losses.md), and the regularizers are the same."""
    hp = {"ratio": 1.0, "lambda_entropy": 0.5, "lambda_kl": 0.5, "mode": "union"}
    hidden, weight, ref_weight, labels = model_inputs(7)
    copy, ours, fused = eksft_three_ways(hidden, weight, ref_weight, labels, hp, "authors")
    assert torch.isnan(copy)
    dropped = fused.metrics["eksft_dropped"][fused.target_rows.bool()]
    assert torch.isfinite(fused.loss) and float(dropped.mean()) == 1.0
    _, parts = eksft_authors_forward(hidden @ weight.t(), (hidden @ ref_weight.t()).detach(), labels, 1.0, 0.5, 0.5,
                                     "union", return_parts=True)
    regularizers = -parts["lam_e"] * parts["entropy"] + parts["lam_k"] * parts["kl"]
    assert_same([ours.detach(), fused.loss.detach()], [regularizers.detach()] * 2, "value", rtol=1e-13)


def test_eksft_authors_terms_differ_from_the_paper_as_documented():
    """At the first step the policy is the reference: the true KL is 0, the authors' term is H + Σ p² (docs/losses.md)."""
    g = torch.Generator().manual_seed(8)
    z = torch.randn(50, V, generator=g, dtype=torch.float64)
    paper = row_statistics(z, z, "paper")
    authors = row_statistics(z, z, "authors")
    p = z.softmax(-1)
    assert float(paper["kl"].abs().max()) < 1e-12
    expected = paper["entropy"] + (p * p).sum(-1)
    assert torch.allclose(authors["kl_term"], expected, atol=1e-12)
    assert float(authors["kl_term"].min()) > 1.0


def test_eksft_selection_is_per_micro_batch_under_gradient_accumulation():
    """Two micro-batches accumulated (`num_items_in_batch` = both token counts): the gradient is each micro-batch's
    own loss (selection within it) weighted by its share of the tokens, as docs/losses.md states."""
    hp = {"ratio": 0.3, "lambda_entropy": 1.0, "lambda_kl": 0.5, "mode": "union"}
    full = {**hp, "formula": "paper", "target_entropy": 0.5, "target_kl": 2.0}
    hidden, weight, ref_weight, labels = model_inputs(9)
    spec = get_loss("eksft")
    parts = [(slice(0, 2), None), (slice(2, 3), None)]
    counts = [int((labels[s, 1:] != -100).sum()) for s, _ in parts]
    total = sum(counts)
    accumulated, combined = 0.0, 0.0
    for (rows_slice, _), count in zip(parts, counts):
        h, lab = hidden[rows_slice], labels[rows_slice]
        shifted, mask = select_targets(lab)
        out = fused_linear_loss(h[:, :-1][mask], weight, shifted[mask], spec,
                                {**full, "reference": ReferenceHead(h.detach()[:, :-1][mask], ref_weight)},
                                num_items_in_batch=total)
        accumulated = accumulated + out.loss
        combined = combined + count / total * eksft_paper_forward(h @ weight.t(), (h @ ref_weight.t()).detach(), lab,
                                                                  hp["ratio"], hp["lambda_entropy"], hp["lambda_kl"],
                                                                  hp["mode"])
    assert_same([accumulated.detach()], [combined.detach()], "value", rtol=1e-13)
    assert_same(grads(accumulated, hidden, weight), grads(combined, hidden, weight), "gradient")
    # And it is not the selection over both micro-batches at once.
    _, _, whole = eksft_three_ways(hidden, weight, ref_weight, labels, hp, "paper")
    assert abs(float(whole.loss) - float(accumulated)) > 1e-6


# -- the Triton kernels (interpreted on the CPU, compiled on a GPU) ---------------------------------------------------

triton_only = pytest.mark.skipif(
    not _triton.HAS_TRITON or (not torch.cuda.is_available() and not _triton.interpreting()),
    reason="needs Triton (compiled on CUDA, or TRITON_INTERPRET=1 on the CPU)",
)


@pytest.fixture
def small_blocks(monkeypatch):
    # 16-column blocks: a 40-token row spans three blocks, the last partial.
    monkeypatch.setattr(_triton, "_MAX_BLOCK_INTERPRETED", 16)
    monkeypatch.setattr(_triton, "_MAX_BLOCK", 16)


@triton_only
@pytest.mark.parametrize("formula", ["authors", "paper"])
def test_eksft_triton_kernels_equal_the_authors_code(formula, small_blocks):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hp = {"ratio": 0.3, "lambda_entropy": 1.0, "lambda_kl": 0.5, "mode": "union"}
    hidden, weight, ref_weight, labels = model_inputs(10, dtype=torch.float32)
    hidden = hidden.detach().to(device).requires_grad_(True)
    weight = weight.detach().to(device).requires_grad_(True)
    copy, _, fused = eksft_three_ways(hidden, weight, ref_weight.to(device), labels.to(device), hp, formula,
                                      backend="triton")
    assert_same([fused.loss.detach()], [copy.detach()], "value", rtol=1e-5)
    assert_same(grads(fused.loss, hidden, weight), grads(copy, hidden, weight), "gradient", rtol=1e-4)


@triton_only
def test_sed_triton_kernel_equals_the_authors_code(small_blocks):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hp = {"lam": 1.0, "top_k": 2, "threshold": 0.6}
    hidden, weight, _, labels = model_inputs(11, dtype=torch.float32)
    hidden = hidden.detach().to(device).requires_grad_(True)
    weight = weight.detach().to(device).requires_grad_(True)
    labels = labels.to(device)
    targets, mask = select_targets(labels)
    authors = sed_authors_forward((hidden @ weight.t())[:, :-1][mask], targets[mask], 1.0, 2, 0.6)
    fused = fused_linear_loss(hidden[:, :-1][mask], weight, targets[mask], get_loss("sed"), hp, chunk_size=8,
                              backend="triton")
    assert_same([fused.loss.detach()], [authors.detach()], "value", rtol=1e-5)
    assert_same(grads(fused.loss, hidden, weight), grads(authors, hidden, weight), "gradient", rtol=1e-4)


# -- EKSFT's ties: the same rows on every backend and chunk size -------------------------------------------------------

EKSFT_BACKENDS = ["torch"] + (["triton"] if _triton.HAS_TRITON and (torch.cuda.is_available() or _triton.interpreting())
                              else [])


def _with_duplicate_at_the_cut(hidden, weight, ref_weight, statistic, k):
    """A later row made a copy of the row ranked `k`-th by `statistic`: the two are equal in exact arithmetic, one
    inside the selection and one outside; the earlier must be taken. Returns (hidden, earlier, later)."""
    stats = row_statistics((hidden @ weight.t()).double(), (hidden @ ref_weight.t()).double(), "paper")[statistic]
    order = torch.sort(stats, descending=True, stable=True).indices
    earlier = int(order[k - 1])
    later = max(int(i) for i in order[k + 3 :])  # well outside, and after it in position
    hidden = hidden.clone()
    hidden[later] = hidden[earlier]
    return hidden, earlier, later


def _cleanly_at_the_cut(hidden, weight, ref_weight, statistic, k, earlier, later):
    """The test's premise: `earlier` and `later` tie at the `k`-th place, every other row clear of them by far more than
    the selection's rounding."""
    stats = row_statistics((hidden @ weight.t()).double(), (hidden @ ref_weight.t()).double(), "paper")[statistic]
    value = stats[earlier]
    others = torch.cat([stats[:earlier], stats[earlier + 1 : later], stats[later + 1 :]])
    assert later > earlier and abs(float(stats[later] - value)) < 1e-12
    assert int((others > value).sum()) == k - 1 and float((others - value).abs().min()) > 10 * TIE_QUANTUM


@pytest.mark.parametrize(("formula", "policy_is_reference"), [("paper", True), ("authors", True), ("paper", False)],
                         ids=["paper-policy=reference", "authors-policy=reference", "paper-policy!=reference"])
def test_eksft_selects_the_same_rows_on_every_backend_and_chunk_size(formula, policy_is_reference):
    """Ties are decided alike everywhere: with the policy as its own reference every KL is exactly 0 on both backends
    (the first k rows are taken), and a duplicated row at the cut of a selection ranks after its original whatever the
    chunk size (which changes the rounding of its product with the head) and backend. Before: the PyTorch path left
    ±1e-6 on the zero KLs and took other rows than the Triton kernel (another loss), varying with the chunk size."""
    n, k = 40, 8  # ratio 0.2
    hp = {"ratio": 0.2, "lambda_entropy": 0.5, "lambda_kl": 0.5, "mode": "union", "formula": formula,
          "target_entropy": 0.5, "target_kl": 2.0}
    g = torch.Generator().manual_seed(34)
    hidden = torch.randn(n, 16, generator=g)
    weight = 0.5 * torch.randn(300, 16, generator=g)
    ref_weight = weight if policy_is_reference else weight + 0.2 * torch.randn(300, 16, generator=g)
    hidden, e_earlier, e_later = _with_duplicate_at_the_cut(hidden, weight, ref_weight, "entropy", k)
    if not policy_is_reference:
        hidden, kl_earlier, kl_later = _with_duplicate_at_the_cut(hidden, weight, ref_weight, "kl", k)
        _cleanly_at_the_cut(hidden, weight, ref_weight, "kl", k, kl_earlier, kl_later)
    _cleanly_at_the_cut(hidden, weight, ref_weight, "entropy", k, e_earlier, e_later)
    targets = torch.randint(0, 300, (n,), generator=g)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the kernels compiled on a GPU, interpreted here
    hidden, weight, ref_weight, targets = (t.to(device) for t in (hidden, weight, ref_weight, targets))
    runs = {}
    for backend in EKSFT_BACKENDS:
        # Every chunk size on the PyTorch path; two on the Triton kernels, interpreted at ~0.1 s a chunk on the CPU.
        for chunk_size in (3, 7, 16, 40) if backend == "torch" else (7, 40):
            out = fused_linear_loss(hidden, weight, targets, get_loss("eksft"),
                                    {**hp, "reference": ReferenceHead(hidden, ref_weight)}, chunk_size=chunk_size,
                                    backend=backend)
            runs[backend, chunk_size] = (
                out.loss.item(), *(out.metrics[m].nonzero().flatten().tolist()
                                   for m in ("eksft_entropy_selected", "eksft_kl_selected", "eksft_dropped")))
    first = next(iter(runs.values()))
    for key, run in runs.items():
        assert run[1:] == first[1:], key
        assert run[0] == pytest.approx(first[0], rel=1e-6), key
    loss, by_entropy, by_kl, _ = first
    assert e_earlier in by_entropy and e_later not in by_entropy
    if policy_is_reference:
        assert by_kl == list(range(k))  # every KL is 0: the earlier positions first
    else:
        assert kl_earlier in by_kl and kl_later not in by_kl


def test_eksft_k_is_the_authors_int_of_n_times_ratio():
    """`k = int(N · ratio)` with the product in double precision, as the authors' code computes it: 0.7 · 90 =
    62.99999999999999, so 62 tokens each, where ⌊0.7 · 90⌋ = 63 (docs/losses.md)."""
    from authors_code import _num_selected
    from trl_emo.losses.eksft import plan_rows

    z = torch.randn(90, 12, generator=torch.Generator().manual_seed(13), dtype=torch.float64)
    hp = {"ratio": 0.7, "lambda_entropy": 0.5, "lambda_kl": 0.5, "mode": "intersection", "formula": "paper"}
    weights = plan_rows(row_statistics(z, z.flip(0), "paper"), hp, 12)
    assert 90 * 0.7 < 63 and _num_selected(90, 0.7) == 62
    assert int(weights["eksft_entropy_selected"].sum()) == 62 and int(weights["eksft_kl_selected"].sum()) == 62
