"""Reading a Llama-architecture GGUF's weights for the converters (gguf_to_onnx.py,
gguf_to_hf.py): metadata, every tensor dequantized to float32 in PyTorch's dimension order,
and the Q/K row order llama.cpp's converter permuted for its RoPE layout, undone."""
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def meta(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    return f.contents() if hasattr(f, "contents") else f.parts[f.data[0]].tolist()[0]


def load(path):
    """The reader and {tensor name: float32 array}; GGUF dims are innermost-first."""
    r = GGUFReader(path)
    if meta(r, "general.architecture") != "llama":
        raise SystemExit(f"unsupported architecture {meta(r, 'general.architecture')!r}")
    w = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float32)
        w[t.name] = a.reshape([int(x) for x in reversed(t.shape)])
    return r, w


def unpermute(w, heads, hd):
    """llama.cpp's convert does w.reshape(heads, 2, hd/2, in).swapaxes(1, 2); undo it, so that
    Hugging Face's rotate_half RoPE applies."""
    return w.reshape(heads, hd // 2, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
