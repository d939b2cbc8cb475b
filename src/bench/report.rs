//! The result of a `goodput bench` run: the same figures `vllm bench serve` prints, as JSON and
//! as a table.

use serde::{Deserialize, Serialize};

use super::Sample;

/// `--goodput ttft:MS tpot:MS e2el:MS`: a request counts toward goodput when it meets every
/// SLO given (vLLM's definition).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SloSpec {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: Option<f64>,
}

impl SloSpec {
    pub fn parse(parts: &[String]) -> Result<SloSpec, String> {
        let mut s = SloSpec::default();
        for p in parts.iter().flat_map(|p| p.split_whitespace()) {
            let (k, v) =
                p.split_once(':').ok_or_else(|| format!("`{p}`: expected NAME:MS, e.g. ttft:500"))?;
            let ms: f64 = v.parse().map_err(|_| format!("`{p}`: `{v}` is not a number of milliseconds"))?;
            if !(ms.is_finite() && ms > 0.0) {
                return Err(format!("`{p}`: must be > 0"));
            }
            match k {
                "ttft" => s.ttft_ms = Some(ms),
                "tpot" => s.tpot_ms = Some(ms),
                "e2el" => s.e2el_ms = Some(ms),
                _ => return Err(format!("`{k}`: the SLOs are ttft, tpot and e2el")),
            }
        }
        Ok(s)
    }

    pub fn is_empty(&self) -> bool {
        self.ttft_ms.is_none() && self.tpot_ms.is_none() && self.e2el_ms.is_none()
    }

    /// Whether a successful request met every SLO given.
    pub fn met(&self, s: &Sample) -> bool {
        let ms = |x: f64| x * 1000.0;
        s.ok && self.ttft_ms.is_none_or(|b| s.ttft.is_some_and(|t| ms(t) <= b))
            && self.tpot_ms.is_none_or(|b| s.tpot().is_none_or(|t| ms(t) <= b))
            && self.e2el_ms.is_none_or(|b| ms(s.e2e) <= b)
    }
}

/// Mean, median, p90, p99 in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    pub count: usize,
    pub mean_ms: Option<f64>,
    pub median_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

impl Dist {
    pub fn of(mut xs: Vec<f64>) -> Dist {
        xs.retain(|x| x.is_finite());
        if xs.is_empty() {
            return Dist::default();
        }
        xs.sort_by(f64::total_cmp);
        // Linear interpolation between closest ranks (numpy's default, as vLLM reports).
        let q = |p: f64| {
            let h = (xs.len() - 1) as f64 * p;
            let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
            (xs[lo] + (xs[hi] - xs[lo]) * (h - lo as f64)) * 1000.0
        };
        Dist {
            count: xs.len(),
            mean_ms: Some(xs.iter().sum::<f64>() / xs.len() as f64 * 1000.0),
            median_ms: Some(q(0.5)),
            p90_ms: Some(q(0.9)),
            p99_ms: Some(q(0.99)),
        }
    }
}

/// Perplexity of the outputs under the reference model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QualitySummary {
    pub model: String,
    pub scored: usize,
    pub perplexity_mean: Option<f64>,
    /// exp(mean ln ppl): the typical value.
    pub perplexity_geomean: Option<f64>,
    pub perplexity_median: Option<f64>,
    pub bits_per_byte_mean: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// What was measured (a name for plots: the target, or --label).
    pub label: String,
    pub target: String,
    pub model: String,
    pub workload: String,
    pub stream: bool,
    pub rate: Option<f64>,
    pub burstiness: f64,
    pub concurrency: Option<usize>,
    pub duration_s: f64,
    pub completed: usize,
    pub failed: usize,
    /// The first few distinct errors.
    pub errors: Vec<String>,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    /// Share of output token counts that came from the server's usage (else content chunks).
    pub output_tokens_from_usage: f64,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub slo: SloSpec,
    /// Requests/s that met every SLO (vLLM's goodput); `None` without --goodput.
    pub request_goodput: Option<f64>,
    /// Output tokens/s of those requests.
    pub output_goodput: Option<f64>,
    pub ttft: Dist,
    pub tpot: Dist,
    pub itl: Dist,
    pub e2el: Dist,
    pub quality: Option<QualitySummary>,
    /// Each request's e2e latency in seconds, sorted (for the latency CDF plot).
    pub e2el_sorted_s: Vec<f64>,
}

impl Report {
    pub fn build(samples: &[Sample], wall: f64, slo: SloSpec) -> Report {
        let ok: Vec<&Sample> = samples.iter().filter(|s| s.ok).collect();
        let mut errors: Vec<String> = Vec::new();
        for e in samples.iter().filter_map(|s| s.error.as_ref()) {
            if errors.len() < 5 && !errors.contains(e) {
                errors.push(e.clone());
            }
        }
        let out: u64 = ok.iter().map(|s| s.output_tokens).sum();
        let inp: u64 = ok.iter().map(|s| s.prompt_tokens).sum();
        let wall = wall.max(1e-9);
        let met: Vec<&&Sample> = ok.iter().filter(|s| slo.met(s)).collect();
        let mut e2el: Vec<f64> = ok.iter().map(|s| s.e2e).collect();
        e2el.sort_by(f64::total_cmp);
        Report {
            duration_s: wall,
            completed: ok.len(),
            failed: samples.len() - ok.len(),
            errors,
            total_input_tokens: inp,
            total_output_tokens: out,
            output_tokens_from_usage: if ok.is_empty() {
                0.0
            } else {
                ok.iter().filter(|s| s.tokens_from_usage).count() as f64 / ok.len() as f64
            },
            request_throughput: ok.len() as f64 / wall,
            output_throughput: out as f64 / wall,
            total_token_throughput: (inp + out) as f64 / wall,
            slo,
            request_goodput: (!slo.is_empty()).then(|| met.len() as f64 / wall),
            output_goodput: (!slo.is_empty())
                .then(|| met.iter().map(|s| s.output_tokens).sum::<u64>() as f64 / wall),
            ttft: Dist::of(ok.iter().filter_map(|s| s.ttft).collect()),
            tpot: Dist::of(ok.iter().filter_map(|s| s.tpot()).collect()),
            itl: Dist::of(ok.iter().flat_map(|s| s.itl.iter().copied()).collect()),
            e2el: Dist::of(e2el.clone()),
            e2el_sorted_s: e2el,
            ..Default::default()
        }
    }

    /// The table `vllm bench serve` prints, in the same order.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let mut row = |k: &str, v: String| t.push_str(&format!("{k:<40}{v:>14}\n"));
        row("Successful requests:", self.completed.to_string());
        row("Failed requests:", self.failed.to_string());
        row("Benchmark duration (s):", format!("{:.2}", self.duration_s));
        row("Total input tokens:", self.total_input_tokens.to_string());
        row("Total generated tokens:", self.total_output_tokens.to_string());
        row("Request throughput (req/s):", format!("{:.2}", self.request_throughput));
        if let Some(g) = self.request_goodput {
            row("Request goodput (req/s):", format!("{g:.2}"));
        }
        row("Output token throughput (tok/s):", format!("{:.2}", self.output_throughput));
        if let Some(g) = self.output_goodput {
            row("Output token goodput (tok/s):", format!("{g:.2}"));
        }
        row("Total token throughput (tok/s):", format!("{:.2}", self.total_token_throughput));
        for (name, d) in
            [("TTFT", &self.ttft), ("TPOT", &self.tpot), ("ITL", &self.itl), ("E2EL", &self.e2el)]
        {
            for (stat, v) in
                [("Mean", d.mean_ms), ("Median", d.median_ms), ("P90", d.p90_ms), ("P99", d.p99_ms)]
            {
                row(&format!("{stat} {name} (ms):"), v.map_or("-".into(), |v| format!("{v:.2}")));
            }
        }
        if let Some(q) = &self.quality {
            row("Outputs scored:", q.scored.to_string());
            row(
                "Perplexity (geometric mean):",
                q.perplexity_geomean.map_or("-".into(), |v| format!("{v:.2}")),
            );
            row("Perplexity (median):", q.perplexity_median.map_or("-".into(), |v| format!("{v:.2}")));
        }
        for e in &self.errors {
            t.push_str(&format!("error: {e}\n"));
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(ttft: f64, e2e: f64, out: u64) -> Sample {
        Sample {
            ok: true,
            ttft: Some(ttft),
            e2e,
            output_tokens: out,
            prompt_tokens: 10,
            ..Default::default()
        }
    }

    #[test]
    fn slo_spec_parses_and_judges() {
        let slo = SloSpec::parse(&["ttft:100 tpot:20".into(), "e2el:1000".into()]).unwrap();
        assert_eq!(slo, SloSpec { ttft_ms: Some(100.0), tpot_ms: Some(20.0), e2el_ms: Some(1000.0) });
        assert!(slo.met(&s(0.1, 0.3, 11)), "tpot = 20 ms");
        assert!(!slo.met(&s(0.1, 0.31, 11)), "tpot = 21 ms");
        assert!(!slo.met(&s(0.2, 0.3, 2)));
        assert!(SloSpec::parse(&["ttft=1".into()]).is_err());
        assert!(SloSpec::parse(&["latency:5".into()]).unwrap_err().contains("ttft, tpot and e2el"));
    }

    #[test]
    fn report_figures() {
        let mut v: Vec<Sample> = (1..=100).map(|i| s(i as f64 / 1000.0, 0.5, 10)).collect();
        v.push(Sample { error: Some("HTTP 500".into()), ..Default::default() });
        let slo = SloSpec { ttft_ms: Some(50.0), ..Default::default() };
        let r = Report::build(&v, 10.0, slo);
        assert_eq!((r.completed, r.failed, r.errors.len()), (100, 1, 1));
        assert_eq!(r.total_output_tokens, 1000);
        assert!((r.request_throughput - 10.0).abs() < 1e-9);
        assert!((r.request_goodput.unwrap() - 5.0).abs() < 1e-9, "50 of 100 met TTFT <= 50 ms");
        assert!((r.output_goodput.unwrap() - 50.0).abs() < 1e-9);
        assert!((r.ttft.median_ms.unwrap() - 50.5).abs() < 1e-9);
        assert!((r.ttft.p99_ms.unwrap() - 99.01).abs() < 1e-9);
        assert!(r.table().contains("Request goodput (req/s):"));
    }
}
