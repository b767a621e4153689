"""The capture attention against transformers' eager attention, padded batches included."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

from spectra import capture

TEXTS = [
    "the attention matrix of a pretrained transformer is low rank and a projection keeps most of its spectrum",
    "reviews of films",
    "the cost grows linearly with the length",
]


class Recorder:
    """A probe that keeps every layer's tensors."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[torch.Tensor, ...]] = {}

    def update(self, layer, q, k, v, mask, p, *, scaling) -> None:
        self.seen[layer] = (q.clone(), k.clone(), v.clone(), None if mask is None else mask.clone(), p.clone())


def models(path, head=AutoModel):
    spectra_model = head.from_pretrained(path, attn_implementation=capture.NAME).eval()
    eager_model = head.from_pretrained(path, attn_implementation="eager").eval()
    return spectra_model, eager_model


@pytest.mark.parametrize("family", ["roberta", "bert"])
def test_outputs_and_p_equal_eager_on_a_padded_batch(family, roberta_dir, bert_dir) -> None:
    path = roberta_dir if family == "roberta" else bert_dir
    tokenizer = AutoTokenizer.from_pretrained(path)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any(), "the batch must be padded"
    spectra_model, eager_model = models(path)
    recorder = Recorder()
    with torch.no_grad(), capture.capturing([recorder]):
        got = spectra_model(**batch).last_hidden_state
    with torch.no_grad():
        want = eager_model(**batch, output_attentions=True)
    assert torch.equal(got, want.last_hidden_state)
    assert sorted(recorder.seen) == list(range(len(want.attentions)))
    for layer, p_eager in enumerate(want.attentions):
        q, k, v, mask, p = recorder.seen[layer]
        assert torch.equal(p, p_eager)
        assert q.shape == k.shape == v.shape == (3, p.shape[1], p.shape[2], q.shape[-1])
        valid = capture.key_valid(mask, 3, p.shape[-1], p.device)
        assert torch.equal(valid, batch["attention_mask"].bool())
        # padded keys get exactly zero probability
        assert (p.masked_select(~valid[:, None, None, :].expand_as(p)) == 0).all()


def test_masked_lm_logits_equal_eager(roberta_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(roberta_dir)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    spectra_model, eager_model = models(roberta_dir, AutoModelForMaskedLM)
    with torch.no_grad():
        assert torch.equal(spectra_model(**batch).logits, eager_model(**batch).logits)


def test_substitution_replaces_the_head_outputs(roberta_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(roberta_dir)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    model, _ = models(roberta_dir)
    with torch.no_grad():
        exact = model(**batch).last_hidden_state

        def same(layer, q, k, v, mask, scaling):
            return torch.softmax(q @ k.transpose(-1, -2) * scaling + mask, dim=-1) @ v

        with capture.capturing(substitute=same):
            assert torch.allclose(model(**batch).last_hidden_state, exact, atol=1e-6)

        def uniform_last_layer(layer, q, k, v, mask, scaling):
            return v.mean(dim=-2, keepdim=True).expand_as(v) if layer == 1 else None

        with capture.capturing(substitute=uniform_last_layer) as state:
            changed = model(**batch).last_hidden_state
        assert state.layers_seen == {0, 1}
        assert not torch.allclose(changed, exact, atol=1e-3)


def test_no_probe_state_leaks_out_of_the_block(roberta_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(roberta_dir)
    model, _ = models(roberta_dir)
    recorder = Recorder()
    with torch.no_grad():
        with capture.capturing([recorder]):
            pass
        model(**tokenizer(TEXTS[:1], return_tensors="pt"))
    assert recorder.seen == {}


FAMILIES = {
    "bert": {},
    "roberta": {"max_position_embeddings": 66},
    "xlm-roberta": {"max_position_embeddings": 66},
    "electra": {"embedding_size": 32},
    "albert": {"embedding_size": 16},  # one attention module shared by all layers, no layer_idx
    "distilbert": {"dim": 32, "hidden_dim": 64, "n_layers": 3, "n_heads": 4},  # no layer_idx
    "modernbert": {"global_attn_every_n_layers": 1, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                   "cls_token_id": 1, "sep_token_id": 2},
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_encoder_families_capture_like_eager(family) -> None:
    import copy

    from transformers import AutoConfig

    sizes = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
             "intermediate_size": 64}
    if family == "distilbert":
        sizes = {"vocab_size": 100}
    config = AutoConfig.for_model(family, **sizes, **FAMILIES[family])
    torch.manual_seed(0)
    spectra_model = AutoModel.from_config(copy.deepcopy(config), attn_implementation=capture.NAME).eval()
    eager_model = AutoModel.from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    eager_model.load_state_dict(spectra_model.state_dict())
    ids = torch.randint(5, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    recorder = Recorder()
    with torch.no_grad():
        with capture.capturing([recorder]):
            got = spectra_model(input_ids=ids, attention_mask=mask).last_hidden_state
        want = eager_model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert torch.equal(got, want.last_hidden_state)
    assert sorted(recorder.seen) == [0, 1, 2]
    for layer, p in enumerate(want.attentions):
        assert torch.equal(recorder.seen[layer][4], p)
