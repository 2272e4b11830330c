//! SVG line charts of a benchmark's curves (plotters; text is left to the viewer's fonts).

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// Draws `series` (name, points) against a logarithmic x axis from 0 up on y, into `path`.
pub(super) fn lines(path: &Path, title: &str, x: &str, y: &str, series: &[(&str, Vec<(f64, f64)>)]) -> Result<()> {
    let points = || series.iter().flat_map(|(_, p)| p.iter().copied());
    let (x_min, x_max) = points().fold((f64::MAX, f64::MIN), |(lo, hi), (x, _)| (lo.min(x), hi.max(x)));
    let y_max = points().fold(0.0f64, |hi, (_, y)| hi.max(y));
    if x_min > x_max {
        return Err(anyhow!("{}: nothing to draw", path.display()));
    }
    let fail = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d((x_min * 0.8..x_max * 1.25).log_scale(), 0.0..(y_max * 1.15).max(1e-9))
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc(x)
        .y_desc(y)
        .draw()
        .map_err(|e| fail(&e))?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|e| fail(&e))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| fail(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_names_its_series_and_axes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.svg");
        lines(
            &path,
            "title",
            "partitions",
            "records/s",
            &[
                ("exactly", vec![(6.0, 1.0), (60.0, 0.9), (600.0, 0.8)]),
                ("plain", vec![(6.0, 1.0)]),
            ],
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for text in ["<svg", "exactly", "plain", "partitions", "records/s", "title"] {
            assert!(svg.contains(text), "{text} missing");
        }
        assert!(lines(&path, "t", "x", "y", &[("none", vec![])]).is_err());
    }
}
