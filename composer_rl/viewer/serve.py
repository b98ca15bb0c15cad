"""Serves a built viewer on 127.0.0.1 (stdlib only): the page fetches its data files, which
browsers refuse over file://, so the viewer is opened through this server."""
import functools
import http.server
import threading
from typing import Optional, Tuple

# The same policy as the page's meta tag, also sent as a header (it then covers the data
# files too); nosniff keeps a browser from running a .json file as anything else.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'")


class _Handler(http.server.SimpleHTTPRequestHandler):
  def end_headers(self):
    self.send_header("Content-Security-Policy", CSP)
    self.send_header("X-Content-Type-Options", "nosniff")
    self.send_header("Cache-Control", "no-cache")  # a re-built viewer is seen at once
    super().end_headers()

  def log_message(self, *args):  # quiet: tests and benchmarks read stdout
    pass


def make_server(directory: str, port: int = 0) -> http.server.ThreadingHTTPServer:
  """A server for `directory` on 127.0.0.1:`port` (0 = any free port; see .server_port)."""
  handler = functools.partial(_Handler, directory=directory)
  return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)


def serve_in_thread(directory: str, port: int = 0) -> Tuple[http.server.ThreadingHTTPServer,
                                                             threading.Thread]:
  """Starts a server in a daemon thread (tests, the benchmark); call .shutdown() to stop."""
  server = make_server(directory, port)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  return server, thread


def serve_forever(directory: str, port: int, ready: Optional[callable] = None) -> None:
  server = make_server(directory, port)
  if ready:
    ready(f"http://127.0.0.1:{server.server_port}/")
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.server_close()
