"""The commands users type, and what only they need: `sft`, `dpo`, `grpo`, `evaluate`, `demo` and the `trl-emo`
dispatcher (`main`); recipe parsing (`command_line`, `parser`), the packaged recipes (`recipes`), a run's final
configuration (`run_config`; `grpo_run` for GRPO), the Hub ids a training command loads (`preflight`) and dry runs
(`dry_run`). The top layer: it may import every other one, and nothing imports it but the thin entry modules at the
package top (`trl_emo.sft`...). See docs/architecture.md."""
