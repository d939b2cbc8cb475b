//! What `goodput bench` sends: fixed prompt and output lengths, or prompts and output lengths
//! taken from a ShareGPT-format JSON file (as `vllm bench serve --dataset-name sharegpt`).

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::Value;
use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    pub prompt: String,
    /// max_tokens asked for.
    pub output_len: u64,
}

#[derive(Debug, Clone)]
pub struct Workload {
    pub inputs: Vec<Input>,
    pub source: String,
}

const WORDS: &[&str] = &[
    "river", "city", "market", "bridge", "morning", "history", "science", "music", "garden", "winter",
    "mountain", "library", "engine", "harbor", "forest", "village", "station", "window", "letter", "island",
];

impl Workload {
    /// `n` prompts of `input_len` words (about as many tokens for these common words), each
    /// different (a numbered preamble defeats prefix caching), asking for `output_len` tokens.
    pub fn fixed(n: usize, input_len: usize, output_len: u64, seed: u64) -> Workload {
        let mut rng = StdRng::seed_from_u64(seed);
        let inputs = (0..n.max(1))
            .map(|i| {
                let mut p = format!("Request {i}:");
                for _ in 0..input_len.saturating_sub(2) {
                    p.push(' ');
                    p.push_str(WORDS[rng.random_range(0..WORDS.len())]);
                }
                Input { prompt: p, output_len }
            })
            .collect();
        Workload { inputs, source: format!("fixed: {input_len} input words, {output_len} output tokens") }
    }

    /// ShareGPT format: a JSON array of `{"conversations": [{"from": "human", "value": ...},
    /// {"from": "gpt", "value": ...}, ...]}`. The first human turn is the prompt; the length of
    /// the answer after it, in words, is the output length (`output_len` overrides it).
    /// Conversations without an answer, or with a prompt or answer under 4 words, are skipped,
    /// as vLLM does. Shuffled with `seed`.
    pub fn sharegpt(path: &Path, output_len: Option<u64>, seed: u64) -> Result<Workload, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let v: Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
        let convs = v
            .as_array()
            .ok_or_else(|| format!("{}: expected a JSON array of conversations", path.display()))?;
        let mut inputs: Vec<Input> = convs
            .iter()
            .filter_map(|c| {
                let turns = c.get("conversations")?.as_array()?;
                let q = turns.iter().position(|t| t.get("from").and_then(Value::as_str) == Some("human"))?;
                let prompt = turns[q].get("value")?.as_str()?;
                let answer = turns.get(q + 1)?.get("value")?.as_str()?;
                let (pw, aw) = (prompt.split_whitespace().count(), answer.split_whitespace().count() as u64);
                (pw >= 4 && aw >= 4)
                    .then(|| Input { prompt: prompt.to_string(), output_len: output_len.unwrap_or(aw) })
            })
            .collect();
        if inputs.is_empty() {
            return Err(format!(
                "{}: no usable conversation (a human turn and an answer, 4 words each)",
                path.display()
            ));
        }
        let mut rng = StdRng::seed_from_u64(seed);
        for i in (1..inputs.len()).rev() {
            inputs.swap(i, rng.random_range(0..=i));
        }
        Ok(Workload {
            source: format!("sharegpt: {} ({} conversations)", path.display(), inputs.len()),
            inputs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_prompts_have_the_length_and_differ() {
        let w = Workload::fixed(3, 50, 128, 1);
        assert_eq!(w.inputs.len(), 3);
        assert!(w.inputs.iter().all(|i| i.prompt.split_whitespace().count() == 50 && i.output_len == 128));
        assert_ne!(w.inputs[0].prompt, w.inputs[1].prompt);
    }

    #[test]
    fn sharegpt_file() {
        let dir = std::env::temp_dir().join(format!("goodput-sharegpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("d.json");
        std::fs::write(
            &f,
            r#"[{"conversations":[{"from":"human","value":"what is the capital of France"},{"from":"gpt","value":"Paris is the capital of France."}]},
                {"conversations":[{"from":"human","value":"hi"},{"from":"gpt","value":"hello there how are you"}]},
                {"conversations":[{"from":"gpt","value":"no question here at all"}]}]"#,
        )
        .unwrap();
        let w = Workload::sharegpt(&f, None, 1).unwrap();
        assert_eq!(w.inputs, vec![Input { prompt: "what is the capital of France".into(), output_len: 6 }]);
        assert_eq!(Workload::sharegpt(&f, Some(32), 1).unwrap().inputs[0].output_len, 32);
        std::fs::write(&f, "[]").unwrap();
        assert!(Workload::sharegpt(&f, None, 1).unwrap_err().contains("no usable conversation"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
