#!/usr/bin/env python3
"""Scoring throughput of the same reference LM in Python onnxruntime and in llama.cpp
(llama-cpp-python on the GGUF it was converted from): tokens/s at batch 1x512 and 8x128.

Usage: scoring.py onnx|llama MODEL (model.onnx's DIR, or the .gguf) [THREADS] [REPS]
Prints one JSON line per shape: the median over REPS runs.
"""
import json, statistics, sys, time


def ids(n, seed):  # the same pseudo-random ids as benches/scoring.rs
    x, out = seed, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 63)
        out.append((x >> 33) % 49000 + 100)
    return out


kind, model = sys.argv[1], sys.argv[2]
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 7
shapes = [(1, 512), (8, 128)]

if kind == "onnx":
    import numpy as np
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(f"{model}/model.onnx", so, providers=["CPUExecutionProvider"])

    def run(rows):
        x = np.array(rows, dtype=np.int64)
        sess.run(["token_logprobs"], {"input_ids": x, "attention_mask": np.ones_like(x)})
    name = "Python onnxruntime"
else:
    from llama_cpp import Llama
    llm = Llama(model_path=model, n_ctx=1024, n_batch=512, logits_all=True, verbose=False,
                n_threads=threads, n_threads_batch=threads)

    def run(rows):
        # llama-cpp-python's API evaluates one sequence at a time: a batch is B evaluations.
        for r in rows:
            llm.reset()
            llm.eval(r)
    name = "llama.cpp (llama-cpp-python)"

for b, s in shapes:
    rows = [ids(s, i + 1) for i in range(b)]
    run(rows)
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        run(rows)
        rates.append(b * s / (time.perf_counter() - t))
    print(json.dumps({"impl": name, "shape": f"{b}x{s}", "threads": threads,
                      "tokens_per_s": round(statistics.median(rates), 1)}), flush=True)
