#!/usr/bin/env python3
"""Check a converted ONNX model against llama.cpp on the same GGUF: perplexity of a fixed
paragraph (must agree within 1%) and, with padding, that a padded batch gives the same logits.

Usage: validate_onnx.py MODEL.gguf ONNX_DIR
"""
import json, sys

import numpy as np
import onnxruntime as ort
from llama_cpp import Llama

PARAGRAPH = (
    "The river flows through the old town, past the market square and the stone bridge that was "
    "built in the fourteenth century. In spring the water rises with melting snow from the "
    "mountains, and the fishermen wait for the first warm days before they take their boats out. "
    "Visitors come to see the cathedral, whose towers can be seen from every hill around the valley."
)

gguf, onnx_dir = sys.argv[1], sys.argv[2]
llm = Llama(model_path=gguf, n_ctx=512, logits_all=True, verbose=False, n_threads=2,
            type_k=0, type_v=0)  # f32 KV cache: one approximation less on the reference side
# SmolLM2 adds no BOS: condition the first token on <|im_start|>, as the server check does.
ids = llm.tokenize(b"<|im_start|>" + PARAGRAPH.encode(), add_bos=False, special=True)
llm.reset()
llm.eval(ids)
ref = np.array(llm.scores[: len(ids)], dtype=np.float64)


def nll(logits, ids):
    lp = logits[:-1] - np.log(np.exp(logits[:-1] - logits[:-1].max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits[:-1].max(-1, keepdims=True)
    return -lp[np.arange(len(ids) - 1), ids[1:]]


sess = ort.InferenceSession(f"{onnx_dir}/model.onnx", providers=["CPUExecutionProvider"])
x = np.array([ids], dtype=np.int64)
out = sess.run(["logits"], {"input_ids": x, "attention_mask": np.ones_like(x)})[0][0].astype(np.float64)
ppl_ref = float(np.exp(nll(ref, ids).mean()))
ppl_onnx = float(np.exp(nll(out, ids).mean()))
# Left-padded batch of two: the shorter row must give the same logits as alone.
short = ids[:20]
pad = len(ids) - len(short)
b_ids = np.array([ids, [0] * pad + short], dtype=np.int64)
b_mask = np.array([[1] * len(ids), [0] * pad + [1] * len(short)], dtype=np.int64)
b_out = sess.run(["logits"], {"input_ids": b_ids, "attention_mask": b_mask})[0]
alone = sess.run(["logits"], {"input_ids": np.array([short], dtype=np.int64),
                              "attention_mask": np.ones((1, len(short)), dtype=np.int64)})[0][0]
pad_err = float(np.abs(b_out[1, pad:] - alone).max())
rel = abs(ppl_onnx - ppl_ref) / ppl_ref
print(json.dumps({"tokens": len(ids), "ppl_llama_cpp": ppl_ref, "ppl_onnx": ppl_onnx, "rel_diff": rel,
                  "padded_batch_max_abs_diff": pad_err}))
sys.exit(0 if rel < 0.01 and pad_err < 1e-3 else 1)
