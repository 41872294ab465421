//! Line charts as standalone SVG text, drawn with plotters' SVG backend.
//!
//! What it is: `ChartSpec` (title, axis labels, named series of (x, y) points, y scale) rendered to
//! one `<svg>` element that can be inlined in an HTML page. Text is emitted as SVG `<text>`
//! elements and laid out by plotters' built-in width estimate, so no font files or font-kit are
//! needed; the viewer's browser picks the actual sans-serif font.
//! What it is not: no interactivity, no JavaScript, no bitmap output.
//!
//! Invariants: rendering never panics on data: an empty chart says "no data", a single point or a
//! constant series gets a padded axis range, non-finite points (and non-positive ones on a log
//! axis) are left out and their number is printed under the chart. Long series are decimated to
//! per-bucket minimum and maximum, so spikes stay visible and the SVG stays small.

use plotters::prelude::*;

use crate::metrics::MetricsError;

/// One named line of a chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// A shaded band around the line, `(x, low, high)` (a confidence interval); empty: none.
    pub band: Vec<(f64, f64, f64)>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
            band: Vec::new(),
        }
    }

    /// The series with a shaded band `(x, low, high)` drawn under its line.
    pub fn with_band(mut self, band: Vec<(f64, f64, f64)>) -> Series {
        self.band = band;
        self
    }
}

/// A series' drawable line and band (y already on the axis scale).
type Drawable = (String, Vec<(f64, f64)>, Vec<(f64, f64, f64)>);

/// Vertical axis scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum YScale {
    Linear,
    Log,
    /// Log when every drawable value is positive and they span at least two decades.
    Auto,
}

/// A line chart to render.
#[derive(Clone, Debug, PartialEq)]
pub struct ChartSpec {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub y_scale: YScale,
}

const WIDTH: u32 = 760;
const HEIGHT: u32 = 340;
/// Points kept per series after decimation (half minima, half maxima of equal-width index buckets).
const MAX_POINTS: usize = 1600;
/// Series with at most this many points also get a marker on each point (sparse evals, single points).
const MARKER_LIMIT: usize = 60;
/// matplotlib's tab10 then the light half of tab20: 20 distinct lines (a MoE layer's experts).
const COLORS: [RGBColor; 20] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(174, 199, 232),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
    RGBColor(255, 152, 150),
    RGBColor(197, 176, 213),
    RGBColor(196, 156, 148),
    RGBColor(247, 182, 210),
    RGBColor(199, 199, 199),
    RGBColor(219, 219, 141),
    RGBColor(158, 218, 229),
];

/// `ChartSpec { .., y_scale: Linear }` rendered; the speedrun's report card uses this directly.
pub fn line_chart_svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<String, MetricsError> {
    ChartSpec {
        title: title.into(),
        x_label: x_label.into(),
        y_label: y_label.into(),
        series: series.to_vec(),
        y_scale: YScale::Linear,
    }
    .render()
}

impl ChartSpec {
    pub fn new(
        title: &str,
        x_label: &str,
        y_label: &str,
        series: Vec<Series>,
        y_scale: YScale,
    ) -> ChartSpec {
        ChartSpec {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            series,
            y_scale,
        }
    }

    /// Number of finite points over all series.
    pub fn finite_points(&self) -> usize {
        self.series
            .iter()
            .flat_map(|s| &s.points)
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .count()
    }

    /// One `<svg>` element.
    pub fn render(&self) -> Result<String, MetricsError> {
        let log = match self.y_scale {
            YScale::Linear => false,
            YScale::Log => true,
            YScale::Auto => spans_decades(&self.series),
        };
        // Drawable points per series; on a log axis y is drawn as log10(y).
        let mut skipped = 0usize;
        let scale = |y: f64| {
            if !log {
                y
            } else if y > 0.0 {
                y.log10()
            } else {
                f64::NAN
            }
        };
        let cleaned: Vec<Drawable> = self
            .series
            .iter()
            .map(|s| {
                let mut points: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .filter_map(|&(x, y)| {
                        let y = scale(y);
                        (x.is_finite() && y.is_finite()).then_some((x, y))
                    })
                    .collect();
                skipped += s.points.len() - points.len();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                let mut band: Vec<(f64, f64, f64)> = s
                    .band
                    .iter()
                    .map(|&(x, lo, hi)| (x, scale(lo), scale(hi)))
                    .filter(|(x, lo, hi)| x.is_finite() && lo.is_finite() && hi.is_finite())
                    .collect();
                band.sort_by(|a, b| a.0.total_cmp(&b.0));
                (s.name.clone(), decimate(points, MAX_POINTS), band)
            })
            .collect();

        let mut svg = String::new();
        self.draw(&mut svg, &cleaned, log, skipped)
            .map_err(|e| MetricsError::Chart {
                title: self.title.clone(),
                message: e.to_string(),
            })?;
        Ok(svg)
    }

    fn draw(
        &self,
        svg: &mut String,
        series: &[Drawable],
        log: bool,
        skipped: usize,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::with_string(svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let band_edges: Vec<(f64, f64)> = series
            .iter()
            .flat_map(|(_, _, b)| b.iter().flat_map(|&(x, lo, hi)| [(x, lo), (x, hi)]))
            .collect();
        let all = series
            .iter()
            .flat_map(|(_, p, _)| p)
            .chain(band_edges.iter());
        let (x_range, y_range) = match padded_ranges(all) {
            AxisRanges::Drawable(x, y) => (x, y),
            AxisRanges::TooWide => return Err("the values span more than an f64 can hold".into()),
            AxisRanges::Empty => {
                root.titled(&self.title, ("sans-serif", 20))?;
                root.draw(&Text::new(
                    "no data".to_string(),
                    ((WIDTH / 2 - 30) as i32, (HEIGHT / 2) as i32),
                    ("sans-serif", 16)
                        .into_font()
                        .color(&RGBColor(120, 120, 120)),
                ))?;
                root.present()?;
                return Ok(());
            }
        };

        let mut chart = ChartBuilder::on(&root)
            .caption(&self.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(72)
            .build_cartesian_2d(x_range, y_range)?;
        let format_y = |v: &f64| {
            if log {
                fmt_tick(10f64.powf(*v))
            } else {
                fmt_tick(*v)
            }
        };
        let format_x = |v: &f64| fmt_tick(*v);
        chart
            .configure_mesh()
            .x_desc(self.x_label.as_str())
            .y_desc(if log {
                format!("{} (log scale)", self.y_label)
            } else {
                self.y_label.clone()
            })
            .x_label_formatter(&format_x)
            .y_label_formatter(&format_y)
            .light_line_style(RGBColor(235, 235, 235))
            .draw()?;

        for (index, (_, _, band)) in series.iter().enumerate() {
            if band.len() < 2 {
                continue;
            }
            let color = COLORS[index % COLORS.len()];
            let outline: Vec<(f64, f64)> = band
                .iter()
                .map(|&(x, _, hi)| (x, hi))
                .chain(band.iter().rev().map(|&(x, lo, _)| (x, lo)))
                .collect();
            chart.draw_series(std::iter::once(Polygon::new(
                outline,
                color.mix(0.18).filled(),
            )))?;
        }
        for (index, (name, points, _)) in series.iter().enumerate() {
            let color = COLORS[index % COLORS.len()];
            let style = ShapeStyle::from(&color).stroke_width(2);
            chart
                .draw_series(LineSeries::new(points.iter().copied(), style))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            if points.len() <= MARKER_LIMIT {
                chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
            }
        }
        if series.iter().any(|(name, _, _)| !name.is_empty()) {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(RGBColor(180, 180, 180))
                .label_font(("sans-serif", 13))
                .draw()?;
        }
        if skipped > 0 {
            let what = if log {
                "non-finite or non-positive"
            } else {
                "non-finite"
            };
            root.draw(&Text::new(
                format!("{skipped} {what} point(s) not drawn"),
                (12, (HEIGHT - 14) as i32),
                ("sans-serif", 12).into_font().color(&RGBColor(160, 60, 60)),
            ))?;
        }
        root.present()?;
        Ok(())
    }
}

/// Whether every finite y is positive and max/min >= 100 (two decades).
fn spans_decades(series: &[Series]) -> bool {
    let mut lo = f64::INFINITY;
    let mut hi = 0.0f64;
    for &(x, y) in series.iter().flat_map(|s| &s.points) {
        if !(x.is_finite() && y.is_finite()) {
            continue;
        }
        if y <= 0.0 {
            return false;
        }
        lo = lo.min(y);
        hi = hi.max(y);
    }
    lo.is_finite() && hi / lo >= 100.0
}

enum AxisRanges {
    Empty,
    /// The span (or its padding) overflows f64.
    TooWide,
    Drawable(std::ops::Range<f64>, std::ops::Range<f64>),
}

/// Axis ranges covering the points with some padding; a zero span gets a padding of its own.
fn padded_ranges<'a>(points: impl Iterator<Item = &'a (f64, f64)>) -> AxisRanges {
    let (mut x_lo, mut x_hi, mut y_lo, mut y_hi) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for &(x, y) in points {
        x_lo = x_lo.min(x);
        x_hi = x_hi.max(x);
        y_lo = y_lo.min(y);
        y_hi = y_hi.max(y);
    }
    if !x_lo.is_finite() {
        return AxisRanges::Empty;
    }
    let pad = |lo: f64, hi: f64, edge: f64| {
        let span = hi - lo;
        let pad = if span > 0.0 {
            span * edge
        } else if lo != 0.0 {
            lo.abs() * 0.05
        } else {
            1.0
        };
        let range = (lo - pad)..(hi + pad);
        (range.start.is_finite() && range.end.is_finite() && (range.end - range.start).is_finite())
            .then_some(range)
    };
    match (pad(x_lo, x_hi, 0.02), pad(y_lo, y_hi, 0.05)) {
        // Extra room at the top for the legend box (upper right), so it covers less of the data.
        (Some(x), Some(y)) => match y.end + 0.08 * (y.end - y.start) {
            top if top.is_finite() => AxisRanges::Drawable(x, y.start..top),
            _ => AxisRanges::TooWide,
        },
        _ => AxisRanges::TooWide,
    }
}

/// Keeps at most `max_points` points: the minimum and maximum y of equal-width index buckets, in
/// x order. Min/max (not the mean) so a one-step spike survives.
fn decimate(points: Vec<(f64, f64)>, max_points: usize) -> Vec<(f64, f64)> {
    let buckets = (max_points / 2).max(1);
    if points.len() <= max_points {
        return points;
    }
    let mut kept = Vec::with_capacity(buckets * 2);
    for b in 0..buckets {
        let start = b * points.len() / buckets;
        let end = ((b + 1) * points.len() / buckets)
            .max(start + 1)
            .min(points.len());
        let bucket = &points[start..end];
        let min = bucket
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.1.total_cmp(&b.1.1));
        let max = bucket
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.1.total_cmp(&b.1.1));
        if let (Some((i_min, &p_min)), Some((i_max, &p_max))) = (min, max) {
            match i_min.cmp(&i_max) {
                std::cmp::Ordering::Less => kept.extend([p_min, p_max]),
                std::cmp::Ordering::Greater => kept.extend([p_max, p_min]),
                std::cmp::Ordering::Equal => kept.push(p_min),
            }
        }
    }
    kept
}

/// Axis tick text: short, exponent form for very small or large magnitudes.
pub(crate) fn fmt_tick(value: f64) -> String {
    let magnitude = value.abs();
    if !value.is_finite() {
        String::new()
    } else if magnitude == 0.0 {
        "0".into()
    } else if !(1e-3..1e6).contains(&magnitude) {
        let text = format!("{value:.1e}");
        text.replace(".0e", "e")
    } else {
        let decimals = (2 - magnitude.log10().floor() as i32).clamp(0, 6) as usize;
        let text = format!("{value:.decimals$}");
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            text
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimation_keeps_a_single_spike() {
        let mut points: Vec<(f64, f64)> = (0..100_000).map(|i| (i as f64, 1.0)).collect();
        points[54_321].1 = 50.0;
        let kept = decimate(points, 1000);
        assert!(kept.len() <= 1000);
        assert!(kept.iter().any(|&(x, y)| x == 54_321.0 && y == 50.0));
        assert!(kept.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn tick_labels_are_short() {
        assert_eq!(fmt_tick(0.0003), "3e-4");
        assert_eq!(fmt_tick(2.5), "2.5");
        assert_eq!(fmt_tick(1200.0), "1200");
        assert_eq!(fmt_tick(0.125), "0.125");
    }
}
