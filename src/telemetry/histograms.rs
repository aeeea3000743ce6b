//! The histograms every request records into, counted in their buckets as they are recorded: the exporter's own
//! keep each sample in an epoch-guarded list, with a clock reading, until its upkeep folds them in (about 135
//! instructions a sample, where a bucket's atomic increment costs a tenth of it). Every other metric is the
//! exporter's, which this recorder hands on.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::PrometheusRecorder;
use parking_lot::Mutex;

/// The exporter's recorder, with the histograms named in [`Counted`] counted here instead.
pub(super) struct Layered {
    pub(super) inner: PrometheusRecorder,
    pub(super) counted: Arc<Counted>,
}

/// Histograms counted in fixed buckets, by name, each with its series (one per label set).
pub(crate) struct Counted {
    families: Mutex<Vec<Family>>,
}

struct Family {
    name: &'static str,
    /// The upper bounds of the buckets, ascending (`+Inf` is implied).
    bounds: &'static [f64],
    help: Option<SharedString>,
    series: Vec<(Key, Arc<Buckets>)>,
}

/// One series: a count per bucket (not cumulative: each sample counts once) and the sum of the samples.
struct Buckets {
    bounds: &'static [f64],
    /// One per bound, then the count over the last bound.
    counts: Box<[AtomicU64]>,
    /// The sum's `f64` bits.
    sum: AtomicU64,
}

// === impl Counted ===

impl Counted {
    /// Histograms of `families` (each a name and its bucket bounds) counted here.
    pub(super) fn new(families: &[(&'static str, &'static [f64])]) -> Self {
        let families = families
            .iter()
            .map(|&(name, bounds)| Family {
                name,
                bounds,
                help: None,
                series: Vec::new(),
            })
            .collect();
        Self {
            families: Mutex::new(families),
        }
    }

    /// The series of `key`, made at its first registration; `None` when its name is not counted here.
    fn series(&self, key: &Key) -> Option<Arc<Buckets>> {
        let mut families = self.families.lock();
        let family = families.iter_mut().find(|f| f.name == key.name())?;
        if let Some((_, buckets)) = family.series.iter().find(|(k, _)| k == key) {
            return Some(Arc::clone(buckets));
        }
        let buckets = Arc::new(Buckets::new(family.bounds));
        family.series.push((key.clone(), Arc::clone(&buckets)));
        Some(buckets)
    }

    /// Keeps the description of `name`, if it is counted here.
    fn describe(&self, name: &str, description: &SharedString) -> bool {
        let mut families = self.families.lock();
        let Some(family) = families.iter_mut().find(|f| f.name == name) else {
            return false;
        };
        family.help = Some(description.clone());
        true
    }

    /// Appends the histograms in Prometheus's text format, as the exporter writes its own: `_bucket` lines with
    /// cumulative counts and `le`, `_sum`, `_count`.
    pub(crate) fn render(&self, out: &mut String) {
        let families = self.families.lock();
        for family in families.iter().filter(|f| !f.series.is_empty()) {
            let name = family.name;
            if let Some(help) = &family.help {
                let _ = writeln!(out, "# HELP {name} {}", help.replace('\n', " "));
            }
            let _ = writeln!(out, "# TYPE {name} histogram");
            for (key, buckets) in &family.series {
                let labels: Vec<String> = key
                    .labels()
                    .map(|label| format!("{}=\"{}\"", label.key(), escaped(label.value())))
                    .collect();
                let with = |extra: Option<String>| {
                    let all: Vec<&str> = labels
                        .iter()
                        .map(String::as_str)
                        .chain(extra.as_deref())
                        .collect();
                    if all.is_empty() {
                        String::new()
                    } else {
                        format!("{{{}}}", all.join(","))
                    }
                };
                let mut cumulative = 0;
                for (i, count) in buckets.counts.iter().enumerate() {
                    cumulative += count.load(Ordering::Relaxed);
                    let le = buckets
                        .bounds
                        .get(i)
                        .map_or_else(|| "+Inf".to_owned(), f64::to_string);
                    let labels = with(Some(format!("le=\"{le}\"")));
                    let _ = writeln!(out, "{name}_bucket{labels} {cumulative}");
                }
                let sum = f64::from_bits(buckets.sum.load(Ordering::Relaxed));
                let labels = with(None);
                let _ = writeln!(out, "{name}_sum{labels} {sum}");
                let _ = writeln!(out, "{name}_count{labels} {cumulative}");
            }
            out.push('\n');
        }
    }
}

/// A label value as the text format writes it: `\`, `"` and line feeds escaped.
pub(crate) fn escaped(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

// === impl Buckets ===

impl Buckets {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }
}

impl HistogramFn for Buckets {
    fn record(&self, value: f64) {
        // The bounds are few and most samples fall in the first ones.
        let bucket = self
            .bounds
            .iter()
            .position(|&bound| value <= bound)
            .unwrap_or(self.bounds.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let mut sum = self.sum.load(Ordering::Relaxed);
        loop {
            let added = (f64::from_bits(sum) + value).to_bits();
            match self
                .sum
                .compare_exchange_weak(sum, added, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => sum = now,
            }
        }
    }
}

// === impl Layered ===

impl Recorder for Layered {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        if !self.counted.describe(key.as_str(), &description) {
            self.inner.describe_histogram(key, unit, description);
        }
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.inner.register_counter(key, metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.inner.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        match self.counted.series(key) {
            Some(buckets) => Histogram::from_arc(buckets),
            None => self.inner.register_histogram(key, metadata),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_counted_in_cumulative_buckets_with_their_sum_and_count() {
        let counted = Counted::new(&[("t_seconds", &[0.001, 0.01])]);
        let key = Key::from_parts("t_seconds", vec![metrics::Label::new("route", "a\"b")]);
        let series = counted.series(&key).expect("counted here");
        for value in [0.0005, 0.001, 0.005, 2.0] {
            series.record(value);
        }
        assert!(counted.series(&Key::from_name("other")).is_none());
        assert!(counted.describe("t_seconds", &SharedString::from("Time.")));
        let mut text = String::new();
        counted.render(&mut text);
        assert_eq!(
            text,
            "# HELP t_seconds Time.\n# TYPE t_seconds histogram\n\
             t_seconds_bucket{route=\"a\\\"b\",le=\"0.001\"} 2\n\
             t_seconds_bucket{route=\"a\\\"b\",le=\"0.01\"} 3\n\
             t_seconds_bucket{route=\"a\\\"b\",le=\"+Inf\"} 4\n\
             t_seconds_sum{route=\"a\\\"b\"} 2.0065\n\
             t_seconds_count{route=\"a\\\"b\"} 4\n\n"
        );
        // The same key is the same series.
        counted.series(&key).expect("counted here").record(0.0001);
        let mut text = String::new();
        counted.render(&mut text);
        assert!(
            text.contains("t_seconds_count{route=\"a\\\"b\"} 5\n"),
            "{text}"
        );
    }
}
