"""Plain-text corpora (`dataset_schema: plain_text`): rows -> documents, TRL's wrapped packing, EMO on the blocks."""

import json
from types import SimpleNamespace

import pytest

from conftest import cpu_config
from data_fixtures import fixture_rows, write_fixture
from trl_emo.data import DataArguments, DataError, load_sft_datasets
from trl_emo.data.plain_text import documents_from_rows, find_corpus, packing_warnings


def args(name, schema="plain_text", config=None, test_split="validation", **data):
    script = SimpleNamespace(dataset_name=name, dataset_config=config, dataset_train_split="train",
                             dataset_test_split=test_split)
    return script, DataArguments(dataset_schema=schema, **data)


def test_wikitext_lines_become_articles_and_other_corpora_rows():
    rows = [r["text"] for r in fixture_rows("plain_text", 14)]
    articles = documents_from_rows(rows, "wikitext")
    assert len(articles) == 2
    # An article is its lines as in the file: title, paragraph, section heading, paragraph; no blank rows.
    assert articles[0] == "".join(rows[:7]).strip("\n") and articles[0].startswith(" = The red cat (train 0) = \n")
    assert " = = Habitat = = \n" in articles[0] and "(train 1)" in articles[1]
    assert documents_from_rows(rows, "rows") == [r for r in rows if r]  # blank rows dropped, nothing joined
    # A section heading alone does not start a new article.
    assert documents_from_rows([" = A = \n", " x\n", " = = B = = \n", " y\n"], "wikitext") == [" = A = \n x\n = = B = = \n y"]


@pytest.mark.parametrize(
    ("name", "config", "expected"),
    [("Salesforce/wikitext", "wikitext-103-raw-v1", "wikitext-103"), ("wikitext", "wikitext-2-raw-v1", "wikitext-2"),
     ("ptb_text_only", "penn_treebank", "ptb"), ("fancyzhx/ag_news", None, "ag_news"),
     ("data/wikitext-103-raw-v1/", None, "wikitext-103"), ("corpora/webtext.test.jsonl", None, "webtext"),
     ("my/other-corpus", None, None)],
)
def test_corpora_are_recognised_by_hub_id_or_local_name(name, config, expected):
    corpus = find_corpus(name, config)
    assert (corpus.name if corpus else None) == expected
    if expected == "ptb":
        assert corpus.text_column == "sentence" and (corpus.prefix_words, corpus.generation_length) == (5, 25)


def test_load_plain_text_documents_from_jsonl_txt_and_a_sentence_column(tmp_path, tokenizer):
    folder = write_fixture("plain_text", tmp_path, n_rows=14)
    train, evaluation, info = load_sft_datasets(*args(folder, config="wikitext-103-raw-v1"), tokenizer)
    assert (info.schema, info.output_format, info.num_train, info.num_eval) == ("plain_text", "text", 2, 2)
    assert train.column_names == ["text"] and train[0]["text"].startswith(" = The red cat (train 0) =")
    # Without a corpus name the rows are the documents; `text_documents` can say otherwise.
    _, _, info = load_sft_datasets(*args(folder), tokenizer)
    assert info.num_train == 8
    _, _, info = load_sft_datasets(*args(folder, text_documents="wikitext"), tokenizer)
    assert info.num_train == 2
    # A .txt file: one row per line in `text` (datasets' text builder).
    txt = tmp_path / "wikitext-2.train.txt"
    txt.write_text("".join(r["text"] if r["text"] else "\n" for r in fixture_rows("plain_text", 14)))
    train, _, info = load_sft_datasets(*args(str(txt), test_split=None), tokenizer)
    assert info.num_train == 2 and "Habitat" in train[0]["text"]
    # PTB keeps its sentences in `sentence`: known by its name; otherwise the column must be named.
    lines = "".join(json.dumps({"sentence": f"the market rose {i} points", "id": i}) + "\n" for i in range(5))
    (tmp_path / "ptb.jsonl").write_text(lines)
    (tmp_path / "news.jsonl").write_text(lines)
    train, _, _ = load_sft_datasets(*args(str(tmp_path / "ptb.jsonl"), test_split=None), tokenizer)
    assert train["text"] == [f"the market rose {i} points" for i in range(5)]
    with pytest.raises(DataError, match="text_column"):
        load_sft_datasets(*args(str(tmp_path / "news.jsonl"), test_split=None), tokenizer)
    train, _, _ = load_sft_datasets(*args(str(tmp_path / "news.jsonl"), test_split=None, text_column="sentence"), tokenizer)
    assert len(train) == 5


def test_trl_wrapped_packing_gives_the_papers_blocks_and_emo_trains_on_them(tmp_path, tokenizer, make_model):
    """TRL's own preparation (EOS per document, wrapped packing) equals concatenate-and-cut with every token a
    target; then two EMO steps run on the packed blocks."""
    from trl_emo import SFTTrainer

    folder = write_fixture("plain_text", tmp_path, n_rows=14)
    train, _, _ = load_sft_datasets(*args(folder, config="wikitext-2-raw-v1"), tokenizer)
    block = 48
    config = cpu_config(tmp_path / "out", loss_type="emo", packing=True, packing_strategy="wrapped", max_length=block,
                        max_steps=2, per_device_train_batch_size=4)
    assert packing_warnings(config) == []
    assert "truncates every document" in packing_warnings(cpu_config(tmp_path, packing=True))[0]
    trainer = SFTTrainer(model=make_model(), args=config, train_dataset=train, processing_class=tokenizer)
    blocks = trainer.train_dataset
    stream = [t for doc in train["text"] for t in tokenizer(doc + tokenizer.eos_token)["input_ids"]]
    assert [t for ids in blocks["input_ids"] for t in ids] == stream
    assert all(len(ids) == block for ids in blocks["input_ids"][:-1]) and len(blocks["input_ids"][-1]) <= block
    assert blocks["labels"] == blocks["input_ids"]  # every token is a target
    assert stream.count(tokenizer.eos_token_id) == 2  # one EOS per article, none per line
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 2 and all(loss > 0 for loss in losses)
