//! Sentence embeddings (all-MiniLM-L6-v2 converted to ONNX by the project's own script, run with
//! ort) against sentence-transformers' own output, and consistency's `embedding` method behind
//! the proxy.

use crate::common::*;
use goodput::quality::embed::{Embedder, cosine};
use std::path::PathBuf;

fn dirs() -> (PathBuf, PathBuf) {
    let get = |k: &str| {
        std::env::var_os(k).map(PathBuf::from).unwrap_or_else(|| {
            panic!("{k} is not set: run the suite with scripts/test.sh (it runs scripts/setup-embeddings.sh)")
        })
    };
    (get("GOODPUT_EMBED_DIR"), get("ORT_DYLIB_PATH"))
}

/// Sentences and sentence-transformers' embeddings of them (scripts/reference/make-embedding-fixtures.sh).
fn fixture() -> serde_json::Value {
    serde_json::from_slice(&std::fs::read("tests/fixtures/minilm_embeddings.json").unwrap()).unwrap()
}

#[test]
fn embeddings_equal_sentence_transformers() {
    let (dir, ort) = dirs();
    let fx: serde_json::Value =
        serde_json::from_slice(&std::fs::read("tests/fixtures/minilm_embeddings.json").unwrap()).unwrap();
    let sentences: Vec<&str> =
        fx["sentences"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    let mut e = Embedder::load(&dir, Some(&ort), 2).unwrap();
    // One batch, padded to its longest sentence, as sentence-transformers encodes it.
    let ours = e.embed(&sentences).unwrap();
    for (i, (row, theirs)) in ours.iter().zip(fx["embeddings"].as_array().unwrap()).enumerate() {
        let theirs: Vec<f64> = theirs.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert_eq!(row.len(), theirs.len());
        let worst = row.iter().zip(&theirs).map(|(a, b)| (f64::from(*a) - b).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-5, "sentence {i} {:?}: max abs diff {worst}", sentences[i]);
    }
    // Alone (no padding) gives the same vector as in the batch.
    let alone = e.embed(&sentences[7..8]).unwrap();
    assert!(cosine(&alone[0], &ours[7]) > 0.99999);
}

#[test]
fn paraphrases_are_close_and_unrelated_sentences_are_not() {
    let (dir, ort) = dirs();
    // The fixture's sentences: 0/1 and 2/3 are paraphrases; 4 and 5 are about other things.
    let fx = fixture();
    let sentences: Vec<&str> =
        fx["sentences"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    let mut e = Embedder::load(&dir, Some(&ort), 2).unwrap();
    let v = e.embed(&sentences[..6]).unwrap();
    for (a, b) in [(0, 1), (2, 3)] {
        assert!(cosine(&v[a], &v[b]) > 0.8, "paraphrases {a},{b}: {}", cosine(&v[a], &v[b]));
    }
    for (a, b) in [(0, 4), (2, 5), (4, 5), (0, 5)] {
        assert!(cosine(&v[a], &v[b]) < 0.2, "unrelated {a},{b}: {}", cosine(&v[a], &v[b]));
    }
    for x in &v {
        assert!((cosine(x, x) - 1.0).abs() < 1e-5, "unit length");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedding_method_scores_checks_behind_the_proxy() {
    let (dir, ort) = dirs();
    let (sim, _) = spawn_sim(0.0, 0.0, 24).await;
    let gp = Goodput::start(&format!(
        "backends:\n  - name: sim\n    url: http://{sim}\n    models: [sim-model]\n\
         quality:\n  max_cpu: 8\n  consistency:\n    sample_rate: 1.0\n    max_token_share: 100.0\n    methods: [embedding]\n\
         \x20   embedding_model_dir: {}\n    onnxruntime: {}\n",
        dir.display(),
        ort.display()
    ));
    let body = serde_json::json!({"model": "sim-model", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "Tell me about the tower."}]})
    .to_string();
    assert_eq!(send(gp.proxy, post_json("/v1/chat/completions", &body)).await.status, 200);
    let recs = gp.scored_when(1, "checked", |r| !r[0]["hallucination_score"].is_null()).await;
    let rec = &recs[0];
    // The simulator's word salad at temperature 1 shares little with its other samples.
    let s = rec["hallucination_score"].as_f64().unwrap();
    assert!(s > 0.0 && s <= 1.0, "{rec}");
    let text = gp.metrics().await;
    assert_eq!(metric(&text, "goodput_consistency_score_count", &[("method", "embedding")]), 1.0);
}
