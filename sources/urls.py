"""The one URL parser and validator: every URL kvdoctor is given (an engine, an exporter, a
Prometheus, an OpenAI-compatible API) is checked here, and each caller derives what it needs from
the parts (a default path, an API root, a base without a trailing slash)."""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit

SCHEMES = ("http", "https")


class UrlError(ValueError):
    """A URL kvdoctor cannot use: ``str()`` is the reason, ``about(what)`` the line naming it."""

    def about(self, what: str) -> str:
        return f"{what} {self}"


def split_http_url(url: str | None, *, scheme_optional: bool = False, query: bool = True) -> SplitResult:
    """``url`` (stripped) split and checked: http(s), a host, a valid port, no blank inside; no query
    or fragment unless ``query``. ``host:port`` alone means http where ``scheme_optional``."""
    text = (url or "").strip()
    if scheme_optional and text and "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in SCHEMES or not parts.hostname or any(c.isspace() for c in text):
        raise UrlError(f"needs an http(s) URL such as http://host:port, got {url!r}")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise UrlError(f"has a bad port: {url!r}") from None
    if not query and (parts.query or parts.fragment):
        raise UrlError(f"must not carry a query or a fragment, got {url!r}")
    return parts


def base_url(url: str | None, *, scheme_optional: bool = False) -> str:
    """``url`` as a base to put API paths after: no query, no trailing slash."""
    parts = split_http_url(url, scheme_optional=scheme_optional, query=False)
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
