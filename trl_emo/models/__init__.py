"""Where models come from: loading a model or a LoRA adapter (`sources`), the Hub ids behind a model or dataset name
(`hub_ids`), the tiny offline models and tokenizers of the demo and the tests (`tiny`), the one real pretrained model
a machine without the Hub can have (`real_model`), and generation that stops at the end of a chat turn
(`generation_eos`). Imports `trl_emo.core` and `trl_emo.losses` only. See docs/architecture.md."""
