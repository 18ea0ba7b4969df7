"""Markers: `long` tests (minutes each) run under `ctest -L long` (python.pytest_long), not in `make test`."""


def pytest_configure(config):
    config.addinivalue_line("markers", "long: minutes each; run by `ctest -L long`, not by `make test`")
