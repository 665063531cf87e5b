"""Training with TRL: `SFTConfig` (`config`), `SFTTrainer` (`trainer`), the selected loss bound to its
hyper-parameters (`objective`), ASFT's reference model (`reference`), GEM's adaptive beta (`gem_schedule`), every use
of TRL's private parts (`trl_compat`), held-out statistics (`heldout`) and how a training command ends (`finish`).
Imports `data`, `models`, `losses` and `core`, never `evaluation` or `commands`. See docs/architecture.md."""
