"""The repository's pytest options and markers: ``--device``, and the ``slow`` marker of the quick loop.

The ``slow`` marker (registered in ``pyproject.toml``) is what ``make test-fast`` (``pytest -m "not slow"``)
leaves out. It is set here, in one place, on what cannot carry a decorator: every notebook cell that
nbval collects from ``tutorials/``, and every test in ``tests.slow.SLOW_FOLDERS``. Single slow tests elsewhere
carry ``@pytest.mark.slow`` themselves. ``tests/test_quick_loop.py`` checks that the quick loop
collects none of them.

``--device cpu`` (the default) or ``--device cuda`` (``make test-gpu``): with ``--device cuda`` every test runs with CUDA as the default device
(:class:`tests.device.TestDevice`); doctests, whose expected output is the CPU's,
are deselected, and the notebooks choose their device themselves and run under ``--nbval-lax``: every
cell runs and every claim a notebook asserts must hold, but the outputs are not compared with the stored
CPU outputs (a GPU draws other random numbers). TF32 is switched off for the
session (PyTorch turns it on for cuDNN convolutions by default; it changes float32 results by about
1e-4 relative, ten times the oracle's tolerance), so the float32 tests check the formulas on the GPU
at the precision they check them on the CPU. On a machine
without a CUDA GPU every test is skipped, and the run ends with one line that
says so: nothing passes silently on the CPU in the GPU's place.

``--failures-at-once`` writes each failure's report the moment it arrives (from xdist workers too), not only
in the summary at the end: ``tools/gpu-session`` passes it, since a stage its time limit cuts off never
prints that summary.
"""

from __future__ import annotations

import pytest

from tests.device import DEVICES, TestDevice, no_gpu_reason
from tests.slow import is_slow


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="where the tests run: cpu (default) or cuda (every test skipped, with one line, if there is no GPU)",
    )
    parser.addoption(
        "--failures-at-once",
        action="store_true",
        help="print each failure's report the moment it fails, not only in the summary at the end "
        "(tools/gpu-session: a stage its time limit cuts off still says why its tests failed)",
    )


class _FailuresAtOnce:
    """Writes each failed test's report (with ``--tb``'s detail) as soon as it arrives, also from xdist workers."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.failed:
            return
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.write_line(f"\n--- failed at once: {report.nodeid} ({report.when}) ---")
            terminal.write_line(report.longreprtext[-4000:])
            terminal.flush()  # now, not when a buffered stdout fills (a killed run never flushes it)


def _gpu_wanted(config: pytest.Config) -> bool:
    return config.getoption("device") == "cuda"


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("failures_at_once"):
        config.pluginmanager.register(_FailuresAtOnce(config), "failures-at-once")
    if _gpu_wanted(config) and no_gpu_reason() is None:
        import torch

        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        # The notebooks' stored outputs are the CPU's: on a GPU every draw and kernel differs, so the outputs
        # cannot match digit for digit. nbval runs every cell and the claims each notebook asserts must hold.
        if hasattr(config.option, "nbval_lax"):
            config.option.nbval_lax = True
        context = TestDevice("cuda")
        context.__enter__()
        config.stash[_CONTEXT] = context


def pytest_unconfigure(config: pytest.Config) -> None:
    context = config.stash.get(_CONTEXT, None)
    if context is not None:
        context.__exit__(None, None, None)


def pytest_report_header(config: pytest.Config) -> str | None:
    if not _gpu_wanted(config):
        return None
    reason = no_gpu_reason()
    if reason:
        return f"device: cuda requested, {reason}"
    import torch

    return f"device: cuda ({torch.cuda.get_device_name()}, {torch.cuda.device_count()} GPU(s))"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if is_slow(item, config.rootpath):
            item.add_marker(pytest.mark.slow)
    if not _gpu_wanted(config):
        return
    doctests = [item for item in items if isinstance(item, pytest.DoctestItem)]
    if doctests:  # their expected output is the CPU's (no device='cuda:0' in it)
        config.hook.pytest_deselected(items=doctests)
        items[:] = [item for item in items if not isinstance(item, pytest.DoctestItem)]
    reason = no_gpu_reason()
    if reason:
        skip = pytest.mark.skip(reason=f"--device cuda: {reason}")
        for item in items:
            item.add_marker(skip)
        config.stash[_SKIPPED] = (len(items), reason)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    skipped = config.stash.get(_SKIPPED, None)
    if skipped is not None:
        count, reason = skipped
        terminalreporter.write_line(f"--device cuda: all {count} tests SKIPPED, none ran: {reason}", yellow=True)


_CONTEXT = pytest.StashKey[TestDevice]()
_SKIPPED = pytest.StashKey[tuple[int, str]]()
