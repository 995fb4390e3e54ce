"""Work of the integration session that waits on the network and the disk more than on the CPU, run in
a thread beside the tests that measure nothing.

The cpu image's first build (tests/integration/test_image.py: podman and debootstrap installed when
missing, the debootstrap base, the wheelhouse, the image) took 334 s on a 2-core AVX-512 box with the
box 52 % busy on average: run alone, half the box idles for five minutes. conftest.py runs the tests
whose assertions read a timing, a probe or a verdict first, as they always ran, then starts the build
here with the first test that measures nothing, and the image's tests, which take its result with
result(), last. Where nothing started the job (the image's tests run alone), result() starts it and
waits.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable

_jobs: dict[str, Future] = {}
_lock = threading.Lock()


def start(name: str, work: Callable[[], Any]) -> None:
    """Run work() in a daemon thread under `name`, once per session (a second start is ignored)."""
    with _lock:
        if name in _jobs:
            return
        future: Future = Future()
        _jobs[name] = future

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever takes the result
            future.set_exception(exc)

    threading.Thread(target=run, name=f"background-{name}", daemon=True).start()


def result(name: str, work: Callable[[], Any]) -> Any:
    """work()'s result: the background job's (waited for), or work() started now if none was."""
    start(name, work)
    return _jobs[name].result()
