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
# fp16 cases whose exact gradient these random inputs put beyond fp16's range. At random initialisation (p_y ~ 1/V)
# the losses that weight a token by its probability (DFT, TaiLr, ASFT's DFT term, EMO without its CE
# weighting) have per-logit gradients near 1e-9, below fp16's smallest subnormal (6e-8). The fused path forms the
# per-logit gradient in the forward pass, before the loss scale, in the fp16 chunk buffer, so the scale cannot lift
# them (the logits path under GradScaler's first scale, 2**16 / 1,024 tokens = 64, stores them at 6e-8 and loses them
# too). Measured on an H100 (2026-11-27, after the float32 scaling fix): 4.4-4.6 % off (DFT, TaiLr, ASFT alpha 0),
# 1.2 % (ASFT alpha 0.1), EMO's head 0.64 %; DFT in Triton's interpreter: 5.1e-2 at p_y ~ 6e-5, 3.2e-3 at p_y ~ 0.7.
# They failed on two H100 runs (2026-11-27, before and after the fix), so they are strict: one that starts to pass is
# an XPASS failure and its marker comes off. bf16 (the recommended precision) covers these losses within tolerance.
FP16_BELOW_RANGE = {"asft-0.1", "asft-0.0", "dft", "emo-none-reference-None", "tailr-0.8-None-paper"}
FP16_BELOW_RANGE_REASON = "per-logit gradients below fp16's subnormal range at random initialisation (see comment)"


def _inputs(dtype, n=1024, hidden=256, vocab=32_000, seed=0, ladder=None):
    """Random inputs; `ladder` (EKSFT's ratio): rows of one norm, each scaled by its own step of a geometric ladder from
    0.25 to 1.5, and by 1.5 more past each cut of the selections (the `ratio · n` smallest scales have the largest
    entropies, the `ratio · n` largest the largest KLs), so that the selections are the same from the kernels'
    half-precision logits as from float64 ones (checked in the test). EKSFT selects the top rows by both, and one row
    flipped across a cut moves the gradient by ~5.7 %, a property of a selection, not of the kernels: on plain random
    rows the bf16 rounding of the logits flips rows, and on the former ladder (0.25 · 1.003^rank, unequal norms) it
    still did: its 0.3 % steps are smaller than the norms' spread, and its largest rows so peaked that bf16 moves their
    KL by 0.1 (an H100, union cases in bf16: one row flipped across the KL cut, gradient off by 5.87 % against the
    2.5 % allowed; these inputs on the same machine: no flip, 0.2 %). Replayed in float64 on the CPU with bf16-rounded
    logits: the entropy cut clear by 0.05 where bf16 moves an entropy by 3e-5, the KL cut by 0.15 where it moves a KL
    by 3e-3 (intersection at 0.5: 0.47 and 0.078 against 3e-4 and 1e-4)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    h = torch.randn(n, hidden, device=DEVICE, generator=g)
    if ladder is not None:
        rank = torch.randperm(n, device=DEVICE, generator=g).float()
        scale = 0.25 * 6.0 ** (rank / (n - 1))
        k = int(n * ladder)
        if k:
            scale = scale * 1.5 ** ((rank >= k).float() + (rank >= n - k).float())
        h = h / h.norm(dim=1, keepdim=True) * (math.sqrt(hidden) * scale[:, None])
    h = h.to(dtype).requires_grad_(True)
    w = (0.05 * torch.randn(vocab, hidden, device=DEVICE, generator=g)).to(dtype).requires_grad_(True)
    y = torch.randint(0, vocab, (n,), device=DEVICE, generator=g)
    return h, w, y


def _eksft_selection(z, zr, hp):
    from trl_emo.losses.eksft import plan_rows, row_statistics

    weights = plan_rows(row_statistics(z, zr, "paper"), hp, z.shape[-1])
    return [weights[name].nonzero().flatten().tolist() for name in ("eksft_entropy_selected", "eksft_kl_selected")]


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("name", "hp"), CASES, ids=IDS)
def test_fused_equals_the_logits_path_in_half_precision(name, hp, dtype, request):
    spec = get_loss(name)
    with_reference = bool(spec.needs_reference)
    if dtype == torch.float16 and case_id(name, hp) in FP16_BELOW_RANGE:
        request.applymarker(pytest.mark.xfail(reason=FP16_BELOW_RANGE_REASON, strict=True))
    h, w, y = _inputs(dtype, ladder=hp["ratio"] if spec.name == "eksft" else None)
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
    if spec.name == "eksft" and hp["ratio"]:
        # The comparison's premise: the kernels select from half-precision logits, `ref` from float64 ones.
        z, zr = logits.detach(), ref_kwargs["reference"]
        assert _eksft_selection(z.to(dtype).double(), zr.to(dtype).double(), hp) == _eksft_selection(z, zr, hp), (
            "the inputs do not separate EKSFT's selections: a row flips across a cut in half precision"
        )
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
                  ("eksft", {"eksft_formula": "authors"}), ("psft", {"psft_old_policy_steps": 2}),
                  ("curio_sft", {"curio_teacher_sync_steps": 1}), ("nll", {})]


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


@pytest.mark.parametrize("loss_type", ["gem", "emo", "curio_sft"])
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
