"""The losses outside TRL (`trl_emo.losses.FusedLinearLoss`, `fused_lm_loss`): every registered loss equal to the
trainer's logits path, TRL's DFT exactly, the same one-line errors as `SFTConfig`, and a plain PyTorch training loop."""

from __future__ import annotations

import copy
import types

import pytest
import torch

from loss_cases import case_id, cases
from loss_cases import default_hparams as cases_defaults
from test_fused import make_inputs, reference_weight, rel_close
from trl_emo.losses import (
    FusedLinearLoss,
    HeadTransform,
    ReferenceHead,
    UnknownLossError,
    add_loss,
    causal_lm_loss,
    dft,
    fused_lm_loss,
    get_loss,
    gem,
    unregister_loss,
)
from trl_emo.training.config import SFTConfig
from trl_emo.training.objective import Objective

# Each loss at its defaults, and the settings that change what the API hands it: no reference model run (ASFT's
# alpha 0, EKSFT's ratio 0) and EKSFT's label rows (its authors' formula). The kernels' other branches are
# `test_fused.py`'s.
CASES = [(name, hp) for name, hp in cases() if hp == cases_defaults(name)] + [
    ("asft", {**cases_defaults("asft"), "alpha": 0.0}),
    ("eksft", {**cases_defaults("eksft"), "ratio": 0.0}),
    ("eksft", {**cases_defaults("eksft"), "formula": "authors"}),
]
IDS = [case_id(name, hp) for name, hp in CASES]


def _head(weight, bias=None):
    """What `Objective.from_logits` reads the head from: a model's output embedding."""
    head = types.SimpleNamespace(weight=weight, bias=bias)
    return types.SimpleNamespace(get_output_embeddings=lambda: head)


def trainer_logits_path(name, hp, hidden, weight, bias, labels, cost, transform, num_items=None):
    """The trainer's own reference implementation (`Objective.from_logits`): the full logits, then the loss."""
    z = hidden @ weight.t() + (0 if bias is None else bias)
    z = z * transform.logit_scale
    if transform.softcap is not None:
        z = transform.softcap * torch.tanh(z / transform.softcap)
    objective = Objective(name, hp)
    objective.cost = cost
    ref_logits = hidden.detach() @ reference_weight(weight).t()
    return objective.from_logits(z, labels, _head(weight, bias), num_items_in_batch=num_items,
                                 reference_logits=ref_logits).loss


@pytest.mark.parametrize(("name", "hp"), CASES, ids=IDS)
def test_every_registered_loss_equals_the_logits_path(name, hp):
    """Value and gradients (hidden, head, bias) with a logit scale, a soft-cap and `num_items_in_batch`; the reference
    losses read the reference model's hidden states and head; EKSFT's authors' formula its label rows."""
    hidden, weight, bias, labels, cost = make_inputs(bias=True, seed=3)
    transform = HeadTransform(logit_scale=0.5, softcap=4.0)
    num_items = 2 * int((labels[:, 1:] != -100).sum())
    want = trainer_logits_path(name, hp, hidden, weight, bias, labels, cost, transform, num_items)
    loss_fn = FusedLinearLoss(name, logit_scale=0.5, softcap=4.0, cost_embedding=cost, **hp)
    reference = ReferenceHead(hidden.detach(), reference_weight(weight))
    got = loss_fn(hidden, weight, labels, bias, num_items_in_batch=num_items,
                  reference=reference if get_loss(name).needs_reference else None)
    assert rel_close(got, want)
    inputs = (hidden, weight, bias)
    for g, w in zip(torch.autograd.grad(got, inputs), torch.autograd.grad(want, inputs)):
        assert rel_close(g, w), float((g - w).abs().max())


def test_dft_is_trls_formula():
    """TRL 1.16's `SFTTrainer.compute_loss` for `loss_type="dft"`: `per_token_loss = -log_probs *
    log_probs.exp().detach()`, summed over the target tokens and divided by their count (or `num_items_in_batch`),
    clamped at 1. Before issue 36, `get_loss("dft")` raised "Unknown loss_type 'dft'. Did you mean 'dft'?"."""
    hidden, weight, _, labels, _ = make_inputs(seed=4)
    for num_items in (None, 50):
        log_probs = torch.log_softmax(hidden[:, :-1] @ weight.t(), -1)
        mask = labels[:, 1:] != -100
        log_probs = log_probs.gather(-1, labels[:, 1:].clamp(min=0)[..., None]).squeeze(-1) * mask
        per_token_loss = -log_probs
        per_token_loss = per_token_loss * log_probs.exp().detach()
        num_tokens = mask.sum() if num_items is None else num_items
        want = per_token_loss.sum() / torch.as_tensor(num_tokens).clamp(min=1)
        got = fused_lm_loss(hidden, weight, labels, "dft", num_items_in_batch=num_items)
        assert rel_close(got, want)
        assert rel_close(torch.autograd.grad(got, weight)[0], torch.autograd.grad(want, weight)[0])


def test_an_unregistered_trl_name_is_not_suggested_as_itself():
    unregister_loss("dft")
    try:
        with pytest.raises(UnknownLossError) as err:
            get_loss("dft")
        assert "Did you mean 'dft'" not in str(err.value) and "add_loss(trl_emo.losses.dft.LOSS)" in str(err.value)
    finally:
        add_loss(dft.LOSS)


def test_labels_already_shifted_and_flattened_give_the_same_loss():
    hidden, weight, _, labels, _ = make_inputs(seed=5)
    shifted = FusedLinearLoss("gem", beta=0.6)(hidden, weight, labels)
    flat = FusedLinearLoss("gem", beta=0.6, shift_labels=False)(hidden[:, :-1].reshape(-1, hidden.shape[-1]), weight,
                                                                 labels[:, 1:].reshape(-1))
    assert torch.equal(shifted, flat)


def test_statistics_are_laid_out_over_the_positions():
    hidden, weight, _, labels, _ = make_inputs(seed=6)
    out = FusedLinearLoss("nll")(hidden, weight, labels, return_stats=True)
    assert out.positions.shape == labels[:, 1:].shape and torch.equal(out.positions, labels[:, 1:] != -100)
    ce = torch.nn.functional.cross_entropy(
        (hidden[:, :-1] @ weight.t()).transpose(1, 2), labels[:, 1:], reduction="none"
    )
    assert rel_close(out.nll, ce[out.positions]) and torch.equal(out.token_losses, out.nll)
    assert rel_close(out.loss, out.token_losses.mean())


@pytest.mark.parametrize(
    ("loss_type", "api", "field", "value"),
    [
        ("gem", "beta", "gem_beta", 1.5),
        ("gem", "h", "gem_h", "sigmoid"),
        ("emo", "weighting", "emo_weighting", "balanced"),
        ("tailr", "formula", "tailr_formula", "both"),
        ("eaft", "alpha", "eaft_alpha", -1.0),
        ("sed", "top_k", "sed_top_k", 0),
        ("eksft", "mode", "eksft_mode", "all"),
    ],
)
def test_hyperparameter_errors_are_sftconfigs(tmp_path, loss_type, api, field, value):
    """One line each, the very message `SFTConfig` gives for the same value (the same check runs)."""
    with pytest.raises(ValueError) as config_error:
        SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", loss_type=loss_type, **{field: value})
    for name in (api, field):
        with pytest.raises(ValueError) as api_error:
            FusedLinearLoss(loss_type, **{name: value})
        assert str(api_error.value) == str(config_error.value) and "\n" not in str(api_error.value)


def test_option_errors_share_sftconfigs_checks(tmp_path):
    for option, value in (("chunk_size", 0), ("backend", "cuda"), ("chunk_memory_mb", -1), ("cost_embedding", "")):
        field = "emo_cost_embedding" if option == "cost_embedding" else f"fused_{option}"
        with pytest.raises(ValueError) as config_error:
            SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **{field: value})
        with pytest.raises(ValueError) as api_error:
            FusedLinearLoss("emo", **{option: value})
        assert str(api_error.value) == str(config_error.value).replace(field, option)


def test_argument_mistakes_are_one_line_errors():
    hidden, weight, _, labels, _ = make_inputs(seed=7)
    mistakes = [
        (lambda: FusedLinearLoss("gem", betta=0.5), "no hyper-parameter 'betta'; it takes: beta (gem_beta), h (gem_h)"),
        (lambda: FusedLinearLoss("gem", beta=0.5, gem_beta=0.6), "gem_beta both set 'gem''s beta"),
        (lambda: FusedLinearLoss("gem", softcap=0.0), "softcap must be a positive number"),
        (lambda: FusedLinearLoss("asft")(hidden, weight, labels), "reads a reference model: pass reference="),
        (lambda: FusedLinearLoss("gem")(hidden, weight, labels, reference=ReferenceHead(hidden, weight)),
         "reads no reference model"),
        (lambda: FusedLinearLoss("gem")(hidden, weight[:, :5], labels), "must share H"),
        (lambda: FusedLinearLoss("gem")(hidden[0], weight, labels[0]), "shift_labels=False"),
        (lambda: FusedLinearLoss("gem")(hidden, weight[:50], labels), "Vocabulary mismatch"),
        (lambda: FusedLinearLoss("eaft", topk=500)(hidden, weight, labels), "eaft_topk"),
        (lambda: fused_lm_loss(hidden, weight, labels, "emo"), "needs cost_embedding="),
        (lambda: FusedLinearLoss("eksft", formula="authors", shift_labels=False)(
            hidden, weight, labels, reference=ReferenceHead(hidden, weight)), "eksft_formula='paper'"),
    ]
    for call, message in mistakes:
        with pytest.raises(ValueError) as err:
            call()
        assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_emo_keeps_a_frozen_snapshot_of_the_head():
    hidden, weight, _, labels, _ = make_inputs(seed=8)
    loss_fn = FusedLinearLoss("emo")
    first = loss_fn(hidden, weight, labels)
    assert torch.equal(loss_fn.cost.weight, weight.detach()) and loss_fn.cost.weight is not weight
    with torch.no_grad():
        weight.mul_(1.5)
    loss_fn(hidden, weight, labels)
    assert torch.equal(loss_fn.cost.weight * 1.5, weight.detach())  # the snapshot did not move
    assert torch.equal(first, fused_lm_loss(hidden, weight / 1.5, labels, "emo", cost_embedding=weight.detach() / 1.5))


def test_for_model_reads_the_soft_cap_and_scale_as_trl_does():
    config = types.SimpleNamespace(final_logit_softcapping=30.0, logits_scaling=4.0, model_type="granite")
    loss_fn = FusedLinearLoss.for_model(types.SimpleNamespace(config=config), "gem", beta=0.9)
    transform = loss_fn.transform
    assert (transform.softcap, transform.logit_scale, loss_fn.hyperparameters["beta"]) == (30.0, 0.25, 0.9)


def test_a_plain_pytorch_training_loop_on_a_tiny_llama(tokenizer, make_model):
    """Two AdamW steps of a tiny Llama with fused GEM (the backbone's hidden states and the head, no logits) and of
    an identical copy with GEM from the model's logits: the same loss, every gradient and the updated weights."""
    fused_model = make_model(seed=11)
    logits_model = copy.deepcopy(fused_model)
    batch = tokenizer(["what is 3 plus 3? The answer is 6.", "Write a short note about the owl."], padding=True,
                      return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    labels[:, :4] = -100  # a prompt
    loss_fn = FusedLinearLoss.for_model(fused_model, "gem", beta=0.7)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (fused_model, logits_model)]
    for _ in range(2):
        # As the README shows it: the model's own forward, one position of logits, the last hidden states.
        out = fused_model(**batch, output_hidden_states=True, logits_to_keep=1)
        assert out.logits.shape[1] == 1
        head = fused_model.get_output_embeddings()
        fused = loss_fn(out.hidden_states[-1], head.weight, labels, head.bias)
        reference = causal_lm_loss(gem.per_token, logits_model(**batch).logits, labels, beta=0.7, h="linear")
        for loss, optimizer in zip((fused, reference), optimizers):
            optimizer.zero_grad()
            loss.backward()
        torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-6)
        for (name, p), q in zip(fused_model.named_parameters(), logits_model.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
        for optimizer in optimizers:
            optimizer.step()
    for p, q in zip(fused_model.parameters(), logits_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
