"""One Prefect test harness (a temporary API server with its own database) per session."""

import os
import tempfile

# before Prefect reads its settings: a private home, no analytics, a startup timeout for 2 cores
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="prefect-home-"))
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
os.environ.pop("PREFECT_API_URL", None)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def prefect_harness():
    pytest.importorskip("prefect")
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
