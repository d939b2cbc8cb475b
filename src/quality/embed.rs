//! Sentence embeddings for consistency's `embedding` method: an ONNX sentence encoder (by default
//! all-MiniLM-L6-v2, made by scripts/setup-embeddings.sh) with its tokenizer.json, run with ONNX
//! Runtime. Output: unit-length vectors, so a dot product is the cosine similarity.

use ort::session::Session;
use ort::value::Tensor;
use std::path::Path;
use tokenizers::Tokenizer;

use super::lm::{LmError, environment, session_builder};

pub struct Embedder {
    session: Session,
    tokenizer: Tokenizer,
    has_token_types: bool,
    intra_op_threads: usize,
}

impl Embedder {
    /// `dir` holds model.onnx (inputs input_ids, attention_mask[, token_type_ids]; output
    /// `sentence_embedding`) and tokenizer.json (padding to the longest of a batch).
    pub fn load(
        dir: &Path,
        onnxruntime: Option<&Path>,
        intra_op_threads: usize,
    ) -> Result<Embedder, LmError> {
        let env = environment(onnxruntime)?;
        let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| LmError(format!("cannot load {}/tokenizer.json: {e}", dir.display())))?;
        let model = dir.join("model.onnx");
        let session = session_builder(env, intra_op_threads)?
            .commit_from_file(&model)
            .map_err(|e| LmError(format!("cannot load {}: {e}", model.display())))?;
        if !session.outputs().iter().any(|o| o.name() == "sentence_embedding") {
            return Err(LmError(format!("{}: no `sentence_embedding` output", model.display())));
        }
        let has_token_types = session.inputs().iter().any(|i| i.name() == "token_type_ids");
        Ok(Embedder { session, tokenizer, has_token_types, intra_op_threads })
    }

    pub fn intra_op_threads(&self) -> usize {
        self.intra_op_threads
    }

    /// One unit vector per text.
    pub fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, LmError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let encs = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| LmError(format!("tokenizer: {e}")))?;
        let (b, s) = (encs.len(), encs.iter().map(|e| e.len()).max().unwrap_or(0));
        let mut ids = vec![0i64; b * s];
        let mut mask = vec![0i64; b * s];
        let mut types = vec![0i64; b * s];
        for (r, e) in encs.iter().enumerate() {
            for (i, ((&id, &m), &t)) in
                e.get_ids().iter().zip(e.get_attention_mask()).zip(e.get_type_ids()).enumerate()
            {
                ids[r * s + i] = i64::from(id);
                mask[r * s + i] = i64::from(m);
                types[r * s + i] = i64::from(t);
            }
        }
        let shape = [b, s];
        let mut inputs = ort::inputs![
            "input_ids" => Tensor::from_array((shape, ids))?,
            "attention_mask" => Tensor::from_array((shape, mask))?,
        ];
        if self.has_token_types {
            inputs.push(("token_type_ids".into(), Tensor::from_array((shape, types))?.into()));
        }
        let out = self.session.run(inputs)?;
        let (shape, data) = out["sentence_embedding"].try_extract_tensor::<f32>()?;
        let h = shape.get(1).copied().unwrap_or(0) as usize;
        if h == 0 || data.len() != b * h {
            return Err(LmError("sentence_embedding has an unexpected shape".into()));
        }
        Ok(data.chunks(h).map(<[f32]>::to_vec).collect())
    }
}

pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// SelfCheck-BERTScore with sentence embeddings: for each response sentence, its best cosine
/// match among each sample's sentences; the sentence's score is 1 - the mean over samples of that
/// best match (0 = every sample says it, 1 = none does). Vectors are unit length.
pub fn bertscore_like(sentences: &[Vec<f32>], samples: &[Vec<Vec<f32>>]) -> Vec<f64> {
    sentences
        .iter()
        .map(|s| {
            let best: Vec<f64> = samples
                .iter()
                .filter(|sample| !sample.is_empty())
                .map(|sample| {
                    sample.iter().map(|t| f64::from(cosine(s, t))).fold(f64::NEG_INFINITY, f64::max)
                })
                .collect();
            if best.is_empty() {
                f64::NAN
            } else {
                (1.0 - best.iter().sum::<f64>() / best.len() as f64).clamp(0.0, 1.0)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bertscore_like_scores_agreement() {
        let a = vec![1.0, 0.0];
        let b = vec![0.0, 1.0];
        let samples = vec![vec![a.clone(), b.clone()], vec![b.clone()]];
        let s = bertscore_like(&[a.clone(), b.clone()], &samples);
        assert!((s[0] - 0.5).abs() < 1e-9, "a is in one sample of two: {s:?}");
        assert!(s[1].abs() < 1e-9, "b is in both");
        assert!(bertscore_like(&[a], &[vec![]])[0].is_nan());
    }
}
