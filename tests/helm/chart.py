"""Rendering the kvdoctor chart with the real helm binary, and reading what it rendered.

Used by the tests in tests/helm/ (through the fixtures of tests/helm/conftest.py).
"""

from __future__ import annotations

import copy
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.support.processes import Completed, Process, run
from tests.support.tools import ROOT

CHART_DIR = ROOT / "helm" / "kvdoctor"
RULES_ALERTS = ROOT / "rules" / "alerts.yaml"
SCENARIOS = sorted(p.name.removesuffix("-values.yaml") for p in (CHART_DIR / "ci").glob("*-values.yaml"))
RELEASE = "kvt"
NAMESPACE = "kvdoctor-test"
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "AlertmanagerConfig"}
KVDOCTOR_SCRIPT = Path(sys.executable).with_name("kvdoctor")


@dataclass(frozen=True)
class ChartUnderTest:
    """The chart directory the tests render, and the rules file its files/alerts.yaml resolves to."""

    path: Path
    alerts_file: Path


def chart_under_test() -> ChartUnderTest:
    """The repository's chart, with the real rules/alerts.yaml behind its files/alerts.yaml symlink;
    fails the tests when that file is missing (the chart cannot render its PrometheusRule without it)."""
    if not RULES_ALERTS.is_file():
        pytest.fail(
            f"{RULES_ALERTS.relative_to(ROOT)} is missing: generate it with "
            f"`kvdoctor rules export -o {RULES_ALERTS.relative_to(ROOT)}`",
            pytrace=False,
        )
    return ChartUnderTest(CHART_DIR, RULES_ALERTS)


class HelmError(AssertionError):
    """helm exited non-zero; the message carries its stderr."""

    def __init__(self, args: list[str], result: Completed):
        self.stderr = result.stderr
        self.returncode = result.rc
        super().__init__(f"helm {' '.join(args)} exited {result.rc}:\n{result.stderr}")


@dataclass
class Helm:
    binary: str
    chart: ChartUnderTest
    _cache: dict = field(default_factory=dict)

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> Completed:
        result = run([self.binary, *args], timeout=timeout)
        if check and result.rc != 0:
            raise HelmError(list(args), result)
        return result

    def values_file(self, scenario: str = "default") -> str:
        """The chart's ci/ values file of ``scenario``."""
        return str(self.chart.path / "ci" / f"{scenario}-values.yaml")

    def template_args(self, scenario: str | None = None, values: Iterable[str] = ()) -> list[str]:
        args = ["template", RELEASE, str(self.chart.path), "--namespace", NAMESPACE]
        if scenario:
            args += ["-f", self.values_file(scenario)]
        return args + list(values)

    def render(self, scenario: str | None = "default", *values: str) -> Rendered:
        """The objects ``helm template`` renders (cached per arguments; callers get a deep copy)."""
        key = (scenario, values)
        if key not in self._cache:
            out = self.run(*self.template_args(scenario, values)).stdout
            self._cache[key] = [doc for doc in yaml.safe_load_all(out) if doc]
        return Rendered(copy.deepcopy(self._cache[key]))

    def render_error(self, *values: str, scenario: str | None = None) -> str:
        """helm template's error output for values it must refuse (fails the test if it renders)."""
        result = self.run(*self.template_args(scenario, values), check=False)
        assert result.rc != 0, f"helm rendered values it should refuse: {values}"
        return result.stderr


class Rendered(list):
    """The objects of one rendering."""

    def kinds(self) -> list[str]:
        return sorted(doc["kind"] for doc in self)

    def all(self, kind: str) -> list[dict]:
        return [doc for doc in self if doc["kind"] == kind]

    def one(self, kind: str, component: str | None = None) -> dict:
        found = [
            doc
            for doc in self.all(kind)
            if component is None or doc["metadata"]["labels"].get("app.kubernetes.io/component") == component
        ]
        assert len(found) == 1, f"expected one {kind} {component or ''}, got {len(found)}"
        return found[0]

    def pod_specs(self) -> list[tuple[str, dict]]:
        """(object name, pod spec) of every workload."""
        out = []
        for doc in self:
            spec = doc.get("spec") or {}
            if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
                out.append((f"{doc['kind']}/{doc['metadata']['name']}", spec["template"]["spec"]))
            elif doc["kind"] == "Pod":
                out.append((f"Pod/{doc['metadata']['name']}", spec))
        return out

    def container(self, name: str) -> tuple[dict, dict]:
        """(pod spec, container) of the one container called ``name``."""
        found = [(pod, c) for _, pod in self.pod_specs() for c in pod["containers"] if c["name"] == name]
        assert len(found) == 1, f"expected one container {name!r}, got {len(found)}"
        return found[0]


def arg_value(args: list[str], flag: str) -> str | None:
    """The value of ``--flag=value`` (or ``--flag value``) in an argument list."""
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def replaced(args: list[str], **values: object) -> list[str]:
    """``args`` with a new value for each ``--flag=value`` named (``engine_url`` is ``--engine-url``):
    the rendered arguments, but for those that are about this machine (a free port, a local URL)."""
    out = list(args)
    for name, value in values.items():
        flag = "--" + name.replace("_", "-") + "="
        found = [i for i, arg in enumerate(out) if arg.startswith(flag)]
        assert len(found) == 1, f"expected one {flag}... in {args}"
        out[found[0]] = f"{flag}{value}"
    return out


def rendered_command(argv: list[str], env: dict[str, str], workdir: Path) -> Process:
    """A rendered container's ``command + args`` as the image runs them (its ENTRYPOINT is the
    kvdoctor console script, installed in .venv here), with the container's ``env`` and no other
    KVDOCTOR_* variable; not started yet."""
    assert argv[0] == "kvdoctor", argv
    if not KVDOCTOR_SCRIPT.exists():
        pytest.skip(f"needs the kvdoctor console script at {KVDOCTOR_SCRIPT} (pip install -e .)")
    return Process([KVDOCTOR_SCRIPT, *argv[1:]], env=env, clean_env=True, cwd=workdir, log=workdir / f"{argv[1]}.log")


def prometheus_seconds(duration: str) -> float:
    """A Prometheus duration (``15s``, ``1m30s``, ``500ms``) in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a Prometheus duration: {duration!r}"
    return sum(int(n) * units[u] for n, u in parts)


def expected_rule_groups(alerts_doc: dict, rule_values: dict, site: str = "") -> list[dict]:
    """rules/alerts.yaml's groups with the chart's documented changes applied (written here
    independently of the template): per-alert enabled/for/severity/labels, ruleLabels on every
    alert, groups left empty dropped; with the dashboard's external address ``site``, a runbook_url
    under <site>/runbooks and a ``dashboard`` link on every alert."""
    overrides = rule_values.get("alerts") or {}
    rule_labels = rule_values.get("ruleLabels") or {}
    groups = []
    for group in alerts_doc["groups"]:
        rules = []
        for rule in group["rules"]:
            if "alert" not in rule:
                rules.append(rule)
                continue
            change = overrides.get(rule["alert"], {})
            if change.get("enabled") is False:
                continue
            rule = copy.deepcopy(rule)
            if change.get("for"):
                rule["for"] = change["for"]
            labels = {**rule.get("labels", {}), **rule_labels, **change.get("labels", {})}
            if change.get("severity"):
                labels["severity"] = change["severity"]
            if labels:
                rule["labels"] = labels
            if site:
                rule["annotations"]["runbook_url"] = f"{site}/runbooks/{rule['alert']}.md"
                rule["annotations"]["dashboard"] = site + "/?pod={{ or $labels.pod $labels.instance }}"
            rules.append(rule)
        if rules:
            groups.append({**group, "rules": rules})
    return groups


# ------------------------------------------------------------ Pod Security Standard "restricted"

ALLOWED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(pod: dict) -> list[str]:
    """What in a pod spec breaks the Pod Security Standard "restricted" (Kubernetes 1.30), plus the
    chart's own rules for every container: read-only root filesystem, CPU and memory requests and
    limits. An empty list when none."""
    problems: list[str] = []
    psc = pod.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(f"pod: {key} is set")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUME_TYPES:
            problems.append(f"volume {volume['name']}: type {sorted(kinds - ALLOWED_VOLUME_TYPES)} not allowed")
    if psc.get("runAsUser") == 0:
        problems.append("pod: runAsUser 0")
    for sysctl in psc.get("sysctls") or []:
        problems.append(f"pod: sysctl {sysctl.get('name')}")
    containers = [*(pod.get("initContainers") or []), *pod["containers"], *(pod.get("ephemeralContainers") or [])]
    for c in containers:
        where = f"container {c['name']}"
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            problems.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"{where}: capabilities do not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: adds capabilities {caps['add']}")
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            problems.append(f"{where}: runAsNonRoot is not true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            problems.append(f"{where}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccompProfile is {seccomp!r}, not RuntimeDefault/Localhost")
        if sc.get("procMount") not in (None, "Default"):
            problems.append(f"{where}: procMount {sc['procMount']}")
        if (sc.get("seLinuxOptions") or {}).get("type") not in (
            None,
            "",
            "container_t",
            "container_init_t",
            "container_kvm_t",
        ):
            problems.append(f"{where}: seLinuxOptions.type")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{where}: hostPort {port['hostPort']}")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: readOnlyRootFilesystem is not true")
        resources = c.get("resources") or {}
        for part in ("requests", "limits"):
            for res in ("cpu", "memory"):
                if res not in (resources.get(part) or {}):
                    problems.append(f"{where}: no {res} {part[:-1]}")
    return problems
