"""collector-config/: Collector YAML, Prometheus settings and the otel-lgtm compose file.

No otelcol-contrib binary is installable here (it is on none of the reachable registries),
so the Collector configs are checked structurally against the component names that
otelcol-contrib ships (its builder manifest, listed below), and the Prometheus and Grafana
files against the paths and attributes that the rest of the project relies on.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from observers.export.resource import process_attributes
from tests._support import REPO

CONFIG = REPO / "collector-config"
COLLECTOR_CONFIGS = sorted(CONFIG.glob("otelcol-config*.yaml"))

# Component type names of otelcol-contrib (opentelemetry-collector-releases,
# distributions/otelcol-contrib/manifest.yaml), the subset worth recognising here. `loki`
# is deliberately absent: the Loki exporter was removed from contrib; Loki 3 takes OTLP.
OTELCOL_CONTRIB = {
    "receivers": {"otlp", "prometheus", "hostmetrics", "filelog", "kafka", "jaeger", "zipkin",
                  "k8s_cluster", "kubeletstats", "docker_stats", "nop"},
    "processors": {"batch", "memory_limiter", "attributes", "resource", "resourcedetection",
                   "transform", "filter", "k8sattributes", "metricstransform", "groupbyattrs",
                   "cumulativetodelta", "deltatocumulative", "interval", "probabilistic_sampler",
                   "tail_sampling", "redaction", "span"},
    "exporters": {"otlp", "otlp_grpc", "otlphttp", "otlp_http", "debug", "nop", "prometheus",
                  "prometheusremotewrite", "file", "kafka", "loadbalancing", "zipkin",
                  "elasticsearch", "clickhouse", "googlecloud", "awsxray", "datadog"},
    "extensions": {"health_check", "pprof", "zpages", "basicauth", "bearertokenauth",
                   "oauth2client", "headers_setter", "file_storage"},
    "connectors": {"spanmetrics", "servicegraph", "count", "forward", "routing"},
}
_ENV = re.compile(r"\$\{env:(\w+)(?::-([^}]*))?\}")


def _load(path: Path) -> dict[str, Any]:
    with path.open() as f:
        return yaml.safe_load(f)


def _defaults(value: Any) -> Any:
    """``${env:VAR:-default}`` placeholders resolved to their defaults (all must have one)."""
    if isinstance(value, dict):
        return {k: _defaults(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_defaults(v) for v in value]
    if isinstance(value, str):
        for m in _ENV.finditer(value):
            assert m.group(2) is not None, f"{m.group(0)} has no default"
        return _ENV.sub(lambda m: m.group(2), value)
    return value


@pytest.mark.parametrize("path", COLLECTOR_CONFIGS, ids=lambda p: p.name)
def test_collector_config_uses_only_otelcol_contrib_components(path: Path) -> None:
    config = _defaults(_load(path))
    service = config["service"]
    used: dict[str, set[str]] = {kind: set() for kind in OTELCOL_CONTRIB}
    for name, pipeline in service["pipelines"].items():
        assert name.split("/")[0] in ("metrics", "traces", "logs"), name
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in (config.get(kind) or {}), f"{name}: {kind} {component} is not defined"
                used[kind].add(component)
    used["extensions"] = set(service.get("extensions", []))
    for kind, known in OTELCOL_CONTRIB.items():
        defined = set(config.get(kind) or {})
        for component in defined | used[kind]:
            assert component.split("/")[0] in known, f"{kind} {component!r} is not an otelcol-contrib component"
        assert defined == used[kind], f"{kind} defined but unused: {defined - used[kind]}"
    # all three signals, received over OTLP (gRPC and HTTP)
    assert {p.split("/")[0] for p in service["pipelines"]} == {"metrics", "traces", "logs"}
    assert set(config["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    for pipeline in service["pipelines"].values():
        assert pipeline["receivers"] == ["otlp"]
        assert pipeline["processors"][0] == "memory_limiter" and pipeline["processors"][-1] == "batch"


def test_collector_destinations() -> None:
    otlp = _defaults(_load(CONFIG / "otelcol-config.yaml"))
    exporters = otlp["exporters"]
    # Prometheus' OTLP receiver: the exporter appends /v1/metrics to this base
    assert exporters["otlp_http/prometheus"]["endpoint"].endswith("/api/v1/otlp")
    assert "otlp_grpc/tempo" in otlp["service"]["pipelines"]["traces"]["exporters"]
    assert exporters["otlp_http/loki"]["endpoint"].endswith("/otlp")  # Loki 3's native OTLP
    rw = _defaults(_load(CONFIG / "otelcol-config-remote-write.yaml"))
    prw = rw["exporters"]["prometheusremotewrite"]
    assert prw["endpoint"].endswith("/api/v1/write")
    assert prw["resource_to_telemetry_conversion"] == {"enabled": True}
    assert prw["add_metric_suffixes"] is True


def test_prometheus_promotes_our_resource_attributes() -> None:
    promoted = _load(CONFIG / "prometheus.yaml")["otlp"]["promote_resource_attributes"]
    assert len(promoted) == len(set(promoted))
    ours = set(process_attributes())  # what the 'observers' resource detector announces
    assert ours == {"service.name", "ml.run.id", "ml.run.name", "ml.rank", "ml.world_size", "host.name"}
    assert ours <= set(promoted)


def test_compose_provisions_the_dashboards_in_otel_lgtm() -> None:
    compose = _load(CONFIG / "docker-compose.yaml")
    (service,) = compose["services"].values()
    assert service["image"].startswith("grafana/otel-lgtm")
    assert {"3000:3000", "4317:4317", "4318:4318"} <= set(service["ports"])
    mounts = {}
    for volume in service["volumes"]:
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            assert (CONFIG / source).exists(), f"{source} does not exist"
            mounts[target] = CONFIG / source
    assert mounts["/otel-lgtm/prometheus.yaml"] == CONFIG / "prometheus.yaml"
    provider_yaml = next(t for t in mounts if t.startswith("/otel-lgtm/grafana/conf/provisioning/dashboards/")
                         and t.endswith(".yaml"))
    provider = _load(mounts[provider_yaml])
    assert provider["apiVersion"] == 1
    (prov,) = provider["providers"]
    assert prov["type"] == "file"
    dashboards = mounts[prov["options"]["path"]]  # the JSON folder is mounted where the provider looks
    names = sorted(p.name for p in dashboards.glob("*.json"))
    assert names == ["alerts.json", "hardware.json", "layers.json", "training.json"]
    for p in dashboards.glob("*.json"):
        json.loads(p.read_text())
    home = service["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(prov["options"]["path"] + "/") and (dashboards / Path(home).name).exists()


def test_docs_name_only_real_settings() -> None:
    """docs/grafana.md: every OTEL_*/OBSERVERS_* variable exists, every Collector one is used."""
    import opentelemetry.environment_variables as api_env
    import opentelemetry.sdk.environment_variables as sdk_env

    from observers import environment_variables as our_env

    known = {v for m in (api_env, sdk_env, our_env) for k, v in vars(m).items()
             if k.isupper() and isinstance(v, str)}
    text = (REPO / "docs" / "grafana.md").read_text()
    for name in set(re.findall(r"\b(?:OTEL|OBSERVERS)_[A-Z_]+\b", text)):
        assert name in known, f"docs/grafana.md names {name}, which no OTel SDK or observers setting has"
    collector = "".join(p.read_text() for p in COLLECTOR_CONFIGS)
    for name in set(re.findall(r"\b(?:PROMETHEUS|TEMPO|LOKI)_[A-Z_]+\b", text)):
        assert f"${{env:{name}" in collector, f"docs/grafana.md sets {name}, which no Collector config reads"
    for path in ("collector-config/otelcol-config.yaml", "collector-config/otelcol-config-remote-write.yaml",
                 "collector-config/prometheus.yaml", "collector-config/grafana/provisioning/dashboards.yaml",
                 "docs/examples/train_digits.py", ".ci/install-services.sh"):
        assert (REPO / path).exists() and (path in text or Path(path).name in text), path
