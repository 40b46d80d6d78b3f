"""The Helm chart of platform/helm, rendered and linted by Helm's own engine.

helm-python-sdk bundles Helm's Go SDK (no helm binary needed); built-in Kubernetes objects are
checked against the Kubernetes 1.30 OpenAPI schemas that kubernetes-validate ships, the CRDs
(KEDA, Prometheus Operator) field by field here.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from prometheus_client.utils import floatToGoString

from tests.platform.contract import ROOT, RULE_FILES, contract_load, problems

CHART = ROOT / "platform" / "helm" / "roundhouse"
TWO_MODELS = ROOT / "platform" / "helm" / "values-two-models.yaml"
POOLS = ROOT / "platform" / "helm" / "values-pools.yaml"
KUBERNETES = "1.30"
SECRETS = {
    "secrets": {
        "DATABASE_URL": "postgresql://roundhouse:pw@postgres:5432/roundhouse",
        "REDIS_URL": "redis://valkey:6379/0",
        "DJANGO_SECRET_KEY": "k" * 50,
        "ROUNDHOUSE_CONTENT_KEYS": "a2V5LWtleS1rZXkta2V5LWtleS1rZXkta2V5LWtleTA=",
    }
}
CUSTOM_KINDS = {"ScaledObject", "PrometheusRule", "ServiceMonitor", "PodMonitor"}
PROMTOOL = shutil.which("promtool")


def two_models() -> dict[str, Any]:
    return yaml.safe_load(TWO_MODELS.read_text())


def everything_on() -> dict[str, Any]:
    """The two-model values with every optional object of the chart switched on."""
    values = two_models()
    values["metrics"]["podAnnotations"] = True
    values["frontend"] = {"autoscaling": {"requestsPerSecond": {"enabled": True}}}
    values["weightsCache"] = {"prefetch": ["llama@v2"]}
    return values


def pinned(reference: str, key: str) -> str:
    """REFERENCE with the digest the chart's default values pin for KEY, if they pin one."""
    digest = yaml.safe_load((CHART / "values.yaml").read_text())[key]["digest"]
    return f"{reference}@{digest}" if digest else reference


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """Render the chart as `helm install` would and return every object."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name="sy", namespace="roundhouse", is_install=True)
    objects: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if path.endswith(".txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pods(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pod templates by their Deployment's or Job's name."""
    return {
        o["metadata"]["name"]: o["spec"]["template"]
        for o in objects
        if o["kind"] in {"Deployment", "Job"}
    }


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels and In/Exists expressions) matches labels."""
    match = selector.get("matchLabels", selector if "matchExpressions" not in selector else {})
    if any(labels.get(k) != v for k, v in match.items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        if operator == "In" and labels.get(key) not in expression["values"]:
            return False
        if operator == "Exists" and key not in labels:
            return False
    return True


@pytest.fixture(scope="module")
def default_objects() -> list[dict[str, Any]]:
    return render(SECRETS)


@pytest.fixture(scope="module")
def two_model_objects() -> list[dict[str, Any]]:
    return render(two_models())


# --- Helm ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [SECRETS, two_models(), everything_on(), yaml.safe_load(POOLS.read_text())],
    ids=["default", "two-models", "all-on", "pools"],
)
def test_helm_lint_finds_nothing_to_warn_about(values):
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBERNETES}.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_the_default_values_ask_for_the_secrets_by_name():
    with pytest.raises(helm.HelmError, match=r"secrets\.DATABASE_URL is required"):
        render({})


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"modelDeployments": [{"name": "chat", "maxReplicas": 2}]}, "deploymentName"),
        (
            {
                "modelDeployments": [
                    {"name": "chat", "deploymentName": "c", "maxReplicas": 2, "gpus": -1}
                ]
            },
            "gpus",
        ),
        # A latency objective must be written as a bucket boundary's label: "2.0", not 2.
        ({"slo": {"ttftSeconds": 2}}, "ttftSeconds"),
        ({"keda": {"trigger": "cpu"}}, "trigger"),
    ],
)
def test_the_values_schema_refuses_values_that_would_render_wrong(values, complaint):
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError, match=complaint):
        chart.validate_schema({**SECRETS, **values})


# --- Kubernetes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values", [SECRETS, two_models(), everything_on()], ids=["default", "two-models", "all-on"]
)
def test_every_built_in_object_is_valid_for_kubernetes(values):
    objects = render(values)
    failures = {}
    for obj in objects:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures[f"{obj['kind']}/{obj['metadata']['name']}"] = str(exc).splitlines()[0]
    assert failures == {}


def test_the_default_release_runs_every_platform_process(default_objects):
    deployments = by_kind(default_objects, "Deployment")
    assert set(deployments) == {
        "sy-roundhouse-frontend",
        "sy-roundhouse-ingester",
        "sy-roundhouse-celery-worker",
        "sy-roundhouse-celery-batches",
        "sy-roundhouse-celery-beat",
    }
    assert by_kind(default_objects, "ScaledObject") == {}
    assert set(by_kind(default_objects, "Secret")) == {"sy-roundhouse-secrets"}
    assert set(by_kind(default_objects, "PersistentVolumeClaim")) == {"sy-roundhouse-artifacts"}


def test_the_frontend_serves_the_api_with_probes_metrics_and_an_hpa(default_objects):
    pod = pods(default_objects)["sy-roundhouse-frontend"]
    (container,) = pod["spec"]["containers"]
    script = container["args"][0]
    assert re.search(r"exec uvicorn config\.asgi:application --host 0\.0\.0\.0 --port 8000", script)
    assert "--workers 2" in script
    # the multi-process metrics directory: an emptyDir, emptied before uvicorn starts
    env = {e["name"]: e.get("value") for e in container["env"]}
    multiproc = env["PROMETHEUS_MULTIPROC_DIR"]
    assert 'rm -rf "$PROMETHEUS_MULTIPROC_DIR"/*' in script
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == multiproc)
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume == {"name": mount["name"], "emptyDir": {}}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8000"
    assert annotations["prometheus.io/path"] == "/metrics"

    (hpa,) = by_kind(default_objects, "HorizontalPodAutoscaler").values()
    assert hpa["spec"]["scaleTargetRef"]["name"] == "sy-roundhouse-frontend"
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    # the HPA owns the replica count
    assert (
        "replicas" not in by_kind(default_objects, "Deployment")["sy-roundhouse-frontend"]["spec"]
    )


def test_the_frontend_hpa_can_also_scale_on_requests_per_second():
    objects = render(
        {**SECRETS, "frontend": {"autoscaling": {"requestsPerSecond": {"enabled": True}}}}
    )
    (hpa,) = by_kind(objects, "HorizontalPodAutoscaler").values()
    pods_metric = hpa["spec"]["metrics"][1]["pods"]
    assert pods_metric["metric"]["name"] == "roundhouse_requests_per_second"
    assert pods_metric["target"] == {"type": "AverageValue", "averageValue": "50"}


def test_two_models_run_one_gpu_worker_and_one_cpu_worker(two_model_objects):
    workers = {
        name: pod
        for name, pod in pods(two_model_objects).items()
        if pod["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    }
    assert set(workers) == {"sy-roundhouse-worker-chat", "sy-roundhouse-worker-embed"}

    chat = workers["sy-roundhouse-worker-chat"]["spec"]
    (container,) = chat["containers"]
    assert container["image"] == pinned("registry.example.com/roundhouse:0.1.0-cuda", "gpuImage")
    assert container["command"] == [
        "python", "manage.py", "run_worker", "--deployment", "llama-chat",
        "--drain-seconds", "570",
    ]  # fmt: skip
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["resources"]["requests"]["memory"] == "32Gi"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in chat[
        "tolerations"
    ]
    assert chat["terminationGracePeriodSeconds"] == 600
    assert "lifecycle" not in container  # SIGTERM drains; no preStop needed
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["ROUNDHOUSE_WORKER_METRICS_PORT"] == "9400"
    assert container["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in chat["volumes"])

    embed = workers["sy-roundhouse-worker-embed"]["spec"]
    (container,) = embed["containers"]
    assert container["image"] == pinned("registry.example.com/roundhouse:0.1.0", "image")
    assert container["command"][4] == "minilm"
    assert "nvidia.com/gpu" not in str(container["resources"])
    assert "tolerations" not in embed


def test_each_worker_is_scaled_by_keda_on_its_desired_replicas(two_model_objects):
    scaled = by_kind(two_model_objects, "ScaledObject")
    deployments = by_kind(two_model_objects, "Deployment")
    expected = {
        "sy-roundhouse-worker-chat": ("llama-chat", 1, 6),
        "sy-roundhouse-worker-embed": ("minilm", 1, 4),
    }
    assert set(scaled) == set(expected)
    for name, (slug, warm, most) in expected.items():
        spec = scaled[name]["spec"]
        assert spec["scaleTargetRef"]["name"] == name and name in deployments
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (warm, most)
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "prometheus"
        assert trigger["metricType"] == "AverageValue"
        assert trigger["metadata"]["query"] == (
            f'max(roundhouse_deployment_desired_replicas{{deployment="{slug}"}})'
        )
        assert trigger["metadata"]["threshold"] == "1"
        assert trigger["metadata"]["ignoreNullValues"] == "false"
        # KEDA owns the replica count
        assert "replicas" not in deployments[name]["spec"]


def test_the_keda_queries_name_documented_series(two_model_objects):
    contract = contract_load()
    for scaled in by_kind(two_model_objects, "ScaledObject").values():
        query = scaled["spec"]["triggers"][0]["metadata"]["query"]
        assert problems(query, contract, set()) == []


def test_the_redis_trigger_needs_the_key_that_holds_the_signal():
    values = two_models()
    values["keda"].update(trigger="redis", redis={"address": "valkey:6379"})
    with pytest.raises(helm.HelmError, match=r"keda\.redis\.keyName is required"):
        render(values)
    values["keda"]["redis"]["keyName"] = "sy:{%s}:desired_replicas"
    scaled = by_kind(render(values), "ScaledObject")["sy-roundhouse-worker-chat"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "redis"
    assert trigger["metadata"]["keyName"] == "sy:{llama-chat}:desired_replicas"
    assert trigger["metadata"]["keyValue"] == "1"


def test_each_disruption_budget_covers_exactly_one_component(two_model_objects):
    templates = pods(two_model_objects)
    budgets = by_kind(two_model_objects, "PodDisruptionBudget")
    covered = {
        name: sorted(
            d
            for d, pod in templates.items()
            if selects(pdb["spec"]["selector"], pod["metadata"]["labels"])
        )
        for name, pdb in budgets.items()
    }
    assert covered == {
        "sy-roundhouse-frontend": ["sy-roundhouse-frontend"],
        "sy-roundhouse-ingester": ["sy-roundhouse-ingester"],
        "sy-roundhouse-worker-chat": ["sy-roundhouse-worker-chat"],
        "sy-roundhouse-worker-embed": ["sy-roundhouse-worker-embed"],
    }
    assert all(pdb["spec"]["maxUnavailable"] == 1 for pdb in budgets.values())


def test_selectors_match_their_own_pods_only(two_model_objects):
    templates = pods(two_model_objects)
    for name, deployment in by_kind(two_model_objects, "Deployment").items():
        matched = [
            d
            for d, pod in templates.items()
            if selects(deployment["spec"]["selector"], pod["metadata"]["labels"])
        ]
        assert matched == [name]
    (service,) = by_kind(two_model_objects, "Service").values()
    matched = [
        d
        for d, pod in templates.items()
        if selects(service["spec"]["selector"], pod["metadata"]["labels"])
    ]
    assert matched == ["sy-roundhouse-frontend"]


def test_migrations_run_as_a_hook_before_install_and_upgrade(default_objects):
    (job,) = by_kind(default_objects, "Job").values()
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "manage.py", "migrate", "--noinput"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    # Hooks run before the release's objects exist: what the Job reads is a hook too, earlier.
    for kind in ("ConfigMap", "Secret"):
        (obj,) = by_kind(default_objects, kind).values()
        hook = obj["metadata"]["annotations"]
        assert hook["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert int(hook["helm.sh/hook-weight"]) < int(annotations["helm.sh/hook-weight"])
    assert "serviceAccountName" not in job["spec"]["template"]["spec"]


def test_celery_beat_runs_exactly_once(default_objects):
    beat = by_kind(default_objects, "Deployment")["sy-roundhouse-celery-beat"]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = beat["spec"]["template"]["spec"]["containers"]
    assert container["command"][:4] == ["celery", "-A", "config", "beat"]
    worker = by_kind(default_objects, "Deployment")["sy-roundhouse-celery-worker"]
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    assert "--beat" not in container["command"]


def _worker_command(objects: list[dict[str, Any]], name: str) -> list[str]:
    (container,) = by_kind(objects, "Deployment")[name]["spec"]["template"]["spec"]["containers"]
    return list(container["command"])


def test_control_jobs_and_batch_steps_run_on_workers_of_their_own(default_objects):
    """Finding 5 of the hardening review: every periodic job shared one queue with every
    tenant's batch steps, and waited behind them."""
    control = _worker_command(default_objects, "sy-roundhouse-celery-worker")
    batches = _worker_command(default_objects, "sy-roundhouse-celery-batches")
    assert control[:4] == batches[:4] == ["celery", "-A", "config", "worker"]
    assert control[control.index("--queues") + 1] == "control"
    assert batches[batches.index("--queues") + 1] == "batches"
    # As many batch runners as the batch workers run steps at once, unless config says.
    (config,) = by_kind(default_objects, "ConfigMap").values()
    assert config["data"]["ROUNDHOUSE_BATCH_RUNNERS"] == "2"
    scaled = render({**SECRETS, "celeryBatches": {"replicas": 3, "concurrency": 4}})
    (config,) = by_kind(scaled, "ConfigMap").values()
    assert config["data"]["ROUNDHOUSE_BATCH_RUNNERS"] == "12"
    chosen = render({**SECRETS, "config": {"ROUNDHOUSE_BATCH_RUNNERS": "5"}})
    (config,) = by_kind(chosen, "ConfigMap").values()
    assert config["data"]["ROUNDHOUSE_BATCH_RUNNERS"] == "5"


def test_the_ingesters_serve_metrics_on_their_port(default_objects):
    pod = pods(default_objects)["sy-roundhouse-ingester"]
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["python", "manage.py", "run_ingester"]
    assert {"name": "ROUNDHOUSE_INGESTER_METRICS_PORT", "value": "9401"} in container["env"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9401"
    assert by_kind(default_objects, "Deployment")["sy-roundhouse-ingester"]["spec"]["replicas"] == 2


def test_every_pod_reads_settings_and_secrets_that_exist(default_objects, two_model_objects):
    for objects, secret in (
        (default_objects, "sy-roundhouse-secrets"),
        (two_model_objects, "roundhouse-secrets"),
    ):
        config_maps = set(by_kind(objects, "ConfigMap"))
        claims = set(by_kind(objects, "PersistentVolumeClaim"))
        assert secret not in by_kind(objects, "Secret") or objects is default_objects
        for name, pod in pods(objects).items():
            for container in pod["spec"]["containers"]:
                sources = container["envFrom"]
                assert {
                    s["configMapRef"]["name"] for s in sources if "configMapRef" in s
                } <= config_maps
                assert [s["secretRef"]["name"] for s in sources if "secretRef" in s] == [secret], (
                    name
                )
            for volume in pod["spec"].get("volumes", []):
                if "persistentVolumeClaim" in volume:
                    assert volume["persistentVolumeClaim"]["claimName"] in claims
    assert by_kind(two_model_objects, "Secret") == {}
    config = by_kind(two_model_objects, "ConfigMap")["sy-roundhouse-config"]["data"]
    assert config["DJANGO_SETTINGS_MODULE"] == "config.settings.prod"
    assert config["ROUNDHOUSE_ARTIFACT_ROOT"] == "/srv/roundhouse/artifacts"


# --- CRDs ------------------------------------------------------------------------------------


def test_custom_resources_are_well_formed(two_model_objects):
    objects = render(everything_on())
    kinds = {o["kind"] for o in objects}
    assert kinds >= CUSTOM_KINDS
    templates = pods(objects)
    services = by_kind(objects, "Service")
    for obj in objects:
        spec = obj.get("spec", {})
        if obj["kind"] == "ScaledObject":
            assert obj["apiVersion"] == "keda.sh/v1alpha1"
            assert spec["scaleTargetRef"]["name"] in by_kind(objects, "Deployment")
            assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
            for trigger in spec["triggers"]:
                # KEDA's trigger metadata is a map of strings: a bare number is refused.
                assert all(isinstance(v, str) for v in trigger["metadata"].values()), trigger
        elif obj["kind"] == "PrometheusRule":
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            for group in spec["groups"]:
                assert group["name"] and group["rules"]
                for rule in group["rules"]:
                    assert set(rule) <= {"record", "alert", "expr", "for", "labels", "annotations"}
                    assert isinstance(rule["expr"], str)
                    assert all(isinstance(v, str) for v in rule.get("labels", {}).values())
                    assert all(isinstance(v, str) for v in rule.get("annotations", {}).values())
                    assert re.fullmatch(r"\d+[smh]", rule.get("for", "1m"))
        elif obj["kind"] == "ServiceMonitor":
            (service,) = [
                s for s in services.values() if selects(spec["selector"], s["metadata"]["labels"])
            ]
            ports = {p["name"] for p in service["spec"]["ports"]}
            assert {e["port"] for e in spec["endpoints"]} <= ports
        elif obj["kind"] == "PodMonitor":
            scraped = [
                name
                for name, pod in templates.items()
                if selects(spec["selector"], pod["metadata"]["labels"])
            ]
            assert sorted(scraped) == [
                "sy-roundhouse-ingester", "sy-roundhouse-worker-chat", "sy-roundhouse-worker-embed",
            ]  # fmt: skip
            for name in scraped:
                ports = {
                    p["name"]
                    for c in templates[name]["spec"]["containers"]
                    for p in c.get("ports", [])
                }
                assert {e["port"] for e in spec["podMetricsEndpoints"]} <= ports


# --- the PrometheusRule --------------------------------------------------------------------


def _normalised(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups = copy.deepcopy(groups)
    for group in groups:
        for rule in group["rules"]:
            rule["expr"] = " ".join(rule["expr"].split())
    return groups


def _rule_groups(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (rule,) = by_kind(objects, "PrometheusRule").values()
    return rule["spec"]["groups"]


def test_the_chart_renders_the_rule_files_for_the_default_objectives():
    objects = render({**SECRETS, "prometheusRule": {"enabled": True}})
    files = [g for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"]]
    assert _normalised(_rule_groups(objects)) == _normalised(files)


def test_per_deployment_objectives_split_the_rules_by_deployment(two_model_objects):
    rules = [r for g in _rule_groups(two_model_objects) for r in g["rules"]]
    ttft = [
        " ".join(r["expr"].split())
        for r in rules
        if r.get("record") == "deployment:roundhouse_ttft_slo_errors:ratio_rate1h"
    ]
    assert len(ttft) == 2
    assert 'deployment="llama-chat", priority="interactive", le="1.0"' in ttft[0]
    assert 'deployment!~"llama-chat", priority="interactive", le="2.0"' in ttft[1]
    availability_pages = [
        " ".join(r["expr"].split())
        for r in rules
        if r.get("alert") == "RoundhouseAvailabilityBudgetBurn"
        and r["labels"]["severity"] == "page"
    ]
    assert len(availability_pages) == 2
    assert 'ratio_rate1h{deployment="minilm"} > (14.4 * (1 - 0.995))' in availability_pages[0]
    assert 'ratio_rate1h{deployment!~"minilm"} > (14.4 * (1 - 0.999))' in availability_pages[1]
    contract = contract_load()
    recorded = {r["record"] for r in rules if "record" in r}
    assert {
        r.get("record") or r["alert"]: problems(r["expr"], contract, recorded)
        for r in rules
        if problems(r["expr"], contract, recorded)
    } == {}
    runbooks = {r["annotations"]["runbook_url"] for r in rules if "alert" in r}
    assert all(
        u.startswith("https://git.example.com/platform/roundhouse/-/blob/main/docs/runbook.md#")
        for u in runbooks
    )


def test_example_objectives_are_bucket_boundaries():
    from vllm.v1.metrics.buckets import histogram_buckets

    from inference.base.metrics import TTFT_BUCKETS

    ttft = {floatToGoString(b) for b in TTFT_BUCKETS}
    itl = {floatToGoString(b) for b in histogram_buckets("inter_token_latency")}
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["slo"]
    objectives = [defaults] + [m.get("slo", {}) for m in two_models()["modelDeployments"]]
    for slo in objectives:
        assert slo.get("ttftSeconds", "2.0") in ttft
        assert slo.get("itlSeconds", "0.2") in itl


# Two deployments with objectives of their own (values-two-models.yaml: llama-chat a 1 s TTFT,
# minilm 99.5 % availability), fed the same traffic: half of the first tokens between 1 and 2 s,
# 1 % of requests failed. llama-chat burns its TTFT budget (50 % over 1 s, budget 5 %) and its
# availability budget (1 % against 0.1 %) fast enough to page; minilm misses none of its TTFT
# objective (2 s) and burns its larger availability budget (1 % against 0.5 %) only slowly.
_OVERRIDE_TEST = """
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
{series}
    alert_rule_test:
      - eval_time: 7h
        alertname: RoundhouseTTFTBudgetBurn
        exp_alerts:
          - exp_labels: {{severity: page, slo: ttft, deployment: llama-chat}}
            exp_annotations: {ttft_page}
          - exp_labels: {{severity: ticket, slo: ttft, deployment: llama-chat}}
            exp_annotations: {ttft_ticket}
      - eval_time: 7h
        alertname: RoundhouseAvailabilityBudgetBurn
        exp_alerts:
          - exp_labels: {{severity: page, slo: availability, deployment: llama-chat}}
            exp_annotations: {avail_chat_page}
          - exp_labels: {{severity: ticket, slo: availability, deployment: llama-chat}}
            exp_annotations: {avail_chat_ticket}
          - exp_labels: {{severity: ticket, slo: availability, deployment: minilm}}
            exp_annotations: {avail_minilm_ticket}
"""


def _series(deployment: str) -> list[str]:
    ttft = "roundhouse_time_to_first_token_seconds"
    where = f'deployment="{deployment}"'
    return [
        f'{ttft}_count{{{where}, priority="interactive"}}|0+100x420',
        f'{ttft}_bucket{{{where}, priority="interactive", le="1.0"}}|0+50x420',
        f'{ttft}_bucket{{{where}, priority="interactive", le="2.0"}}|0+100x420',
        f'roundhouse_admission_decisions_total{{{where}, reason="admitted"}}|0+1000x420',
        f'roundhouse_worker_requests_total{{{where}, status="error"}}|0+10x420',
    ]


def _annotations(rule: dict[str, Any], deployment: str, value: str) -> str:
    def fill(text: str) -> str:
        text = text.replace("{{ $labels.deployment }}", deployment)
        return text.replace("{{ $value | humanizePercentage }}", value)

    return yaml.safe_dump(
        {k: fill(v) for k, v in rule["annotations"].items()}, default_flow_style=True, width=10_000
    ).strip()


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
def test_per_deployment_objectives_alert_each_deployment_on_its_own_budget(
    tmp_path, two_model_objects
):
    assert PROMTOOL is not None
    groups = _rule_groups(two_model_objects)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    check = subprocess.run(
        [PROMTOOL, "check", "rules", "rules.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr

    rules = {
        (r["alert"], r["labels"]["severity"]): r for g in groups for r in g["rules"] if "alert" in r
    }
    series = "\n".join(
        f"      - series: '{name}'\n        values: '{values}'"
        for deployment in ("llama-chat", "minilm")
        for name, values in (line.split("|") for line in _series(deployment))
    )
    test = _OVERRIDE_TEST.format(
        series=series,
        ttft_page=_annotations(rules["RoundhouseTTFTBudgetBurn", "page"], "llama-chat", "50%"),
        ttft_ticket=_annotations(rules["RoundhouseTTFTBudgetBurn", "ticket"], "llama-chat", "50%"),
        avail_chat_page=_annotations(
            rules["RoundhouseAvailabilityBudgetBurn", "page"], "llama-chat", "1%"
        ),
        avail_chat_ticket=_annotations(
            rules["RoundhouseAvailabilityBudgetBurn", "ticket"], "llama-chat", "1%"
        ),
        avail_minilm_ticket=_annotations(
            rules["RoundhouseAvailabilityBudgetBurn", "ticket"], "minilm", "1%"
        ),
    )
    (tmp_path / "test.yml").write_text(test)
    result = subprocess.run(
        [PROMTOOL, "test", "rules", "test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_workers_keep_their_weights_in_the_nodes_cache(two_model_objects):
    for name, pod in pods(two_model_objects).items():
        if pod["metadata"]["labels"]["app.kubernetes.io/component"] != "worker":
            continue
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["ROUNDHOUSE_WEIGHTS_CACHE_DIR"] == "/var/cache/roundhouse/weights", name
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["weights-cache"] == "/var/cache/roundhouse/weights"
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["weights-cache"]["hostPath"] == {
            "path": "/var/cache/roundhouse/weights",
            "type": "DirectoryOrCreate",
        }
    assert not by_kind(two_model_objects, "DaemonSet")  # nothing to prefetch


def test_a_prefetch_list_runs_a_warm_pool_daemonset_on_the_worker_nodes():
    values = everything_on()
    values["weightsCache"] = {"prefetch": ["llama@v2", "llama@v3"], "maxBytes": 500 << 30}
    objects = render(values)
    (daemonset,) = by_kind(objects, "DaemonSet").values()
    spec = daemonset["spec"]["template"]["spec"]
    owner, fetch = spec["initContainers"]
    assert owner["name"] == "weights-cache-owner"
    assert fetch["command"] == [
        "python", "manage.py", "fetch_weights", "llama@v2", "llama@v3",
    ]  # fmt: skip
    env = {e["name"]: e.get("value") for e in fetch["env"]}
    assert env["ROUNDHOUSE_WEIGHTS_CACHE_MAX_BYTES"] == str(500 << 30)
    assert {m["name"] for m in fetch["volumeMounts"]} >= {"artifacts", "weights-cache"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert daemonset["spec"]["template"]["metadata"]["annotations"]["roundhouse.io/prefetch"] == (
        "llama@v2,llama@v3"
    )


def test_each_pool_of_a_version_gets_its_nodes_its_resource_and_its_grace():
    objects = render(yaml.safe_load(POOLS.read_text()))
    for obj in objects:
        if obj["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    deployments = by_kind(objects, "Deployment")
    h100 = deployments["sy-roundhouse-worker-llama-h100"]
    l4 = deployments["sy-roundhouse-worker-llama-l4"]
    mig = deployments["sy-roundhouse-worker-llama-mig"]
    assert h100["metadata"]["labels"]["roundhouse.io/capacity"] == "on-demand"
    assert l4["metadata"]["labels"]["roundhouse.io/capacity"] == "spot"
    assert mig["metadata"]["labels"]["roundhouse.io/accelerator"] == "NVIDIA-A100-SXM4-40GB"

    h100_pod, l4_pod, mig_pod = (d["spec"]["template"]["spec"] for d in (h100, l4, mig))
    assert h100_pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert l4_pod["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-L4",
        "karpenter.sh/capacity-type": "spot",
    }
    assert {"key": "karpenter.sh/capacity-type", "operator": "Equal", "value": "spot",
            "effect": "NoSchedule"} in l4_pod["tolerations"]  # fmt: skip
    assert not any(t.get("key") == "karpenter.sh/capacity-type" for t in h100_pod["tolerations"])
    # A MIG profile is a resource name of its own.
    (container,) = mig_pod["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/mig-3g.20gb": 1}
    # A spot pool drains within its node's notice.
    (container,) = l4_pod["containers"]
    assert l4_pod["terminationGracePeriodSeconds"] == 120
    assert container["command"][-2:] == ["--drain-seconds", "110"]
    # Each pool's workers, and the frontends, spread over zones.
    for pod, own in ((h100_pod, "llama-h100"), (l4_pod, "llama-l4")):
        (spread,) = pod["topologySpreadConstraints"]
        assert spread["topologyKey"] == "topology.kubernetes.io/zone"
        assert spread["labelSelector"]["matchLabels"]["roundhouse.io/model-deployment"] == own
    frontend = deployments["sy-roundhouse-frontend"]["spec"]["template"]
    (spread,) = frontend["spec"]["topologySpreadConstraints"]
    assert selects(spread["labelSelector"], frontend["metadata"]["labels"])


def test_every_pod_runs_the_pinned_image_as_its_user_on_a_read_only_root(two_model_objects):
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["digest"], "make image writes the digest it built into values.yaml"
    default = render(SECRETS)
    images = {
        container["image"]
        for pod in pods(default).values()
        for container in pod["spec"]["containers"]
    }
    assert images == {f"ghcr.io/example/roundhouse:0.1.0@{values['image']['digest']}"}
    for name, pod in pods(two_model_objects).items():
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] == 10001, name
        for container in spec["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}, name
            mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
            assert "/tmp" in mounts, name  # the one place a process writes


def test_a_gpu_worker_runs_the_cuda_build_and_an_override_drops_the_default_digest():
    digests = {"image": "sha256:" + "a" * 64, "gpuImage": "sha256:" + "b" * 64}
    values = two_models()
    values["image"] = {"repository": "r.example/roundhouse", "digest": digests["image"]}
    values["gpuImage"] = {"repository": "r.example/roundhouse", "digest": digests["gpuImage"]}
    workers = {n: p["spec"] for n, p in pods(render({**values})).items() if "worker" in n}
    (chat,) = workers["sy-roundhouse-worker-chat"]["containers"]
    (embed,) = workers["sy-roundhouse-worker-embed"]["containers"]
    assert chat["image"] == f"r.example/roundhouse:0.1.0-cuda@{digests['gpuImage']}"
    assert embed["image"] == f"r.example/roundhouse:0.1.0@{digests['image']}"

    values["modelDeployments"][0]["image"] = {"repository": "r.example/own", "tag": "7"}
    workers = {n: p["spec"] for n, p in pods(render(values)).items() if "worker" in n}
    (chat,) = workers["sy-roundhouse-worker-chat"]["containers"]
    assert chat["image"] == "r.example/own:7"


def test_only_the_weights_cache_owner_runs_as_root_and_only_to_chown(two_model_objects):
    for name, pod in pods(two_model_objects).items():
        for init in pod["spec"].get("initContainers", []):
            if init["securityContext"].get("runAsUser") != 0:
                continue
            assert init["name"] == "weights-cache-owner", name
            assert init["command"] == ["chown", "10001:10001", "/var/cache/roundhouse/weights"]
            assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
            assert [m["name"] for m in init["volumeMounts"]] == ["weights-cache"]
