"""deploy/kubernetes as `kubectl kustomize` renders it (and deploy/overlay-example over it):

- every built-in resource is valid against the Kubernetes schemas (kubernetes-validate,
  offline, strict: an unknown field is an error), for the oldest and the newest version;
- every container runs a `recallq` command line recallq's own parser takes, with the ports,
  CPU and grace period that command and the settings call for;
- secrets are referenced, never inlined, under the keys docs/deploy.md says to create;
- the KEDA ScaledObject and TriggerAuthentication, and the Prometheus Operator's monitors,
  have the shape their projects document (CRDs: no schema of theirs ships here);
- the KEDA trigger's query, read from the rendered manifest, run on a real migrated Postgres
  (a throwaway database) with runs made and cancelled through the library: 0 with no run, a
  pod per 128 items waiting (32 threads, 4 items to an attribution message), 0 again after
  a cancel; the same as the recallq_items_waiting gauge
  once a run is dispatched; answered through the index on a large items table, by a role
  that may only read `runs` and `items`.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import kubernetes_validate
import psycopg
import pytest
import yaml
from sqlalchemy.engine import make_url

from recallq.cli import build_parser
from recallq.execution import work
from recallq.execution.celery_queue import ATTRIBUTION_MESSAGE_ITEMS
from recallq.execution.runtime import Runtime
from recallq.observability.gauges import WorkCollector
from recallq.runs.service import RunService
from recallq.settings import Settings
from tests.fakes import RecordingQueue
from tests.services import REPO, migrated_database, redis_database

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(
    KUBECTL is None,
    reason="kubectl is not installed: the tests render deploy/kubernetes with `kubectl kustomize`"
    " (CI installs it)",
)

BASE = REPO / "deploy" / "kubernetes"
OVERLAY = REPO / "deploy" / "overlay-example"
#: the oldest and the newest Kubernetes the manifests are checked against (KEDA 2.17 and
#: later run on 1.30 and later; kubernetes-validate ships schemas up to its own version)
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version() + ".0")
#: kinds that are CRDs: shapes checked below against their projects' documentation
CUSTOM_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
}
SECRET_SETTINGS = {  # environment variables that hold a secret: from a Secret, always
    "RECALLQ_DATABASE_URL",
    "RECALLQ_REDIS_URL",
    "RECALLQ_SESSION_SECRET",
    "RECALLQ_METRICS_TOKEN",
    "RECALLQ_API_KEY",
}


def _render(directory: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return _render(BASE)


@pytest.fixture(scope="module", params=["base", "overlay"])
def rendered(request: pytest.FixtureRequest, base: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return base if request.param == "base" else _render(OVERLAY)


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def _pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each workload's pod spec, by the workload's name."""
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] in ("Deployment", "Job")
    }


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _settings_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    (config,) = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("recallq-settings")
    ]
    data: dict[str, str] = config["data"]
    return data


def _settings(docs: list[dict[str, Any]]) -> Settings:
    """The settings every recallq container reads: the ConfigMap's over the defaults."""
    fields = {
        name.removeprefix("RECALLQ_").lower(): value
        for name, value in _settings_of(docs).items()
        if name.startswith("RECALLQ_")
    }
    return Settings.model_validate(fields)


def _items_per_pod(docs: list[dict[str, Any]]) -> int:
    """Items one worker pod keeps busy: --processes x --concurrency threads of its command
    (read off the command line: whether recallq's parser takes it is the next test's), each
    attributing the items of one attribution message in a row."""
    (worker,) = _pod_specs(docs)["recallq-worker"]["containers"]
    argv = [*worker["command"], *worker.get("args", [])]
    threads = int(argv[argv.index("--processes") + 1]) * int(argv[argv.index("--concurrency") + 1])
    return threads * ATTRIBUTION_MESSAGE_ITEMS


# --- the built-in resources ------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_built_in_resource_is_valid_for_kubernetes(
    rendered: list[dict[str, Any]], version: str
) -> None:
    kinds = set()
    for doc in rendered:
        kinds.add(doc["kind"])
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{doc['kind']} {doc['metadata']['name']}: {exc}") from None
    assert {"Deployment", "Service", "Job", "PodDisruptionBudget", "ScaledObject"} <= kinds
    assert {(d["apiVersion"], d["kind"]) for d in rendered} >= CUSTOM_KINDS
    assert "Secret" not in kinds  # referenced, created beside (docs/deploy.md): never here


def test_every_container_runs_a_command_line_recallq_takes(rendered: list[dict[str, Any]]) -> None:
    parser = build_parser()
    commands = {}
    for workload, pod in _pod_specs(rendered).items():
        for container in _containers(pod):
            argv = [*container.get("command", []), *container.get("args", [])]
            assert argv[0] == "recallq", (workload, container["name"])
            commands[workload, container["name"]] = (parser.parse_args(argv[1:]), container)
    migrate, _ = commands["recallq-migrate", "migrate"]
    assert migrate.command == "migrate" and not migrate.check and migrate.downgrade is None
    for workload in ("recallq-api", "recallq-worker"):  # they wait for it, changing nothing
        waits, _ = commands[workload, "wait-for-migrations"]
        assert waits.command == "migrate" and waits.check and waits.wait > 0
        assert [c["name"] for c in _pod_specs(rendered)[workload]["initContainers"]] == [
            "wait-for-migrations"
        ]

    api, container = commands["recallq-api", "api"]
    assert api.command == "api" and api.host == "0.0.0.0"
    (http,) = container["ports"]
    assert http == {"name": "http", "containerPort": api.port}

    worker, container = commands["recallq-worker", "worker"]
    assert worker.command == "worker" and worker.metrics_host == "0.0.0.0"
    (metrics,) = container["ports"]
    assert metrics == {"name": "metrics", "containerPort": worker.metrics_port}
    # one process per CPU the pod asks for: in a container, the CPU count is the node's
    assert worker.processes is not None and worker.concurrency is not None
    assert str(worker.processes) == str(container["resources"]["requests"]["cpu"])


def test_secrets_are_referenced_never_inlined(rendered: list[dict[str, Any]]) -> None:
    documented = (REPO / "docs" / "deploy.md").read_text()
    secret_keys: set[tuple[str, str]] = set()
    for workload, pod in _pod_specs(rendered).items():
        for container in _containers(pod):
            for env in container.get("env", []):
                name = env["name"]
                if name.startswith("RECALLQ_"):  # a setting recallq has
                    assert name.removeprefix("RECALLQ_").lower() in Settings.model_fields, name
                if name in SECRET_SETTINGS or re.search(r"KEY|SECRET|TOKEN|PASSWORD", name):
                    assert "value" not in env, (workload, name)
                    ref = env["valueFrom"]["secretKeyRef"]
                    secret_keys.add((ref["name"], ref["key"]))
                else:
                    assert "://" not in str(env.get("value", "")), (workload, name)
            for source in container.get("envFrom", []):
                if "secretRef" in source:  # the providers' keys: the workers' only
                    assert (workload, source["secretRef"]["name"]) == (
                        "recallq-worker",
                        "recallq-provider-keys",
                    )
                    assert container["name"] == "worker"
    # the keys docs/deploy.md has you create, each with kubectl create secret
    for name, key in secret_keys | {("recallq", "keda-database-url")}:
        assert f"--from-literal={key}=" in documented or f"--from-file={key}=" in documented, key
        assert name == "recallq"
    assert "create secret generic recallq-provider-keys" in documented
    # what sits in the ConfigMap is no secret, and is a setting recallq has
    for name, value in _settings_of(rendered).items():
        assert name not in SECRET_SETTINGS and "://" not in value, name
        if name.startswith("RECALLQ_"):
            assert name.removeprefix("RECALLQ_").lower() in Settings.model_fields, name


def test_pods_run_as_the_images_user_with_a_read_only_root(rendered: list[dict[str, Any]]) -> None:
    uid = int(re.search(r"--uid (\d+)", (REPO / "Dockerfile").read_text()).group(1))  # type: ignore[union-attr]
    for workload, pod in _pod_specs(rendered).items():
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == uid, workload  # numeric: verifiable
        assert pod["serviceAccountName"] == "recallq"
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        for container in _containers(pod):
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert "emptyDir" in volumes[mounts["/tmp"]], (workload, container["name"])
            image = container["image"]  # a version, never whatever `latest` is that day
            assert re.fullmatch(r"[^:@]+(:[\w.-]+|@sha256:[0-9a-f]{64})", image), image
            assert not image.endswith(":latest"), image
            assert "memory" in container["resources"]["limits"], (workload, container["name"])
    sa = _one(rendered, "ServiceAccount", "recallq")
    assert sa["automountServiceAccountToken"] is False
    # the API's spool (uploads, then each submission's checked items) fits its /tmp
    api = _pod_specs(rendered)["recallq-api"]
    (tmp,) = [v for v in api["volumes"] if v["name"] == "tmp"]
    size = tmp["emptyDir"]["sizeLimit"]
    spool = _settings(rendered).max_spool_bytes
    assert size.endswith("Gi") and int(size[:-2]) * 1024**3 >= 2 * spool, size
    # every recallq pod that reads the models file has it where RECALLQ_MODELS_FILE says
    models_file = Path(_settings_of(rendered)["RECALLQ_MODELS_FILE"])
    for workload in ("recallq-api", "recallq-worker"):
        pod = _pod_specs(rendered)[workload]
        (container,) = pod["containers"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volume = next(v for v in pod["volumes"] if v["name"] == mounts[str(models_file.parent)])
        (models,) = [
            d
            for d in rendered
            if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"]
        ]
        assert models_file.name in models["data"]
        assert yaml.safe_load(models["data"][models_file.name])["models"], workload


def test_probes_grace_and_disruption_budgets(rendered: list[dict[str, Any]]) -> None:
    pods = _pod_specs(rendered)
    (api,) = pods["recallq-api"]["containers"]
    assert api["readinessProbe"]["httpGet"] == {"path": "/readyz?exclude=workers", "port": "http"}
    assert api["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}

    # a worker waiting out a provider (or Redis) outage is alive: its liveness asks that a
    # process of it serves its metrics page, in longer than the page's Redis reads may take
    (worker,) = pods["recallq-worker"]["containers"]
    for probe in ("startupProbe", "livenessProbe"):
        assert worker[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
        assert (
            worker[probe]["timeoutSeconds"] > 10
        )  # recallq.execution.runtime's Redis socket timeout
    assert "readinessProbe" not in worker and "exec" not in worker["livenessProbe"]

    # a stopping worker's calls in flight may finish: the longest one call may take
    settings = _settings(rendered)
    grace = pods["recallq-worker"]["terminationGracePeriodSeconds"]
    assert grace >= settings.rate_limit_max_wait + settings.request_timeout + 10, grace

    for component in ("api", "worker"):
        budget = _one(rendered, "PodDisruptionBudget", f"recallq-{component}")["spec"]
        # maxUnavailable, never minAvailable: a drain of a node holding the only pod goes on
        assert budget["maxUnavailable"] == 1 and "minAvailable" not in budget
        deployment = _one(rendered, "Deployment", f"recallq-{component}")
        assert budget["selector"] == deployment["spec"]["selector"]
    assert "replicas" not in _one(rendered, "Deployment", "recallq-worker")["spec"]  # KEDA's


# --- the custom resources ------------------------------------------------------------------

#: keda.sh/v1alpha1 ScaledObject spec fields (KEDA's ScaledObject specification)
SCALED_OBJECT_FIELDS = {
    "scaleTargetRef",
    "pollingInterval",
    "cooldownPeriod",
    "initialCooldownPeriod",
    "idleReplicaCount",
    "minReplicaCount",
    "maxReplicaCount",
    "fallback",
    "advanced",
    "triggers",
}
#: the postgresql scaler's trigger metadata (KEDA's PostgreSQL scaler page)
POSTGRESQL_METADATA = {
    "connectionFromEnv",
    "host",
    "userName",
    "passwordFromEnv",
    "port",
    "dbName",
    "sslmode",
    "query",
    "targetQueryValue",
    "activationTargetQueryValue",
    "metricName",
}
#: and its authentication parameters (TriggerAuthentication secretTargetRef[].parameter)
POSTGRESQL_AUTH = {"connection", "host", "userName", "password", "port", "dbName", "sslmode"}


def test_the_scaled_object_is_what_keda_documents(rendered: list[dict[str, Any]]) -> None:
    scaled = _one(rendered, "ScaledObject", "recallq-worker")
    spec = scaled["spec"]
    assert set(spec) <= SCALED_OBJECT_FIELDS, set(spec) - SCALED_OBJECT_FIELDS
    target = spec["scaleTargetRef"]  # mandatory: name; kind and apiVersion default to a
    assert target == {"name": "recallq-worker"}  # Deployment's, in this namespace
    _one(rendered, "Deployment", target["name"])
    for field in ("pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount"):
        assert isinstance(spec[field], int) and spec[field] >= 0, field
    assert spec["minReplicaCount"] == 0 < spec["maxReplicaCount"]
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert set(behavior) <= {"scaleUp", "scaleDown"}

    (trigger,) = spec["triggers"]
    assert trigger["type"] == "postgresql"
    metadata = trigger["metadata"]
    assert set(metadata) <= POSTGRESQL_METADATA, set(metadata) - POSTGRESQL_METADATA
    # the CRD's metadata is a map of strings: a bare number is refused when applied
    assert all(isinstance(value, str) for value in metadata.values()), metadata
    assert {"query", "targetQueryValue"} <= set(metadata)
    assert float(metadata["targetQueryValue"]) == 1  # the query answers in pods
    assert float(metadata.get("activationTargetQueryValue", "0")) == 0
    # no connection in the trigger itself: from the TriggerAuthentication it names
    assert not {"connectionFromEnv", "host", "passwordFromEnv"} & set(metadata)
    auth = _one(rendered, "TriggerAuthentication", trigger["authenticationRef"]["name"])
    assert set(auth["spec"]) == {"secretTargetRef"}
    (ref,) = auth["spec"]["secretTargetRef"]
    assert set(ref) == {"parameter", "name", "key"} and ref["parameter"] in POSTGRESQL_AUTH
    assert ref["parameter"] == "connection"


def test_prometheus_scrapes_the_api_with_its_token_and_every_worker_pod(
    rendered: list[dict[str, Any]],
) -> None:
    service = _one(rendered, "Service", "recallq-api")
    monitor = _one(rendered, "ServiceMonitor", "recallq-api")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "recallq", "key": "metrics-token"},
    }
    (api,) = _pod_specs(rendered)["recallq-api"]["containers"]
    token = next(e for e in api["env"] if e["name"] == "RECALLQ_METRICS_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == endpoint["authorization"]["credentials"]

    pods = _one(rendered, "PodMonitor", "recallq-worker")["spec"]
    worker = _one(rendered, "Deployment", "recallq-worker")["spec"]["template"]
    assert pods["selector"]["matchLabels"].items() <= worker["metadata"]["labels"].items()
    (endpoint,) = pods["podMetricsEndpoints"]
    (container,) = worker["spec"]["containers"]
    assert endpoint["port"] in {port["name"] for port in container["ports"]}


def test_the_overlay_changes_image_replicas_models_and_the_most_workers() -> None:
    base, overlay = _render(BASE), _render(OVERLAY)
    images = {c["image"] for pod in _pod_specs(overlay).values() for c in _containers(pod)}
    assert images == {"registry.example.com/team/recallq:0.1.0"}
    assert _one(overlay, "Deployment", "recallq-api")["spec"]["replicas"] == 3
    assert _one(overlay, "ScaledObject", "recallq-worker")["spec"]["maxReplicaCount"] == 4
    assert {d["metadata"].get("namespace") for d in overlay} == {"recallq"}

    def models(docs: list[dict[str, Any]]) -> list[str]:
        (config,) = [
            d
            for d in docs
            if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("recallq-models")
        ]
        return [m["name"] for m in yaml.safe_load(config["data"]["models.yaml"])["models"]]

    assert models(base) == ["gpt-4o-mini"]
    assert models(overlay) == ["gpt-4o-mini", "claude-3-5-haiku"]


# --- the KEDA query on a real Postgres ------------------------------------------------------


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    """A migrated Postgres database of this module's own: the session's holds other tests'
    active runs, and the query counts every active run."""
    with migrated_database() as url:
        yield url


def _query(base: list[dict[str, Any]]) -> str:
    (trigger,) = _one(base, "ScaledObject", "recallq-worker")["spec"]["triggers"]
    query: str = trigger["metadata"]["query"]
    return query


def _libpq(url: str, username: str | None = None, password: str | None = None) -> str:
    """The libpq form of a SQLAlchemy URL (what KEDA's keda-database-url holds)."""
    libpq = make_url(url).set(drivername="postgresql")
    if username is not None:
        libpq = libpq.set(username=username, password=password)
    return libpq.render_as_string(hide_password=False)


def _pods_wanted(url: str, query: str) -> int:
    with psycopg.connect(_libpq(url)) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None and isinstance(row[0], int), row  # KEDA reads one integer
    return row[0]


def _waiting_gauge(runtime: Runtime) -> float:
    collector = WorkCollector(
        partial(work.read_work, runtime.database), lambda: runtime.models.keys()
    )
    (family,) = [f for f in collector.collect() if f.name == "recallq_items_waiting"]
    return sum(sample.value for sample in family.samples)


def _items(n: int, tag: str) -> list[dict[str, Any]]:
    return [
        {"id": f"{tag}{i}", "ground_truth": f"Fact {i}.", "context": [f"Fact {i}."]}
        for i in range(n)
    ]


@pytest.fixture()
def service(database: str, base: list[dict[str, Any]], tmp_path: Path) -> Iterator[RunService]:
    models = tmp_path / "models.yaml"  # a model whose runs may go to its provider's Batch API
    models.write_text(
        "models:\n  - name: batched\n    litellm_params: {model: openai/gpt-4o-mini}\n"
        "    batch: true\n"
    )
    settings = Settings(
        database_url=database,
        redis_url=redis_database(9),
        models_file=models,
        dispatch_window=_settings(base).dispatch_window,
        cancel_wait=1,
    )
    runtime = Runtime.distributed(settings, RecordingQueue())
    yield RunService(runtime)
    runtime.close()


def test_the_keda_query_asks_for_workers_while_items_wait_and_none_after(
    base: list[dict[str, Any]], database: str, service: RunService
) -> None:
    query, per_pod = _query(base), _items_per_pod(base)
    window = service.settings.dispatch_window
    assert _pods_wanted(database, query) == 0  # no run: no worker

    submitted = service.submit(service.spec({}, "k8s"), _items(100, "a")).view
    # submitted to an empty fleet: no worker has dispatched it, its items are all pending
    assert _pods_wanted(database, query) == math.ceil(100 / per_pod) >= 1
    service.runtime.engine.dispatch(submitted["id"])  # what a worker does first
    assert _waiting_gauge(service.runtime) == 100
    assert _pods_wanted(database, query) == math.ceil(100 / per_pod)  # = ceil(gauge / 128)

    # a run bigger than its window asks for what its window can keep busy, no more
    big = service.submit(service.spec({}, "k8s"), _items(window + 500, "b")).view
    assert _pods_wanted(database, query) == math.ceil((100 + window) / per_pod)
    service.runtime.engine.dispatch(big["id"])
    assert _waiting_gauge(service.runtime) == 100 + window
    assert _pods_wanted(database, query) == math.ceil(_waiting_gauge(service.runtime) / per_pod)

    for run in (submitted, big):
        assert service.cancel(run["id"], "k8s").view["status"] == "cancelled"
    assert _pods_wanted(database, query) == 0  # cancelled: nothing waits

    # a batch-mode run's items go to the provider's Batch API, which one worker polls
    batched = service.submit(
        service.spec({"model": "batched", "mode": "batch"}, "k8s"), _items(10, "c")
    ).view
    assert _pods_wanted(database, query) == 1
    service.cancel(batched["id"], "k8s")
    assert _pods_wanted(database, query) == 0


def test_the_keda_query_reads_the_index_and_needs_only_runs_and_items(
    base: list[dict[str, Any]], database: str, service: RunService
) -> None:
    query = _query(base)
    active = service.submit(service.spec({}, "k8s"), _items(200, "d")).view
    # a large items table: 60,000 items of ended runs, as months of use leave behind
    with psycopg.connect(_libpq(database)) as conn:
        ended = [str(uuid.uuid4()) for _ in range(60)]
        for run_id in ended:
            conn.execute(
                "INSERT INTO runs (id, project, model, scale, status, total_items, created_at, "
                "mode) VALUES (%s, 'k8s', 'local/lexical', 1, 'completed', 1000, now(), "
                "'online')",
                (run_id,),
            )
            conn.execute(
                "INSERT INTO items (run_id, idx, key, status, attempts, llm_calls, "
                "prompt_tokens, completion_tokens, cost_usd, cache_hits) "
                "SELECT %s, i, 'k' || i, 'succeeded', 1, 2, 0, 0, 0, 0 "
                "FROM generate_series(0, 999) AS i",
                (run_id,),
            )
        conn.execute("ANALYZE runs")
        conn.execute("ANALYZE items")
        (plan,) = conn.execute(f"EXPLAIN (FORMAT JSON) {query}").fetchone()  # type: ignore[misc]

    def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    # items are found through the run-and-status index (an index, index-only or bitmap scan
    # of it, as the statistics make cheapest), never by reading the table
    every = list(nodes(plan[0]["Plan"]))
    on_items = [n for n in every if n.get("Relation Name") == "items"]
    assert on_items and all(n["Node Type"] != "Seq Scan" for n in on_items), plan
    indexes = {n["Index Name"] for n in every if "Index Name" in n}
    assert indexes == {"ix_items_run_status_idx"}, plan
    assert _pods_wanted(database, query) == math.ceil(200 / _items_per_pod(base))

    # the role docs/deploy.md gives KEDA: it may read runs and items, nothing else
    role, password = f"recallq_keda_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    documented = (REPO / "docs" / "deploy.md").read_text()
    grants = [
        line.strip().rstrip(";").replace("recallq_keda", role)
        for line in documented.splitlines()
        if re.match(r"\s*(GRANT|CREATE ROLE) ", line)
    ]
    assert any(g.startswith("GRANT SELECT ON runs, items") for g in grants), grants
    database_name = make_url(database).database
    with psycopg.connect(_libpq(database), autocommit=True) as admin:
        try:
            for statement in grants:
                statement = statement.replace("'PASSWORD'", f"'{password}'")
                admin.execute(statement.replace("DATABASE recallq", f"DATABASE {database_name}"))
            as_keda = _libpq(database, username=role, password=password)
            with psycopg.connect(as_keda) as conn:
                (wanted,) = conn.execute(query).fetchone()  # type: ignore[misc]
                assert wanted == math.ceil(200 / _items_per_pod(base))
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute("SELECT count(*) FROM claims")
        finally:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")
    service.cancel(active["id"], "k8s")
