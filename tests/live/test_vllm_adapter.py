"""The vLLM adapter without vLLM: the model folder it serves, the server's lifecycle (a stand-in
server process: ready, dead on start, stopped with its children), the client against a
stand-in streaming endpoint, and the iteration-log parser on lines a real vLLM 0.32.0 wrote.
tests/live/test_vllm_real.py runs the real server."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from live.vllm_client import serve_workload, served_frame
from live.vllm_log import read_iterations
from live.vllm_server import VllmError, VllmServer, VllmSettings, vllm_python
from traces import Workload

DATA = Path(__file__).parent / "data"


def test_iteration_lines_parse():
    frame = read_iterations(DATA / "vllm-iterations.log")
    assert list(frame.iteration) == [0, 1, 2]  # the "non-default args" line is not one
    assert frame.iloc[0].to_dict() == {
        "iteration": 0, "context_requests": 1, "context_tokens": 43, "generation_requests": 0,
        "generation_tokens": 0, "elapsed_ms": 1617.62, "dummy": False}
    assert frame.generation_tokens.tolist() == [0, 1, 1]


def test_settings_make_the_serve_command():
    plain = VllmSettings(Path("/m")).args(8000)
    assert plain[:2] == ["serve", "/m"] and "--speculative-config" not in plain
    assert "--no-enable-prefix-caching" in plain and "--enable-logging-iteration-details" in plain
    table = VllmSettings(Path("/m"), speculative_tokens=4, k_by_batch=((1, 8, 4), (9, 128, 2)))
    args = table.args(8000)
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                    "prompt_lookup_max": 3,
                    "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 128, 2]]}
    assert args[args.index("--per-request-spec-decode-metrics") + 1] == "detailed"


def test_a_missing_environment_says_what_to_run(tmp_path):
    with pytest.raises(VllmError, match=r"scripts/vllm_env\.sh"):
        vllm_python(tmp_path / "nowhere")


def fake_venv(tmp_path: Path, server_code: str) -> Path:
    """A venv whose python runs `server_code` whatever it is asked (as `python -c LAUNCH ...`)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    script = tmp_path / "server.py"
    script.write_text(textwrap.dedent(server_code))
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    python.chmod(0o755)
    return venv


def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


SERVER = """
    import http.server, json, os, signal, subprocess, sys, time
    port = int(sys.argv[sys.argv.index("--port") + 1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(os.environ["CHILD_PID_FILE"], "w").write(str(child.pid))
    def stop(signum, frame):  # as vLLM's API server does: its engine core goes with it
        child.kill()
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200); self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(body["max_tokens"]):
                event = {"choices": [{"token_ids": [body["prompt"][0] + i]}]}
                self.wfile.write(f"data: {json.dumps(event)}\\n\\n".encode()); self.wfile.flush()
                time.sleep(0.01)
            last = {"choices": [], "metrics": {"speculative_decoding": {
                "per_step_drafted": [2], "per_step_accepted": [1]}}}
            self.wfile.write(f"data: {json.dumps(last)}\\n\\ndata: [DONE]\\n\\n".encode())
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_server_serves_and_stops_with_its_children(tmp_path, monkeypatch):
    monkeypatch.setenv("CHILD_PID_FILE", str(tmp_path / "child.pid"))
    venv = fake_venv(tmp_path, SERVER)
    settings = VllmSettings(model_dir(tmp_path))
    with VllmServer(settings, venv, tmp_path / "server.log", ready_timeout_s=30) as server:
        wl = Workload(arrival_s=np.array([0.0, 0.05]), prompt_tokens=np.array([1, 1]),
                      output_tokens=np.array([3, 5]), request_ids=np.array([7, 8]),
                      source="test")
        served = serve_workload(server.url, "m", wl, [[100], [200]])
        child = int((tmp_path / "child.pid").read_text())
        os.kill(child, 0)  # alive while the server is
    assert [s.token_ids for s in served] == [[100, 101, 102], [200, 201, 202, 203, 204]]
    assert all(s.error is None for s in served)
    frame = served_frame(served, wl)
    assert frame.request_id.tolist() == [7, 8] and frame.output_tokens.tolist() == [3, 5]
    assert (frame.ttft_s > 0).all() and (frame.e2e_s >= frame.ttft_s).all()
    assert frame.drafted.tolist() == [2, 2] and frame.accepted.tolist() == [1, 1]
    assert served[1].sent_s >= 0.05  # sent at its arrival
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the server's child went with its process group
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the server's child process outlived it")


def test_a_server_that_dies_on_start_reports_its_log(tmp_path):
    venv = fake_venv(tmp_path, "import sys\nprint('ValueError: no CPU KV cache left')\n"
                               "sys.exit(3)\n")
    server = VllmServer(VllmSettings(model_dir(tmp_path)), venv, tmp_path / "server.log",
                        ready_timeout_s=30)
    with pytest.raises(VllmError, match=r"(?s)exited with code 3.*no CPU KV cache left"):
        server.start()
    assert server.process is None


def test_a_missing_model_folder_says_what_to_run(tmp_path):
    venv = fake_venv(tmp_path, "pass\n")
    with pytest.raises(VllmError, match=r"(?s)no model folder.*scripts/vllm_env\.sh"):
        VllmServer(VllmSettings(tmp_path / "none"), venv, tmp_path / "log").start()


def test_safetensors_layout(tmp_path):
    from models.hf_folder import write_safetensors

    tensors = {"b.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
               "a.norm": np.array([1.5, -2.0], dtype=np.float32)}
    path = tmp_path / "m.safetensors"
    write_safetensors(path, tensors)
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    assert size % 8 == 0 and header["__metadata__"] == {"format": "pt"}
    data = raw[8 + size :]
    for name, array in tensors.items():
        entry = header[name]
        assert entry["dtype"] == "F32" and entry["shape"] == list(array.shape)
        begin, end = entry["data_offsets"]
        got = np.frombuffer(data[begin:end], dtype="<f4").reshape(array.shape)
        np.testing.assert_array_equal(got, array)
    assert max(e["data_offsets"][1] for k, e in header.items() if k != "__metadata__") == len(data)


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


SPECTUNE = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from live.vllm_server import VllmServer, VllmSettings
with VllmServer(VllmSettings(Path({model!r})), Path({venv!r}), Path({log!r}),
                ready_timeout_s=30):
    print("READY", flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_spectune_leaves_no_server_behind(tmp_path, monkeypatch, signum):
    """SIGTERM unwinds spectune, whose stop kills the server's group; SIGKILL cannot be caught,
    and the server's death signal (SIGTERM) lets it stop its own children."""
    monkeypatch.setenv("CHILD_PID_FILE", str(tmp_path / "child.pid"))
    venv = fake_venv(tmp_path, SERVER)
    code = SPECTUNE.format(root=str(Path(__file__).parents[2]), model=str(model_dir(tmp_path)),
                           venv=str(venv), log=str(tmp_path / "server.log"))
    spectune = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert spectune.stdout.readline().strip() == "READY"
    child = int((tmp_path / "child.pid").read_text())
    spectune.send_signal(signum)
    assert spectune.wait(timeout=30) == (143 if signum == signal.SIGTERM else -signal.SIGKILL)
    assert _gone(child), "the server's child process outlived spectune"


def test_stop_kills_the_group_when_the_server_itself_is_gone(tmp_path, monkeypatch):
    monkeypatch.setenv("CHILD_PID_FILE", str(tmp_path / "child.pid"))
    venv = fake_venv(tmp_path, SERVER.replace("signal.signal(signal.SIGTERM, stop)", ""))
    server = VllmServer(VllmSettings(model_dir(tmp_path)), venv, tmp_path / "server.log",
                        ready_timeout_s=30)
    server.start()
    child = int((tmp_path / "child.pid").read_text())
    os.kill(server.process.pid, signal.SIGKILL)  # the API server dies, its engine core not
    server.process.wait()
    assert not _gone(child, within_s=0.5)
    server.stop()
    assert _gone(child)
