"""The one URL check (sources/urls.py) every flag, setting and client uses."""

from __future__ import annotations

import pytest

from kvdoctor.exporter.settings import normalise_url
from kvdoctor.sources.urls import UrlError, base_url, split_http_url
from kvdoctor.stress.load import api_root
from tests.support.errors import one_line_error


@pytest.mark.parametrize(
    "given, base",
    [
        ("http://127.0.0.1:9745", "http://127.0.0.1:9745"),
        ("http://exporter:9745/", "http://exporter:9745"),
        (" https://prom.example/prometheus/ ", "https://prom.example/prometheus"),
        ("http://[::1]:9090", "http://[::1]:9090"),
    ],
)
def test_a_base_keeps_its_prefix_without_the_trailing_slash(given, base):
    assert base_url(given) == base


@pytest.mark.parametrize(
    "bad, reason",
    [
        ("ftp://x", "needs an http(s) URL"),
        ("http://", "needs an http(s) URL"),
        ("file:///etc/passwd", "needs an http(s) URL"),
        ("http://a host/", "needs an http(s) URL"),
        ("http://h:99999", "has a bad port"),
        ("http://h/?next=http://evil", "must not carry a query"),
    ],
)
def test_a_bad_base_is_refused_with_one_line_saying_why(bad, reason):
    message = one_line_error(UrlError, base_url, bad)
    assert message.startswith(reason) and repr(bad) in message
    with pytest.raises(UrlError) as err:
        base_url(bad)
    assert err.value.about("--exporter") == f"--exporter {message}"


@pytest.mark.parametrize("given", ["h:8000", "127.0.0.1:9745", "localhost"])
def test_host_and_port_alone_are_refused_with_the_url_they_likely_meant(given):
    with pytest.raises(UrlError) as err:
        split_http_url(given)
    assert str(err.value).endswith(f"got {given!r} (did you mean 'http://{given}'?)")
    assert split_http_url("http://h/metrics?x=1").query == "x=1"  # a query is kept unless refused


@pytest.mark.parametrize(
    "given, scraped, api",
    [
        ("http://h:8000", "http://h:8000/metrics", "http://h:8000/v1"),
        ("http://h:8000/", "http://h:8000/metrics", "http://h:8000/v1"),
        (" http://[::1]:9000/metrics ", "http://[::1]:9000/metrics", "http://[::1]:9000/v1"),
        ("https://engine:8443/serve/metrics", "https://engine:8443/serve/metrics", "https://engine:8443/serve/v1"),
    ],
)
def test_one_engine_url_serves_the_exporter_and_stress(given, scraped, api):
    """What a user gives ``--engine-url``, the server or its /metrics: the exporter scrapes its
    /metrics, and ``kvdoctor stress`` sends requests to the OpenAI API beside it."""
    assert normalise_url(given) == scraped
    assert api_root(given) == api
