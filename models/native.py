"""A small C source compiled for this CPU at first use and loaded with ctypes: the kernels that no
library the project depends on has (scoring's streaming top-k, ``models/stream_topk.py``) and the
peak benchmark's FMA loops (``benchmarks/peak.py``).

Why not a compiled extension: a wheel's code is built for a generic x86-64, while these loops
exist to use what this CPU has (AVX-512 compares, AVX512_BF16), and ``-march=native`` can only be
decided on the machine that runs them. The build takes well under a second; a library is built
once per source, flags, compiler and CPU and kept in a cache folder (``NCE_NATIVE_CACHE``, else
a private folder of this user's under the temporary folder: ``cache_folder``), so a shared
cache keeps one per kind of node. It is compiled to a temporary name and renamed
into place: processes building at once (Spark's tasks) never load a half-written file.

Without a C compiler, or where the build fails, ``build`` says why and the callers keep their
pure-torch path: nothing depends on a compiler being there."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CACHE_ENV = "NCE_NATIVE_CACHE"
FLAGS = ("-O2", "-march=native", "-shared", "-fPIC")


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def cpu_key() -> str:
    """What ``-march=native`` depends on: the CPU's model name and flags (Linux's cpuinfo; the
    platform's machine name elsewhere)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform
        return platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part")
    seen = {}
    for line in lines:
        name = line.split(":", 1)[0].strip()
        if name in wanted and name not in seen:
            seen[name] = line
    return "\n".join(seen.values())


def cache_folder() -> Path:
    """Where built libraries are kept: ``NCE_NATIVE_CACHE``, else a folder of this user's in the
    temporary folder (not the home: a run writes nothing there). A library found there is loaded
    into the process, so the folder must be this user's alone: created 0700, and one that is
    someone else's or writable by others is not used (a fresh private folder is made instead)."""
    pinned = os.environ.get(CACHE_ENV)
    if pinned:
        Path(pinned).mkdir(parents=True, exist_ok=True)
        return Path(pinned)
    where = Path(tempfile.gettempdir()) / f"nce-autorec-native-{os.getuid()}"
    try:
        where.mkdir(mode=0o700, exist_ok=True)
        st = where.lstat()
        if where.is_dir() and not where.is_symlink() and st.st_uid == os.getuid() \
                and not st.st_mode & 0o022:
            return where
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="nce-autorec-native-"))


def build(name: str, source: str, folder: str | None = None,
          flags: tuple[str, ...] = FLAGS) -> tuple[str | None, str]:
    """(path of the library built from ``source``, the compile command) or (None, why not)."""
    cc = compiler()
    if cc is None:
        return None, "no C compiler (cc, gcc or clang) on PATH"
    key = hashlib.sha256("\0".join([source, " ".join(flags), cc, cpu_key()]).encode())
    where = Path(folder) if folder else cache_folder()
    where.mkdir(parents=True, exist_ok=True)
    lib = where / f"{name}-{key.hexdigest()[:16]}.so"
    how = " ".join([Path(cc).name, *flags])
    if lib.exists():
        return str(lib), how
    with tempfile.TemporaryDirectory(dir=where, prefix=f".{name}-") as tmp:
        src, out = Path(tmp) / f"{name}.c", Path(tmp) / f"{name}.so"
        src.write_text(source)
        cmd = [cc, *flags, "-o", str(out), str(src)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            return None, f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}"
        os.replace(out, lib)  # atomic: a reader sees no library or the whole one
    return str(lib), how


def load(path: str, signatures: dict[str, tuple]) -> ctypes.CDLL:
    """The library at ``path`` with each function's (restype, argtypes) set."""
    lib = ctypes.CDLL(path)
    for fn, (restype, argtypes) in signatures.items():
        getattr(lib, fn).restype, getattr(lib, fn).argtypes = restype, list(argtypes)
    return lib
