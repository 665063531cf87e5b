"""Checks that need a CUDA GPU (marker `gpu`; skipped, saying so, on a machine without one).

`python -m pytest -m gpu` on a GPU machine runs only these. The kernels themselves are also
tested on the CPU by `test_triton_kernels.py` (Triton's interpreter); here the compiled kernels
meet the rest of the stack: the fused path against the full-logits path in half precision, the
chunk memory plan, QLoRA on CUDA, and a short trainer run per loss.
"""

from __future__ import annotations

import pytest
import torch

from trl_emo.losses import CostEmbedding, fused_linear_loss, get_loss
from trl_emo.losses.asft import ReferenceHead

from loss_cases import case_id, cases, default_hparams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CASES = cases()
IDS = [case_id(name, hp) for name, hp in CASES]
# Relative (norm) error allowed against a float64 computation from the same rounded inputs: the
# rounding of the logits and of the stored gradient (bf16 keeps 8 bits, fp16 11).
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _inputs(dtype, n=1024, hidden=256, vocab=32_000, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(n, hidden, device="cuda", generator=g).to(dtype).requires_grad_(True)
    w = (0.05 * torch.randn(vocab, hidden, device="cuda", generator=g)).to(dtype).requires_grad_(True)
    y = torch.randint(0, vocab, (n,), device="cuda", generator=g)
    return h, w, y


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("name", "hp"), CASES, ids=IDS)
def test_fused_equals_the_logits_path_in_half_precision(name, hp, dtype):
    h, w, y = _inputs(dtype)
    spec = get_loss(name)
    kwargs, ref_kwargs = dict(hp), dict(hp)
    if spec.uses_cost_embedding:
        kwargs["cost_embedding"] = CostEmbedding(w.detach())
        ref_kwargs["cost_embedding"] = CostEmbedding(w.detach().double())
    if spec.needs_reference:  # ASFT: the reference model is another head on the same hidden states
        w_ref = (w.detach().float() + 0.02 * torch.randn_like(w.float())).to(dtype)
        kwargs["reference"] = ReferenceHead(h.detach(), w_ref)
        ref_kwargs["reference"] = h.detach().double() @ w_ref.double().t()
    out = fused_linear_loss(h, w, y, spec, kwargs)  # auto: the Triton kernels on CUDA
    gh, gw = torch.autograd.grad(out.loss, (h, w))

    h64, w64 = h.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    ref = spec.per_token(h64 @ w64.t(), y, **ref_kwargs).mean()
    rh, rw = torch.autograd.grad(ref, (h64, w64))
    assert abs(out.loss.item() - ref.item()) <= 2e-3 * max(1.0, abs(ref.item()))
    assert _rel(gh, rh) < TOLERANCE[dtype] and _rel(gw, rw) < TOLERANCE[dtype]


def test_auto_backend_is_triton_on_cuda():
    pytest.importorskip("triton")
    from trl_emo.losses.fused import resolve_backend

    assert resolve_backend("auto", get_loss("gem"), torch.device("cuda"), torch.bfloat16) == "triton"


@pytest.mark.parametrize("name", ["nll", "gem", "emo"])
def test_peak_memory_follows_the_chunk_plan(name):
    """Peak extra memory: the head and hidden gradients plus the chunk buffers, never [tokens, vocab]."""
    n, hidden, vocab = 8192, 512, 32_000
    h, w, y = _inputs(torch.bfloat16, n=n, hidden=hidden, vocab=vocab)
    spec = get_loss(name)
    hp = default_hparams(name)
    if spec.uses_cost_embedding:
        hp["cost_embedding"] = CostEmbedding(w.detach())
    budget = 64 * 2**20
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    out = fused_linear_loss(h, w, y, spec, hp, chunk_memory=budget)
    torch.autograd.grad(out.loss, (h, w))
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - start
    gradients = (n * hidden + vocab * hidden) * 2
    logits = n * vocab * 2
    # 64 MiB of slack: statistics, the target logits, cuBLAS workspaces.
    assert extra < gradients + budget + 64 * 2**20, (extra, gradients, budget)
    assert extra < logits / 2


def _gpu_config(output_dir, **overrides):
    from trl_emo import SFTConfig

    values = dict(
        output_dir=str(output_dir), bf16=True, max_steps=2, per_device_train_batch_size=8, learning_rate=1e-3,
        logging_steps=1, report_to="none", gradient_checkpointing=False, save_strategy="no", max_length=64, seed=0,
        disable_tqdm=True,
    )
    values.update(overrides)
    return SFTConfig(**values)


TRAINER_LOSSES = [("gem", {}), ("gem", {"gem_h": "logsigmoid"}), ("emo", {}), ("emo", {"emo_cost_embedding": "lm_head"}),
                  ("tailr", {}), ("mixce", {}), ("ce_entropy", {}), ("nll", {})]


@pytest.mark.parametrize(("loss_type", "extra"), TRAINER_LOSSES, ids=[f"{n}-{len(e)}" for n, e in TRAINER_LOSSES])
def test_two_trainer_steps_per_loss_on_cuda(tmp_path, make_model, tokenizer, pc_dataset, loss_type, extra):
    from trl_emo import SFTTrainer

    model = make_model()
    trainer = SFTTrainer(model=model, args=_gpu_config(tmp_path, loss_type=loss_type, **extra), train_dataset=pc_dataset,
                         processing_class=tokenizer)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert next(trainer.model.parameters()).device.type == "cuda"
    logged = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert len(logged) == 2 and all(torch.isfinite(torch.tensor(logged)))
    assert any(not torch.equal(a, b.to(a.device)) for a, b in zip(before, trainer.model.parameters()))


@pytest.mark.parametrize("loss_type", ["gem", "emo"])
def test_qlora_on_cuda(tmp_path, make_model, tokenizer, pc_dataset, loss_type):
    pytest.importorskip("bitsandbytes")
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from trl_emo import SFTTrainer

    make_model(hidden_size=64, intermediate_size=128).save_pretrained(str(tmp_path / "base"))
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"), quantization_config=quant, dtype=torch.bfloat16,
                                                 device_map={"": 0})
    peft_config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=_gpu_config(tmp_path / "out", loss_type=loss_type), train_dataset=pc_dataset,
                         processing_class=tokenizer, peft_config=peft_config)
    trainer.train()
    logged = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert all(torch.isfinite(torch.tensor(logged)))
    if loss_type == "emo":
        # The head is frozen under QLoRA: EMO's cost embedding is the head itself, not a copy.
        assert trainer._objective.head_is_snapshot and trainer._objective.cost is None
