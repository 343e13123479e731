"""Plain helpers shared by the tests (fixtures live in conftest.py): `from helpers import ...`."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def subprocess_env() -> dict[str, str]:
    """Environment for `python -m sweeper...` subprocesses run outside the repository root."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_group(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM a process started with start_new_session=True and its children; SIGKILL after `timeout` s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_until_up(uri: str, proc: subprocess.Popen, log: Path, seconds: float) -> None:
    """Wait until the MLflow server `proc` at `uri` answers /health; its `log` is in the error if it does not."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"mlflow server at {uri} did not answer within {seconds} s:\n{log.read_text()[-3000:]}")


# README's code blocks (tests/test_docs.py explains the `<!-- runnable -->` markers).
@dataclass
class Block:
    line: int           # 1-based line of the opening fence
    text: str
    runnable: bool
    smoke: list[str]


def blocks(lang: str = "bash") -> list[Block]:
    lines = README.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == f"```{lang}":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            marker = lines[i - 1].strip() if i else ""
            runnable = re.fullmatch(r"<!-- runnable( smoke=\"[^\"]*\")? -->", marker) is not None
            smoke = re.search(r'smoke="([^"]*)"', marker)
            out.append(Block(i + 1, "\n".join(lines[i + 1:end]), runnable, smoke.group(1).split() if smoke else []))
            i = end
        i += 1
    return out


def commands(text: str) -> list[list[str]]:
    """Shell commands of a block: continuation lines joined, comments and heredoc bodies dropped."""
    text = re.sub(r"<<'EOF'\n.*?\nEOF", "", text, flags=re.S).replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            words = shlex.split(line)
            cuts = [-1] + [i for i, w in enumerate(words) if w == "&&"] + [len(words)]
            out += [words[a + 1:b] for a, b in zip(cuts, cuts[1:])]
            # a command quoted inside another (`ray exec CLUSTER "cd /app && python -m ..."`)
            out += [c for w in words if " " in w and "python -m" in w for c in commands(w)]
            # the entrypoint of a Ray job (`ray job submit --address URL -- python -m ...`)
            if words[:3] == ["ray", "job", "submit"] and "--" in words:
                out.append(words[words.index("--") + 1:])
    return out
