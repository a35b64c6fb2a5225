"""Every command of README.md runs on a fresh machine after the Quickstart's install: the
commands of its ``bash`` blocks, in order, in one empty temporary folder (the demo's files are
there for the simulator's command), with this test's interpreter and this copy of tritondtr.
Nothing may refer to ``../shared``, which a fresh machine lacks."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import tritondtr

ROOT = Path(__file__).resolve().parents[1]

# Commands not run, each with the reason.
SKIPPED = {
    "pip": "installs packages: the test runs in the environment already installed",
    "pytest": "the test suite itself, which is running now",
}


def readme_commands(text: str) -> list[str]:
    """The commands of the ``bash`` blocks, in order: continuation lines joined, comments
    dropped, ``a && b`` split into ``a`` and ``b``."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                if part.strip() and not part.strip().startswith("#"):
                    commands.append(part.strip())
    return commands


def argv_of(command: str) -> tuple[list[str] | None, str]:
    """(argv with this interpreter, "") or (None, why it is skipped)."""
    words = shlex.split(command, comments=True)
    if words[0] in ("python", "python3"):
        words = [sys.executable, *words[1:]]
    elif words[0] == "tritondtr":
        words = [sys.executable, "-m", "tritondtr", *words[1:]]
    else:
        raise AssertionError(
            f"README command {command!r} starts with {words[0]!r}: the test runs python3 and "
            "tritondtr commands only; map the new program in tests/test_readme.py"
        )
    module = words[2] if words[1:2] == ["-m"] else None
    if module in SKIPPED:
        return None, SKIPPED[module]
    return words, ""


def test_readme_parser_splits_chains_and_skips_installs():
    text = "```bash\npython3 -m pip install -e . && python3 -m tritondtr demo --out x  # c\n```\n"
    cmds = readme_commands(text)
    assert cmds == ["python3 -m pip install -e .", "python3 -m tritondtr demo --out x  # c"]
    assert argv_of(cmds[0]) == (None, SKIPPED["pip"])
    assert argv_of(cmds[1]) == ([sys.executable, "-m", "tritondtr", "demo", "--out", "x"], "")


@pytest.mark.slow  # ~80 s: the demo at its defaults (tests/app/test_demo.py runs it small)
def test_every_readme_command_runs_in_an_empty_folder(tmp_path):
    commands = readme_commands((ROOT / "README.md").read_text())
    assert not [c for c in commands if "../shared" in c], "README commands need ../shared"
    env = dict(os.environ)
    here = str(Path(tritondtr.__file__).resolve().parents[1])  # this copy, not another install
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
    env["OMP_NUM_THREADS"] = "1"
    ran, skipped = [], []
    for command in commands:
        argv, why = argv_of(command)
        if argv is None:
            skipped.append((command, why))
            continue
        p = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, (
            f"{command!r} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        )
        ran.append(argv[1:4])
    assert all(re.search(r"-m (pip install|pytest)", c) for c, _ in skipped), skipped
    assert ["-m", "tritondtr", "demo"] in ran and ["-m", "tritondtr", "simulate"] in ran
    assert (tmp_path / "out/demo/trace.npz").is_file()
    assert (tmp_path / "out/sim/results.csv").is_file()
