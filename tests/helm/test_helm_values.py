"""values.yaml is the documentation: a comment above every key, a schema that describes and
closes every object, and the scenario files valid against it. No helm needed."""

from __future__ import annotations

import copy
import json
import re
import tomllib

import jsonschema
import pytest
import yaml

from tests.helm.chart import CHART_DIR, ROOT, SCENARIOS

VALUES_TEXT = (CHART_DIR / "values.yaml").read_text()
VALUES = yaml.safe_load(VALUES_TEXT)
SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())


def deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def resolve(node: dict) -> dict:
    while "$ref" in node:
        node = SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return node


def walk_schema(node: dict, path: str = ""):
    """Yields (path, schema node) for every node reachable through properties/items/definitions."""
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from walk_schema(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk_schema(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk_schema(node["additionalProperties"], f"{path}.*")


def test_values_yaml_names_its_schema_on_the_first_line():
    assert VALUES_TEXT.splitlines()[0] == "# yaml-language-server: $schema=values.schema.json"


def test_schema_is_draft_07_and_itself_valid():
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(SCHEMA)


def test_every_schema_object_is_closed_and_every_property_described():
    nodes = list(walk_schema(SCHEMA)) + [
        (f"#{n}", d) for name, d in SCHEMA["definitions"].items() for n, d in walk_schema(d, name)
    ]
    for path, node in nodes:
        if "properties" in node:
            assert node.get("additionalProperties") is False, f"{path}: additionalProperties is not false"
        for name, child in (node.get("properties") or {}).items():
            assert child.get("description") or resolve(child).get("description"), f"{path}.{name}: no description"


def test_values_yaml_is_valid_against_the_schema():
    jsonschema.Draft7Validator(SCHEMA).validate(VALUES)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_is_valid_against_the_schema(scenario):
    override = yaml.safe_load((CHART_DIR / "ci" / f"{scenario}-values.yaml").read_text()) or {}
    jsonschema.Draft7Validator(SCHEMA).validate(deep_merge(VALUES, override))


def chart_keys(schema_node: dict, values: dict, path: str = ""):
    """(dotted path, schema node) of every key the chart defines (not inside free-form Kubernetes
    objects or maps) that values.yaml sets."""
    node = resolve(schema_node)
    for key, value in values.items():
        child = (node.get("properties") or {}).get(key)
        if child is None:
            continue
        yield f"{path}{key}", child
        resolved = resolve(child)
        if isinstance(value, dict) and "properties" in resolved:
            yield from chart_keys(resolved, value, f"{path}{key}.")
        if isinstance(value, list) and "properties" in resolve(resolved.get("items") or {}):
            for item in value:
                yield from chart_keys(resolve(resolved["items"]), item, f"{path}{key}[].")


def commented_keys(text: str) -> set[str]:
    """Dotted paths (``[]`` for list items) of the keys in ``text`` with a comment on the line
    above (or a ``- # comment`` list-item line above)."""
    lines = text.splitlines()
    found: set[str] = set()
    stack: list[tuple[int, str]] = []  # (column, path) of the open keys and list items

    def parent_of(column: int) -> str:
        while stack and stack[-1][0] >= column:
            stack.pop()
        return stack[-1][1] if stack else ""

    for number, line in enumerate(lines):
        item = re.match(r"^(\s*)- ", line)
        if item:
            dash = len(item.group(1))
            stack.append((dash, parent_of(dash) + "[]"))
        match = re.match(r"^(\s*(?:- )?)([A-Za-z0-9_.\-/]+):(\s|$)", line)
        if not match or line.lstrip().startswith("#"):
            continue
        column = len(match.group(1))
        parent = parent_of(column)
        path = f"{parent}.{match.group(2)}" if parent else match.group(2)
        stack.append((column, path))
        above = lines[number - 1].strip() if number else ""
        if above.startswith("#") or above.startswith("- #"):
            found.add(path)
    return found


def test_every_chart_defined_key_has_a_comment_above_it():
    documented = [path for path, _ in chart_keys(SCHEMA, VALUES)]
    assert len(documented) > 50
    missing = [path for path in documented if path not in commented_keys(VALUES_TEXT)]
    assert not missing, f"keys without a comment above them in values.yaml: {missing}"


def test_the_comment_check_sees_a_missing_comment():
    text = "# a\na:\n  # b\n  b: 1\n  c: 2\nlist:\n  - # item\n    d: 1\n    e: 2\n"
    assert commented_keys(text) == {"a", "a.b", "list[].d"}


def test_every_schema_property_has_a_default_in_values_yaml():
    def check(node, values, path):
        node = resolve(node)
        for key, child in (node.get("properties") or {}).items():
            if key == "global":
                continue
            if resolve(child).get("type") == "object" and "properties" in resolve(child) and key in values:
                check(child, values[key], f"{path}{key}.")
            elif path.startswith("monitoring.prometheusRule.alerts."):
                continue  # per-alert overrides are optional by nature
            else:
                assert key in values, f"{path}{key}: in the schema but not in values.yaml"

    check(SCHEMA, VALUES, "")


def test_schema_knows_exactly_the_alerts_of_the_rules_file(chart):
    alerts = yaml.safe_load(chart.alerts_file.read_text())
    names = {r["alert"] for g in alerts["groups"] for r in g["rules"] if "alert" in r}
    schema_names = set(
        SCHEMA["properties"]["monitoring"]["properties"]["prometheusRule"]["properties"]["alerts"]["properties"]
    )
    assert schema_names == names


def test_chart_app_version_is_the_kvdoctor_version():
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", chart["version"])
    assert chart["apiVersion"] == "v2" and chart["name"] == CHART_DIR.name


@pytest.mark.parametrize(
    "bad, path",
    [
        ({"sidecar": {"port": -1}}, ["sidecar", "port"]),
        ({"sidecar": {"interval": "5s"}}, ["sidecar", "interval"]),
        ({"unknown": 1}, []),
        ({"monitoring": {"serviceMonitor": {"lables": {}}}}, ["monitoring", "serviceMonitor"]),
    ],
)
def test_schema_rejects_bad_values_here_too(bad, path):
    errors = list(jsonschema.Draft7Validator(SCHEMA).iter_errors(deep_merge(VALUES, bad)))
    assert [list(e.absolute_path) for e in errors] == [path]


def test_largest_allowed_interval_gives_every_rule_window_two_samples(chart):
    """rate()/increase() need two samples in their range: the shortest range in the alert rules
    bounds the scrape interval (= the exporter's interval, one value)."""
    text = chart.alerts_file.read_text()
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    ranges = [int(n) * units[u] for n, u in re.findall(r"\[(\d+)(ms|s|m|h)\]", text)]
    assert ranges, "no range selectors in the rules?"
    maximum = SCHEMA["properties"]["sidecar"]["properties"]["interval"]["maximum"]
    assert 2 * maximum <= min(ranges), f"sidecar.interval may be {maximum} s but a rule ranges over {min(ranges)} s"
    assert VALUES["sidecar"]["interval"] <= maximum


def test_every_empty_default_has_an_example_under_it():
    lines = VALUES_TEXT.splitlines()
    missing = []
    for number, line in enumerate(lines):
        match = re.match(r'^(\s*)(?:- )?([A-Za-z0-9_.\-/]+): (""|\{\}|\[\])\s*$', line)
        if not match:
            continue
        below = lines[number + 1] if number + 1 < len(lines) else ""
        if not (below.strip().startswith("#") and len(below) - len(below.lstrip()) > len(match.group(1))):
            missing.append(f"line {number + 1}: {line.strip()}")
    assert not missing, f"empty defaults without an example under them: {missing}"


# ------------------------------------------------------------- the sidecar's flags are the exporter's

SIDECAR_TPL = (CHART_DIR / "templates" / "_sidecar.tpl").read_text()
SIDECAR_VALUES_TEXT = re.search(r"^sidecar:\n(?:(?:[ #].*)?\n)*", VALUES_TEXT, re.M).group(0)
SCENARIO_SIDECARS = {
    name: (yaml.safe_load((CHART_DIR / "ci" / f"{name}-values.yaml").read_text()) or {}).get("sidecar") or {}
    for name in SCENARIOS
}


def exporter_parser():
    from kvdoctor.cli import build_parser

    return build_parser()._subparsers._group_actions[0].choices["exporter"]


def settings_for(argv: list[str]):
    """The exporter's settings for ``argv`` exactly as ``kvdoctor exporter`` builds them."""
    from kvdoctor.commands.exporter import settings_from_args

    return settings_from_args(exporter_parser().parse_args(argv))


def exporter_flags() -> set[str]:
    from kvdoctor.exporter.settings import options

    return {flag for option in options() for flag in option.flag_names()}


def exporter_variables() -> set[str]:
    from kvdoctor.exporter.collector_switches import COLLECTOR_ENV_PREFIX
    from kvdoctor.exporter.settings import collector_registry, options

    names = {env for option in options() if not option.is_collectors for env in option.env}
    return names | {COLLECTOR_ENV_PREFIX + name.upper() for name in collector_registry()}


def chart_flags() -> dict[str, str | None]:
    """Each flag the sidecar template passes -> the ``sidecar`` value it prints (None: computed)."""
    lines = SIDECAR_TPL.splitlines()
    found: dict[str, str | None] = {}
    for number, line in enumerate(lines):
        for flag in re.findall(r'"(--[a-z][a-z0-9.-]*)=%[sd]"', line):
            key = re.search(r"\$s\.(\w+)", line) or re.search(r"with \$s\.(\w+)", lines[number - 1])
            found[flag] = key.group(1) if key else None
    return found


def test_every_flag_the_chart_passes_is_an_exporter_flag():
    flags = chart_flags()
    assert len(flags) >= 7, flags
    assert set(flags) <= exporter_flags(), sorted(set(flags) - exporter_flags())


def test_every_flag_and_variable_the_sidecar_values_name_is_the_exporters():
    """values.yaml's sidecar section (its comments and examples) and the scenarios' extraArgs and
    extraEnv name flags and KVDOCTOR_* variables the exporter knows."""
    container = re.search(r'define "kvdoctor.sidecar.container".*?\n\{\{- end \}\}', SIDECAR_TPL, re.S).group(0)
    values = "\n".join(line for line in SIDECAR_VALUES_TEXT.splitlines() if "nvidia-smi" not in line)
    texts = [values, container] + [yaml.safe_dump(s) for s in SCENARIO_SIDECARS.values()]
    named_flags = {f for text in texts for f in re.findall(r"(?<![\w-])(--[a-z][a-z0-9.-]*[a-z0-9])", text)}
    named_vars = {v for text in texts for v in re.findall(r"\bKVDOCTOR_[A-Z0-9_]+", text)}
    assert named_flags and named_vars
    assert named_flags <= exporter_flags(), sorted(named_flags - exporter_flags())
    assert named_vars <= exporter_variables(), sorted(named_vars - exporter_variables())


def test_the_default_sidecar_values_are_settings_the_exporter_accepts():
    sidecar = VALUES["sidecar"]
    argv = []
    for flag, key in chart_flags().items():
        if key is None:
            continue  # computed by the template: the policies are checked below
        value = sidecar[key] if key != "engineUrl" else sidecar[key] or "http://127.0.0.1:8000/metrics"
        if value != "":
            argv.append(f"{flag}={value}")
    settings = settings_for(argv)
    assert (settings.host, settings.port, settings.interval) == (sidecar["host"], sidecar["port"], sidecar["interval"])
    assert (settings.engine, settings.log_level) == (sidecar["engine"], sidecar["logLevel"])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_scenarios_extra_args_are_settings_the_exporter_accepts(scenario):
    settings_for(list(SCENARIO_SIDECARS[scenario].get("extraArgs") or []))


def test_every_gpu_filter_the_template_writes_is_a_policy_the_exporter_accepts():
    define = re.search(r'define "kvdoctor.gpuFilter".*?\{\{- end \}\}\n\{\{- end \}\}', SIDECAR_TPL, re.S).group(0)
    list_file = re.search(r'define "kvdoctor.gpuListFile" -\}\}(\S+?)\{\{', SIDECAR_TPL).group(1)
    policies = [
        p.replace("%s", list_file if p.startswith("file:") else "GPU-0a1b")
        for p in re.findall(r'printf "([a-z-]+:%s)"', define)
    ]
    policies += re.findall(r'print "([a-z-]+)"', define) + re.findall(r'"(all|auto)"', define)
    assert {p.split(":")[0] for p in policies} == {"file", "engine-processes", "uuids", "all", "auto"}
    for policy in policies:
        assert settings_for([f"--gpu-filter={policy}"]).gpu_filter.startswith(policy.split(":")[0])


def test_the_schema_bounds_of_sidecar_values_are_within_the_exporters():
    from kvdoctor.exporter.settings import options

    choices = {o.flag: o.choices for o in options()}
    sidecar = SCHEMA["properties"]["sidecar"]["properties"]
    for flag, key in chart_flags().items():
        node = sidecar[key] if key else {}
        for bound in ("minimum", "maximum"):
            if bound in node:
                settings_for([f"{flag}={node[bound]}"])
        if "enum" in node:
            assert set(node["enum"]) == set(choices[flag]), flag
