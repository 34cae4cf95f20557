"""``make test``: the suite as two pytest processes side by side, one per core.

The services tier (``-m session``, marked by tests/conftest.py: every test of the session's Spark
session or stack, and every Spark test) is almost all of the suite's time and uses the services
one at a time, so it runs alone in one process, streamed as usual. The rest (the numpy/torch
tests, about 1.5 of its 17 minutes, and the Ray tests that start a stack of their own) runs
beside it in a second process whose report is printed when both have ended. A run given its own
``-m`` is one plain pytest process, as before.

pytest-xdist's ``--dist loadgroup`` would do the same in one report, but it stopped grouping
under pytest 9.2 (pytest-dev/pytest-xdist#1386): both workers then started a Spark session and
a stack."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICES = "session"
REST = "not session"


def plain(args: list[str]) -> bool:
    """Whether the caller chose the tiers themselves (a marker expression of their own)."""
    return any(a.startswith("-m") for a in args)


def rest_args(args: list[str]) -> list[str]:
    """``args`` for the second process: its own cache folder (the two --lf records apart) and
    its own JUnit file beside the one asked for (``X.xml`` -> ``X-rest.xml``)."""
    def beside(path: str) -> str:
        p = Path(path)
        return str(p.with_name(f"{p.stem}-rest{p.suffix}"))

    out, flags = ["-o", "cache_dir=.pytest_cache/rest"], ("--junitxml", "--junit-xml")
    for i, a in enumerate(args):
        flag, eq, value = a.partition("=")
        if eq and flag in flags:          # --junitxml=PATH
            a = f"{flag}={beside(value)}"
        elif i and args[i - 1] in flags:  # --junitxml PATH
            a = beside(a)
        out.append(a)
    return out


def pytest(marks: str, args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pytest", "-m", marks, *args], cwd=ROOT, **kw)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if plain(args):
        return subprocess.call([sys.executable, "-m", "pytest", *args], cwd=ROOT)
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        rest = pytest(REST, rest_args(args), stdout=log, stderr=subprocess.STDOUT)
        print(f"tests: the services tier here; the rest ({REST}) beside it, reported at the end",
              flush=True)
        services = pytest(SERVICES, args).wait()
        code = rest.wait()
        log.seek(0)
        print(f"\n==== the rest of the suite (-m '{REST}'), run beside the services tier ====")
        print(log.read(), end="", flush=True)
    took, result = time.monotonic() - start, combined(services, code)
    print(f"\ntests {'passed' if result == 0 else 'FAILED'}: services tier exit {services}, "
          f"the rest exit {code}; {took:.0f} s ({took / 60:.1f} min) for both", flush=True)
    return result


def combined(*codes: int) -> int:
    """One exit code for the tiers' pytest codes: the worst, where 5 (nothing collected: a -k
    that only one tier matches) counts only when no tier collected anything."""
    ran = [c for c in codes if c != 5]
    return max(ran) if ran else 5


if __name__ == "__main__":
    sys.exit(main())
