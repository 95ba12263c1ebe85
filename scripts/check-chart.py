"""Lints, renders and validates the Helm chart without a `helm` binary or a cluster.

- helm-python-sdk (Helm's library): `lint --strict`, then render with the default values and
  with charts/replay-ingest/ci/all-on-values.yaml;
- kubernetes-validate --strict: every rendered manifest against the Kubernetes schemas (KEDA's
  ScaledObject is a CRD without a bundled schema: checked for its required fields instead);
- every `config` key must be a real REPLAY_INGEST_* variable of `replay-ingest consume`;
- every metric the Datadog dashboard queries is in the metrics catalogue (src/metrics.rs).

Usage: python3 scripts/check-chart.py BINARY   (run by scripts/test.sh inside its venv)
"""

import json
import pathlib
import re
import subprocess
import sys
import tempfile

import helm_python as helm
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "replay-ingest"
KUBE_VERSION = "1.30.0"


def fail(message):
    print(f"chart: {message}", file=sys.stderr)
    sys.exit(1)


def documents(rendered):
    for path, text in sorted(rendered.items()):
        for doc in yaml.safe_load_all(text):
            if doc:
                yield path, doc


def check(values_name, values):
    report = helm.lint(str(CHART), values, strict=True, kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2] + report.get("errors", [])
    if problems:
        fail(f"lint ({values_name}): {problems}")
    chart = helm.Chart.load(str(CHART))
    rendered = chart.render(values, name="replay-ingest", namespace="replays", is_install=True)
    docs = list(documents(rendered))
    kinds = sorted(doc["kind"] for _, doc in docs)
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, (path, doc) in enumerate(docs):
            if doc["apiVersion"].startswith("keda.sh/"):
                spec = doc["spec"]
                if not spec["scaleTargetRef"]["name"] or not spec["triggers"]:
                    fail(f"{path}: ScaledObject needs a target and triggers")
                continue
            file = pathlib.Path(tmp) / f"{i}.yaml"
            file.write_text(yaml.safe_dump(doc))
            files.append(str(file))
        result = subprocess.run(
            [str(pathlib.Path(sys.executable).parent / "kubernetes-validate"), "--strict", "--kubernetes-version", KUBE_VERSION, *files],
            capture_output=True, text=True,
        )
        if result.returncode != 0 or "ERROR" in result.stdout:
            fail(f"kubernetes-validate ({values_name}):\n{result.stdout}{result.stderr}")
    print(f"chart ({values_name}): lint clean, {len(docs)} manifests valid: {', '.join(kinds)}")
    return docs


def main():
    binary = sys.argv[1]
    help_text = subprocess.run([binary, "consume", "--help"], capture_output=True, text=True, check=True).stdout
    known = {line.split("[env: ")[1].split("=")[0].rstrip("]") for line in help_text.splitlines() if "[env: " in line}
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    all_on = yaml.safe_load((CHART / "ci" / "all-on-values.yaml").read_text())
    for name, values in [("values.yaml", defaults), ("ci/all-on-values.yaml", all_on)]:
        unknown = sorted(f"REPLAY_INGEST_{k}" for k in values.get("config", {}) if f"REPLAY_INGEST_{k}" not in known)
        if unknown:
            fail(f"{name}: config keys that replay-ingest does not read: {unknown}")
    catalogue = set(re.findall(r'pub const [A-Z_]+: &str = "([a-z_.]+)";', (ROOT / "src" / "metrics.rs").read_text()))
    dashboard = json.loads((CHART / "dashboards" / "datadog.json").read_text())
    queried = {q for w in dashboard["widgets"] for r in w["definition"]["requests"] for q in re.findall(r":replay_ingest\.([a-z_.]+)\{", r["q"])}
    if not queried or queried - catalogue:
        fail(f"dashboard queries metrics missing from src/metrics.rs: {sorted(queried - catalogue)}")
    print(f"dashboard: {len(dashboard['widgets'])} widgets over {len(queried)} catalogued metrics")
    check("default values", None)
    docs = check("every option on", all_on)
    if not any(d["kind"] == "ScaledObject" for _, d in docs):
        fail("the all-on values should render the KEDA ScaledObject")
    # The chart refuses a grace period the drain does not fit in — with its own message; any other
    # render error (a template bug) is a failure, not the expected refusal.
    try:
        helm.Chart.load(str(CHART)).render({"terminationGracePeriodSeconds": 10}, name="x", namespace="y")
    except helm.HelmError as error:
        if "must exceed config.DRAIN_DEADLINE_MS" not in str(error):
            fail(f"a grace period below the drain deadline was refused for another reason: {error}")
    else:
        fail("a grace period below the drain deadline must not render")
    print("a grace period below the drain deadline is refused, naming the drain deadline")


if __name__ == "__main__":
    main()
