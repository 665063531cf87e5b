"""SED's threshold `τ`, calibrated on the starting model before the first step, as the authors' `train.py` does.

The authors' script never sets `cumsum_threshold`; their trainer then computes it (`compute_cumsum_threshold`) on the
model as loaded, before training: over every position of the first 100 rows of their held-out file, the mass of the
top-10 probabilities, and `τ` is the value that 70 % of the positions reach or exceed (`cumsum_ratio: 0.7`). The loss
then compares `τ` with the top-2 mass (`top_k: 2`). Here: the first `sed_threshold_samples` rows of the evaluation
dataset (the training dataset when there is none), `sed_threshold_top_k`, `sed_threshold_ratio`, the model in eval
mode and without gradient, every process on the same rows (under ZeRO-3 and FSDP each forward needs them all), the
value of the main process broadcast so that every process masks alike. The value is logged (`sed_threshold`) and saved
with each checkpoint (`trl_emo_sed_threshold.json`): a resumed run keeps it instead of calibrating on trained weights.
"""

from __future__ import annotations

import functools
import json
import logging
import os

import torch

from ..losses.sed import threshold_from_masses, top_k_mass

logger = logging.getLogger(__name__)

STATE_FILE = "trl_emo_sed_threshold.json"


def calibration_rows(dataset, count: int) -> list[dict]:
    """The first `count` rows of a prepared (tokenized) dataset, or of the first of several evaluation datasets."""
    if isinstance(dataset, dict):
        dataset = next(iter(dataset.values()))
    rows = []
    for row in dataset:
        if len(rows) >= count:
            break
        if row.get("input_ids"):
            rows.append(row)
    if not rows:
        raise ValueError("SED's threshold calibration found no tokenized row (input_ids) in the dataset.")
    return rows


@torch.no_grad()
def calibrate(model, base_model, rows: list[dict], top_k: int, ratio: float, device) -> float:
    """`τ` from `rows` through `model` (the wrapped model: its forward reaches the patched one of `base_model`)."""
    weight = base_model.get_output_embeddings().weight
    vocab = (getattr(weight, "ds_shape", None) or weight.shape)[0]  # ZeRO-3 leaves an empty shard in `weight`
    if top_k > vocab:
        raise ValueError(f"sed_threshold_top_k={top_k} is larger than the model's vocabulary ({vocab} tokens).")
    probe = functools.partial(_probe, top_k=top_k)
    was_training = base_model.training
    base_model.eval()
    try:
        masses = []
        for row in rows:
            kwargs = {"input_ids": torch.tensor([row["input_ids"]], device=device)}
            if row.get("position_ids") is not None:
                kwargs["position_ids"] = torch.tensor([row["position_ids"]], device=device)
            masses.append(model(**kwargs, trl_emo_probe=probe))
    finally:
        base_model.train(was_training)
    return threshold_from_masses(torch.cat(masses), ratio)


def _probe(hidden, weight, bias, transform, top_k: int):
    return top_k_mass(hidden, weight, bias, transform, top_k)


def save(folder: str, threshold: float) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, STATE_FILE), "w", encoding="utf-8") as handle:
        json.dump({"sed_threshold": repr(float(threshold))}, handle)


def load(folder: str) -> float | None:
    """The threshold saved with a checkpoint, or None when the checkpoint has none."""
    path = os.path.join(folder, STATE_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return float(json.load(handle)["sed_threshold"])
