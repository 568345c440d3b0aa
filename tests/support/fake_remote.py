"""A request as the API's middlewares see it, from a client address the test chooses (the machine's
own tests all connect from loopback; a LAN client is needed to test who counts as local)."""

from __future__ import annotations

from unittest import mock

from aiohttp.test_utils import make_mocked_request


def request_from(remote: str, headers: dict[str, str] | None = None, path: str = "/v1/models",
                 method: str = "GET", host: str = "localhost:8800"):
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (remote, 50123) if name == "peername" else default
    return make_mocked_request(method, path, headers={"Host": host, **(headers or {})}, transport=transport)
