//! `goodput ppl`: the perplexity of text files under a reference LM, computed the way
//! lm-evaluation-harness's wikitext task does (disjoint rolling windows, corpus-level token,
//! word and byte perplexities and bits per byte).

use serde::Serialize;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::lm::{LmAssets, LmError, LmOptions, ReferenceLm};
use super::ppl::{Perplexities, Totals, rolling_windows};

pub struct PplOptions {
    pub model_dir: PathBuf,
    pub lm: LmOptions,
    /// Tokens predicted per model call (the window length).
    pub max_length: usize,
    /// Windows per model call.
    pub batch: usize,
    pub json: bool,
}

#[derive(Serialize)]
struct FileResult<'a> {
    file: &'a str,
    #[serde(flatten)]
    p: Perplexities,
    max_length: usize,
}

pub fn run(opts: &PplOptions, files: &[PathBuf]) -> Result<(), LmError> {
    let assets = Arc::new(LmAssets::load(&opts.model_dir)?);
    let mut lm = ReferenceLm::load(&opts.model_dir, assets, &opts.lm)?;
    let mut all = Totals::default();
    for f in files {
        let t = perplexity_of_file(&mut lm, f, opts)?;
        all.merge(&t);
        let p = t.perplexities();
        let name = f.display().to_string();
        if opts.json {
            let line = serde_json::to_string(&FileResult { file: &name, p, max_length: opts.max_length })
                .map_err(|e| LmError(e.to_string()))?;
            println!("{line}");
        } else {
            println!(
                "{name}: tokens={} token_ppl={:.4} word_ppl={:.4} byte_ppl={:.4} bits_per_byte={:.4}",
                p.tokens, p.token_perplexity, p.word_perplexity, p.byte_perplexity, p.bits_per_byte
            );
        }
    }
    if !opts.json && files.len() > 1 {
        let p = all.perplexities();
        println!(
            "all: tokens={} token_ppl={:.4} word_ppl={:.4} byte_ppl={:.4} bits_per_byte={:.4}",
            p.tokens, p.token_perplexity, p.word_perplexity, p.byte_perplexity, p.bits_per_byte
        );
    }
    Ok(())
}

pub fn perplexity_of_file(lm: &mut ReferenceLm, f: &Path, opts: &PplOptions) -> Result<Totals, LmError> {
    let text = std::fs::read_to_string(f).map_err(|e| LmError(format!("{}: {e}", f.display())))?;
    let mut totals = Totals::for_text(&text);
    let mut seq = vec![lm.assets.prefix_id];
    seq.extend(lm.assets.encode(&text)?);
    let windows = rolling_windows(seq.len() - 1, opts.max_length);
    // A progress line on a terminal when the text needs more than a few model calls.
    let progress = std::io::stderr().is_terminal() && windows.len() > opts.batch * 2;
    let started = std::time::Instant::now();
    for (i, chunk) in windows.chunks(opts.batch.max(1)).enumerate() {
        let rows: Vec<&[u32]> = chunk.iter().map(|w| &seq[w.input.0..w.input.1]).collect();
        for (w, lps) in chunk.iter().zip(lm.next_token_logprobs(&rows)?) {
            totals.add_logprobs(&lps[lps.len() - w.predicted..]);
        }
        if progress {
            let done = ((i + 1) * opts.batch).min(windows.len());
            let rate = totals.tokens as f64 / started.elapsed().as_secs_f64().max(1e-9);
            eprint!("\r{}: window {done}/{} ({rate:.0} tokens/s)", f.display(), windows.len());
            let _ = std::io::stderr().flush();
        }
    }
    if progress {
        eprintln!();
    }
    Ok(totals)
}
