"""Every command the README shows runs: the README can never break again.

The cases come from README.md itself, so a command added to it is tested the day it is added:

- every line of a ```bash fence (backslash-continued lines joined, a trailing `# comment`
  stripped; the comment's "writes a, b" is checked too);
- in the prose, every code span that is a command: `python benchmarks/...`, `python scripts/...`,
  `pip install ...`, and `spectune SUB ARGS...`. A bare `spectune SUB` in a sentence names the
  subcommand, not a command to type (`spectune profile` alone would run the 15-minute grid): the
  test checks a fenced command shows that subcommand instead.

They run in README order in one temporary working directory, as a reader would type them (the
README's relative paths chain: `plan --from-tune runs/tune` reads the tune before it), with
`spectune` as `python -m spectune` and `python benchmarks/x.py` as this interpreter running the
checkout's script. Run the whole file: a case picked alone lacks what the commands before it wrote.

Sizes: REDUCE appends flags to each command, keyed by its longest matching prefix. argparse keeps
the last occurrence of an option, so an appended `--requests 40` overrides the README's value and
the command itself is otherwise run as written. A command no key covers fails the test and says
where to add one: it is never skipped. The exceptions are explicit:

- the test-suite line is CI itself: it is not run here (it would run this test inside itself),
  but `.ci/run` must hold exactly that command;
- the quick start's `python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/spectune
  tune` runs for real: a fresh virtual environment, the checkout installed without extras from the
  package index, its `spectune tune` (reduced) printing a recommendation, and torch not
  importable there;
- any other `pip install` line is not rerun (CI's own install covers it, and re-resolving torch
  would download it again): what it installs must be installed here, at the pinned versions;
- a `--device cuda` command on a machine without CUDA must end with exit code 2 and one line
  that names cuda (no traceback); with a GPU it runs, reduced, like the others;
- a command that serves on a real vLLM (`--engine vllm`, `benchmarks/vllm_loop.py`), or reads
  back what one served (`benchmarks/vllm_calibration.py`, `benchmarks/vllm_loop_calibrated.py`),
  is run by
  tests/live/test_vllm_real.py, reduced by VLLM_REDUCE, in README order, after that test has
  built vLLM's environment, and with checks of what vLLM served; here, only that VLLM_REDUCE
  covers it.

Each run must exit 0 with no traceback; `--format json` output must parse; an `--out` folder
must hold files; tune, plan, validate and report must write their file.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
COMMAND_FENCES = ("bash", "sh", "shell")
#: prose code spans that are commands to run (a bare `spectune SUB` is a name: see above)
INLINE_COMMAND = re.compile(
    r"^(spectune \S+ \S|python3? (benchmarks|scripts)/\S+\.py\b|pip install )")
INLINE_SUBCOMMAND = re.compile(r"^spectune ([a-z][a-z-]*)$")
CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
TIMEOUT_S = 600

#: Flags appended to shrink a command, keyed by command prefix (the longest match wins). An empty
#: tuple: fast as written. Times are on the 2-core CI machine.
REDUCE: dict[str, tuple[str, ...]] = {
    # 300 requests x 3 seeds (x 5) and a Sobol refinement of 4 points: 1.5-2 min each as written
    "spectune tune": ("--requests", "40", "--seeds", "2", "--points", "2", "--jobs", "2"),
    # bisection per policy x hardware over 300-request simulations
    "spectune plan": ("--requests", "60", "--tolerance", "0.1", "--jobs", "2"),
    # Llama-3.1-70B over 2 GPUs x 3 TP degrees x 3 policies (201 simulations of 300 requests,
    # ~15 s as written): one policy, 60 requests, a coarse bisection
    "spectune plan --target Llama-3.1-70B": ("--requests", "60", "--tolerance", "0.1",
                                             "--policies", "fixed:k=4", "--jobs", "2"),
    "spectune report": (),
    "python benchmarks/tp_published.py": (),  # 36 published rows and a grid fit: 0.2 s
    "python benchmarks/vllm_windows.py": (),  # reads ten committed tables: 1 s
    "spectune simulate": (),  # 2-4 s each, even at 2000 requests
    "spectune policies": (),
    "spectune catalog": (),
    # --quick is ~1.5 min, the full grid ~15: the quick grid, one round, no warm-up, fewer points
    "spectune profile": ("--quick", "--repeats", "1", "--warmup", "0", "--ragged", "3",
                         "--query-tokens", "1,2,4"),
    # 2 prompts of each of 13 categories x 128 tokens of the real model: ~3 min
    "spectune record": ("--categories", "extraction", "--max-tokens", "16"),
    # live runs in real time (40 requests x 64 tokens, per policy and rate) with a profile round
    # timed after each: one rate halves them (0.5 req/s also waits for its arrivals)
    "spectune validate": ("--requests", "2", "--output-tokens", "8", "--max-num-seqs", "2",
                          "--rates", "4"),
    "python benchmarks/policies.py": ("--requests", "100", "--workers", "2"),
    # 80 cells x 3 seeds x 23 policies of 800 requests: ~40 min on 2 cores as written
    "python benchmarks/policy_matrix.py": ("--requests", "40", "--seeds", "0", "--acceptances",
                                           "smollm2-ngram", "--gpus", "H100-SXM", "--workloads",
                                           "azure-conv", "--loads", "0.4", "--policies", "auto",
                                           "goodput", "--jobs", "2"),
    "python benchmarks/sim_speed.py": ("--sizes", "1000", "--recorded", "300"),  # 100k: ~1 min
    # the first tables, then every policy on two acceptance sources, 3 runs of 2,000 requests
    # each (~3 min): one run of 100
    "python benchmarks/sim_speed.py --every-policy": ("--sizes", "1000", "--recorded", "0",
                                                      "--every-policy", "100", "--repeats", "1"),
    # every policy under chunked prefill and vLLM's scheduler, 3 runs of 2,000 requests each
    # (~4 min): one run of 100
    "python benchmarks/sim_speed.py --every-scheduler": ("--sizes", "1000", "--recorded", "0",
                                                         "--every-scheduler", "100",
                                                         "--repeats", "1"),
    # every path at two loads, 3 runs of 2,000 requests per replica each (~4 min): one of 100
    "python benchmarks/sim_speed.py --paths": ("--sizes", "1000", "--recorded", "0",
                                               "--paths", "100", "--repeats", "1"),
    # every path with the per-request loops in numpy and compiled, 3 runs of 2,000 requests
    # per replica each (~7 min): one of 100
    "python benchmarks/sim_speed.py --compiled": ("--sizes", "1000", "--recorded", "0",
                                                  "--compiled", "100", "--repeats", "1"),
    # the shipped profiles, fast and stepped, 3 runs of 1,000 requests each (~2 min): one of 60
    "python benchmarks/sim_speed.py --profiles": ("--sizes", "1000", "--recorded", "0",
                                                  "--profiles", "60", "--repeats", "1"),
    # the targets: 10k and 100k recorded runs and the default tune, ~3 min; scaled to 300
    "python benchmarks/sim_speed.py --targets": ("--sizes", "1000", "--recorded", "0",
                                                 "--target-requests", "300"),
    # 100k, 1M and 10M requests: an hour; two small sizes show the table
    "python benchmarks/sim_memory.py": ("--sizes", "1000", "5000"),
    # the default tune twice (local, then on a two-node Ray on this machine): ~2 min
    "python benchmarks/ray_sweep.py": ("--args", "--requests 40 --seeds 2 --points 2 --rates 4"),
}
#: Commands that serve on a real vLLM (each server start costs ~1 min of compiling): run by
#: tests/live/test_vllm_real.py with these flags appended.
VLLM_REDUCE: dict[str, tuple[str, ...]] = {
    "spectune record": ("--categories", "extraction", "--limit", "3", "--max-tokens", "24"),
    # two servers: a fixed k and a per-batch-size table (the loop below serves k = 0)
    "spectune validate": ("--rates", "2", "--requests", "3", "--output-tokens", "16",
                          "--policies", "fixed:k=2,batch_adaptive:schedule=[[1,1,3],[2,128,1]]"),
    # k = 0, the recommended k and the tune's table: one to three servers
    "python benchmarks/vllm_loop.py": ("--rates", "2", "--requests", "3", "--output-tokens",
                                       "16", "--seeds", "2", "--ks", "0"),
    # reads the calibrated validation above back (what it served, so the same reduction)
    "python benchmarks/vllm_calibration.py": (
        "--rates", "2", "--requests", "3", "--output-tokens", "16",
        "--policies", "fixed:k=2,batch_adaptive:schedule=[[1,1,3],[2,128,1]]"),
    # the same, then two tunes of those two configurations (plain, calibrated)
    "python benchmarks/vllm_loop_calibrated.py": (
        "--rates", "2", "--requests", "3", "--output-tokens", "16", "--seeds", "2",
        "--policies", "fixed:k=2,batch_adaptive:schedule=[[1,1,3],[2,128,1]]"),
}
#: the README's test-suite line: CI itself, so it is not run here; `.ci/run` must run exactly it
CI_COMMAND = "python -m pytest"


@dataclass(frozen=True)
class Command:
    """One command of the README: where it is, as written (joined, comment stripped)."""

    line: int
    text: str
    comment: str = ""
    inline: bool = False

    def __str__(self) -> str:
        return f"README.md:{self.line}: {self.text}"


def split_comment(line: str) -> tuple[str, str]:
    """(command, comment): a `#` outside quotes, at the start or after a space, starts it."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def readme_commands(text: str) -> list[Command]:
    """The commands of a README in its order: fenced shell lines and prose command spans."""
    found: list[Command] = []
    fence: str | None = None
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else (stripped[3:].strip() or "text")
            continue
        if fence is None:
            for span in CODE_SPAN.findall(raw):
                if INLINE_COMMAND.match(span.strip()):
                    found.append(Command(number, span.strip(), inline=True))
            continue
        if fence not in COMMAND_FENCES:
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        command, comment = split_comment(" ".join(p for p in pending if p))
        pending = []
        if command:
            found.append(Command(start, command, comment))
    return found


def subcommands_named_in_prose(text: str) -> dict[str, int]:
    """{subcommand: first line} of the prose's bare `spectune SUB` spans."""
    named: dict[str, int] = {}
    fence = False
    for number, raw in enumerate(text.splitlines(), 1):
        if raw.strip().startswith("```"):
            fence = not fence
        elif not fence:
            for span in CODE_SPAN.findall(raw):
                if m := INLINE_SUBCOMMAND.match(span.strip()):
                    named.setdefault(m.group(1), number)
    return named


def reduce_key(tokens: list[str], table: dict | None = None) -> str | None:
    """The REDUCE (or `table`) key the command starts with (the longest), or None."""
    words = ["python" if t == "python3" else t for t in tokens]
    keys = [k for k in (REDUCE if table is None else table) if words[:len(k.split())] == k.split()]
    return max(keys, key=len, default=None)


def needs_vllm(tokens: list[str]) -> bool:
    """The command serves on a real vLLM."""
    return option(tokens, "--engine") == "vllm" or any(
        t.endswith(("benchmarks/vllm_loop.py", "benchmarks/vllm_calibration.py",
                    "benchmarks/vllm_loop_calibrated.py"))
        for t in tokens[:2])


def option(tokens: list[str], name: str, default: str | None = None) -> str | None:
    """The value of the last `name VALUE` (or `name=VALUE`) in tokens: argparse's."""
    value = default
    for i, t in enumerate(tokens):
        if t == name and i + 1 < len(tokens):
            value = tokens[i + 1]
        elif t.startswith(name + "="):
            value = t.split("=", 1)[1]
    return value


def wants_cuda(tokens: list[str]) -> bool:
    return (option(tokens, "--device") or "").startswith("cuda")


def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


# -- the parser, on literal cases ----------------------------------------------------------------

def test_the_parser_joins_continuations_and_strips_comments():
    text = ("Run `python benchmarks/x.py --n 2`, then `spectune tune` or `--rates`.\n"
            "```bash\n"
            "spectune tune --a 1 \\\n"
            "              --b '#not a comment'   # a comment\n"
            "\n"
            "spectune report runs/tune#x  # writes report.html\n"
            "```\n"
            "```\n"
            "spectune this-is-output\n"
            "```\n")
    assert readme_commands(text) == [
        Command(1, "python benchmarks/x.py --n 2", inline=True),
        Command(3, "spectune tune --a 1 --b '#not a comment'", "a comment"),
        Command(6, "spectune report runs/tune#x", "writes report.html"),
    ]
    assert subcommands_named_in_prose(text) == {"tune": 1}


def test_reducing_flags_are_found_by_prefix_and_override(tmp_path):
    assert reduce_key(["python3", "benchmarks/sim_speed.py", "--ks", "0"]) == (
        "python benchmarks/sim_speed.py")
    assert reduce_key(["spectune", "tune", "--seeds", "5"]) == "spectune tune"
    tokens = ["spectune", "tune", "--seeds", "5", *REDUCE["spectune tune"]]
    assert option(tokens, "--seeds") == "2"  # the appended flag wins, as in argparse
    assert option(["--out=a", "--out", "b"], "--out") == "b"
    unknown = Command(7, "spectune frobnicate --everything")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)README.md:7: .*add its prefix"):
        run_one(unknown, shlex.split(unknown.text), tmp_path)


def test_the_readme_commands_are_found():
    texts = [c.text for c in COMMANDS]
    assert any(".venv/bin/spectune tune" in t for t in texts)  # the quick start
    assert any(t.startswith("spectune simulate") for t in texts)
    assert not [t for t in texts if t.endswith("\\")]


def test_subcommands_named_in_prose_have_a_command():
    shown = {shlex.split(c.text)[1] for c in COMMANDS
             if not c.inline and c.text.startswith("spectune ")}
    named = subcommands_named_in_prose(README.read_text(encoding="utf-8"))
    missing = {f"README.md:{line}: `spectune {sub}`" for sub, line in named.items()
               if sub not in shown}
    assert not missing, f"the prose names subcommands no fenced command shows: {missing}"


# -- running them ------------------------------------------------------------------------------

#: README line -> outcome, so a failure can say which earlier command failed
OUTCOMES: dict[int, str] = {}


@dataclass
class Ran:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("readme")


def command_env() -> dict[str, str]:
    """This interpreter's bin first on PATH, and no PYTHONPATH: the commands as a user runs them."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def context(command: Command) -> str:
    earlier = [f"  README.md:{line}: {outcome}" for line, outcome in OUTCOMES.items()
               if line < command.line and outcome == "failed"]
    return ("\nearlier README commands that failed (this one may need what they write):\n"
            + "\n".join(earlier)) if earlier else ""


def run(command: Command, argv: list[str], cwd: Path, expect: int = 0) -> Ran:
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, cwd=cwd, env=command_env(), capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{command}\nran as: {shlex.join(argv)}\ndid not finish in {TIMEOUT_S} s: "
                    f"reduce it further in REDUCE\nstderr: {(exc.stderr or b'')[-2000:]!r}")
    ran = Ran(argv, done.returncode, done.stdout, done.stderr, time.perf_counter() - started)
    print(f"{ran.seconds:6.1f} s  {shlex.join(argv)}")
    tail = "\n".join(done.stderr.strip().splitlines()[-15:])
    where = f"{command}\nran as: {shlex.join(argv)}\n"
    assert done.returncode == expect, (
        f"{where}exit code {done.returncode}, expected {expect}; stderr ends:\n{tail}"
        f"{context(command)}")
    for stream, name in ((done.stderr, "stderr"), (done.stdout, "stdout")):
        assert "Traceback" not in stream, f"{where}a traceback on {name}:\n{stream[-3000:]}"
    return ran


def as_argv(tokens: list[str]) -> list[str]:
    """How the test runs a README command's words: this interpreter, the checkout's scripts."""
    if tokens[0] == "spectune":
        return [sys.executable, "-m", "spectune", *tokens[1:]]
    if tokens[0] in ("python", "python3") and tokens[1].endswith(".py"):
        return [sys.executable, str(ROOT / tokens[1]), *tokens[2:]]
    raise AssertionError(f"no way to run {tokens[0]!r}: teach as_argv")


def check_outputs(command: Command, tokens: list[str], ran: Ran, cwd: Path, since: float) -> None:
    """What the command says it writes is there."""
    where = f"{command}\nran as: {shlex.join(ran.argv)}\n"
    if option(tokens, "--format") == "json":
        try:
            json.loads(ran.stdout)
        except ValueError as exc:
            pytest.fail(f"{where}--format json printed no JSON ({exc}):\n{ran.stdout[:2000]}")
    sub = tokens[1] if tokens[0] == "spectune" else None
    out = option(tokens, "--out", {"tune": "runs/tune", "plan": "runs/plan",
                                   "validate": "runs/validate"}.get(sub or ""))
    if sub == "report":
        rest = tokens[2:]
        folder = next(t for i, t in enumerate(rest) if not t.startswith("-")
                      and (i == 0 or rest[i - 1] not in ("--out", "--title")))
        page = cwd / (option(tokens, "--out") or f"{folder}/report.html")
        assert page.is_file() and page.stat().st_mtime >= since - 1, f"{where}wrote no {page}"
        return
    if out is None:
        return
    folder = cwd / out
    assert folder.is_dir() and any(p.is_file() for p in folder.rglob("*")), (
        f"{where}--out {out} holds no file")
    written = {"tune": "tune.json", "plan": "plan.json", "validate": "validate.json"}.get(sub or "")
    if written:
        assert (folder / written).is_file(), f"{where}wrote no {out}/{written}"
    if m := re.search(r"\bwrites\s+(.*)", command.comment):
        for name in re.findall(r"[\w.-]+\.\w+", m.group(1)):
            assert (folder / name).is_file(), (
                f"{where}the README says it writes {name}: not in {out}")
    if sub == "tune" and option(tokens, "--format", "table") == "table":
        assert "recommended" in ran.stdout, f"{where}printed no recommendation:\n{ran.stdout}"


def run_one(command: Command, tokens: list[str], cwd: Path) -> None:
    """A single README command: reduced, run, its outputs checked."""
    key = reduce_key(tokens)
    if key is None:
        pytest.fail(f"{command}\nis a command no entry of REDUCE in {Path(__file__).name} covers: "
                    "add its prefix with the flags that make it fast (an empty tuple if it is "
                    "fast as written); never skip it")
    if wants_cuda(tokens) and not cuda_available():
        # Not runnable here: the README shows it for a GPU. What it must do is say so, in one line.
        ran = run(command, as_argv(tokens), cwd, expect=2)
        lines = ran.stderr.strip().splitlines()
        assert len(lines) == 1 and "cuda" in lines[0].lower(), (
            f"{command}\nwithout CUDA: expected one line naming cuda, got:\n{ran.stderr}")
        return
    since = time.time()
    full = tokens + list(REDUCE[key])
    ran = run(command, as_argv(full), cwd)
    check_outputs(command, full, ran, cwd, since)


def run_installed(command: Command, tokens: list[str]) -> None:
    """`pip install ...`: not rerun (CI's install covers it); what it installs is here."""
    problems = []
    args = tokens[2:]
    for i, arg in enumerate(args):
        if arg.startswith("-") or (i and args[i - 1] in ("-r", "-c", "--index-url")):
            continue
        if m := re.fullmatch(r"\.(?:\[([\w,-]+)\])?", arg):  # the checkout, with extras
            extras = set((m.group(1) or "").split(",")) - {""}
            wanted = [r for r in importlib.metadata.requires("spectune") or []
                      if (e := re.search(r"extra\s*==\s*['\"]([\w-]+)['\"]", r))
                      and e.group(1) in extras]
            requirements = ["spectune"] + [r.split(";")[0].strip() for r in wanted]
        else:
            requirements = [arg]
        for requirement in requirements:
            m = re.match(r"([\w.-]+)(?:\[[^\]]*\])?\s*(?:==\s*([^\s;,]+))?", requirement)
            name, pinned = m.group(1), m.group(2)
            try:
                have = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                problems.append(f"{name} is not installed")
                continue
            if pinned and have != pinned and have.split("+")[0] != pinned:
                problems.append(f"{name} {have} is installed, the line pins {pinned}")
    assert not problems, f"{command}\n" + "\n".join(problems)


def run_quick_start(command: Command, cwd: Path) -> None:
    """`python3 -m venv DIR && DIR/bin/pip install ... -e . && DIR/bin/spectune tune`, for real:
    the checkout installed from the package index without extras runs the main job."""
    venv = None
    for part in command.text.split("&&"):
        tokens = shlex.split(part)
        program = Path(tokens[0]).name
        if tokens[:3] == ["python3", "-m", "venv"]:
            venv = cwd / tokens[3]
            run(command, tokens, cwd)
        elif program == "pip" and tokens[1] == "install":
            argv = [str(cwd / tokens[0])] + [
                re.sub(r"^\.(?=$|\[)", str(ROOT), t) for t in tokens[1:]]
            ran = run(command, argv, cwd)
            print(f"quick start: the fresh install took {ran.seconds:.0f} s")
        elif program == "spectune":
            key = reduce_key(["spectune", *tokens[1:]])
            assert key is not None, f"{command}\nno REDUCE entry for {shlex.join(tokens)}"
            full = tokens + list(REDUCE[key])
            since = time.time()
            ran = run(command, [str(cwd / tokens[0]), *full[1:]], cwd)
            check_outputs(command, ["spectune", *full[1:]], ran, cwd, since)
        else:
            pytest.fail(f"{command}\nthe quick start has a step the test does not know: {part!r}")
    assert venv is not None, f"{command}\nmade no virtual environment"
    probe = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import importlib.util; print(importlib.util.find_spec('torch'))"],
                           cwd=cwd, env=command_env(), capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "None", (
        f"{command}\nthe quick start's environment has torch: {probe.stdout.strip()}")


def check_ci_runs_it(command: Command) -> None:
    """The test-suite line is what CI runs: `.ci/run` must hold exactly that command (running it
    here would run this test inside itself)."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    ci = [line.strip() for line in lines if CI_COMMAND in line]
    assert ci == [command.text], (
        f"{command}\n.ci/run must run exactly the README's test command; it runs {ci}")


def case_id(command: Command) -> str:
    return f"L{command.line}:" + re.sub(r"[^\w.:=,@/+-]+", "_", command.text[:50]).strip("_")


@pytest.mark.parametrize("command", COMMANDS, ids=case_id)
def test_readme_command_runs(command: Command, workdir: Path) -> None:
    OUTCOMES[command.line] = "failed"
    if CI_COMMAND in command.text:
        check_ci_runs_it(command)
    elif "&&" in command.text:
        if not command.text.startswith("python3 -m venv "):
            pytest.fail(f"{command}\nis a chain of commands the test does not know: teach it "
                        "(run_quick_start shows how)")
        run_quick_start(command, workdir)
    else:
        tokens = shlex.split(command.text)
        if tokens[:2] == ["pip", "install"]:
            run_installed(command, tokens)
        elif needs_vllm(tokens):
            assert reduce_key(tokens, VLLM_REDUCE) is not None, (
                f"{command}\nserves on vLLM: add its prefix to VLLM_REDUCE (tests/live/"
                "test_vllm_real.py runs it)")
        else:
            run_one(command, tokens, workdir)
    OUTCOMES[command.line] = "passed"
