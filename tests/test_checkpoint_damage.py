"""A damaged newest checkpoint never breaks a relaunch; rotation never deletes what it should keep; one run per
`output_dir` (docs/reliability.md, "Damaged checkpoints").

The damage matrix: for each layout (single file, sharded index, FSDP2 sharded here; DeepSpeed ZeRO-2 from a real
two-process run in test_recovery_launches.py), each file kind (weights, optimizer, scheduler, RNG, trainer state, the
loss's side file, the manifest) and each damage (deleted, emptied, cut to half, first 64 bytes zeroed), the newest
checkpoint (`checkpoint-4`) is damaged in a copy and the resume scan must skip it, name it and keep it, and take
`checkpoint-2`: once judged by its manifest, once with the manifest removed (a folder of another writer, judged by its
files' structure). Those scans are in-process and share one tiny run's checkpoints (GEM with a target entropy, whose
beta is the side file). A relaunch with `auto` per file kind (single file) and per layout (sharded; DeepSpeed in
test_recovery_launches.py) then shows the run ends bit for bit as the uninterrupted one: the scan is the same
function for every case, so a relaunch per case would retest the trainer, not the detection.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from checkpoint_layouts import DAMAGES, copy_checkpoints, damage, drop_records, shard_weights, write_fsdp_checkpoints
from fault_injection import Fault, run_with_fault
from test_faults import MAX_STEPS, RUNS, SAVE_STEPS, assert_same_weights, assets, uninterrupted  # noqa: F401

from trl_emo.commands import sft
from trl_emo.training import checkpoint_manifest as manifest
from trl_emo.training import checkpoints as ckpt
from trl_emo.training import output_lock

RUN = "gem_target_entropy"
SIDE_FILE = "trl_emo_gem_beta.json"
# Each layout's file of each kind, in checkpoint-4.
KINDS = {
    "single": {"weights": "model.safetensors", "optimizer": "optimizer.pt", "scheduler": "scheduler.pt",
               "RNG": "rng_state.pth", "trainer state": "trainer_state.json", "side file": SIDE_FILE,
               "manifest": manifest.MANIFEST, "record": manifest.RECORD},
    "sharded": {"weights": "model-00002-of-00002.safetensors", "weights index": "model.safetensors.index.json",
                "optimizer": "optimizer.pt", "scheduler": "scheduler.pt", "RNG": "rng_state.pth",
                "trainer state": "trainer_state.json", "side file": SIDE_FILE, "manifest": manifest.MANIFEST},
    "fsdp": {"weights": "pytorch_model_fsdp_0/__1_0.distcp", "weights index": "pytorch_model_fsdp_0/.metadata",
             "optimizer": "optimizer_0/__0_0.distcp", "optimizer index": "optimizer_0/.metadata",
             "scheduler": "scheduler.pt", "RNG": "rng_state_1.pth", "trainer state": "trainer_state.json",
             "side file": SIDE_FILE, "manifest": manifest.MANIFEST},
}
# What structure alone cannot see (the sizes and headers intact): bytes overwritten inside a Distributed Checkpoint
# shard, whose format has no header of its own. A manifest's checksum catches it; without one, the load fails and
# the trainer goes back to the previous checkpoint (test_a_checkpoint_that_fails_to_load...).
STRUCTURE_BLIND = {("fsdp", "weights", "overwrite"), ("fsdp", "optimizer", "overwrite")}
_RECORD_KINDS = {"manifest", "record"}


@pytest.fixture(scope="module")
def layouts(assets, tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    single = uninterrupted(assets, RUN)
    sharded = copy_checkpoints(single, root / "sharded")
    for step in (2, 4):
        shard_weights(sharded / f"checkpoint-{step}")
    return {"single": single, "sharded": sharded, "fsdp": write_fsdp_checkpoints(root / "fsdp", single)}


def assert_skipped(scan: ckpt.CheckpointScan, out: Path, case: str) -> None:
    newest = out / f"checkpoint-{MAX_STEPS}"
    assert scan.checkpoint == str(out / f"checkpoint-{SAVE_STEPS}"), f"{case}: chose {scan.checkpoint}"
    assert [folder for folder, _ in scan.skipped] == [str(newest)] and scan.skipped[0][1], case
    assert newest.is_dir(), f"{case}: the damaged checkpoint was not kept"


@pytest.mark.parametrize("layout, kind", [(layout, kind) for layout, kinds in KINDS.items() for kind in kinds])
def test_a_damaged_file_of_the_newest_checkpoint_is_skipped_named_and_kept(layouts, tmp_path, layout, kind):
    path = KINDS[layout][kind]
    for with_manifest in (True, False):
        if kind in _RECORD_KINDS and not with_manifest:
            continue
        for how in DAMAGES:
            case = f"{layout}/{kind}/{how}/{'manifest' if with_manifest else 'structure'}"
            out = copy_checkpoints(layouts[layout], tmp_path / case.replace("/", "-").replace(" ", "_"))
            if not with_manifest:
                for folder in out.iterdir():
                    drop_records(folder)
            damage(out / f"checkpoint-{MAX_STEPS}" / path, how)
            scan = ckpt.newest_complete_checkpoint(str(out), side_files=[SIDE_FILE])
            if not with_manifest and (layout, kind, how) in STRUCTURE_BLIND:
                assert scan.checkpoint == str(out / f"checkpoint-{MAX_STEPS}"), case  # the load decides (see above)
                continue
            assert_skipped(scan, out, case)
            if with_manifest or how != "delete":
                # The warning names the file (a deleted one is named by what is missing: "no RNG state").
                named = os.path.basename(path) if kind != "manifest" else manifest.MANIFEST
                assert named in "; ".join(scan.skipped[0][1]), (case, scan.skipped)


def test_the_undamaged_layouts_are_complete_by_manifest_and_by_structure(layouts, tmp_path):
    for layout, source in layouts.items():
        out = copy_checkpoints(source, tmp_path / layout)
        assert ckpt.newest_complete_checkpoint(str(out), side_files=[SIDE_FILE]).checkpoint == \
            str(out / f"checkpoint-{MAX_STEPS}"), layout
        for folder in out.iterdir():
            drop_records(folder)
        scan = ckpt.newest_complete_checkpoint(str(out), side_files=[SIDE_FILE])
        assert scan.checkpoint == str(out / f"checkpoint-{MAX_STEPS}"), (layout, scan.skipped)


def relaunch(assets, out: Path, log: Path, *extra: str) -> str:
    argv = [*RUNS[RUN][1](assets), "--output_dir", str(out), "--resume_from_checkpoint", "auto", *extra]
    code = run_with_fault("sft", argv, log_path=log)
    assert code == 0, log.read_text()[-3000:]
    return log.read_text()


def damaged_run(source: Path, out: Path, path: str, how: str) -> Path:
    """A copy of a run's checkpoints with `path` of checkpoint-4 damaged, as the relaunch finds them."""
    copy_checkpoints(source, out)
    damage(out / f"checkpoint-{MAX_STEPS}" / path, how)
    return out


# One relaunch per file kind of the single-file layout (every damage appears), one for the sharded index.
RELAUNCHES = [("single", "weights", "half"), ("single", "optimizer", "overwrite"), ("single", "scheduler", "empty"),
              ("single", "RNG", "delete"), ("single", "trainer state", "half"), ("single", "side file", "overwrite"),
              ("single", "manifest", "delete"), ("sharded", "weights", "half")]


@pytest.mark.parametrize("layout, kind, how", RELAUNCHES)
def test_relaunched_with_auto_after_damage_ends_bit_for_bit_from_the_previous_checkpoint(assets, layouts, tmp_path,
                                                                                         layout, kind, how):
    path = KINDS[layout][kind]
    out = damaged_run(layouts[layout], tmp_path / "out", path, how)
    damaged_size = None if how == "delete" else (out / f"checkpoint-{MAX_STEPS}" / path).stat().st_size
    text = relaunch(assets, out, tmp_path / "resume.log")
    assert f"skipping torn checkpoint {out / f'checkpoint-{MAX_STEPS}'} (" in text
    assert f"resuming from {out / f'checkpoint-{SAVE_STEPS}'}" in text
    assert "Traceback" not in text
    # The damaged folder is kept, as it was, moved aside when step 4 was saved again.
    kept = out / f"{ckpt.REPLACED_PREFIX}checkpoint-{MAX_STEPS}" / path
    assert (kept.stat().st_size if kept.exists() else None) == damaged_size
    assert_same_weights(out, uninterrupted(assets, RUN))


def test_a_checkpoint_that_fails_to_load_is_marked_kept_and_the_run_goes_back_in_the_same_launch(assets, layouts,
                                                                                                 tmp_path):
    """Damage no check can see (no manifest; a whole torch.save file holding something else than an optimizer
    state): the load fails, the checkpoint is named with the cause, marked, and the same launch resumes from the
    previous one, bit for bit. The next scan skips it; naming it explicitly is a one-line error."""
    out = copy_checkpoints(layouts["single"], tmp_path / "out")
    for folder in out.iterdir():
        drop_records(folder)
    newest = out / f"checkpoint-{MAX_STEPS}"
    torch.save({"not": "an optimizer state"}, newest / "optimizer.pt")
    assert ckpt.newest_complete_checkpoint(str(out)).checkpoint == str(newest)  # it passes every check
    text = relaunch(assets, out, tmp_path / "resume.log")
    assert (f"checkpoint {newest} failed to load (optimizer and scheduler: KeyError: 'param_groups'); it is marked "
            "unusable (kept), going back to the previous complete checkpoint") in text
    assert f"resuming from {out / f'checkpoint-{SAVE_STEPS}'}" in text
    assert_same_weights(out, uninterrupted(assets, RUN))
    kept = out / f"{ckpt.REPLACED_PREFIX}checkpoint-{MAX_STEPS}"
    assert "param_groups" in json.loads((kept / manifest.UNUSABLE).read_text())["cause"]
    # Marked: never chosen again (here, where it was), and a folder named explicitly says why, in one line.
    shutil.copytree(kept, tmp_path / "again" / f"checkpoint-{MAX_STEPS}")
    copy_checkpoints(layouts["single"], tmp_path / "again", steps=(2,))
    scan = ckpt.newest_complete_checkpoint(str(tmp_path / "again"))
    assert scan.checkpoint.endswith(f"checkpoint-{SAVE_STEPS}") and "marked unusable" in scan.skipped[0][1][0]
    with pytest.raises(ckpt.ConfigError, match="marked unusable: it failed to load on .*param_groups"):
        ckpt.resolve_checkpoint(str(kept), str(out))


def test_a_named_checkpoint_that_fails_to_load_is_a_one_line_error(assets, layouts, tmp_path):
    out = copy_checkpoints(layouts["single"], tmp_path / "out")
    newest = out / f"checkpoint-{MAX_STEPS}"
    drop_records(newest)
    torch.save({"not": "an optimizer state"}, newest / "optimizer.pt")
    log = tmp_path / "named.log"
    argv = [*RUNS[RUN][1](assets), "--output_dir", str(out), "--resume_from_checkpoint", str(newest)]
    assert run_with_fault("sft", argv, log_path=log) == 2
    lines = [line for line in log.read_text().splitlines() if " error: " in line or line.startswith("Traceback")]
    assert lines == [f"trl_emo.sft: error: resume_from_checkpoint: checkpoint {newest} failed to load (optimizer and "
                     "scheduler: KeyError: 'param_groups'); it is marked unusable, kept; pass another checkpoint "
                     "folder, or auto to take the newest complete one"]
    assert (newest / manifest.UNUSABLE).exists()


# -- rotation ------------------------------------------------------------------------------------------------------


def _sealed(folder: Path, run: str, saved_at: float) -> Path:
    from test_faults import write_valid_checkpoint

    write_valid_checkpoint(folder)
    manifest.write_record(str(folder), run, 1)
    manifest.write_manifest(str(folder), run, 1)
    data = json.loads((folder / manifest.MANIFEST).read_text())
    data["saved_at"] = saved_at  # the order a run wrote them in
    (folder / manifest.MANIFEST).write_text(json.dumps(data))
    return folder


def test_rotation_counts_and_deletes_only_this_runs_complete_checkpoints(tmp_path):
    ours = [_sealed(tmp_path / f"checkpoint-{step}", "A", step) for step in (1, 2, 3, 4)]
    torn = _sealed(tmp_path / "checkpoint-5", "A", 5)
    os.truncate(torn / "optimizer.pt", 10)
    marked = _sealed(tmp_path / "checkpoint-6", "A", 6)
    ckpt.mark_unusable(str(marked), "test")
    other_run = _sealed(tmp_path / "checkpoint-7", "B", 0)
    from test_faults import write_valid_checkpoint

    foreign = write_valid_checkpoint(tmp_path / "checkpoint-8")  # TRL's scripts: no manifest
    # A limit of 3 over this run's four complete checkpoints: the oldest that is not the best (checkpoint-1) goes.
    deleted = ckpt.rotate_checkpoints(str(tmp_path), 3, "A", protected=[str(ours[3]), str(ours[0])])  # newest, best
    assert deleted == [str(ours[1])]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (ours[0], ours[2], ours[3], torn, marked, other_run, foreign))


def test_a_run_with_a_limit_of_two_relaunched_keeps_its_two_newest_and_every_torn_or_foreign_folder(assets, tmp_path):
    """The issue's case: a torn `checkpoint-5` present and `save_total_limit: 2`. A kill at step 3, a relaunch with
    `auto` (the run keeps its identity through the resumed checkpoint's manifest), and one of the run's own
    checkpoints damaged between the launches: only this run's complete checkpoints are counted and deleted."""
    out = tmp_path / "out"
    torn_foreign = out / "checkpoint-5"
    torn_foreign.mkdir(parents=True)
    (torn_foreign / "trainer_state.json").write_text("{}")
    argv = [*RUNS[RUN][1](assets), "--output_dir", str(out), "--resume_from_checkpoint", "auto",
            "--save_steps", "1", "--save_total_limit", "2"]
    assert run_with_fault("sft", argv, Fault("kill", 3)) == -signal.SIGKILL
    assert {p.name for p in out.glob("checkpoint-*")} == {"checkpoint-1", "checkpoint-2", "checkpoint-5"}
    os.truncate(out / "checkpoint-1" / "optimizer.pt", 100)  # torn after it was written
    log = tmp_path / "resume.log"
    assert run_with_fault("sft", argv, log_path=log) == 0, log.read_text()[-3000:]
    assert f"resuming from {out / 'checkpoint-2'}" in log.read_text()
    assert {p.name for p in out.glob("checkpoint-*")} == {"checkpoint-1", "checkpoint-3", "checkpoint-4",
                                                          "checkpoint-5"}
    assert_same_weights(out, uninterrupted(assets, RUN))


# -- one run per output_dir ---------------------------------------------------------------------------------------


def _hold(out: Path, holder: dict) -> int:
    """The lock as a live run holds it: the kernel's flock on an open file, the holder written in it."""
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / output_lock.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps(holder).encode())
    return fd


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_second_launch_on_a_live_output_dir_is_one_line_and_writes_nothing(assets, tmp_path, capsys):
    out = tmp_path / "out"
    copy_checkpoints(uninterrupted(assets, RUN), out, steps=(2,))
    (out / ckpt.STAGING_DIR / "checkpoint-4").mkdir(parents=True)  # the live run's save in progress
    fd = _hold(out, {"pid": 4242, "host": "node-a", "started": 0})
    try:
        argv = [*RUNS[RUN][1](assets), "--output_dir", str(out), "--resume_from_checkpoint", "auto"]
        assert sft.run(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"trl_emo.sft: error: output_dir: {out} is in use by another run (pid 4242 on host node-a, "
                       f"started {__import__('time').strftime('%Y-%m-%d %H:%M:%S', __import__('time').localtime(0))}; "
                       f"lock file {out / output_lock.LOCK_FILE}); wait for it to end, stop it, or choose another "
                       "output_dir."]
        assert (out / ckpt.STAGING_DIR / "checkpoint-4").is_dir()  # the live run's staging untouched
        assert sft.run([*argv, "--dry_run", "true"]) == 0  # a dry run writes nothing, takes no lock
    finally:
        os.close(fd)


def test_a_stale_lock_is_taken_over_with_a_warning_and_given_back_at_the_end(tmp_path, caplog):
    out = tmp_path / "out"
    out.mkdir()
    pid = _dead_pid()
    (out / output_lock.LOCK_FILE).write_text(json.dumps({"pid": pid, "host": output_lock._host(), "started": 0}))
    lock = output_lock.take(str(out))
    assert f"the lock of an earlier run (pid {pid} on host {output_lock._host()}" in caplog.text
    assert "taking it over" in caplog.text
    assert json.loads((out / output_lock.LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert (out / output_lock.LOCK_FILE).read_text() == ""  # given back: the next launch takes it silently


@pytest.mark.parametrize("holder, taken", [
    ("alive", False),  # this process: alive on this host
    ("dead", True),  # its pid gone
    ("reused", True),  # its pid now another process's (the start time differs)
    ("other host", False),  # cannot be checked from here
])
def test_without_flock_the_lock_file_alone_decides(tmp_path, monkeypatch, holder, taken):
    monkeypatch.setattr(output_lock, "_try_lock", lambda fd: None)  # a filesystem without flock
    out = tmp_path / "out"
    out.mkdir()
    me = {"pid": os.getpid(), "host": output_lock._host(), "started": 0, "proc_start": output_lock._proc_start(os.getpid())}
    written = {"alive": me, "dead": {**me, "pid": _dead_pid()}, "reused": {**me, "proc_start": 1},
               "other host": {**me, "host": "elsewhere"}}[holder]
    (out / output_lock.LOCK_FILE).write_text(json.dumps(written))
    if taken:
        output_lock.take(str(out)).release()
    else:
        with pytest.raises(output_lock.OutputDirLocked, match="another host" if holder == "other host" else "in use"):
            output_lock.take(str(out))


def test_the_manifest_checksums_blocks_with_xxh3_and_still_reads_its_crc32_format(tmp_path):
    # Two blocks and a tail: a file longer than BLOCK is checksummed per block, so a change in the second block is seen.
    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    size = manifest.BLOCK + 1000
    (folder / "weights.bin").write_bytes(os.urandom(size))
    (folder / "small.json").write_text("{}")
    written = manifest.write_manifest(str(folder), "run", 1)
    data = json.loads((folder / manifest.MANIFEST).read_text())
    assert data["checksum"] == "xxh3_64" and data["format"] == 2
    assert len(written.files["weights.bin"]["blocks"]) == 2 and manifest.manifest_problems(str(folder)) == []
    with open(folder / "weights.bin", "r+b") as handle:  # one byte of the second block, its size kept
        handle.seek(manifest.BLOCK + 10)
        byte = handle.read(1)
        handle.seek(manifest.BLOCK + 10)
        handle.write(bytes([byte[0] ^ 1]))
    assert manifest.manifest_problems(str(folder)) == ["weights.bin differs from its checksum in the manifest"]
    # A manifest of the first format (CRC-32 blocks under "crc32", written by the release before) is still verified.
    files = {rel: {"size": (folder / rel).stat().st_size,
                   "crc32": [f"{zlib.crc32((folder / rel).read_bytes()[o:o + manifest.BLOCK]):08x}"
                             for o in range(0, (folder / rel).stat().st_size, manifest.BLOCK)]}
             for rel in ("weights.bin", "small.json")}
    old = {"format": 1, "writer": "trl_emo", "run": "run", "step": 1, "saved_at": 0.0, "checksum": "crc32",
           "block_bytes": manifest.BLOCK, "files": files,
           "files_crc32": f"{zlib.crc32(json.dumps(files, sort_keys=True).encode()):08x}"}
    (folder / manifest.MANIFEST).write_text(json.dumps(old))
    assert manifest.read_manifest(str(folder)).checksum == "crc32" and manifest.manifest_problems(str(folder)) == []
    (folder / "small.json").write_text("[]")
    assert manifest.manifest_problems(str(folder)) == ["small.json differs from its checksum in the manifest"]
