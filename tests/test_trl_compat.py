"""Each piece of `trl_emo.training.trl_compat` against TRL's own behaviour, so a TRL upgrade that changes one fails here.

One test per copied or called piece, named after it; each builds the TRL side with TRL's public API (its trainer, its
`add_fused_lm_head`) and compares. Tiny models, one forward or one trainer construction each.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
import trl
from datasets import Dataset

from conftest import conversation_rows, cpu_config, prompt_completion_rows
from trl_emo.training import trl_compat as compat
from trl_emo.losses import add_loss, get_loss, unregister_loss
from trl_emo.losses.registry import TRL_LOSS_TYPES
from trl_emo.models.tiny import CHAT_TEMPLATE, build_tiny_model

# A trl_emo loss that is exactly TRL's `nll`, so that our compute_loss can be compared number for number with TRL's.
COPY_OF_NLL = "compat_nll"


@pytest.fixture(scope="module", autouse=True)
def copy_of_nll():
    add_loss(dataclasses.replace(get_loss("nll"), name=COPY_OF_NLL), overwrite=True)
    yield
    unregister_loss(COPY_OF_NLL)


def trl_config(tmp_path, **overrides):
    """A plain `trl.SFTConfig` with the CPU settings of `cpu_config`."""
    values = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False,
                  max_length=64, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    values.update(overrides)
    return trl.SFTConfig(**values)


def trl_trainer(tmp_path, model, tokenizer, dataset, **overrides):
    return trl.SFTTrainer(model=model, args=trl_config(tmp_path, **overrides), train_dataset=dataset, processing_class=tokenizer)


def our_trainer(tmp_path, model, tokenizer, dataset, **overrides):
    from trl_emo import SFTTrainer

    args = cpu_config(tmp_path, loss_type=COPY_OF_NLL, **overrides)
    return SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)


# -- TRL_LOSS_TYPES and the loss_type swap (SFTTrainer.__init__) ------------------------------------------------------


def test_trl_loss_types_are_the_ones_trl_accepts(tmp_path):
    """`TRL_LOSS_TYPES` is what TRL's `SFTConfig.loss_type` resolves to (deprecated spellings mapped away)."""
    loss_type = next(f for f in dataclasses.fields(trl.SFTConfig) if f.name == "loss_type")
    with pytest.warns(FutureWarning) if "chunked_nll" in loss_type.metadata["choices"] else contextlib.nullcontext():
        resolved = {trl_config(tmp_path, loss_type=choice).loss_type for choice in loss_type.metadata["choices"]}
    assert resolved == set(TRL_LOSS_TYPES)


def test_trl_builds_own_loss_trainer(tmp_path, tokenizer, pc_dataset):
    """TRL's trainer refuses a loss it does not know (why the swap exists) and builds with the swap, which gives the
    value back afterwards."""
    args = trl_config(tmp_path, loss_type="gem")
    model = build_tiny_model(tokenizer, hidden_size=32, intermediate_size=64)
    with pytest.raises(ValueError, match="Invalid `loss_type`"):
        trl.SFTTrainer(model=model, args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    with compat.trl_builds_own_loss_trainer(args):
        trainer = trl.SFTTrainer(model=model, args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    assert args.loss_type == "gem" and trainer.args is args


# -- logit_transform (add_fused_lm_head) -------------------------------------------------------------------------------

SCALINGS = {
    "none": {},
    "logit_scale": {"logit_scale": 0.5},
    "output_multiplier": {"output_multiplier": 2.0},
    "lm_head_multiplier": {"lm_head_multiplier": 0.25},
    "granite_logits_scaling": {"logits_scaling": 4.0},
    "hyperclovax_logits_scaling": {"logits_scaling": 4.0, "model_type": "hyperclovax"},
    "softcap": {"final_logit_softcapping": 3.0},
    "logit_scale_and_softcap": {"logit_scale": 3.0, "final_logit_softcapping": 2.0},
}


def scaled_model(tokenizer, attributes: dict, seed: int = 0):
    """A tiny Llama whose config carries scaling attributes (Llama's own forward ignores them; TRL's fused head reads
    them)."""
    model = build_tiny_model(tokenizer, seed=seed, hidden_size=32, intermediate_size=64)
    for name, value in attributes.items():
        setattr(model.config, name, value)
    return model


def batch(tokenizer):
    ids = torch.tensor([tokenizer("what is 2 plus 2? The answer is 4.")["input_ids"]] * 2)
    labels = ids.clone()
    labels[0, :4] = -100  # a masked prompt
    return ids, labels


@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_logit_transform(tokenizer, scaling):
    """Our transform of `h W^T` gives the log-probabilities TRL's fused head computes for the same config."""
    from trl.trainer.utils import add_fused_lm_head

    model = scaled_model(tokenizer, SCALINGS[scaling])
    ids, labels = batch(tokenizer)
    transform = compat.logit_transform(model)
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]
        ours = transform.apply_(hidden @ model.get_output_embeddings().weight.T).log_softmax(-1)
        ours = ours.gather(-1, labels[:, 1:].clamp(min=0)[..., None]).squeeze(-1)
        add_fused_lm_head(model)
        theirs = model(input_ids=ids, labels=labels, fused_lm_head=True).log_probs
    mask = labels[:, 1:] != -100
    assert torch.allclose(ours[mask], theirs[mask], atol=1e-5)


# -- add_objective_head (add_fused_lm_head's forward) -----------------------------------------------------------------


def patched_pair(tokenizer, attributes=None):
    """The same weights twice: patched by TRL only, and by TRL then trl_emo (as `trl_emo.SFTTrainer` does)."""
    from trl.trainer.utils import add_fused_lm_head

    from trl_emo.training.objective import Objective

    theirs, ours = (scaled_model(tokenizer, attributes or {}, seed=3) for _ in range(2))
    for model in (theirs, ours):
        add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    compat.add_objective_head(ours, Objective(COPY_OF_NLL, {}).fused)
    return theirs, ours


@pytest.mark.parametrize("shifted", [False, True], ids=["labels", "shift_labels"])
def test_add_objective_head(tokenizer, shifted):
    theirs, ours = patched_pair(tokenizer, SCALINGS["logit_scale_and_softcap"])
    ids, labels = batch(tokenizer)
    kwargs = {"shift_labels": torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)} if shifted else {"labels": labels}
    with torch.no_grad():
        trl_out = theirs(input_ids=ids, fused_lm_head=True, num_items_in_batch=7, **kwargs)
        out = ours(input_ids=ids, trl_emo_loss=True, num_items_in_batch=7, **kwargs)
        mask = trl_out.label_mask
        assert torch.allclose(out.result.nll, -trl_out.log_probs[mask], atol=1e-5)
        assert torch.allclose(out.result.entropy, trl_out.entropy[mask], atol=1e-4)
        assert torch.equal(out.result.is_top1.bool(), trl_out.is_top1[mask].bool())
        assert torch.allclose(out.loss, trl_out.loss, atol=1e-6) and out.loss is out.result.loss
        # Other calls are TRL's: its fused head, and the model's own forward.
        again = ours(input_ids=ids, fused_lm_head=True, num_items_in_batch=7, **kwargs)
        assert torch.allclose(again.log_probs, trl_out.log_probs)
        assert torch.equal(ours(input_ids=ids).logits, type(ours).forward(ours, input_ids=ids).logits)
    assert isinstance(compat.gather_lm_head(ours.get_output_embeddings().weight), contextlib.nullcontext)


def test_add_objective_head_router_loss(tokenizer):
    """MoE models: the load-balancing loss TRL's fused head computes, from the same router logits."""
    from transformers import MixtralConfig, MixtralForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from trl_emo.training.objective import Objective

    config = MixtralConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                           output_router_logits=True, router_aux_loss_coef=0.0)
    torch.manual_seed(0)
    model = MixtralForCausalLM(config).eval()
    add_fused_lm_head(model)
    ids, labels = batch(tokenizer)
    with torch.no_grad():
        theirs = model(input_ids=ids, labels=labels, fused_lm_head=True)
        compat.add_objective_head(model, Objective(COPY_OF_NLL, {}).fused)
        ours = model(input_ids=ids, labels=labels, trl_emo_loss=True)
    assert theirs.aux_loss is not None and torch.allclose(ours.aux_loss, theirs.aux_loss)


# -- loss_inputs, finish_loss, log_metric, count_train_tokens (SFTTrainer.compute_loss); loss_weight, gather_step ------


class TwoProcesses:
    """An accelerator that says two processes take part (the rest is the real one's)."""

    num_processes = 2

    def __init__(self, accelerator):
        self._accelerator = accelerator

    def __getattr__(self, name):
        return getattr(self._accelerator, name)


def loss_and_metrics(trainer, inputs, num_items_in_batch, two_processes=False):
    real = trainer.accelerator
    if two_processes:
        trainer.accelerator = TwoProcesses(real)
    try:
        trainer.model.train()
        loss = trainer.compute_loss(trainer.model, dict(inputs), num_items_in_batch=num_items_in_batch)
        if hasattr(trainer, "_end_optimizer_step"):  # trl_emo logs its metrics once per optimizer step
            trainer._end_optimizer_step()
    finally:
        trainer.accelerator = real
    metrics = {key: values[-1] for key, values in trainer._metrics["train"].items()}
    trainer._metrics["train"].clear()
    return loss.detach(), metrics


@pytest.mark.parametrize("case", ["attention_mask", "padding_free", "two_processes"])
def test_compute_loss_bookkeeping(tmp_path, tokenizer, pc_dataset, case):
    """`loss_inputs`, `finish_loss`, `log_metric` and `count_train_tokens` around a loss equal to TRL's nll give TRL's
    loss and tokens seen, with and without an attention mask, and scaled for DDP's gradient averaging; `loss_weight`
    and `gather_step` make the step's `objective` the loss the Trainer logs for it. TRL logs entropy and accuracy as
    this micro-batch's own means; trl_emo weights them like the loss, over the step's `num_items_in_batch` tokens
    (here 3 more than this micro-batch's, as if another micro-batch held them)."""
    theirs = trl_trainer(tmp_path / "trl", build_tiny_model(tokenizer, hidden_size=32, intermediate_size=64), tokenizer,
                         pc_dataset)
    ours = our_trainer(tmp_path / "ours", build_tiny_model(tokenizer, hidden_size=32, intermediate_size=64), tokenizer,
                       pc_dataset)
    inputs = theirs.data_collator([theirs.train_dataset[i] for i in range(4)])
    if case == "padding_free":  # one packed row, as padding-free batches come
        keep = inputs["attention_mask"].bool()
        inputs = {"input_ids": inputs["input_ids"][keep][None], "labels": inputs["labels"][keep][None],
                  "position_ids": torch.cat([torch.arange(int(n)) for n in keep.sum(1)])[None]}
    num_items = int((inputs["labels"][:, 1:] != -100).sum()) + 3
    trl_loss, trl_metrics = loss_and_metrics(theirs, inputs, num_items, case == "two_processes")
    our_loss, our_metrics = loss_and_metrics(ours, inputs, num_items, case == "two_processes")
    assert torch.allclose(our_loss, trl_loss, rtol=1e-5)
    assert our_metrics["num_tokens"] == trl_metrics["num_tokens"]
    # What `Trainer._maybe_log_save_evaluate` logs for a step of this one micro-batch: its `training_step` loss.
    assert our_metrics["objective"] == pytest.approx(float(our_loss), rel=1e-5)
    assert our_metrics["cross_entropy"] == pytest.approx(our_metrics["objective"], rel=1e-5)
    tokens = int((inputs["labels"][:, 1:] != -100).sum())
    processes = 2 if case == "two_processes" else 1
    for key in ("entropy", "mean_token_accuracy"):
        expected = trl_metrics[key] * tokens / num_items * processes
        assert our_metrics[key] == pytest.approx(expected, rel=1e-5), key


def test_compute_loss_router_loss(tmp_path, tokenizer, pc_dataset):
    """MoE: the load-balancing loss added with TRL's coefficient, averaged over accumulation steps, logged as
    `aux_loss`."""
    from transformers import MixtralConfig, MixtralForCausalLM

    def mixtral():
        torch.manual_seed(0)
        config = MixtralConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                               output_router_logits=True, router_aux_loss_coef=0.5, pad_token_id=tokenizer.pad_token_id)
        return MixtralForCausalLM(config)

    theirs = trl_trainer(tmp_path / "trl", mixtral(), tokenizer, pc_dataset, gradient_accumulation_steps=2)
    ours = our_trainer(tmp_path / "ours", mixtral(), tokenizer, pc_dataset, gradient_accumulation_steps=2)
    assert theirs.aux_loss_enabled and ours.aux_loss_enabled
    for trainer in (theirs, ours):  # set by the training loop, which does not run here
        trainer.current_gradient_accumulation_steps = 2
    inputs = theirs.data_collator([theirs.train_dataset[i] for i in range(4)])
    trl_loss, trl_metrics = loss_and_metrics(theirs, inputs, 40)
    our_loss, our_metrics = loss_and_metrics(ours, inputs, 40)
    assert torch.allclose(our_loss, trl_loss, rtol=1e-5)
    assert our_metrics["aux_loss"] == pytest.approx(trl_metrics["aux_loss"], rel=1e-5)


# -- template_masks_assistant_turns, prepare_sft_examples (SFTTrainer.__init__, _prepare_dataset) -----------------------


@pytest.mark.parametrize("markers", [True, False], ids=["generation_markers", "no_markers"])
def test_template_masks_assistant_turns(tmp_path, tokenizer, markers):
    """True exactly when TRL's trainer can build an assistant-only loss with the template."""
    tok = tokenizer if markers else _without_markers(tokenizer)
    model = build_tiny_model(tok, hidden_size=32, intermediate_size=64)
    data = Dataset.from_list(conversation_rows(4))
    args = trl_config(tmp_path, assistant_only_loss=True)
    if compat.template_masks_assistant_turns(tok):
        trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    else:
        with pytest.raises(ValueError):
            trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    assert compat.template_masks_assistant_turns(tok) == markers


def _without_markers(tokenizer):
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    return tok


PREPARED = {
    "prompt_completion": (lambda: prompt_completion_rows(4), {}),
    "prompt_completion_full_loss": (lambda: prompt_completion_rows(4), {"completion_only_loss": False}),
    "conversational_prompt_completion": (
        lambda: [{"prompt": r["messages"][:1], "completion": r["messages"][1:]} for r in conversation_rows(4)], {}),
    "messages_assistant_only": (lambda: conversation_rows(4), {"assistant_only_loss": True}),
    "text": (lambda: [{"text": r["prompt"] + r["completion"]} for r in prompt_completion_rows(4)], {}),
}


@pytest.mark.parametrize("case", list(PREPARED))
def test_prepare_sft_examples(tmp_path, tokenizer, case):
    """The dry run's examples are token for token, label for label, those TRL's trainer trains on."""
    rows, overrides = PREPARED[case]
    data = Dataset.from_list(rows())
    trainer = trl_trainer(tmp_path, build_tiny_model(tokenizer, hidden_size=32, intermediate_size=64), tokenizer, data,
                          **overrides)
    prepared = compat.prepare_sft_examples(data, tokenizer, trl_config(tmp_path, **overrides), 3)
    assert len(prepared) == 3
    for ours, theirs in zip(prepared, trainer.train_dataset):
        assert ours["input_ids"] == theirs["input_ids"]
        assert ours["labels"] == theirs["labels"]
    assert any(label == -100 for label in prepared[0]["labels"]) == (case not in ("prompt_completion_full_loss", "text"))


def test_prepare_sft_examples_packed(tmp_path, tokenizer):
    """With packing (plain-text corpora), the dry run shows the blocks the trainer packs: the first ones are TRL's."""
    rows = [{"text": " ".join([r["prompt"], r["completion"]] * 3)} for r in prompt_completion_rows(6)]
    data = Dataset.from_list(rows)
    overrides = dict(packing=True, packing_strategy="wrapped", max_length=16)
    trainer = trl_trainer(tmp_path, build_tiny_model(tokenizer, hidden_size=32, intermediate_size=64), tokenizer, data,
                          **overrides)
    prepared = compat.prepare_sft_examples(data, tokenizer, trl_config(tmp_path, **overrides), 2)
    assert len(prepared) == 2
    for ours, theirs in zip(prepared, trainer.train_dataset):
        assert len(ours["input_ids"]) == 16 and ours["input_ids"] == theirs["input_ids"]
