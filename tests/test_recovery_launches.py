"""Recovery across processes, nodes and restarts, each launched as a user launches it (CPU, gloo).

- a rank of two killed, torch elastic restarting the group (`accelerate launch --max_restarts 2`), which resumes with
  `auto` and ends bit for bit as the uninterrupted two-process run;
- two nodes on this machine (`--num_machines 2 --machine_rank 0/1`), each with its own output folder
  (`save_on_each_node`, as per-node disks): one node's rank killed, then both relaunched with `auto`: a node whose disk
  lacks the checkpoint the main process chose stops the launch in one line naming it; with its copy back, both end bit
  for bit as the uninterrupted run;
- DeepSpeed ZeRO-2 checkpoints written by a real two-process run: the damage matrix's DeepSpeed layout (every file
  kind and damage, with and without the manifest, in-process) and one relaunch, bit for bit.

The uninterrupted two-process run is launched once (`ddp_reference`) and is the reference of the restart and the
two-node runs: two nodes of one process each are two processes of one global batch, the same run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoint_layouts import DAMAGES, copy_checkpoints, damage, drop_records
from conftest import free_port, launch_failure
from test_deepspeed import deepspeed_cpu  # noqa: F401 - DeepSpeed's CPU op compiled once, before two ranks race
from test_faults import MAX_STEPS, SAVE_STEPS, assert_same_weights, assets, sft_argv  # noqa: F401

from trl_emo.training import checkpoint_manifest as manifest
from trl_emo.training import checkpoints as ckpt

LAUNCH_SCRIPT = Path(__file__).parent / "scripts" / "run_command.py"
ACCELERATE_CONFIGS = Path(__file__).resolve().parent.parent / "recipes" / "accelerate"


def cpu_env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
            "DS_ACCELERATOR": "cpu"}


def launch(cwd: Path, target: list[str], *launcher: str, machine: int | None = None, port: int | None = None,
           env: dict | None = None) -> subprocess.Popen:
    """`accelerate launch` of two CPU processes running `target` (`-m trl_emo.sft ...`, or `run_command.py` and its
    JSON); with `machine`, as node `machine` of two (one process each) meeting at `port`."""
    nodes = ["--num_machines", "1"] if machine is None else [
        "--num_machines", "2", "--machine_rank", str(machine), "--main_process_ip", "127.0.0.1"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *(launcher or ("--multi_gpu",)), "--num_processes", "2",
           *nodes, "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port or free_port()),
           *target]
    # A session of its own: a launch that overruns is ended with every worker it started (they hold its output open).
    return subprocess.Popen(cmd, env={**cpu_env(), **(env or {})}, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(process: subprocess.Popen, timeout: float = 600) -> subprocess.CompletedProcess:
    # The timeout turns a collective that never completes into a failure instead of a stuck CI job.
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        err += f"\n[the launch ran past {timeout} s and was killed]"
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def script(run: dict) -> list[str]:
    return [str(LAUNCH_SCRIPT), json.dumps(run)]


def ddp_argv(assets) -> list[str]:
    # EKSFT with the authors' formula: a frozen reference copy, and the label rows on both processes.
    return [*sft_argv(assets, "--loss_type", "eksft", "--eksft_formula", "authors"), "--resume_from_checkpoint", "auto",
            "--per_device_train_batch_size", "2"]


@pytest.fixture(scope="module")
def ddp_reference(assets, tmp_path_factory) -> Path:
    """The uninterrupted two-process run, launched as a user launches it (`-m trl_emo.sft`)."""
    whole = tmp_path_factory.mktemp("ddp") / "whole"
    result = finish(launch(whole.parent, ["-m", "trl_emo.sft", *ddp_argv(assets), "--output_dir", str(whole)]))
    assert result.returncode == 0, launch_failure(result)
    assert (whole / "model.safetensors").exists() and (whole / f"checkpoint-{MAX_STEPS}").exists()
    return whole


def test_a_killed_rank_makes_torch_elastic_restart_the_group_which_resumes_with_auto_bit_for_bit(assets, ddp_reference,
                                                                                                tmp_path):
    """`accelerate launch --max_restarts 2` (torch elastic): the second rank killed at the start of step 3 in the
    first attempt only; the agent stops the group and starts it again, which resumes from checkpoint-2 with `auto`.
    With the c10d rendezvous and `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (README, "Errors and interruptions"): the
    store torch elastic shares with the workers by default keeps the dead group's addresses, and the restarted group
    read them (measured here: with accelerate's default static rendezvous the restarted group hung in
    `init_process_group`; with c10d and the shared store, of four launches one failed and one hung; pytorch#135712)."""
    out = tmp_path / "out"
    run = {"command": "sft", "argv": [*ddp_argv(assets), "--output_dir", str(out)], "fault": ["kill", 3], "rank": 1,
           "first_attempt": True}
    result = finish(launch(tmp_path, script(run), "--multi_gpu", "--max_restarts", "2", "--rdzv_backend", "c10d",
                           env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}), timeout=300)
    assert result.returncode == 0, launch_failure(result)
    logs = result.stdout + result.stderr
    assert "starting from scratch" in logs and f"resuming from {out / f'checkpoint-{SAVE_STEPS}'}" in logs
    assert_same_weights(out, ddp_reference)


def test_two_nodes_each_with_its_own_disk_one_killed_then_both_relaunched_with_auto_end_bit_for_bit(assets,
                                                                                                   ddp_reference,
                                                                                                   tmp_path):
    disks = {node: tmp_path / f"node{node}" for node in (0, 1)}
    run = {"command": "sft", "argv": [*ddp_argv(assets), "--save_on_each_node", "true"],
           "argv_by_node": {str(node): ["--output_dir", str(disk)] for node, disk in disks.items()}}

    def both(run) -> list[subprocess.CompletedProcess]:
        port = free_port()
        nodes = [launch(tmp_path, script(run), "--multi_gpu", machine=node, port=port) for node in (0, 1)]
        return [finish(node, timeout=300) for node in nodes]

    # Node 1's rank killed at the start of step 3: both launches go down; each disk holds its own checkpoint-2.
    killed = both({**run, "fault": ["kill", 3], "rank": 1})
    assert all(result.returncode != 0 for result in killed)
    for disk in disks.values():
        assert [Path(c).name for c in ckpt.checkpoints(str(disk))] == [f"checkpoint-{SAVE_STEPS}"]
        assert not ckpt.checkpoint_problems(str(disk / f"checkpoint-{SAVE_STEPS}"))
    # Node 1's copy gone: the main process chooses checkpoint-2 on its disk; node 1 cannot follow and says so.
    moved = disks[1] / "moved-away"
    (disks[1] / f"checkpoint-{SAVE_STEPS}").rename(moved)
    refused = both(run)
    lacking = disks[1] / f"checkpoint-{SAVE_STEPS}"
    for result in refused:
        assert result.returncode != 0
        lines = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("trl_emo.sft: error")]
        assert lines == [f"trl_emo.sft: error: resume_from_checkpoint: the main process chose checkpoint-{SAVE_STEPS}, "
                         f"but node 1 (host {socket.gethostname()}, rank 1) cannot resume from it: {lacking} is not "
                         "there; give every node a whole copy of it (save_on_each_node writes each node's copy to its "
                         "own disk), or pass a checkpoint folder every node holds."], launch_failure(result)
    moved.rename(lacking)
    relaunched = both(run)
    for node, result in zip(disks, relaunched):
        assert result.returncode == 0, launch_failure(result)
    assert f"resuming from {disks[0] / f'checkpoint-{SAVE_STEPS}'}" in relaunched[0].stdout + relaunched[0].stderr
    for disk in disks.values():  # each node's copy of the final model, and of the checkpoints, with the weights
        assert_same_weights(disk, ddp_reference)
        assert (disk / f"checkpoint-{MAX_STEPS}" / "model.safetensors").exists()


# -- DeepSpeed ZeRO-2 ---------------------------------------------------------------------------------------------

DEEPSPEED = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None or shutil.which(
    os.environ.get("CXX", "c++")) is None, reason="deepspeed (and a C++ compiler for its CPU op) is not installed")
DEEPSPEED_KINDS = {
    "weights": "model.safetensors", "model states": f"global_step{MAX_STEPS}/mp_rank_00_model_states.pt",
    "optimizer": f"global_step{MAX_STEPS}/zero_pp_rank_1_mp_rank_00_optim_states.pt", "latest": "latest",
    "scheduler": "scheduler.pt", "RNG": "rng_state_1.pth", "trainer state": "trainer_state.json",
    "side file": "trl_emo_gem_beta.json", "manifest": manifest.MANIFEST,
}
# Without a manifest, what structure cannot decide in a DeepSpeed folder: without `model.safetensors` it is complete
# (DeepSpeed resumes the weights from its own model and optimizer states; transformers never reads that file there);
# without `scheduler.pt` it may be (DeepSpeed keeps its own scheduler when its configuration has one, which the folder
# does not say): the load decides, and the relaunch below shows the run going back from it.
DEEPSPEED_STRUCTURE_ACCEPTS = {("weights", "delete"), ("scheduler", "delete")}


def zero2_argv(assets, out: Path) -> list[str]:
    return ["-m", "trl_emo.sft", *sft_argv(assets, "--loss_type", "gem", "--gem_target_entropy", "2.0"),
            "--per_device_train_batch_size", "2", "--resume_from_checkpoint", "auto", "--output_dir", str(out)]


def zero2(tmp_path: Path, assets, out: Path) -> subprocess.CompletedProcess:
    return finish(launch(tmp_path, zero2_argv(assets, out), "--config_file", str(ACCELERATE_CONFIGS / "zero2.yaml")))


@pytest.fixture(scope="module")
def zero2_run(assets, tmp_path_factory, deepspeed_cpu) -> Path:
    root = tmp_path_factory.mktemp("zero2")
    result = zero2(root, assets, root / "whole")
    assert result.returncode == 0, launch_failure(result)
    return root / "whole"


@DEEPSPEED
def test_deepspeed_zero2_layout_every_damage_is_skipped_named_and_kept_then_a_relaunch_ends_bit_for_bit(
        assets, zero2_run, tmp_path):
    for kind, path in DEEPSPEED_KINDS.items():
        for with_manifest in (True, False):
            if kind == "manifest" and not with_manifest:
                continue
            for how in DAMAGES:
                case = f"{kind}-{how}-{with_manifest}".replace(" ", "_")
                out = copy_checkpoints(zero2_run, tmp_path / case)
                if not with_manifest:
                    for folder in out.iterdir():
                        drop_records(folder)
                damage(out / f"checkpoint-{MAX_STEPS}" / path, how)
                scan = ckpt.newest_complete_checkpoint(str(out), side_files=["trl_emo_gem_beta.json"])
                if not with_manifest and (kind, how) in DEEPSPEED_STRUCTURE_ACCEPTS:
                    assert scan.checkpoint == str(out / f"checkpoint-{MAX_STEPS}"), case
                    continue
                assert scan.checkpoint == str(out / f"checkpoint-{SAVE_STEPS}"), (case, scan.skipped)
                assert [folder for folder, _ in scan.skipped] == [str(out / f"checkpoint-{MAX_STEPS}")], case
    # One relaunch, of the case only the load can decide (no manifest, no scheduler.pt, which this configuration
    # needs): both processes fail to load it, agree on it, mark it, and the same launch goes back to checkpoint-2 on
    # a trainer built again (a second DeepSpeed engine in the same processes), bit for bit.
    out = copy_checkpoints(zero2_run, tmp_path / "relaunch")
    for folder in out.iterdir():
        drop_records(folder)
    damage(out / f"checkpoint-{MAX_STEPS}" / DEEPSPEED_KINDS["scheduler"], "delete")
    result = zero2(tmp_path, assets, out)
    assert result.returncode == 0, launch_failure(result)
    logs = result.stdout + result.stderr
    newest = out / f"checkpoint-{MAX_STEPS}"
    assert logs.count(f"checkpoint {newest} failed to load (node 0 (host {socket.gethostname()}, rank 0): optimizer "
                      f"and scheduler: No such file or directory ({newest / 'scheduler.pt'})); it is marked unusable "
                      "(kept), going back to the previous complete checkpoint") == 1, launch_failure(result)
    assert f"resuming from {out / f'checkpoint-{SAVE_STEPS}'}" in logs
    assert (out / f"{ckpt.REPLACED_PREFIX}checkpoint-{MAX_STEPS}" / manifest.UNUSABLE).exists()
    assert_same_weights(out, zero2_run)
