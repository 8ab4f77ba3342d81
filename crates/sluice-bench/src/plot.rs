//! PNG plots (plotters, drawn into a buffer, written with `image`).
//!
//! Text needs a TrueType font: the first of a few usual system fonts (DejaVu Sans,
//! Liberation Sans) is loaded at start-up; without one, [`init_font`] says so and no
//! plot is drawn.

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::stats::Summary;

const FONT: &str = "sans-serif";
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
];
const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
];
const SIZE: (u32, u32) = (900, 560);

/// Loads a system font for the plots' text; `Err` says why plots cannot be drawn.
pub fn init_font() -> Result<String, String> {
    for path in FONT_PATHS {
        if let Ok(bytes) = std::fs::read(path) {
            // The font must live as long as the process: plotters keeps a reference.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font(FONT, FontStyle::Normal, bytes).is_ok() {
                return Ok((*path).to_string());
            }
        }
    }
    Err(format!(
        "no TrueType font found (looked for {}); install fonts-dejavu-core",
        FONT_PATHS.join(", ")
    ))
}

/// How the x axis maps values.
#[derive(Debug, Clone, Copy)]
pub enum XAxis {
    /// Powers of two, evenly spaced (N = 1, 2, 4, 8; sizes).
    Log2,
    /// Powers of ten, evenly spaced (latencies).
    Log10,
}

impl XAxis {
    fn to_axis(self, x: f64) -> f64 {
        match self {
            XAxis::Log2 => x.log2(),
            XAxis::Log10 => x.log10(),
        }
    }

    fn label(self, x: f64) -> String {
        if (x - x.round()).abs() > 1e-6 {
            return String::new();
        }
        let v = match self {
            XAxis::Log2 => 2f64.powf(x.round()),
            XAxis::Log10 => 10f64.powf(x.round()),
        };
        if v >= 1.0 {
            format!("{v:.0}")
        } else {
            format!("{v}")
        }
    }
}

/// One line: points `(x, summary)`, drawn at the median with a min–max bar.
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points.
    pub points: Vec<(f64, Summary)>,
}

fn render(
    path: &Path,
    draw: impl FnOnce(&DrawingArea<BitMapBackend<'_>, Shift>) -> Result<()>,
) -> Result<()> {
    let (w, h) = SIZE;
    let mut buf = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        draw(&root)?;
        root.present().map_err(|e| anyhow!("{e}"))?;
    }
    image::RgbImage::from_raw(w, h, buf)
        .context("plot buffer has the wrong size")?
        .save(path)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// A line chart of several series against a logarithmic x axis, y from 0.
pub fn lines(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    x: XAxis,
    series: &[Series],
) -> Result<()> {
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|(x, _)| *x))
        .collect();
    let (lo, hi) = xs
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(x.to_axis(*v)), hi.max(x.to_axis(*v)))
        });
    if !lo.is_finite() {
        return Ok(());
    }
    let pad = ((hi - lo) * 0.08).max(0.2);
    let y_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|(_, v)| v.max))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
        * 1.2;
    let y_max = if y_max > 0.0 { y_max } else { 1.0 };
    render(path, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 24))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d((lo - pad)..(hi + pad), 0f64..y_max)
            .map_err(|e| anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_labels(((hi - lo).round() as usize + 1) * 4)
            .x_label_formatter(&|v| x.label(*v))
            .label_style((FONT, 15))
            .axis_desc_style((FONT, 17))
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        for (i, s) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let pts: Vec<(f64, Summary)> = s
                .points
                .iter()
                .map(|(px, v)| (x.to_axis(*px), *v))
                .collect();
            chart
                .draw_series(LineSeries::new(
                    pts.iter().map(|(px, v)| (*px, v.median)),
                    color.stroke_width(3),
                ))
                .map_err(|e| anyhow!("{e}"))?
                .label(s.name.as_str())
                .legend(move |(lx, ly)| {
                    PathElement::new(vec![(lx, ly), (lx + 24, ly)], color.stroke_width(3))
                });
            chart
                .draw_series(
                    pts.iter()
                        .map(|(px, v)| Circle::new((*px, v.median), 4, color.filled())),
                )
                .map_err(|e| anyhow!("{e}"))?;
            chart
                .draw_series(pts.iter().filter(|(_, v)| v.n > 1).map(|(px, v)| {
                    ErrorBar::new_vertical(*px, v.min, v.median, v.max, color.stroke_width(2), 10)
                }))
                .map_err(|e| anyhow!("{e}"))?;
        }
        chart
            .configure_series_labels()
            .label_font((FONT, 16))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        Ok(())
    })
}

/// A histogram of latencies (microseconds) as one line per series, on a log10 x axis:
/// the share of samples in each of 20 bins per decade.
pub fn histogram(path: &Path, title: &str, series: &[(String, Vec<f64>)]) -> Result<()> {
    const PER_DECADE: f64 = 20.0;
    let logs: Vec<Vec<f64>> = series
        .iter()
        .map(|(_, v)| v.iter().filter(|x| **x > 0.0).map(|x| x.log10()).collect())
        .collect();
    let all = logs.iter().flatten();
    let lo = all.clone().fold(f64::INFINITY, |a, b| a.min(*b));
    let hi = all.fold(f64::NEG_INFINITY, |a, b| a.max(*b));
    if !lo.is_finite() {
        return Ok(());
    }
    let (lo, hi) = (
        (lo * PER_DECADE).floor() / PER_DECADE,
        (hi * PER_DECADE).ceil() / PER_DECADE,
    );
    let bins = (((hi - lo) * PER_DECADE).round() as usize).max(1) + 1;
    let hists: Vec<Vec<(f64, f64)>> = logs
        .iter()
        .map(|l| {
            let mut counts = vec![0usize; bins];
            for v in l {
                counts[(((v - lo) * PER_DECADE) as usize).min(bins - 1)] += 1;
            }
            let total = l.len().max(1) as f64;
            counts
                .iter()
                .enumerate()
                .map(|(i, c)| (lo + (i as f64 + 0.5) / PER_DECADE, *c as f64 / total))
                .collect()
        })
        .collect();
    let y_max = hists.iter().flatten().map(|(_, y)| *y).fold(0.0, f64::max) * 1.2;
    render(path, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 24))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d((lo - 0.05)..(hi + 0.05), 0f64..y_max.max(0.01))
            .map_err(|e| anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc("publish → receive latency (µs, log scale)")
            .y_desc("share of batches per bin (20 bins per decade)")
            .x_labels(((hi - lo) * 10.0) as usize + 2)
            .x_label_formatter(&|v| XAxis::Log10.label(*v))
            .label_style((FONT, 15))
            .axis_desc_style((FONT, 17))
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        for (i, ((name, _), h)) in series.iter().zip(&hists).enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(h.iter().copied(), color.stroke_width(2)))
                .map_err(|e| anyhow!("{e}"))?
                .label(name.as_str())
                .legend(move |(lx, ly)| {
                    PathElement::new(vec![(lx, ly), (lx + 24, ly)], color.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .label_font((FONT, 16))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        Ok(())
    })
}

/// Bars (median, with a min–max bar) for a few named measurements.
pub fn bars(path: &Path, title: &str, y_desc: &str, bars: &[(String, Summary)]) -> Result<()> {
    let y_max = bars
        .iter()
        .map(|(_, v)| v.max)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
        * 1.2;
    let k = bars.len() as f64;
    render(path, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 24))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(-0.5f64..(k - 0.5), 0f64..y_max.max(1e-9))
            .map_err(|e| anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_desc(y_desc)
            .x_labels(bars.len() * 4)
            .x_label_formatter(&|v| {
                let i = v.round();
                if (v - i).abs() > 1e-6 || i < 0.0 {
                    return String::new();
                }
                bars.get(i as usize)
                    .map(|(n, _)| n.clone())
                    .unwrap_or_default()
            })
            .label_style((FONT, 15))
            .axis_desc_style((FONT, 17))
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        for (i, (_, v)) in bars.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let x = i as f64;
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x - 0.3, 0.0), (x + 0.3, v.median)],
                    color.filled(),
                )))
                .map_err(|e| anyhow!("{e}"))?;
            if v.n > 1 {
                chart
                    .draw_series(std::iter::once(ErrorBar::new_vertical(
                        x,
                        v.min,
                        v.median,
                        v.max,
                        BLACK.stroke_width(2),
                        14,
                    )))
                    .map_err(|e| anyhow!("{e}"))?;
            }
        }
        Ok(())
    })
}
