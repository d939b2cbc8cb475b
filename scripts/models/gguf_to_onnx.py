#!/usr/bin/env python3
"""Convert a Llama-architecture GGUF (SmolLM2-135M-Instruct) to an ONNX causal LM, without torch.

Graph: inputs `input_ids`, `attention_mask` (int64 [B,S]); outputs `logits` [B,S,V] and
`token_logprobs` [B,S] (the log-probability of each next input token; the last position has no
next token and is to be ignored). Positions are
cumsum(mask) - 1, so left- or right-padded batches work. Weights are dequantized from the GGUF
(gguf.quants) and stored as float16 initializers with a Cast to float32 in the graph, which
onnxruntime folds at load (about 270 MB on disk). llama.cpp stores Q and K rows permuted for its
rope layout; they are permuted back so that the graph uses Hugging Face's rotate_half RoPE.

Usage: gguf_to_onnx.py MODEL.gguf OUT_DIR   (writes OUT_DIR/model.onnx)
"""
import os, sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from gguf_weights import load, meta, unpermute


def main():
    path, out = sys.argv[1], sys.argv[2]
    r, W = load(path)
    n_layer = int(meta(r, "llama.block_count"))
    d = int(meta(r, "llama.embedding_length"))
    n_head = int(meta(r, "llama.attention.head_count"))
    n_kv = int(meta(r, "llama.attention.head_count_kv"))
    eps = float(meta(r, "llama.attention.layer_norm_rms_epsilon"))
    theta = float(meta(r, "llama.rope.freq_base"))
    ctx = int(meta(r, "llama.context_length"))
    hd = d // n_head
    vocab = W["token_embd.weight"].shape[0]
    print(f"llama: {n_layer} layers, d={d}, heads={n_head}/{n_kv}, hd={hd}, vocab={vocab}, eps={eps}, "
          f"theta={theta}", file=sys.stderr)

    nodes, inits = [], []
    counter = [0]

    def name(p):
        counter[0] += 1
        return f"{p}_{counter[0]}"

    store_fp16 = os.environ.get("GOODPUT_ONNX_FP32") != "1"

    def init(n, arr, fp16=True):
        if fp16 and store_fp16 and arr.dtype == np.float32:
            inits.append(numpy_helper.from_array(arr.astype(np.float16), n + "_f16"))
            nodes.append(helper.make_node("Cast", [n + "_f16"], [n], to=TensorProto.FLOAT))
        else:
            inits.append(numpy_helper.from_array(arr, n))
        return n

    def op(kind, inputs, **attrs):
        o = name(kind)
        nodes.append(helper.make_node(kind, inputs, [o], **attrs))
        return o

    const = lambda n, v: init(n, np.array(v), fp16=False)
    eps_c = const("eps", np.float32(eps))
    one_i = const("one_i64", np.int64(1))
    zero_i = const("zero_i64", np.int64(0))

    def rms(x, w):
        ms = op("ReduceMean", [op("Mul", [x, x])], axes=[-1], keepdims=1)
        return op("Mul", [op("Div", [x, op("Sqrt", [op("Add", [ms, eps_c])])]), w])

    def linear(x, wname, w):
        return op("MatMul", [x, init(wname, np.ascontiguousarray(w.T))])

    emb = init("embed", W["token_embd.weight"])
    x = op("Gather", [emb, "input_ids"], axis=0)
    # positions = max(cumsum(mask) - 1, 0)
    pos = op("Max", [op("Sub", [op("CumSum", ["attention_mask", one_i]), one_i]), zero_i])
    inv = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    freqs = np.outer(np.arange(ctx, dtype=np.float64), inv)
    embp = np.concatenate([freqs, freqs], axis=1)
    cos_t = init("cos_table", np.cos(embp).astype(np.float32), fp16=False)
    sin_t = init("sin_table", np.sin(embp).astype(np.float32), fp16=False)
    ax1 = const("axes1", np.array([1], dtype=np.int64))
    cos = op("Unsqueeze", [op("Gather", [cos_t, pos], axis=0), ax1])  # [B,1,S,hd]
    sin = op("Unsqueeze", [op("Gather", [sin_t, pos], axis=0), ax1])
    # additive mask [B,1,S,S]: causal and key padding
    s_len = op("Gather", [op("Shape", ["input_ids"]), one_i], axis=0)
    ss = op("Concat", [op("Unsqueeze", [s_len, const("axes0", np.array([0], dtype=np.int64))])] * 2, axis=0)
    tril = op("Trilu", [op("ConstantOfShape", [ss], value=numpy_helper.from_array(np.array([1.0], dtype=np.float32)))], upper=0)
    keym = op("Unsqueeze", [op("Cast", ["attention_mask"], to=TensorProto.FLOAT), const("axes12", np.array([1, 2], dtype=np.int64))])
    allowed = op("Mul", [tril, keym])
    bias = op("Mul", [op("Sub", [allowed, const("onef", np.float32(1.0))]), const("big", np.float32(1e9))])
    scale = const("scale", np.float32(1.0 / np.sqrt(hd)))
    half = hd // 2
    sh = lambda v: const(name("shape"), np.array(v, dtype=np.int64))
    neg1 = const("neg1", np.float32(-1.0))

    def rope(t):
        x1 = op("Slice", [t, sh([0]), sh([half]), sh([-1])])
        x2 = op("Slice", [t, sh([half]), sh([hd]), sh([-1])])
        rot = op("Concat", [op("Mul", [x2, neg1]), x1], axis=-1)
        return op("Add", [op("Mul", [t, cos]), op("Mul", [rot, sin])])

    def heads(t, n):  # [B,S,n*hd] -> [B,n,S,hd]
        return op("Transpose", [op("Reshape", [t, sh([0, 0, n, hd])])], perm=[0, 2, 1, 3])

    for i in range(n_layer):
        p = f"blk.{i}."
        h = rms(x, init(p + "attn_norm", W[p + "attn_norm.weight"]))
        q = heads(linear(h, p + "wq", unpermute(W[p + "attn_q.weight"], n_head, hd)), n_head)
        k = heads(linear(h, p + "wk", unpermute(W[p + "attn_k.weight"], n_kv, hd)), n_kv)
        v = heads(linear(h, p + "wv", W[p + "attn_v.weight"]), n_kv)
        q, k = rope(q), rope(k)
        if n_kv != n_head:  # grouped-query attention: repeat each KV head
            rep = sh([1, 1, n_head // n_kv, 1, 1])
            k = op("Reshape", [op("Tile", [op("Unsqueeze", [k, sh([2])]), rep]), sh([0, n_head, -1, hd])])
            v = op("Reshape", [op("Tile", [op("Unsqueeze", [v, sh([2])]), rep]), sh([0, n_head, -1, hd])])
        scores = op("Add", [op("Mul", [op("MatMul", [q, op("Transpose", [k], perm=[0, 1, 3, 2])]), scale]), bias])
        att = op("MatMul", [op("Softmax", [scores], axis=-1), v])
        att = op("Reshape", [op("Transpose", [att], perm=[0, 2, 1, 3]), sh([0, 0, d])])
        x = op("Add", [x, linear(att, p + "wo", W[p + "attn_output.weight"])])
        h = rms(x, init(p + "ffn_norm", W[p + "ffn_norm.weight"]))
        g = linear(h, p + "wg", W[p + "ffn_gate.weight"])
        u = linear(h, p + "wu", W[p + "ffn_up.weight"])
        act = op("Mul", [op("Mul", [g, op("Sigmoid", [g])]), u])
        x = op("Add", [x, linear(act, p + "wd", W[p + "ffn_down.weight"])])
    x = rms(x, init("output_norm", W["output_norm.weight"]))
    if "output.weight" in W:
        head_t = init("lm_head", np.ascontiguousarray(W["output.weight"].T))
    else:  # tied embeddings: reuse the table (onnxruntime folds the Transpose at load)
        head_t = op("Transpose", [emb], perm=[1, 0])
    nodes.append(helper.make_node("MatMul", [x, head_t], ["logits"]))
    # token_logprobs[b, s] = log p(input_ids[b, s+1] | ids[b, :s+1]); the last position is padding.
    # Computing it in the graph spares callers the [B,S,V] logits copy (49152 floats a token).
    lse = op("ReduceLogSumExp", ["logits"], axes=[-1], keepdims=1)
    nxt = op("Slice", ["input_ids", sh([1]), sh([2**62]), sh([1])])
    nxt = op("Pad", [nxt, sh([0, 0, 0, 1])], mode="constant")
    picked = op("GatherElements", ["logits", op("Unsqueeze", [nxt, sh([-1])])], axis=2)
    nodes.append(helper.make_node("Squeeze", [op("Sub", [picked, lse]), sh([-1])], ["token_logprobs"]))

    graph = helper.make_graph(
        nodes, "llama",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", vocab]),
         helper.make_tensor_value_info("token_logprobs", TensorProto.FLOAT, ["batch", "seq"])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="goodput")
    model.ir_version = 8
    os.makedirs(out, exist_ok=True)
    dst = os.path.join(out, "model.onnx")
    onnx.save_model(model, dst + ".part")
    os.replace(dst + ".part", dst)
    print(f"wrote {dst} ({os.path.getsize(dst) / 1e6:.0f} MB)", file=sys.stderr)


if __name__ == "__main__":
    main()
