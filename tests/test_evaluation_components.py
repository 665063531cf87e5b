"""Pieces of the evaluation with tiny offline models: config, prompts, scoring, generation, cache."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json
import sys

import pytest
import torch

from trl_emo.core.errors import ConfigError
from trl_emo.evaluation.cache import JsonlCache
from trl_emo.evaluation.config import EvalConfig
from trl_emo.evaluation.errors import EvaluationError
from trl_emo.evaluation.generation import HFGenerator, VLLM_MISSING, import_vllm, plan_batches, stop_token_ids
from trl_emo.data.prompts import alpaca_prompt
from trl_emo.evaluation.prompts import load_prompt_set, render_policy_prompt
from trl_emo.evaluation.scoring import RewardModel
from trl_emo.models.tiny import END_OF_TURN, build_tiny_reward_model, save_tiny_causal_lm, train_tokenizer

from conftest import EVAL_TEXTS as TEXTS, EVAL_TINY as TINY
from data_fixtures import write_jsonl


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("rm")
    tokenizer = train_tokenizer(TEXTS, vocab_size=300)
    build_tiny_reward_model(tokenizer, seed=1, **TINY).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return save_tiny_causal_lm(TEXTS, output_dir=tmp_path_factory.mktemp("policy") / "m", vocab_size=300, **TINY)


def make_config(tmp_path, **overrides):
    values = dict(policies=["p=/nonexistent"], prompts="prompts.jsonl", output_dir=str(tmp_path / "out"), n=4)
    values.update(overrides)
    return EvalConfig(**values)


# ---------------------------------------------------------------- config


def test_config_validates_what_yaml_can_bypass(tmp_path):
    with pytest.raises(ConfigError, match="n must be >= 1"):
        make_config(tmp_path, n=0)
    with pytest.raises(ConfigError, match=r"k_values: k = \[8\] larger than n = 4"):
        make_config(tmp_path, k_values=[1, 8])
    with pytest.raises(ConfigError, match="backend must be one of hf, vllm"):
        make_config(tmp_path, backend="vLLM")
    with pytest.raises(ConfigError, match="top_p"):
        make_config(tmp_path, top_p=1.5)
    with pytest.raises(ConfigError, match="used twice"):
        make_config(tmp_path, policies=["a=/x", "a=/y"])
    config = make_config(tmp_path, n=6, policies={"ce": "/x/ce", "gem": "/x/gem"})
    assert config.policies == {"ce": "/x/ce", "gem": "/x/gem"}
    assert config.k_values == [1, 2, 4, 6]
    assert config.math_k_values == [1, 4]
    assert make_config(tmp_path, policies=["/models/my-ce/"]).policies == {"my-ce": "/models/my-ce/"}


# ---------------------------------------------------------------- prompts


def test_prompt_layouts(tmp_path):
    alpaca = tmp_path / "alpaca_eval.json"
    alpaca.write_text(json.dumps([{"instruction": "Name a fruit.", "output": "Apple.", "generator": "gpt4"}]))
    prompts = load_prompt_set(make_config(tmp_path, prompts=str(alpaca), reference_column="output"))
    assert prompts.examples[0].messages == [{"role": "user", "content": "Name a fruit."}]
    assert prompts.examples[0].reference == "Apple."
    assert not prompts.has_gold

    chat = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello!"}]
    ultra = write_jsonl(tmp_path / "uf.jsonl", [{"prompt": "Hi?", "prompt_id": "abc", "messages": chat}])
    prompts = load_prompt_set(make_config(tmp_path, prompts=ultra, reference_column="messages"))
    # `messages` wins over `prompt`; the final assistant turn is the reference, not part of the prompt.
    assert prompts.examples[0].messages == chat[:1]
    assert prompts.examples[0].reference == "Hello!"
    assert prompts.examples[0].id == "abc"

    gsm_rows = [{"question": "1+1?", "answer": "1+1=2\n#### 2"}, {"question": "2*3?", "answer": "#### 6"}]
    gsm = write_jsonl(tmp_path / "gsm.jsonl", gsm_rows)
    prompts = load_prompt_set(make_config(tmp_path, prompts=gsm, max_prompts=1))
    assert [e.gold for e in prompts.examples] == ["2"]


def test_missing_prompt_column_names_what_exists_and_what_is_accepted(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"text": "x", "label": 1}])
    with pytest.raises(EvaluationError) as info:
        load_prompt_set(make_config(tmp_path, prompts=path))
    message = str(info.value)
    assert "['text', 'label']" in message and "messages, prompt, instruction, question" in message
    with pytest.raises(EvaluationError, match="reference_column 'ref' is not a column"):
        load_prompt_set(make_config(tmp_path, prompts=path, prompt_column="text", reference_column="ref"))
    with pytest.raises(EvaluationError, match="Prompt file not found"):
        load_prompt_set(make_config(tmp_path, prompts=str(tmp_path / "missing.jsonl")))


def test_alpaca_prompt_for_base_models_and_chat_template_otherwise(tmp_path):
    rows = [{"instruction": "Add 2 and 3."}, {"instruction": "Translate.", "input": "Hallo"}]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    examples = load_prompt_set(make_config(tmp_path, prompts=path)).examples
    base = train_tokenizer(TEXTS, vocab_size=300, chat_template=False)
    # The very prompt the SFT data pipeline trains base models on.
    assert render_policy_prompt(base, examples[0]) == alpaca_prompt("Add 2 and 3.")
    assert render_policy_prompt(base, examples[0]).startswith("Below is an instruction that describes a task. Write")
    with_input = render_policy_prompt(base, examples[1])
    assert "### Instruction:\nTranslate.\n\n### Input:\nHallo\n\n### Response:" in with_input
    chat = train_tokenizer(TEXTS, vocab_size=300)
    assert render_policy_prompt(chat, examples[0]) == "<s><|user|>\nAdd 2 and 3.<|end|>\n<|assistant|>\n"
    assert render_policy_prompt(chat, examples[0], "alpaca").startswith("Below is an instruction")

    # A multi-turn conversation for a base model: the last user turn is the instruction, earlier turns the input.
    chat_rows = [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "Name a colour."},
            ]
        }
    ]
    example = load_prompt_set(make_config(tmp_path, prompts=write_jsonl(tmp_path / "m.jsonl", chat_rows))).examples[0]
    assert example.instruction == "Name a colour."
    rendered = render_policy_prompt(base, example)
    assert "### Instruction:\nName a colour." in rendered and "Be brief." in rendered and "Hello" in rendered


# ---------------------------------------------------------------- scoring


def test_batched_scores_equal_one_by_one_scores(reward_dir):
    model = RewardModel(reward_dir, dtype="float32", device="cpu")
    messages = [{"role": "user", "content": "Write a poem about the sea."}]
    responses = ["Waves.", "The sea is wide and deep and blue, hello world how are you", "", "42"]
    encoded = [model.encode(messages, r) for r in responses]
    assert len({len(e) for e in encoded}) > 1  # the batch really needs padding
    batched = model.score(encoded)
    alone = [model.score([e])[0] for e in encoded]
    assert batched == pytest.approx(alone, abs=1e-5)
    assert len(set(round(s, 6) for s in batched)) > 1  # the responses are told apart


def test_reward_model_gets_one_bos_and_its_chat_template(reward_dir):
    from tokenizers.processors import TemplateProcessing

    model = RewardModel(reward_dir, dtype="float32", device="cpu")
    tokenizer = model.tokenizer
    bos = tokenizer.bos_token_id
    # Make the tokenizer add a BOS by itself, like Llama's: the template's own BOS must not be doubled.
    tokenizer._tokenizer.post_processor = TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    assert tokenizer("hi")["input_ids"][0] == bos
    ids = model.encode([{"role": "user", "content": "Hi"}], "Hello")
    assert ids[0] == bos and ids[1] != bos
    assert ids.count(bos) == 1
    assert tokenizer.decode(ids) == "<s><|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|>\n"


def test_reward_model_without_chat_template_scores_a_question_answer_pair(reward_dir):
    model = RewardModel(reward_dir, dtype="float32", device="cpu")
    model.use_chat_template = False
    ids = model.encode([{"role": "user", "content": "What is 2+2?"}], "4")
    assert ids == model.tokenizer("What is 2+2?", "4")["input_ids"]


def test_a_sequence_ending_with_the_pad_id_is_scored_at_its_last_token(reward_dir):
    model = RewardModel(reward_dir, dtype="float32", device="cpu")
    ids = model.encode([{"role": "user", "content": "Hi"}], "Hello") + [model.pad_id]
    # Last-token pooling of the model itself would read the token before the trailing pad id.
    with torch.no_grad():
        logits = model.model.model(input_ids=torch.tensor([ids])).last_hidden_state
        expected = float(model.model.score(logits)[0, -1, 0])
    assert model.score([ids, ids[:3]])[0] == pytest.approx(expected, abs=1e-5)


# ---------------------------------------------------------------- generation


def test_batches_cover_every_sample_once_at_fixed_positions():
    for n, size in [(4, 8), (4, 6), (8, 3), (1, 5)]:
        batches = plan_batches(5, n, size)
        keys = [(i, j) for b in batches for i in b.prompts for j in b.samples]
        assert sorted(keys) == [(i, j) for i in range(5) for j in range(n)]
        assert all(len(b.prompts) * len(b.samples) <= max(size, n if n <= size else size) for b in batches)
    assert plan_batches(5, 4, 8) == plan_batches(5, 4, 8)
    greedy = plan_batches(5, 1, 2, greedy=True)
    assert [b.prompts for b in greedy] == [(0, 1), (2, 3), (4,)]


def test_stop_tokens_include_the_chat_end_of_turn(policy_dir):
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    other = tokenizer.convert_tokens_to_ids("<|user|>")
    ids = stop_token_ids(tokenizer, GenerationConfig(eos_token_id=[tokenizer.eos_token_id, other]), end_of_turn=True)
    assert ids == [tokenizer.eos_token_id, other, end]
    assert end not in stop_token_ids(tokenizer, None, end_of_turn=False)


def test_lora_adapter_folder_is_loaded_on_its_base_and_merged(tmp_path, policy_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(policy_dir)
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "adapter")
    ids = torch.tensor([[1, 10, 20, 30]])
    with torch.no_grad():
        expected = peft_model(input_ids=ids).logits
        base_logits = AutoModelForCausalLM.from_pretrained(policy_dir)(input_ids=ids).logits
    assert not torch.allclose(expected, base_logits, atol=1e-4)  # the adapter changes the model

    config = make_config(tmp_path, device="cpu", max_new_tokens=4)
    generator = HFGenerator(str(tmp_path / "adapter"), config, AutoTokenizer.from_pretrained(policy_dir))
    with torch.no_grad():
        merged = generator.model(input_ids=ids).logits
    assert torch.allclose(merged, expected, atol=1e-4)
    assert not hasattr(generator.model, "peft_config")  # merged, plain model
    prompts = ["<s><|user|>\nhi<|end|>\n<|assistant|>\n", "<s><|user|>\nhello world<|end|>\n"]
    out = generator.generate(prompts, 2, seed=0)
    assert [len(r) for r in out] == [2, 2]
    assert all(1 <= r["num_tokens"] <= 4 for rs in out for r in rs)


def test_sampling_is_reproducible_for_a_seed(policy_dir, tmp_path):
    from transformers import AutoTokenizer

    config = make_config(tmp_path, device="cpu", max_new_tokens=6, temperature=1.0)
    generator = HFGenerator(policy_dir, config, AutoTokenizer.from_pretrained(policy_dir))
    prompts = [
        "<s><|user|>\nhi<|end|>\n<|assistant|>\n",
        "<s><|user|>\nWrite a poem about the sea.<|end|>\n<|assistant|>\n",
    ]
    first = generator.generate(prompts, 3, seed=5)
    assert generator.generate(prompts, 3, seed=5) == first
    assert generator.generate(prompts, 3, seed=6) != first


def test_vllm_backend_without_vllm_says_how_to_fix_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail even where it is installed
    with pytest.raises(EvaluationError) as info:
        import_vllm()
    assert str(info.value) == VLLM_MISSING
    assert "pip install vllm" in VLLM_MISSING and "backend: hf" in VLLM_MISSING


# ---------------------------------------------------------------- cache


def test_cache_survives_a_torn_last_line_and_refuses_other_settings(tmp_path):
    path = tmp_path / "c.jsonl"
    cache = JsonlCache(path, {"n": 4}, ("i",))
    cache.append([{"i": 0, "v": "a"}, {"i": 1, "v": "b"}])
    with open(path, "a") as handle:
        handle.write('{"i": 2, "v": "c", "fing')  # killed mid-write
    cache = JsonlCache(path, {"n": 4}, ("i",))
    assert sorted(cache.rows) == [(0,), (1,)]
    cache.append([{"i": 2, "v": "c"}])
    assert [json.loads(line)["i"] for line in path.read_text().splitlines()] == [0, 1, 2]

    with pytest.raises(EvaluationError, match=r"n: cached 4, now 8"):
        JsonlCache(path, {"n": 8}, ("i",))
    assert len(JsonlCache(path, {"n": 8}, ("i",), overwrite=True)) == 0


def test_parquet_files_and_saved_dataset_folders(tmp_path):
    import datasets

    rows = {"prompt": ["one?", "two?"], "prompt_id": ["a", "b"]}
    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "p.parquet"))
    prompts = load_prompt_set(make_config(tmp_path, prompts=str(tmp_path / "p.parquet")))
    assert [(e.id, e.instruction) for e in prompts.examples] == [("a", "one?"), ("b", "two?")]
    (tmp_path / "p.csv").write_text('instruction,output\n"Say hi, please.",Hi\n')
    prompts = load_prompt_set(make_config(tmp_path, prompts=str(tmp_path / "p.csv"), reference_column="output"))
    assert [(e.instruction, e.reference) for e in prompts.examples] == [("Say hi, please.", "Hi")]

    splits = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"prompt": ["train"]}),
            "test": datasets.Dataset.from_dict({"prompt": ["t"]}),
        }
    )
    splits.save_to_disk(str(tmp_path / "saved"))
    prompts = load_prompt_set(make_config(tmp_path, prompts=str(tmp_path / "saved")))
    assert [e.instruction for e in prompts.examples] == ["t"]  # `test` is taken when there are several splits
    prompts = load_prompt_set(make_config(tmp_path, prompts=str(tmp_path / "saved"), prompts_split="train"))
    assert [e.instruction for e in prompts.examples] == ["train"]


def test_hub_prompt_set_offline_is_a_clear_error(tmp_path):
    with pytest.raises(EvaluationError, match="Could not load the prompt set 'someone/no-such-set'"):
        load_prompt_set(make_config(tmp_path, prompts="someone/no-such-set"))
