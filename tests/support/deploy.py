"""The deployment recipes under deploy/ read as the processes they start: the Dockerfile's
stages, and each rsched container of compose.yaml and deploy/kubernetes/ as its command line,
environment, health checks and stop grace, resolved the way Docker Compose and Kubernetes do
(the image's ENTRYPOINT and CMD, YAML merge keys, envFrom and valueFrom)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rsched.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"  # the build context is the repository's root
COMPOSE = DEPLOY / "compose.yaml"
KUBERNETES = DEPLOY / "kubernetes"
KUSTOMIZATION = KUBERNETES / "kustomization.yaml"
IMAGE = "rsched"  # the image name the recipes give the build of deploy/Dockerfile
COMPOSE_STOP_GRACE_S = 10.0  # Docker Compose's default stop_grace_period
KUBERNETES_STOP_GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds


# --- the Dockerfile -------------------------------------------------------------------------


@dataclass
class Stage:
    """One FROM ... of a Dockerfile and its instructions, as (INSTRUCTION, arguments)."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, instruction: str) -> list[str]:
        return [args for ins, args in self.instructions if ins == instruction]

    def exec_form(self, instruction: str) -> list[str]:
        """The last ENTRYPOINT or CMD in exec (JSON) form; [] when the stage has none."""
        found = self.all(instruction)
        if not found:
            return []
        value = json.loads(found[-1])
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), found[-1]
        return value


def dockerfile_stages(path: Path = DOCKERFILE) -> list[Stage]:
    """The stages in order, continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment between continued lines
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[Stage] = []
    for line in logical:
        instruction, _, args = line.partition(" ")
        instruction, args = instruction.upper(), args.strip()
        if instruction == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        else:
            assert stages, f"{instruction} before any FROM"
            stages[-1].instructions.append((instruction, args))
    return stages


def base_image(stages: list[Stage], stage: Stage) -> str:
    """The registry image a stage starts from, through stages built on other stages."""
    named = {s.name: s for s in stages if s.name}
    while stage.base in named:
        stage = named[stage.base]
    return stage.base


def image_entrypoint() -> tuple[list[str], list[str]]:
    """The final stage's ENTRYPOINT and CMD (a stage inherits them from the stage it builds on)."""
    stages = dockerfile_stages()
    named = {s.name: s for s in stages if s.name}
    stage: Stage | None = stages[-1]
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    while stage is not None:
        if entrypoint is None and stage.all("ENTRYPOINT"):
            entrypoint = stage.exec_form("ENTRYPOINT")
        if cmd is None and stage.all("CMD"):
            cmd = stage.exec_form("CMD")
        stage = named.get(stage.base)
    return entrypoint or [], cmd or []


def container_argv(command: list[str] | None, args: list[str] | None) -> list[str]:
    """What a container of the image runs: a command replaces ENTRYPOINT (and drops CMD),
    arguments replace CMD (Kubernetes' command/args; Compose's entrypoint/command)."""
    entrypoint, cmd = image_entrypoint()
    if command is not None:
        return [*command, *(args or [])]
    return [*entrypoint, *(cmd if args is None else args)]


# --- the processes of the recipes --------------------------------------------------------------


@dataclass(frozen=True)
class HttpCheck:
    """A Kubernetes httpGet probe: healthy on a status from 200 to 399."""

    kind: str  # readiness, liveness, startup
    port: int  # the container's port, named ports resolved
    path: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ExecCheck:
    """A command run in the container: healthy when it exits 0 (Compose's healthcheck, an exec
    probe)."""

    kind: str
    argv: tuple[str, ...]


Check = HttpCheck | ExecCheck


@dataclass(frozen=True)
class Process:
    """One rsched container of a recipe."""

    recipe: str  # compose or kubernetes
    name: str  # the service, or deployment/container
    argv: tuple[str, ...]  # as the container runs it: ("rsched", "worker", ...)
    env: dict[str, str]  # the container's RSCHED_* and other variables, as the recipe gives them
    checks: tuple[Check, ...]
    stop_grace_s: float  # from SIGTERM to SIGKILL
    ports: tuple[int, ...] = ()  # the container ports the recipe declares (Kubernetes)
    replicas: int = 1

    @property
    def command(self) -> str:
        """The rsched command: api, dispatcher, worker, archiver."""
        return next(a for a in self.argv[1:] if a in cli.commands)


def _duration_s(text: str) -> float:
    """A Compose duration (``45s``, ``1m30s``, ``500ms``) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def _compose_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def compose_checks(service: dict[str, Any]) -> tuple[Check, ...]:
    test = (service.get("healthcheck") or {}).get("test")
    if test is None:
        return ()
    if isinstance(test, str):
        return (ExecCheck("health", ("/bin/sh", "-c", test)),)
    if test[0] == "CMD":
        return (ExecCheck("health", tuple(test[1:])),)
    assert test[0] == "CMD-SHELL", f"healthcheck test {test!r}"
    return (ExecCheck("health", ("/bin/sh", "-c", test[1])),)


def is_rsched(image: str) -> bool:
    return image.rpartition("/")[2].split(":")[0] == IMAGE


def compose_processes() -> list[Process]:
    out = []
    for name, service in compose()["services"].items():
        if not is_rsched(str(service.get("image", ""))):
            continue
        entry, cmd = service.get("entrypoint"), service.get("command")
        argv = container_argv([entry] if isinstance(entry, str) else entry,
                              shlex.split(cmd) if isinstance(cmd, str) else cmd)
        grace = service.get("stop_grace_period")
        replicas = (service.get("deploy") or {}).get("replicas", 1)
        out.append(Process("compose", name, tuple(argv), _compose_env(service),
                           compose_checks(service),
                           COMPOSE_STOP_GRACE_S if grace is None else _duration_s(grace),
                           replicas=replicas))
    return out


def compose_service(name: str) -> dict[str, Any]:
    service = compose()["services"][name]
    assert isinstance(service, dict)
    return service


def kubernetes_files() -> list[Path]:
    """The manifests (not the kustomization, which no Kubernetes schema describes)."""
    return sorted(p for p in KUBERNETES.glob("*.yaml") if p != KUSTOMIZATION)


def kubernetes_resources() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in kubernetes_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                yield path, doc


def _kubernetes_env(container: dict[str, Any], maps: dict[tuple[str, str], dict[str, str]]
                    ) -> dict[str, str]:
    """envFrom first, then env (which wins), references resolved from the manifests."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        kind, ref = next((k, v) for k, v in source.items() if k.endswith("Ref"))
        values = maps[("ConfigMap" if kind == "configMapRef" else "Secret", ref["name"])]
        env.update({source.get("prefix", "") + k: v for k, v in values.items()})
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        ref_kind, ref = next(iter(item["valueFrom"].items()))
        kind = {"configMapKeyRef": "ConfigMap", "secretKeyRef": "Secret"}[ref_kind]
        env[item["name"]] = maps[(kind, ref["name"])][ref["key"]]
    return env


def _kubernetes_checks(container: dict[str, Any]) -> tuple[Check, ...]:
    named = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
    checks: list[Check] = []
    for kind in ("startup", "readiness", "liveness"):
        probe = container.get(f"{kind}Probe")
        if probe is None:
            continue
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = get["port"]
            headers = tuple((h["name"], h["value"]) for h in get.get("httpHeaders", []))
            checks.append(HttpCheck(kind, named[port] if isinstance(port, str) else int(port),
                                    get.get("path", "/"), headers))
        else:
            assert "exec" in probe, f"{kind} probe {probe!r}: only httpGet and exec are run"
            checks.append(ExecCheck(kind, tuple(probe["exec"]["command"])))
    return tuple(checks)


def kubernetes_processes() -> list[Process]:
    resources = [doc for _, doc in kubernetes_resources()]
    maps: dict[tuple[str, str], dict[str, str]] = {}
    for doc in resources:
        if doc["kind"] in ("ConfigMap", "Secret"):
            data = dict(doc.get("stringData") or doc.get("data") or {})
            maps[(doc["kind"], doc["metadata"]["name"])] = {k: str(v) for k, v in data.items()}
    out = []
    for doc in resources:
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        grace = float(pod.get("terminationGracePeriodSeconds", KUBERNETES_STOP_GRACE_S))
        for c in pod["containers"]:
            if not is_rsched(c["image"]):
                continue
            out.append(Process(
                "kubernetes", f"{doc['metadata']['name']}/{c['name']}",
                tuple(container_argv(c.get("command"), c.get("args"))),
                _kubernetes_env(c, maps), _kubernetes_checks(c), grace,
                tuple(p["containerPort"] for p in c.get("ports", [])),
                doc["spec"].get("replicas", 1)))
    return out


def recipe_processes(recipe: str) -> list[Process]:
    return compose_processes() if recipe == "compose" else kubernetes_processes()


# --- the commands the recipes tell an operator to run -----------------------------------------

# `docker compose ... exec SERVICE rsched ...` and `kubectl exec deploy/NAME -- rsched ...` in a
# comment of a recipe.
_COMPOSE_EXEC = re.compile(r"^#\s+docker compose .*?\bexec (?P<where>[\w-]+) (?P<cmd>rsched .*)$")
_KUBECTL_EXEC = re.compile(r"^#\s+kubectl .*?\bexec (?:deploy(?:ment)?/)?(?P<where>[\w-]+) "
                           r"(?:-c [\w-]+ )?-- (?P<cmd>rsched .*)$")


@dataclass(frozen=True)
class OperatorCommand:
    recipe: str
    where: str  # the service or Deployment whose container runs it
    argv: tuple[str, ...]


def operator_commands(recipe: str) -> list[OperatorCommand]:
    """The rsched commands a recipe's comments tell the operator to run in a container."""
    paths, pattern = ((([COMPOSE]), _COMPOSE_EXEC) if recipe == "compose"
                      else (sorted(KUBERNETES.glob("*.yaml")), _KUBECTL_EXEC))
    return [OperatorCommand(recipe, m["where"], tuple(shlex.split(m["cmd"])))
            for path in paths for line in path.read_text().splitlines()
            if (m := pattern.match(line.strip()))]
