"""The OpenAI-compatible server on a thread of the calling process (uvicorn on loopback).

What an in-process user of the server needs — the online-RL controller, which serves and
trains in one process, the serving benchmark, tests — where `launch/serve.py` (the
command-line server, with its signal handling) would be a separate process.
"""
import socket
import threading
import time

from composer_rl.serving import app as app_lib


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class ThreadedServer:
  """Serves `service` on 127.0.0.1 (a free port) until `stop()`; `base_url` ends in /v1.

  keys: an `auth.KeyRing` of accepted API keys (None = no authentication).
  """

  def __init__(self, service, keys=None, start_timeout_s: float = 120.0):
    import uvicorn  # pylint: disable=g-import-not-at-top
    self.port = free_port()
    app = app_lib.create_app(service, app_lib.AppSettings.for_service(service, keys=keys))
    self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                log_level="warning"))
    self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
    self.thread.start()
    t0 = time.time()
    while not self.server.started:
      if time.time() - t0 > start_timeout_s or not self.thread.is_alive():
        raise RuntimeError(f"the server did not start on port {self.port}")
      time.sleep(0.05)
    self.base_url = f"http://127.0.0.1:{self.port}/v1"

  def stop(self) -> None:
    self.server.should_exit = True
    self.thread.join(timeout=60)
