"""`python -m trl_emo.evaluate` from recipe to reports with tiny offline models, including resuming."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json
import math
import sys

import pytest

from trl_emo.evaluation import generation, scoring
from trl_emo.commands.evaluate import run

from conftest import require_minilm, save_eval_policy, save_eval_reward_model, write_eval_recipe
from data_fixtures import write_jsonl
PROMPTS = [
    {"question": "What is 1+1?", "answer": "1+1=2\n#### 2", "reference": "The answer is 2."},
    {"question": "Write a poem about the sea.", "answer": "#### 0", "reference": "Waves roll in."},
    {"question": "What is 2+2?", "answer": "2+2=4\n#### 4", "reference": "It is 4. The answer is 4"},
]
N = 4


class Interrupted(Exception):
    pass


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_assets")
    return {
        "root": root, "ce": save_eval_policy(root / "ce", seed=0), "gem": save_eval_policy(root / "gem", seed=1),
        "rm": save_eval_reward_model(root / "rm"), "prompts": write_jsonl(root / "prompts.jsonl", PROMPTS),
    }


def recipe(assets, output_dir, **overrides):
    values = {
        "policies": {"ce": assets["ce"], "gem": assets["gem"]},
        "reward_model": assets["rm"],
        "prompts": assets["prompts"],
        "reference_column": "reference",
        "n": N,
        "max_new_tokens": 6,
        "temperature": 1.0,
        "generation_batch_size": 4,  # one prompt (4 samples) per generate call: several calls to interrupt
        "scoring_batch_size": 4,
        "embedding_diversity": False,
        "progress": False,
        "device": "cpu",
        "output_dir": str(output_dir),
    }
    return write_eval_recipe(output_dir, values, **overrides)


class Counter:
    """Counts calls of a method and optionally raises on the call number `fail_on`."""

    def __init__(self, original, fail_on=None):
        self.original, self.fail_on, self.calls = original, fail_on, 0

    def install(self, monkeypatch, owner, name):
        counter = self

        def wrapper(self, *args, **kwargs):
            counter.calls += 1
            if counter.fail_on is not None and counter.calls == counter.fail_on:
                raise Interrupted(f"killed at call {counter.calls}")
            return counter.original(self, *args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)
        return self


def run_counted(monkeypatch, argv, generate_fail_on=None, score_fail_on=None):
    gen = Counter(generation.HFGenerator.generate, generate_fail_on)
    gen.install(monkeypatch, generation.HFGenerator, "generate")
    score = Counter(scoring.RewardModel.score, score_fail_on)
    score.install(monkeypatch, scoring.RewardModel, "score")
    try:
        code = run(argv)
    finally:
        monkeypatch.undo()
    return code, gen.calls, score.calls


def read_jsonl(path):
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def load_summary(output_dir):
    with open(output_dir / "summary.json") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def full_run(assets):
    """An uninterrupted evaluation: the summary every resumed run must reproduce."""
    output_dir = assets["root"] / "full"
    with pytest.MonkeyPatch.context() as monkeypatch:
        code, generate_calls, score_calls = run_counted(monkeypatch, ["--recipe", recipe(assets, output_dir)])
    assert code == 0
    return {
        "dir": output_dir,
        "summary": load_summary(output_dir),
        "generate_calls": generate_calls,
        "score_calls": score_calls,
    }


def test_recipe_run_writes_every_output(assets, tmp_path, capsys):
    require_minilm()
    output_dir = tmp_path / "cli"
    # Flags override the recipe.
    path = recipe(assets, output_dir, embedding_diversity=True, max_new_tokens=8)
    argv = ["--recipe", path, "--max_new_tokens", "5"]
    assert run(argv) == 0
    assert "| metric | ce | gem |" in capsys.readouterr().out

    for name in ("ce", "gem"):
        rows = read_jsonl(output_dir / "generations" / f"{name}.jsonl")
        # n samples per prompt plus one greedy response (the prompts have GSM8K gold answers).
        assert len(rows) == len(PROMPTS) * (N + 1)
        assert sum(r["sample"] == "greedy" for r in rows) == len(PROMPTS)
        assert all(1 <= r["num_tokens"] <= 5 for r in rows)
        assert rows[0]["prompt"] == "<s><|user|>\nWhat is 1+1?<|end|>\n<|assistant|>\n"
        assert len(read_jsonl(output_dir / "rewards" / f"{name}.jsonl")) == len(PROMPTS) * N
    assert len(read_jsonl(output_dir / "rewards" / "_reference.jsonl")) == len(PROMPTS)

    summary = load_summary(output_dir)
    assert summary["settings"]["max_new_tokens"] == 5
    assert list(summary["models"]) == ["ce", "gem"]
    for name, model in summary["models"].items():
        assert model["bon"]["k"] == [1, 2, 4]
        assert set(model["diversity"]) >= {"distinct_n", "self_bleu", "embedding", "cross_sample_distinct_n"}
        assert 0 <= model["diversity"]["embedding"] <= 100
        assert model["gsm8k"]["k"] == [1, 4] and "greedy_accuracy" in model["gsm8k"]
        # The summary agrees with the cached rows it was computed from.
        reward_rows = read_jsonl(output_dir / "rewards" / f"{name}.jsonl")
        rewards = {(r["prompt_index"], r["sample"]): r["reward"] for r in reward_rows}
        refs = {r["prompt_index"]: r["reward"] for r in read_jsonl(output_dir / "rewards" / "_reference.jsonl")}
        best = [max(rewards[(i, j)] for j in range(N)) for i in range(len(PROMPTS))]
        assert model["bon"]["unbiased"][-1] == pytest.approx(sum(best) / len(best))
        assert model["mean"]["unbiased"][0] == pytest.approx(sum(rewards.values()) / len(rewards))
        first = [1 / (1 + math.exp(-(rewards[(i, 0)] - refs[i]))) for i in range(len(PROMPTS))]
        assert model["win_rate"]["first_k"][0] == pytest.approx(100 * sum(first) / len(first))
    table = (output_dir / "summary.md").read_text()
    assert "BoN@4" in table and "self-BLEU diversity" in table and "MV@4" in table
    assert (output_dir / "bon.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_generation_killed_half_way_resumes_to_the_same_summary(assets, tmp_path, monkeypatch, full_run):
    output_dir = tmp_path / "killed"
    argv = ["--recipe", recipe(assets, output_dir)]
    with pytest.raises(Interrupted):
        run_counted(monkeypatch, argv, generate_fail_on=2)
    saved = read_jsonl(output_dir / "generations" / "ce.jsonl")
    assert len(saved) == N  # the first batch (prompt 0) was written before the kill
    assert not (output_dir / "summary.json").exists()

    code, generate_calls, _ = run_counted(monkeypatch, argv)
    assert code == 0
    # Only the finished batch is skipped: every other batch is generated once.
    assert generate_calls == full_run["generate_calls"] - 1
    assert read_jsonl(output_dir / "generations" / "ce.jsonl")[:N] == saved
    assert load_summary(output_dir) == full_run["summary"]
    resumed = read_jsonl(output_dir / "generations" / "gem.jsonl")
    assert resumed == read_jsonl(full_run["dir"] / "generations" / "gem.jsonl")


def test_scoring_killed_half_way_resumes_to_the_same_summary(assets, tmp_path, monkeypatch, full_run):
    output_dir = tmp_path / "killed_scoring"
    argv = ["--recipe", recipe(assets, output_dir)]
    with pytest.raises(Interrupted):
        run_counted(monkeypatch, argv, score_fail_on=3)
    assert len(read_jsonl(output_dir / "rewards" / "ce.jsonl")) == 2 * 4  # two batches of four

    code, generate_calls, score_calls = run_counted(monkeypatch, argv)
    assert code == 0
    assert generate_calls == 0  # all generations were cached
    assert score_calls == full_run["score_calls"] - 2
    assert load_summary(output_dir) == full_run["summary"]


def test_a_finished_run_loads_no_model_and_changed_settings_are_refused(assets, monkeypatch, full_run, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded although everything is cached")

    monkeypatch.setattr(generation.HFGenerator, "__init__", refuse)
    monkeypatch.setattr(scoring.RewardModel, "__init__", refuse)
    argv = ["--recipe", recipe(assets, full_run["dir"])]
    assert run(argv) == 0
    assert load_summary(full_run["dir"]) == full_run["summary"]
    capsys.readouterr()

    assert run([*argv, "--temperature", "0.7"]) == 2
    err = capsys.readouterr().err
    assert "written with different settings" in err and "temperature: cached 1.0, now 0.7" in err


def test_gsm8k_metrics_from_the_generated_answers(assets, tmp_path, monkeypatch):
    # A scripted policy, so the answers (and so the accuracies) are known in advance.
    scripted = {
        "What is 1+1?": ["The answer is 2", "The answer is 3", "The answer is 2", "no idea"],  # gold 2
        "What is 2+2?": ["The answer is 5", "The answer is 5", "The answer is 4", "The answer is 4."],  # gold 4
        "Write a poem about the sea.": ["Waves", "Sea", "Blue", "Deep"],  # gold 0
    }
    greedy_text = {
        "What is 1+1?": "The answer is 2.",
        "What is 2+2?": "The answer is 1,0",
        "Write a poem about the sea.": "0",
    }

    def fake_init(self, path, config, tokenizer):
        self.tokenizer = tokenizer

    def fake_generate(self, prompts, num_samples, seed, greedy=False):
        questions = [p.split("<|user|>\n", 1)[1].split("<|end|>", 1)[0] for p in prompts]
        if greedy:
            return [[{"text": greedy_text[q], "num_tokens": 3, "finish_reason": "stop"}] for q in questions]
        return [
            [{"text": t, "num_tokens": 3, "finish_reason": "stop"} for t in scripted[q][:num_samples]]
            for q in questions
        ]

    monkeypatch.setattr(generation.HFGenerator, "__init__", fake_init)
    monkeypatch.setattr(generation.HFGenerator, "generate", fake_generate)
    monkeypatch.setattr(generation.HFGenerator, "close", lambda self: None)
    output_dir = tmp_path / "gsm"
    # No reward model: only the GSM8K metrics (and response statistics) are computed.
    path = recipe(assets, output_dir, policies=[f"ce={assets['ce']}"], generation_batch_size=8, diversity=False)
    argv = ["--recipe", path]
    assert run([*argv, "--reward_model", ""]) == 0
    gsm = load_summary(output_dir)["models"]["ce"]["gsm8k"]
    assert gsm["greedy_accuracy"] == pytest.approx(100 / 3)  # only prompt 0; "1,0" is 1, not 10
    assert gsm["k"] == [1, 4]
    assert gsm["mv"] == pytest.approx([100 / 3, 100 / 3])  # prompt 0 both; prompt 2 MV@4 is the 5-vs-4 tie -> 5
    assert gsm["pass_first_k"] == pytest.approx([100 / 3, 200 / 3])
    assert "bon" not in load_summary(output_dir)["models"]["ce"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"temprature": 0.5}, "did you mean 'temperature'"),
        ({"n": 0}, "n must be >= 1"),
        ({"k_values": [1, 8]}, "larger than n = 4"),
        ({"reward_model": "/does/not/exist"}, "Reward model folder not found: /does/not/exist"),
        ({"prompt_column": "nope"}, "prompt_column 'nope' is not a column"),
        ({"backend": "vllm"}, "vLLM is not installed"),
    ],
)
def test_clear_errors(assets, tmp_path, capsys, monkeypatch, overrides, message):
    monkeypatch.setitem(sys.modules, "vllm", None)
    assert run(["--recipe", recipe(assets, tmp_path / "bad", **overrides)]) == 2
    assert message in capsys.readouterr().err
