#!/usr/bin/env python3
"""Convert a Llama-architecture GGUF (SmolLM2-135M-Instruct) to Hugging Face format for vLLM,
without torch: model.safetensors (float32, dequantized by gguf.quants), config.json,
generation_config.json, and the tokenizer files that scripts/models/gguf_tokenizer.py built
(tokenizer.json, the chat template) with a tokenizer_config.json naming the special tokens.

llama.cpp stores the Q and K projections with their rows permuted for its rope layout; they are
permuted back (as gguf_to_onnx.py does), so that Hugging Face's rotate_half RoPE applies.

With --requantize BITS, every linear layer's weights are quantized again, coarser: blocks of
32 along each row, symmetric, round to nearest, BITS bits (embeddings and norms kept). That is
a damaged copy of the same model, as a bad quantization makes one (scripts/run-vllm-degraded.sh).

Usage: gguf_to_hf.py MODEL.gguf TOKENIZER_DIR OUT_DIR [--requantize BITS]
"""
import json, os, shutil, sys

import numpy as np
from safetensors.numpy import save_file

from gguf_weights import load, meta, unpermute


def requantize(w, bits, block=32):
    """w quantized to `bits` bits per weight in row blocks of `block` (symmetric absmax), back
    in float32."""
    rows, cols = w.shape
    assert cols % block == 0, (w.shape, block)
    b = w.astype(np.float32).reshape(rows, cols // block, block)
    levels = 2 ** (bits - 1) - 1
    scale = np.abs(b).max(axis=2, keepdims=True) / levels
    scale[scale == 0] = 1.0
    return (np.clip(np.round(b / scale), -levels, levels) * scale).reshape(rows, cols).astype(np.float32)


def main():
    args = sys.argv[1:]
    bits = None
    if "--requantize" in args:
        i = args.index("--requantize")
        bits = int(args[i + 1])
        if not 2 <= bits <= 8:
            sys.exit("--requantize takes 2 to 8 bits")
        del args[i:i + 2]
    path, tokdir, out = args[0], args[1], args[2]
    r, W = load(path)
    n_layer = int(meta(r, "llama.block_count"))
    d = int(meta(r, "llama.embedding_length"))
    n_head = int(meta(r, "llama.attention.head_count"))
    n_kv = int(meta(r, "llama.attention.head_count_kv"))
    hd = d // n_head
    hf = {"model.embed_tokens.weight": W["token_embd.weight"], "model.norm.weight": W["output_norm.weight"]}
    tied = "output.weight" not in W
    if not tied:
        hf["lm_head.weight"] = W["output.weight"]
    names = {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
        "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    }
    for i in range(n_layer):
        p, q = f"blk.{i}.", f"model.layers.{i}."
        hf[q + "self_attn.q_proj.weight"] = unpermute(W[p + "attn_q.weight"], n_head, hd)
        hf[q + "self_attn.k_proj.weight"] = unpermute(W[p + "attn_k.weight"], n_kv, hd)
        for g, h in names.items():
            hf[q + h + ".weight"] = W[p + g + ".weight"]
        if bits is not None:
            for k in [k for k in hf if k.startswith(q) and k.endswith("proj.weight")]:
                hf[k] = requantize(hf[k], bits)
    os.makedirs(out, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in hf.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})

    special = json.load(open(os.path.join(tokdir, "special_tokens.json")))
    tokens = meta(r, "tokenizer.ggml.tokens")
    bos, eos = special["bos_token_id"], special["eos_token_id"]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": d,
        "intermediate_size": int(W["blk.0.ffn_gate.weight"].shape[0]),
        "num_hidden_layers": n_layer,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": hd,
        "hidden_act": "silu",
        "rms_norm_eps": float(meta(r, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta(r, "llama.rope.freq_base")),
        "max_position_embeddings": int(meta(r, "llama.context_length")),
        "vocab_size": int(W["token_embd.weight"].shape[0]),
        "tie_word_embeddings": tied,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": special.get("padding_token_id", eos),
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
    }
    json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
    json.dump({"bos_token_id": bos, "eos_token_id": eos}, open(os.path.join(out, "generation_config.json"), "w"))
    shutil.copy(os.path.join(tokdir, "tokenizer.json"), os.path.join(out, "tokenizer.json"))
    template = open(os.path.join(tokdir, "chat_template.jinja")).read()
    json.dump({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokens[bos], "eos_token": tokens[eos], "pad_token": tokens[special.get("padding_token_id", eos)],
        "add_bos_token": bool(special.get("add_bos_token", False)),
        "model_max_length": config["max_position_embeddings"],
        "chat_template": template,
    }, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)
    print(f"wrote {out}: {len(hf)} tensors, tied embeddings: {tied}", file=sys.stderr)


if __name__ == "__main__":
    main()
