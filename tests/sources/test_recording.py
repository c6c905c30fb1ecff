"""kvdoctor.sources.recording: overlapping windows merged once each, the fall-back to /metrics, and
checkpoints (the CLI around it is in tests/test_cli_diagnose.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import SourceError
from kvdoctor.signals.window import Window, labels_of
from kvdoctor.sources import recording
from kvdoctor.sources.exporter_api import ExporterClient
from kvdoctor.sources.recording import ExporterRecorder, RawRecording, SnapshotRecording
from kvdoctor.sources.traces import load_trace
from tests.support.servers import JSON, FakeServer, respond

T0 = 1_700_000_000.0
KEY = (S.KV_CACHE_USAGE, labels_of(engine="vllm"))


def window(start: float, n: int) -> Window:
    return Window(start + np.arange(n, dtype=float), {KEY: np.full(n, 0.5)})


def test_overlapping_windows_add_each_snapshot_once_from_the_first_windows_end(tmp_path):
    rec = SnapshotRecording(tmp_path / "t.om")
    assert rec.add_window(window(T0, 5)) == 1  # the recording starts at the exporter's newest snapshot
    assert rec.add_window(window(T0 + 2, 5)) == 2  # T0+4 is there already; T0+5, T0+6 are new
    assert rec.add_window(Window.empty()) == 0
    assert rec.timestamps() == [T0 + 4, T0 + 5, T0 + 6] and rec.newest() == T0 + 6
    assert rec.write() == 3
    assert list(load_trace(tmp_path / "t.om").window.timestamps) == rec.timestamps()


def test_checkpoints_rewrite_the_file_once_a_minute(tmp_path, monkeypatch):
    rec = RawRecording(tmp_path / "raw.om")
    rec.checkpoint()
    assert not rec.output.exists()  # nothing recorded: nothing written
    rec.add(T0, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n")
    rec.checkpoint()
    assert not rec.output.exists()  # not a minute yet
    monkeypatch.setattr(recording, "CHECKPOINT_SECONDS", 0.0)
    rec.checkpoint()
    assert "vllm:num_requests_running" in rec.output.read_text() and len(rec) == 1


@pytest.fixture
def exporter():
    with FakeServer() as fake:
        yield fake


def test_the_recorder_polls_the_window_api_with_the_seconds_it_is_behind(exporter, tmp_path):
    exporter.routes["/api/v1/window"] = respond(json.dumps(window(T0, 3).to_json()).encode(), content_type=JSON)
    with ExporterClient(exporter.url(), timeout=2) as client:
        recorder = ExporterRecorder(client, SnapshotRecording(tmp_path / "t.om"), interval=0.5)
        recorder.first_poll()
        recorder.poll()
    assert recorder.mode == "/api/v1/window" and len(recorder.recording) == 1
    first, second = exporter.paths
    assert first == "/api/v1/window?seconds=2"  # an interval behind, and two more
    assert int(second.split("=")[1]) >= 900  # T0 is long ago: as far back as an exporter keeps


def test_without_the_window_api_the_recorder_reads_metrics(exporter, tmp_path):
    exporter.routes["/metrics"] = respond(f'{S.KV_CACHE_USAGE}{{engine="vllm"}} 0.5\n'.encode())
    with ExporterClient(exporter.url(), timeout=2) as client:
        recorder = ExporterRecorder(client, SnapshotRecording(tmp_path / "t.om"), interval=0.5)
        recorder.first_poll()
        recorder.poll()
    assert recorder.mode == "/metrics" and not recorder.uses_window_api
    assert exporter.paths == ["/api/v1/window?seconds=2", "/metrics", "/metrics"]
    assert [s.samples for s in recorder.recording.snapshots.values()][-1] == {KEY: 0.5}


def test_a_window_api_that_disappears_is_a_source_error(exporter, tmp_path):
    exporter.routes["/api/v1/window"] = respond(json.dumps(window(T0, 3).to_json()).encode(), content_type=JSON)
    with ExporterClient(exporter.url(), timeout=2) as client:
        recorder = ExporterRecorder(client, SnapshotRecording(tmp_path / "t.om"), interval=0.5)
        recorder.first_poll()
        del exporter.routes["/api/v1/window"]
        with pytest.raises(SourceError, match="/api/v1/window disappeared"):
            recorder.poll()
