"""Run one training command under `accelerate launch`, a fault injected in one rank (test_faults).

    accelerate launch ... run_command.py '{"command": "sft", "argv": [...], "fault": ["kill", 3], "rank": 1}'

The run is `trl_emo.commands.<command>.run(argv)`; with a `fault`, it is installed (`fault_injection.Fault`) in the
process of that `rank` only, and with `"first_attempt": true` only in torch elastic's first attempt
(`TORCHELASTIC_RESTART_COUNT` 0): the restarted group runs without it. `"argv_by_node"`: the arguments added on each
node (its own `--output_dir`), by torch elastic's `GROUP_RANK`.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: fault_injection
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(run):
    import importlib

    from fault_injection import Fault, _install

    first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if run.get("fault") and run.get("rank", 0) == int(os.environ.get("RANK", "0")) and (first or not run.get("first_attempt")):
        _install(Fault(*run["fault"]))
    argv = [*run["argv"], *run.get("argv_by_node", {}).get(os.environ.get("GROUP_RANK", "0"), [])]
    module = importlib.import_module(f"trl_emo.commands.{run['command']}")
    raise SystemExit(module.run(argv))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
