"""Run inside LLaMA-Factory 0.9.5's own environment (tests/framework_venvs.py): its SFT trainer, subclassed so that
`compute_loss` calls trl_emo's fused loss, trains a tiny model two steps on a dataset in LLaMA-Factory's format, through
LLaMA-Factory's own entry (`run_exp`, what `llamafactory-cli train` calls), which builds the subclass in `run_sft`.

`python llamafactory_sft.py MODEL_DIR DATA_DIR OUT_DIR` writes OUT_DIR/results.pt: for each run, the loss and every
parameter's gradient at each step. The runs, from the same model and batches:
- `gem_fused`: our fused GEM through this subclass (the hidden states from the model's own forward, no logits);
- `gem_logits`: GEM from the model's full logits (`trl_emo.losses.causal_lm_loss` with GEM's per-token function).
`dft_fused` and `dft_llamafactory` (LLaMA-Factory's own `use_dft_loss`) can be run too (`--runs`); the test leaves
them out for time (DFT against TRL's formula is `tests/test_standalone.py`'s). The test compares the runs, and that
only trl_emo.losses was imported of trl_emo.
"""

from __future__ import annotations

import sys

import torch
from llamafactory.train.sft import workflow
from llamafactory.train.tuner import run_exp
from transformers import TrainerCallback

from trl_emo.losses import FusedLinearLoss, causal_lm_loss, get_loss


# The loss the runs use; set by `train` before LLaMA-Factory builds the trainer.
RUN = {"loss_type": "gem", "hparams": {}, "losses": []}


class FusedLossTrainer(workflow.CustomSeq2SeqTrainer):
    """LLaMA-Factory's SFT trainer with a trl_emo loss: what a user writes (README, "Outside TRL")."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_fn = FusedLinearLoss.for_model(self.model, RUN["loss_type"], **RUN["hparams"])

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        # Through the model's own (wrapped) forward, so DDP/FSDP/DeepSpeed hooks run; one position of logits only.
        outputs = model(**inputs, output_hidden_states=True, logits_to_keep=1)
        head = self.accelerator.unwrap_model(model).get_output_embeddings()
        loss = self.loss_fn(outputs.hidden_states[-1], head.weight, labels, head.bias,
                            num_items_in_batch=num_items_in_batch)
        RUN["losses"].append(loss.item())
        return (loss, outputs) if return_outputs else loss


class LogitsLossTrainer(workflow.CustomSeq2SeqTrainer):
    """The same loss from the full logits: our own reference path."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = causal_lm_loss(get_loss(RUN["loss_type"]).per_token, outputs.logits, labels, num_items_in_batch,
                              **RUN["hparams"])
        RUN["losses"].append(loss.item())
        return (loss, outputs) if return_outputs else loss


class LlamaFactoryLoss(workflow.CustomSeq2SeqTrainer):
    """LLaMA-Factory's own loss (`use_dft_loss`), its losses recorded."""

    def compute_loss(self, *args, **kwargs):
        loss = super().compute_loss(*args, **kwargs)
        RUN["losses"].append((loss[0] if isinstance(loss, tuple) else loss).item())
        return loss


class Record(TrainerCallback):
    """Every parameter's gradient just before each optimizer step."""

    def __init__(self):
        self.grads = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})


def train(model_dir: str, data_dir: str, out_dir: str, run: str) -> dict:
    """One run through `run_exp`, as `llamafactory-cli train` runs it, with `run_sft` building our trainer class."""
    loss_type, implementation = run.split("_")
    RUN.update(loss_type=loss_type, hparams={"beta": 0.7, "h": "linear"} if loss_type == "gem" else {}, losses=[])
    workflow.CustomSeq2SeqTrainer = {"fused": FusedLossTrainer, "logits": LogitsLossTrainer}.get(
        implementation, LlamaFactoryLoss
    )
    record = Record()
    run_exp(dict(
        model_name_or_path=model_dir, stage="sft", do_train=True, finetuning_type="full", dataset="tiny_alpaca",
        dataset_dir=data_dir, template="default", cutoff_len=64, output_dir=f"{out_dir}/{run}",
        overwrite_output_dir=True, per_device_train_batch_size=2, gradient_accumulation_steps=1, max_steps=2,
        learning_rate=1e-3, lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to="none",
        disable_shuffling=True, use_dft_loss=implementation == "llamafactory", bf16=False, seed=0,
        overwrite_cache=True,
    ), callbacks=[record])
    return {"losses": RUN["losses"], "grads": record.grads}


if __name__ == "__main__":
    model_dir, data_dir, out_dir = sys.argv[1:4]
    runs = sys.argv[5].split(",") if sys.argv[4:5] == ["--runs"] else ["gem_fused", "gem_logits"]
    results = {run: train(model_dir, data_dir, out_dir, run) for run in runs}
    results["trl_emo_modules"] = sorted(m for m in sys.modules if m.startswith("trl_emo"))
    results["trl_emo_path"] = list(sys.modules["trl_emo"].__path__)
    torch.save(results, f"{out_dir}/results.pt")
