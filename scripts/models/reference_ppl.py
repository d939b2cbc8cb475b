#!/usr/bin/env python3
"""Independent references for a converted ONNX causal LM, on one text file.

Prints one JSON object:
  ids            llama.cpp's tokenization of the text (no special tokens), to compare with ours
  ppl_llama_cpp  perplexity from llama-cpp-python's logits (f32 KV cache)
  ppl_server     perplexity from llama.cpp's OpenAI server: /v1/completions with echo, logprobs=1,
                 max_tokens=1 (only with --server)
  ppl_onnx       perplexity from Python onnxruntime on model.onnx (its token_logprobs output)
  logprobs_max_abs_diff  token_logprobs vs log_softmax(logits) in numpy
  padded_batch_max_abs_diff  a left-padded row vs the same row alone
Every perplexity is over the text's tokens, each conditioned on <|im_start|> (the model's BOS:
SmolLM2 adds none, and without it the first token has no context and the logprobs shift by one).

Usage: reference_ppl.py MODEL.gguf ONNX_DIR TEXT_FILE [--server PYTHON]
  (PYTHON: an interpreter with llama-cpp-python[server], e.g. the venv of scripts/setup-llm.sh)
"""
import json, math, os, socket, subprocess, sys, time, urllib.error, urllib.request

import numpy as np
import onnxruntime as ort
from llama_cpp import Llama

gguf, onnx_dir, text_file = sys.argv[1:4]
server_python = sys.argv[5] if len(sys.argv) > 5 and sys.argv[4] == "--server" else None
text = open(text_file, encoding="utf-8").read()
PREFIX = "<|im_start|>"

llm = Llama(model_path=gguf, n_ctx=2048, logits_all=True, verbose=False, n_threads=2,
            type_k=0, type_v=0)  # f32 KV cache: one approximation less on the reference side
ids = llm.tokenize(text.encode(), add_bos=False, special=False)
full = llm.tokenize(PREFIX.encode(), add_bos=False, special=True) + ids
llm.reset()
llm.eval(full)
ref = np.array(llm.scores[: len(full)], dtype=np.float64)


def log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def ppl_from_logits(logits, seq):
    lp = log_softmax(logits[:-1])[np.arange(len(seq) - 1), seq[1:]]
    return float(np.exp(-lp.mean()))


out = {"tokens": len(ids), "ids": ids, "ppl_llama_cpp": ppl_from_logits(ref, full)}

sess = ort.InferenceSession(os.path.join(onnx_dir, "model.onnx"), providers=["CPUExecutionProvider"])
x = np.array([full], dtype=np.int64)
logits, tlp = sess.run(["logits", "token_logprobs"], {"input_ids": x, "attention_mask": np.ones_like(x)})
out["ppl_onnx"] = float(np.exp(-tlp[0, :-1].astype(np.float64).mean()))
numpy_lp = log_softmax(logits[0, :-1].astype(np.float64))[np.arange(len(full) - 1), full[1:]]
out["logprobs_max_abs_diff"] = float(np.abs(numpy_lp - tlp[0, :-1]).max())
short = full[:20]
pad = len(full) - len(short)
b_ids = np.array([full, [0] * pad + short], dtype=np.int64)
b_mask = np.array([[1] * len(full), [0] * pad + [1] * len(short)], dtype=np.int64)
b_tlp = sess.run(["token_logprobs"], {"input_ids": b_ids, "attention_mask": b_mask})[0]
alone = sess.run(["token_logprobs"], {"input_ids": np.array([short], dtype=np.int64),
                                       "attention_mask": np.ones((1, len(short)), dtype=np.int64)})[0][0]
out["padded_batch_max_abs_diff"] = float(np.abs(b_tlp[1, pad:-1] - alone[:-1]).max())

if server_python:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [server_python, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "2048", "--n_threads", "2", "--type_k", "0", "--type_v", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        body = json.dumps({"prompt": PREFIX + text, "echo": True, "logprobs": 1, "max_tokens": 1,
                           "temperature": 0}).encode()
        for _ in range(600):
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                             {"Content-Type": "application/json"})
                resp = json.load(urllib.request.urlopen(req, timeout=120))
                break
            except urllib.error.HTTPError as e:
                sys.exit(f"llama.cpp server: {e.code} {e.read()[:500]!r}")
            except OSError:
                if server.poll() is not None:
                    sys.exit("llama.cpp server exited")
                time.sleep(0.1)
        else:
            sys.exit("llama.cpp server did not answer")
        lps = resp["choices"][0]["logprobs"]["token_logprobs"]
        # The server drops the leading BOS (<|im_start|>), lists one logprob per text token, then
        # the generated token, and nulls the first entry (OpenAI's convention): so the server
        # scores text tokens 1.. and the ONNX figure to compare is over the same tokens.
        scored = lps[1: len(ids)]
        assert None not in scored and len(scored) == len(ids) - 1, "unexpected echo layout"
        out["ppl_server"] = float(math.exp(-sum(scored) / len(scored)))
        out["ppl_onnx_server_tokens"] = float(np.exp(-tlp[0, 1:-1].astype(np.float64).mean()))
    finally:
        server.terminate()
        server.wait()
print(json.dumps(out))
