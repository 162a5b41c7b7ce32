"""The remote engine's servers (asyncrl.engine.fleet): routing to the live server with the fewest outstanding
requests, ties in turn; a retired or cooling-down server is never picked; answers map to their errors."""

import time

import pytest

from asyncrl.engine.fleet import Fleet, RequestFailed, RequestRejected, checked, url_of


def test_the_next_request_goes_to_the_least_loaded_live_server_and_ties_take_turns():
    fleet = Fleet(["a:1", "b:2", "c:3"])
    assert [s.url for s in fleet.servers] == ["http://a:1", "http://b:2", "http://c:3"]
    fleet.servers[0].outstanding = 2
    fleet.servers[1].outstanding = 1
    assert fleet.pick(set()).url == "http://c:3"
    fleet.servers[2].dead_until = time.monotonic() + 60  # cooling down after a failed request
    assert fleet.pick(set()).url == "http://b:2"
    fleet.retire(fleet.servers[1], "missed an update")
    assert fleet.pick(set()).url == "http://a:1" and fleet.live_addrs() == ["http://a:1"]
    assert fleet.pick({"http://a:1"}) is None
    ties = Fleet(["a:1", "b:2"])
    assert {ties.pick(set()).url for _ in range(4)} == {"http://a:1", "http://b:2"}  # in turn, not always the first


class _Response:
    def __init__(self, status_code, body=b'{"ok": 1}'):
        self.status_code, self.content, self.text = status_code, body, body.decode()

    def json(self):
        return {"ok": 1}


def test_answers_map_to_their_errors():
    assert checked(_Response(200), "x") == {"ok": 1} and checked(_Response(200, b""), "x") == {}
    with pytest.raises(RequestFailed, match="x: HTTP 503"):
        checked(_Response(503), "x")
    with pytest.raises(RequestRejected, match="HTTP 400"):
        checked(_Response(400), "x")
    assert url_of(" https://h:1/ ") == "https://h:1"
