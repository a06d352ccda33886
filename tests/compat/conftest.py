"""Opacus-compatibility tests: each test is an Opacus-style user script, run once with ``opacus``
and once with its imports switched to ``dpnotebook`` (``sed s/opacus/dpnotebook/``).

They need Opacus 1.6 (the ``opacus`` extra, part of ``dev``); without it they are skipped.
Single-threaded, as the privacy tests: the models are tiny.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("opacus")

LIBRARIES = ("opacus", "dpnotebook")


@pytest.fixture(autouse=True)
def _one_thread_quiet() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus' secure-RNG notice, dpnotebook's PrivacyWarning
        yield
    torch.set_num_threads(threads)
