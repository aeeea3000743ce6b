//! `GET /stats`: what the dashboard shows, as JSON. Decisions per second by route and limit over the last minutes,
//! responses per second by route, the store's state, the consumers held and the reloads, sampled from the
//! Prometheus recorder when asked (at most one sample a second, five minutes kept), so that nothing runs while no
//! one looks; and the few heaviest keys of each limit (see `top.rs`).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::{Admin, AdminError};

/// How much history is kept: the dashboard's charts span it.
const KEPT: Duration = Duration::from_secs(300);
/// Asked sooner than this after the last sample, the answer reuses it (a second viewer adds no parsing).
const SPACING: Duration = Duration::from_millis(900);

/// The samples taken, oldest first.
#[derive(Debug, Default)]
pub(super) struct Stats {
    samples: Mutex<VecDeque<Sample>>,
}

/// The counters and gauges the dashboard reads, at one moment.
#[derive(Debug, Clone, Default)]
struct Sample {
    at_ms: u64,
    /// `(route, limit)` to the allowed, denied and shadow-denied counts.
    decisions: BTreeMap<(String, String), [f64; 3]>,
    /// Responses by route.
    requests: BTreeMap<String, f64>,
    store_errors: f64,
    evicted_keys: f64,
    store_resets: f64,
    fallback: f64,
    consumers_held: Option<f64>,
    reloads_ok: f64,
    reloads_error: f64,
}

/// The decisions' outcomes, in a sample's order.
const OUTCOMES: [&str; 3] = ["allowed", "denied", "shadow_denied"];

/// `GET /stats` (behind the admin token).
pub(super) async fn stats(
    State(admin): State<Admin>,
    headers: HeaderMap,
) -> Result<Json<Value>, AdminError> {
    admin.authorize(&headers)?;
    let text = crate::telemetry::prometheus()
        .map(|handle| handle.render())
        .unwrap_or_default();
    let samples = admin.stats.sampled(&text, now_ms());
    let (_, readiness) = crate::gateway::readiness(&admin.gateway, admin.degraded_status);
    let mut shown = answer(&samples, readiness);
    shown["top"] = super::top::for_stats(&admin);
    shown["consumers"]["nearest"] = super::top::nearest_for_stats(&admin);
    shown["upstreams"] = json!(super::upstreams::health(&admin));
    shown["reloads"]["last"] = admin
        .gateway
        .last_reloads()
        .into_iter()
        .map(|reload| json!({"at_ms": reload.at_ms, "applied": reload.refused.is_none(), "error": reload.refused}))
        .collect();
    Ok(Json(shown))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

// === impl Stats ===

impl Stats {
    /// The samples after taking one from `metrics` at `now_ms` (unless the last is recent).
    fn sampled(&self, metrics: &str, now_ms: u64) -> Vec<Sample> {
        let mut samples = self.samples.lock();
        let recent = samples
            .back()
            .is_some_and(|last| now_ms.saturating_sub(last.at_ms) < SPACING.as_millis() as u64);
        if !recent {
            samples.push_back(Sample::parse(metrics, now_ms));
        }
        let oldest = now_ms.saturating_sub(KEPT.as_millis() as u64);
        while samples.front().is_some_and(|first| first.at_ms < oldest) {
            samples.pop_front();
        }
        samples.iter().cloned().collect()
    }
}

// === impl Sample ===

impl Sample {
    /// The series the dashboard reads, from Prometheus's text format.
    fn parse(text: &str, at_ms: u64) -> Self {
        let mut sample = Sample {
            at_ms,
            ..Sample::default()
        };
        // Comments and other series fall through the match below.
        for line in text.lines() {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let label = |wanted: &str| label_value(labels, wanted);
            match name {
                "tollgate_decisions_total" => {
                    let (Some(route), Some(limit), Some(decision)) =
                        (label("route"), label("limit"), label("decision"))
                    else {
                        continue;
                    };
                    let Some(outcome) = OUTCOMES.iter().position(|o| *o == decision) else {
                        continue;
                    };
                    // A plan's limit counts per plan too: summed, as the route and limit they were checked on.
                    sample.decisions.entry((route, limit)).or_default()[outcome] += value;
                }
                "tollgate_requests_total" => {
                    if let Some(route) = label("route") {
                        *sample.requests.entry(route).or_default() += value;
                    }
                }
                "tollgate_store_errors_total" => sample.store_errors += value,
                "tollgate_store_evicted_keys_total" => sample.evicted_keys += value,
                "tollgate_store_resets_total" => sample.store_resets += value,
                "tollgate_store_fallback" => sample.fallback = value,
                "tollgate_consumer_directory_consumers" => {
                    *sample.consumers_held.get_or_insert(0.0) += value
                }
                "tollgate_config_reloads_total" => match label("result").as_deref() {
                    Some("ok") => sample.reloads_ok += value,
                    Some(_) => sample.reloads_error += value,
                    None => {}
                },
                _ => {}
            }
        }
        sample
    }
}

/// The value of label `wanted` in `labels` (`a="x",b="y"`, values escaped as Prometheus escapes them).
fn label_value(labels: &str, wanted: &str) -> Option<String> {
    let mut rest = labels;
    while !rest.is_empty() {
        let (name, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((at, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => {}
                },
                '"' => {
                    end = at + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        if name.trim_start_matches(',') == wanted {
            return Some(value);
        }
        rest = after[end..].trim_start_matches(',');
    }
    None
}

/// The answer: rates between consecutive samples, the latest state, and `readiness` as `/readyz` gives it.
fn answer(samples: &[Sample], readiness: Value) -> Value {
    let latest = samples.last().cloned().unwrap_or_default();
    let pairs: Vec<(&Sample, &Sample)> = samples.iter().zip(samples.iter().skip(1)).collect();
    let per_second = |before: f64, after: f64, from: &Sample, to: &Sample| {
        let seconds = to.at_ms.saturating_sub(from.at_ms) as f64 / 1e3;
        if seconds > 0.0 {
            // A counter that went back (the recorder was replaced) counts from zero.
            (after - before).max(0.0) / seconds
        } else {
            0.0
        }
    };
    let rate_now = |value: &dyn Fn(&Sample) -> f64| {
        pairs.last().map_or(0.0, |(from, to)| {
            per_second(value(from), value(to), from, to)
        })
    };
    let decisions: Vec<Value> = latest
        .decisions
        .keys()
        .map(|(route, limit)| {
            let key = (route.clone(), limit.clone());
            let count = |sample: &Sample, outcome: usize| {
                sample
                    .decisions
                    .get(&key)
                    .map_or(0.0, |counts| counts[outcome])
            };
            let mut entry = json!({"route": route, "limit": limit});
            for (outcome, name) in OUTCOMES.iter().enumerate() {
                let history: Vec<f64> = pairs
                    .iter()
                    .map(|(from, to)| {
                        per_second(count(from, outcome), count(to, outcome), from, to)
                    })
                    .collect();
                entry[format!("{name}_per_second")] = json!(history.last().copied().unwrap_or(0.0));
                entry["history"][*name] = json!(history);
            }
            entry
        })
        .collect();
    let requests: BTreeMap<&String, f64> = latest
        .requests
        .keys()
        .map(|route| {
            let value = |sample: &Sample| sample.requests.get(route).copied().unwrap_or(0.0);
            (route, rate_now(&value))
        })
        .collect();
    json!({
        "at_ms": latest.at_ms,
        "times_ms": pairs.iter().map(|(_, to)| to.at_ms).collect::<Vec<_>>(),
        "decisions": decisions,
        "requests_per_second": requests,
        "store": {
            "readiness": readiness,
            "fallback_active": latest.fallback > 0.0,
            "errors_per_second": rate_now(&|sample: &Sample| sample.store_errors),
            "evicted_keys": latest.evicted_keys,
            "resets": latest.store_resets,
        },
        "consumers": {"held": latest.consumers_held},
        "reloads": {"ok": latest.reloads_ok, "error": latest.reloads_error},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = r#"# TYPE tollgate_decisions_total counter
tollgate_decisions_total{route="api",limit="per_ip",decision="allowed"} 10
tollgate_decisions_total{route="api",limit="per_ip",decision="denied"} 4
tollgate_decisions_total{route="api",limit="hourly",decision="allowed",plan="pro"} 3
tollgate_decisions_total{route="api",limit="hourly",decision="allowed",plan="free"} 2
tollgate_decisions_total{route="odd \"name\"",limit="x",decision="shadow_denied"} 1
tollgate_requests_total{route="api",status="200"} 10
tollgate_requests_total{route="api",status="429"} 4
tollgate_store_fallback 1
tollgate_config_reloads_total{result="error"} 2
"#;

    #[test]
    fn a_sample_reads_the_series_the_dashboard_shows() {
        let sample = Sample::parse(METRICS, 1_000);
        let per_ip = &sample.decisions[&("api".to_owned(), "per_ip".to_owned())];
        assert_eq!(per_ip, &[10.0, 4.0, 0.0]);
        // Two plans' counts of one route and limit, summed.
        let hourly = &sample.decisions[&("api".to_owned(), "hourly".to_owned())];
        assert_eq!(hourly[0], 5.0);
        let odd = &sample.decisions[&("odd \"name\"".to_owned(), "x".to_owned())];
        assert_eq!(odd[2], 1.0);
        assert_eq!(sample.requests["api"], 14.0);
        assert_eq!(sample.fallback, 1.0);
        assert_eq!(sample.reloads_error, 2.0);
        assert_eq!(sample.consumers_held, None);
    }

    #[test]
    fn rates_are_the_differences_between_samples_per_second() {
        let stats = Stats::default();
        stats.sampled(METRICS, 1_000);
        // Asked again within a second: no new sample.
        assert_eq!(stats.sampled(METRICS, 1_500).len(), 1);
        let later = METRICS.replace("decision=\"denied\"} 4", "decision=\"denied\"} 24");
        let samples = stats.sampled(&later, 3_000);
        assert_eq!(samples.len(), 2);
        let answer = answer(&samples, json!({}));
        let per_ip = answer["decisions"]
            .as_array()
            .and_then(|all| all.iter().find(|d| d["limit"] == "per_ip"))
            .expect("per_ip")
            .clone();
        // 20 more denials over 2 s.
        assert_eq!(per_ip["denied_per_second"], 10.0);
        assert_eq!(per_ip["allowed_per_second"], 0.0);
        assert_eq!(per_ip["history"]["denied"], json!([10.0]));
        assert_eq!(answer["times_ms"], json!([3_000]));
        assert_eq!(answer["store"]["fallback_active"], true);
        // Kept for five minutes, then gone.
        assert_eq!(stats.sampled(&later, 300_000)[0].at_ms, 1_000);
        assert_eq!(stats.sampled(&later, 302_000)[0].at_ms, 3_000);
    }
}
