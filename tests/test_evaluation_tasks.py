"""The task framework of `trl-emo eval`: registry, per-task defaults and field checks, and the hook shape."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json

import pytest

from trl_emo.core.errors import ConfigError
from trl_emo.evaluation import tasks
from trl_emo.commands.evaluate import run
from trl_emo.evaluation.config import EvalConfig
from trl_emo.evaluation.tasks import EvalTask


class PromptLength(EvalTask):
    """A task that needs no generation: it measures the prompts, with its own cache (like code execution)."""

    name = "prompt_length"
    title = "Prompt length"
    defaults = {"max_new_tokens": 1}
    ignores = ("n", "temperature", "top_k", "top_p", "greedy", "reward_model", "k_values")
    fields = ("embedding_model",)  # borrowed: any field can stand for a task-specific one
    computed = 0

    @classmethod
    def ignore_reason(cls, name):
        return " (it generates nothing)"

    def generation_plan(self, examples):
        return None

    def post_process(self, run, examples):
        cache = self.open_cache("lengths", run, {"unit": "characters"}, key_fields=("model", "prompt_index"))
        rows = []
        for i, example in enumerate(examples.examples):
            if (run.name, i) not in cache:
                type(self).computed += 1
                rows.append({"model": run.name, "prompt_index": i, "length": len(example.instruction)})
        cache.append(rows)
        run.extra["lengths"] = [cache.rows[(run.name, i)]["length"] for i in range(len(examples.examples))]

    def summarize(self, run, examples):
        lengths = run.extra["lengths"]
        return {"mean_length": sum(lengths) / len(lengths), "longest": max(lengths)}

    def report_sections(self, summary):
        models = summary["models"].values()
        return [("Prompt length", [("mean characters", [m["mean_length"] for m in models])])]

    def plot(self, summary, output_dir):
        with open(os.path.join(output_dir, "lengths.txt"), "w") as handle:
            handle.write("plotted")


@pytest.fixture
def toy_task(monkeypatch):
    monkeypatch.setitem(tasks._TASKS, PromptLength.name, PromptLength)
    PromptLength.computed = 0
    return PromptLength


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("hi", "hello there", "a longer prompt")))
    return str(path)


def test_default_task_is_bon_with_its_sampling_defaults():
    config = EvalConfig(policies=["p=/x"], prompts="p.jsonl")
    assert config.task == "bon"
    assert (config.n, config.temperature, config.top_k, config.top_p, config.max_new_tokens) == (32, 0.6, 50, 0.9, 512)
    assert EvalConfig(policies=["p=/x"], prompts="p.jsonl", n=8, top_k=0).k_values == [1, 2, 4, 8]
    assert "bon" in tasks.task_names()


def test_unknown_task_and_fields_that_do_not_apply_are_clear_errors(toy_task):
    with pytest.raises(ConfigError, match="Unknown task 'bonn'. Did you mean 'bon'"):
        EvalConfig(task="bonn", policies=["p=/x"], prompts="p.jsonl")
    with pytest.raises(ConfigError, match=r"n does not apply to task 'prompt_length' \(it generates nothing\)"):
        EvalConfig(task="prompt_length", policies=["p=/x"], prompts="p.jsonl", n=4)
    with pytest.raises(ConfigError, match="embedding_model belongs to task 'prompt_length'"):
        EvalConfig(policies=["p=/x"], prompts="p.jsonl", embedding_model="some/model")
    config = EvalConfig(task="prompt_length", policies=["p=/x"], prompts="p.jsonl", embedding_model="m")
    # Ignored sampling fields stay unset; the task's own defaults apply.
    assert config.n is None and config.k_values is None and config.max_new_tokens == 1


def test_a_task_without_generation_runs_resumes_and_reports(toy_task, prompts_file, tmp_path, capsys):
    policy = tmp_path / "policy"
    policy.mkdir()  # never loaded: this task does no work with the model
    argv = ["--task", "prompt_length", "--policies", f"a={policy}", f"b={policy}", "--prompts", prompts_file,
            "--output_dir", str(tmp_path / "out"), "--progress", "false"]
    assert run(argv) == 0
    assert "| mean characters | 9.33 | 9.33 |" in capsys.readouterr().out
    assert toy_task.computed == 6
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["task"] == "prompt_length"
    assert summary["models"]["a"] == {"policy": str(policy), "mean_length": 28 / 3, "longest": 15}
    assert (tmp_path / "out" / "lengths.txt").read_text() == "plotted"
    assert not (tmp_path / "out" / "generations").exists()
    assert (tmp_path / "out" / "summary.md").read_text().startswith("# Prompt length\n\n3 prompts from")

    # Resuming recomputes nothing and writes the same summary.
    assert run(argv) == 0
    assert toy_task.computed == 6
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary


def test_list_tasks(capsys, toy_task):
    assert run(["--list_tasks"]) == 0
    out = capsys.readouterr().out
    assert "bon" in out and "Best-of-n evaluation" in out and "prompt_length" in out
