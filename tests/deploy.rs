//! The deployment artefacts, checked with the real tools: the Helm chart renders and lints in
//! both modes with several value sets (Helm's library) and validates strictly against the
//! Kubernetes schemas (scripts/check-chart.py), and its preStop hooks, run beside a real goodput,
//! signal vLLM only after goodput drained a stream; the Prometheus rules pass `promtool check
//! rules` and `promtool test rules` (a case for every alert); the committed dashboards are
//! what grafana/make_dashboards.py writes. tests/dashboards.rs evaluates their PromQL.

use std::path::Path;
use std::process::Command;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn helm_chart_renders_lints_and_validates_in_both_modes() {
    let python = std::env::var("GOODPUT_DEPLOY_PYTHON").unwrap_or_else(|_| {
        panic!("GOODPUT_DEPLOY_PYTHON is not set: run the suite with scripts/test.sh (scripts/setup-deploy-check.sh)")
    });
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("chart");
    let text = run(Command::new(python)
        .arg(Path::new(ROOT).join("scripts/check-chart.py"))
        .arg(env!("CARGO_BIN_EXE_goodput"))
        .arg(&out));
    assert!(text.contains("check-chart: ok"), "{text}");
    for set in ["sidecar-default", "sidecar-scorer-monitoring", "router-three-backends"] {
        assert!(text.contains(&format!("check-chart: {set}:")), "{text}");
    }
    assert!(text.contains("check-chart: shutdown order:"), "{text}");
}

#[test]
fn prometheus_rules_check_and_their_tests_pass() {
    let promtool = std::env::var("PROMTOOL_BIN").unwrap_or_else(|_| "promtool".into());
    let text = run(Command::new(&promtool)
        .args(["check", "rules"])
        .arg(Path::new(ROOT).join("helm/goodput/files/goodput-rules.yaml")));
    assert!(text.contains("SUCCESS"), "{text}");
    let text = run(Command::new(&promtool)
        .args(["test", "rules", "goodput-rules.test.yaml"])
        .current_dir(Path::new(ROOT).join("tests/rules")));
    assert!(text.contains("SUCCESS"), "{text}");
    // Every alert has a test case.
    let rules =
        std::fs::read_to_string(Path::new(ROOT).join("helm/goodput/files/goodput-rules.yaml")).unwrap();
    let tests = std::fs::read_to_string(Path::new(ROOT).join("tests/rules/goodput-rules.test.yaml")).unwrap();
    let alerts: Vec<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")).collect();
    assert!(alerts.len() >= 6, "{alerts:?}");
    for a in alerts {
        assert!(tests.contains(&format!("alertname: {a}")), "no promtool test for {a}");
    }
}

#[test]
fn committed_dashboards_are_what_the_generator_writes() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboards");
    let _ = std::fs::remove_dir_all(&out);
    run(Command::new("python3").arg(Path::new(ROOT).join("grafana/make_dashboards.py")).arg(&out));
    for name in ["overview", "quality", "routing"] {
        let file = format!("goodput-{name}.json");
        let made = std::fs::read_to_string(out.join(&file)).unwrap();
        let committed =
            std::fs::read_to_string(Path::new(ROOT).join("grafana/dashboards").join(&file)).unwrap();
        assert!(
            made == committed,
            "grafana/dashboards/{file} is stale: run python3 grafana/make_dashboards.py"
        );
    }
}
