#!/usr/bin/env python3
"""Fixtures for goodput's SelfCheck-Unigram, produced by the reference implementation: the PyPI
package `selfcheckgpt` (0.1.7), its `SelfCheckNgram(n=1).predict(sentences, passage, samples)`.

The package imports torch, transformers and bert_score at module level for its other methods;
they play no part in the unigram method and are replaced by empty stand-ins here. Its unigram
model calls spacy.load("en_core_web_sm"), which is not on PyPI from spaCy's authors: the blank
English pipeline with the rule-based sentencizer stands in (the same tokenizer; sentence
boundaries only decide where `add` restarts tokenization).

Usage: selfcheck_unigram.py CASES.json > EXPECTED.json
  CASES.json: [{"passage": str, "samples": [str], "sentences": [str]}, ...]
Run by scripts/reference/make-selfcheck-fixtures.sh (a venv with selfcheckgpt, spacy, nltk).
"""
import contextlib, json, sys, types


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _Anything:
    def __call__(self, *a, **k):
        return _Anything()

    def __getattr__(self, name):
        return _Anything()


for mod in ["torch", "bert_score", "transformers"]:
    sys.modules[mod] = _Stub(mod)

import spacy  # noqa: E402

_blank = spacy.blank("en")
_blank.add_pipe("sentencizer")
spacy.load = lambda name, *a, **k: _blank

from selfcheckgpt.modeling_selfcheck import SelfCheckNgram  # noqa: E402

cases = json.load(open(sys.argv[1]))
with contextlib.redirect_stdout(sys.stderr):  # it prints a greeting
    model = SelfCheckNgram(n=1)
out = []
for c in cases:
    r = model.predict(sentences=c["sentences"], passage=c["passage"], sampled_passages=c["samples"])
    out.append({
        "avg_neg_logprob": [float(x) for x in r["sent_level"]["avg_neg_logprob"]],
        "max_neg_logprob": [float(x) for x in r["sent_level"]["max_neg_logprob"]],
        "doc_avg_neg_logprob": float(r["doc_level"]["avg_neg_logprob"]),
        "doc_avg_max_neg_logprob": float(r["doc_level"]["avg_max_neg_logprob"]),
        "tokens": [[t.text for t in _blank(s)] for s in c["sentences"]],
    })
json.dump(out, sys.stdout, indent=1)
print()
