"""Fixtures of the viewer tests (helpers live in viewer_helpers.py)."""
import pytest

import viewer_helpers as vh
from composer_rl.viewer import serve


@pytest.fixture(scope="session")
def real_run(tmp_path_factory):
  """Workdir of a real `tiny_bugfix.py:smoke` run with its viewer built."""
  return vh.make_real_run(tmp_path_factory)


@pytest.fixture(scope="session")
def real_url(real_run):
  server, _ = serve.serve_in_thread(f"{real_run}/viewer")
  yield f"http://127.0.0.1:{server.server_port}/index.html"
  server.shutdown()


@pytest.fixture(scope="session")
def drv():
  d = vh.browser()
  yield d
  d.quit()
