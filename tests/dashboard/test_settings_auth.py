"""Settings from arguments and the environment; basic auth on every route."""

from __future__ import annotations

import base64

import pytest

from kvdoctor.dashboard import auth
from kvdoctor.dashboard.app import create_app
from kvdoctor.dashboard.settings import DashboardSettings
from tests.support.errors import one_line_error


def test_base_urls_are_checked_once_and_refusals_name_the_url():
    assert DashboardSettings(exporter_url="http://127.0.0.1:9745/").exporter_url == "http://127.0.0.1:9745"
    message = one_line_error(ValueError, DashboardSettings.from_env, {}, exporter_url="127.0.0.1:9745")
    assert message.startswith("exporter URL needs an http(s) URL")  # a scheme, as every verb needs one
    message = one_line_error(ValueError, DashboardSettings.from_env, {}, prometheus_url="http://h/?next=http://evil")
    assert message.startswith("Prometheus URL must not carry a query")


def test_environment_fills_what_arguments_leave_out():
    env = {
        "KVDOCTOR_DASHBOARD_EXPORTER_URL": "http://e:1",
        "KVDOCTOR_DASHBOARD_REFRESH": "2.5",
        "KVDOCTOR_DASHBOARD_LIVE_SECONDS": "300",
        "KVDOCTOR_DASHBOARD_USERS": "ann:pw1",
        "KVDOCTOR_DASHBOARD_REQUEST_TIMEOUT": "7.5",
    }
    s = DashboardSettings.from_env(env, prometheus_url="http://p:9090")
    assert (s.exporter_url, s.prometheus_url, s.refresh_seconds, s.live_seconds) == (
        "http://e:1",
        "http://p:9090",
        2.5,
        300,
    )
    assert s.request_timeout_seconds == 7.5
    assert dict(s.users) == {"ann": "pw1"}
    assert s.live_points_cap == 121
    assert DashboardSettings.from_env(env, exporter_url="https://x:2").exporter_url == "https://x:2"
    with pytest.raises(ValueError, match="KVDOCTOR_DASHBOARD_REFRESH"):
        DashboardSettings.from_env({"KVDOCTOR_DASHBOARD_REFRESH": "soon"})
    with pytest.raises(ValueError, match="request timeout"):
        DashboardSettings.from_env({"KVDOCTOR_DASHBOARD_REQUEST_TIMEOUT": "0"})
    assert "pw1" not in repr(s)


def test_users_from_env_and_file(tmp_path):
    secret = tmp_path / "users"
    secret.write_text("# mounted secret\nbob:s3cret:with:colons\n\ncarl:pw\n")
    users = auth.users_from_env({auth.USERS_ENV: "ann:pw1, carl:old", auth.AUTH_FILE_ENV: str(secret)})
    assert users == {"ann": "pw1", "bob": "s3cret:with:colons", "carl": "pw"}
    with pytest.raises(ValueError, match="line 2 is not user:password") as err:
        auth.parse_users("ok:1\nnopassword\n", separator="\n", origin="f")
    assert "nopassword" not in str(err.value)  # never echo what may be a password
    with pytest.raises(ValueError, match="cannot read"):
        auth.users_from_env({auth.AUTH_FILE_ENV: str(tmp_path / "missing")})


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(
    "header, ok",
    [
        (None, False),
        (_basic("ann", "pw1"), True),
        (_basic("ann", "wrong"), False),
        (_basic("nobody", "pw1"), False),
        ("Basic !!!notbase64", False),
        ("Bearer abc", False),
    ],
)
def test_check_authorization(header, ok):
    assert auth.check_authorization(header, {"ann": "pw1"}) is ok


@pytest.mark.parametrize("path", ["/", "/ledger", "/_dash-layout", "/_dash-dependencies", "/assets/kvdoctor.css"])
def test_every_route_needs_the_password_when_users_are_set(path):
    app = create_app(exporter_url="http://127.0.0.1:9", users={"ann": "pw1"}, environ={})
    client = app.server.test_client()
    denied = client.get(path)
    assert denied.status_code == 401 and "Basic" in denied.headers["WWW-Authenticate"]
    assert client.get(path, headers={"Authorization": _basic("ann", "pw1")}).status_code == 200


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_probes_answer_without_credentials_and_reveal_nothing(path):
    app = create_app(exporter_url="http://127.0.0.1:9", users={"ann": "pw1"}, environ={})
    resp = app.server.test_client().get(path)
    assert resp.status_code == 200 and set(resp.get_json()) == {"status"}


def test_no_users_no_auth():
    app = create_app(exporter_url="http://127.0.0.1:9", environ={})
    assert app.server.test_client().get("/").status_code == 200


def test_create_app_needs_a_source():
    with pytest.raises(ValueError, match="exporter URL or a Prometheus URL"):
        create_app(environ={})
