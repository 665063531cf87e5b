"""A Hub id that cannot be loaded is one line naming the field, the id and the fix, exit status 2, in every command
and in `--dry_run`, checked before anything slow starts (`trl_emo.core.hub`).

Nothing here touches the network: offline is the test default (conftest), and the online cases (gated, not found,
revision, unreachable) come from huggingface_hub's own client, answering through a mock transport the way the Hub
answers, so the exceptions are the client's own (`GatedRepoError`, `RepositoryNotFoundError`...)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants, errors, set_client_factory
from huggingface_hub.utils._http import default_client_factory

try:  # huggingface_hub 2 ships its HTTP client as httpx2; 1.x uses httpx (a GPU image may hold either)
    import httpx2
except ImportError:
    import httpx as httpx2

from data_fixtures import write_fixture

from trl_emo.commands import dpo, sft
from trl_emo.commands import evaluate as eval_cli
from trl_emo.commands.command_line import run_command
from trl_emo.core.errors import HubAccessError, HubSource
from trl_emo.core.hub import check_sources, hub_errors
from trl_emo.evaluation.pipeline import eval_sources
from trl_emo.models.hub_ids import check_hub_ids, model_sources

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE_ID = "meta-llama/Meta-Llama-3-8B-Instruct"  # gem_ultrafeedback's chat_template_path, gated on the Hub


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    """Empty Hugging Face caches, whatever this machine has downloaded."""
    import datasets

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    return tmp_path


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A model folder (its config alone: never loaded, the check comes first), the fixture datasets, an adapter whose
    base is a Hub id."""
    root = tmp_path_factory.mktemp("hub_errors")
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text("{}")  # a folder without one is an error of its own (test_bad_inputs)
    adapter = root / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "nobody/base", "r": 4,
                                                                   "peft_type": "LORA"}))
    prompts = root / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "what is 1 plus 1?"}) + "\n")
    return {"root": root, "model": str(root / "model"), "adapter": str(adapter), "prompts": str(prompts),
            "data": write_fixture("ultrafeedback", root)}


def sft_argv(local, tmp_path, *extra):
    return ["--recipe", "gem_ultrafeedback", "--dry_run", "--model_name_or_path", local["model"], "--dataset_name",
            local["data"], "--output_dir", str(tmp_path / "out"), "--use_cpu", "true", *extra]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


# -- the Hub, mocked through huggingface_hub's own client -------------------------------------------------------------

GATED, MISSING, NO_REVISION, DOWN = "gated", "missing", "no_revision", "down"


@pytest.fixture
def hub(monkeypatch):
    """Online, with the Hub answering through a mock transport: `hub[repo_id] = GATED | MISSING | NO_REVISION | DOWN`
    (any other id is a public repository). No socket may open."""
    answers: dict[str, str] = {}

    def no_socket(*args, **kwargs):
        raise AssertionError("a test tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_socket)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def answer(request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        repo = next((r for r in answers if f"/{r}/" in f"{path}/"), None)
        state = answers.get(repo)
        if state == DOWN:
            raise httpx2.ConnectError("[Errno -2] Name or service not known", request=request)
        if state == MISSING:
            return httpx2.Response(401, headers={"X-Error-Code": "RepoNotFound"}, request=request)
        if state == NO_REVISION and "/revision/" in path:
            return httpx2.Response(404, headers={"X-Error-Code": "RevisionNotFound"}, request=request)
        if state == GATED and (path.endswith("/auth-check") or "/resolve/" in path):
            return httpx2.Response(403, headers={"X-Error-Code": "GatedRepo"}, request=request)
        if path.startswith("/api/"):
            repo_id = path.split("/")[3] + "/" + path.split("/")[4]
            return httpx2.Response(200, json={"id": repo_id, "sha": "0" * 40, "gated": "manual" if state == GATED else False},
                                   request=request)
        return httpx2.Response(404, headers={"X-Error-Code": "EntryNotFound"}, request=request)

    set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(answer), follow_redirects=True))
    yield answers
    set_client_factory(default_client_factory)


# -- the issue's command ----------------------------------------------------------------------------------------------


def test_the_issue_command_is_one_line_naming_the_field(local, tmp_path):
    """`python -m trl_emo.sft --recipe gem_ultrafeedback --dry_run` with local model and data, offline: the recipe's
    chat_template_path is a Hub id that is not cached."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_DATASETS_CACHE": str(tmp_path / "ds")}
    result = subprocess.run([sys.executable, "-m", "trl_emo.sft", *sft_argv(local, tmp_path)], capture_output=True,
                            text=True, env=env, cwd=ROOT, timeout=300)  # this checkout's trl_emo
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        f"trl_emo.sft: error: chat_template_path: '{TEMPLATE_ID}' is no local folder, and as a Hub model id it has no "
        "copy in the local Hugging Face cache while offline mode is on (HF_HUB_OFFLINE=1): run once with network "
        "access to download it, or unset HF_HUB_OFFLINE, or point chat_template_path at a local folder."
    ]


# -- offline: every field of a training run -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, field, repo_id",
    [
        (["--model_name_or_path", "nobody/no-such-model"], "model_name_or_path", "nobody/no-such-model"),
        ([], "chat_template_path", TEMPLATE_ID),
        (["--chat_template_path", "", "--dataset_name", "nobody/no-such-data"], "dataset_name", "nobody/no-such-data"),
        (["--chat_template_path", "", "--loss_type", "emo", "--emo_cost_embedding", "nobody/emb"], "emo_cost_embedding",
         "nobody/emb"),
        (["--chat_template_path", "", "--loss_type", "asft", "--asft_ref_model", "nobody/ref"], "asft_ref_model",
         "nobody/ref"),
    ],
)
def test_sft_dry_run_names_the_field_of_an_uncached_hub_id(local, tmp_path, capsys, extra, field, repo_id):
    assert sft.run(sft_argv(local, tmp_path, *extra)) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"trl_emo.sft: error: {field}: '{repo_id}' is no local ")
    assert "HF_HUB_OFFLINE" in err and f"point {field} at a local" in err
    assert not (tmp_path / "out").exists()


def test_dpo_names_the_model_and_an_adapters_base(local, tmp_path, capsys):
    common = ["--recipe", "dpo_ultrafeedback", "--dry_run", "--dataset_name", local["data"], "--output_dir",
              str(tmp_path / "out"), "--use_cpu", "true"]
    # The recipe's model_name_or_path left as it is: a folder that does not exist here, shaped like a Hub id.
    assert dpo.run(common) == 2
    assert "model_name_or_path: 'outputs/gem-ultrafeedback-llama3-8b' is no local folder" in one_line_error(capsys)
    assert dpo.run([*common, "--model_name_or_path", local["adapter"]]) == 2
    err = one_line_error(capsys)
    assert "the base model of the adapter in model_name_or_path: 'nobody/base'" in err
    assert f"point base_model_name_or_path in {local['adapter']}/adapter_config.json at a local folder" in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--policies", "ce=nobody/policy"], "trl_emo.evaluate: error: policies[ce]: 'nobody/policy' is no local folder"),
        (["--reward_model", "nobody/rm"], "trl_emo.evaluate: error: reward_model: 'nobody/rm' is no local folder"),
        (["--prompts", "nobody/prompts"], "trl_emo.evaluate: error: prompts: 'nobody/prompts' is no local file or folder"),
    ],
)
def test_evaluation_names_the_field(local, tmp_path, capsys, extra, message):
    argv = ["--policies", f"ce={local['model']}", "--prompts", local["prompts"], "--output_dir", str(tmp_path / "out"),
            "--progress", "false", "--n", "2", *extra]
    assert eval_cli.run(argv) == 2
    assert one_line_error(capsys).startswith(message)
    assert not (tmp_path / "out").exists()


def test_the_evaluation_checks_its_featurizer_and_encoders():
    from trl_emo.evaluation.config import EvalConfig

    config = EvalConfig(task="continuation", policies=["a=nobody/policy"], prompts="wikitext", mauve=True)
    fields = {(s.field, s.repo_id, s.repo_type) for s in eval_sources(config)}
    assert ("mauve_featurizer", "gpt2-large", "model") in fields and ("policies[a]", "nobody/policy", "model") in fields
    assert ("prompts", "wikitext", "dataset") in fields
    config = EvalConfig(policies=["a=/x"], prompts="p.jsonl", embedding_model="someone/encoder")
    assert [s.field for s in eval_sources(config)] == ["embedding_model"]


def test_a_command_with_its_own_options_gets_the_same_line(capsys):
    """What `trl-emo demo --model ID` calls, through `run_command` like every command."""

    def main(args):
        check_hub_ids({"--model": "nobody/tiny"})
        return 0

    def make_parser():
        import argparse

        return argparse.ArgumentParser()

    assert run_command(make_parser, main, [], "trl-emo demo") == 2
    assert one_line_error(capsys).startswith("trl-emo demo: error: --model: 'nobody/tiny' is no local folder")


# -- online: the Hub client's own exceptions ---------------------------------------------------------------------------


def test_gated_repository(local, tmp_path, capsys, hub):
    hub[TEMPLATE_ID] = GATED
    assert sft.run(sft_argv(local, tmp_path)) == 2
    assert one_line_error(capsys) == (
        f"trl_emo.sft: error: chat_template_path: '{TEMPLATE_ID}' is a gated Hub repository this account has no access "
        f"to: log in with `hf auth login` (or set HF_TOKEN) and accept its licence at https://huggingface.co/{TEMPLATE_ID}."
    )
    hub["org/gated-set"] = GATED
    with pytest.raises(HubAccessError) as caught:
        check_sources([HubSource("dataset_name", "org/gated-set", repo_type="dataset")])
    assert isinstance(caught.value.__cause__, errors.GatedRepoError)
    assert "accept its licence at https://huggingface.co/datasets/org/gated-set" in str(caught.value)


def test_not_found_and_revision_not_found(local, tmp_path, capsys, hub):
    hub["nobody/no-such-model"] = MISSING
    assert sft.run(sft_argv(local, tmp_path, "--model_name_or_path", "nobody/no-such-model")) == 2
    assert one_line_error(capsys) == (
        "trl_emo.sft: error: model_name_or_path: 'nobody/no-such-model' is neither a local folder nor a model "
        "repository on the Hugging Face Hub: check the id or path (a typo?); a private repository also needs "
        "`hf auth login`."
    )
    hub["nobody/no-such-data"] = MISSING
    assert sft.run(sft_argv(local, tmp_path, "--chat_template_path", "", "--dataset_name", "nobody/no-such-data")) == 2
    assert "dataset_name: 'nobody/no-such-data' is neither a local file or folder nor a dataset repository" in (
        one_line_error(capsys))
    hub["org/model"] = NO_REVISION
    with pytest.raises(HubAccessError) as caught:
        check_sources(model_sources("model_name_or_path", "org/model", "v9", "model_revision"))
    assert isinstance(caught.value.__cause__, errors.RevisionNotFoundError)
    assert str(caught.value) == ("model_name_or_path: 'org/model' has no revision 'v9' (model_revision) on the Hub: "
                                 "check the branch, tag or commit name at https://huggingface.co/org/model.")


def test_unreachable_hub_fails_only_without_a_cached_copy(empty_cache, hub, capsys, local, tmp_path):
    hub[TEMPLATE_ID] = DOWN
    assert sft.run(sft_argv(local, tmp_path)) == 2
    err = one_line_error(capsys)
    assert (f"chat_template_path: '{TEMPLATE_ID}' is no local folder, and the Hugging Face Hub (https://huggingface.co) "
            "could not be reached (ConnectError: [Errno -2] Name or service not known)") in err
    assert "HTTPS_PROXY" in err and "HF_ENDPOINT" in err
    # With a cached copy the run goes on (transformers and datasets fall back to it).
    hub["org/cached"] = DOWN
    snapshot = empty_cache / "hub-cache" / "models--org--cached" / "snapshots" / ("1" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("1" * 40)
    check_sources([HubSource("model_name_or_path", "org/cached")])


def test_cached_ids_pass_offline(empty_cache):
    snapshot = empty_cache / "hub-cache" / "models--org--cached" / "snapshots" / ("1" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("1" * 40)
    (empty_cache / "datasets-cache" / "org___cached-set" / "default" / "0.0.0" / "abc").mkdir(parents=True)
    check_sources([HubSource("model_name_or_path", "org/cached"), HubSource("dataset_name", "org/cached-set", "dataset")])
    # The tokenizer of a chat template needs its own file: a cached config alone is not enough.
    with pytest.raises(HubAccessError, match="chat_template_path: 'org/cached'"):
        check_sources([HubSource("chat_template_path", "org/cached", filename="tokenizer_config.json")])


# -- later failures, translated (belt and braces) ----------------------------------------------------------------------


def test_failures_while_loading_are_translated_with_their_field(hub):
    from transformers import AutoConfig

    hub["nobody/gone"] = MISSING
    hub["org/gated"] = GATED
    sources = [HubSource("reward_model", "nobody/gone"), HubSource("policies[a]", "org/gated")]
    with pytest.raises(HubAccessError, match=r"^reward_model: 'nobody/gone' is neither a local folder") as caught:
        with hub_errors(sources):
            AutoConfig.from_pretrained("nobody/gone")
    assert isinstance(caught.value.__cause__, OSError)  # transformers' error, the Hub client's in its chain
    with pytest.raises(HubAccessError, match=r"^policies\[a\]: 'org/gated' is a gated Hub repository"):
        with hub_errors(sources):
            AutoConfig.from_pretrained("org/gated")
    with pytest.raises(ValueError, match="not a Hub failure"):  # anything else passes through unchanged
        with hub_errors(sources):
            raise ValueError("not a Hub failure")


def test_offline_failures_while_loading_are_translated():
    from datasets import load_dataset
    from transformers import AutoTokenizer

    with pytest.raises(HubAccessError, match=r"^chat_template_path: 'nobody/template' is no local folder.*HF_HUB_OFFLINE"):
        with hub_errors(HubSource("chat_template_path", "nobody/template")):
            AutoTokenizer.from_pretrained("nobody/template")
    with pytest.raises(HubAccessError, match=r"^dataset_name: 'nobody/set' is no local file or folder.*HF_HUB_OFFLINE"):
        with hub_errors(HubSource("dataset_name", "nobody/set", repo_type="dataset")):
            load_dataset("nobody/set", split="train")


def test_emo_cost_embedding_loaded_at_the_first_step_names_its_field():
    from trl_emo.losses import load_cost_embedding

    with pytest.raises(HubAccessError, match=r"^emo_cost_embedding: 'nobody/emb' is no local folder.*HF_HUB_OFFLINE"):
        load_cost_embedding("nobody/emb")


def test_icl_benchmarks_from_the_hub_are_each_checked():
    from trl_emo.commands.parser import parse_config
    from trl_emo.evaluation.config import EvalConfig

    (config,) = parse_config([EvalConfig], ["--recipe", str(ROOT / "recipes" / "eval_icl.yaml")])
    datasets = [s for s in eval_sources(config) if s.repo_type == "dataset"]
    assert len(datasets) == 8 and all(s.field.startswith("prompts (icl benchmark ") for s in datasets)
    assert not any(s.repo_id == "hub" for s in eval_sources(config))


def test_a_command_defaults_to_offline_only_when_nothing_it_names_needs_the_hub(tmp_path, monkeypatch):
    from trl_emo.core.hub import offline_unless_hub

    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(variable, "")  # recorded, so the value the function sets is undone after the test
        monkeypatch.delenv(variable)
    offline_unless_hub("someone/some-model", str(tmp_path))  # a Hub id: the user's own setting stays (unset)
    assert "HF_HUB_OFFLINE" not in os.environ and "HF_DATASETS_OFFLINE" not in os.environ
    offline_unless_hub(None, str(tmp_path), str(tmp_path / "model.gguf"))  # nothing, a folder, a (missing) file
    assert os.environ["HF_HUB_OFFLINE"] == os.environ["HF_DATASETS_OFFLINE"] == "1"


def test_a_hub_adapter_is_detected_through_peft_offline(empty_cache):
    """A LoRA adapter named by its Hub id is an adapter (PEFT reads its cached adapter_config.json), checked by its
    own file and its base model; an id the cache does not know, offline, is not taken for one, and the preflight says
    in one line that it is not cached."""
    from trl_emo.models.hub_ids import model_sources
    from trl_emo.models.sources import adapter_base

    snapshot = empty_cache / "hub-cache" / "models--org--adapter" / "snapshots" / ("2" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path":
                                                              "org/base", "r": 4}))
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("2" * 40)
    assert adapter_base("org/adapter") == "org/base"
    sources = model_sources("model_name_or_path", "org/adapter")
    assert [(s.field, s.repo_id, s.filename) for s in sources] == [
        ("model_name_or_path", "org/adapter", "adapter_config.json"),
        ("the base model of the adapter in model_name_or_path", "org/base", "config.json")]
    with pytest.raises(HubAccessError, match="the base model of the adapter in model_name_or_path: 'org/base'"):
        check_sources(sources)  # the adapter is cached, its base is not
    assert adapter_base("org/unknown") is None
    with pytest.raises(HubAccessError, match="no copy in the local Hugging Face cache while offline mode is on"):
        check_sources(model_sources("model_name_or_path", "org/unknown"))
