//! The shipped Grafana dashboard and Prometheus alert rules (`deploy/`): valid for the tools that load them
//! (promtool checks every rule and every panel's query), and naming only series and labels tollgate exports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Runs `promtool check rules` on `file`; panics with its words when it refuses.
fn promtool_accepts(file: &Path) {
    let output = Command::new("promtool")
        .args(["check", "rules"])
        .arg(file)
        .output()
        .expect("promtool (scripts/test.sh installs Debian's prometheus package for it)");
    assert!(
        output.status.success(),
        "promtool refused {}:\n{}{}",
        file.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The series tollgate exports and each one's labels, as docs/operations.md's metrics table gives them
/// (tests/documented.rs holds that table to the series the source registers, no more and no fewer).
fn exported() -> BTreeMap<String, BTreeSet<String>> {
    let docs = read("docs/operations.md");
    let mut exported = BTreeMap::new();
    for line in docs.lines().filter(|line| line.starts_with("| `tollgate_")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`').to_owned();
        // The labels cell: each label in backquotes, some followed by their values in parentheses.
        let mut depth = 0;
        let without_values: String = cells[3]
            .chars()
            .filter(|c| {
                depth += i32::from(*c == '(') - i32::from(*c == ')');
                depth == 0 && *c != ')'
            })
            .collect();
        let labels = without_values
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        exported.insert(name, labels);
    }
    assert!(exported.len() > 20, "the metrics table was not found");
    exported
}

/// Checks that `expr` names only exported series, and only labels they have (or Prometheus's own).
fn names_only_exported(expr: &str, exported: &BTreeMap<String, BTreeSet<String>>) {
    let mut labels: BTreeSet<String> = ["instance", "job", "le"].map(String::from).into();
    let mut series = Vec::new();
    for (at, _) in expr.match_indices("tollgate_") {
        let name: String = expr[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .filter(|base| exported.contains_key(*base))
            .unwrap_or(&name)
            .to_owned();
        let known = exported
            .get(&base)
            .unwrap_or_else(|| panic!("{expr}: tollgate exports no series {name}"));
        labels.extend(known.iter().cloned());
        series.push(base);
    }
    assert!(!series.is_empty(), "{expr}: names no tollgate series");
    // Labels in selectors (`{decision="denied"}`) and groupings (`by (route, limit)`).
    let mut used = Vec::new();
    let inside = |from: usize, close: char| expr[from..].split(close).next().unwrap_or_default();
    for (at, _) in expr.match_indices('{') {
        let matchers = inside(at + 1, '}');
        used.extend(
            matchers
                .split(',')
                .map(|m| m.split(['=', '!']).next().unwrap_or_default()),
        );
    }
    for keyword in ["by (", "without ("] {
        for (at, _) in expr.match_indices(keyword) {
            used.extend(inside(at + keyword.len(), ')').split(','));
        }
    }
    let used: Vec<String> = used
        .into_iter()
        .map(|label| label.trim().to_owned())
        .filter(|label| !label.is_empty())
        .collect();
    for label in used {
        assert!(
            labels.contains(&label),
            "{expr}: label {label} is not one of {series:?}'s ({labels:?})"
        );
    }
}

#[test]
fn the_alert_rules_load_in_prometheus_and_name_only_what_tollgate_exports() {
    let path = Path::new(ROOT).join("deploy/prometheus/alerts.yaml");
    promtool_accepts(&path);
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&read("deploy/prometheus/alerts.yaml")).expect("YAML");
    let exported = exported();
    let mut alerts = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("an alert rule").to_owned();
            let severity = rule["labels"]["severity"].as_str();
            assert!(
                matches!(severity, Some("warning" | "critical")),
                "{name}: severity {severity:?}"
            );
            for annotation in ["summary", "description"] {
                assert!(
                    rule["annotations"][annotation].as_str().is_some(),
                    "{name}: no {annotation}"
                );
            }
            names_only_exported(rule["expr"].as_str().expect("expr"), &exported);
            alerts.push(name);
        }
    }
    // What an operator of a rate limiter is woken for.
    for expected in [
        "TollgateStoreDown",
        "TollgateRedisEvictingLimitState",
        "TollgateDenialsRising",
        "TollgateLeasesExpiring",
        "TollgateConsumerDirectoryLost",
        "TollgateCertificateExpiring",
    ] {
        assert!(
            alerts.iter().any(|a| a == expected),
            "no {expected} in {alerts:?}"
        );
    }
}

#[test]
fn the_grafana_dashboard_s_queries_load_in_prometheus_and_name_only_what_tollgate_exports() {
    let dashboard: Value =
        serde_json::from_str(&read("deploy/grafana/tollgate.json")).expect("JSON");
    let exported = exported();
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for panel in panels {
        let title = panel["title"].as_str().expect("a title");
        assert!(
            ids.insert(panel["id"].as_u64().expect("an id")),
            "{title}: id repeated"
        );
        let grid = &panel["gridPos"];
        let right = grid["x"].as_u64().expect("x") + grid["w"].as_u64().expect("w");
        assert!(right <= 24, "{title}: wider than the dashboard");
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            let expr = target["expr"].as_str().expect("expr");
            names_only_exported(expr, &exported);
            // Grafana's variables, as Grafana would fill them in.
            let filled = expr
                .replace("$__rate_interval", "1m")
                .replace("$instance", ".*");
            rules.push_str(&format!(
                "      - record: dashboard:query\n        expr: {filled:?}\n"
            ));
        }
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("dashboard-queries.yaml");
    std::fs::write(&file, rules).expect("write");
    promtool_accepts(&file);
}

#[test]
fn a_query_naming_a_series_or_label_tollgate_lacks_is_caught() {
    let exported = exported();
    names_only_exported(
        "sum by (route, limit) (rate(tollgate_decisions_total{decision=\"denied\"}[5m]))",
        &exported,
    );
    for wrong in [
        "rate(tollgate_decisions_total_typo[5m])",
        "sum by (consumer) (rate(tollgate_decisions_total[5m]))",
        "rate(tollgate_store_errors_total{route=\"a\"}[5m])",
    ] {
        let caught = std::panic::catch_unwind(|| names_only_exported(wrong, &exported));
        assert!(caught.is_err(), "{wrong} passed");
    }
}
