"""A reference that follows the policy: PSFT's old policy and CurioSFT's teacher (`LossSpec.lagged_reference`).

Both are the model itself with older weights in the place of the trainable ones: every `every` optimizer steps those
weights become `(1 - mixup) * lagged + mixup * current` (PSFT: a copy every `psft_old_policy_steps`; CurioSFT: 0.99 of
the policy every 5 steps), starting from the starting weights. So only the trainable tensors are kept:

- under PEFT (LoRA, QLoRA on one card) the adapters (and any `modules_to_save`) alone, an adapter's memory, since the
  frozen base is shared and never changes;
- in full fine-tuning every parameter, a copy of the model's weights (what a frozen reference copy costs, without its
  buffers or a second module).

A forward of the lagged model is the policy's own modules with those tensors swapped in for the call (each parameter's
`.data`, under `torch.no_grad` and in eval mode as verl runs it, restored afterwards), so it runs the same code,
attention implementation, quantized base and hooks as the policy. While the lagged weights equal the policy's (PSFT's
first step of every window, CurioSFT before its first update) no forward runs at all: the loss gets `reference=None`,
which it reads as the policy itself (exactly: the same weights give the same logits).

The weights (and whether they equal the policy's) are saved with every checkpoint (`STATE_FILE`, written inside the
staged save) and restored on resume, so a resumed run continues bit for bit. A checkpoint folder named explicitly
without the file (written with another loss) re-takes them from the resumed weights, with a warning.

Refused under DeepSpeed ZeRO-3 and FSDP, whose parameters are shards (the same limit as a separate reference model).
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch

from .trl_compat import head_parameters, logit_transform

logger = logging.getLogger(__name__)

STATE_FILE = "trl_emo_lagged_policy.safetensors"
# What each loss calls its lagged model, in messages.
_ROLE = {"psft": "old policy", "curio_sft": "teacher"}


def role_name(loss: str) -> str:
    """What `loss` calls its lagged model ("old policy", "teacher"), for messages."""
    return _ROLE.get(loss, "lagged policy")


class LaggedPolicy:
    """The lagged copy of a model's trainable weights, its schedule, and its forward (`hidden_states`, `logits`)."""

    def __init__(self, model, every: int, mixup: float, loss: str = "psft"):
        self.model = model  # the policy (the base model under PEFT), whose modules run the lagged forward
        self.every = int(every)
        self.mixup = float(mixup)
        self.loss = loss
        with torch.no_grad():
            self.weights = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
        # The lagged weights are the policy's: no forward needed (see the module docstring).
        self.in_sync = True
        self._retake = False

    @property
    def role(self) -> str:
        return role_name(self.loss)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.weights.values())

    @classmethod
    def build(cls, trainer, every: int, mixup: float, loss: str) -> LaggedPolicy:
        plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
        if trainer.is_fsdp_enabled or (trainer.is_deepspeed_enabled and getattr(plugin, "zero_stage", None) == 3):
            raise ValueError(
                f"loss_type={loss!r} keeps a lagged copy of the trainable weights, which DeepSpeed ZeRO-3 and FSDP shard; "
                "use DDP or ZeRO-2 (with LoRA the copy is an adapter's size)."
            )
        lagged = cls(trainer._base_model(), every, mixup, loss)
        what = "the adapters" if hasattr(trainer.model, "disable_adapter") else "every parameter (full fine-tuning)"
        logger.warning("%s %s: a copy of %s, %d tensors, %.2f MiB.", loss.upper(), lagged.role, what, len(lagged.weights),
                       lagged.nbytes / 2**20)
        return lagged

    # -- the schedule --------------------------------------------------------------------------------------------------
    def _parameters(self) -> dict[str, torch.nn.Parameter]:
        # Looked up at each use: a resume loads weights into the modules, and they are read where they are now.
        params = {name: p for name, p in self.model.named_parameters() if name in self.weights}
        if params.keys() != self.weights.keys():
            missing = sorted(self.weights.keys() - params.keys())[:3]
            raise RuntimeError(f"the model no longer has the trainable tensors the {self.role} copied ({missing} ...)")
        return params

    @torch.no_grad()
    def _take(self, mixup: float) -> None:
        for name, param in self._parameters().items():
            lagged = self.weights[name]
            if mixup == 1.0:
                lagged.copy_(param)
            else:
                # CurioSFT's sync, in the parameters' dtype as theirs (fsdp_workers.py L855-857).
                lagged.mul_(1.0 - mixup).add_(param.detach(), alpha=mixup)

    def after_step(self, global_step: int) -> None:
        """After optimizer step `global_step` (counted from 1): the weights moved; every `every` steps, the mix."""
        self.in_sync = False
        if global_step % self.every == 0:
            self._take(self.mixup)
            self.in_sync = self.mixup == 1.0

    def begin_training(self) -> None:
        """When training starts (the checkpoint's weights loaded): re-take the lagged weights if a resume had none."""
        if self._retake:
            self._take(1.0)
            self.in_sync = True
            self._retake = False

    # -- the forward ---------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _swapped(self):
        """The lagged tensors in place of the trainable ones, in eval mode (as verl computes the old log-probabilities
        and the teacher's: without dropout), everything restored afterwards."""
        params = self._parameters()
        current = {}
        modes = [(module, module.training) for module in self.model.modules()]
        try:
            self.model.eval()
            for name, param in params.items():
                current[name] = param.data
                param.data = self.weights[name]
            yield
        finally:
            for name, data in current.items():
                params[name].data = data
            for module, training in modes:
                module.training = training

    def _lagged(self, tensor):
        """A head parameter as the lagged model has it (its copy when it trains, the shared tensor when frozen)."""
        if tensor is None:
            return None
        for name, param in self._parameters().items():
            if param is tensor:
                return self.weights[name]
        return tensor

    def hidden_states(self, policy, args, kwargs):
        """`(hidden [B, T, H], head weight, head bias, HeadTransform)` of the lagged model for the policy's batch
        (`trl_compat.add_objective_head`'s reference), or None while it equals the policy."""
        if self.in_sync:
            return None
        with torch.no_grad(), self._swapped():
            hidden = policy.base_model(*args, **kwargs).last_hidden_state
        weight, bias = head_parameters(policy)
        return hidden, self._lagged(weight), self._lagged(bias), logit_transform(policy)

    def logits(self, policy, inputs: dict):
        """The lagged model's logits `[B, T, V]` (the logits path), or None while it equals the policy."""
        if self.in_sync:
            return None
        with torch.no_grad(), self._swapped():
            return policy(**inputs).logits

    # -- checkpoints ---------------------------------------------------------------------------------------------------
    def save(self, folder: str) -> None:
        from safetensors.torch import save_file

        os.makedirs(folder, exist_ok=True)
        tensors = {name: t.detach().contiguous().cpu() for name, t in self.weights.items()}
        save_file(tensors, os.path.join(folder, STATE_FILE), metadata={"in_sync": str(int(self.in_sync))})

    def load(self, folder: str) -> bool:
        """Restore the weights saved with a checkpoint; False when it has none (they are then re-taken from the resumed
        weights when training starts)."""
        from safetensors import safe_open

        path = os.path.join(folder, STATE_FILE)
        if not os.path.isfile(path):
            self._retake = True
            return False
        with safe_open(path, framework="pt") as handle:
            names = set(handle.keys())
            if names != self.weights.keys():
                raise ValueError(
                    f"{path} holds the {self.role} of other trainable tensors ({len(names)} saved, {len(self.weights)} "
                    "trainable now): resume with the same model and PEFT settings, or from another checkpoint."
                )
            with torch.no_grad():
                for name in names:
                    self.weights[name].copy_(handle.get_tensor(name))
            self.in_sync = handle.metadata().get("in_sync") == "1"
        self._retake = False
        return True
