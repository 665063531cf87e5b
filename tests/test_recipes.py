"""Every recipe parses and `--dry_run`s against a fixture of its dataset's schema; bad recipes fail clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import CORPUS
from data_fixtures import fixture_rows, write_fixture
from trl_emo.commands import dpo, sft
from trl_emo.commands.dry_run import MASK_CLOSE, MASK_OPEN

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
# GRPO recipes (grpo_*, demo_grpo): test_grpo; the chain's DPO stage (demo_dpo) is a DPO recipe.
SFT_RECIPES = sorted(p for p in RECIPES.glob("*.yaml")
                     if not p.name.startswith(("dpo_", "eval_", "grpo_")) and p.stem not in ("demo_dpo", "demo_grpo"))
EVAL_RECIPES = sorted(RECIPES.glob("eval_*.yaml"))
DPO_RECIPES = sorted([*RECIPES.glob("dpo_*.yaml"), RECIPES / "demo_dpo.yaml"])


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """A chat-template tiny model folder, a base (no template) one, and the template as a .jinja file."""
    from trl_emo.models.tiny import CHAT_TEMPLATE, save_tiny_causal_lm

    root = tmp_path_factory.mktemp("tiny")
    chat = save_tiny_causal_lm(CORPUS, output_dir=root / "chat", vocab_size=320, hidden_size=32, intermediate_size=64)
    base = save_tiny_causal_lm(
        CORPUS, output_dir=root / "base", vocab_size=320, chat_template=False, hidden_size=32, intermediate_size=64
    )
    jinja = root / "template.jinja"
    jinja.write_text(CHAT_TEMPLATE)
    return {"chat": chat, "base": base, "jinja": str(jinja)}


def recipe_overrides(recipe: Path, tiny_models, fixtures: Path):
    config = yaml.safe_load(recipe.read_text())
    schema = config["dataset_schema"]
    args = ["--recipe", str(recipe), "--dataset_name", write_fixture(schema, fixtures), "--use_cpu", "true",
            "--output_dir", str(fixtures / "out"), "--dry_run"]
    if "chat_template_path" in config:
        args += ["--model_name_or_path", tiny_models["base"], "--chat_template_path", tiny_models["jinja"]]
    elif config.get("prompt_format") == "alpaca":
        args += ["--model_name_or_path", tiny_models["base"]]
    else:
        args += ["--model_name_or_path", tiny_models["chat"]]
    return config, args


def test_there_is_a_recipe_for_every_paper_setting():
    names = {p.name for p in RECIPES.glob("*.yaml")}
    for base in ("gem_ultrafeedback", "emo_alpaca_gpt4", "emo_evol_instruct", "gem_metamath", "gem_magicoder", "dpo_ultrafeedback",
                 "emo_wikitext103_continual", "sed_miromind", "eksft_openr1_math", "psft_openr1_math", "curio_sft_openr1_math"):
        assert f"{base}.yaml" in names and f"{base}_qlora.yaml" in names, base
    assert "emo_lm_gpt2.yaml" in names and {"eval_continuation.yaml", "eval_icl.yaml"} <= names
    assert {p.name for p in (RECIPES / "accelerate").glob("*.yaml")} == {"ddp.yaml", "zero2.yaml", "zero3.yaml", "fsdp2.yaml"}


@pytest.mark.parametrize("recipe", SFT_RECIPES, ids=[p.stem for p in SFT_RECIPES])
def test_sft_recipe_dry_runs_on_its_schema(recipe, tiny_models, tmp_path, capsys):
    config, args = recipe_overrides(recipe, tiny_models, tmp_path)
    assert sft.run(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"loss_type: {config.get('loss_type', 'nll')}" in out
    if config["dataset_schema"] == "plain_text":
        # Packed blocks of max_length tokens, every token trained, starting with the first article of the fixture.
        assert "packing_strategy: wrapped" in out and MASK_OPEN not in out.split("--- example 0", 1)[1]
        block = config["max_length"]
        if block <= 256:  # the fixture fills three blocks
            assert f"--- example 2 ({block} tokens, {block} trained) ---" in out
        else:  # a longer block (SLM's 2,048 tokens) holds the whole fixture
            assert "--- example 0 (" in out and "--- example 1" not in out
        assert out.split("--- example 0", 1)[1].split("\n", 1)[1].startswith(" = The red cat (train 0) =")
        return
    assert "--- example 2" in out and MASK_OPEN in out
    if config.get("load_in_4bit"):
        assert "load_in_4bit: true" in out and "use_peft: true" in out
    # The trained (unmasked) text of the first example is exactly the fixture's first answer.
    first = out.split("--- example 0", 1)[1].split("--- example 1", 1)[0]
    trained = "".join(part.split(MASK_CLOSE, 1)[-1] for part in first.split(MASK_OPEN))
    row = fixture_rows(config["dataset_schema"], 1, split=config.get("dataset_train_split", "train"))[0]
    answer = {
        "alpaca": lambda r: r["output"],
        "evol_instruct": lambda r: r["data"]["output"],
        "metamath": lambda r: r["response"],
        "magicoder": lambda r: r["solution"],
        "ultrafeedback": lambda r: r["messages"][-1]["content"],
        "miromind_m1": lambda r: r["response"],
        "openr1_math": lambda r: r["messages"][-1]["content"],
        "messages": lambda r: r["messages"][-1]["content"],
    }[config["dataset_schema"]](row)
    assert answer.strip() in trained


@pytest.mark.parametrize("recipe", DPO_RECIPES, ids=[p.stem for p in DPO_RECIPES])
def test_dpo_recipe_dry_runs(recipe, tiny_models, tmp_path, capsys):
    args = ["--recipe", str(recipe), "--model_name_or_path", tiny_models["chat"], "--use_cpu", "true",
            "--dataset_name", write_fixture("ultrafeedback", tmp_path), "--output_dir", str(tmp_path / "out"), "--dry_run"]
    assert dpo.run(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "--- pair 2 ---" in out and "[chosen]" in out and "[rejected]" in out
    assert "train_prefs" in out


@pytest.mark.parametrize("recipe", EVAL_RECIPES, ids=[p.stem for p in EVAL_RECIPES])
def test_evaluation_recipe_parses(recipe):
    from trl_emo.commands.parser import parse_config
    from trl_emo.evaluation.config import EvalConfig

    (config,) = parse_config([EvalConfig], ["--recipe", str(recipe)])
    if config.task == "continuation":  # EMO Table 1: ancestral sampling, 5 samples, Table 4 lengths
        assert (config.n, config.temperature, config.top_k, config.top_p) == (5, 1.0, 0, 1.0)
        assert (config.continuation_prefix_words, config.max_new_tokens, config.min_new_tokens) == (20, 80, 80)
        return
    if config.task == "icl":  # EMO Table 3: the eight benchmarks, 8 retrieved demonstrations
        assert len(config.icl_benchmarks) == 8 and config.icl_num_demonstrations == 8
        return
    assert set(config.policies) == {"ce", "gem"}
    if config.task == "ifeval":  # GEM's Table 1: greedy decoding, 1,024 new tokens
        assert config.n is None and config.temperature is None and config.max_new_tokens == 1024
    elif config.task in ("humaneval", "mbpp"):  # Appendix D: 200 samples, pass@{1,10,20,50,100}; opt-in on the CLI
        assert (config.n, config.temperature, config.code_k_values) == (200, 0.6, [1, 10, 20, 50, 100])
        assert config.allow_code_execution is False
    elif config.task == "creative":  # Table 2: 16 samples at temperature 1.0, 512 new tokens
        assert (config.n, config.temperature, config.max_new_tokens) == (16, 1.0, 512)
        assert "titled '{title}' with no more than 200 words" in config.creative_template
    else:
        assert config.n == 32 and config.temperature == 0.6


def _write_recipe(tmp_path, **fields):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(fields))
    return str(path)


def _base_args(tmp_path, tiny_models):
    return ["--model_name_or_path", tiny_models["chat"], "--dataset_name", write_fixture("alpaca", tmp_path),
            "--use_cpu", "true", "--output_dir", str(tmp_path / "out"), "--dry_run"]


def test_unknown_recipe_key_is_a_clear_error(tmp_path, tiny_models, capsys):
    recipe = _write_recipe(tmp_path, loss_type="gem", gem_bta=0.5)
    assert sft.run(["--recipe", recipe, *_base_args(tmp_path, tiny_models)]) == 2
    err = capsys.readouterr().err
    assert "gem_bta" in err and "did you mean 'gem_beta'" in err


@pytest.mark.parametrize(("field", "value", "match"), [("gem_h", "tanh", "gem_h"), ("loss_type", "gemm", "Did you mean 'gem'"),
                                                       ("dataset_schema", "alpacca", "dataset_schema")])
def test_bad_recipe_value_is_a_clear_error(tmp_path, tiny_models, capsys, field, value, match):
    recipe = _write_recipe(tmp_path, **{field: value})
    assert sft.run(["--recipe", recipe, *_base_args(tmp_path, tiny_models)]) == 2
    assert match in capsys.readouterr().err


def test_missing_recipe_file_and_model_are_clear_errors(tmp_path, tiny_models, capsys):
    assert sft.run(["--recipe", str(tmp_path / "nope.yaml"), *_base_args(tmp_path, tiny_models)]) == 2
    assert "Recipe file not found" in capsys.readouterr().err
    assert sft.run(["--dataset_name", "x", "--output_dir", str(tmp_path)]) == 2
    assert "model_name_or_path is required" in capsys.readouterr().err


def test_command_line_overrides_the_recipe(tmp_path, tiny_models, capsys):
    recipe = _write_recipe(tmp_path, loss_type="gem", gem_h="logsigmoid")
    assert sft.run(["--recipe", recipe, *_base_args(tmp_path, tiny_models), "--loss_type", "nll"]) == 0
    out = capsys.readouterr().out
    assert "loss_type: nll" in out and "gem_h" not in out.split("script:")[0]


def test_missing_dataset_column_names_the_column_and_schema(tmp_path, tiny_models, capsys):
    import json

    rows = [{"instruction": "Say hi.", "input": ""} for _ in range(3)]  # no `output`
    path = tmp_path / "broken.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["--model_name_or_path", tiny_models["chat"], "--dataset_name", str(path), "--dataset_schema", "alpaca",
            "--use_cpu", "true", "--output_dir", str(tmp_path / "out"), "--dry_run"]
    assert sft.run(args) == 2
    err = capsys.readouterr().err
    assert "output" in err and "alpaca" in err
