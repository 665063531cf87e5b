"""Plain-text corpora for language modelling (EMO paper, Section 4): rows -> documents, every token trained.

The corpora of the paper's Section 4 (WikiText-2/103, WebText, PTB, WritingPrompts, AG News) are
plain text, one row per line (WikiText: a line of an article, headings included), per sentence (PTB)
or per document (AG News, WebText). `plain_text` data is turned into one `{"text": document}` row
per document here, and TRL does the rest in its language-modelling format: it appends EOS to each
document, tokenizes, and with `packing: true, packing_strategy: wrapped` concatenates the documents
and cuts them into blocks of `max_length` tokens with every token a target (the paper's
`group_texts`, block size 256). No grouper is written here.

Why `wrapped`: TRL's default `bfd` packs whole documents and truncates each one at `max_length`
(most of a WikiText article would be lost); `bfd_split` keeps every token but relies on
padding-free attention; `wrapped` is the paper's concatenate-and-cut.

`CORPORA` also holds each corpus's open-ended generation setting (Table 4: prefix and generation
lengths), read by the `continuation` evaluation task, so training and evaluation agree on the text
column and on what a document is.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .info import DatasetInfo
from .schemas import DataError

logger = logging.getLogger(__name__)

# How rows become documents.
DOCUMENT_RULES = ("auto", "rows", "wikitext")
# A WikiText level-1 heading (" = Title = "), which starts an article; " = = Section = = " does not.
_WIKITEXT_TITLE = re.compile(r"^ ?= [^=].*[^=] = ?\n?$")
# Any WikiText heading line (" = Title = ", " = = Section = = ", ...).
_WIKITEXT_HEADING = re.compile(r"^ ?(= )+.*( =)+ ?\n?$")


@dataclass(frozen=True)
class Corpus:
    """A corpus of the paper's Section 4: where it lives, how it is read, and its Table 4 setting.

    Attributes:
        name: the name used in recipes and `continuation_corpus`.
        hub_ids: Hub ids it is published under (compared without case; the first is the one to use).
        config: its Hub configuration, when the Hub id holds several corpora (WikiText).
        text_column: the column holding the text.
        documents: "wikitext" (rows are lines, a ` = Title = ` line starts an article) or "rows".
        prefix_words: words of the held-out text given as the prefix (Table 4).
        generation_length: tokens generated, and words of the human continuation (Table 4).
        eval_split: the held-out split the prefixes come from.
        names: substrings of a local path that identify the corpus.
    """

    name: str
    hub_ids: tuple[str, ...]
    config: str | None
    text_column: str
    documents: str
    prefix_words: int
    generation_length: int
    eval_split: str = "test"
    names: tuple[str, ...] = ()

    def summary(self) -> str:
        where = (self.hub_ids[0] + (f" ({self.config})" if self.config else "")) if self.hub_ids else "local files"
        return (
            f"{self.name}: {where}, column `{self.text_column}`, prefix {self.prefix_words} words, "
            f"{self.generation_length} generated tokens"
        )


# Table 4 of the EMO paper (prefix / generation lengths); WebText and WritingPrompts are the splits of
# Zhang et al. (2023), not on the Hub: use local files with a `text` column.
CORPORA: dict[str, Corpus] = {
    corpus.name: corpus
    for corpus in (
        Corpus("wikitext-2", ("Salesforce/wikitext", "wikitext"), "wikitext-2-raw-v1", "text", "wikitext", 20, 80,
               names=("wikitext-2", "wikitext2", "wiki2")),
        Corpus("wikitext-103", ("Salesforce/wikitext", "wikitext"), "wikitext-103-raw-v1", "text", "wikitext", 20, 80,
               names=("wikitext-103", "wikitext103", "wiki103")),
        Corpus("webtext", (), None, "text", "rows", 20, 80, names=("webtext",)),
        Corpus("ptb", ("ptb-text-only/ptb_text_only", "ptb_text_only"), "penn_treebank", "sentence", "rows", 5, 25,
               names=("ptb", "penn")),
        Corpus("writingprompts", (), None, "text", "rows", 35, 80, names=("writingprompts", "writing_prompts")),
        Corpus("ag_news", ("fancyzhx/ag_news", "ag_news"), None, "text", "rows", 10, 30, names=("ag_news", "agnews")),
    )
}
CORPUS_NAMES = ("auto", *CORPORA)


def find_corpus(dataset_name: str | None, config: str | None = None, corpus: str | None = "auto") -> Corpus | None:
    """The corpus named by `corpus`, or (for "auto"/None) the one `dataset_name` (+ `config`) refers to, if any.

    A Hub id matches exactly (WikiText by its configuration); a local path matches when its last
    two components contain one of the corpus's names (`data/wikitext-103-raw-v1/`, `ptb.train.jsonl`).
    """
    if corpus not in (None, "auto"):
        if corpus not in CORPORA:
            raise DataError(f"Unknown corpus {corpus!r}; known: {', '.join(CORPORA)}.")
        return CORPORA[corpus]
    if not dataset_name:
        return None
    lowered = dataset_name.lower()
    for candidate in CORPORA.values():
        if lowered in (h.lower() for h in candidate.hub_ids) and candidate.config in (None, config):
            return candidate
    tail = "/".join(os.path.normpath(os.path.expanduser(dataset_name)).split(os.sep)[-2:]).lower()
    tail = f"{tail} {(config or '').lower()}"
    # Longest names first, so "wikitext-103" is not taken for "wikitext-2"... nor the reverse.
    matches = [(len(n), c) for c in CORPORA.values() for n in c.names if n in tail]
    return max(matches, key=lambda m: m[0])[1] if matches else None


def is_wikitext_heading(line: str) -> bool:
    return bool(_WIKITEXT_HEADING.match(line))


def documents_from_rows(rows: Iterable[str | None], rule: str) -> list[str]:
    """Documents from the rows of a corpus: each non-blank row (`rows`), or WikiText articles (`wikitext`).

    WikiText rows are the lines of the articles, each ending with "\\n" (blank lines are empty
    rows); an article starts at its ` = Title = ` line and its lines are joined as they were in the
    file, so the text is the corpus's own (the paper's run_clm concatenates the same lines).
    """
    if rule not in ("rows", "wikitext"):
        raise DataError(f"Unknown document rule {rule!r}; use 'rows' or 'wikitext'.")
    documents: list[str] = []
    if rule == "rows":
        return [row for row in rows if row is not None and row.strip()]
    current: list[str] = []
    for row in rows:
        if not row:
            continue
        if _WIKITEXT_TITLE.match(row) and any(line.strip() for line in current):
            documents.append("".join(current).strip("\n"))
            current = []
        current.append(row if row.endswith("\n") else row + "\n")
    if any(line.strip() for line in current):
        documents.append("".join(current).strip("\n"))
    return documents


def resolve_text_settings(dataset_name: str | None, config: str | None, columns, text_column: str | None,
                          rule: str, corpus: str | None = "auto") -> tuple[str, str, Corpus | None]:
    """(text column, document rule, corpus or None) for a plain-text source with these `columns`."""
    known = find_corpus(dataset_name, config, corpus)
    column = text_column or (known.text_column if known is not None and known.text_column in columns else None)
    if column is None:
        # `text`, else the only column (a one-column file).
        column = "text" if "text" in columns else (columns[0] if len(columns) == 1 else None)
    if column is None or column not in columns:
        wanted = f"column {column!r}" if column else "a `text` column"
        raise DataError(
            f"Plain-text data needs {wanted}; found columns: {', '.join(columns) or '(none)'}. "
            "Name the text column with `text_column` (e.g. `sentence` for PTB)."
        )
    if rule not in DOCUMENT_RULES:
        raise DataError(f"Invalid text_documents {rule!r}; valid values: {', '.join(DOCUMENT_RULES)}.")
    if rule == "auto":
        rule = known.documents if known is not None else "rows"
    return column, rule, known


def to_documents(dataset, column: str, rule: str):
    """A `datasets.Dataset` with one column `text`, one row per document (blank documents dropped)."""
    from datasets import Dataset

    documents = documents_from_rows(dataset[column], rule)
    if not documents:
        raise DataError(f"The plain-text data has no text: every row of column {column!r} is blank.")
    return Dataset.from_dict({"text": documents})


def prepare_plain_text(source, train, train_split, evaluation, eval_split, script_args, data_args):
    """`load_sft_datasets` for `dataset_schema: plain_text`: documents in TRL's language-modelling format."""
    column, rule, known = resolve_text_settings(
        script_args.dataset_name, getattr(script_args, "dataset_config", None), train.column_names,
        data_args.text_column, data_args.text_documents,
    )
    train = to_documents(train, column, rule)
    if evaluation is not None:
        if column not in evaluation.column_names:
            raise DataError(f"Split {eval_split!r} has no column {column!r}; it has {', '.join(evaluation.column_names)}.")
        evaluation = to_documents(evaluation, column, rule)
    info = DatasetInfo.of_splits(source, train, train_split, evaluation, eval_split, schema="plain_text",
                                 output_format="text", prompt_format=None, assistant_only_loss=False)
    logger.info("%s; column %r, documents by %s%s", info.summary(), column, rule,
                f" (corpus {known.name})" if known else "")
    return train, evaluation, info


def packing_warnings(training_args) -> list[str]:
    """What is wrong with the trainer's settings for plain-text data (empty when nothing is)."""
    if not training_args.packing:
        return [
            "dataset_schema=plain_text without packing: each document is truncated at max_length and padded. "
            "Set `packing: true` and `packing_strategy: wrapped` to concatenate documents and cut them into blocks."
        ]
    if training_args.packing_strategy == "bfd":
        return [
            "packing_strategy=bfd truncates every document at max_length (the rest of the document is lost); "
            "use `packing_strategy: wrapped` for plain-text corpora."
        ]
    return []
