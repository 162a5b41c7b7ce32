"""``asyncrl serve``'s app on a thread of the test process, and a watch on its /health while a test abuses it."""

import contextlib
import math
import threading
import time

import httpx

from asyncrl.engine.local import LocalEngine
from asyncrl.server.app import ServerThread, build_app
from asyncrl.server.state import ServerState

MAX_LEN = 64


@contextlib.contextmanager
def serving(model, tokenizer, admin_key: str | None = None, **state_kw):
    """A server of ``model`` (max_len 64, 4 slots) on a thread of this process: (url, state)."""
    engine = LocalEngine(
        model, max_slots=4, max_len=MAX_LEN, stop_token_ids=(tokenizer.eos_token_id,), tokenizer=tokenizer
    ).start()
    state = ServerState(engine, tokenizer, "tiny", "-", **state_kw)
    app = build_app(state)
    if admin_key:  # as asyncrl serve --admin-key wraps it
        from asyncrl.server.middleware import AdminOnly

        app = AdminOnly(app, admin_key)
    http = ServerThread(app)
    try:
        yield http.url, state
    finally:
        http.close()
        engine.stop()


HEALTH_BOUND_S = 2.5
"""The slowest /health answer allowed while a server works on a large request. A request handled on the event loop
held /health for 3 to 14 s (the hardening reports); on 2 loaded cores beside another test worker, a server that
does not block its loop still answered once in 1.28 s (the GIL is held while a thread parses 8 MB of JSON)."""


@contextlib.contextmanager
def health_watch(url):
    """Polls ``/health`` every 50 ms on a thread; yields the list of answer times (a failed poll: inf)."""
    times, done = [], threading.Event()

    def poll():
        with httpx.Client(timeout=30) as client:
            while not done.is_set():
                t0 = time.monotonic()
                try:
                    ok = client.get(f"{url}/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                times.append(time.monotonic() - t0 if ok else math.inf)
                time.sleep(0.05)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    time.sleep(0.1)
    try:
        yield times
    finally:
        time.sleep(0.1)
        done.set()
        thread.join(timeout=60)


def greedy(url, ids=(5, 17, 42), n=6):
    """``n`` greedy tokens after ``ids`` from the server at ``url``."""
    r = httpx.post(
        f"{url}/generate",
        json={"input_ids": list(ids), "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]
