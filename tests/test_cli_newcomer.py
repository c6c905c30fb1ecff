"""A newcomer's first ten minutes (#25), each case of the issue's "Why" as a user meets it: the
``kvdoctor`` console script run as a process, its exit status, stdout and stderr.

- the README's first command, bounded (``kvdoctor demo --check``), comes up or names what did not;
- input errors are exit 2 with one line naming the flag and its range, found before any work;
- ``--json`` keeps stdout one JSON object on failure too; listings honour it;
- names as users type them: Hugging Face ids and their variants, GPU short names, --context;
- one runbook-URL builder for both exports, grafana export --check, the verb in every error,
  the unknown flag named, https against plain HTTP told within a second, a fast --version.
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support import servers
from tests.support.certificates import make_pki

ROOT = Path(__file__).resolve().parents[1]
KVDOCTOR = str(Path(sys.executable).parent / "kvdoctor")
TRACE = ROOT / "tests/fixtures/traces/simulator-kv-thrashing.om"
CLOSED = servers.refusing_url()


class Ran:
    def __init__(self, proc: subprocess.CompletedProcess[str], seconds: float):
        self.rc, self.out, self.err, self.seconds = proc.returncode, proc.stdout, proc.stderr, seconds

    @property
    def line(self) -> str:
        """The one line on stderr (the test fails unless there is exactly one)."""
        lines = self.err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in self.err, self.err
        return lines[0]


def kvdoctor(*args: object, timeout: float = 60, env: dict[str, str] | None = None) -> Ran:
    """``kvdoctor ARGS`` as a user runs it: the console script, in its own process."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KVDOCTOR_")} | (env or {})
    started = time.monotonic()
    proc = subprocess.run(
        [KVDOCTOR, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=environ, cwd=ROOT
    )
    return Ran(proc, time.monotonic() - started)


# ------------------------------------------------------------------ 1. the README's first command


@pytest.mark.slow
def test_demo_check_comes_up_and_says_how_long_each_part_took():
    ran = kvdoctor("demo", "--check", timeout=180)
    assert ran.rc == 0, ran.err + ran.out
    for what in ("the exporter's verdict", "the Live page", "the Ledger page", "the Fleet page"):
        assert re.search(rf"^kvdoctor demo --check: {what} after \d+\.\d s", ran.out, re.M), what
    assert re.search(r"verdict after [\d.]+ s: healthy \(confidence", ran.out)
    assert ran.out.rstrip().splitlines()[-1].startswith("kvdoctor demo --check: everything came up in ")


@pytest.mark.slow
def test_demo_check_names_what_did_not_come_up_and_exits_1():
    ran = kvdoctor("demo", "--check", "--check-timeout", "0.001", timeout=180)
    assert ran.rc == 1, ran.err + ran.out
    assert ran.line.startswith("kvdoctor demo: error: did not come up within 0.001 s: the exporter's verdict")


# ------------------------------------------------------------------ 3, 4. input errors, found first


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["diagnose", "--exporter", CLOSED, "--timeout", "1e308"],
            "kvdoctor diagnose: error: --timeout: must be more than 0 up to 3,600 seconds, got '1e308'",
        ),
        (
            ["record", "--exporter", CLOSED, "--seconds", "1e12", "-o", "{tmp}/t.om"],
            "kvdoctor record: error: --seconds: must be more than 0 up to 604,800 seconds (a week), got '1e12'",
        ),
        (
            ["diagnose", "--exporter", CLOSED, "--window", "100000"],
            "kvdoctor diagnose: error: --window: must be more than 0 up to 86,400 seconds, got '100000'",
        ),
        (["diagnose", "--exporter", CLOSED, "--at", "0"], "kvdoctor diagnose: error: --at must be a time from 2000"),
        (["diagnose", "--replay", TRACE, "--at", "4102444800"], "kvdoctor diagnose: error: --at must be a time"),
        (["diagnose", "--exporter", CLOSED, "--limit", "-1"], "kvdoctor diagnose: error: --limit: must be"),
        (["stress", "--engine-url", CLOSED, "-o", "/proc/kvdoctor-x"], "kvdoctor stress: error: -o /proc/kvdoctor-x: "),
        (
            ["record", "--exporter", CLOSED, "--seconds", "5", "-o", "/proc/x.om"],
            "kvdoctor record: error: -o /proc/x.om",
        ),
        (["diagnose", "--exporter", "ftp://host:21"], "kvdoctor diagnose: error: --exporter: "),
    ],
    ids=["timeout-overflow", "seconds-overflow", "window", "at-0", "at-future", "limit", "stress-o", "record-o", "url"],
)
def test_bad_input_is_exit_2_with_one_line_naming_the_flag_before_any_work(tmp_path, args, line):
    ran = kvdoctor(*(str(a).format(tmp=tmp_path) for a in args))
    assert ran.rc == 2, ran.err
    assert ran.line.startswith(line), ran.line
    assert "internal error" not in ran.err and ran.out == ""
    assert ran.seconds < 10  # refused up front: no load run, no source waited for


def test_an_exporter_that_keeps_less_than_asked_is_bad_input_not_an_outage():
    refused = servers.respond(b'{"detail": "seconds too large"}', status=422, content_type=servers.JSON)
    with servers.FakeServer({"/api/v1/window": refused}) as server:
        ran = kvdoctor("diagnose", "--exporter", server.url(), "--window", "1000")
    assert ran.rc == 2 and ran.line.startswith("kvdoctor diagnose: error: --window/--at: "), ran.err
    assert "refused a 1005 s window" in ran.line


def test_an_unreachable_source_stays_exit_3():
    ran = kvdoctor("diagnose", "--exporter", CLOSED, "--timeout", "2")
    assert ran.rc == 3 and "connection refused" in ran.line


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stress_stopped_by_a_signal_writes_its_report(demo, tmp_path, sig):
    d = demo("healthy", in_process=True)
    out = tmp_path / "report"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KVDOCTOR_")}
    # A run started from a shell prompt: a job a script starts in the background inherits SIGINT
    # ignored (and exec keeps it ignored), which the run must respect, so the test makes sure the
    # run it starts does not inherit that from however the test suite itself was started.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [KVDOCTOR, "stress", "--engine-url", d.engine_url, "--exporter", d.exporter_url, "--step-seconds", "60",
             "--prompt-tokens", "200", "--max-tokens", "50", "-o", str(out), "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ, start_new_session=True,
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        deadline = time.monotonic() + 90
        seen = ""
        while "concurrency" not in seen and time.monotonic() < deadline:  # the run's first line: the load started
            seen += proc.stderr.readline()
        time.sleep(3)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and (out / "report.html").is_file() and (out / "trace.om").is_file()
    assert json.loads(stdout) == summary
    assert "interrupted; writing the report of what ran" in seen + stderr


# ------------------------------------------------------------------ 5. --json keeps the pipe


@pytest.mark.parametrize(
    "args, rc",
    [
        (["diagnose", "--exporter", CLOSED, "--json", "--timeout", "2"], 3),
        (["diagnose", "--replay", "/nonexistent/trace.om", "--json"], 2),
        (["diagnose", "--exproter", CLOSED, "--json"], 2),
        (["record", "--exporter", CLOSED, "--seconds", "1", "-o", "{tmp}/r.om", "--json"], 3),
        (["stress", "--engine-url", CLOSED, "-o", "{tmp}/s", "--json", "--timeout", "2"], 3),
        (["stress", "--engine-url", CLOSED, "-o", "/proc/x", "--json"], 2),
        (["ledger", "--model", "GPT-5", "--gpu", "L4", "--json"], 2),
        (["ledger", "--model", "Llama-3.1-8B", "--gpu", "H100", "--json"], 2),
        (["version", "--json", "--bogus"], 2),
    ],
    ids=[
        "diagnose-3",
        "diagnose-2",
        "diagnose-typo",
        "record",
        "stress-3",
        "stress-2",
        "ledger",
        "ledger-gpu",
        "version",
    ],
)
def test_json_prints_one_object_on_failure_too(tmp_path, args, rc):
    ran = kvdoctor(*(a.format(tmp=tmp_path) for a in args))
    assert ran.rc == rc, ran.err
    doc = json.loads(ran.out)  # `| jq` works
    assert set(doc) == {"error", "exit_code"} and doc["exit_code"] == rc
    assert doc["error"] in ran.line  # the same words on stderr, for a human


def test_the_gpu_listing_honours_json_and_shows_the_short_names():
    text = kvdoctor("ledger", "--list-gpus")
    assert text.rc == 0 and re.search(r"^NVIDIA H100 PCIe\s+H100 PCIe\s+80 GiB", text.out, re.M), text.out
    doc = json.loads(kvdoctor("ledger", "--list-gpus", "--json").out)
    rows = {g["name"]: g["short_name"] for g in doc["gpus"]}
    assert rows["NVIDIA H100 80GB HBM3"] == "H100 SXM" and rows["NVIDIA L40S"] == "L40S"
    assert rows["NVIDIA A100-PCIE-40GB"] == "A100 PCIe 40GB"


# ------------------------------------------------------------------ 6. names as users type them


def ledger(*args: object) -> Ran:
    return kvdoctor("ledger", *args)


@pytest.mark.parametrize(
    "model, builtin",
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
        ("meta-llama/Llama-2-7b-chat-hf", "Llama-2-7B"),
        ("mistralai/Mistral-7B-Instruct-v0.2", "Mistral-7B"),
        ("google/gemma-2-9b-it", "gemma-2-9b"),
    ],
)
def test_a_variant_of_a_builtin_model_takes_its_shape_and_says_so(tmp_path, model, builtin):
    env = {"HF_HUB_CACHE": str(tmp_path)}  # an empty cache: nothing found there
    ran = kvdoctor("ledger", "--model", model, "--gpu", "L40S", "--context", 4096, "--json", env=env)
    assert ran.rc == 0, ran.err
    assert json.loads(ran.out)["model"]["name"] == model
    text = kvdoctor("ledger", "--model", model, "--gpu", "L40S", "--context", 4096, env=env)
    assert f"variant of {builtin}: the built-in {builtin} shape" in text.line


def test_a_builtin_name_under_another_organisation_is_refused(tmp_path):
    ran = kvdoctor("ledger", "--model", "foo/Llama-3.1-8B", "--gpu", "L40S", env={"HF_HUB_CACHE": str(tmp_path)})
    assert ran.rc == 2 and "the built-in Llama-3.1-8B shape is meta-llama's" in ran.line and "not foo's" in ran.line


@pytest.mark.parametrize(
    "name, nvml",
    [
        ("H100 SXM", "NVIDIA H100 80GB HBM3"),
        ("H100 PCIe", "NVIDIA H100 PCIe"),
        ("h100-pcie", "NVIDIA H100 PCIe"),
        ("A100 SXM 40GB", "NVIDIA A100-SXM4-40GB"),
        ("L40S", "NVIDIA L40S"),
        ("L40", "NVIDIA L40"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
    ],
)
def test_gpu_short_names_resolve_to_the_nvml_name(name, nvml):
    ran = ledger("--model", "Llama-3.1-8B", "--gpu", name, "--json")
    assert ran.rc == 0, ran.err
    assert json.loads(ran.out)["gpu"]["name"] == nvml


@pytest.mark.parametrize(
    "name, candidates",
    [
        ("H100", ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL"]),
        ("A100", ["NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"]),
        ("A100 40GB", ["NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"]),
    ],
)
def test_an_ambiguous_gpu_name_lists_the_candidates(name, candidates):
    ran = ledger("--model", "Llama-3.1-8B", "--gpu", name)
    assert ran.rc == 2 and ran.line.startswith(
        f"kvdoctor ledger: error: --gpu {name!r} could be {len(candidates)} GPUs"
    )
    assert re.findall(r"\(([^()]+)\)", ran.line.split("could be", 1)[1])[: len(candidates)] == candidates


def test_a_context_beyond_the_model_is_refused_first_as_vllm_does():
    ran = ledger("--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100 SXM", "--context", 1_000_000, "--tp", 1)
    assert ran.rc == 2, ran.err
    assert "--context 1,000,000 is longer than" in ran.line and "max_position_embeddings=131,072" in ran.line
    assert "User-specified max_model_len (1000000) is greater than the derived max_model_len" in ran.line
    assert ledger("--model", "Llama-3.1-8B", "--gpu", "H100 SXM", "--context", 131_072, "--tp", 2).rc in (0, 1)


def test_a_rope_scaled_model_takes_its_scaled_length(tmp_path):
    config = {
        "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
    }  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    common = ("--model", path, "--gpu", "L4", "--batch", 1)
    assert ledger(*common, "--context", 16384).rc == 0
    ran = ledger(*common, "--context", 16385)
    assert ran.rc == 2 and "x yarn factor 4" in ran.line


def test_block_sizes_vllm_refuses_are_refused():
    ran = ledger("--model", "Llama-3.1-8B", "--gpu", "L40S", "--block-size", 7)
    assert ran.rc == 2
    assert ran.line.endswith("--block-size: must be 1, 8, 16, 32, 64 or 128 (the block sizes vLLM accepts), got '7'")


def test_large_figures_keep_the_tables_aligned():
    ran = ledger("--model", "Llama-3.1-8B", "--gpu", "H100 SXM", "--batch", 1_000_000_000)
    assert ran.rc == 0, ran.err
    lines = ran.out.splitlines()
    figures = [line for line in lines if re.match(r"^  \S.*\S {2,}\S", line) and " x " in line]
    starts = {len(line) - len(line[44:].lstrip()) for line in figures if len(line) > 44}
    assert len(starts) == 1, figures  # every figure's "how" starts in one column
    header = next(i for i, line in enumerate(lines) if line.startswith("what if"))
    rows = lines[header : header + 4]
    for column in ("live KV", "step floor", "tokens/s", "fits"):
        at = rows[0].index(column)
        assert all(row[at - 1] == " " and row[at] != " " for row in rows[1:]), (column, rows)


# ------------------------------------------------------------------ 7. links, grammar, speed


def test_both_exports_build_the_same_runbook_links():
    base = "https://wiki.example.com/runbooks"
    rules = yaml.safe_load(kvdoctor("rules", "export", "--runbook-base-url", base).out)
    urls = {r["annotations"]["runbook_url"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert "https://wiki.example.com/runbooks/KVCacheThrashing.md" in urls
    grafana = kvdoctor("grafana", "export", "--runbook-base-url", base)
    assert grafana.rc == 0 and "https://wiki.example.com/runbooks/${__value.raw}.md" in grafana.out
    assert "runbooks${__value.raw}" not in grafana.out


@pytest.mark.parametrize("verb", ["rules", "grafana"])
@pytest.mark.parametrize("bad", ["not a url", "ftp://wiki.example.com/runbooks", "https://", "https://h/x?y=1"])
def test_both_exports_refuse_the_same_bad_runbook_base(verb, bad):
    ran = kvdoctor(verb, "export", "--runbook-base-url", bad)
    assert ran.rc == 2 and ran.out == "" and f"kvdoctor {verb}: error: --runbook-base-url must be" in ran.line


def test_grafana_export_check_says_whether_the_file_is_current(tmp_path):
    current = kvdoctor("grafana", "export", "--check", "-o", ROOT / "grafana/kvdoctor-dashboard.json")
    assert current.rc == 0, current.err
    stale = tmp_path / "dashboard.json"
    stale.write_text("{}")
    ran = kvdoctor("grafana", "export", "--check", "-o", stale)
    assert ran.rc == 1 and "out of date; regenerate it with: kvdoctor grafana export -o" in ran.line
    assert stale.read_text() == "{}"  # --check never writes


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["diagnose", "--exproter", "http://x"],
            "kvdoctor diagnose: unknown flag --exproter; did you mean --exporter?",
        ),
        (["ledger", "--list-gpu"], "kvdoctor ledger: unknown flag --list-gpu; did you mean --list-gpus?"),
        (["rules", "export", "--scrape-intervall", "1m"], "kvdoctor rules export: unknown flag --scrape-intervall; "),
        (["diagnos"], "kvdoctor: error: unknown command 'diagnos'; did you mean 'diagnose'?"),
        (["diagnose"], "kvdoctor diagnose: error: one of the arguments --exporter --prometheus --replay is required"),
    ],
)
def test_argument_errors_name_the_verb_and_the_flag(args, line):
    ran = kvdoctor(*args)
    assert ran.rc == 2 and ran.line.startswith(line), ran.line


@pytest.fixture(scope="module")
def tls_context(tmp_path_factory):
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki.server_cert), str(pki.server_key))
    return context


def test_https_against_plain_http_is_told_within_a_second():
    with servers.FakeServer() as plain:  # answers HTTP, never TLS
        url = plain.url().replace("http://", "https://")
        ran = kvdoctor("diagnose", "--exporter", url, "--timeout", "30")
    assert ran.rc == 2 and "speaks plain HTTP, not HTTPS; give http://" in ran.line, ran.err
    assert ran.seconds < 5  # Python's start included; the probe itself is bounded at one second


def test_plain_http_against_https_is_told_too(tls_context):
    with servers.FakeServer(tls=tls_context) as secure:
        url = secure.url().replace("https://", "http://")
        ran = kvdoctor("diagnose", "--exporter", url, "--timeout", "30")
    assert ran.rc == 2 and "speaks HTTPS (TLS), not plain HTTP; give https://" in ran.line, ran.err
    assert ran.seconds < 5


def test_version_flag_imports_no_verb():
    probe = (
        "import sys\nfrom kvdoctor.cli import main\nmain(['--version'])\n"
        "print(sorted(m for m in sys.modules if m.startswith(('fastapi', 'dash', 'uvicorn', 'kvdoctor.commands.'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    line, loaded = out.strip().splitlines()
    assert line.startswith("kvdoctor ") and loaded == "['kvdoctor.commands.version']", loaded
    flag, verb = kvdoctor("--version"), kvdoctor("version")
    assert flag.out == verb.out and flag.rc == verb.rc == 0


VERB_LINES = ["demo", "exporter", "dashboard", "diagnose", "record", "ledger", "rules export", "grafana export",
              "stress", "version"]  # fmt: skip


@pytest.mark.parametrize("verb", VERB_LINES)
def test_every_verb_help_has_its_own_exit_status_section(verb):
    from kvdoctor.errors import EXIT_STATUS_HELP

    text = kvdoctor(*verb.split(), "--help").out
    section = re.search(r"^exit status: (.+?)(?:\n\n|\Z)", text, re.M | re.S)
    assert section, text
    assert " ".join(section.group(0).split()) != EXIT_STATUS_HELP  # its own meanings, not the generic line
    assert re.search(r"\b0 ", section.group(1)) and re.search(r"\b2 ", section.group(1))
