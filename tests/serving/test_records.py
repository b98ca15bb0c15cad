"""The server's record log: every acknowledged record reads back, in order, across file
rotation, reopening, concurrent appenders and a SIGKILLed writer; torn and corrupt lines
are skipped with a warning that names the file and byte offset."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

from composer_rl.serving import records as rl


def _rec(i, **kw):
  return {"kind": "completion", "id": f"c{i}", "text": "x" * 40, **kw}


def _files(d):
  return sorted(n for n in os.listdir(d) if n.endswith(".log"))


def test_round_trip_across_rotation(tmp_path):
  d = str(tmp_path / "log")
  recs = [_rec(i, unicode="é\n✓\ud800", nested={"a": [1, 2.5, None]}) for i in range(20)]
  with rl.RecordLog(d, max_file_bytes=300) as log:
    for r in recs:
      log.append(r)
  assert len(_files(d)) > 3
  assert _files(d)[0] == "records-000001.log"
  for name in _files(d):  # every file holds at least one record and none far past the cap
    size = os.path.getsize(os.path.join(d, name))
    assert 0 < size < 300 + len(rl.encode(recs[0]))
  assert list(rl.read_records(d)) == recs


def test_concurrent_appenders_all_present_in_per_thread_order(tmp_path):
  d = str(tmp_path)
  log = rl.RecordLog(d, max_file_bytes=4096)
  n_threads, per_thread = 6, 40

  def work(t):
    for i in range(per_thread):
      log.append({"kind": "completion", "id": f"{t}:{i}", "t": t, "i": i})

  threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
  for th in threads:
    th.start()
  for th in threads:
    th.join()
  log.close()
  got = list(rl.read_records(d))
  assert len(got) == n_threads * per_thread
  for t in range(n_threads):
    assert [r["i"] for r in got if r["t"] == t] == list(range(per_thread))
  with pytest.raises(ValueError, match="closed"):
    log.append(_rec(0))


def test_concurrent_appenders_share_fsyncs(tmp_path, monkeypatch):
  """Group commit: while one appender waits on the disk the others queue behind the same
  fsync instead of each paying for their own."""
  calls = []
  real_fsync = os.fsync

  def slow_fsync(fd):
    calls.append(fd)
    time.sleep(0.005)
    real_fsync(fd)

  monkeypatch.setattr(os, "fsync", slow_fsync)
  log = rl.RecordLog(str(tmp_path))
  threads = [threading.Thread(target=lambda t=t: [log.append(_rec(f"{t}-{i}"))
                                                  for i in range(20)]) for t in range(4)]
  for th in threads:
    th.start()
  for th in threads:
    th.join()
  log.close()
  assert len(list(rl.read_records(str(tmp_path)))) == 80
  assert len(calls) < 60


def test_torn_tail_is_skipped_with_a_warning(tmp_path):
  d = str(tmp_path)
  with rl.RecordLog(d) as log:
    for i in range(5):
      log.append(_rec(i))
  path = os.path.join(d, _files(d)[-1])
  size = os.path.getsize(path)
  last = len(rl.encode(_rec(4)))
  os.truncate(path, size - last // 2)  # the writer died halfway through record 4
  with pytest.warns(UserWarning, match=r"records-000001\.log: byte offset %d: .*torn"
                    % (size - last)):
    got = list(rl.read_records(d))
  assert got == [_rec(i) for i in range(4)]


def test_flipped_byte_in_the_middle_record_is_detected(tmp_path):
  d = str(tmp_path)
  with rl.RecordLog(d) as log:
    for i in range(3):
      log.append(_rec(i))
  path = os.path.join(d, _files(d)[0])
  data = bytearray(open(path, "rb").read())
  first = len(rl.encode(_rec(0)))
  pos = data.index(b"xxxx", first)  # inside record 1's JSON (its "text" run of x's)
  assert first < pos < 2 * first
  data[pos] ^= 0x01  # 'x' -> 'y': still valid JSON, so only the CRC can catch it
  open(path, "wb").write(bytes(data))
  skipped = []
  with pytest.warns(UserWarning, match=r"byte offset %d: .*corrupt" % first):
    got = list(rl.read_records(d, on_skip=lambda p, o, why: skipped.append((p, o))))
  assert got == [_rec(0), _rec(2)]
  assert skipped == [(path, first)]


def test_reopen_writes_a_new_file_after_a_torn_tail(tmp_path):
  d = str(tmp_path)
  with rl.RecordLog(d) as log:
    log.append(_rec(0))
    log.append(_rec(1))
    first_path = log.path
  with open(first_path, "ab") as f:  # a torn record left by a killed writer
    f.write(rl.encode(_rec(99))[:25])
  log = rl.RecordLog(d)
  assert log.path != first_path and log.path.endswith("records-000002.log")
  log.append(_rec(2))
  log.close()
  with pytest.warns(UserWarning, match="torn"):
    got = list(rl.read_records(d))
  assert got == [_rec(0), _rec(1), _rec(2)]


def test_missing_directory_yields_nothing(tmp_path):
  assert list(rl.read_records(str(tmp_path / "absent"))) == []


def test_float_bits_round_trip_is_exact():
  vals = np.array([-0.0, -1e-38, -3.4028235e38, -1.2345678, 0.0, -np.inf], np.float32)
  bits = rl.float_bits(vals.tolist())
  assert all(isinstance(b, int) for b in bits)
  back = np.asarray(rl.bits_float(bits), np.float32)
  np.testing.assert_array_equal(back.view(np.uint32), vals.view(np.uint32))


_WRITER = textwrap.dedent("""
    import sys, threading
    from composer_rl.serving.records import RecordLog
    log = RecordLog(sys.argv[1], max_file_bytes=20000)
    out = threading.Lock()
    print("ready", flush=True)
    def work(t):
      for i in range(10 ** 9):
        rid = f"{t}:{i}"
        log.append({"kind": "completion", "id": rid, "pad": "p" * 500})
        with out:
          print(rid, flush=True)  # acknowledged only after append returned
    for t in range(4):
      threading.Thread(target=work, args=(t,)).start()
""")


def test_sigkill_loses_no_acknowledged_record(tmp_path):
  d = str(tmp_path / "log")
  proc = subprocess.Popen([sys.executable, "-c", _WRITER, d], stdout=subprocess.PIPE,
                          text=True)
  try:
    assert proc.stdout.readline().strip() == "ready"
    acked = []
    while len(acked) < 300:
      line = proc.stdout.readline()
      assert line, "the writer exited early"
      acked.append(line.strip())
  finally:
    os.kill(proc.pid, signal.SIGKILL)
  rest = proc.stdout.read()  # acknowledgements already in the pipe when it died
  proc.wait()
  acked += rest.split("\n")[:-1]  # the part after the last newline is torn
  with warnings.catch_warnings():  # the kill may have torn a final record
    warnings.simplefilter("ignore")
    stored = {r["id"] for r in rl.read_records(d)}
  assert len(_files(d)) > 1  # it rotated while running
  missing = [a for a in acked if a not in stored]
  assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:3]}"
