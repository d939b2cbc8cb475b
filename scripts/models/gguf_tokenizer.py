#!/usr/bin/env python3
"""Build a Hugging Face tokenizer.json (and the chat template) from a GGUF file.

The GGUF holds the BPE vocabulary, merges, token types and special token ids. For SmolLM2
(llama.cpp pre-tokenizer "smollm") the pre-tokenizer is GPT-2 ByteLevel preceded by splitting
every digit on its own (Digits, individual_digits). Control and user-defined tokens become
added (special) tokens, so that text containing "<|im_start|>" tokenizes as llama.cpp does.

Usage: gguf_tokenizer.py MODEL.gguf OUT_DIR
Writes OUT_DIR/tokenizer.json and OUT_DIR/chat_template.jinja.
"""
import json, os, sys

from gguf import GGUFReader


def field(reader, name, default=None):
    f = reader.fields.get(name)
    if f is None:
        return default
    if hasattr(f, "contents"):
        return f.contents()
    # older gguf: decode by hand
    vals = [f.parts[i] for i in f.data]
    if len(vals) == 1 and name not in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
        v = vals[0]
        return bytes(v).decode("utf-8") if v.dtype.kind == "u" and v.dtype.itemsize == 1 else v.tolist()[0]
    return [bytes(v).decode("utf-8") if v.dtype.kind == "u" and v.dtype.itemsize == 1 else v.tolist()[0] for v in vals]


def main():
    gguf_path, out = sys.argv[1], sys.argv[2]
    r = GGUFReader(gguf_path)
    model = field(r, "tokenizer.ggml.model")
    pre = field(r, "tokenizer.ggml.pre")
    if model != "gpt2":
        sys.exit(f"unsupported tokenizer model {model!r} (only BPE 'gpt2' is)")
    tokens = field(r, "tokenizer.ggml.tokens")
    merges = field(r, "tokenizer.ggml.merges")
    types = field(r, "tokenizer.ggml.token_type")
    template = field(r, "tokenizer.chat_template")
    pretok = [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]
    if pre in ("smollm", "starcoder", "refact", "qwen2"):
        pretok.insert(0, {"type": "Digits", "individual_digits": True})
    elif pre not in ("gpt-2", "default", None):
        print(f"warning: pre-tokenizer {pre!r} approximated as GPT-2 ByteLevel", file=sys.stderr)
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (3, 4)
    ]
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pretok},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": merges,
        },
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    if template:
        with open(os.path.join(out, "chat_template.jinja"), "w") as f:
            f.write(template)
    meta = {k: field(r, k) for k in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                     "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token")}
    with open(os.path.join(out, "special_tokens.json"), "w") as f:
        json.dump({k.split(".")[-1]: v for k, v in meta.items()}, f)
    print(f"{len(tokens)} tokens, {len(merges)} merges, {len(added)} special, pre={pre}", file=sys.stderr)


if __name__ == "__main__":
    main()
