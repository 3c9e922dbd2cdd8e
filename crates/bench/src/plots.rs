//! The plots next to BENCHMARKS.md: latency against load, throughput against runners.

use anyhow::{Context, Result};

/// Two PNG plots next to BENCHMARKS.md: latency vs load, throughput vs runners.
pub fn plots(
    dir: &std::path::Path,
    latency: &[(usize, f64, f64)],
    throughput: &[(usize, f64)],
) -> Result<Vec<std::path::PathBuf>> {
    use plotters::prelude::*;
    let font = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
        .context("the plots need DejaVu Sans (Debian: fonts-dejavu-core)")?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("DejaVu Sans did not load"))?;
    let lat_path = dir.join("bench-latency.png");
    {
        let root = BitMapBackend::new(&lat_path, (800, 500)).into_drawing_area();
        root.fill(&WHITE)?;
        let max_x = latency.iter().map(|l| l.0).max().unwrap_or(1) as f64;
        let max_y = latency.iter().map(|l| l.2).fold(1.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .caption("Latency vs load (inbound → reply)", ("sans-serif", 24))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..max_x * 1.05, 0f64..max_y)?;
        chart
            .configure_mesh()
            .x_desc("turns sent at once")
            .y_desc("ms")
            .draw()?;
        chart
            .draw_series(LineSeries::new(
                latency.iter().map(|l| (l.0 as f64, l.1)),
                &BLUE,
            ))?
            .label("p50")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        chart
            .draw_series(LineSeries::new(
                latency.iter().map(|l| (l.0 as f64, l.2)),
                &RED,
            ))?
            .label("p99")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        chart.configure_series_labels().border_style(BLACK).draw()?;
        root.present()?;
    }
    let tp_path = dir.join("bench-runners.png");
    {
        let root = BitMapBackend::new(&tp_path, (800, 500)).into_drawing_area();
        root.fill(&WHITE)?;
        let max_x = throughput.iter().map(|t| t.0).max().unwrap_or(1) as f64;
        let one = throughput.first().map(|t| t.1).unwrap_or(1.0);
        let max_y = (one * max_x).max(throughput.iter().map(|t| t.1).fold(0.0, f64::max)) * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .caption("Throughput vs runners (sleep:1 turns)", ("sans-serif", 24))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..max_x + 0.5, 0f64..max_y)?;
        chart
            .configure_mesh()
            .x_desc("runners (2 slots each)")
            .y_desc("turns/s")
            .draw()?;
        chart
            .draw_series(LineSeries::new(
                throughput.iter().map(|t| (t.0 as f64, t.1)),
                &BLUE,
            ))?
            .label("measured")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        chart
            .draw_series(LineSeries::new(
                throughput.iter().map(|t| (t.0 as f64, one * t.0 as f64)),
                &BLACK.mix(0.4),
            ))?
            .label("linear")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.4)));
        chart.configure_series_labels().border_style(BLACK).draw()?;
        root.present()?;
    }
    Ok(vec![lat_path, tp_path])
}
