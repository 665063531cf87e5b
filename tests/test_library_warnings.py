"""The commands drop the deprecation warnings the libraries raise at each other, and only those (`trl_emo.core.noise`).

transformers 5.23 deprecated its `gradient_checkpointing` methods, which PEFT and TRL still call themselves: a QLoRA
SFT run and a DPO run on a PEFT model printed `FutureWarning`s the user could do nothing about. The same warning from
the user's own call, and a warning caused by the user's own configuration, still show.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from conftest import CORPUS
from data_fixtures import write_fixture
from trl_emo.commands import dpo, sft
from trl_emo.core import noise

ROOT = Path(__file__).resolve().parent.parent


def checkpointing_deprecations(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, FutureWarning) and "checkpointing" in str(w.message)]


def test_qlora_sft_then_dpo_commands_show_no_library_deprecation(tmp_path):
    """The QLoRA recipes, activation checkpointing on as they set it, one step each: SFT (PEFT wraps the 4-bit model),
    then DPO from its adapter (merged, quantized again, a new adapter; TRL turns checkpointing off and on around each
    reference forward)."""
    from trl_emo.models.tiny import save_tiny_causal_lm

    model = save_tiny_causal_lm(CORPUS, output_dir=tmp_path / "chat", vocab_size=320, hidden_size=64, intermediate_size=128)
    data = write_fixture("ultrafeedback", tmp_path, n_rows=8)
    common = ["--dataset_name", data, "--use_cpu", "true", "--bf16", "false", "--dtype", "float32", "--max_steps", "1",
              "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1", "--eval_strategy", "no",
              "--save_strategy", "no", "--logging_steps", "1", "--report_to", "none"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # as in a command: each warning once per place it is raised
        assert sft.run(["--recipe", str(ROOT / "recipes" / "gem_ultrafeedback_qlora.yaml"), "--model_name_or_path", model,
                        "--chat_template_path", "", "--output_dir", str(tmp_path / "sft"), *common]) == 0
        assert dpo.run(["--recipe", str(ROOT / "recipes" / "dpo_ultrafeedback_qlora.yaml"), "--model_name_or_path",
                        str(tmp_path / "sft"), "--output_dir", str(tmp_path / "dpo"), *common]) == 0
    assert (tmp_path / "dpo" / "adapter_config.json").exists()
    assert checkpointing_deprecations(caught) == []


def test_only_the_libraries_own_calls_are_dropped(tmp_path, make_model):
    """PEFT's and TRL's calls of the deprecated methods are dropped; the user's own calls of them, afterwards, warn
    as usual, and so does a deprecated setting the user passes."""
    from peft import LoraConfig, get_peft_model
    from transformers import TrainingArguments
    from trl.models.utils import disable_gradient_checkpointing

    def library_calls(model):
        peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
        model.activation_checkpointing_enable()  # the current name: no warning
        with disable_gradient_checkpointing(model):  # TRL: is_gradient_checkpointing, _disable, then _enable
            pass
        return peft_model

    def run(quiet: bool) -> tuple[list[str], list[str]]:
        model = make_model()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            if quiet:
                noise.quiet_library_deprecations()
                noise.quiet_library_deprecations()  # idempotent
            library_calls(model)
            from_libraries = checkpointing_deprecations(caught)
            model.gradient_checkpointing_disable()
            model.gradient_checkpointing_enable()
            assert model.is_gradient_checkpointing
            TrainingArguments(output_dir=str(tmp_path), use_cpu=True, gradient_checkpointing=True, report_to="none")
        return from_libraries, checkpointing_deprecations(caught)[len(from_libraries):]

    deprecated = ["`is_gradient_checkpointing`", "`gradient_checkpointing_disable`", "`gradient_checkpointing_enable`"]
    loud_libraries, _ = run(quiet=False)
    # Without the filter the library calls do warn (and, shown once per place, hide the user's later calls).
    assert sorted(m.split(" ")[0] for m in loud_libraries) == sorted(deprecated)
    quiet_libraries, quiet_user = run(quiet=True)
    assert quiet_libraries == []  # also fails if transformers rewords one (`noise.DEPRECATED_ALIASES`)
    # disable, enable, is_..., then TrainingArguments(gradient_checkpointing=True): the user's setting.
    assert [m.split(" ")[0] for m in quiet_user] == [*deprecated[1:], deprecated[0], "`gradient_checkpointing`"]


def test_a_filter_only_matches_its_own_warning():
    matcher = noise._CalledByALibrary("is_gradient_checkpointing", noise.DEPRECATED_ALIASES["is_gradient_checkpointing"])
    assert not matcher.match("something else")
    # Raised outside the deprecated method (no such frame on the stack): never dropped.
    assert not matcher.match(noise.DEPRECATED_ALIASES["is_gradient_checkpointing"] + " Use ...")
