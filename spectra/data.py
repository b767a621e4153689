"""Turn a named dataset or a local file into seeded, reproducible batches of token blocks.

Documents are shuffled with the seed, then either packed (`pack`: concatenated with the tokenizer's
separator and cut into blocks of exactly n tokens including special tokens, the last partial block
dropped) or truncated (`truncate`: one document per sequence, at most n tokens, padded in the batch).
Tokenization is lazy: only as many documents are read as the requested sequences need.
"""

from __future__ import annotations

import hashlib
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import distributed, hub
from .errors import SpectraError

#: name → (hub path, configuration, default split, text column)
NAMED = {
    "imdb": ("stanfordnlp/imdb", None, "test", "text"),
    "wikitext-103": ("Salesforce/wikitext", "wikitext-103-raw-v1", "test", "text"),
    "wikitext-2": ("Salesforce/wikitext", "wikitext-2-raw-v1", "test", "text"),
}
FILE_TYPES = {".txt": "text", ".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
#: a sample of the corpus for the tokenizer check: documents read and the share of unknown tokens refused
TOKENIZER_SAMPLE, MAX_UNKNOWN_SHARE = 64, 0.5


@dataclass
class Corpus:
    """Documents in their seeded order, where they came from, and what identifies their content (a local
    file's size and SHA-256, a hub dataset's fingerprint), so a resumed run can tell the data changed."""

    name: str
    source: str
    split: str | None
    text_column: str
    documents: list[str]
    content: dict[str, object] = field(default_factory=dict)

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "source": self.source, "split": self.split, "text_column": self.text_column,
                "documents": len(self.documents), **self.content}


def file_content(path: Path) -> dict[str, object]:
    """Size and SHA-256 of a local file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def _read_txt(path: Path) -> list[str]:
    """Blank-line separated paragraphs when the file has blank lines, else one document per line."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    if any(not line.strip() for line in lines[:-1]) and any(line.strip() for line in lines):
        return [" ".join(part.split("\n")).strip() for part in text.split("\n\n")]
    return lines


def unclosed_quote(text: str) -> int | None:
    """The 1-based line on which a CSV quoted field opens and never closes, or None. A quote opens a quoted field
    only at a field's start (elsewhere it is text, as in `5" screen`); inside one, `""` is a literal quote."""
    line, opened, quoted, at_start, i = 1, None, False, True, 0
    while i < len(text):
        char = text[i]
        if quoted:
            if char == '"' and text[i + 1:i + 2] == '"':
                i += 1
            elif char == '"':
                quoted = False
        elif char == '"' and at_start:
            quoted, opened = True, line
        else:
            at_start = char in ",\n"
        line += char == "\n"
        i += 1
    return opened if quoted else None


def _table_error(path: Path, error: BaseException) -> str:
    """Why datasets could not read a table file: its innermost cause (datasets wraps the parser's error in "An
    error occurred while generating the dataset"), and for a CSV quote left open, the line it opens on."""
    cause = error
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__
    text = (str(cause).strip().splitlines()[0] if str(cause).strip() else
            f"its parser stopped ({type(cause).__name__}, no message); is it a well-formed {path.suffix[1:]} file?")
    if path.suffix == ".csv" and "EOF inside string" in text:
        try:
            line = unclosed_quote(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            line = None
        if line is not None:
            return (f"line {line} opens a quoted field that is never closed; close its quote, or double a quote "
                    '("") that belongs to the text')
    return text


def _empty_table(path: Path) -> str | None:
    """Why a table file holds nothing to read, in words (no byte but whitespace; no row), or None. Checked before
    datasets reads it: its own errors for an empty file are a parser's type name ("StopIteration", "IndexError")
    or "Instruction 'train' corresponds to no data!", which say nothing to a reader."""
    if path.suffix == ".parquet":
        return "it is empty (0 bytes)" if path.stat().st_size == 0 else None
    if path.stat().st_size > 2**16:
        return None
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        return "it is empty"
    if path.suffix == ".csv" and len([line for line in text.splitlines() if line.strip()]) < 2:
        return "it holds a header and no row"
    if path.suffix == ".json" and text.strip() in ("[]", "{}"):
        return f"it holds no record ({text.strip()})"
    return None


def _read_table(path: Path, text_column: str) -> list[str]:
    if (empty := _empty_table(path)) is not None:
        raise SpectraError(f"{path} holds no text: {empty}; give a {path.suffix[1:]} file with a '{text_column}' "
                           "column and at least one row")
    import datasets

    datasets.disable_progress_bars()
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its "Failed to read file" would be a second line
    try:
        table = datasets.load_dataset(FILE_TYPES[path.suffix], data_files=str(path), split="train")
    except Exception as error:  # datasets raises many types for unreadable files
        raise SpectraError(f"could not read {path} as {path.suffix[1:]}: {_table_error(path, error)}") from None
    finally:
        datasets.logging.set_verbosity(verbosity)
    if text_column not in table.column_names:
        raise SpectraError(
            f"{path} has no column '{text_column}'; its columns are {', '.join(table.column_names)} (use --text-column)"
        )
    values = [x for x in table[text_column] if x is not None]
    if values and not any(isinstance(x, str) for x in values):
        found = "numbers" if all(isinstance(x, (int, float)) for x in values) else type(values[0]).__name__ + " values"
        others = [name for name in table.column_names if name != text_column]
        raise SpectraError(f"column '{text_column}' of {path} holds {found}, not text; choose a text column with "
                           f"--text-column (its other columns: {', '.join(others) or 'none'})")
    return [str(x) for x in values]


def _read_named(name: str, split: str, text_column: str) -> list[str]:
    import datasets

    hub_id, config, _, _ = NAMED[name]
    hub.prepare()  # one quick connection attempt; unreachable → the local cache only, no retries
    datasets.disable_progress_bars()
    try:
        table = datasets.load_dataset(hub_id, config, split=split)
    except Exception as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SpectraError(
            f"could not load dataset '{name}' ({hub_id}, split {split}): {first}; with no network, "
            "pass a local .txt/.jsonl/.csv/.parquet file instead, or set HF_DATASETS_OFFLINE=1 to use the cache"
        ) from None
    if text_column not in table.column_names:
        raise SpectraError(f"dataset '{name}' has no column '{text_column}'; its columns are {', '.join(table.column_names)}")
    return table[text_column], {"fingerprint": getattr(table, "_fingerprint", None)}


def open_corpus(data: str, *, split: str | None = None, text_column: str | None = None, seed: int = 0) -> Corpus:
    """A named dataset (imdb, wikitext-103, wikitext-2) or a local file, its non-empty documents shuffled."""
    path = Path(data)
    if data in NAMED and not path.exists():
        hub_id, _, default_split, default_column = NAMED[data]
        split = split or default_split
        column = text_column or default_column
        (documents, content), source = _read_named(data, split, column), hub_id
        name = data
    else:
        if path.suffix not in FILE_TYPES:
            if not path.exists():
                raise SpectraError(
                    f"data '{data}' is neither a known dataset ({', '.join(NAMED)}) nor an existing file"
                )
            raise SpectraError(f"cannot read {data}: use a {', '.join(FILE_TYPES)} file")
        if not path.is_file():
            raise SpectraError(f"data file {data} does not exist")
        if split is not None:
            raise SpectraError("--split applies to named datasets only, not to a local file")
        if text_column is not None and path.suffix == ".txt":
            raise SpectraError("--text-column applies to .jsonl/.csv/.parquet files only; a .txt file holds "
                               "plain text, one document per line or paragraph")
        column = text_column or "text"
        try:
            documents = _read_txt(path) if path.suffix == ".txt" else _read_table(path, column)
            content = file_content(path)
        except (OSError, UnicodeDecodeError) as error:
            raise SpectraError(f"could not read {data}: {error}") from None
        source, name = str(path.resolve()), path.stem
    documents = [doc for doc in documents if doc and doc.strip()]
    if not documents:
        raise SpectraError(f"data '{data}' holds no non-empty text")
    order = np.random.default_rng(seed).permutation(len(documents))
    return Corpus(name, source, split, column, [documents[i] for i in order], content)


@dataclass
class Batch:
    """Token ids and attention mask (B, width), and each sequence's index in the run's order."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    index: list[int]


def _token_chunks(tokenizer, documents: list[str], chunk: int = 256) -> Iterator[list[int]]:
    for start in range(0, len(documents), chunk):
        yield from tokenizer(documents[start : start + chunk], add_special_tokens=False, verbose=False)["input_ids"]


def unknown_share(tokenizer, documents: list[str]) -> float:
    """The share of a sample's words (whitespace-separated) that the tokenizer maps to its unknown token."""
    unknown = tokenizer.unk_token_id
    sample = documents[:TOKENIZER_SAMPLE]
    words = sum(len(doc.split()) for doc in sample)
    if unknown is None or not words:
        return 0.0
    ids = tokenizer(sample, add_special_tokens=False, verbose=False)["input_ids"]
    return sum(row.count(unknown) for row in ids) / words


def special_tokens(tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a single sequence (e.g. <s> … </s>, [CLS] … [SEP])."""
    bare = tokenizer("spectra", add_special_tokens=False)["input_ids"]
    full = tokenizer("spectra", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return full[:start], full[start + len(bare) :]
    raise SpectraError("cannot tell the tokenizer's special tokens apart from the text it encodes")


def separator(tokenizer) -> int | None:
    """The token that joins documents in pack mode: the tokenizer's separator, else its end-of-sequence token."""
    return tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id


def framing(tokenizer, mode: str) -> dict[str, object]:
    """How sequences are framed, for run.json: the special tokens the tokenizer itself adds around a sequence
    (e.g. <s> … </s>, [CLS] … [SEP], a BOS alone, or none), the token joining packed documents, padding's side."""
    prefix, suffix = special_tokens(tokenizer)
    joined = separator(tokenizer) if mode == "pack" else None
    return {"prefix_tokens": tokenizer.convert_ids_to_tokens(prefix), "suffix_tokens": tokenizer.convert_ids_to_tokens(suffix),
            "separator": tokenizer.convert_ids_to_tokens(joined) if joined is not None else None,
            "padding_side": getattr(tokenizer, "padding_side", "right")}


def sequences(tokenizer, corpus: Corpus, n: int, mode: str) -> Iterator[list[int]]:
    """Token id lists of the model's input, in the corpus order (see module docstring)."""
    prefix, suffix = special_tokens(tokenizer)
    body = n - len(prefix) - len(suffix)
    if body < 1:
        raise SpectraError(f"--length {n} leaves no room for text beside {len(prefix) + len(suffix)} special tokens")
    if mode == "truncate":
        for ids in _token_chunks(tokenizer, corpus.documents):
            if ids:
                yield prefix + ids[:body] + suffix
        return
    joiner = separator(tokenizer)
    buffer: list[int] = []
    for ids in _token_chunks(tokenizer, corpus.documents):
        buffer.extend(ids)
        if joiner is not None:
            buffer.append(joiner)
        while len(buffer) >= body:
            yield prefix + buffer[:body] + suffix
            del buffer[:body]


def batches(tokenizer, corpus: Corpus, n: int, mode: str, count: int, batch_size: int, skip: int = 0,
            shard: tuple[int, int] = (0, 1), fit_samples: int = 0, held: Container[int] = ()) -> Iterator[Batch]:
    """Batches of up to `batch_size` of the first `count` sequences (calibration included), leaving out the first `skip`
    and those `held` (resuming: what checkpoints hold) and, with shard = (rank, size), keeping one process's share
    (`distributed.share`: with nothing held, indices ≡ rank mod size).
    No batch holds sequences on both sides of `fit_samples` (the end of a calibration set)."""
    pad = next((token for token in (tokenizer.pad_token_id, tokenizer.eos_token_id) if token is not None), 0)
    left = getattr(tokenizer, "padding_side", "right") == "left"
    pending: list[tuple[int, list[int]]] = []
    mine = distributed.share(range(skip, count), held, shard)
    wanted = next(mine, None)
    for index, ids in enumerate(sequences(tokenizer, corpus, n, mode)):
        if wanted is None:
            break
        if index != wanted:
            continue
        wanted = next(mine, None)
        if pending and pending[-1][0] < fit_samples <= index:
            yield _collate(pending, pad, left)
            pending = []
        pending.append((index, ids))
        if len(pending) == batch_size:
            yield _collate(pending, pad, left)
            pending = []
    if pending:
        yield _collate(pending, pad, left)


def _collate(rows: list[tuple[int, list[int]]], pad: int, left: bool = False) -> Batch:
    """Rows padded to the longest on the tokenizer's padding side (decoders often pad on the left)."""
    width = max(len(ids) for _, ids in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (_, ids) in enumerate(rows):
        where = slice(width - len(ids), width) if left else slice(0, len(ids))
        input_ids[i, where] = torch.tensor(ids)
        mask[i, where] = 1
    return Batch(input_ids, mask, [index for index, _ in rows])
