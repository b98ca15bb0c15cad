"""Serves a policy over the OpenAI API: python launch/serve.py --config=experiments/X.py

  python launch/serve.py --config=experiments/serve_tiny.py            # fresh init, :8000
  python launch/serve.py --config=experiments/tiny_bugfix.py \
      --checkpoint=/tmp/tiny_bugfix/checkpoints --records_dir=/data/records
  python launch/serve.py --config=... --weights_dir=SHARED/weights     # follow new versions
  python launch/serve.py --config=... --host=0.0.0.0 --api_key_file=keys.txt

Without --checkpoint / --weights_dir the config's freshly initialized model is served.
Binds to 127.0.0.1 unless told otherwise; a non-loopback address needs --api_key_file
(lines `name:sha256hex`; make one with `python -m composer_rl.serving.auth NAME`) or an
explicit --allow_unauthenticated. --port=0 picks a free port. When the server accepts
requests it prints one line `composer_rl serve: ready at http://HOST:PORT/v1 ...`.
SIGTERM (or Ctrl-C) stops accepting, finishes in-flight requests, closes the record log.
Settings: the config's `serve` section (`composer_rl.serving.settings.ServeSettings`).
"""
import ipaddress
import os
import signal
import socket
import sys

import composer_rl  # noqa: F401  (sets the parity XLA flags before JAX starts)
from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file",
                                          lock_config=True)
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "train checkpoint directory (a workdir, "
                                  "its checkpoints/ or one step folder); params only")
_WEIGHTS_DIR = flags.DEFINE_string("weights_dir", None, "published weights root to follow "
                                   "(composer_rl.sync); its newest version is served")
_RECORDS_DIR = flags.DEFINE_string("records_dir", None, "where session records are written "
                                   "(default: config.serve.records_dir, else "
                                   "<workdir>/records, else ~/.cache/composer_rl/serve/...)")
_WORKDIR = flags.DEFINE_string("workdir", None, "serving workdir (records/ goes here)")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "address to bind")
_PORT = flags.DEFINE_integer("port", 8000, "port to bind (0 = a free one)")
_KEYS = flags.DEFINE_string("api_key_file", None, "hashed API keys, one `[name:]sha256hex` "
                            "a line; every request then needs a valid bearer key")
_ALLOW_UNAUTH = flags.DEFINE_bool("allow_unauthenticated", False, "allow binding a "
                                  "non-loopback address without --api_key_file")
flags.mark_flags_as_required(["config"])


def is_loopback(host: str) -> bool:
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host.strip("[]")).is_loopback
  except ValueError:
    return False  # a host name other than localhost: treat as reachable from outside


def bind(host: str, port: int) -> socket.socket:
  info = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM,
                            flags=socket.AI_PASSIVE)
  family, _, _, _, addr = info[0]
  sock = socket.socket(family, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  if family == socket.AF_INET6:
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
  sock.bind(addr)
  sock.listen(2048)
  sock.set_inheritable(True)
  return sock


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  host = _HOST.value
  if not is_loopback(host) and not _KEYS.value and not _ALLOW_UNAUTH.value:
    print(f"composer_rl serve: refusing to bind {host} (not a loopback address) without "
          "--api_key_file; anyone who can reach it could use the model and write records. "
          "Give --api_key_file, or --allow_unauthenticated if this is really intended.",
          file=sys.stderr, flush=True)
    sys.exit(2)
  logging.set_verbosity(logging.WARNING)
  # Imported here so the refusal above costs no model build.
  import uvicorn  # pylint: disable=g-import-not-at-top
  from composer_rl.serving.app import AppSettings, create_app  # pylint: disable=g-import-not-at-top
  from composer_rl.serving.auth import KeyRing  # pylint: disable=g-import-not-at-top
  from composer_rl.serving.loading import build_service, resolve_records_dir  # pylint: disable=g-import-not-at-top
  from composer_rl.serving.settings import ServeSettings  # pylint: disable=g-import-not-at-top

  keys = None
  if _KEYS.value:
    try:
      keys = KeyRing.from_file(_KEYS.value)
    except (OSError, ValueError) as e:
      print(f"composer_rl serve: --api_key_file: {e}", file=sys.stderr, flush=True)
      sys.exit(2)
  if not is_loopback(host) and keys is None:
    print(f"composer_rl serve: WARNING: {host} is reachable without authentication "
          "(--allow_unauthenticated)", file=sys.stderr, flush=True)
  config = _CONFIG.value
  stem = os.path.splitext(os.path.basename(config_flags.get_config_filename(
      flags.FLAGS["config"])))[0]
  settings = ServeSettings.from_config(config, stem)
  try:
    sock = bind(host, _PORT.value)  # fail fast (address in use) before building the model
  except OSError as e:
    print(f"composer_rl serve: cannot bind {host}:{_PORT.value}: {e}", file=sys.stderr,
          flush=True)
    sys.exit(2)
  port = sock.getsockname()[1]
  records_dir = resolve_records_dir(settings, _RECORDS_DIR.value, _WORKDIR.value)
  service = build_service(config, checkpoint_dir=_CHECKPOINT.value,
                          weights_dir=_WEIGHTS_DIR.value, records_dir=records_dir,
                          settings=settings)
  api = create_app(service, AppSettings.for_service(service, keys))
  shown = f"[{host}]" if ":" in host else host
  line = (f"composer_rl serve: ready at http://{shown}:{port}/v1 (model "
          f"{service.model_name}, policy version {service.generator.version}, records "
          f"{records_dir}, auth {'on' if keys else 'off'})")

  class Server(uvicorn.Server):
    async def startup(self, sockets=None):
      await super().startup(sockets=sockets)
      if not self.should_exit:
        print(line, flush=True)

  server = Server(uvicorn.Config(
      api, log_level="warning", access_log=False, server_header=False,
      timeout_graceful_shutdown=settings.graceful_shutdown_s, timeout_keep_alive=5,
      lifespan="on"))
  # uvicorn re-raises a captured SIGTERM with the handler it found once it has shut down
  # gracefully; with this one the process then ends normally (exit status 0).
  signal.signal(signal.SIGTERM, lambda *_: None)
  try:
    server.run(sockets=[sock])
  finally:
    service.close()  # idempotent; the lifespan shutdown normally did it
    sock.close()
  print("composer_rl serve: stopped", flush=True)


if __name__ == "__main__":
  app.run(main)
