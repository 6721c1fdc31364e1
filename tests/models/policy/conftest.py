"""Fixtures shared by the policy tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """These tests call the model on pytest's main thread. On a CPU shared with other jobs, OpenMP's
    spinning workers there made a tiny-PI0 chunk 10-50x slower (the server runs the model on its worker
    thread and was not affected); one thread keeps the tests quick and changes no result they check."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
