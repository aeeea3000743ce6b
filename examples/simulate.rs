//! Drives the same bursty traffic through the six algorithms in simulated time and draws `docs/algorithms.png`.
//!
//! Run with: `cargo run --example simulate`
//!
//! Traffic, 60 simulated seconds: a steady background of 1 request per second (at 0.5 s, 1.5 s, ...), and from
//! 9.9 s on, every 10 s, a burst of 40 requests within 200 ms (one every 5 ms), so each burst straddles the edge
//! of a 10 s window. Parameters are comparable: 20 per 10 s for the window algorithms, `rate: 2/s, burst: 20`
//! for the bucket algorithms. Decisions come from the in-process store ([`MemoryStore`]) at explicit timestamps,
//! which makes the same decisions as the Redis script (`tests/store_parity.rs`). Text is drawn with DejaVu Sans
//! (Debian's `fonts-dejavu-core`).

use std::error::Error;
use std::sync::Arc;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use tollgate::limiter::store::{LimitCheck, MemoryStore};
use tollgate::limiter::{Algorithm, LeakyMode, Limit, ManualClock, Rate};

/// Simulated time zero: 2026-01-01T00:00:00Z, so aligned windows start at 0 s, 10 s, 20 s...
const START_MS: i64 = 1_767_225_600_000;
const DURATION_MS: i64 = 60_000;
const BIN_MS: i64 = 500;
const OUTPUT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/algorithms.png");
const FONTS: [(&str, FontStyle); 2] = [
    (
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        FontStyle::Normal,
    ),
    (
        "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf",
        FontStyle::Bold,
    ),
];

/// One simulated limit and what it did with the traffic.
struct Run {
    /// Short name for the console table.
    label: String,
    title: String,
    color: RGBColor,
    /// Simulated ms (from 0) at which each admitted request went through (for delay mode: was released).
    passed: Vec<i64>,
}

fn main() -> Result<(), Box<dyn Error>> {
    let offered = traffic();
    let rate = Rate::new(2, 1_000)?;
    let (limit, period_ms) = (20, 10_000);
    let setups: [(Algorithm, &str, RGBColor); 7] = [
        (
            Algorithm::FixedWindow { limit, period_ms },
            "limit: 20, period: 10s",
            RGBColor(214, 39, 40),
        ),
        (
            Algorithm::SlidingWindow { limit, period_ms },
            "limit: 20, period: 10s",
            RGBColor(255, 127, 14),
        ),
        (
            Algorithm::SlidingLog { limit, period_ms },
            "limit: 20, period: 10s",
            RGBColor(44, 160, 44),
        ),
        (
            Algorithm::TokenBucket { rate, burst: 20 },
            "rate: 2/s, burst: 20",
            RGBColor(31, 119, 180),
        ),
        (
            Algorithm::Gcra { rate, burst: 20 },
            "rate: 2/s, burst: 20",
            RGBColor(148, 103, 189),
        ),
        (
            Algorithm::LeakyBucket {
                rate,
                burst: 20,
                mode: LeakyMode::Reject,
            },
            "rate: 2/s, burst: 20, mode: reject",
            RGBColor(140, 86, 75),
        ),
        (
            Algorithm::LeakyBucket {
                rate,
                burst: 20,
                mode: LeakyMode::Delay {
                    max_delay_ms: 5_000,
                },
            },
            "rate: 2/s, burst: 20, mode: delay, max_delay: 5s; bars at release time",
            RGBColor(227, 119, 194),
        ),
    ];

    let runs: Vec<Run> = setups
        .iter()
        .map(|&(algorithm, params, color)| simulate(algorithm, params, color, &offered))
        .collect::<Result<_, _>>()?;

    println!("offered: {} requests in 60 s", offered.len());
    println!(
        "{:<22} {:>8} {:>14} {:>13}",
        "algorithm", "admitted", "most in 10 s", "most in 1 s"
    );
    for run in &runs {
        println!(
            "{:<22} {:>8} {:>14} {:>13}",
            run.label,
            run.passed.len(),
            most_within(&run.passed, 10_000),
            most_within(&run.passed, 1_000)
        );
    }
    println!(
        "token_bucket, gcra and leaky_bucket (reject) admitted the same requests: {}",
        runs[3].passed == runs[4].passed && runs[4].passed == runs[5].passed
    );

    draw(&offered, &runs)?;
    println!("wrote {OUTPUT}");
    Ok(())
}

/// Request times in simulated ms from 0, sorted.
fn traffic() -> Vec<i64> {
    let background = (0..DURATION_MS / 1_000).map(|s| s * 1_000 + 500);
    let bursts = (0..5).flat_map(|b| (0..40).map(move |i| 9_900 + b * 10_000 + i * 5));
    let mut times: Vec<i64> = background.chain(bursts).collect();
    times.sort_unstable();
    times
}

fn simulate(
    algorithm: Algorithm,
    params: &str,
    color: RGBColor,
    offered: &[i64],
) -> Result<Run, Box<dyn Error>> {
    let store = MemoryStore::new(16, Arc::new(ManualClock::new(START_MS)));
    let limit = Limit::new(algorithm.name(), algorithm, 1)?;
    let checks = [LimitCheck {
        key: "simulated-client",
        limit: &limit,
    }];
    let mut passed: Vec<i64> = offered
        .iter()
        .filter_map(|&t| {
            let outcome = store.check_at(START_MS + t, &checks);
            outcome.allowed.then(|| t + outcome.delay_ms() as i64)
        })
        .collect();
    passed.sort_unstable();
    let label = match algorithm {
        Algorithm::LeakyBucket {
            mode: LeakyMode::Reject,
            ..
        } => "leaky_bucket (reject)".to_owned(),
        Algorithm::LeakyBucket { .. } => "leaky_bucket (delay)".to_owned(),
        _ => algorithm.name().to_owned(),
    };
    Ok(Run {
        label,
        title: format!("{}  ({params})", algorithm.name()),
        color,
        passed,
    })
}

/// The largest number of `times` within any half-open interval of `length_ms`.
fn most_within(times: &[i64], length_ms: i64) -> usize {
    let mut most = 0;
    let mut first = 0;
    for (last, &t) in times.iter().enumerate() {
        while times[first] <= t - length_ms {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

/// Counts per `BIN_MS` bin over the simulated duration.
fn bins(times: &[i64]) -> Vec<u32> {
    let mut counts = vec![0u32; (DURATION_MS / BIN_MS) as usize];
    for &t in times {
        if let Some(c) = counts.get_mut((t / BIN_MS) as usize) {
            *c += 1;
        }
    }
    counts
}

fn load_fonts() -> Result<(), Box<dyn Error>> {
    for (path, style) in FONTS {
        let bytes = std::fs::read(path).map_err(|e| {
            format!("{path}: {e} (install Debian's fonts-dejavu-core: apt-get install fonts-dejavu-core)")
        })?;
        // plotters keeps registered fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        register_font("sans-serif", style, bytes).map_err(|_| format!("{path}: not a font"))?;
    }
    Ok(())
}

fn draw(offered: &[i64], runs: &[Run]) -> Result<(), Box<dyn Error>> {
    load_fonts()?;
    if let Some(dir) = std::path::Path::new(OUTPUT).parent() {
        std::fs::create_dir_all(dir)?;
    }
    let panel_height = 210;
    let header_height = 80;
    let height = header_height + panel_height * runs.len() as u32;
    let root = BitMapBackend::new(OUTPUT, (1200, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (header, body) = root.split_vertically(header_height);
    header.draw(&Text::new(
        "The same bursty traffic through each algorithm (simulated, 60 s)",
        (20, 12),
        ("sans-serif", 26).into_font().style(FontStyle::Bold),
    ))?;
    header.draw(&Text::new(
        "Grey: offered (1 request/s, plus bursts of 40 in 200 ms from 9.9 s every 10 s, across the 10 s window edges). \
         Colour: admitted. Bars count requests per 0.5 s.",
        (20, 48),
        ("sans-serif", 15).into_font(),
    ))?;

    let offered_bins = bins(offered);
    let y_max = offered_bins.iter().copied().max().unwrap_or(1) + 2;
    let bin_s = BIN_MS as f64 / 1_000.0;
    for (area, run) in body.split_evenly((runs.len(), 1)).iter().zip(runs) {
        let caption = format!(
            "{}: {} of {} admitted, at most {} in any 10 s",
            run.title,
            run.passed.len(),
            offered.len(),
            most_within(&run.passed, 10_000)
        );
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 17))
            .margin_left(12)
            .margin_right(20)
            .margin_bottom(4)
            .x_label_area_size(26)
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..(DURATION_MS / 1_000) as f64, 0u32..y_max)?;
        chart
            .configure_mesh()
            .x_labels(13)
            .y_labels(5)
            .x_label_formatter(&|x| format!("{x:.0} s"))
            .y_desc("requests")
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 13))
            .light_line_style(WHITE)
            .draw()?;
        let bar = |counts: Vec<u32>, style: ShapeStyle, shrink: f64| {
            counts
                .into_iter()
                .enumerate()
                .filter(|&(_, n)| n > 0)
                .map(move |(i, n)| {
                    let x0 = i as f64 * bin_s;
                    Rectangle::new([(x0 + shrink, 0), (x0 + bin_s - shrink, n)], style)
                })
        };
        chart
            .draw_series(bar(
                offered_bins.clone(),
                RGBColor(170, 170, 170).mix(0.6).filled(),
                0.0,
            ))?
            .label("offered")
            .legend(|(x, y)| {
                Rectangle::new(
                    [(x, y - 5), (x + 14, y + 5)],
                    RGBColor(170, 170, 170).filled(),
                )
            });
        let color = run.color;
        chart
            .draw_series(bar(bins(&run.passed), color.filled(), 0.08))?
            .label("admitted")
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .label_font(("sans-serif", 13))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
