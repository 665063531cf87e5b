"""trl_emo: EMO and GEM (and the papers' baselines) as drop-in losses for TRL's SFTTrainer.

```python
from trl_emo import SFTConfig, SFTTrainer   # instead of `from trl import ...`
args = SFTConfig(output_dir="out", loss_type="gem")   # or "emo", "tailr", "mixce", "ce_entropy"
```

Heavy imports (torch, TRL's trainer, transformers) happen on first use of a name below. The package is grouped
by role, in layers that import one way (docs/architecture.md): `commands` > `evaluation` | `training` > `data` |
`models` > `losses` > `core`; this top holds only the thin modules users run (`python -m trl_emo.sft`, `.dpo`,
`.grpo`, `.evaluate`, `.real_model`, the `trl-emo` script in `.cli`).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Imported on first use: `import trl_emo` (and every `python -m trl_emo.<command>`, `trl-emo --help`) costs no torch
# import until a loss, a config or a trainer is asked for.
_LAZY = {
    "get_loss": "trl_emo.losses",
    "list_losses": "trl_emo.losses",
    "register_loss": "trl_emo.losses",
    "unregister_loss": "trl_emo.losses",
    "SFTConfig": "trl_emo.training.config",
    "SFTTrainer": "trl_emo.training.trainer",
    "NonFiniteLossError": "trl_emo.training.trainer",
    "CostEmbedding": "trl_emo.losses",
}

__all__ = ["SFTConfig", "SFTTrainer", "NonFiniteLossError", "CostEmbedding", "get_loss", "list_losses",
           "register_loss", "unregister_loss", "__version__"]


def __getattr__(name):
    if name in _LAZY:
        from .core.noise import quiet_optional_packages

        # The notices of optional packages the run does not use, held back in the API as in the commands
        # (trl_emo.core.noise), before the import that would print them.
        quiet_optional_packages()
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trl_emo' has no attribute {name!r}")
