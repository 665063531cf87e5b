"""`trl_emo.grpo`: GRPO with verifiable rewards on top of an SFT output, the rewards, the prompt sets, the recipes.

Offline and small: a tiny model's full SFT output and its LoRA adapter (made here with `trl_emo.sft`), two GRPO steps
from each, a resumed run, a two-process launch, and two steps on SmolLM2-135M-Instruct from its saved SFT output,
with the rewards recorded as the trainer gets them. A few prompts, 2 generations of at most 8-16 tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from checkpoint_layouts import reseal
from conftest import CORPUS, free_port, launch_failure
from data_fixtures import GRPO_FIXTURE_SCHEMAS, fixture_rows, write_fixture, write_jsonl
from trl_emo.commands import grpo, sft
from trl_emo.evaluation.rewards import REWARDS, completion_text, format_reward, gsm8k_answer, math_answer

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "recipes").glob("grpo_*.yaml"))  # the paper's (demo_grpo: the chain's test, test_commands)


def chat(text):
    """A conversational completion as TRL 1.16 passes it to a reward: one assistant message in a list."""
    return [{"role": "assistant", "content": text}]


# -- rewards -------------------------------------------------------------------------------------------------------

GSM8K_REFERENCE = "She sells 600 + 472 = <<600+472=1072>>1072 clips.\n#### 1,072"


@pytest.mark.parametrize("completion, expected", [
    ("600 + 472 = 1072.\nThe answer is: 1,072", 1.0),  # MetaMath's form, comma
    ("#### 1072", 1.0),  # GSM8K's own form
    ("The answer is $1,072.00.", 1.0),  # a dollar sign and decimals: the same number
    ("The answer is: \\frac{2144}{2}", 1.0),  # math-verify's equivalence, as the GSM8K metrics use it
    ("The answer is: 1071", 0.0),  # wrong
    ("It is 1072 clips.", 0.0),  # malformed: no final-answer marker (the evaluation scores it wrong too)
    ("", 0.0),  # empty
])
def test_gsm8k_answer_on_right_wrong_malformed_and_empty_completions(completion, expected):
    assert gsm8k_answer(["q"], [chat(completion)], answer=[GSM8K_REFERENCE]) == [expected]
    assert gsm8k_answer(["q"], [completion], answer=[GSM8K_REFERENCE]) == [expected]  # standard (string) completions


MATH_REFERENCE = "Solving, $x = \\frac{1}{2}$, so the answer is $\\boxed{\\frac{1}{2}}$."
NESTED_REFERENCE = "The solutions are $\\boxed{\\{-5, \\frac{2}{3}\\}}$."


@pytest.mark.parametrize("completion, reference, expected", [
    ("So \\boxed{0.5}.", MATH_REFERENCE, 1.0),  # equivalent, not equal
    ("\\boxed{\\dfrac{1}{2}}", MATH_REFERENCE, 1.0),
    ("The answer is: \\frac12", MATH_REFERENCE, 1.0),  # no box: the last line, MetaMath's lead-in dropped
    ("\\boxed{\\frac{1}{3}}", MATH_REFERENCE, 0.0),
    ("\\boxed{}", MATH_REFERENCE, 0.0),  # malformed: an empty box
    ("I am not sure.", MATH_REFERENCE, 0.0),
    ("", MATH_REFERENCE, 0.0),
    ("\\boxed{\\left\\{\\frac{2}{3}, -5\\right\\}}", NESTED_REFERENCE, 1.0),  # nested braces, a set in another order
    ("\\boxed{\\{-5\\}}", NESTED_REFERENCE, 0.0),
    ("\\boxed{1,072}", "1072", 1.0),  # a bare reference
])
def test_math_answer_on_right_wrong_malformed_and_empty_completions(completion, reference, expected):
    assert math_answer(["q"], [chat(completion)], answer=[reference]) == [expected]


def test_format_reward_asks_for_the_references_own_form():
    completions = [chat("The answer is: 12"), chat("#### 12"), chat("\\boxed{12}"), chat("twelve"), chat("")]
    assert format_reward(None, completions, answer=[GSM8K_REFERENCE] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert format_reward(None, completions, answer=[MATH_REFERENCE] * 5) == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert format_reward(None, completions, answer=["12"] * 5) == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert format_reward.__name__ == "format" and REWARDS["format"] is format_reward  # logged as rewards/format/...


def test_rewards_take_conversational_and_odd_completions_and_skip_unreadable_references():
    assert completion_text(chat("a")) == "a" and completion_text("b") == "b" and completion_text(None) == ""
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "#### 7"}]}]
    assert gsm8k_answer(None, [parts, chat("#### 8")], answer=["#### 7", "#### 7"]) == [1.0, 0.0]
    # A reference without an answer gives None: TRL leaves the row out of the reward's mean (not a wrong answer).
    assert gsm8k_answer(None, [chat("#### 7")], answer=["no number"]) == [None]
    assert math_answer(None, [chat("\\boxed{7}")], answer=[""]) == [None]


def test_reward_names_and_import_paths_resolve_or_fail_in_one_line():
    from trl_emo.core.errors import ConfigError
    from trl_emo.evaluation.rewards import resolve_reward_funcs

    assert resolve_reward_funcs(["gsm8k_answer", "format"]) == [gsm8k_answer, format_reward]
    assert resolve_reward_funcs(["test_grpo:length_reward"]) == [length_reward]
    assert resolve_reward_funcs(["test_grpo.length_reward"]) == [length_reward]  # TRL's dotted form
    for names, message in ((["gsm8k_anwser"], "did you mean 'gsm8k_answer'"),
                           (["nope_pkg.rewards:score"], "cannot import"), (["test_grpo:missing"], "has no 'missing'"),
                           (["test_grpo:RECIPES"], "not a function")):
        with pytest.raises(ConfigError, match=message) as info:
            resolve_reward_funcs(names)
        assert "\n" not in str(info.value)


# A reward of "yours", by import path: its values vary between completions, and every call is recorded, so the test can
# compare what the trainer logged with what the function returned.
RECORDED: list[dict] = []


def length_reward(prompts, completions, answer, **kwargs):
    texts = [completion_text(c) for c in completions]
    values = [len(text) / 16.0 for text in texts]
    RECORDED.append({"texts": texts, "answers": list(answer), "values": values})
    return values


# -- prompt sets ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("schema", GRPO_FIXTURE_SCHEMAS)
def test_prompt_sets_are_detected_for_grpo_only_and_match_the_hub_columns(schema):
    from datasets import Dataset

    from trl_emo.data import SCHEMAS, DataError, detect_schema

    rows = fixture_rows(schema, 2)
    assert list(rows[0]) == list(SCHEMAS[schema].hub_columns)
    features = Dataset.from_list(rows).features
    assert detect_schema(features, verifiable=True) == schema
    assert not SCHEMAS[schema].sft
    if schema == "gsm8k":  # never SFT data: the SFT error points to GRPO instead
        with pytest.raises(DataError, match="use it with trl_emo.grpo"):
            detect_schema(features)


def test_rows_become_grpo_prompts_with_their_reference():
    from trl_emo.data.adapters import format_verifiable_example

    row = fixture_rows("gsm8k", 1)[0]
    chat_row = format_verifiable_example(row, "gsm8k", "chat_template", system_prompt="Be brief.")
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": row["question"]}]
    assert chat_row == {"prompt": turns, "answer": row["answer"]}
    alpaca = format_verifiable_example(row, "gsm8k", "alpaca")
    assert alpaca["prompt"].endswith("### Response:\n") and row["question"] in alpaca["prompt"]
    own = format_verifiable_example(fixture_rows("prompt_answer", 1)[0], "prompt_answer", "chat_template")
    assert own["prompt"][0]["role"] == "user" and own["answer"] == "4"


def test_rows_without_a_reference_stay_unscored_and_numbers_are_written_out(tmp_path, caplog):
    # One empty `answer` used to stop the whole run with a data error; a JSON number was read as `str(1e-05)` = "1e-05",
    # then as the number 1.
    import logging
    from types import SimpleNamespace

    from trl_emo.data import DataArguments, DataError
    from trl_emo.data.verifiable import load_grpo_datasets

    def load(rows, name):
        script = SimpleNamespace(dataset_name=str(write_jsonl(tmp_path / name, rows)), dataset_config=None,
                                 dataset_train_split="train", dataset_test_split=None)
        data = DataArguments(dataset_schema="prompt_answer", prompt_format="alpaca")
        return load_grpo_datasets(script, data, tokenizer=None)[0]

    rows = [{"prompt": "What is 2 + 2?", "answer": "4"}, {"prompt": "What is 1 + 1?", "answer": ""},
            {"prompt": "What is 3 + 3?", "answer": None}]
    with caplog.at_level(logging.WARNING, logger="trl_emo.data.verifiable"):
        train = load(rows, "own.jsonl")
    assert train["answer"] == ["4", "", ""]
    assert "2 of 3 rows of split 'train' have no reference answer" in caplog.text
    completions = [chat("The answer is 4"), chat("#### 4"), chat("\\boxed{4}")]
    for reward in REWARDS.values():  # the empty rows are not scored by any reward: TRL gives them no advantage
        assert reward(None, completions, answer=train["answer"])[1:] == [None, None]
    with pytest.raises(DataError, match="No row of split 'train' has a reference answer"):
        load([{"prompt": "What is 1 + 1?", "answer": ""}], "none.jsonl")
    numbers = load([{"prompt": "A tiny rate?", "answer": 0.00001}, {"prompt": "How many?", "answer": 72.0}], "n.jsonl")
    assert numbers["answer"] == ["0.00001", "72"]
    assert gsm8k_answer(None, ["The answer is 1", "The answer is 0.00001"], answer=[0.00001] * 2) == [0.0, 1.0]


# -- the command: fixtures -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny chat model, its full SFT output and its LoRA adapter (two `trl_emo.sft` steps each), the prompt sets."""
    from trl_emo.models.tiny import save_tiny_causal_lm

    root = tmp_path_factory.mktemp("grpo")
    model = save_tiny_causal_lm(CORPUS, output_dir=root / "chat", vocab_size=320, hidden_size=32, intermediate_size=64)
    metamath = write_fixture("metamath", root, n_rows=8)
    outputs = {}
    for name, extra in (("full", []), ("lora", ["--use_peft", "true", "--lora_target_modules", "all-linear"])):
        argv = ["--recipe", "demo", "--model_name_or_path", model, "--dataset_name", metamath, "--dataset_schema",
                "metamath", "--prompt_format", "chat_template", "--max_steps", "2", "--per_device_train_batch_size",
                "4", "--output_dir", str(root / f"sft-{name}"), *extra]
        assert sft.run(argv) == 0
        outputs[name] = str(root / f"sft-{name}")
    return {"model": model, **outputs, "gsm8k": write_fixture("gsm8k", root), "math": write_fixture("math", root),
            "root": root}


def short(output_dir, *extra) -> list[str]:
    """Two tiny GRPO steps on CPU: 2 prompts x 2 generations of at most 8 tokens a step."""
    return ["--use_cpu", "true", "--bf16", "false", "--max_steps", "2", "--per_device_train_batch_size", "4",
            "--num_generations", "2", "--max_completion_length", "8", "--learning_rate", "1e-2", "--logging_steps", "1",
            "--report_to", "none", "--save_strategy", "no", "--activation_checkpointing", "false",
            # mallopt would outlive the run in this pytest process (its own test below runs in a subprocess)
            "--cpu_keep_freed_memory", "false", "--output_dir", str(output_dir), *extra]


def log_rows(output_dir) -> list[dict]:
    """The logged steps, from the `trainer_state.json` the command writes beside the model."""
    state = json.loads((Path(output_dir) / "trainer_state.json").read_text())
    return [row for row in state["log_history"] if "reward" in row]


# -- the command: training -----------------------------------------------------------------------------------------


def test_two_steps_from_a_full_sft_output_then_resume(tiny, tmp_path):
    from transformers import AutoModelForCausalLM, GenerationConfig

    out = tmp_path / "grpo"
    head = ["--model_name_or_path", tiny["full"], "--dataset_name", tiny["gsm8k"], "--reward_funcs", "gsm8k_answer",
            "format", "--reward_weights", "1.0", "0.5"]
    assert grpo.run([*head, *short(out, "--save_strategy", "steps", "--save_steps", "1")]) == 0
    rows = log_rows(out)
    assert [row["step"] for row in rows] == [1, 2]
    for key in ("reward", "reward_std", "rewards/gsm8k_answer/mean", "rewards/format/mean", "completions/mean_length",
                "entropy"):  # TRL's logs, kept
        assert key in rows[0], key
    model = AutoModelForCausalLM.from_pretrained(str(out))
    sft_model = AutoModelForCausalLM.from_pretrained(tiny["full"])
    assert model.config.vocab_size == sft_model.config.vocab_size
    assert 7 in GenerationConfig.from_pretrained(str(out)).eos_token_id  # the SFT model's end of turn, kept
    assert not (out / "_sft-merged").exists()

    # Resume: the run continues from its last checkpoint to the new max_steps. A marker planted in the checkpoint's
    # state shows that the state came from there (a run started afresh, being seeded, would log the same rewards).
    state_file = out / "checkpoint-2" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["log_history"][-1]["resumed_marker"] = 1.0
    state_file.write_text(json.dumps(state))
    reseal(state_file.parent)  # its manifest written again: an edit on purpose, not damage
    assert grpo.run([*head, *short(out, "--max_steps", "3", "--save_strategy", "steps", "--save_steps", "1",
                                   "--resume_from_checkpoint", "true")]) == 0
    rows = log_rows(out)
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert any(row.get("resumed_marker") == 1.0 for row in json.loads((out / "trainer_state.json").read_text())[
        "log_history"])


def test_two_steps_from_a_lora_adapter_merged_first_then_a_new_adapter(tiny, tmp_path):
    from trl_emo.models.sources import MERGE_STAMP, adapter_base, load_causal_lm

    out = tmp_path / "grpo"
    argv = ["--model_name_or_path", tiny["lora"], "--dataset_name", tiny["math"], "--use_peft", "true",
            "--lora_target_modules", "all-linear", *short(out)]
    assert grpo.run(argv) == 0
    merged = out / "_sft-merged"
    assert (merged / MERGE_STAMP).is_file() and (merged / "tokenizer.json").is_file()
    # The new adapter names the merged SFT model (an absolute path) as its base: evaluation loads and merges it.
    assert adapter_base(str(out)) == str(merged.resolve())
    assert load_causal_lm(str(out)).config.vocab_size > 0


def test_a_reward_that_never_fires_is_said_once(tiny, tmp_path, capsys):
    """A tiny model never writes a boxed answer: `math_answer` scores every completion 0, the groups have no spread,
    and the command warns once (TRL's log alone shows only zeros)."""
    from trl_emo.training.reward_signal import RewardNeverFires

    out = tmp_path / "grpo"
    assert grpo.run(["--model_name_or_path", tiny["full"], "--dataset_name", tiny["math"], *short(out)]) == 0
    rows = log_rows(out)
    assert all(row["reward"] == 0 and row["frac_reward_zero_std"] == 1 for row in rows), rows
    assert capsys.readouterr().err.count("The reward never fires") == 1

    # The rule on TRL's logged windows: silent as soon as one window has a reward or a spread; once at most.
    class State:
        global_step, max_steps = 0, 10

    def warnings_for(windows, max_steps=10):
        callback, state, said = RewardNeverFires(["gsm8k_answer"]), State(), []
        state.max_steps = max_steps
        callback._warn = lambda steps: (said.append(steps), setattr(callback, "done", True))
        for step, (reward, zero_std) in enumerate(windows, 1):
            state.global_step = step
            callback.on_log(None, state, None, logs={"reward": reward, "frac_reward_zero_std": zero_std})
        callback.on_train_end(None, state, None)
        return said

    assert warnings_for([(0.0, 1.0)] * 6) == [4]
    assert warnings_for([(0.0, 1.0)] * 2, max_steps=2) == [2]
    assert warnings_for([(0.0, 1.0), (0.0, 0.5), (0.0, 1.0), (0.0, 1.0)]) == []  # one group with a spread
    assert warnings_for([(0.0, 1.0), (0.25, 1.0)]) == []  # every completion of a group right: reward, no spread


def test_dry_run_prints_the_configuration_prompts_and_reference_answers(tiny, tmp_path, capsys):
    argv = ["--model_name_or_path", tiny["lora"], "--dataset_name", tiny["gsm8k"], "--reward_funcs", "gsm8k_answer",
            "format", "--dry_run", "--dry_run_examples", "2", *short(tmp_path / "out")]
    assert grpo.run(argv) == 0
    out = capsys.readouterr().out
    row = fixture_rows("gsm8k", 1)[0]
    assert "# trl_emo.grpo --dry_run: resolved configuration" in out and "- format" in out
    assert "<|user|>\n" + row["question"] + "<|end|>\n<|assistant|>\n" in out  # the SFT model's own chat template
    assert "[answer] " + row["answer"] in out and "[gsm8k_answer compares with] 9" in out
    assert "--- prompt 1 ---" in out and "--- prompt 2 ---" not in out
    assert not (tmp_path / "out" / "_sft-merged").exists()  # a dry run merges nothing


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipes_dry_run_on_their_prompt_set(recipe, tiny, tmp_path, capsys):
    config = yaml.safe_load(recipe.read_text())
    assert (config["num_generations"], config["temperature"], config["epsilon"], config["epsilon_high"],
            config["beta"]) == (8, 1.0, 0.2, 0.28, 0.0)  # the SED-SFT paper's RL stage
    argv = ["--recipe", recipe.stem, "--model_name_or_path", tiny["full"], "--dataset_name",
            tiny[config["dataset_schema"]], "--output_dir", str(tmp_path / "out"), "--dry_run"]
    assert grpo.run(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"[{config['reward_funcs'][0]} compares with]" in out and "--- prompt 2 ---" in out


def test_recipes_are_listed_and_the_command_is_dispatched(capsys):
    from trl_emo.commands import main as cli

    assert cli.main(["recipes"]) == 0
    listing = capsys.readouterr().out
    assert all(recipe.stem in listing for recipe in RECIPES)
    assert cli.main(["grpo", "--help"]) == 0
    assert "reward_funcs" in capsys.readouterr().out


def _one_line_error(capsys) -> str:
    """The error, one line and the last one; datasets' progress bars (reading a new file) may come before it."""
    lines = [line for line in capsys.readouterr().err.strip().splitlines()
             if line.strip() and not line.startswith(("Generating ", "Map", "Formatting "))]
    assert len(lines) == 1, lines
    assert lines[0].startswith("trl_emo.grpo: error: ")
    return lines[0]


def test_errors_are_one_line_with_exit_status_2(tiny, tmp_path, capsys):
    base = ["--dataset_name", tiny["gsm8k"], "--dry_run", *short(tmp_path / "out")]
    model = ["--model_name_or_path", tiny["full"]]
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("reward_func: [gsm8k_answer]\n")
    assert grpo.run(["--recipe", str(recipe), *model, *base]) == 2
    assert "did you mean 'reward_funcs'" in _one_line_error(capsys)
    assert grpo.run(["--model_name_or_path", str(tmp_path / "no-such-sft"), *base]) == 2
    error = _one_line_error(capsys)
    assert "model_name_or_path: " in error and "no-such-sft not found" in error
    assert grpo.run(["--model_name_or_path", "nobody/no-such-sft-model", *base]) == 2  # the Hub preflight, offline
    assert "'nobody/no-such-sft-model'" in (line := _one_line_error(capsys)) and "HF_HUB_OFFLINE" in line
    assert grpo.run([*model, *base, "--dataset_name", "nobody/no-such-prompts"]) == 2
    assert "dataset_name" in _one_line_error(capsys)
    assert grpo.run([*model, *base, "--reward_funcs", "gsm8k"]) == 2
    assert "unknown reward 'gsm8k'" in _one_line_error(capsys)
    assert grpo.run([*model, *base, "--reward_funcs", "my_missing_pkg.rewards:score"]) == 2
    assert "cannot import 'my_missing_pkg.rewards'" in _one_line_error(capsys)
    assert grpo.run([*model, *base, "--reward_funcs", "gsm8k_answer", "format", "--reward_weights", "1.0"]) == 2
    assert "reward_weights has 1 value(s) for 2 reward function(s)" in _one_line_error(capsys)
    broken = write_jsonl(tmp_path / "broken.jsonl", [{"question": "What is 2 + 2?"}] * 4)  # no `answer`
    assert grpo.run([*model, *base[2:], "--dataset_name", broken, "--dataset_schema", "gsm8k"]) == 2
    assert "Missing column 'answer' for dataset schema 'gsm8k'" in _one_line_error(capsys)
    alpaca = write_fixture("alpaca", tmp_path)
    assert grpo.run([*model, *base[2:], "--dataset_name", alpaca, "--dataset_schema", "alpaca"]) == 2
    assert "has no reference answers" in _one_line_error(capsys)
    empty = tmp_path / "empty.yaml"
    empty.write_text("reward_funcs: []\n")  # explicit and empty: not the schema's default
    assert grpo.run(["--recipe", str(empty), *model, *base]) == 2
    assert "reward_funcs is empty" in _one_line_error(capsys)
    assert grpo.run([*model, *base, "--remove_unused_columns", "true"]) == 2
    assert "drop the reference answers" in _one_line_error(capsys)


def test_math_answer_without_math_verify_fails_before_training(tiny, tmp_path, capsys, monkeypatch):
    from trl_emo.evaluation import math_answers
    from trl_emo.evaluation.errors import EvaluationError

    def missing():
        raise EvaluationError(math_answers.MATH_VERIFY_MISSING)

    monkeypatch.setattr(math_answers, "import_math_verify", missing)
    argv = ["--model_name_or_path", tiny["full"], "--dataset_name", tiny["math"], "--reward_funcs", "math_answer",
            "--dry_run", *short(tmp_path / "out")]
    assert grpo.run(argv) == 2
    assert "math_answer needs math-verify: pip install 'trl-emo[math]'" in _one_line_error(capsys)


def test_two_process_launch(tiny, tmp_path):
    """Two CPU processes (gloo): the generations of a step are split across them and the rewards gathered."""
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
           "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), "-m",
           "trl_emo.grpo", "--model_name_or_path", tiny["full"], "--dataset_name", tiny["gsm8k"], "--reward_funcs",
           "gsm8k_answer", "format", *short(out, "--per_device_train_batch_size", "2", "--save_strategy", "steps",
                                              "--save_steps", "2", "--disable_tqdm", "true")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, launch_failure(result)
    rows = log_rows(out)
    assert [row["step"] for row in rows] == [1, 2] and "rewards/format/mean" in rows[0]
    assert (out / "model.safetensors").exists()


# -- the real model ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_sft_output(tmp_path_factory):
    """SmolLM2-135M-Instruct after one full `trl_emo.sft` step, saved as an SFT output."""
    from trl_emo.models.real_model import RealModelUnavailable, smollm2_instruct

    try:
        model = smollm2_instruct(progress=False)
    except RealModelUnavailable as exc:
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("grpo-real")
    argv = ["--model_name_or_path", model, "--dataset_name", write_fixture("metamath", root, n_rows=4),
            "--dataset_schema", "metamath", "--prompt_format", "chat_template", "--max_steps", "1",
            "--per_device_train_batch_size", "2", "--max_length", "96", "--learning_rate", "1e-5", "--use_cpu", "true",
            "--bf16", "false", "--dtype", "float32", "--activation_checkpointing", "false", "--save_strategy", "no",
            "--report_to", "none", "--output_dir", str(root / "sft")]
    assert sft.run(argv) == 0
    return root


def test_two_steps_on_the_real_model_log_the_rewards_it_returned_and_save_a_model_that_generates(real_sft_output):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root, out = real_sft_output, real_sft_output / "grpo"
    prompts = write_jsonl(root / "prompts.jsonl", [
        {"question": f"What is {a} plus {b}? End with: The answer is: <number>.", "answer": f"#### {a + b}"}
        for a, b in ((2, 3), (10, 4), (7, 8), (20, 30))])
    RECORDED.clear()
    argv = ["--model_name_or_path", str(root / "sft"), "--dataset_name", prompts, "--dataset_schema", "gsm8k",
            "--reward_funcs", "gsm8k_answer", "test_grpo:length_reward", "--reward_weights", "1.0", "0.5",
            *short(out, "--max_completion_length", "16", "--learning_rate", "1e-5", "--save_strategy", "steps",
                   "--save_steps", "2", "--shuffle_dataset", "false")]
    assert grpo.run(argv) == 0
    rows = log_rows(out)
    assert len(rows) == 2 and len(RECORDED) == 2  # one reward call per step: 2 prompts x 2 generations
    for row, call in zip(rows, RECORDED):
        assert len(call["values"]) == 4
        mean = sum(call["values"]) / 4
        correct = gsm8k_answer(None, call["texts"], answer=call["answers"])
        assert row["rewards/length_reward/mean"] == pytest.approx(mean, rel=1e-5)
        assert row["rewards/gsm8k_answer/mean"] == pytest.approx(sum(correct) / 4, abs=1e-6)
        assert row["reward"] == pytest.approx(sum(c + 0.5 * v for c, v in zip(correct, call["values"])) / 4, rel=1e-5)
        assert 0 < row["completions/mean_length"] <= 16
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    start = AutoModelForCausalLM.from_pretrained(str(root / "sft"), dtype=torch.float32)
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), start.parameters())), "GRPO changed nothing"
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        new = model.generate(**inputs, max_new_tokens=24, do_sample=False)[0, inputs["input_ids"].shape[1]:]
    assert tokenizer.decode(new, skip_special_tokens=True).strip()


# -- the CPU allocator setting and the step-time benchmark ---------------------------------------------------------

KEPT_MEMORY = """
import resource, sys, torch
from trl_emo.commands.cpu_memory import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
def step():
    x = torch.empty(64 * 2**20 // 4); x.fill_(1.0); del x  # a step's large buffer, freed and allocated again
for _ in range(16):  # the warm-up: some glibc builds reuse an aligned block only after several (cpu_memory's docstring)
    step()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    step()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_keeping_freed_memory_stops_a_step_from_faulting_its_buffers_in_again():
    runs = {}
    for mode in ("system", "keep"):
        result = subprocess.run([sys.executable, "-c", KEPT_MEMORY, mode], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        kept, faults = result.stdout.split()
        runs[mode] = (kept, int(faults))
    if runs["keep"][0] != "True":
        pytest.skip("the C library is not glibc")
    pages = 64 * 2**20 // 4096
    assert runs["system"][1] >= 7 * pages  # every allocation faulted in afresh
    assert runs["keep"][1] <= pages  # none once the heap holds the buffer (one at most, for a late warm-up)


def test_step_bench_splits_a_step_into_phases(tiny):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import argparse

    import grpo_step_bench as bench

    args = argparse.Namespace(model=tiny["model"], steps=1, warmup=0, natural_length=False, set=None)
    row = bench.worker(args, "default")
    assert row["step"] > 0 and row["generation"] > 0 and row["backward"] > 0
    # "other" is the step less the timed phases: the phases the hooks time must account for most of the step.
    assert 0 <= row["other"] < 0.5 * row["step"], row
    assert row["mean_completion_length"] == bench.MAX_NEW_TOKENS  # every completion made 64 tokens long
    load = {"loadavg_1min": 0.0, "busy_processes": []}
    table = bench.format_table([{"variant": "plain_generate", "generation": 1.0, "step": 1.0, "new_tokens": 64,
                                 "load_before": load, "load_after": load}, {"variant": "default", **row,
                                 "load_before": load, "load_after": load}])
    assert "| default |" in table and "| plain generate (16 x 64) | 1.00 |" in table
