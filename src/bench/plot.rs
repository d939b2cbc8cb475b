//! `goodput bench --plot FILE.png`: the latency CDF of one or more runs, or, given several
//! results with scored outputs, the seed's picture: output throughput against perplexity, one
//! point per model or backend. Drawn with plotters into a PNG; text needs a TrueType font
//! (`GOODPUT_FONT`, else DejaVu Sans from Debian's fonts-dejavu-core).

use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::Report;

const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Register one TrueType font as plotters' "sans-serif" (once per process).
fn font() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let path = std::env::var_os("GOODPUT_FONT")
            .map(PathBuf::from)
            .or_else(|| FONT_CANDIDATES.iter().map(PathBuf::from).find(|p| p.is_file()))
            .ok_or("no TrueType font for the plot's text: set GOODPUT_FONT=/path/to/font.ttf (or install fonts-dejavu-core)")?;
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        // plotters keeps the font for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{}: not a usable TrueType font", path.display()))
    })
    .clone()
}

fn err(e: impl std::fmt::Display) -> String {
    format!("plot: {e}")
}

/// The share of requests finished within x ms, one line per run.
pub fn latency_cdf(reports: &[Report], out: &Path) -> Result<(), String> {
    font()?;
    let max_ms =
        reports.iter().filter_map(|r| r.e2el_sorted_s.last()).fold(0.0f64, |a, b| a.max(*b)) * 1000.0;
    if max_ms <= 0.0 {
        return Err("plot: no successful request to draw".into());
    }
    let root = BitMapBackend::new(out, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("End-to-end latency CDF", ("sans-serif", 26))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..max_ms * 1.05, 0f64..1.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("e2e latency (ms)")
        .y_desc("share of requests")
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(err)?;
    for (i, r) in reports.iter().enumerate() {
        let n = r.e2el_sorted_s.len() as f64;
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                r.e2el_sorted_s.iter().enumerate().map(|(k, x)| (x * 1000.0, (k + 1) as f64 / n)),
                color.stroke_width(3),
            ))
            .map_err(err)?
            .label(r.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 15))
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// Output tokens/s against the outputs' perplexity (geometric mean), one labelled point per run:
/// up and to the left is better.
pub fn tput_vs_ppl(reports: &[Report], out: &Path) -> Result<(), String> {
    font()?;
    let pts: Vec<(f64, f64, &str)> = reports
        .iter()
        .filter_map(|r| {
            Some((r.quality.as_ref()?.perplexity_geomean?, r.output_throughput, r.label.as_str()))
        })
        .collect();
    if pts.len() < reports.len() {
        return Err("plot: every result needs scored outputs (run goodput bench with --score-model)".into());
    }
    let (max_ppl, max_tps) = pts.iter().fold((0.0f64, 0.0f64), |(a, b), p| (a.max(p.0), b.max(p.1)));
    let root = BitMapBackend::new(out, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Throughput vs perplexity", ("sans-serif", 26))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        // Room on the right for the last point's label.
        .build_cartesian_2d((1f64..max_ppl * 12.0).log_scale(), 0f64..max_tps * 1.2)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("perplexity of the outputs (geometric mean, log scale)")
        .y_desc("output tokens/s")
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(err)?;
    for (i, (ppl, tps, label)) in pts.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let label = label.to_string();
        chart.draw_series(std::iter::once(Circle::new((*ppl, *tps), 8, color.filled()))).map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{label} ({ppl:.1}, {tps:.0} tok/s)"),
                (*ppl, *tps * 1.04),
                ("sans-serif", 15).into_font(),
            )))
            .map_err(err)?;
    }
    root.present().map_err(err)
}
