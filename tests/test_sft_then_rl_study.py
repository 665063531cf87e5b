"""The SFT-then-RL study's machinery on synthetic inputs (the study itself trains a real model for hours): the job
queue its workers share, the zero-spread split of the logged rewards, the per-problem measures, the learning-rate
table, the verdicts and the report."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import sft_then_rl_study as study  # noqa: E402
from benchmarks.real_model import jobs as job_queue  # noqa: E402
from benchmarks.real_model.answer_reader import answer_reader_version  # noqa: E402
from benchmarks.real_model.logged_rewards import LOG_VARIABLE, gsm8k_answer, zero_spread_shares  # noqa: E402


# -- the job queue ----------------------------------------------------------------------------------------------------

WORKER = '''
import sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from benchmarks.real_model.jobs import Job, JobBoard, worker_main
folder = Path({folder!r})

def make(name, after=()):
    def run():
        for dependency in after:  # a job must start only after its dependencies finished
            assert (folder / "ran" / dependency).exists(), (name, dependency)
        time.sleep(0.05)
        with open(folder / "ran" / name, "x") as handle:  # "x": a second run of one job fails
            handle.write("ok")
    return Job(name, run, tuple(after))

jobs = [make("a"), make("b", ["a"]), make("c", ["a"]), make("d"), make("e", ["b", "c", "d"])]
sys.exit(worker_main(jobs, JobBoard(folder / "board"), print))
'''


def test_two_workers_run_every_job_once_and_after_its_dependencies(tmp_path):
    (tmp_path / "ran").mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(root=str(ROOT), folder=str(tmp_path)))
    jobs = [job_queue.Job(n, lambda: None, a) for n, a in
            [("a", ()), ("b", ("a",)), ("c", ("a",)), ("d", ()), ("e", ("b", "c", "d"))]]
    board = job_queue.JobBoard(tmp_path / "board")
    job_queue.run_workers(jobs, board, 2, [sys.executable, str(script)], log=lambda m: None)
    assert sorted(p.name for p in (tmp_path / "ran").iterdir()) == ["a", "b", "c", "d", "e"]
    assert not board.failures()


CRASHING_WORKER = '''
import os, sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from benchmarks.real_model.jobs import Job, JobBoard, worker_main

def crash():
    os._exit(9)  # killed: no failure mark written

jobs = [Job("a", crash), Job("b", lambda: None, ("a",))]
sys.exit(worker_main(jobs, JobBoard(Path({folder!r})), print))
'''


def test_a_worker_killed_mid_job_stops_the_study_instead_of_leaving_the_other_waiting(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(CRASHING_WORKER.format(root=str(ROOT), folder=str(tmp_path / "board")))
    jobs = [job_queue.Job("a", lambda: None), job_queue.Job("b", lambda: None, ("a",))]
    board = job_queue.JobBoard(tmp_path / "board")
    with pytest.raises(SystemExit, match=r"job worker-\d+ failed: the worker process exited with status 9"):
        job_queue.run_workers(jobs, board, 2, [sys.executable, str(script)], log=lambda m: None)


def test_one_invocation_at_a_time_owns_a_study(tmp_path):
    jobs = [job_queue.Job("a", lambda: None)]
    board = job_queue.JobBoard(tmp_path / "board")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = tmp_path / "board.lock"
        lock.write_text(str(sleeper.pid))  # a live owner
        with pytest.raises(SystemExit, match=f"another invocation \\(pid {sleeper.pid}\\) is running"):
            job_queue.run_workers(jobs, board, 1, [], log=lambda m: None)
        lock.write_text("999999999")  # a dead owner: its lock is stale
        board.reset()
        (board.folder / "claimed" / "a").write_text(str(sleeper.pid))  # ...but its worker still runs job a
        with pytest.raises(SystemExit, match=f"job a is still running in process {sleeper.pid}"):
            job_queue.run_workers(jobs, board, 1, [], log=lambda m: None)
    finally:
        sleeper.kill()
        sleeper.wait()
    job_queue.run_workers(jobs, board, 1, [], log=lambda m: None)  # the orphan gone: the relaunch runs
    assert board.done("a") and not (tmp_path / "board.lock").exists()


def test_a_failed_job_stops_the_queue_with_one_line_and_a_relaunch_resumes(tmp_path):
    ran = []
    state = {"fail": True}

    def step(name):
        def run():
            if name == "b" and state["fail"]:
                raise RuntimeError("disk full")
            ran.append(name)
        return run

    jobs = [job_queue.Job("a", step("a")), job_queue.Job("b", step("b"), ("a",)), job_queue.Job("c", step("c"), ("b",))]
    board = job_queue.JobBoard(tmp_path / "board")
    with pytest.raises(SystemExit) as exc:
        job_queue.run_workers(jobs, board, 1, [], log=lambda m: None)
    assert "job b failed: RuntimeError: disk full" in str(exc.value) and "\n" not in str(exc.value)
    assert ran == ["a"]  # c waits for b: never run
    state["fail"] = False
    job_queue.run_workers(jobs, board, 1, [], log=lambda m: None)  # the same command again: claims cleared, resumes
    assert ran == ["a", "a", "b", "c"]


def test_a_job_waiting_for_an_unknown_job_is_refused(tmp_path):
    board = job_queue.JobBoard(tmp_path / "board")
    board.reset()
    with pytest.raises(ValueError, match="unknown jobs"):
        job_queue.work([job_queue.Job("a", lambda: None, ("typo",))], board, log=lambda m: None)


# -- what GRPO needs: the zero-spread groups ---------------------------------------------------------------------------


def test_logged_rewards_split_the_zero_spread_groups_into_all_wrong_and_all_right(tmp_path, monkeypatch):
    log = tmp_path / "rewards.jsonl"
    monkeypatch.setenv(LOG_VARIABLE, str(log))
    prompts = ["p1"] * 2 + ["p2"] * 2 + ["p3"] * 2 + ["p4"] * 2
    completions = ["#### 4", "#### 4",  # all right
                   "#### 1", "#### 2",  # all wrong (two different wrong answers: no spread)
                   "#### 4", "#### 5",  # spread
                   "#### 4", "no answer"]  # spread
    rewards = gsm8k_answer(prompts=prompts, completions=completions, answer=["2 + 2 = 4\n#### 4"] * 8)
    assert rewards == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    gsm8k_answer(prompts=["p1"] * 2, completions=["#### 3", "#### 3"], answer=["#### 4"] * 2)
    steps = zero_spread_shares(log)
    assert steps[0] == {"groups": 4, "zero_spread": 0.5, "all_wrong": 0.25, "all_right": 0.25}
    assert steps[1] == {"groups": 1, "zero_spread": 1.0, "all_wrong": 1.0, "all_right": 0.0}
    monkeypatch.delenv(LOG_VARIABLE)
    gsm8k_answer(prompts=["p1"], completions=["#### 4"], answer=["#### 4"])  # unset: nothing written
    assert len(log.read_text().splitlines()) == 2


def test_unscored_completions_are_left_out_of_their_group(tmp_path):
    log = tmp_path / "rewards.jsonl"
    log.write_text(json.dumps({"prompts": ["p", "p", "q", "q"], "rewards": [1.0, None, None, None]}) + "\n")
    assert zero_spread_shares(log) == [{"groups": 1, "zero_spread": 1.0, "all_wrong": 0.0, "all_right": 1.0}]


def test_finished_stages_are_reused_only_while_what_they_were_built_on_is_unchanged(tmp_path):
    start, run = tmp_path / "sft", tmp_path / "rl"
    start.mkdir(), run.mkdir()
    (start / "study_run.json").write_text("{}")
    stamp = run / "study_run.json"
    stamp.write_text(json.dumps({"recipe": {"lr": 1}, "rl_prompts": "abc"}))
    assert study._still_valid(stamp, {"lr": 1}, "abc", start / "study_run.json")
    assert not study._still_valid(stamp, {"lr": 2}, "abc", start / "study_run.json")  # another recipe
    assert not study._still_valid(stamp, {"lr": 1}, "xyz", start / "study_run.json")  # other RL prompts
    os.utime(start / "study_run.json", (stamp.stat().st_mtime + 10,) * 2)  # the SFT model trained again since
    assert not study._still_valid(stamp, {"lr": 1}, "abc", start / "study_run.json")
    # An evaluation: the same settings, and not older than the model it measured.
    cache = tmp_path / "measures.json"
    cache.write_text("{}")
    settings = {"samples": 8, "greedy": True, "max_new_tokens": 64, "problems": 64}
    assert study._measures_valid({"settings": settings}, settings, cache, run)
    assert not study._measures_valid({"settings": {**settings, "samples": 4}}, settings, cache, run)
    assert study._measures_valid({"samples": 8, "problems": 64}, settings, cache, run)  # a first-version cache
    # Another answer reader does not make the completions stale: they are scored again, not generated again.
    assert study._measures_valid({"settings": {**settings, "reader": "older"}}, settings, cache, run)
    os.utime(stamp, (cache.stat().st_mtime + 10,) * 2)  # the model trained again into the same folder
    assert not study._measures_valid({"settings": settings}, settings, cache, run)


# -- the measures -----------------------------------------------------------------------------------------------------


def test_problem_measures_from_generations(tmp_path):
    rows = []
    # Problem 0: 2 of 4 samples right, greedy right; problem 1: none right, greedy wrong.
    for i, responses, greedy in [(0, ["#### 7", "#### 7", "#### 3", "x"], "#### 7"),
                                 (1, ["#### 1", "#### 1", "#### 2", "#### 5"], "#### 0")]:
        rows += [{"model": "m", "prompt_index": i, "sample": j, "response": r} for j, r in enumerate(responses)]
        rows.append({"model": "m", "prompt_index": i, "sample": "greedy", "response": greedy})
    rows.append({"model": "other", "prompt_index": 0, "sample": 0, "response": "#### 0"})
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = study.problem_measures(path, "m", ["#### 7", "#### 9"])
    assert m["samples"] == 4 and m["greedy_accuracy"] == 50.0
    assert m["pass"]["1"] == pytest.approx(100 * (0.5 + 0) / 2)
    assert m["pass"]["2"] == pytest.approx(100 * (1 - 1 / 6) / 2)  # 1 - C(2,2)/C(4,2) for problem 0
    assert m["pass"]["4"] == 50.0 and "8" not in m["pass"]
    assert m["per_problem"] == [0.5, 0.0] and m["greedy_per_problem"] == [1.0, 0.0]  # the paired tests' items
    assert m["distinct_answers"] == 2.5  # {7, 3} and {1, 2, 5}


def test_the_learning_rate_is_the_one_raising_validation_pass_at_1_most(tmp_path):
    args = study.parse_args(["--quick", "--rl_lr_candidates", "1e-6", "1e-5", "--output_dir", str(tmp_path)])
    out = tmp_path

    def measures(folder, per_problem):
        folder.mkdir(parents=True)
        (folder / "measures.json").write_text(json.dumps(
            {"pass": {"1": 100 * sum(per_problem) / len(per_problem)}, "per_problem": per_problem,
             "greedy_accuracy": 50.0, "settings": {"reader": answer_reader_version()}}))

    measures(study.eval_folder(out, "validation", "nll-s0-sft", 1.0), [0.0, 0.5, 0.5, 0.25])
    for lr, per_problem in ((1e-6, [0.25, 0.5, 0.5, 0.25]), (1e-5, [0.5, 0.75, 0.5, 0.5])):
        name = study.rl_name("nll", 0, 1.0, lr)
        measures(study.eval_folder(out, "validation", f"rl-{name}", 1.0), per_problem)
        run = out / "runs" / f"rl-{name}"
        run.mkdir(parents=True)
        (run / "log_history.json").write_text(json.dumps([{"reward": 0.2, "frac_reward_zero_std": 0.5},
                                                          {"reward": 0.4, "frac_reward_zero_std": 0.25}]))
    sweep = study.choose_learning_rate(args, out)
    assert sweep["chosen"] == 1e-5 and study.rl_learning_rate(args, out) == 1e-5
    rate = sweep["rates"]["1e-05"]
    assert rate["gain"] == pytest.approx(25.0) and rate["gain_error"] == pytest.approx(10.2062072616)
    assert rate["reward_first"] == 0.2 and rate["zero_spread"] == 0.375
    text = "\n".join(study.sweep_markdown(sweep))
    assert "| 1e-05 (chosen) | 56.2 | +25.0 ± 10.2 |" in text


# -- the verdicts and the report --------------------------------------------------------------------------------------


def _measures(pass1, pass8, greedy=None):
    m = {"pass": {str(k): pass1 + (pass8 - pass1) * (k - 1) / 7 for k in range(1, 9)}, "distinct_answers": 3.0}
    if greedy is not None:
        m["greedy_accuracy"] = greedy
    return m


def _run(arm, seed, before, after, temperature=1.0):
    """`before`/`after`: (greedy, pass@1, pass@8) at T = 1 (and the same at the RL temperature)."""
    def stage(greedy, pass1, pass8):
        out = {"T1": _measures(pass1, pass8, greedy), "heldout": {"entropy": 0.2}}
        if temperature != 1.0:
            out[study.temperature_key(temperature)] = _measures(pass1, pass8)
        return out

    return {"arm": arm, "seed": seed, "rl_temperature": temperature, "learning_rate": 1e-5, "sft_seconds": 1.0,
            "rl_seconds": 2.0, "sft_finished": "2026-11-27 08:00 UTC", "rl_finished": "2026-11-27 09:00 UTC",
            "sft": stage(*before), "rl": stage(*after),
            "rl_curves": {"reward": [0.1, 0.2, 0.3, 0.4, 0.5], "entropy": [0.5] * 5,
                          "frac_reward_zero_std": [0.5] * 5, "all_wrong": [0.25] * 5, "all_right": [0.25] * 5}}


def _results(runs):
    return {"environment": {"command": "test", "date": "today", "machine": "here"},
            "settings": {"test": 64}, "runs": runs, "total_seconds": 60.0, "sweep": None}


def _with_problems(run, stage, shares, greedy=None, where="T1", samples=8):
    """Give a run's stage per-problem figures (shares of right samples of `samples`, greedy verdicts)."""
    measures = run[stage][where]
    measures["per_problem"], measures["samples"] = list(shares), samples
    measures["pass"]["1"] = 100 * sum(shares) / len(shares)
    if greedy is not None:
        measures["greedy_per_problem"] = [float(g) for g in greedy]
        measures["greedy_accuracy"] = 100 * sum(greedy) / len(greedy)


def test_verdicts_are_paired_tests_over_problems_and_seeds_with_three_labels():
    # 64 problems, two seeds. CE: RL moves nothing. GEM: starts up to 4 samples of 8 lower on the even problems and
    # RL gives one more right sample on the odd ones: ends lower (told), gains more (told). SED: CE's problems
    # shuffled: cannot be told apart.
    base = [(i % 8) / 8 for i in range(64)]
    runs = []
    for seed in (0, 1):
        ce = _run("nll", seed, (30, 20, 50), (30, 20, 50))
        _with_problems(ce, "sft", base, [i % 3 == 0 for i in range(64)])
        _with_problems(ce, "rl", base, [i % 3 == 0 for i in range(64)])
        gem = _run("gem", seed, (30, 20, 50), (30, 20, 50))
        low = [max(0.0, p - 0.5) if i % 2 == 0 else p for i, p in enumerate(base)]
        _with_problems(gem, "sft", low, [i % 3 == 0 for i in range(64)])
        _with_problems(gem, "rl", [p + 0.125 * (i % 2) for i, p in enumerate(low)], [i % 3 == 0 for i in range(64)])
        sed = _run("sed", seed, (30, 20, 50), (30, 20, 50))
        shuffled = base[seed:] + base[:seed]
        _with_problems(sed, "sft", shuffled, [i % 3 == 0 for i in range(64)])
        _with_problems(sed, "rl", shuffled, [i % 3 == 1 for i in range(64)])
        runs += [ce, gem, sed]
    analysis = study.analyse(_results(runs))
    rows = {(r["config"], r["claim"], r["metric"]): r for r in analysis["comparisons"]}
    assert len(rows) == 8  # two objectives x (greedy, pass@1, pass@8 after RL; the pass@1 gain)
    gem_gain = rows["gem", "RL gains more", "rlT/pass@1"]
    assert gem_gain["label"] == "better" and gem_gain["effect"]["effect"] == pytest.approx(100 * 0.125 / 2)
    assert "64 items × 2 seeds, paired" in gem_gain["effect"]["method"]
    assert rows["gem", "ends higher", "rlT/pass@1"]["label"] == "worse"
    assert rows["sed", "ends higher", "rlT/pass@1"]["label"] == "cannot tell"
    # Greedy, kept per problem here, is paired over the problems too (no longer per seed only).
    assert "items" in rows["sed", "ends higher", "greedy"]["effect"]["method"]
    assert all(r["holm_p"] >= r["effect"]["p"] for r in rows.values())
    assert {r["config"] for r in analysis["rl_gains"]} == {"nll", "gem", "sed"}
    assert any(size["config"] == "sed" for size in analysis["sample_sizes"])  # what telling it would take
    assert analysis["table"]["gem"]["metrics"]["greedy"]["rl"]["n"] == 2


def test_without_per_problem_figures_a_verdict_is_over_the_seeds_and_one_seed_tells_nothing():
    runs = [_run("nll", s, (30, 20, 50), (32 + s, 30, 60)) for s in (0, 1)]
    runs += [_run("gem", s, (20, 10, 50), (30 + 3 * s, 32 + s, 62)) for s in (0, 1)]
    runs += [_run("sed", 0, (30, 20, 50), (33, 31, 61))]
    runs += [_run("nll", 0, (30, 20, 50), (30, 15, 40), 0.7), _run("gem", 0, (20, 10, 50), (40, 45, 80), 0.7)]
    analysis = study.analyse(_results(runs))
    rows = {(r["config"], r["claim"], r["metric"]): r for r in analysis["comparisons"]}
    gain = rows["gem", "RL gains more", "rlT/pass@1"]["effect"]
    assert gain["method"] == "t over 2 paired seeds" and gain["effect"] == pytest.approx(12.5)
    # One seed (sed, gem@T0.7): a difference, no interval, "cannot tell" however large.
    assert rows["gem@T0.7", "ends higher", "rlT/pass@1"]["label"] == "cannot tell"
    assert rows["gem@T0.7", "ends higher", "rlT/pass@1"]["compared_with"] == "nll@T0.7"
    assert rows["sed", "ends higher", "greedy"]["effect"]["low"] is None
    assert not analysis["sample_sizes"]  # no per-problem figures: no variance components


def test_the_report_has_every_run_its_pass_at_k_and_the_verdicts(tmp_path):
    runs = [_run("nll", 0, (30, 20, 50), (31, 25, 55)), _run("gem", 0, (30, 15, 55), (29, 20, 60)),
            _run("gem", 0, (30, 15, 55), (35, 30, 70), 0.7), _run("nll", 0, (30, 20, 50), (31, 25, 55), 0.7)]
    results = _results(runs)
    results["analysis"] = study.analyse(results)
    text = study.report_markdown(results)
    assert "| gem | ends higher | pass@1 at the RL T |" in text and "| gem@T0.7 | RL gains more |" in text
    assert "8 comparisons in this table" in text and "RL gain per configuration" in text
    for run in ("nll-s0", "gem-s0", "gem@T0.7-s0"):
        assert f"| {run} | 2026-11-27 08:00 UTC | 2026-11-27 09:00 UTC |" in text
    assert "| gem@T0.7-s0 | 0.7 | rl |" in text and "k=8" in text
    assert "0.50 (0.25 / 0.25)" in text  # the zero-spread share, split
    study.write_outputs(results, tmp_path, report=True)
    assert (tmp_path / "sft_then_rl_study.png").stat().st_size > 10_000
    # The written report's template names figures of the full study (sed, GEM at 0.7...): not rendered from these.
    assert not (tmp_path / "sft_then_rl_study.md").exists()


def test_quick_and_default_sizes():
    quick = study.parse_args(["--quick"])
    assert quick.arms == study.QUICK_ARMS and quick.seeds == [0] and quick.workers == 1
    assert quick.cooled_arms == ["nll", "gem"] and quick.rl_lr_candidates == study.QUICK_LR_CANDIDATES
    default = study.parse_args([])
    assert default.arms == study.DEFAULT_ARMS and "eksft_authors" in default.arms and default.seeds == [0, 1]
    # The floor: at least 384 completions over at least 96 distinct prompts per RL run.
    assert default.rl_steps * default.rl_prompts_per_step * default.rl_generations >= 384
    assert default.rl_steps * default.rl_prompts_per_step >= 96 and default.rl_prompts >= 96
    assert [r for r in study.rl_runs(default) if r[2] != 1.0] == [("nll", 0, 0.7), ("gem", 0, 0.7), ("nll", 1, 0.7),
                                                                 ("gem", 1, 0.7)]
    assert study.parse_args(["--finished_only"]).finished_only
    with pytest.raises(SystemExit):
        study.parse_args(["--arms", "gem"])  # no CE to compare with
    # The 2026 objectives are arms of the script: an arm list away, once trl_emo registers their losses.
    assert {"psft", "curio_sft"} <= set(study.ARMS)
    registered = {arm for arm in ("psft", "curio_sft") if study._registered(study.ARMS[arm]["loss_type"])}
    for arm in {"psft", "curio_sft"} - registered:
        with pytest.raises(SystemExit):
            study.parse_args(["--arms", "nll", arm])


def test_the_jobs_run_the_sweep_first_then_seed_by_seed(tmp_path):
    args = study.parse_args(["--output_dir", str(tmp_path)])
    jobs = study.study_jobs(args, "model", tmp_path / "data", tmp_path, [], None)
    names = [job.name for job in jobs]
    assert names[0] == "sft-nll-s0" and names.index("choose-lr") < names.index("sft-gem-s0")
    assert names.index("eval-rl-gem-s0-T0.7-T0.7") < names.index("sft-nll-s1")
    assert len(names) == len(set(names))
    by_name = {job.name: job for job in jobs}
    assert by_name["rl-gem-s1-T0.7"].after == ("sft-gem-s1", "choose-lr")
    # Every SFT model is measured once per temperature, whatever the number of runs starting from it.
    assert names.count("eval-gem-s0-sft-T1") == 1 and "eval-sed-s0-sft-T0.7" not in names
    fixed = study.study_jobs(study.parse_args(["--rl_learning_rate", "5e-6"]), "m", tmp_path, tmp_path, [], None)
    assert not any(job.name.startswith(("sweep", "choose")) for job in fixed)


# -- the answer reader, new arms and progress ------------------------------------------------------------------------


def test_a_changed_answer_reader_rescores_the_saved_completions_without_generating(tmp_path, monkeypatch):
    out, data = tmp_path, tmp_path / "data"
    data.mkdir()
    (data / "test.jsonl").write_text("".join(json.dumps({"question": q, "answer": a}) + "\n"
                                             for q, a in (("q0", "#### 7"), ("q1", "#### 9"))))
    folder = study.eval_folder(out, "test", "m", 1.0)
    (folder / "generations").mkdir(parents=True)
    rows = [{"model": "m", "prompt_index": 0, "sample": j, "response": r} for j, r in enumerate(["#### 7", "#### 3"])]
    rows += [{"model": "m", "prompt_index": 1, "sample": j, "response": r} for j, r in enumerate(["#### 9", "#### 9"])]
    (folder / "generations" / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = {"samples": 2, "greedy": False, "max_new_tokens": 64, "problems": 2}
    # Measures cached by another reader, which read every answer as wrong.
    stale = {"per_problem": [0.0, 0.0], "pass": {"1": 0.0}, "samples": 2, "finished": "then",
             "settings": {**settings, "reader": "an-older-reader"}}
    (folder / "measures.json").write_text(json.dumps(stale))

    def no_generation(*args, **kwargs):
        raise AssertionError("generated again")
    monkeypatch.setattr(study.rms, "evaluate_math", no_generation)
    args = argparse.Namespace(samples=2, math_max_new_tokens=64, test=2)
    measures = study.evaluate_model("m", tmp_path / "model", "test", 1.0, data, out, args, greedy=False)
    assert measures["per_problem"] == [0.5, 1.0] and measures["pass"]["1"] == 75.0  # read again, by this reader
    assert measures["settings"]["reader"] == answer_reader_version() and measures["finished"] == "then"
    assert json.loads((folder / "measures.json").read_text())["rescored"]  # the cache now holds the new reading
    # Read by this reader: reused as it is, nothing scored again.
    monkeypatch.setattr(study, "problem_measures", no_generation)
    assert study.cached_measures(out, "test", "m", 1.0)["per_problem"] == [0.5, 1.0]
    # The reader's version follows its rules' source: another source, another version.
    assert len(answer_reader_version()) == 16


def test_new_arms_reuse_the_runs_a_results_file_holds_and_train_only_theirs(tmp_path):
    runs = [_run("nll", s, (30, 20, 50), (31, 25, 55)) for s in (0, 1)]
    runs += [_run("gem", s, (30, 15, 55), (29, 20, 60)) for s in (0, 1)]
    args = study.parse_args(["--arms", "nll", "gem", "sed", "--cooled_arms", "--output_dir", str(tmp_path)])
    old = {"settings": {name: getattr(args, name) for name in study.DEFAULTS} | {
        "grpo_fields": study.GRPO_FIELDS, "cooled_temperature": study.COOLED_TEMPERATURE, "rl_learning_rate": 2e-6,
        "sft_fields": {"nll": study.ARMS["nll"], "gem": study.ARMS["gem"]}},
        "runs": runs, "environment": {"command": "earlier"}, "sweep": {"chosen": 2e-6}}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    args = study.parse_args(["--arms", "nll", "gem", "sed", "--cooled_arms", "--reuse_results", str(path),
                             "--output_dir", str(tmp_path)])
    assert study.load_reused(args) == old and args.rl_learning_rate == 2e-6  # the sweep is not run again
    assert study.pending_runs(args) == [("sed", 0, 1.0), ("sed", 1, 1.0)]
    names = [job.name for job in study.study_jobs(args, "model", tmp_path / "data", tmp_path, [], None)]
    assert not any(name.startswith(("sweep", "choose", "sft-nll", "sft-gem", "rl-nll", "rl-gem")) for name in names)
    assert "sft-sed-s0" in names and "rl-sed-s1-T1" in names
    # Another recipe than the file's: one line naming what differs.
    old["settings"]["rl_steps"] = 7
    path.write_text(json.dumps(old))
    with pytest.raises(SystemExit, match="rl_steps 7 there, 24 here"):
        study.load_reused(study.parse_args(["--reuse_results", str(path), "--output_dir", str(tmp_path)]))


def test_the_jobs_report_i_of_n_with_elapsed_and_remaining_time(tmp_path):
    from benchmarks.progress import Progress, duration, estimate

    board = job_queue.JobBoard(tmp_path / "board")
    board.reset(workers=2)
    for name, seconds in (("a", 0.01), ("b", 600.0), ("c", 1200.0)):
        board.finish(name, seconds)
    line = board.progress(7)
    # 3 of 7 done; the cached one (under a second) does not count: 900 s a job, 4 left, two workers: 30 min.
    assert line.startswith("job 3 of 7 done; ") and line.endswith("about 30 min left")
    assert estimate([0.2], 1, 5, 3.0) == "job 1 of 5 done; 3 s elapsed"  # no job that worked yet: no estimate
    assert duration(7200) == "2.0 h" and duration(600) == "10 min"
    progress = Progress(2)
    assert progress.step("first").startswith("first done in 0 s: job 1 of 2 done")


def test_a_claim_on_a_figure_the_runs_did_not_measure_is_left_out():
    # --quick samples 2 per problem: pass@8 has no figure, so its claims are not made (they were a ValueError).
    runs = [_run("nll", s, (30, 20, 50), (31, 25, 55)) for s in (0, 1)]
    runs += [_run("psft", s, (30, 15, 55), (29, 20, 60)) for s in (0, 1)]
    for run in runs:
        for stage in ("sft", "rl"):
            shares = [(i % 3) / 2 for i in range(8)]
            _with_problems(run, stage, shares, [i % 2 == 0 for i in range(8)], samples=2)
            run[stage]["T1"]["pass"] = {k: v for k, v in run[stage]["T1"]["pass"].items() if int(k) <= 2}
    analysis = study.analyse(_results(runs))
    assert [(r["claim"], r["metric"]) for r in analysis["comparisons"]] == [
        ("ends higher", "greedy"), ("ends higher", "rlT/pass@1"), ("RL gains more", "rlT/pass@1")]
