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


def split_http_url(url: str | None, *, query: bool = True) -> SplitResult:
    """``url`` (stripped) split and checked: http(s), a host, a valid port, no blank inside; no query
    or fragment unless ``query``. A scheme is always needed: ``host:port`` alone is refused (with
    the URL it was likely meant to be), as every verb, setting and client refuses it."""
    text = (url or "").strip()
    parts = urlsplit(text)
    if parts.scheme not in SCHEMES or not parts.hostname or any(c.isspace() for c in text):
        hint = ""
        if text and "://" not in text and not any(c.isspace() for c in text):
            hint = f" (did you mean 'http://{text}'?)"
        raise UrlError(f"needs an http(s) URL such as http://host:port, got {url!r}{hint}")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise UrlError(f"has a bad port: {url!r}") from None
    if not query and (parts.query or parts.fragment):
        raise UrlError(f"must not carry a query or a fragment, got {url!r}")
    return parts


def base_url(url: str | None) -> str:
    """``url`` as a base to put API paths after: no query, no trailing slash."""
    parts = split_http_url(url, query=False)
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
