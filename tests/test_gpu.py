"""Checks that need a CUDA GPU (marker `gpu`; skipped, saying so, on a machine without one).

`python -m pytest -m gpu` on a GPU machine runs only these. The kernels themselves are also
tested on the CPU by `test_triton_kernels.py` (Triton's interpreter); here the compiled kernels
meet the rest of the stack: the fused path against the full-logits path in half precision, the
chunk memory plan, QLoRA on CUDA, and a short trainer run per loss.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from loss_cases import case_id, cases, default_hparams

from trl_emo.losses import CostEmbedding, fused_linear_loss, get_loss
from trl_emo.losses.asft import ReferenceHead

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CASES = cases()
IDS = [case_id(name, hp) for name, hp in CASES]
# Relative (norm) error allowed against a float64 computation from the same rounded inputs: the
# rounding of the logits and of the stored gradient (bf16 keeps 8 bits, fp16 11).
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}
# fp16 gradients are compared as fp16 training computes them, under a loss scale: unscaled, the per-element
# gradients of a mean over 1,024 tokens (1e-10 to 1e-8 for ASFT and TaiLr) are below fp16's smallest subnormal
# and come back as zeros (seen on an H200, docs/gpu_check_2026-11-26.md). GradScaler starts at 2**16 and grows
# while nothing overflows; 2**20 keeps every element here normal and the largest far below 65,504.
LOSS_SCALE = {torch.bfloat16: 1.0, torch.float16: 2.0**20}
# Losses with a reference term: twice what rounding the inputs' logits alone does to ASFT's gradient (below).
REFERENCE_TOLERANCE = {torch.bfloat16: 2.5e-2, torch.float16: 4e-3}
DEVICE = "cuda"


def _inputs(dtype, n=1024, hidden=256, vocab=32_000, seed=0, ladder=False):
    """Random inputs; `ladder`: every row's hidden state scaled by its own step of a geometric ladder, so that no two
    rows have nearly the same entropy or KL. EKSFT selects the top rows by both: on plain random rows the bf16
    rounding of the logits flips rows across the cut and moves the gradient by 5.7 % (float64 on the CPU; 0.06 % on
    the ladder), a property of a selection, not of the kernels."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    h = torch.randn(n, hidden, device=DEVICE, generator=g)
    if ladder:
        h = h * (0.25 * 1.003 ** torch.randperm(n, device=DEVICE, generator=g).float())[:, None]
    h = h.to(dtype).requires_grad_(True)
    w = (0.05 * torch.randn(vocab, hidden, device=DEVICE, generator=g)).to(dtype).requires_grad_(True)
    y = torch.randint(0, vocab, (n,), device=DEVICE, generator=g)
    return h, w, y


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("name", "hp"), CASES, ids=IDS)
def test_fused_equals_the_logits_path_in_half_precision(name, hp, dtype):
    spec = get_loss(name)
    with_reference = bool(spec.needs_reference)
    h, w, y = _inputs(dtype, ladder=spec.prepare is not None)
    kwargs, ref_kwargs = dict(hp), dict(hp)
    if spec.uses_cost_embedding:
        kwargs["cost_embedding"] = CostEmbedding(w.detach())
        ref_kwargs["cost_embedding"] = CostEmbedding(w.detach().double())
    tolerance = TOLERANCE[dtype]
    if with_reference:
        # ASFT, EKSFT: the reference model is another head on the same hidden states.
        g = torch.Generator(device=DEVICE).manual_seed(1)
        w_ref = (w.detach().float() + 0.02 * torch.randn(w.shape, device=DEVICE, generator=g)).to(dtype)
        kwargs["reference"] = ReferenceHead(h.detach(), w_ref)
        ref_kwargs["reference"] = h.detach().double() @ w_ref.double().t()
        # The kernels read both models' logits from half-precision chunk buffers, and the reference term's
        # gradient is a difference of two close distributions, which multiplies that rounding: rounding the
        # logits of these inputs to bf16, in float64 on the CPU, moves ASFT's gradient by 1.2 % (fp16: 0.15 %), what
        # an H200 measured for the kernels against float64 (docs/gpu_check_2026-11-26.md).
        tolerance = REFERENCE_TOLERANCE[dtype]
    h64, w64 = h.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    logits = h64 @ w64.t()
    out = fused_linear_loss(h, w, y, spec, kwargs)  # auto: the Triton kernels on CUDA
    gh, gw = torch.autograd.grad(out.loss * LOSS_SCALE[dtype], (h, w))
    ref = spec.per_token(logits, y, **ref_kwargs).mean()
    rh, rw = torch.autograd.grad(ref * LOSS_SCALE[dtype], (h64, w64))
    assert abs(out.loss.item() - ref.item()) <= 2e-3 * max(1.0, abs(ref.item()))
    assert _rel(gh, rh) < tolerance and _rel(gw, rw) < tolerance


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
                  ("tailr", {}), ("mixce", {}), ("ce_entropy", {}), ("sed", {}), ("eksft", {}),
                  ("eksft", {"eksft_formula": "authors"}), ("nll", {})]


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


@pytest.mark.parametrize("loss_type", ["sed", "eksft"])
def test_sft_then_grpo_commands_on_cuda(tmp_path, loss_type):
    """The RL-preparing chain on a GPU: `trl_emo.sft` with SED-SFT or EKSFT, then `trl_emo.grpo` from its output."""
    from conftest import CORPUS
    from data_fixtures import write_fixture

    from trl_emo.commands import grpo, sft
    from trl_emo.models.tiny import save_tiny_causal_lm

    model = save_tiny_causal_lm(CORPUS, output_dir=tmp_path / "chat", vocab_size=320, hidden_size=32,
                                intermediate_size=64)
    sft_out, rl_out = tmp_path / "sft", tmp_path / "grpo"
    assert sft.run(["--recipe", "demo", "--use_cpu", "false", "--bf16", "true", "--model_name_or_path", model,
                    "--dataset_name", write_fixture("metamath", tmp_path, n_rows=8), "--dataset_schema", "metamath",
                    "--prompt_format", "chat_template", "--loss_type", loss_type, "--max_steps", "2",
                    "--per_device_train_batch_size", "4", "--output_dir", str(sft_out)]) == 0
    assert grpo.run(["--model_name_or_path", str(sft_out), "--dataset_name", write_fixture("gsm8k", tmp_path),
                     "--reward_funcs", "gsm8k_answer", "--bf16", "true", "--max_steps", "2",
                     "--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "8",
                     "--learning_rate", "1e-2", "--logging_steps", "1", "--report_to", "none", "--save_strategy", "no",
                     "--output_dir", str(rl_out)]) == 0
    state = json.loads((rl_out / "trainer_state.json").read_text())
    rows = [row for row in state["log_history"] if "reward" in row]
    assert [row["step"] for row in rows] == [1, 2]
    assert all(math.isfinite(row["loss"]) for row in rows)
