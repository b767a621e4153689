"""Corpus reading, seeded shuffling, and the pack/truncate semantics of token blocks."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from transformers import AutoTokenizer

from spectra import data
from spectra.errors import SpectraError


def test_txt_lines_and_paragraphs(tmp_path) -> None:
    lines = tmp_path / "lines.txt"
    lines.write_text("first document\nsecond one\nthird\n")
    paragraphs = tmp_path / "para.txt"
    paragraphs.write_text("a first\nparagraph\n\nthe second\n")
    assert sorted(data.open_corpus(str(lines)).documents) == ["first document", "second one", "third"]
    assert sorted(data.open_corpus(str(paragraphs)).documents) == ["a first paragraph", "the second"]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_tables_with_text_column(tmp_path, suffix) -> None:
    frame = pd.DataFrame({"id": [1, 2, 3], "body": ["one review", "another review", "a third"]})
    path = tmp_path / f"reviews{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in frame.to_dict("records")))
    elif suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path)
    corpus = data.open_corpus(str(path), text_column="body")
    assert sorted(corpus.documents) == sorted(frame["body"])
    with pytest.raises(SpectraError, match="no column 'text'.*id, body"):
        data.open_corpus(str(path))


def test_shuffle_is_seeded(text_file) -> None:
    a = data.open_corpus(str(text_file), seed=1).documents
    assert a == data.open_corpus(str(text_file), seed=1).documents
    assert a != data.open_corpus(str(text_file), seed=2).documents
    assert sorted(a) == sorted(line for line in text_file.read_text().splitlines() if line.strip())


def test_pack_makes_exact_blocks_of_the_separated_stream(roberta_dir, text_file) -> None:
    tokenizer = AutoTokenizer.from_pretrained(roberta_dir)
    corpus = data.open_corpus(str(text_file), seed=0)
    n = 24
    blocks = list(data.sequences(tokenizer, corpus, n, "pack"))
    stream = []
    for doc in corpus.documents:
        stream += tokenizer(doc, add_special_tokens=False)["input_ids"] + [tokenizer.sep_token_id]
    assert all(len(b) == n for b in blocks)
    assert all(b[0] == tokenizer.cls_token_id and b[-1] == tokenizer.sep_token_id for b in blocks)
    bodies = [token for b in blocks for token in b[1:-1]]
    assert bodies == stream[: len(bodies)] and len(stream) - len(bodies) < n - 2
    batches = list(data.batches(tokenizer, corpus, n, "pack", count=10, batch_size=4))
    assert [b.input_ids.shape for b in batches] == [(4, n), (4, n), (2, n)]
    assert bool(batches[0].attention_mask.all())
    resumed = list(data.batches(tokenizer, corpus, n, "pack", count=10, batch_size=4, skip=4))
    assert all((a.input_ids == b.input_ids).all() for a, b in zip(resumed, batches[1:]))
    held = list(data.batches(tokenizer, corpus, n, "pack", count=10, batch_size=4, held={0, 2, 3}, shard=(1, 2)))
    assert [b.index for b in held] == [[4, 6, 8]]  # of 1, 4, 5, 6, 7, 8, 9 left: the second, fourth, …
    assert (held[0].input_ids == torch.stack([batches[1].input_ids[0], batches[1].input_ids[2],
                                              batches[2].input_ids[0]])).all()


def test_truncate_makes_one_padded_sequence_per_document(bert_dir, text_file) -> None:
    tokenizer = AutoTokenizer.from_pretrained(bert_dir)
    corpus = data.open_corpus(str(text_file), seed=0)
    n = 16
    sequences = list(data.sequences(tokenizer, corpus, n, "truncate"))
    assert len(sequences) == len(corpus.documents)
    for ids, doc in zip(sequences, corpus.documents):
        assert ids == tokenizer(doc, truncation=True, max_length=n)["input_ids"]
    batch = next(data.batches(tokenizer, corpus, n, "truncate", count=8, batch_size=8))
    lengths = [len(s) for s in sequences[:8]]
    assert batch.attention_mask.sum(1).tolist() == lengths
    assert batch.input_ids.shape == (8, max(lengths))


def test_bad_sources(tmp_path) -> None:
    with pytest.raises(SpectraError, match="neither a known dataset"):
        data.open_corpus("no-such-corpus")
    with pytest.raises(SpectraError, match="does not exist"):
        data.open_corpus(str(tmp_path / "missing.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(SpectraError, match="no non-empty text"):
        data.open_corpus(str(empty))
    with pytest.raises(SpectraError, match="imdb.*HF_DATASETS_OFFLINE"):
        data.open_corpus("imdb")


@pytest.mark.parametrize(
    "name, hub, config",
    [("imdb", "stanfordnlp/imdb", None), ("wikitext-103", "Salesforce/wikitext", "wikitext-103-raw-v1"),
     ("wikitext-2", "Salesforce/wikitext", "wikitext-2-raw-v1")],
)
def test_named_datasets_load_from_the_hub_ids(name, hub, config, monkeypatch) -> None:
    """The hub path, configuration and default split of each named dataset (the hub itself is stubbed)."""
    import datasets

    calls = []

    def fake_load(path, name=None, split=None):
        calls.append((path, name, split))
        return datasets.Dataset.from_dict({"text": ["", " = Heading = ", "a paragraph of text"], "label": [0, 1, 0]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    corpus = data.open_corpus(name)
    assert calls == [(hub, config, "test")]
    assert sorted(corpus.documents) == [" = Heading = ", "a paragraph of text"]
    data.open_corpus(name, split="train")
    assert calls[-1] == (hub, config, "train")
    with pytest.raises(SpectraError, match="no column 'body'"):
        data.open_corpus(name, text_column="body")


def test_decoders_get_only_their_own_special_tokens_and_padding_side(llama_dir, gpt2_dir, text_file) -> None:
    """Pack mode adds only what the tokenizer adds (a BOS for a Llama-2-style tokenizer, nothing for GPT-2) and joins
    documents with EOS; truncate mode pads on the tokenizer's side."""
    from transformers import AutoTokenizer

    corpus = data.open_corpus(str(text_file), seed=0)
    llama, gpt2 = AutoTokenizer.from_pretrained(llama_dir), AutoTokenizer.from_pretrained(gpt2_dir)
    assert data.framing(llama, "pack") == {"prefix_tokens": ["<s>"], "suffix_tokens": [], "separator": "</s>",
                                           "padding_side": "left"}
    assert data.framing(gpt2, "truncate") == {"prefix_tokens": [], "suffix_tokens": [], "separator": None,
                                              "padding_side": "right"}
    block = next(data.sequences(llama, corpus, 16, "pack"))
    assert block[0] == llama.bos_token_id and block.count(llama.bos_token_id) == 1 and len(block) == 16
    stream = [t for doc in corpus.documents[:8] for t in llama(doc, add_special_tokens=False)["input_ids"] + [
        llama.eos_token_id]]
    assert block[1:] == stream[:15], "documents joined by EOS, nothing else added"
    batch = next(data.batches(llama, corpus, 16, "truncate", 4, 4))
    lengths = batch.attention_mask.sum(-1)
    assert (lengths < 16).any()
    for row, m in zip(batch.attention_mask, lengths.tolist()):
        assert row[16 - m:].all() and not row[: 16 - m].any(), "left padding"
    assert (batch.input_ids[batch.attention_mask == 0] == llama.eos_token_id).all(), "no pad token: EOS pads"


def test_a_malformed_csv_names_the_cause_and_the_line(tmp_path) -> None:
    """An unterminated quote is named with the line its field starts on (counting the lines of the quoted fields
    before it, which the parser's own row number does not); any other parser error gives the parser's own cause,
    never only "An error occurred while generating the dataset"."""
    quoted = tmp_path / "quoted.csv"
    quoted.write_text('text,label\n"a review\nover three\nlines",1\nplain 5" screen,2\n"never closed,1\nmore,0\n')
    with pytest.raises(SpectraError) as raised:
        data.open_corpus(str(quoted))
    assert str(raised.value) == (f"could not read {quoted} as csv: line 6 opens a quoted field that is never closed; "
                                 'close its quote, or double a quote ("") that belongs to the text')
    fields = tmp_path / "fields.csv"
    fields.write_text("text,label\nfine,1\ntoo,many,fields\n")
    with pytest.raises(SpectraError, match=f"could not read {fields} as csv: .*Expected 2 fields in line 3, saw 3$"):
        data.open_corpus(str(fields))


@pytest.mark.parametrize(("name", "content", "why"), [
    ("empty.csv", "", "it is empty"), ("blank.csv", "\n \n", "it is empty"),
    ("header.csv", "text,label\n", "it holds a header and no row"), ("empty.json", "", "it is empty"),
    ("list.json", "[]", "it holds no record ([])"), ("empty.parquet", "", "it is empty (0 bytes)"),
    ("empty.jsonl", "\n", "it is empty")])
def test_an_empty_table_file_is_one_clear_line(tmp_path, name, content, why) -> None:
    """An empty csv/json/parquet file says so in words, never datasets' bare error type (IndexError,
    StopIteration) or "Instruction 'train' corresponds to no data!"."""
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(SpectraError) as raised:
        data.open_corpus(str(path))
    assert str(raised.value) == (f"{path} holds no text: {why}; give a {path.suffix[1:]} file with a 'text' column "
                                 "and at least one row")
