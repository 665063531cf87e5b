"""MAUVE between human and model texts: our featurizer (any `AutoModel`), the `mauve-text` package's score.

`mauve.compute_mauve` can featurize texts itself, but only with GPT-2 or BERT models named by a Hub
id, and it featurizes the human texts again for every comparison. Here each text is featurized once
with any `AutoModel` (the feature is the last layer's hidden state at the text's last token, MAUVE's
own definition), the features are kept on disk (`mauve/_features/*.npy`, named by a hash of the
featurizer and the texts), and `compute_mauve(p_features=..., q_features=...)` does the quantization
and the divergence curve.
"""

from __future__ import annotations

import hashlib
import json
import os

from .cache import file_signature
from .config import EvalConfig
from .errors import EvaluationError
from .loading import not_loadable, resolve_device

DEFAULT_FEATURIZER = "gpt2-large"
# MAUVE's default truncation; the paper's texts (prefix + continuation) are far shorter.
MAX_TEXT_LENGTH = 1024
MAUVE_MISSING = "MAUVE needs the `mauve-text` package: `pip install 'trl-emo[mauve]'` (or set `mauve: false`)."


def import_mauve():
    try:
        import mauve
    except ImportError as exc:
        raise EvaluationError(MAUVE_MISSING) from exc
    return mauve


def check_featurizer(name: str, trust_remote_code: bool = False) -> None:
    """Fail early when the featurizer cannot be loaded (offline and not cached): its config is enough to know."""
    from transformers import AutoConfig

    path = os.path.expanduser(name)
    try:
        AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        if os.path.isdir(path):
            raise EvaluationError(f"MAUVE featurizer {name!r}: {exc}") from exc
        raise not_loadable("MAUVE featurizer", name, exc) from exc


class Featurizer:
    """Texts -> [n, d] float32 features, computed once per text set and stored under `folder`."""

    def __init__(self, name: str | None, config: EvalConfig, folder: str):
        self.name = name or DEFAULT_FEATURIZER
        self.config = config
        self.folder = folder
        self.signature = {"featurizer": file_signature(os.path.expanduser(self.name)), "max_length": MAX_TEXT_LENGTH}
        self._model = None

    def _load(self):
        from transformers import AutoModel, AutoTokenizer

        path = os.path.expanduser(self.name)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=self.config.trust_remote_code)
            model = AutoModel.from_pretrained(path, trust_remote_code=self.config.trust_remote_code)
        except OSError as exc:
            if os.path.isdir(path):
                raise
            raise not_loadable("MAUVE featurizer", self.name, exc) from exc
        self.device = resolve_device(self.config.device)
        self._model = model.float().to(self.device).eval()
        self._tokenizer = tokenizer

    def path(self, texts: list[str]) -> str:
        digest = hashlib.sha256(json.dumps([self.signature, texts], default=str).encode()).hexdigest()[:20]
        return os.path.join(self.folder, f"{digest}.npy")

    def __call__(self, texts: list[str], desc: str = "featurize"):
        import numpy as np

        path = self.path(texts)
        if os.path.exists(path):
            return np.load(path)
        features = self._featurize(texts, desc)
        os.makedirs(self.folder, exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}.npy"
        np.save(tmp, features)
        os.replace(tmp, path)  # a kill never leaves a half-written feature file
        return features

    def _featurize(self, texts: list[str], desc: str):
        import numpy as np
        import torch
        from tqdm.auto import tqdm

        if self._model is None:
            self._load()
        encoded = [
            self._tokenizer(text, truncation=True, max_length=MAX_TEXT_LENGTH)["input_ids"] or [0] for text in texts
        ]
        batch_size = self.config.scoring_batch_size
        order = sorted(range(len(texts)), key=lambda i: -len(encoded[i]))
        features = [None] * len(texts)
        starts = range(0, len(order), batch_size)
        with torch.no_grad():
            for start in tqdm(starts, desc=desc, unit="batch", disable=not self.config.progress):
                chunk = order[start : start + batch_size]
                width = max(len(encoded[i]) for i in chunk)
                ids = torch.zeros((len(chunk), width), dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, i in enumerate(chunk):
                    ids[row, : len(encoded[i])] = torch.tensor(encoded[i])
                    mask[row, : len(encoded[i])] = 1
                hidden = self._model(
                    input_ids=ids.to(self.device), attention_mask=mask.to(self.device), output_hidden_states=True
                ).hidden_states[-1]
                for row, i in enumerate(chunk):
                    features[i] = hidden[row, len(encoded[i]) - 1].float().cpu().numpy()
        return np.stack(features).astype(np.float32)

    def close(self) -> None:
        self._model = None


def mauve_score(human_features, model_features) -> dict:
    """MAUVE (×100, as the paper reports it) and the frontier integral of two feature sets (MAUVE's defaults)."""
    mauve = import_mauve()
    out = mauve.compute_mauve(p_features=human_features, q_features=model_features, verbose=False)
    return {"mauve": 100.0 * float(out.mauve), "frontier_integral": float(out.frontier_integral),
            "num_buckets": int(out.num_buckets)}
