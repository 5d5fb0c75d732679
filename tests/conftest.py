"""Shared test configuration: async tests run on asyncio through anyio's pytest plugin; a module
marked ``trio_too`` runs each of its async tests on trio as well (the kernel, the runtime and
the stores promise both backends; the AG-UI server and the command line run on asyncio)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return getattr(request, "param", "asyncio")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "anyio_backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "trio_too"
    ):
        # (the trio runs count as slow: `make test` runs them, the fast tier does not)
        trio = pytest.param("trio", marks=pytest.mark.slow)
        metafunc.parametrize("anyio_backend", ["asyncio", trio], indirect=True)
