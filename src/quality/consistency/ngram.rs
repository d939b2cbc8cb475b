//! SelfCheck-Unigram: a unigram model trained on the response and its re-samples scores each
//! response sentence by the average and the maximum of -log p over its tokens (SelfCheckGPT's
//! `SelfCheckNgram(n=1)`, no smoothing, lower-cased). Sentences that the samples do not repeat
//! score high.

use std::collections::HashMap;

use super::text::tokenize;

#[derive(Debug, Clone, PartialEq)]
pub struct NgramScores {
    /// Per response sentence: mean of -log p.
    pub avg_neg_logprob: Vec<f64>,
    /// Per response sentence: max of -log p.
    pub max_neg_logprob: Vec<f64>,
    /// Over all tokens of all sentences.
    pub doc_avg_neg_logprob: f64,
    /// Mean over sentences of the per-sentence max.
    pub doc_avg_max_neg_logprob: f64,
}

pub fn score(sentences: &[&str], passage: &str, samples: &[&str]) -> NgramScores {
    let mut counts: HashMap<String, u64> = HashMap::new();
    let mut total = 0u64;
    for text in std::iter::once(passage).chain(samples.iter().copied()) {
        for t in tokenize(text) {
            *counts.entry(t.to_lowercase()).or_default() += 1;
            total += 1;
        }
    }
    let logp = |t: &str| -> f64 {
        let c = counts.get(&t.to_lowercase()).copied().unwrap_or(0);
        // Unseen tokens have probability 0 (no smoothing, as the reference): -log p = inf.
        (c as f64 / total.max(1) as f64).ln()
    };
    let (mut avg, mut max, mut all) = (Vec::new(), Vec::new(), Vec::new());
    for s in sentences {
        let lps: Vec<f64> = tokenize(s).into_iter().map(logp).collect();
        if lps.is_empty() {
            avg.push(f64::NAN);
            max.push(f64::NAN);
            continue;
        }
        avg.push(-lps.iter().sum::<f64>() / lps.len() as f64);
        max.push(-lps.iter().copied().fold(f64::INFINITY, f64::min));
        all.extend(lps);
    }
    let mean = |v: &[f64]| if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
    NgramScores {
        doc_avg_neg_logprob: -mean(&all),
        doc_avg_max_neg_logprob: mean(&max),
        avg_neg_logprob: avg,
        max_neg_logprob: max,
    }
}

/// A sentence's unigram score as a number in [0, 1]: 1 - the geometric-mean token probability.
pub fn bounded(avg_neg_logprob: f64) -> f64 {
    if avg_neg_logprob.is_nan() { f64::NAN } else { 1.0 - (-avg_neg_logprob).exp() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Equal to the reference implementation (PyPI selfcheckgpt 0.1.7) on the same inputs; its
    /// outputs were stored by scripts/reference/make-selfcheck-fixtures.sh.
    #[test]
    fn equals_selfcheckgpt_on_fixtures() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/selfcheck");
        let read = |f: &str| -> serde_json::Value {
            serde_json::from_slice(&std::fs::read(dir.join(f)).unwrap()).unwrap()
        };
        let (cases, expected) = (read("unigram_cases.json"), read("unigram_expected.json"));
        let strs = |v: &serde_json::Value| -> Vec<String> {
            v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect()
        };
        for (c, e) in cases.as_array().unwrap().iter().zip(expected.as_array().unwrap()) {
            let sents = strs(&c["sentences"]);
            let samples = strs(&c["samples"]);
            let passage = c["passage"].as_str().unwrap();
            // Our splitter finds the sentences the fixture names.
            assert_eq!(super::super::text::sentences(passage), sents);
            for (s, toks) in sents.iter().zip(e["tokens"].as_array().unwrap()) {
                assert_eq!(tokenize(s), strs(toks), "tokens of {s:?}");
            }
            let sr: Vec<&str> = sents.iter().map(String::as_str).collect();
            let smp: Vec<&str> = samples.iter().map(String::as_str).collect();
            let got = score(&sr, passage, &smp);
            let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
            for (k, ours) in
                [("avg_neg_logprob", &got.avg_neg_logprob), ("max_neg_logprob", &got.max_neg_logprob)]
            {
                let theirs: Vec<f64> = e[k].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
                assert_eq!(ours.len(), theirs.len());
                assert!(ours.iter().zip(&theirs).all(|(a, b)| close(*a, *b)), "{k}: {ours:?} vs {theirs:?}");
            }
            assert!(close(got.doc_avg_neg_logprob, e["doc_avg_neg_logprob"].as_f64().unwrap()));
            assert!(close(got.doc_avg_max_neg_logprob, e["doc_avg_max_neg_logprob"].as_f64().unwrap()));
        }
    }

    #[test]
    fn repeated_sentences_score_lower() {
        let passage = "Paris is the capital of France. The moon is made of cheese.";
        let samples = ["Paris is the capital of France.", "The capital of France is Paris. It is large."];
        let sents = ["Paris is the capital of France.", "The moon is made of cheese."];
        let s = score(&sents, passage, &samples);
        assert!(s.avg_neg_logprob[0] < s.avg_neg_logprob[1], "{s:?}");
        assert!(s.max_neg_logprob[0] < s.max_neg_logprob[1]);
        // By hand: 14 + 7 + 11 = 32 tokens in all; "cheese" appears once.
        let total = 32.0f64;
        let cheese = -(1.0 / total).ln();
        assert!((s.max_neg_logprob[1] - cheese).abs() < 1e-12);
        assert!(bounded(s.avg_neg_logprob[0]) > 0.0 && bounded(s.avg_neg_logprob[0]) < 1.0);
    }
}
