"""Hugging Face transformers decoders and encoders as users export them (torch.export's exporter, the
default since torch 2.9; tiny configs, random weights): what the rewrite takes, and that the jitops
kernels (CPU emulator) and the fallback bodies match ORT on the original at sizes the export never saw.

Needs transformers and onnxscript (scripts/setup.sh installs them where it can); skipped without.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
pytest.importorskip("onnxscript")

import jitops.onnx as jo  # noqa: E402
from jitops.onnx.testing import max_rel_error, ort_session  # noqa: E402

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=256)


def _model(name: str):
    if name == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**SMALL, num_key_value_heads=2))
    if name == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**SMALL, num_key_value_heads=2))
    if name == "mistral":      # a sliding window: not causal at every length
        return tf.MistralForCausalLM(tf.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=4096))
    if name == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=256))
    if name == "gemma":        # multi-query: one kv head
        return tf.GemmaForCausalLM(tf.GemmaConfig(**SMALL, num_key_value_heads=1, head_dim=16))
    if name == "falcon":       # multi-query, its own attention code
        return tf.FalconForCausalLM(tf.FalconConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                                                    num_attention_heads=4, multi_query=True,
                                                    new_decoder_architecture=False))
    raise ValueError(name)


_exported: dict = {}


def _export(name: str, attn: str, dtype: str = "float32"):
    if (name, attn, dtype) not in _exported:
        torch.manual_seed(0)
        m = _model(name).to(getattr(torch, dtype))
        m.config._attn_implementation = attn
        m.config.use_cache = False
        batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=200)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(m.eval(), (torch.randint(0, 128, (2, 16)),), dynamo=True, verbose=False,
                                        input_names=["input_ids"], dynamic_shapes=({0: batch, 1: seq},))
        _exported[(name, attn, dtype)] = onnx.load_from_string(program.model_proto.SerializeToString())
    return _exported[(name, attn, dtype)]


def _attention_nodes(model) -> list[tuple[str, int]]:
    return [(n.op_type, {a.name: a.i for a in n.attribute}.get("is_causal", 0)) for n in model.graph.node
            if n.domain == jo.DOMAIN and "Attention" in n.op_type]


# name -> the attention nodes of the rewrite (two layers each)
EXPECTED = {"llama": ("Attention", 1), "qwen2": ("Attention", 1), "gpt2": ("AttentionBshd", 1),
            "mistral": ("MaskedAttention", 0), "gemma": ("Attention", 1), "falcon": ("Attention", 1)}


@pytest.mark.parametrize("name,attn,dtype", [("llama", "sdpa", "float32"), ("llama", "eager", "float32"),
                                             ("llama", "sdpa", "float16"), ("qwen2", "sdpa", "float32"),
                                             ("gpt2", "sdpa", "float32"), ("gpt2", "eager", "float32"),
                                             ("mistral", "sdpa", "float32"), ("gemma", "sdpa", "float32"),
                                             ("falcon", "sdpa", "float32")])
def test_hf_export_is_rewritten_and_matches(name, attn, dtype):
    """Every layer's attention is one node: SDPA's decomposition (its NaN guard after the Softmax)
    and the eager one alike; the causal mask transformers builds from position indices is proved
    causal (Mistral's 4096-position sliding window keeps its mask; float16's lowest as the fill is
    no position), and Llama / Qwen2's repeat_kv goes into the node where the mask went."""
    model = _export(name, attn, dtype)
    rw = jo.rewrite(model)
    assert _attention_nodes(rw) == [EXPECTED[name]] * 2
    assert "Softmax" not in {n.op_type for n in rw.graph.node}
    if name in ("llama", "qwen2", "gemma", "falcon"):      # repeat_kv taken in: the node reads the kv heads
        assert "Expand" not in {n.op_type for n in rw.graph.node}
    sess = jo.session(model, providers=["CPUExecutionProvider"], backend="cpu")
    for batch, seq in ((1, 5), (3, 37)):
        ids = np.random.default_rng(batch + seq).integers(0, 128, (batch, seq)).astype(np.int64)
        ref = ort_session(model).run(None, {"input_ids": ids})[0]
        got = sess.run(None, {"input_ids": ids})[0]                    # jitops kernels (emulator)
        fallback = ort_session(rw).run(None, {"input_ids": ids})[0]    # no jitops library: the bodies
        tol = 3e-3 if dtype == "float16" else 1e-4
        assert got.shape == ref.shape == (batch, seq, 128) and got.dtype == ref.dtype
        assert max_rel_error(got, ref) < tol and max_rel_error(fallback, ref) < tol, (batch, seq)


@pytest.mark.parametrize("opset", [18, 23])
def test_hf_bert_padding_mask_is_read_as_one_row(opset):
    """BERT (transformers 5 under torch.export) builds its [B, 1, S, S] mask from position indices and
    attention_mask: every query row the same. The rewrite passes its first row (a padding mask, one
    value per key: key_masks); at opset 23 the exporter writes ONNX's Attention op with that mask as
    booleans: its first row, taken as the additive mask (the fallback body, that op, gets it broadcast
    back to a row per query). The result matches ORT on the original with padded batches at sizes the
    export never saw."""
    from jitops.onnx.testing import ort_supports_opset
    if opset == 23 and not ort_supports_opset(23):
        pytest.skip("this onnxruntime has no opset 23")
    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=256)
    m = tf.BertModel(cfg).eval()
    m.config._attn_implementation = "sdpa"
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=200)
    ids, am = torch.randint(0, 128, (2, 16)), torch.ones(2, 16, dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(m, (ids, am), dynamo=True, verbose=False, opset_version=opset,
                                    input_names=["input_ids", "attention_mask"],
                                    dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
    model = onnx.load_from_string(program.model_proto.SerializeToString())
    rw = jo.rewrite(model)
    producer = {o: n for n in rw.graph.node for o in n.output}
    attention = [n for n in rw.graph.node if n.domain == jo.DOMAIN and "Attention" in n.op_type]
    assert len(attention) == 2 and all(n.op_type.startswith("MaskedAttention") for n in attention)
    mask_nodes = [producer[n.input[3]] for n in attention]
    if opset == 23:              # Where(first row, 0, -inf)
        assert all(m.op_type == "Where" for m in mask_nodes)
        mask_nodes = [producer[m.input[0]] for m in mask_nodes]
    assert all(m.op_type == "Slice" for m in mask_nodes)
    sess = jo.session(model, providers=["CPUExecutionProvider"], backend="cpu")
    rng = np.random.default_rng(1)
    for b, s in ((1, 5), (3, 37)):
        feeds = {"input_ids": rng.integers(0, 128, (b, s)).astype(np.int64), "attention_mask": np.ones((b, s), np.int64)}
        feeds["attention_mask"][-1, s // 2:] = 0                       # the last sequence padded
        ref = ort_session(model).run(None, feeds)[0]
        got = sess.run(None, feeds)[0]                                  # jitops kernels (emulator)
        fallback = ort_session(rw).run(None, feeds)[0]                  # the bodies
        assert got.shape == ref.shape == (b, s, 64)
        assert max_rel_error(got, ref) < 1e-4 and max_rel_error(fallback, ref) < 1e-4, (b, s)
