"""Faults a training run survives, each injected: a SIGKILL mid-training and mid-save, a save that fails, a torn
checkpoint written by something else, a complete checkpoint left in the staging folder, a relaunch with one command
(`resume_from_checkpoint: auto`), every save error as one line, `save_only_model` resumed. Damaged checkpoints:
test_checkpoint_damage.py; several processes, nodes and elastic restarts: test_recovery_launches.py.

Every stateful loss (GEM with a target entropy, SED-SFT's calibrated threshold, EKSFT's and ASFT's frozen reference,
EMO's frozen cost embedding, PSFT's old policy, CurioSFT's teacher) and `trl_emo.dpo` and `trl_emo.grpo` are killed at a seeded step, relaunched with `auto`,
and must end with the weights of an uninterrupted run, bit for bit. The runs are children forked from a server that
imported the stack once (`fault_injection`); the fault matrix is in docs/reliability.md.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import CORPUS
from data_fixtures import write_fixture
from fault_injection import Fault, run_with_fault

from trl_emo.commands import sft
from trl_emo.training import checkpoints as ckpt
from trl_emo.training import output_lock

ROOT = Path(__file__).resolve().parent.parent
MAX_STEPS, SAVE_STEPS = 4, 2
TRAIN = ["--max_steps", str(MAX_STEPS), "--save_strategy", "steps", "--save_steps", str(SAVE_STEPS), "--logging_steps",
         "1", "--report_to", "none", "--use_cpu", "true", "--bf16", "false", "--seed", "0"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from trl_emo.models.tiny import save_tiny_causal_lm

    root = tmp_path_factory.mktemp("faults")
    return {
        "model": save_tiny_causal_lm(CORPUS, output_dir=root / "chat", vocab_size=320, hidden_size=32,
                                     intermediate_size=64),
        "alpaca": write_fixture("alpaca", root, n_rows=16),
        "ultrafeedback": write_fixture("ultrafeedback", root, n_rows=16),
        "gsm8k": write_fixture("gsm8k", root),
        "root": root,
    }


def sft_argv(assets, *loss):
    return ["--recipe", "demo", "--model_name_or_path", assets["model"], "--dataset_name", assets["alpaca"],
            "--per_device_train_batch_size", "4", "--max_length", "256", *loss, *TRAIN]


def dpo_argv(assets):
    return ["--recipe", "dpo_ultrafeedback", "--model_name_or_path", assets["model"], "--dataset_name",
            assets["ultrafeedback"], "--dtype", "float32", "--gradient_checkpointing", "false", "--eval_strategy", "no",
            "--gradient_accumulation_steps", "1", "--per_device_train_batch_size", "4", "--learning_rate", "1e-4",
            "--max_length", "128", *TRAIN]


def grpo_argv(assets):
    return ["--model_name_or_path", assets["model"], "--dataset_name", assets["gsm8k"], "--reward_funcs",
            "gsm8k_answer", "format", "--per_device_train_batch_size", "4", "--num_generations", "2",
            "--max_completion_length", "8", "--learning_rate", "1e-2", "--activation_checkpointing", "false",
            "--cpu_keep_freed_memory", "false", *TRAIN]


# What each run keeps beyond the weights, and so what a resume must restore exactly.
RUNS = {
    "gem_target_entropy": ("sft", lambda a: sft_argv(a, "--loss_type", "gem", "--gem_target_entropy", "2.0")),
    "sed_calibrated": ("sft", lambda a: sft_argv(a, "--loss_type", "sed")),
    "eksft_frozen_reference": ("sft", lambda a: sft_argv(a, "--loss_type", "eksft")),
    "asft_frozen_reference": ("sft", lambda a: sft_argv(a, "--loss_type", "asft")),
    "emo_frozen_cost": ("sft", lambda a: sft_argv(a, "--loss_type", "emo")),
    # A window of 3 and a mix every 2 steps: the checkpoint of step 2 holds an old policy (the start's) and a teacher
    # (mixed at step 2) that differ from its weights, which the resumed steps read.
    "psft_old_policy": ("sft", lambda a: sft_argv(a, "--loss_type", "psft", "--psft_old_policy_steps", "3")),
    "curio_sft_teacher": ("sft", lambda a: sft_argv(a, "--loss_type", "curio_sft", "--curio_teacher_sync_steps", "2")),
    "dpo": ("dpo", dpo_argv),
    "grpo": ("grpo", grpo_argv),
}


def drawn_fault(name: str) -> Fault:
    """The fault of a run, drawn from a generator seeded by its name (the same in every CI run): a kill at the start
    of a step, or a kill inside the save of a checkpoint (model written, optimizer not)."""
    rng = random.Random(f"trl_emo-faults-{name}")
    if rng.random() < 0.5:
        return Fault("kill", rng.randint(SAVE_STEPS + 1, MAX_STEPS))  # after a checkpoint
    return Fault("kill_in_save", rng.choice(range(SAVE_STEPS, MAX_STEPS + 1, SAVE_STEPS)))


def test_the_drawn_faults_cover_both_kinds_of_kill():
    kinds = {drawn_fault(name).kind for name in RUNS}
    assert kinds == {"kill", "kill_in_save"}


def weights(folder) -> dict:
    return load_file(str(Path(folder) / ("adapter_model.safetensors" if (Path(folder) / "adapter_model.safetensors").exists()
                                         else "model.safetensors")))


def assert_same_weights(a, b):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    different = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


_REFERENCES: dict = {}


def uninterrupted(assets, name: str) -> Path:
    """The run without a fault, launched with `auto` on an empty folder (computed once per run name and assets)."""
    key = (str(assets["root"]), name)
    if key not in _REFERENCES:
        command, argv = RUNS[name]
        out = assets["root"] / f"{name}-whole"
        log = assets["root"] / f"{name}-whole.log"
        code = run_with_fault(command, [*argv(assets), "--output_dir", str(out), "--resume_from_checkpoint", "auto"],
                              log_path=log)
        assert code == 0, log.read_text()[-3000:]
        assert "no complete checkpoint" in log.read_text() and "starting from scratch" in log.read_text()
        _REFERENCES[key] = out
    return _REFERENCES[key]


@pytest.mark.parametrize("name", list(RUNS))
def test_killed_at_a_seeded_moment_then_relaunched_with_auto_ends_bit_for_bit_as_an_uninterrupted_run(assets, tmp_path,
                                                                                                    name):
    command, argv = RUNS[name]
    fault = drawn_fault(name)
    out = tmp_path / "out"
    relaunch = [*argv(assets), "--output_dir", str(out), "--resume_from_checkpoint", "auto"]
    assert run_with_fault(command, relaunch, fault) == -signal.SIGKILL
    # The kill left no torn checkpoint: the interrupted save (if any) sits in the staging folder only.
    saved = ckpt.checkpoints(str(out))
    assert all(not ckpt.missing_parts(folder) for folder in saved)
    last = fault.step - (1 if fault.kind == "kill" else SAVE_STEPS)
    last -= last % SAVE_STEPS
    assert [ckpt.checkpoint_step(folder) for folder in saved] == list(range(last, 0, -SAVE_STEPS))
    log = tmp_path / "resume.log"
    assert run_with_fault(command, relaunch, log_path=log) == 0, log.read_text()[-3000:]
    assert (f"resuming from {saved[0]}" if saved else "starting from scratch") in log.read_text()
    # The killed run never gave its output_dir lock back: the kernel did, and the relaunch takes it over, saying so.
    assert "the lock of an earlier run (pid " in log.read_text() and "taking it over" in log.read_text()
    assert not (out / ckpt.STAGING_DIR).exists()  # what the cut save left is cleared
    assert_same_weights(out, uninterrupted(assets, name))


def test_a_torn_newest_checkpoint_is_skipped_named_and_kept(assets, tmp_path):
    whole = uninterrupted(assets, "emo_frozen_cost")
    out = tmp_path / "out"
    shutil.copytree(whole, out)
    # As a save cut short by a writer without staging (nor trl_emo's manifest) leaves it: the model written, no
    # state, no optimizer.
    torn = out / f"checkpoint-{MAX_STEPS}"
    for name in ("trainer_state.json", "optimizer.pt", "trl_emo_manifest.json", "trl_emo_checkpoint.json"):
        (torn / name).unlink()
    for name in ("model.safetensors", "trainer_state.json", "README.md"):
        (out / name).unlink(missing_ok=True)
    log = tmp_path / "resume.log"
    argv = [*RUNS["emo_frozen_cost"][1](assets), "--output_dir", str(out), "--resume_from_checkpoint", "true"]
    assert run_with_fault("sft", argv, log_path=log) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert f"skipping torn checkpoint {torn} (no trainer_state.json; no optimizer state)" in text
    assert f"resuming from {out / f'checkpoint-{SAVE_STEPS}'}" in text
    assert_same_weights(out, whole)
    kept = out / f"{ckpt.REPLACED_PREFIX}checkpoint-{MAX_STEPS}"
    assert (kept / "model.safetensors").exists()  # moved aside when the step was saved again, never deleted
    assert not ckpt.missing_parts(str(torn))


def test_a_failed_save_leaves_the_earlier_checkpoints_intact_and_says_so_in_one_line(assets, tmp_path):
    out = tmp_path / "out"
    argv = [*RUNS["gem_target_entropy"][1](assets), "--output_dir", str(out), "--resume_from_checkpoint", "auto"]
    log = tmp_path / "failed.log"
    assert run_with_fault("sft", argv, Fault("fail_save", MAX_STEPS), log_path=log) == 1
    lines = [line for line in log.read_text().splitlines() if "error" in line.lower()]
    assert lines == [f"trl_emo.sft: error: could not save {out / f'checkpoint-{MAX_STEPS}'}: No space left on device "
                     f"({out / ckpt.STAGING_DIR / f'checkpoint-{MAX_STEPS}' / 'optimizer.pt'}); the earlier checkpoints "
                     f"in {out} are intact (free space or fix the permission, then relaunch with "
                     "--resume_from_checkpoint auto)"]
    assert "Traceback" not in log.read_text()
    assert [Path(c).name for c in ckpt.checkpoints(str(out))] == [f"checkpoint-{SAVE_STEPS}"]
    assert not ckpt.missing_parts(str(out / f"checkpoint-{SAVE_STEPS}"), side_files=[
        "trl_emo_gem_beta.json"])
    assert not (out / ckpt.STAGING_DIR / f"checkpoint-{MAX_STEPS}").exists()
    # Nothing is lost: the relaunch ends where the uninterrupted run does.
    assert run_with_fault("sft", argv) == 0
    assert_same_weights(out, uninterrupted(assets, "gem_target_entropy"))


def test_true_without_a_checkpoint_and_a_torn_folder_named_explicitly_are_one_line_errors(assets, tmp_path, capsys):
    argv = [*sft_argv(assets, "--loss_type", "gem"), "--output_dir", str(tmp_path / "empty")]
    assert sft.run([*argv, "--resume_from_checkpoint", "true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"trl_emo.sft: error: resume_from_checkpoint: true, but {tmp_path / 'empty'} holds no complete "
                   "checkpoint; pass --resume_from_checkpoint auto to start from scratch when there is none (one command "
                   "for the first launch and every relaunch), or false."]
    torn = tmp_path / "checkpoint-3"
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"")
    assert sft.run([*argv, "--resume_from_checkpoint", str(torn)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{torn} is not a complete checkpoint (no trainer_state.json; no optimizer state; no " \
        "scheduler.pt; no RNG state; model.safetensors is cut short (0 bytes, no header))" in err[0]


def _touch(folder: Path, *names: str):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"x")


@pytest.mark.parametrize("files, save_only_model, side, missing", [
    (["trainer_state.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"], False, [], []),
    (["trainer_state.json", "model.safetensors"], True, [], []),  # save_only_model: weights and state suffice
    (["trainer_state.json", "model.safetensors"], False, [], ["optimizer state", "scheduler.pt", "RNG state"]),
    (["trainer_state.json", "adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state_1.pth"], False, [],
     []),  # an adapter; a rank's RNG state
    # ZeRO: DeepSpeed's own folder holds the optimizer (and scheduler)
    (["trainer_state.json", "model.safetensors", "global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt",
      "rng_state_0.pth"], False, [], []),
    # FSDP's sharded layout
    (["trainer_state.json", "pytorch_model_fsdp_0/__0_0.distcp", "optimizer_0/__0_0.distcp", "scheduler.pt",
      "rng_state_0.pth"], False, [], []),
    (["trainer_state.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"], False,
     ["trl_emo_sed_threshold.json"], ["trl_emo_sed_threshold.json"]),
    ([], True, [], ["trainer_state.json", "model weights"]),
])
def test_what_a_complete_checkpoint_holds(tmp_path, files, save_only_model, side, missing):
    _touch(tmp_path / "checkpoint-4", *files)
    assert ckpt.missing_parts(str(tmp_path / "checkpoint-4"), save_only_model, side) == missing


def test_a_sharded_checkpoint_missing_a_shard_is_torn(tmp_path):
    folder = tmp_path / "checkpoint-2"
    _touch(folder, "trainer_state.json", "model-00001-of-00002.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    assert ckpt.missing_parts(str(folder), save_only_model=True) == ["weight shards model-00002-of-00002.safetensors"]


def write_valid_checkpoint(folder: Path, step: int = 1) -> Path:
    """A small checkpoint whose files are all whole by their formats (no trl_emo manifest)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    save_file({"w": torch.ones(2, 2)}, str(folder / "model.safetensors"))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({"step": step}, folder / name)
    return folder


def test_auto_resolution_order_and_messages(tmp_path, caplog):
    write_valid_checkpoint(tmp_path / "checkpoint-2")
    _touch(tmp_path / "checkpoint-10", "model.safetensors")  # newer by number (not by name), torn
    write_valid_checkpoint(tmp_path / "_replaced-checkpoint-12")  # moved aside: never a candidate
    assert ckpt.resolve_checkpoint("auto", str(tmp_path)) == str(tmp_path / "checkpoint-2")
    assert "skipping torn checkpoint" in caplog.text and "checkpoint-10" in caplog.text
    assert ckpt.resolve_checkpoint("false", str(tmp_path)) is None
    assert ckpt.resolve_checkpoint("auto", str(tmp_path / "nothing-yet")) is None


def test_a_complete_checkpoint_left_in_staging_is_published_at_the_next_launch(assets, tmp_path):
    """A kill after the last file and the manifest of checkpoint-2 were written, before its rename: the work is on
    disk, and the relaunch publishes it instead of clearing it."""
    out = tmp_path / "out"
    argv = [*RUNS["gem_target_entropy"][1](assets), "--output_dir", str(out), "--resume_from_checkpoint", "auto"]
    assert run_with_fault("sft", argv, Fault("kill_before_publish", SAVE_STEPS)) == -signal.SIGKILL
    assert ckpt.checkpoints(str(out)) == []
    staged = out / ckpt.STAGING_DIR / f"checkpoint-{SAVE_STEPS}"
    assert (staged / "trl_emo_manifest.json").exists()
    log = tmp_path / "resume.log"
    assert run_with_fault("sft", argv, log_path=log) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert f"published checkpoint-{SAVE_STEPS}, left complete in {out / ckpt.STAGING_DIR}" in text
    assert f"resuming from {out / f'checkpoint-{SAVE_STEPS}'}" in text
    assert not (out / ckpt.STAGING_DIR).exists()
    assert_same_weights(out, uninterrupted(assets, "gem_target_entropy"))


@pytest.mark.parametrize("fault, says, left", [
    # The staging folder cannot be created (disk full): before anything of the checkpoint is written.
    (Fault("fail_staging", SAVE_STEPS), "could not save {final}: No space left on device ({staged})", []),
    # The final model (after the last checkpoint): safetensors' own error, not an OSError.
    (Fault("fail_final_save"), "could not save the final model to {out}: Error while serializing: I/O error: No "
                               "space left on device (os error 28); the checkpoints there are intact",
     [f"checkpoint-{SAVE_STEPS}"]),
])
def test_every_save_error_is_one_line(assets, tmp_path, fault, says, left):
    out = tmp_path / "out"
    argv = [*RUNS["emo_frozen_cost"][1](assets), "--output_dir", str(out), "--resume_from_checkpoint", "auto",
            "--max_steps", str(SAVE_STEPS)]
    log = tmp_path / "failed.log"
    assert run_with_fault("sft", argv, fault, log_path=log) == 1
    text = log.read_text()
    final = out / f"checkpoint-{SAVE_STEPS}"
    expected = says.format(final=final, staged=out / ckpt.STAGING_DIR / final.name, out=out)
    lines = [line for line in text.splitlines() if " error: " in line or line.startswith("Traceback")]
    assert len(lines) == 1 and lines[0].startswith(f"trl_emo.sft: error: {expected}"), lines
    assert [Path(c).name for c in ckpt.checkpoints(str(out))] == left
    assert not (out / ckpt.STAGING_DIR).exists()


def test_save_only_model_resumes_with_a_fresh_optimizer_and_says_so(assets, tmp_path):
    out = tmp_path / "out"
    argv = [*RUNS["gem_target_entropy"][1](assets), "--output_dir", str(out), "--resume_from_checkpoint", "auto",
            "--save_only_model", "true"]
    assert run_with_fault("sft", argv, Fault("kill", SAVE_STEPS + 1)) == -signal.SIGKILL
    log = tmp_path / "resume.log"
    assert run_with_fault("sft", argv, log_path=log) == 0, log.read_text()[-3000:]
    assert (f"{out / f'checkpoint-{SAVE_STEPS}'} holds the weights only (saved with save_only_model): the optimizer, "
            "the learning-rate schedule and the random state start fresh, so the run will not be the uninterrupted "
            "run's, bit for bit") in log.read_text()
    # As it says: the result is not the uninterrupted run's.
    with pytest.raises(AssertionError, match="tensors differ"):
        assert_same_weights(out, uninterrupted(assets, "gem_target_entropy"))


def test_push_to_hub_uploads_no_staging_no_torn_checkpoint_and_no_merged_sft_model(assets, tmp_path, monkeypatch):
    """What transformers' upload of `output_dir` leaves out, with the patterns it passes (recorded, not copied)."""
    import transformers.trainer
    from huggingface_hub.utils import filter_repo_objects
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_emo import SFTTrainer
    from trl_emo.commands.run_config import MERGED_DIR
    from conftest import cpu_config

    out = tmp_path / "out"
    for folder in (ckpt.STAGING_DIR + "/checkpoint-4", ckpt.REPLACED_PREFIX + "checkpoint-4", MERGED_DIR, "checkpoint-2"):
        _touch(out / folder, "model.safetensors")
    _touch(out, output_lock.LOCK_FILE)
    recorded = {}

    class Api:
        def upload_folder(self, **kwargs):
            recorded.update(kwargs)

    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: Api())
    trainer = SFTTrainer(AutoModelForCausalLM.from_pretrained(assets["model"]), cpu_config(out),
                         processing_class=AutoTokenizer.from_pretrained(assets["model"]),
                         train_dataset=__import__("datasets").Dataset.from_list([{"prompt": "a", "completion": "b"}]))
    trainer.hub_model_id = "someone/model"
    trainer.push_to_hub()
    files = [str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()]
    uploaded = set(filter_repo_objects(files, ignore_patterns=recorded["ignore_patterns"]))
    assert "model.safetensors" in uploaded
    assert not [f for f in uploaded if f.startswith((ckpt.STAGING_DIR, ckpt.REPLACED_PREFIX, MERGED_DIR, "checkpoint-",
                                                     output_lock.LOCK_FILE))]


def test_a_checkpoint_is_pushed_from_its_published_folder(assets, tmp_path, monkeypatch):
    """transformers pushes the folder it just wrote, in the background: the staged one, which the rename takes away
    mid-upload. The push is made from `checkpoint-N` once it is published."""
    import datasets
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conftest import cpu_config
    from trl_emo import SFTTrainer

    pushed = []
    monkeypatch.setattr(transformers.Trainer, "_push_from_checkpoint",
                        lambda self, folder: pushed.append((folder, (Path(folder) / "model.safetensors").is_file())))
    out = tmp_path / "out"
    trainer = SFTTrainer(AutoModelForCausalLM.from_pretrained(assets["model"]), cpu_config(out, save_only_model=True),
                         processing_class=AutoTokenizer.from_pretrained(assets["model"]),
                         train_dataset=datasets.Dataset.from_list([{"prompt": "a", "completion": "b"}]))
    trainer.args.push_to_hub = True  # after construction: no Hub repository is created
    trainer.state.global_step = 3
    trainer._save_checkpoint(trainer.model, None)
    assert pushed == [(str(out / "checkpoint-3"), True)]
