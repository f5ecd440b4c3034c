"""A small HTTP client for the Ray tests: JSON requests to 127.0.0.1 that never go through a
proxy, answering (status, parsed body, response headers) for any status, never raising for one."""

import json
import urllib.error
import urllib.request

# Never through a proxy: every request stays on 127.0.0.1.
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def request(method, url, body=None, headers=None, timeout=30):
    """(status, JSON body (None when empty, text when not JSON), headers with lower-case names)
    of one request; `body` is sent as JSON."""
    data = None if body is None else json.dumps(body).encode()
    sent = {"content-type": "application/json", **(headers or {})} if data is not None else dict(headers or {})
    req = urllib.request.Request(url, data=data, method=method, headers=sent)
    try:
        with HTTP.open(req, timeout=timeout) as response:
            status, raw, answer_headers = response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        status, raw, answer_headers = error.code, error.read(), error.headers
    try:
        parsed = json.loads(raw) if raw.strip() else None
    except ValueError:  # e.g. Serve's own text answer for a route that is not up yet
        parsed = raw.decode("utf-8", errors="replace")
    return status, parsed, {k.lower(): v for k, v in answer_headers.items()}


def post(url, body, headers=None, timeout=30):
    return request("POST", url, body, headers, timeout)
