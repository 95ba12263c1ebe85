"""Lints, renders and validates the Helm chart without a `helm` binary or a cluster.

- helm-python-sdk (Helm's library): `lint --strict`, then render with the default values and
  with charts/replay-ingest/ci/all-on-values.yaml;
- kubernetes-validate --strict: every rendered manifest against the Kubernetes schemas (KEDA's
  ScaledObject is a CRD without a bundled schema: checked for its required fields instead);
- every `config` key must be a real REPLAY_INGEST_* variable of `replay-ingest consume`, and
  values.schema.json admits exactly those (a misspelt key is refused, not ignored);
- every metric the Datadog dashboard queries is in the metrics catalogue (src/metrics.rs);
- the memory limit the chart gives a pod when `resources.limits.memory` is unset holds what the
  service may hold (`check-config`'s bound, with room for the baseline) for 1 to 16 processing
  threads, and one set is kept;
- the Datadog monitors (dashboards/datadog-monitors.json): one for each alert of
  docs/operations.md's Alerts table, on a metric its row names, each query well formed — a
  catalogued metric, counters as counts or rates and gauges not, tags the metric carries, its
  threshold the one the query compares with — and each runbook its message names exists; with
  datadogMonitors on, each is rendered as a DatadogMonitor in the operator's spelling, with the
  scope, handles and tags given;
- a tool's Job (toolJob) runs with the release's image, settings, Secrets, volumes, ServiceAccount
  and security contexts, toolJob.env replacing variables of its names, its pod none of the
  Deployment's, and `sweep` runs with the environment it renders, `redrive` too on the local
  broker when one runs (REPLAY_INGEST_TEST_BROKERS, as the test command sets it);
- the recommended labels on every object and on the pod template; the container port, the probes
  and REPLAY_INGEST_HTTP_LISTEN agree; Kafka properties render one per line; with SASL and KEDA, a
  TriggerAuthentication reads the same Secret the pods mount; NOTES.txt renders;
- the Dockerfile agrees with the chart (runtime user, port), copies only what exists, has OCI
  labels;
- the chart refuses what it must (a grace period below the drain deadline and the exit after it, config.HTTP_LISTEN,
  config.STATSD_ADDRESS and config.STATSD_TAGS, a config key a mounted Secret's path sets), each
  with its own message; and the service refuses what renders but cannot start (check-config: a
  drain deadline as long as the session, a Kafka property librdkafka does not know).

Usage: python3 scripts/check-chart.py BINARY   (run by scripts/test.sh inside its venv)
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import helm_python as helm
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "replay-ingest"
KUBE_VERSION = "1.30.0"


def fail(message):
    print(f"chart: {message}", file=sys.stderr)
    sys.exit(1)


RECOMMENDED_LABELS = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
]


def documents(rendered):
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
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
            if doc["apiVersion"] == "datadoghq.com/v1alpha1":
                # The Datadog Operator's CRD: no bundled schema (check_datadog_monitors checks them).
                continue
            if doc["apiVersion"].startswith("keda.sh/"):
                spec = doc["spec"]
                if doc["kind"] == "ScaledObject" and not (spec["scaleTargetRef"]["name"] and spec["triggers"]):
                    fail(f"{path}: ScaledObject needs a target and triggers")
                if doc["kind"] == "TriggerAuthentication" and not all(
                    r["parameter"] and r["name"] and r["key"] for r in spec["secretTargetRef"]
                ):
                    fail(f"{path}: every secretTargetRef needs a parameter, a Secret and a key")
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
    notes = next((text for path, text in rendered.items() if path.endswith("NOTES.txt")), "")
    if "port-forward" not in notes:
        fail(f"NOTES.txt ({values_name}) did not render: {notes!r}")
    check_wiring(values_name, docs)
    print(f"chart ({values_name}): lint clean, {len(docs)} manifests valid: {', '.join(kinds)}")
    return docs


def check_wiring(values_name, docs):
    """Labels, the HTTP port, properties and KEDA's credentials, as rendered."""
    by_kind = {}
    for path, doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
        labels = doc["metadata"].get("labels", {})
        missing = [l for l in RECOMMENDED_LABELS if l not in labels]
        if missing:
            fail(f"{path} ({values_name}): {doc['kind']} lacks the recommended labels {missing}")
    deployment = by_kind["Deployment"][0]
    template = deployment["spec"]["template"]
    missing = [l for l in RECOMMENDED_LABELS if l not in template["metadata"]["labels"]]
    if missing:
        fail(f"pod template ({values_name}) lacks the recommended labels {missing}")
    data = by_kind["ConfigMap"][0]["data"]
    container = template["spec"]["containers"][0]
    # The ConfigMap is a copy of the settings (for kubectl, a hand-made Job); the pods carry them.
    inline = {e["name"]: e.get("value") for e in container.get("env", [])}
    differing = {k: (v, inline.get(k)) for k, v in data.items() if inline.get(k) != v}
    if differing:
        fail(f"({values_name}) the ConfigMap and the pod's settings differ: {differing}")
    port = container["ports"][0]["containerPort"]
    if data["REPLAY_INGEST_HTTP_LISTEN"] not in (f"0.0.0.0:{port}", f"[::]:{port}"):
        fail(f"({values_name}) the container port {port} and REPLAY_INGEST_HTTP_LISTEN={data['REPLAY_INGEST_HTTP_LISTEN']} differ")
    probes = [container[p]["httpGet"]["port"] for p in ("startupProbe", "livenessProbe", "readinessProbe")]
    if probes != ["http"] * 3:
        fail(f"({values_name}) every probe must use the named port: {probes}")
    properties = data.get("REPLAY_INGEST_KAFKA_PROPERTIES")
    if properties is not None and any("=" not in line for line in properties.split("\n")):
        fail(f"({values_name}) Kafka properties must be key=value, one per line: {properties!r}")
    if any("PASSWORD" in k and "FILE" not in k for k in data):
        fail(f"({values_name}) a password in the ConfigMap: {sorted(data)}")
    scaled = by_kind.get("ScaledObject", [])
    if scaled and data.get("REPLAY_INGEST_KAFKA_SECURITY_PROTOCOL", "").startswith("SASL_"):
        auth = by_kind.get("TriggerAuthentication", [])
        trigger = scaled[0]["spec"]["triggers"][0]
        if not auth or trigger.get("authenticationRef", {}).get("name") != auth[0]["metadata"]["name"]:
            fail(f"({values_name}) KEDA with SASL needs a TriggerAuthentication the trigger references")
        mounted = {v["secret"]["secretName"] for v in template["spec"]["volumes"] if "secret" in v}
        referenced = {r["name"] for r in auth[0]["spec"]["secretTargetRef"]}
        if not referenced <= mounted:
            fail(f"({values_name}) KEDA reads Secrets the pods do not use: {sorted(referenced - mounted)}")
        if trigger["metadata"].get("sasl") not in ("plaintext", "scram_sha256", "scram_sha512"):
            fail(f"({values_name}) KEDA's sasl mode: {trigger['metadata']}")


def pod_env(docs):
    """The environment the container starts with, as Kubernetes builds it from the rendered
    manifests: the container's own variables (the settings are in the pod spec, not read from
    the ConfigMap), `$(VAR)` expanded; the values Kubernetes fills in at run time (the pod's
    name, the node's IP, its labels) stand in."""
    container = first_container(docs)
    if "envFrom" in container:
        fail(f"the pod reads its settings from elsewhere ({container['envFrom']}): an old pod restarting mid-rollout would take the new release's")
    env = {}
    fields = {"metadata.name": "replay-ingest-7d9f-abcde", "status.hostIP": "10.0.0.1"}
    for variable in first_container(docs).get("env", []):
        if "value" in variable:
            # `$(NAME)` of a variable defined before it; `$$` is a literal `$`.
            value = re.sub(
                r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)",
                lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]),
                variable["value"],
            )
        else:
            # The pod's own fields; a Secret's or ConfigMap's key stands in as a placeholder.
            path = variable["valueFrom"].get("fieldRef", {}).get("fieldPath")
            value = fields.get(path, "label-value" if path else "from-a-reference")
        env[variable["name"]] = value
    return env


# A Datadog metric monitor's query: `AGG(last_N):SPACE:METRIC{SCOPE} [by {TAGS}][.as_count()] OP N`.
MONITOR_QUERY = re.compile(
    r"^(?:change\((?:avg|max|min|sum)\(last_\d+[mh]\),last_\d+[mh]\)|(?:avg|max|min|sum)\(last_\d+[mh]\)):(?:avg|max|min|sum):"
    r"(?P<metric>[a-z_.]+)\{(?P<scope>[^}]*)\}(?: by \{(?P<by>[a-z_,]+)\})?(?P<as>\.as_(?:count|rate)\(\))? "
    r"(?P<op>>|>=|<|<=) (?P<threshold>\d+(?:\.\d+)?)$")

# Tags every metric carries (src/metrics.rs and the chart's statsd tags), and what the
# Kubernetes integration tags its own metrics with.
COMMON_TAGS = {"service", "version", "env", "pod_name"}
KUBE_METRICS = {"kubernetes_state.container.restarts": {"kube_container_name", "kube_namespace", "pod_name"}}


def check_monitors():
    """The monitors cover docs/operations.md's Alerts table, each query one Datadog would run."""
    catalogue = {}
    for name, kind, tags in re.findall(r"^//! \| `([a-z_.]+)` \| (counter|gauge|distribution) \|[^|]*\|([^|]*)\|",
                                       (ROOT / "src" / "metrics.rs").read_text(), re.M):
        catalogue[f"replay_ingest.{name}"] = (kind, set(re.findall(r"`([a-z_]+)`", tags)) | COMMON_TAGS)
    for name, tags in KUBE_METRICS.items():
        catalogue[name] = ("gauge", tags)
    operations = (ROOT / "docs" / "operations.md").read_text()
    section = operations.split("### Alerts", 1)[1].split("\n## ", 1)[0]
    alerts = {row[0]: set(re.findall(r"`([a-z_.]+)(?:\{|`)", row[1]))
              for row in (line.strip("|").split("|") for line in section.splitlines() if line.startswith("| "))
              for row in [[cell.strip() for cell in row]] if row[0] not in ("alert", "---")}
    runbooks = {title.replace('"', "") for title in re.findall(r"^- \*\*(.+?)\*\*", operations.split("### Runbooks", 1)[1], re.M)}
    monitors = json.loads((CHART / "dashboards" / "datadog-monitors.json").read_text())
    covered = set()
    for monitor in monitors:
        name = monitor["name"]
        query = MONITOR_QUERY.match(monitor["query"])
        if monitor["type"] != "query alert" or not query:
            fail(f"monitor {name!r}: not a metric query Datadog runs: {monitor['query']!r}")
        metric, threshold = query["metric"], float(query["threshold"])
        if metric not in catalogue:
            fail(f"monitor {name!r}: {metric} is not a catalogued metric")
        kind, tags = catalogue[metric]
        if (kind == "counter") != bool(query["as"]):
            fail(f"monitor {name!r}: a {kind} is queried {'with' if query['as'] else 'without'} .as_count()/.as_rate()")
        used = {t.split(":")[0] for t in query["scope"].split(",") if t != "*"} | set(filter(None, (query["by"] or "").split(",")))
        if used - tags:
            fail(f"monitor {name!r}: {metric} carries no tag {sorted(used - tags)}")
        if monitor["options"]["thresholds"]["critical"] != threshold:
            fail(f"monitor {name!r}: its critical threshold is not the query's {threshold}")
        by = set(filter(None, (query["by"] or "").split(",")))
        named = set(re.findall(r"\{\{([a-z_]+)\.name\}\}", name + monitor["message"]))
        if named - by:
            fail(f"monitor {name!r}: {sorted(named - by)} in its text, not among the groups of its query ({sorted(by)})")
        for title in re.findall(r'runbook "([^"]+)"', monitor["message"]):
            if not any(title in r for r in runbooks):
                fail(f"monitor {name!r}: no runbook {title!r} in docs/operations.md")
        alert = next((a for a in alerts if re.fullmatch(rf"replay-ingest: {re.escape(a)}(?: \(.*\))?", name)), None)
        if alert is None:
            fail(f"monitor {name!r} is for no alert of docs/operations.md's table {sorted(alerts)}")
        if alert in covered:
            fail(f"two monitors for the alert {alert!r}")
        if alert != "pods restarting" and metric.removeprefix("replay_ingest.") not in alerts[alert]:
            fail(f"monitor {name!r}: {metric} is not a signal of its alert ({sorted(alerts[alert])})")
        covered.add(alert)
    if covered != set(alerts):
        fail(f"alerts of docs/operations.md without a monitor: {sorted(set(alerts) - covered)}")
    print(f"monitors: {len(monitors)}, one for each of the {len(alerts)} alerts of docs/operations.md, on catalogued metrics")


# The DatadogMonitor fields (datadoghq.com/v1alpha1) the chart may set, and their options.
MONITOR_SPEC = {"name", "type", "query", "message", "priority", "tags", "options"}
MONITOR_OPTIONS = {"evaluationDelay", "includeTags", "newGroupDelay", "noDataTimeframe", "notifyNoData",
                   "renotifyInterval", "requireFullWindow", "thresholds", "timeoutH"}


def unscoped(query):
    """A rendered monitor's query without the scope the chart put first in each filter (`env:prod`,
    or the release's namespace for the Kubernetes integration's metrics)."""
    return re.sub(r"\{(?:env:prod|kube_namespace:replays)(?:,([^}]*))?\}", lambda m: "{" + (m[1] or "*") + "}", query)


def check_datadog_monitors():
    """datadogMonitors renders each monitor of datadog-monitors.json as a DatadogMonitor, in the
    operator's spelling, with the scope, the notification handles and the tags it is given."""
    if any(d["kind"] == "DatadogMonitor" for _, d in render_docs({})):
        fail("DatadogMonitors rendered without datadogMonitors.enabled")
    monitors = json.loads((CHART / "dashboards" / "datadog-monitors.json").read_text())
    settings = {"enabled": True, "scope": "env:prod", "notify": "@pagerduty-replays", "tags": ["team:replays"]}
    rendered = [d for _, d in render_docs({"datadogMonitors": settings}) if d["kind"] == "DatadogMonitor"]
    if len(rendered) != len(monitors):
        fail(f"{len(rendered)} DatadogMonitors rendered for {len(monitors)} monitors")
    names = [d["metadata"]["name"] for d in rendered]
    if len(set(names)) != len(names) or not all(len(n) <= 253 and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", n) for n in names):
        fail(f"DatadogMonitor names must be distinct DNS subdomains: {names}")
    for monitor, doc in zip(monitors, rendered):
        spec = doc["spec"]
        camel = lambda key: re.sub(r"_([a-z])", lambda m: m[1].upper(), key)
        # Every filter of the service's metrics starts with the scope, and is the file's without it;
        # the Kubernetes integration's is the release's namespace.
        filters = re.findall(r"(?:replay_ingest\.[a-z_.]+|kubernetes_state\.[a-z_.]+)\{([^}]*)\}", spec["query"])
        if not filters or not all(f.split(",")[0] == ("kube_namespace:replays" if "kube_" in f else "env:prod") for f in filters):
            fail(f"DatadogMonitor {doc['metadata']['name']}: a filter without the scope: {spec['query']}")
        if unscoped(spec["query"]) != monitor["query"]:
            fail(f"DatadogMonitor {doc['metadata']['name']}: {spec['query']} is not {monitor['query']} with the scope")
        expected = {
            "name": f"{monitor['name']} [replays/replay-ingest]", "type": monitor["type"], "priority": monitor["priority"],
            "query": spec["query"],
            "message": f"{monitor['message']} {settings['notify']}",
            "tags": monitor["tags"] + settings["tags"] + ["generated:kubernetes"],
            "options": {camel(k): ({camel(level): json.dumps(t) for level, t in v.items()} if k == "thresholds" else v)
                        for k, v in monitor["options"].items()},
        }
        if set(spec) - MONITOR_SPEC or set(spec["options"]) - MONITOR_OPTIONS:
            fail(f"DatadogMonitor {doc['metadata']['name']}: fields the operator does not take: {sorted((set(spec) - MONITOR_SPEC) | (set(spec['options']) - MONITOR_OPTIONS))}")
        if spec != expected:
            fail(f"DatadogMonitor {doc['metadata']['name']}: {spec} (expected {expected})")
    # Another metric prefix (Sentry's own, or none) is the one the monitors watch: with the
    # default's names written in, every monitor would watch names no pod sends.
    for prefix, named in [("sentry", "sentry."), ("", "")]:
        values = {"datadogMonitors": settings, "config": {"STATSD_PREFIX": prefix}}
        prefixed = [d for _, d in render_docs(values) if d["kind"] == "DatadogMonitor"]
        for monitor, doc in zip(monitors, prefixed):
            spec = doc["spec"]
            expected = monitor["query"].replace("replay_ingest.", named)
            if unscoped(spec["query"]) != expected or "replay_ingest." in spec["message"]:
                fail(f"DatadogMonitor {doc['metadata']['name']} with STATSD_PREFIX {prefix!r}: {spec['query']} (expected {expected} with the scope)")
    # Two clusters in one organisation: the Kubernetes integration's filter names the cluster.
    clustered = [d["spec"]["query"] for _, d in render_docs({"datadogMonitors": {**settings, "clusterName": "prod-eu"}})
                 if d["kind"] == "DatadogMonitor" and "kubernetes_state." in d["spec"]["query"]]
    if not clustered or not all("{kube_cluster_name:prod-eu,kube_namespace:replays," in q for q in clustered):
        fail(f"with datadogMonitors.clusterName, the Kubernetes integration's filters name the cluster: {clustered}")
    print(f"DatadogMonitors: {len(rendered)}, as datadog-monitors.json says, with the scope, handles and tags given, the metric prefix set, and the cluster named")


def check_config(binary, docs, values_name, refused=None):
    """`replay-ingest check-config` with the pod's environment: the service would start with what
    the chart renders (or, with `refused`, refuses it saying so) — values that render but that the
    binary refuses are a crash loop after the rollout."""
    env = pod_env(docs)
    # One thread per core of whatever node runs it: neither the memory bound below nor the pod's
    # limit would hold (the chart sets one per requested core).
    if env.get("REPLAY_INGEST_PROCESSING_THREADS") in (None, "0"):
        fail(f"({values_name}) the processing threads must be set: {env.get('REPLAY_INGEST_PROCESSING_THREADS')!r}")
    result = subprocess.run([binary, "check-config"], env=env, capture_output=True, text=True)
    if refused is None and result.returncode != 0:
        fail(f"({values_name}) the service refuses the rendered configuration: {result.stderr.strip()}")
    if refused is None:
        # What the configuration may hold fits the container's limit, with room for the baseline.
        bound = int(re.search(r"memory_bound_bytes=(\d+)", result.stdout)[1])
        limit = quantity(first_container(docs)["resources"]["limits"]["memory"])
        if bound > limit * 0.85:
            fail(f"({values_name}) the configuration may hold {bound >> 20} MiB, against a limit of {limit >> 20} MiB")
    if refused is not None and (result.returncode == 0 or refused not in result.stderr):
        fail(f"({values_name}) the service must refuse it ({refused}): {result.returncode} {result.stderr.strip()}")


def quantity(text):
    """A Kubernetes memory quantity in bytes (\"1Gi\", \"768Mi\", \"1G\", \"512000\")."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text)).groups()
    return int(float(number) * units.get(unit, 1))


def first_container(docs):
    deployment = next(d for _, d in docs if d["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def tool_container(docs):
    """The container of the tool Job among `docs`."""
    job = next(d for _, d in docs if d["kind"] == "Job")
    return job["spec"]["template"]["spec"]["containers"][0]


def render_docs(values):
    return list(documents(helm.Chart.load(str(CHART)).render(values, name="replay-ingest", namespace="replays")))


def check_pod_policy(defaults, default_docs, all_on_docs, hpa_docs):
    """What keeps a healthy pod running, a failed one explained and the group steady, as rendered."""
    first = lambda docs, kind: next(d for _, d in docs if d["kind"] == kind)
    template = first(default_docs, "Deployment")["spec"]["template"]
    pod, container = template["spec"], template["spec"]["containers"][0]
    if pod.get("automountServiceAccountToken") is not False:
        fail("the pod mounts a Kubernetes API token it never uses")
    if container.get("terminationMessagePolicy") != "FallbackToLogsOnError":
        fail("the container's last ERROR line must stay in its status (terminationMessagePolicy)")
    slow = {p: container[p].get("timeoutSeconds", 1) for p in ("startupProbe", "livenessProbe", "readinessProbe")}
    if min(slow.values()) < 2:
        fail(f"a probe timing out after Kubernetes' default second restarts a busy healthy pod: {slow}")
    spread = pod.get("topologySpreadConstraints", [])
    selector = template["metadata"]["labels"]
    if not spread or any(
        any(selector.get(k) != v for k, v in c["labelSelector"]["matchLabels"].items()) for c in spread
    ):
        fail(f"the spread constraints must select the chart's own pods: {spread}")
    if first(default_docs, "PodDisruptionBudget")["spec"].get("unhealthyPodEvictionPolicy") != "AlwaysAllow":
        fail("a budget that keeps crash-looping pods from eviction blocks node drains")
    behavior = defaults["autoscaling"]["behavior"]
    hpa = first(hpa_docs, "HorizontalPodAutoscaler")["spec"].get("behavior")
    keda = first(all_on_docs, "ScaledObject")["spec"].get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior")
    if hpa != behavior or keda != behavior:
        fail(f"both autoscalers step as autoscaling.behavior says: HPA {hpa}, KEDA {keda}")
    print(f"pods: probe timeouts {slow}, spread over nodes and zones, no API token, exit reason kept; autoscalers step one pod at a time")


def check_image(defaults, docs):
    """The Dockerfile and the chart agree: the runtime user, the port; what it copies exists."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    user = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.M)
    deployment = next(d for _, d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]["securityContext"]
    if not user or (int(user[1]), int(user[2])) != (pod["runAsUser"], pod["runAsGroup"]):
        fail(f"the image's USER and the chart's runAsUser/runAsGroup differ: {user and user[0]} vs {pod}")
    exposed = re.search(r"^EXPOSE (\d+)$", dockerfile, re.M)
    if not exposed or int(exposed[1]) != defaults["http"]["port"]:
        fail(f"the image's EXPOSE and the chart's http.port differ: {exposed and exposed[0]}")
    for source in re.findall(r"^COPY (?!--from)(\S+)", dockerfile, re.M):
        if source != "." and not (ROOT / source).exists():
            fail(f"the Dockerfile copies {source}, which is not in the repository")
    if "org.opencontainers.image.version" not in dockerfile:
        fail("the image carries no OCI labels")
    print(f"image: runs as {user[1]}:{user[2]}, exposes {exposed[1]}, as the chart expects")


def check_secret_volumes(docs):
    """Each mounted Secret brings only the key the service reads, at mode 0440 (the pod's group,
    not others): a Secret shared with other keys mounted them all, world-readable."""
    volumes = [v for v in next(d for _, d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    if not volumes:
        fail("no Secret volume rendered with every secret set")
    for volume in volumes:
        secret = volume["secret"]
        if secret.get("defaultMode") != 0o440 or len(secret.get("items", [])) != 1:
            fail(f"the Secret volume {volume['name']} must mount its one key at 0440: {secret}")


def check_rollout_values():
    """priorityClassName and the rollout strategy reach the Deployment when given, and are
    Kubernetes' defaults when not."""
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    given = check("a priority class and a strategy", {"priorityClassName": "replays-high", "strategy": strategy})
    deployment = next(d for _, d in given if d["kind"] == "Deployment")["spec"]
    if deployment.get("strategy") != strategy or deployment["template"]["spec"].get("priorityClassName") != "replays-high":
        fail(f"priorityClassName and strategy must reach the Deployment: {deployment.get('strategy')}")
    default = next(d for _, d in render_docs({}) if d["kind"] == "Deployment")["spec"]
    if "strategy" in default or "priorityClassName" in default["template"]["spec"]:
        fail("without priorityClassName and strategy, the Deployment sets neither")


def check_notes():
    """NOTES.txt warns of a missing password only when nothing gives one: a password from a
    Secret of the operator's own through extraEnv is one (a working install was told it would
    refuse to start), and ClickHouse's only when rows go to ClickHouse."""
    def notes(values):
        rendered = helm.Chart.load(str(CHART)).render(values, name="replay-ingest", namespace="replays", is_install=True)
        return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))
    from_secret = lambda name: {"name": name, "valueFrom": {"secretKeyRef": {"name": "own", "key": "password"}}}
    no_password, refuses = "ClickHouse is used without a password", "the pods will refuse to start"
    sasl = {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "KAFKA_SASL_USERNAME": "u"}
    for values, says, must in [
        ({}, no_password, True),
        ({"config": {"ROWS_SINK": "snuba"}}, no_password, False),
        ({"extraEnv": [from_secret("REPLAY_INGEST_CLICKHOUSE_PASSWORD")]}, no_password, False),
        ({"config": sasl}, refuses, True),
        ({"config": sasl, "extraEnv": [from_secret("REPLAY_INGEST_KAFKA_SASL_PASSWORD")]}, refuses, False),
        ({"config": {**sasl, "KAFKA_SASL_PASSWORD_FILE": "/var/run/secrets/own/password"}}, refuses, False),
        ({"config": {"CLICKHOUSE_PASSWORD_FILE": "/var/run/secrets/own/password"}}, no_password, False),
    ]:
        if (says in notes(values)) != must:
            fail(f"NOTES.txt with {values}: {'missing' if must else 'wrongly says'} {says!r}")
    print("NOTES.txt: a missing password noted only when neither a Secret nor extraEnv gives one")


def check_tool_job(binary, all_on):
    """A tool's Job (templates/tool-job.yaml) runs with what the release's pods run with — the
    image, every setting and mounted Secret, extraEnv, the volumes, the ServiceAccount, the
    security contexts, the node placement — toolJob.env replacing variables of its names; its pod
    is none of the Deployment's (its selector, the budget's, the spread's); nothing renders
    without args; and the tool starts with the rendered environment."""
    if any(d["kind"] == "Job" for _, d in render_docs({})):
        fail("a tool Job renders without toolJob.args")
    ops = [{"name": "REPLAY_INGEST_KAFKA_SASL_USERNAME", "value": "replay-ingest-ops"},
           {"name": "REPLAY_INGEST_KAFKA_SASL_PASSWORD_FILE", "value": "/var/run/secrets/ops/password"}]
    tool_job = {"name": "redrive-rejected-by-sink-2026-12-05",
                "args": ["redrive", "--group-id", "redrive-rejected-by-sink-2026-12-05", "--reason", "rejected_by_sink"],
                "env": ops,
                "extraVolumes": [{"name": "ops", "secret": {"secretName": "replay-ingest-ops-kafka"}}],
                "extraVolumeMounts": [{"name": "ops", "mountPath": "/var/run/secrets/ops", "readOnly": True}],
                "ttlSecondsAfterFinished": 1209600, "podAnnotations": {"sidecar.istio.io/inject": "false"}}
    docs = check("a redrive Job", {**all_on, "toolJob": tool_job})
    deployment = next(d for _, d in docs if d["kind"] == "Deployment")["spec"]["template"]
    job = next(d for _, d in docs if d["kind"] == "Job")
    pod, container = job["spec"]["template"]["spec"], job["spec"]["template"]["spec"]["containers"][0]
    consumer = deployment["spec"]["containers"][0]
    if job["metadata"]["name"] != "replay-ingest-redrive-rejected-by-sink-2026-12-05" or container["args"] != tool_job["args"]:
        fail(f"the Job is named after the run and runs its args: {job['metadata']['name']}, {container['args']}")
    if (pod["restartPolicy"], job["spec"]["backoffLimit"]) != ("Never", 0):
        fail(f"a tool that fails is not run again by Kubernetes: {pod['restartPolicy']}, backoffLimit {job['spec']['backoffLimit']}")
    # Helm reads numbers as floats: a week or two must not render as 1.2096e+06.
    if repr(job["spec"]["ttlSecondsAfterFinished"]) != "1209600":
        fail(f"ttlSecondsAfterFinished renders as {job['spec']['ttlSecondsAfterFinished']!r}")
    if job["spec"]["template"]["metadata"].get("annotations") != tool_job["podAnnotations"]:
        fail(f"the tool pod's annotations are toolJob.podAnnotations: {job['spec']['template']['metadata'].get('annotations')}")
    for key in ("image", "imagePullPolicy", "securityContext", "terminationMessagePolicy"):
        if container.get(key) != consumer.get(key):
            fail(f"the tool's {key} differs from the consumer's: {container.get(key)} vs {consumer.get(key)}")
    for key in ("serviceAccountName", "automountServiceAccountToken", "securityContext", "imagePullSecrets", "nodeSelector", "tolerations", "affinity"):
        if pod.get(key) != deployment["spec"].get(key):
            fail(f"the tool pod's {key} differs from the consumers': {pod.get(key)} vs {deployment['spec'].get(key)}")
    names = [e["name"] for e in container["env"]]
    if len(names) != len(set(names)):
        fail(f"a variable set twice in the tool's env (which one wins is Kubernetes'): {names}")
    env = {e["name"]: e for e in container["env"]}
    replaced = {e["name"]: e for e in ops}
    # The consumer's own: its metrics' address and tags, and the pod fields they are made of.
    own = lambda name: name.startswith(("DD_", "REPLAY_INGEST_STATSD_")) or name == "POD_NAME"
    for variable in consumer["env"]:
        name = variable["name"]
        if not own(name) and env.get(name) != replaced.get(name, variable):
            fail(f"the tool's {name} is {env.get(name)}, the consumers' {variable}")
    if any(env.get(name) != variable for name, variable in replaced.items()):
        fail(f"toolJob.env must be the tool's: {[env.get(n) for n in replaced]}")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    # The agent's socket is the consumer's too (its metrics).
    for volume in [v for v in deployment["spec"]["volumes"] if v["name"] != "dsd-socket"] + tool_job["extraVolumes"]:
        if volumes.get(volume["name"]) != volume:
            fail(f"the tool pod lacks the volume {volume}")
    for mount in [m for m in consumer["volumeMounts"] if m["name"] != "dsd-socket"] + tool_job["extraVolumeMounts"]:
        if mounts.get(mount["name"]) != mount:
            fail(f"the tool lacks the mount {mount}")
    labels = job["spec"]["template"]["metadata"]["labels"]
    for name, selector in [("Deployment", next(d for _, d in docs if d["kind"] == "Deployment")["spec"]["selector"]["matchLabels"]),
                           ("PodDisruptionBudget", next(d for _, d in docs if d["kind"] == "PodDisruptionBudget")["spec"]["selector"]["matchLabels"])]:
        if all(labels.get(k) == v for k, v in selector.items()):
            fail(f"the {name}'s selector takes the tool's pod for a consumer: {selector} ⊆ {labels}")
    # A password given by name replaces the release's password file too (the file would win).
    clickhouse = [{"name": "REPLAY_INGEST_CLICKHOUSE_USER", "value": "replay-deleter"},
                  {"name": "REPLAY_INGEST_CLICKHOUSE_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "deleter", "key": "password"}}}]
    deleting = render_docs({**all_on, "toolJob": {"name": "delete-1", "args": ["delete", "--project", "1", "--replay", "a" * 32], "env": clickhouse}})
    env = {e["name"]: e for e in tool_container(deleting)["env"]}
    if "REPLAY_INGEST_CLICKHOUSE_PASSWORD_FILE" in env or any(env.get(e["name"]) != e for e in clickhouse):
        fail(f"a password in toolJob.env must replace the release's password file: {sorted(env)}")
    for refused, message in [
        ({"name": "x", "args": ["consume"]}, 'toolJob.args: the first is the tool, delete, redrive, sweep or migrate, not "consume"'),
        ({"args": ["redrive"]}, "toolJob.name: a name for this run"),
        ({"name": "m", "args": ["migrate", "--clickhouse-password", "x"]}, "toolJob.args: a secret's value in the args"),
        ({"name": "r", "args": ["redrive", "--kafka-property", "sasl.password=x"]}, "toolJob.args: a secret's value in the args"),
        ({"name": "Redrive_1", "args": ["redrive"]}, "toolJob.name: a name for this run"),
        ({"name": "x" * 60, "args": ["sweep"]}, "is longer than 63 characters"),
        ({"name": "x", "args": ["redrive"], "env": [{"name": "REPLAY_INGEST_KAFKA_SASL_PASSWORD", "value": "hunter2"}]},
         "toolJob.env REPLAY_INGEST_KAFKA_SASL_PASSWORD: a secret's value goes in a Secret"),
    ]:
        try:
            helm.Chart.load(str(CHART)).render({"toolJob": refused}, name="replay-ingest", namespace="y")
        except helm.HelmError as error:
            if message not in str(error):
                fail(f"toolJob {refused} was refused for another reason: {error}")
        else:
            fail(f"toolJob {refused} must not render")
    # The tool starts with what the Job gives it: every setting of the release in its environment
    # (those it does not read, ignored) and its args, here a sweep of a filesystem store on the
    # release's volume.
    with tempfile.TemporaryDirectory() as blobs:
        values = {"config": {"BLOB_SINK": "filesystem", "BLOB_DIR": blobs},
                  "extraVolumes": [{"name": "blobs", "persistentVolumeClaim": {"claimName": "replay-blobs"}}],
                  "extraVolumeMounts": [{"name": "blobs", "mountPath": blobs}],
                  "toolJob": {"name": "sweep-now", "args": ["sweep", "--dry-run", "--summary-only"]}}
        swept = render_docs(values)
        container = tool_container(swept)
        if not any(m["mountPath"] == blobs for m in container["volumeMounts"]):
            fail("the sweep Job must mount the store's volume")
        env = {e["name"]: e["value"] for e in container["env"]}
        result = subprocess.run([binary, *container["args"]], env=env, capture_output=True, text=True)
        if result.returncode != 0:
            fail(f"the sweep Job's tool refuses its rendered environment: {result.returncode} {result.stderr.strip()}")
        ran = "sweep"
        # And `redrive` on the local broker, when one runs (the test command starts it first):
        # every Kafka setting the release renders, read by the tool, on topics of this check's own.
        brokers = os.environ.get("REPLAY_INGEST_TEST_BROKERS")
        if brokers:
            run = f"chart-job-{os.getpid()}-{int(time.time())}"
            topics = pathlib.Path(binary).parent / "examples" / "topics"
            if not topics.exists():
                fail(f"{topics} is missing: `cargo build --example topics` (scripts/test.sh builds it)")
            subprocess.run([str(topics), "--brokers", brokers, f"{run}:1", f"{run}-dlq:1"], check=True, capture_output=True)
            values = {**values, "config": {**values["config"], "KAFKA_BROKERS": brokers, "TOPIC": run, "DLQ_TOPIC": f"{run}-dlq"},
                      "toolJob": {"name": "redrive-check", "args": ["redrive", "--dry-run", "--group-id", run]}}
            job = tool_container(render_docs(values))
            env = {e["name"]: e["value"] for e in job["env"]}
            result = subprocess.run([binary, *job["args"]], env=env, capture_output=True, text=True, timeout=120)
            if result.returncode != 0:
                fail(f"the redrive Job's tool fails with its rendered environment: {result.returncode} {result.stderr.strip()}")
            ran += " and redrive (on the local broker)"
        # And `migrate`, the table created before a first install, with a DDL user of its own (here
        # the server's default), on the local ClickHouse when one runs, in a database of its own.
        clickhouse = os.environ.get("REPLAY_INGEST_TEST_CLICKHOUSE_URL")
        database = f"chart_job_{os.getpid()}"
        ddl = [{"name": "REPLAY_INGEST_CLICKHOUSE_URL", "value": clickhouse or "http://127.0.0.1:1"},
               {"name": "REPLAY_INGEST_CLICKHOUSE_DATABASE", "value": database},
               {"name": "REPLAY_INGEST_CLICKHOUSE_USER", "value": "default"}]
        values = {"config": {"ROWS_SINK": "clickhouse"}, "secrets": {"clickhousePassword": {"existingSecret": "ch"}},
                  "toolJob": {"name": "migrate-first-install", "args": ["migrate"], "env": ddl}}
        migrate_docs = render_docs(values)
        pod = next(d for _, d in migrate_docs if d["kind"] == "Job")["spec"]["template"]["spec"]
        if pod["serviceAccountName"] != "default":
            fail(f"the migrate Job runs before a first install, when the release's ServiceAccount does not exist: {pod['serviceAccountName']}")
        job = tool_container(migrate_docs)
        env = {e["name"]: e["value"] for e in job["env"] if "value" in e}
        if "REPLAY_INGEST_CLICKHOUSE_PASSWORD_FILE" in env:
            fail("the migrate Job's user in toolJob.env must replace the release's password file")
        if clickhouse:
            try:
                result = subprocess.run([binary, *job["args"]], env=env, capture_output=True, text=True, timeout=120)
                if result.returncode != 0:
                    fail(f"the migrate Job fails with its rendered environment: {result.returncode} {result.stderr.strip()}")
            finally:
                urllib.request.urlopen(urllib.request.Request(clickhouse, data=f"DROP DATABASE IF EXISTS {database}".encode()), timeout=30)
            ran += " and migrate (on the local ClickHouse)"
    print("tool Job: the release's image, settings, Secrets, volumes, ServiceAccount and security, toolJob.env last; "
          f"not a consumer to the Deployment or the budget; {ran} run with the rendered environment")


def main():
    binary = sys.argv[1]
    help_text = subprocess.run([binary, "consume", "--help"], capture_output=True, text=True, check=True).stdout
    known = {line.split("[env: ")[1].split("=")[0].rstrip("]") for line in help_text.splitlines() if "[env: " in line}
    schema = json.loads((CHART / "values.schema.json").read_text())
    listed = {f"REPLAY_INGEST_{k}" for k in schema["properties"]["config"]["propertyNames"]["enum"]}
    if listed != known:
        fail(f"values.schema.json's config keys differ from `replay-ingest consume --help`: missing {sorted(known - listed)}, "
             f"not read {sorted(listed - known)}")
    print(f"values.schema.json: the {len(known)} config keys replay-ingest consume reads, and no other")
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
    check_monitors()
    check_datadog_monitors()
    default_docs = check("default values", None)
    check_image(defaults, default_docs)
    docs = check("every option on", all_on)
    hpa_docs = check("the HPA on", {"autoscaling": {"hpa": {"enabled": True}}, "http": {"port": 8080, "bindAddress": "[::]"}})
    check_pod_policy(defaults, default_docs, docs, hpa_docs)
    check_tool_job(binary, all_on)
    check_notes()
    check_rollout_values()
    check_secret_volumes(docs)
    for values_name, rendered_docs in [("default values", default_docs), ("every option on", docs), ("the HPA on", hpa_docs)]:
        check_config(binary, rendered_docs, values_name)
    listen = [pod_env(d)["REPLAY_INGEST_HTTP_LISTEN"] for d in (default_docs, hpa_docs)]
    if listen != ["0.0.0.0:8080", "[::]:8080"]:
        fail(f"the probe listener follows http.bindAddress: {listen}")
    # Rendered, but refused by the service: the check would catch such values before a rollout.
    check_config(binary, render_docs({"kafkaProperties": {"fetch.max.wait.ms": "100"}}), "a Kafka property librdkafka does not know",
                 refused='Kafka property "fetch.max.wait.ms" is not one librdkafka knows')
    print("the service accepts what the chart renders (replay-ingest check-config, the pod's environment), and refuses what it must")
    kinds = {d["kind"] for _, d in docs}
    if not {"ScaledObject", "TriggerAuthentication"} <= kinds:
        fail(f"the all-on values should render KEDA's ScaledObject and TriggerAuthentication: {sorted(kinds)}")
    properties = next(d for _, d in docs if d["kind"] == "ConfigMap")["data"]["REPLAY_INGEST_KAFKA_PROPERTIES"]
    if "debug=cgrp,fetch" not in properties.split("\n"):
        fail(f"a property value with commas must survive rendering: {properties!r}")
    # One processing thread per requested core, rounded up, unless config sets it: left to the
    # service it would take one per core of the node.
    for values, threads in [
        ({}, "2"),
        ({"resources": {"requests": {"cpu": "1500m"}}}, "2"),
        ({"resources": {"requests": {"cpu": "250m"}}}, "1"),
        ({"resources": {"requests": {"cpu": 4}}}, "4"),
        ({"config": {"PROCESSING_THREADS": "3"}}, "3"),
    ]:
        rendered = helm.Chart.load(str(CHART)).render(values, name="x", namespace="y")
        data = next(d for _, d in documents(rendered) if d["kind"] == "ConfigMap")["data"]
        if data.get("REPLAY_INGEST_PROCESSING_THREADS") != threads:
            fail(f"{values}: {threads} processing threads expected, got {data.get('REPLAY_INGEST_PROCESSING_THREADS')}")
    print("processing threads: one per requested core, or config.PROCESSING_THREADS")
    # limits.memory, left unset, follows the processing threads: the bound the service computes
    # for each count fits the limit the chart gives it, with room for the baseline; one set is kept.
    for threads in range(1, 17):
        check_config(binary, render_docs({"resources": {"requests": {"cpu": str(threads)}}}), f"{threads} requested cores")
    check_config(binary, render_docs({"config": {"PROCESSING_THREADS": "6"}}), "config.PROCESSING_THREADS 6")
    kept = first_container(render_docs({"resources": {"limits": {"memory": "3Gi"}}}))["resources"]
    if kept != {"requests": {"cpu": "2", "memory": "768Mi"}, "limits": {"memory": "3Gi"}}:
        fail(f"a limits.memory set must be kept as set: {kept}")
    # Settings that raise what a pod holds beyond what the threads say need the limit set: the
    # limit derived from the threads (1Gi for two) left a pod with a 1 GiB buffer (a 1.5 GiB
    # bound) to be OOM-killed under a backlog, and again after each restart.
    big_buffer = {"config": {"BUFFER_MAX_BYTES": "1073741824"}}
    try:
        helm.Chart.load(str(CHART)).render(big_buffer, name="x", namespace="y")
    except helm.HelmError as error:
        if "config.BUFFER_MAX_BYTES is raised past 268435456 and resources.limits.memory is not set" not in str(error):
            fail(f"a raised buffer without a memory limit was refused for another reason: {error}")
    else:
        fail("a raised buffer without a memory limit must not render")
    check_config(binary, render_docs({**big_buffer, "resources": {"limits": {"memory": "2Gi"}}}), "a 1 GiB buffer within a 2Gi limit")
    print("limits.memory: 1 to 16 processing threads each within the limit the chart gives them; one set is kept; settings that raise the bound need one set")
    # Helm reads YAML numbers as floats: 1048576 would print as 1.048576e+06, which librdkafka
    # reads as 1. KEDA reads the lag from the service's own brokers unless told otherwise.
    rendered = helm.Chart.load(str(CHART)).render(
        {"kafkaProperties": {"queued.min.messages": 1048576, "fetch.wait.max.ms": 100, "enable.partition.eof": False},
         "config": {"KAFKA_BROKERS": "b1:9092,b2:9092"}, "autoscaling": {"keda": {"enabled": True}}},
        name="x", namespace="y")
    numbers = list(documents(rendered))
    properties = next(d for _, d in numbers if d["kind"] == "ConfigMap")["data"]["REPLAY_INGEST_KAFKA_PROPERTIES"].split("\n")
    expected = ["enable.partition.eof=false", "fetch.wait.max.ms=100", "queued.min.messages=1048576"]
    if properties != expected:
        fail(f"numbers in kafkaProperties must render as written: {properties} (expected {expected})")
    brokers = next(d for _, d in numbers if d["kind"] == "ScaledObject")["spec"]["triggers"][0]["metadata"]["bootstrapServers"]
    if brokers != "b1:9092,b2:9092":
        fail(f"KEDA must read the lag from config.KAFKA_BROKERS unless autoscaling.keda.bootstrapServers is set: {brokers}")
    reset = next(d for _, d in numbers if d["kind"] == "ScaledObject")["spec"]["triggers"][0]["metadata"].get("offsetResetPolicy")
    if reset != "earliest":
        fail(f"KEDA must count lag from where the service starts a partition without commits (earliest): {reset!r}")
    print("kafkaProperties: whole numbers as integers; KEDA on the service's brokers")
    # The service's own version tag is the one the agent takes from the pod's labels (two
    # different `version` tags on one metric otherwise).
    deployment = next(d for _, d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in pod["spec"]["containers"][0]["env"]}
    for tag in ("service", "version"):
        path = f"metadata.labels['tags.datadoghq.com/{tag}']"
        if env.get(f"DD_{tag.upper()}") != path or f"tags.datadoghq.com/{tag}" not in pod["metadata"]["labels"]:
            fail(f"DD_{tag.upper()} must come from the pod label tags.datadoghq.com/{tag}: {env.get(f'DD_{tag.upper()}')}")
    print("unified service tags: DD_SERVICE and DD_VERSION from the pod's labels")
    # The DogStatsD address follows dogstatsd.mode; `off` sends no metrics (an empty address).
    for mode, address in [("hostIP", "$(DD_AGENT_HOST):8125"), ("socket", "unixgram:///var/run/datadog/dsd.socket"), ("off", "")]:
        rendered = helm.Chart.load(str(CHART)).render({"dogstatsd": {"mode": mode}}, name="x", namespace="y")
        container = next(d for _, d in documents(rendered) if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
        got = [e.get("value") for e in container["env"] if e["name"] == "REPLAY_INGEST_STATSD_ADDRESS"]
        if got != [address]:
            fail(f"dogstatsd.mode {mode}: REPLAY_INGEST_STATSD_ADDRESS {got}, expected [{address!r}]")
    print("DogStatsD address: by host IP, by socket, or off")
    # Every metric names its pod (two pods on a node would overwrite each other's gauges at the
    # agent): POD_NAME from the pod's name, defined before the tags that use it.
    for mode, tags in [("hostIP", "region:eu,env:ci,pod_name:$(POD_NAME)"), ("socket", "region:eu,env:ci,pod_name:$(POD_NAME)"), ("off", None)]:
        rendered = helm.Chart.load(str(CHART)).render(
            {"dogstatsd": {"mode": mode, "env": "ci", "tags": ["region:eu"]}}, name="x", namespace="y")
        container = next(d for _, d in documents(rendered) if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
        names = [e["name"] for e in container["env"]]
        got = next((e.get("value") for e in container["env"] if e["name"] == "REPLAY_INGEST_STATSD_TAGS"), None)
        pod = next((e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"] if e["name"] == "POD_NAME"), None)
        if got != tags or (tags and (pod != "metadata.name" or names.index("POD_NAME") > names.index("REPLAY_INGEST_STATSD_TAGS"))):
            fail(f"dogstatsd.mode {mode}: REPLAY_INGEST_STATSD_TAGS {got!r} (expected {tags!r}), POD_NAME from {pod!r}")
    print("DogStatsD tags: the pod's name on every metric, beside dogstatsd.tags and env")
    # The chart refuses values that cannot work — each with its own message; any other render
    # error (a template bug) is a failure, not the expected refusal.
    refusals = [
        ({"terminationGracePeriodSeconds": 10}, "must be at least config.DRAIN_DEADLINE_MS"),
        ({"terminationGracePeriodSeconds": 30, "config": {"DRAIN_DEADLINE_MS": "28900"}}, "plus 2 s to close the clients"),
        ({"config": {"HTTP_LISTEN": "0.0.0.0:1"}}, "set http.port instead"),
        # A misspelt key (MAX_DECOMPRESSED_BYTES) would leave the default in force without a word.
        ({"config": {"MAX_DECOMPRESSED_BYTE": "33554432"}}, "invalid propertyName 'MAX_DECOMPRESSED_BYTE'"),
        ({"config": {"STATSD_ADDRESS": ""}}, "config.STATSD_ADDRESS: set dogstatsd.mode"),
        ({"config": {"STATSD_TAGS": "region:eu"}, "dogstatsd": {"env": "prod"}}, "config.STATSD_TAGS: set dogstatsd.tags"),
        ({"config": {"CLICKHOUSE_PASSWORD": "x"}}, "config.CLICKHOUSE_PASSWORD: a secret goes in secrets."),
        ({"config": {"KAFKA_SASL_PASSWORD": "x"}}, "config.KAFKA_SASL_PASSWORD: a secret goes in secrets."),
        ({"kafkaProperties": {"sasl.password": "x"}}, "kafkaProperties.sasl.password: a secret goes in secrets."),
        ({"kafkaProperties": {"ssl.key.pem": "x"}}, "kafkaProperties.ssl.key.pem: a secret goes in secrets."),
        ({"kafkaProperties": {"group.id": "x"}}, "kafkaProperties.group.id: set config.GROUP_ID instead"),
        ({"kafkaProperties": {"session.timeout.ms": 10000}}, "kafkaProperties.session.timeout.ms: set config.SESSION_TIMEOUT_MS instead"),
        ({"kafkaProperties": {"enable.auto.commit": True}}, "kafkaProperties.enable.auto.commit cannot be changed"),
        ({"kafkaProperties": {"acks": 1}}, "kafkaProperties.acks cannot be changed"),
        ({"kafkaProperties": {"sasl.oauthbearer.config": "x"}}, "kafkaProperties.sasl.oauthbearer.config: a secret goes in secrets."),
        ({"kafkaProperties": {"sasl.oauthbearer.assertion.private.key.passphrase": "x"}},
         "kafkaProperties.sasl.oauthbearer.assertion.private.key.passphrase: a secret goes in secrets."),
        ({"kafkaProperties": {"group.instance.id": "$(POD_NAME)"}}, "kafkaProperties.group.instance.id: every pod would join with it"),
        ({"config": {"CLICKHOUSE_URL": "http://u:hunter2@ch:8123"}}, "config.CLICKHOUSE_URL: a URL with credentials in it"),
        ({"config": {"CLICKHOUSE_URL": "http://u:hunt/er2@ch:8123"}}, "config.CLICKHOUSE_URL: a URL with credentials in it"),
        ({"extraEnv": [{"name": "REPLAY_INGEST_CLICKHOUSE_PASSWORD", "value": "hunter2"}]},
         "extraEnv REPLAY_INGEST_CLICKHOUSE_PASSWORD: a secret's value goes in a Secret"),
        ({"secrets": {"kafkaCa": {"existingSecret": "ca"}}}, "secrets.kafkaCa is set but config.KAFKA_SECURITY_PROTOCOL is PLAINTEXT"),
        ({"secrets": {"kafkaSaslPassword": {"existingSecret": "pw"}}, "config": {"KAFKA_SECURITY_PROTOCOL": "SSL"}},
         "secrets.kafkaSaslPassword is set but config.KAFKA_SECURITY_PROTOCOL is SSL"),
        ({"secrets": {"clickhousePassword": {"existingSecret": "pw"}}, "config": {"CLICKHOUSE_PASSWORD_FILE": "/etc/pw"}},
         "config.CLICKHOUSE_PASSWORD_FILE: secrets.clickhousePassword sets it"),
        ({"secrets": {"kafkaCa": {"existingSecret": "ca"}}, "config": {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CA_LOCATION": "/etc/ca.pem"}},
         "config.KAFKA_SSL_CA_LOCATION: secrets.kafkaCa sets it"),
        ({"secrets": {"gcsCredentials": {"existingSecret": "key"}}, "serviceAccount": {"gcpServiceAccount": "a@b.iam.gserviceaccount.com"}},
         "secrets.gcsCredentials and serviceAccount.gcpServiceAccount are both set"),
        ({"serviceAccount": {"create": False, "name": "mine", "gcpServiceAccount": "a@b.iam.gserviceaccount.com"}},
         "serviceAccount.gcpServiceAccount needs serviceAccount.create"),
        ({"extraEnv": [{"name": "REPLAY_INGEST_DRAIN_DEADLINE_MS", "value": "29000"}]},
         "extraEnv REPLAY_INGEST_DRAIN_DEADLINE_MS: set it through the chart's values (config.DRAIN_DEADLINE_MS"),
        ({"config": {"DRAIN_DEADLINE_MS": "20000", "SESSION_TIMEOUT_MS": "15000"}},
         "config.DRAIN_DEADLINE_MS (20000) must be below config.SESSION_TIMEOUT_MS (15000)"),
        ({"config": {"BLOB_SINK": "filesystem"}}, "config.BLOB_SINK filesystem needs config.BLOB_DIR"),
        ({"datadogMonitors": {"enabled": True}, "dogstatsd": {"mode": "off"}}, "datadogMonitors.enabled with dogstatsd.mode off"),
        ({"datadogMonitors": {"enabled": True}}, "datadogMonitors.enabled needs datadogMonitors.scope (or dogstatsd.env)"),
        # The service's 0 is a thread per core of the node, which the memory limit would not follow.
        ({"config": {"PROCESSING_THREADS": "0"}}, "/config/PROCESSING_THREADS': '0' does not match pattern"),
        ({"config": {"PROCESSING_THREADS": "1025"}}, "/config/PROCESSING_THREADS': '1025' does not match pattern"),
        ({"image": {"tag": "1.2.3@sha256:" + "0" * 64}}, "image.tag holds a digest: set image.digest"),
        ({"autoscaling": {"keda": {"enabled": True}}, "config": {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CERTIFICATE_LOCATION": "/c.pem"}},
         "autoscaling.keda with a client certificate"),
    ]
    for values, message in refusals:
        try:
            helm.Chart.load(str(CHART)).render(values, name="x", namespace="y")
        except helm.HelmError as error:
            if message not in str(error):
                fail(f"{values} was refused for another reason: {error}")
        else:
            fail(f"{values} must not render")
        print(f"refused as it must be: {values} ({message})")
    # A key file alone is GCS's credentials (the all-on values use Workload Identity).
    key_file = check("a GCS key file", {"secrets": {"gcsCredentials": {"existingSecret": "key"}}})
    env = {e["name"]: e.get("value") for e in first_container(key_file).get("env", [])}
    if env.get("GOOGLE_APPLICATION_CREDENTIALS") != "/var/run/secrets/replay-ingest/gcs/key.json":
        fail(f"a GCS key file must be where GOOGLE_APPLICATION_CREDENTIALS says: {env}")
    # Pulled by digest when one is given; the labels keep the tag. An umbrella chart's global
    # values are accepted. The async runtime's threads follow the CPU request.
    digest = "sha256:" + "a" * 64
    pinned = render_docs({"image": {"tag": "1.2.3", "digest": digest}, "global": {"imageRegistry": "x"}})
    container = first_container(pinned)
    deployment = next(d for _, d in pinned if d["kind"] == "Deployment")
    if container["image"] != f"ghcr.io/example/replay-ingest@{digest}" or deployment["metadata"]["labels"]["app.kubernetes.io/version"] != "1.2.3":
        fail(f"image.digest: {container['image']}, labels {deployment['metadata']['labels']}")
    # A tag no label may hold as it is (a semver build's "+", longer than 63 characters) keeps
    # the image as tagged and labels that the API server takes: it refused every object.
    long_tag = "1.2.3+g1a2b3c-" + "x" * 60
    tagged = render_docs({"image": {"tag": long_tag}, "dogstatsd": {"env": "prod"}})
    deployment = next(d for _, d in tagged if d["kind"] == "Deployment")
    versions = [deployment["metadata"]["labels"]["app.kubernetes.io/version"],
                deployment["spec"]["template"]["metadata"]["labels"]["tags.datadoghq.com/version"]]
    if first_container(tagged)["image"] != f"ghcr.io/example/replay-ingest:{long_tag}" or any(
            not re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", v) for v in versions):
        fail(f"a tag with a + and 75 characters: image {first_container(tagged)['image']}, labels {versions}")
    for cpu, workers in [("2", "2"), ("500m", "2"), ("6", "6")]:
        config = next(d for _, d in render_docs({"resources": {"requests": {"cpu": cpu}}}) if d["kind"] == "ConfigMap")
        if config["data"].get("TOKIO_WORKER_THREADS") != workers:
            fail(f"requests.cpu {cpu}: TOKIO_WORKER_THREADS {config['data'].get('TOKIO_WORKER_THREADS')}, expected {workers}")
    print("image by digest, global values, async threads from the CPU request")
    # Paths to secrets are not secrets.
    for values in [{"config": {"CLICKHOUSE_PASSWORD_FILE": "/x"}}, {"config": {"KAFKA_SSL_KEY_LOCATION": "/x"}}]:
        helm.Chart.load(str(CHART)).render(values, name="x", namespace="y")
        print(f"renders, as it must: {values}")


if __name__ == "__main__":
    main()
