"""`python -m trl_emo.samples NAME`: prints the path of a sample shipped with trl_emo (alpaca, ultrafeedback, gsm8k),
for `--dataset_name "$(python -m trl_emo.samples gsm8k)"`. The code lives in `trl_emo.data.bundled`."""

from .data.bundled import main

if __name__ == "__main__":
    raise SystemExit(main())
