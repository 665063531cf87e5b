"""EMO's transport cost: `C(i, j) = 1 - cos(e_i, e_j)` from a fixed token embedding.

The embedding is kept in the dtype it came in (a bf16 head is copied as bf16: widening it to
float32 is exact, so nothing is lost) together with float32 inverse row norms; similarities are
computed in float32. This halves the resident memory of a bf16 model's snapshot (1 GiB instead of
2 GiB for Llama-3's 128,256 x 4,096 head) without changing a single cost value.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .precision import mm_float32

# Rows with a zero norm (never-trained padding tokens) would divide by zero; with this floor
# their cosine with everything is 0, i.e. they sit at cost 1 from every token.
_NORM_EPS = 1e-12

# Names under which a cost embedding can be stored in a single-file checkpoint.
_TENSOR_KEYS = ("cost_embedding", "embedding", "weight", "lm_head.weight")


# Rows per step when computing norms: a float32 copy of a whole bf16 head would be 2 GiB at
# Llama-3's size, and the live (`lm_head`) cost recomputes the norms at every step.
_NORM_ROWS = 16384


def _row_norms(weight: torch.Tensor) -> torch.Tensor:
    """L2 norm of every row, in float64 for float64 tables (gradcheck) and float32 otherwise."""
    dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
    if weight.shape[0] <= _NORM_ROWS:
        return weight.to(dtype).norm(dim=-1)
    return torch.cat([weight[i : i + _NORM_ROWS].to(dtype).norm(dim=-1) for i in range(0, weight.shape[0], _NORM_ROWS)])


class CostEmbedding:
    """A `[V, d']` token embedding and its cosine similarities, for EMO's transport cost."""

    def __init__(self, weight: torch.Tensor, source: str = "tensor"):
        if weight.dim() != 2:
            raise ValueError(f"An EMO cost embedding must be a 2-D [vocab, dim] tensor, got shape {tuple(weight.shape)} from {source}.")
        if not weight.is_floating_point():
            raise ValueError(f"An EMO cost embedding must hold floating-point values, got {weight.dtype} from {source}.")
        self.weight = weight.detach()
        self.source = source
        self.inv_norm = 1.0 / _row_norms(self.weight).clamp_min(_NORM_EPS)
        self._casts: dict[torch.dtype, torch.Tensor] = {}

    @property
    def vocab_size(self) -> int:
        return self.weight.shape[0]

    def to(self, device: torch.device | str) -> CostEmbedding:
        if self.weight.device == torch.device(device):
            return self
        moved = CostEmbedding.__new__(CostEmbedding)
        moved.weight = self.weight.to(device)
        moved.inv_norm = self.inv_norm.to(device)
        moved.source = self.source
        moved._casts = {}
        return moved

    def weight_as(self, dtype: torch.dtype) -> torch.Tensor:
        """The table in `dtype` for the GPU path's cost products; a cast is made once and kept."""
        if self.weight.dtype == dtype:
            return self.weight
        if dtype not in self._casts:
            self._casts[dtype] = self.weight.to(dtype)
        return self._casts[dtype]

    def normalized(self) -> torch.Tensor:
        """`Ê`, the row-normalized embedding in float32 (`[V, d']`)."""
        weight = self.weight.double() if self.weight.dtype == torch.float64 else self.weight.float()
        return weight * self.inv_norm[:, None]

    def similarity(self, targets: torch.Tensor) -> torch.Tensor:
        """`c[t, j] = cos(e_{targets[t]}, e_j)`, float32 `[n, V]`: one `[n, d'] x [d', V]` product."""
        # On CUDA a half-precision table is multiplied with float32 output, without a float32
        # copy of the whole table.
        sim = mm_float32(self.weight[targets], self.weight.t())
        sim.mul_(self.inv_norm[targets][:, None].to(sim.dtype)).mul_(self.inv_norm[None, :].to(sim.dtype))
        return sim

    def check_vocab(self, vocab_size: int) -> None:
        if self.vocab_size != vocab_size:
            raise ValueError(
                f"Vocabulary mismatch: the EMO cost embedding from {self.source} has {self.vocab_size} rows, but the "
                f"model's output embedding has {vocab_size}. The cost embedding must cover exactly the model's "
                "vocabulary: use a tensor/model with the same tokenizer, or resize the model's embeddings before "
                "taking the snapshot."
            )


def _load_tensor_file(path: Path) -> torch.Tensor:
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = load_file(str(path))
    elif suffix in (".pt", ".pth", ".bin"):
        loaded = torch.load(str(path), map_location="cpu", weights_only=True)
        tensors = loaded if isinstance(loaded, dict) else {"weight": loaded}
    elif suffix == ".npy":
        import numpy as np

        tensors = {"weight": torch.from_numpy(np.load(str(path)))}
    else:
        raise ValueError(
            f"Unsupported EMO cost embedding file {path}: use a .safetensors, .pt/.pth/.bin or .npy file holding a "
            "[vocab, dim] tensor, or a model folder."
        )
    if not isinstance(tensors, dict) or not tensors:
        raise ValueError(f"No tensor found in EMO cost embedding file {path}.")
    if len(tensors) == 1:
        return next(iter(tensors.values()))
    for key in _TENSOR_KEYS:
        if key in tensors:
            return tensors[key]
    raise ValueError(
        f"EMO cost embedding file {path} holds several tensors ({', '.join(sorted(tensors))}); store one tensor, or "
        f"name it one of {', '.join(_TENSOR_KEYS)}."
    )


def _load_model_head(path: str, trust_remote_code: bool = False) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=trust_remote_code)
    weight = model.get_output_embeddings().weight.detach().clone()
    del model
    return weight


def load_cost_embedding(spec: str, trust_remote_code: bool = False) -> CostEmbedding:
    """A cost embedding from a file (`[V, d']` tensor) or from another model (its output embedding).

    `spec` is a local path, or a Hub model id (`trl_emo.core.hub.locate` tells them apart).
    """
    from ..core.hub import locate

    kind, location = locate(spec)
    path = Path(location)
    if kind == "local" and path.is_file():
        return CostEmbedding(_load_tensor_file(path), source=str(path))
    if kind == "local" and path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"EMO cost embedding folder {path} has no config.json: it must be a model folder.")
        return CostEmbedding(_load_model_head(str(path), trust_remote_code), source=str(path))
    if kind != "hub":
        raise FileNotFoundError(f"EMO cost embedding not found: {spec}")
    from ..core.errors import HubSource
    from ..core.hub import hub_errors

    try:
        # Offline and not cached, unreachable, gated, not found: one line naming `emo_cost_embedding`.
        with hub_errors(HubSource("emo_cost_embedding", spec)):
            return CostEmbedding(_load_model_head(spec, trust_remote_code), source=spec)
    except OSError as exc:
        raise FileNotFoundError(
            f"EMO cost embedding {spec!r} is neither a local file/folder nor a loadable model id: {exc}"
        ) from exc
