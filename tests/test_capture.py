"""The capture attention against transformers' eager attention, padded batches included."""

from __future__ import annotations

import pytest
import tiny
import torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

from spectra import capture
from spectra.errors import InternalError

TEXTS = [
    "the attention matrix of a pretrained transformer is low rank and a projection keeps most of its spectrum",
    "reviews of films",
    "the cost grows linearly with the length",
]


class Recorder:
    """An observer that keeps every layer's record, with P formed."""

    def __init__(self) -> None:
        self.seen: dict[int, capture.Captured] = {}

    def __call__(self, captured: capture.Captured) -> None:
        captured.p  # noqa: B018 - form P now, as a probe would
        self.seen[captured.layer] = captured


def models(path, head=AutoModel):
    spectra_model = head.from_pretrained(path, attn_implementation=capture.NAME).eval()
    eager_model = head.from_pretrained(path, attn_implementation="eager").eval()
    return spectra_model, eager_model


def captured_and_eager(spectra_model, eager_model, **inputs):
    """Both models on the same inputs, without gradients: the capture's records, the capture model's output, and
    eager attention's output with its attention weights."""
    recorder = Recorder()
    index = tuple(range(7, 7 + inputs["input_ids"].shape[0]))  # a later batch of a run: global indices 7, 8, …
    with torch.no_grad():
        with capture.capturing(recorder, index=index):
            got = spectra_model(**inputs)
        want = eager_model(**inputs, output_attentions=True)
    assert all(record.sequence_index() == list(index) for record in recorder.seen.values())
    return recorder, got, want


@pytest.mark.parametrize("family", ["roberta", "bert"])
def test_outputs_and_p_equal_eager_on_a_padded_batch(family, roberta_dir, bert_dir) -> None:
    path = roberta_dir if family == "roberta" else bert_dir
    tokenizer = AutoTokenizer.from_pretrained(path)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any(), "the batch must be padded"
    spectra_model, eager_model = models(path)
    recorder, got, want = captured_and_eager(spectra_model, eager_model, **batch)
    assert torch.equal(got.last_hidden_state, want.last_hidden_state)
    assert sorted(recorder.seen) == list(range(len(want.attentions)))
    for layer, p_eager in enumerate(want.attentions):
        seen = recorder.seen[layer]
        p = seen.p
        assert torch.equal(p, p_eager)
        assert seen.q.shape == seen.k.shape == seen.v.shape == (3, p.shape[1], p.shape[2], seen.q.shape[-1])
        assert seen.k is seen.key and seen.groups == 1 and not seen.causal
        assert seen.scaling == seen.q.shape[-1] ** -0.5
        valid = seen.valid
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

        def same(captured: capture.Captured) -> torch.Tensor:
            scores = captured.q @ captured.k.transpose(-1, -2) * captured.scaling
            return torch.softmax(scores + captured.mask, dim=-1) @ captured.v

        with capture.capturing(substitute=same):
            assert torch.allclose(model(**batch).last_hidden_state, exact, atol=1e-6)

        def uniform_last_layer(captured: capture.Captured) -> torch.Tensor | None:
            assert "p" not in captured.__dict__, "no observer: P is never formed"
            return captured.v.mean(dim=-2, keepdim=True).expand_as(captured.v) if captured.layer == 1 else None

        with capture.capturing(substitute=uniform_last_layer) as state:
            changed = model(**batch).last_hidden_state
        assert state.layers_seen == {0, 1}
        assert not torch.allclose(changed, exact, atol=1e-3)


def test_no_probe_state_leaks_out_of_the_block(roberta_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(roberta_dir)
    model, _ = models(roberta_dir)
    recorder = Recorder()
    with torch.no_grad():
        with capture.capturing(recorder):
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
    recorder, got, want = captured_and_eager(spectra_model, eager_model, input_ids=ids, attention_mask=mask)
    assert torch.equal(got.last_hidden_state, want.last_hidden_state)
    assert sorted(recorder.seen) == [0, 1, 2]
    for layer, p in enumerate(want.attentions):
        assert torch.equal(recorder.seen[layer].p, p)


def test_forward_refuses_a_model_whose_attention_bypasses_the_capture(roberta_dir) -> None:
    from spectra.errors import SpectraError

    tokenizer = AutoTokenizer.from_pretrained(roberta_dir)
    eager = AutoModel.from_pretrained(roberta_dir, attn_implementation="eager").eval()
    with pytest.raises(SpectraError, match="0 of 2 layers seen"):
        capture.forward(eager, 2, **tokenizer(TEXTS[:1], return_tensors="pt"))


def test_a_record_built_by_hand_equals_the_eager_formula() -> None:
    q, k, v = torch.randn(3, 2, 4, 6, 8).unbind(0)
    mask = torch.zeros(2, 1, 6, 6)
    mask[1, :, :, 4:] = torch.finfo(torch.float32).min
    captured = capture.Captured.of(0, q, k, v, mask)
    assert torch.equal(captured.valid, torch.tensor([[True] * 6, [True] * 4 + [False] * 2]))
    want = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5 + mask, dim=-1)
    assert torch.allclose(captured.p, want, atol=1e-7)


def test_a_record_without_its_sequence_indices_is_refused_by_whoever_needs_them() -> None:
    """Records made outside a run may lack the indices, but reading them is then a bug (never batch positions)."""
    q, k, v = torch.randn(3, 2, 1, 4, 8).unbind(0)
    with pytest.raises(InternalError, match="no sequence indices"):
        capture.Captured.of(0, q, k, v).sequence_index()
    with pytest.raises(InternalError, match="3 sequence indices for 2 sequences"):
        capture.Captured.of(0, q, k, v, index=(0, 1, 2)).sequence_index()
    assert capture.Captured.of(0, q, k, v, index=(4, 9)).sequence_index() == [4, 9]


def test_grouped_query_records_keep_one_key_per_key_value_head() -> None:
    q = torch.randn(1, 6, 5, 4)
    key, value = torch.randn(2, 1, 2, 5, 4).unbind(0)
    captured = capture.Captured(0, q, key, value, torch.ones(1, 5, dtype=torch.bool), 0.5)
    assert captured.groups == 3 and captured.key.shape[1] == 2
    for head in range(6):  # query head h reads key/value head h // groups, as eager attention's repeat_kv
        assert torch.equal(captured.k[:, head], key[:, head // 3])
        assert torch.equal(captured.v[:, head], value[:, head // 3])


DECODERS = {
    "llama": {"num_key_value_heads": 2},
    "qwen2": {"num_key_value_heads": 2},
    "mistral": {"num_key_value_heads": 2, "sliding_window": None},
    "gpt2": {},
}


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("family", sorted(DECODERS))
def test_decoder_families_capture_like_eager(family, side) -> None:
    """Causal LMs, grouped-query attention included: logits and P bitwise equal to eager, padding on either side;
    the record keeps one key per key/value head and says the layer is causal."""
    import copy

    from transformers import AutoConfig, AutoModelForCausalLM

    sizes = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    if family == "gpt2":
        sizes = dict(vocab_size=100, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    config = AutoConfig.for_model(family, **sizes, **DECODERS[family])
    torch.manual_seed(0)
    spectra_model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=capture.NAME).eval()
    eager_model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    eager_model.load_state_dict(spectra_model.state_dict())
    ids = torch.randint(5, 100, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    if side == "right":
        mask[1, 6:] = 0
    else:
        mask[1, :4] = 0
    recorder, got, want = captured_and_eager(spectra_model, eager_model, input_ids=ids, attention_mask=mask)
    assert torch.equal(got.logits, want.logits)
    for layer, p in enumerate(want.attentions):
        seen = recorder.seen[layer]
        assert torch.equal(seen.p, p) and seen.causal
        assert seen.key.shape[1] == (2 if family != "gpt2" else 4) and seen.groups == 4 // seen.key.shape[1]
        assert torch.equal(seen.valid, mask.bool())


@pytest.mark.slow
def test_smollm2_captures_like_eager() -> None:
    """The real pretrained decoder (30 layers, 9 query heads sharing 3 key/value heads, RoPE): logits and every
    layer's P bitwise equal to eager attention on a left-padded batch."""
    from transformers import AutoModelForCausalLM

    folder, name = tiny.smollm2()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.padding_side = "left"
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    spectra_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, attn_implementation=capture.NAME).eval()
    eager_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, attn_implementation="eager").eval()
    recorder, got, want = captured_and_eager(spectra_model, eager_model, **batch)
    assert torch.equal(got.logits, want.logits)
    assert len(want.attentions) == 30
    for layer, p in enumerate(want.attentions):
        seen = recorder.seen[layer]
        assert torch.equal(seen.p, p), layer
        assert seen.q.shape[1] == 9 and seen.key.shape[1] == 3 and seen.causal


@pytest.mark.slow
def test_minilm_captures_like_eager() -> None:
    """The real pretrained encoder all-MiniLM-L6-v2 on real text, padded: hidden states and every layer's P
    bitwise equal to eager attention."""
    folder = tiny.minilm()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = tiny.licence_text(4000)
    batch = tokenizer([text[:1500], text[1500:2200]], padding=True, truncation=True, max_length=256,
                      return_tensors="pt")
    spectra_model = AutoModel.from_pretrained(folder, attn_implementation=capture.NAME).eval()
    eager_model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    recorder, got, want = captured_and_eager(spectra_model, eager_model, **batch)
    assert torch.equal(got.last_hidden_state, want.last_hidden_state)
    assert len(want.attentions) == 6 and not bool(batch["attention_mask"].all()), "one sequence is padded"
    for layer, p in enumerate(want.attentions):
        assert torch.equal(recorder.seen[layer].p, p), layer


def test_a_sliding_window_decoder_captures_like_eager() -> None:
    """Gemma 3's local layers: the captured P is eager attention's, bit for bit, its band mask included (each query
    sees only its last W keys), and the global layer's is causal over every key."""
    import copy

    import tiny

    spectra_model = tiny.gemma3(window=6)
    config = copy.deepcopy(spectra_model.config)
    config._attn_implementation = "eager"
    from transformers import Gemma3ForCausalLM

    eager_model = Gemma3ForCausalLM(config).eval()
    eager_model.load_state_dict(spectra_model.state_dict())
    ids = torch.randint(3, 128, (2, 20), generator=torch.Generator().manual_seed(2))
    recorder, got, want = captured_and_eager(spectra_model, eager_model, input_ids=ids)
    assert torch.equal(got.logits, want.logits)
    for layer, p in enumerate(want.attentions):
        assert torch.equal(recorder.seen[layer].p, p)
    far = torch.ones(20, 20, dtype=torch.bool).tril(-6)  # keys W or more positions back
    assert (want.attentions[0][..., far] == 0).all() and (want.attentions[2][..., far] > 0).all()
