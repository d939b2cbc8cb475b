//! Perplexity arithmetic, as lm-evaluation-harness computes it: rolling windows over a long
//! text, and corpus-level token, word and byte perplexities from summed log-likelihoods. Pure.

use serde::Serialize;

/// One model call of a rolling evaluation: the model reads `ids[input.0 .. input.1]` (indices
/// into `[prefix] ++ tokens`) and the log-probabilities of its last `predicted` next tokens count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub input: (usize, usize),
    pub predicted: usize,
}

/// Disjoint windows covering `n_tokens` tokens, each predicting at most `max_length` of them:
/// the first is conditioned on the prefix (BOS) token alone, each later one on the last token of
/// the window before (lm-evaluation-harness's `get_rolling_token_windows` with context_len 1).
/// Indices are into `[prefix] ++ tokens`; a window reads `predicted + 1` positions, the last of
/// which is only a target (a causal model's earlier outputs do not depend on it).
pub fn rolling_windows(n_tokens: usize, max_length: usize) -> Vec<Window> {
    let max_length = max_length.max(1);
    let mut out = Vec::with_capacity(n_tokens.div_ceil(max_length));
    let mut start = 0;
    while start < n_tokens {
        let predicted = max_length.min(n_tokens - start);
        // Predicting tokens[start..start+predicted] = seq[start+1 ..= start+predicted].
        out.push(Window { input: (start, start + predicted + 1), predicted });
        start += predicted;
    }
    out
}

/// Summed log-likelihood over a text, and the units to normalise it by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Totals {
    pub log_likelihood: f64,
    pub tokens: u64,
    pub words: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Perplexities {
    pub tokens: u64,
    pub words: u64,
    pub bytes: u64,
    pub log_likelihood: f64,
    pub token_perplexity: f64,
    pub word_perplexity: f64,
    pub byte_perplexity: f64,
    pub bits_per_byte: f64,
}

impl Totals {
    /// Words are the whitespace split of the text (lm-evaluation-harness's wikitext count);
    /// bytes are its UTF-8 length.
    pub fn for_text(text: &str) -> Totals {
        Totals {
            words: text.split_whitespace().count() as u64,
            bytes: text.len() as u64,
            ..Default::default()
        }
    }

    pub fn add_logprobs(&mut self, lps: &[f32]) {
        self.log_likelihood += lps.iter().map(|&l| f64::from(l)).sum::<f64>();
        self.tokens += lps.len() as u64;
    }

    pub fn merge(&mut self, o: &Totals) {
        self.log_likelihood += o.log_likelihood;
        self.tokens += o.tokens;
        self.words += o.words;
        self.bytes += o.bytes;
    }

    pub fn perplexities(&self) -> Perplexities {
        let nll = -self.log_likelihood;
        let per = |n: u64| if n == 0 { f64::NAN } else { nll / n as f64 };
        Perplexities {
            tokens: self.tokens,
            words: self.words,
            bytes: self.bytes,
            log_likelihood: self.log_likelihood,
            token_perplexity: per(self.tokens).exp(),
            word_perplexity: per(self.words).exp(),
            byte_perplexity: per(self.bytes).exp(),
            bits_per_byte: per(self.bytes) / std::f64::consts::LN_2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_every_token_once() {
        for n in 0..40 {
            for max in 1..9 {
                let ws = rolling_windows(n, max);
                let total: usize = ws.iter().map(|w| w.predicted).sum();
                assert_eq!(total, n);
                let mut next = 1; // seq index of the next token to predict
                for w in &ws {
                    assert!(w.predicted <= max);
                    assert_eq!(w.input.1 - w.input.0, w.predicted + 1);
                    assert_eq!(w.input.0 + 1, next, "conditioned on the token just before");
                    next = w.input.1;
                }
            }
        }
        assert_eq!(
            rolling_windows(5, 2),
            vec![
                Window { input: (0, 3), predicted: 2 },
                Window { input: (2, 5), predicted: 2 },
                Window { input: (4, 6), predicted: 1 }
            ]
        );
    }

    #[test]
    fn corpus_metrics() {
        let mut t = Totals::for_text("héllo big world");
        assert_eq!((t.words, t.bytes), (3, 16));
        t.add_logprobs(&[-1.0, -2.0, -3.0, -2.0]);
        let p = t.perplexities();
        assert!((p.token_perplexity - 2f64.exp()).abs() < 1e-9);
        assert!((p.word_perplexity - (8.0f64 / 3.0).exp()).abs() < 1e-9);
        assert!((p.byte_perplexity - 0.5f64.exp()).abs() < 1e-9);
        assert!((p.bits_per_byte - 0.5 / std::f64::consts::LN_2).abs() < 1e-9);
    }
}
