"""SED's threshold `τ`, calibrated on the starting model before the first step, as the authors' `train.py` does.

The authors' script never sets `cumsum_threshold`; their trainer then computes it (`compute_cumsum_threshold`) on the
model as loaded, before training: over every position of the first 100 rows of their held-out file, the mass of the
top-10 probabilities, and `τ` is the value that 70 % of the positions reach or exceed (`cumsum_ratio: 0.7`). The loss
then compares `τ` with the top-2 mass (`top_k: 2`). Here: the first `sed_threshold_samples` examples of
the evaluation dataset (the training dataset when there is none), each run as its own sequence, as the loss sees it (a
packed row is split into its examples), `sed_threshold_top_k`, `sed_threshold_ratio`, the model in eval mode, without
gradient and with autocast off (the probe of `trl_compat.add_objective_head`; the head's product in float32), every
process on the same examples (under ZeRO-3 and FSDP each forward needs them all), the value of the main process
broadcast so that every process masks alike. The value is logged (`sed_threshold`) and saved with each checkpoint
(`trl_emo_sed_threshold.json`): a resumed run keeps it instead of calibrating on trained weights (and warns when the
checkpoint has none).
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


def calibration_sequences(dataset, count: int) -> list[list[int]]:
    """The token ids of the first `count` examples of a prepared (tokenized) dataset, or of the first of several
    evaluation datasets, one list per example.

    With `packing`, TRL's rows hold several examples and say where each ends (`seq_lengths`, TRL 1.16's best-fit
    packing), and the trainer trains on each as its own sequence (padding-free: positions restart, attention stays
    within the example). Each example is cut out and run alone here: the same forward as without packing, on every
    model and attention implementation, where passing per-example `position_ids` would rely on the attention deriving a
    block-diagonal mask from them. A row without `seq_lengths` (no packing, or the "wrapped" strategy, which trains
    across example boundaries) is one sequence; a row with `position_ids` that restart is split where they do."""
    if isinstance(dataset, dict):
        dataset = next(iter(dataset.values()))
    sequences: list[list[int]] = []
    for row in dataset:
        if len(sequences) >= count:
            break
        ids = list(row.get("input_ids") or [])
        if not ids:
            continue
        start = 0
        for length in _example_lengths(row, len(ids)):
            if len(sequences) >= count:
                break
            if length > 0:
                sequences.append(ids[start : start + length])
            start += length
    if not sequences:
        raise ValueError("SED's threshold calibration found no tokenized row (input_ids) in the dataset.")
    return sequences


def _example_lengths(row: dict, n_tokens: int) -> list[int]:
    lengths = row.get("seq_lengths")
    if lengths is not None and len(lengths) > 0:
        lengths = [int(n) for n in lengths]
        if sum(lengths) != n_tokens:
            raise ValueError(
                f"SED's threshold calibration: a packed row's seq_lengths sum to {sum(lengths)} but it has {n_tokens} "
                "tokens."
            )
        return lengths
    positions = row.get("position_ids")
    if positions is not None and len(positions) == n_tokens:
        starts = [i for i, position in enumerate(positions) if i == 0 or int(position) == 0]
        return [end - start for start, end in zip(starts, starts[1:] + [n_tokens])]
    return [n_tokens]


@torch.no_grad()
def calibrate(model, base_model, sequences: list[list[int]], top_k: int, ratio: float, device) -> float:
    """`τ` from `sequences` (token ids, one example each) through `model` (the wrapped model: its forward reaches the
    patched one of `base_model`, whose probe runs with autocast off and the head's product in float32)."""
    weight = base_model.get_output_embeddings().weight
    vocab = (getattr(weight, "ds_shape", None) or weight.shape)[0]  # ZeRO-3 leaves an empty shard in `weight`
    if top_k > vocab:
        raise ValueError(f"sed_threshold_top_k={top_k} is larger than the model's vocabulary ({vocab} tokens).")
    probe = functools.partial(_probe, top_k=top_k)
    was_training = base_model.training
    base_model.eval()
    try:
        masses = [model(input_ids=torch.tensor([ids], device=device), trl_emo_probe=probe) for ids in sequences]
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
