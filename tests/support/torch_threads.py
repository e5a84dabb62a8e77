"""One torch thread for the tests of tiny models: each torch test folder's conftest uses it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny shapes: one thread is fastest, and spare threads spin on a busy machine (50x slower)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
