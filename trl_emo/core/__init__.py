"""The bottom layer, which every other layer may import and which imports none of them: the errors several layers
raise (`errors`), where a name points and what the Hugging Face Hub says about it (`hub`), loading other packages'
plugins from entry points (`plugins`) and keeping optional packages quiet (`noise`). See docs/architecture.md."""
