"""`trl_emo.models.sources`: one path-or-Hub rule for every command, and adapters loaded the same way by DPO and evaluation,
including an adapter whose SFT run added tokens."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from conftest import CORPUS, prompt_completion_rows
from trl_emo.models import sources


def test_one_rule_for_local_paths_and_hub_ids(tmp_path):
    (tmp_path / "model").mkdir()
    for name in ("gpt2", "meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-0.5B", "HuggingFaceH4/ultrafeedback_binarized"):
        assert sources.locate(name) == ("hub", name), name
    for name in ("./x", "/abs/folder", "~/d.parquet", "a/b/c", "data/train.jsonl", "emb.npy", "models/ce/", "a b", "C:\\m"):
        assert sources.locate(name)[0] == "missing", name
    assert sources.locate(str(tmp_path / "model")) == ("local", str(tmp_path / "model"))


def test_the_commands_share_the_rule(tmp_path):
    """Datasets, models for evaluation and DPO, and EMO's cost embedding tell a missing path from a Hub id alike."""
    from trl_emo.data import DataPathError, resolve_source
    from trl_emo.evaluation.errors import EvaluationError
    from trl_emo.evaluation.loading import check_model_source
    from trl_emo.losses import load_cost_embedding

    missing = str(tmp_path / "nothing" / "here")
    with pytest.raises(DataPathError):
        resolve_source(missing)
    with pytest.raises(EvaluationError, match="folder not found"):
        check_model_source(missing, "Policy 'p'")
    with pytest.raises(FileNotFoundError, match="EMO cost embedding not found"):
        load_cost_embedding(missing)
    assert resolve_source("owner/name").kind == "hub"
    check_model_source("owner/name", "Policy 'p'")  # a Hub id: checked when loaded


@pytest.fixture(scope="module")
def adapter_with_added_tokens(tmp_path_factory):
    """A LoRA adapter from `trl_emo.SFTTrainer` whose run cloned a chat template that brings a new special token: TRL
    added it to the tokenizer and resized the embeddings (to a multiple of 64) before training."""
    from peft import LoraConfig
    from transformers import AutoTokenizer

    from conftest import cpu_config
    from datasets import Dataset
    from trl_emo import SFTTrainer
    from trl_emo.models.tiny import CHAT_TEMPLATE, save_tiny_causal_lm

    root = tmp_path_factory.mktemp("sources")
    base = save_tiny_causal_lm(CORPUS, output_dir=root / "base", vocab_size=320, chat_template=False, hidden_size=32,
                               intermediate_size=64)
    template = AutoTokenizer.from_pretrained(base)
    template.add_special_tokens({"additional_special_tokens": ["<|turn|>"]})
    template.chat_template = CHAT_TEMPLATE.replace("<|end|>", "<|turn|>")
    template.save_pretrained(root / "template")
    args = cpu_config(root / "sft", loss_type="gem", max_steps=2, learning_rate=5e-2,
                      chat_template_path=str(root / "template"))
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}],
                                  "completion": [{"role": "assistant", "content": r["completion"]}]}
                                 for r in prompt_completion_rows(16)])
    trainer = SFTTrainer(model=base, args=args, train_dataset=dataset,
                         peft_config=LoraConfig(r=4, target_modules="all-linear", lora_alpha=8))
    trainer.train()
    trainer.save_model(str(root / "adapter"))
    model = trainer.model.eval()
    ids = torch.tensor([trainer.processing_class.apply_chat_template(
        [{"role": "user", "content": "what is 3 plus 3?"}], add_generation_prompt=True, tokenize=True, return_dict=False)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return {"root": root, "base": base, "adapter": str(root / "adapter"), "ids": ids, "logits": logits,
            "vocab": len(trainer.processing_class)}


def test_an_adapter_whose_run_added_tokens_loads_merged(adapter_with_added_tokens):
    assets = adapter_with_added_tokens
    assert assets["vocab"] > 320  # the run added tokens
    merged = sources.load_causal_lm(assets["adapter"], torch.float32).eval()
    assert merged.get_input_embeddings().weight.shape[0] == assets["vocab"]
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=assets["ids"]).logits, assets["logits"], atol=1e-4)
    # DPO's merged starting model is the same model, saved once and reused.
    target = sources.merge_adapter_to(assets["adapter"], str(assets["root"] / "merged"), "float32")
    stamp = (assets["root"] / "merged" / sources.MERGE_STAMP).stat().st_mtime
    assert sources.merge_adapter_to(assets["adapter"], target, "float32") == target
    assert (assets["root"] / "merged" / sources.MERGE_STAMP).stat().st_mtime == stamp
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        saved = AutoModelForCausalLM.from_pretrained(target).eval()
        assert torch.allclose(saved(input_ids=assets["ids"]).logits, assets["logits"], atol=1e-4)


def test_evaluating_an_adapter_whose_run_added_tokens(adapter_with_added_tokens, capsys):
    from trl_emo.commands.evaluate import run

    assets = adapter_with_added_tokens
    prompts = assets["root"] / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"what is {i} plus 1?"}) + "\n" for i in range(2)))
    recipe = assets["root"] / "eval.yaml"
    recipe.write_text(yaml.safe_dump({
        "policies": {"lora": assets["adapter"]}, "prompts": str(prompts), "n": 2, "max_new_tokens": 4,
        "temperature": 1.0, "diversity": False, "embedding_diversity": False, "plot": False, "progress": False,
        "device": "cpu", "dtype": "float32", "prompt_format": "chat_template", "output_dir": str(assets["root"] / "eval"),
    }))
    assert run(["--recipe", str(recipe)]) == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (assets["root"] / "eval" / "generations" / "lora.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(row["prompt"].endswith("<|assistant|>\n") for row in rows)
