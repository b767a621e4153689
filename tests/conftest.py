"""Shared fixtures: tiny offline models and corpora; the network is never touched."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).parent))

import task_files
import tiny


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked `cuda` run only where torch sees a CUDA device (benchmarks/gpu/run.sh runs them there)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: benchmarks/gpu/run.sh runs these on a GPU")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory) -> Path:
    """The model cache of the whole session, in a temporary folder: a test never writes the user's ~/.cache."""
    folder = tmp_path_factory.mktemp("spectra-cache")
    os.environ["SPECTRA_CACHE"] = str(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    """A tiny Llama GGUF file (Q4_1 and Q8_0 tensors, byte-level BPE), written by the gguf package (transformers
    reads one only with accelerate too: both, or a skip)."""
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    import gguf_files

    return gguf_files.write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.Q4_1.gguf")


@pytest.fixture(scope="session")
def roberta_dir(tmp_path_factory) -> Path:
    return tiny.save_model(tmp_path_factory.mktemp("models") / "tiny-roberta", "roberta")


@pytest.fixture(scope="session")
def bert_dir(tmp_path_factory) -> Path:
    return tiny.save_model(tmp_path_factory.mktemp("models") / "tiny-bert", "bert")


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    return tiny.save_decoder(tmp_path_factory.mktemp("models") / "tiny-llama", "llama")


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory) -> Path:
    return tiny.save_decoder(tmp_path_factory.mktemp("models") / "tiny-gpt2", "gpt2")


@pytest.fixture(scope="session")
def text_file(tmp_path_factory) -> Path:
    return tiny.write_text(tmp_path_factory.mktemp("data") / "corpus.txt", count=200)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: intra-op threads only add overhead (and stall badly on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def machine_threads():
    """The suite runs with one intra-op thread (fixtures included): on its tiny tensors torch's thread pool only adds
    its fork-join cost (an approx run with fitting: 1.5 s on one thread, 9 s on two, 2 cores). Yields the
    machine's own count, which the tests marked `threads` get back (see `intra_op_threads`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield threads
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def intra_op_threads(request, machine_threads):
    """Tests marked `threads` run with the machine's intra-op threads (split_threads' pool of single-threaded
    LAPACK calls, as users get it); every other test with one."""
    marked = request.node.get_closest_marker("threads") is not None
    torch.set_num_threads(machine_threads if marked else 1)
    yield
    torch.set_num_threads(1)


# ---------------------------------------------------------------- task study: tiny decoders with 4096 positions
# (the tiny Llama's tokenizer has no chat template: kvpress puts BOS before the context; the chat one has a template)

@pytest.fixture(scope="session")
def long_decoder(tmp_path_factory) -> Path:
    return tiny.save_decoder(tmp_path_factory.mktemp("models") / "tiny-llama-4096", "llama", positions=4096)


@pytest.fixture(scope="session")
def tokenizer(long_decoder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(long_decoder)


@pytest.fixture(scope="session")
def chat_tokenizer(long_decoder):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(long_decoder)
    tokenizer.chat_template = task_files.CHAT
    return tokenizer


@pytest.fixture(scope="session")
def chat_decoder(long_decoder, chat_tokenizer, tmp_path_factory) -> Path:
    """The tiny decoder's directory with the chat template saved in its tokenizer."""
    import shutil

    path = tmp_path_factory.mktemp("models") / "tiny-chat"
    shutil.copytree(long_decoder, path, dirs_exist_ok=True)
    chat_tokenizer.save_pretrained(path)
    return path
