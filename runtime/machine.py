"""The CPU a timing belongs to: hosts change under the same name (a 'vm' has been an AVX2 and an
AVX-512 EPYC), so every result records the model and the vector instructions it had."""

from __future__ import annotations

import os
import platform

# the flags that decide which kernels run (fp32 FMA width, bf16 and int8 dot products, AMX)
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                "avx512_fp16", "amx_bf16", "amx_tile", "asimd", "sve")


VENDORS = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}


def cpu(cpuinfo: str = "/proc/cpuinfo") -> dict:
    """{"vendor", "model", "family", "cores", "flags"} from /proc/cpuinfo: ``vendor`` AMD, Intel or
    the vendor id as written; ``family`` the "cpu family/model" numbers, which tell Zen 3 from
    Zen 4 where a VM names both "AMD EPYC"; ``flags`` the vector flags of ``VECTOR_FLAGS``
    present, in that order. The model falls back to ``platform.processor()``."""
    vendor, model, family, number, flags = "", "", "", "", set()
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id" and not vendor:
                    vendor = VENDORS.get(value.strip(), value.strip())
                elif key == "model name" and not model:
                    model = value.strip()
                elif key == "cpu family" and not family:
                    family = value.strip()
                elif key == "model" and not number:
                    number = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {"vendor": vendor, "model": model or platform.processor() or "unknown",
            "family": f"{family}/{number}" if family else "", "cores": os.cpu_count(),
            "flags": [f for f in VECTOR_FLAGS if f in flags]}


def describe_cpu(info: dict | None = None) -> str:
    """One line: model, cores, vector flags."""
    info = info or cpu()
    family = f" (family/model {info['family']})" if info.get("family") else ""
    return (f"{info['model']}{family}, {info['cores']} cores, "
            f"flags {' '.join(info['flags']) or 'none'}")


# the environment variables that pick a BLAS library's kernels or threads behind its back
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")


def blas(env: dict | None = None) -> str:
    """The BLAS libraries loaded in this process with the kernels they picked (threadpoolctl's
    'architecture'), and the variables that pinned them: ``OPENBLAS_CORETYPE=Haswell``, set on
    some hosts, holds numpy's OpenBLAS to its AVX2 kernels on an AVX-512 CPU (on a Zen 5, scoring's
    product ran at 100 GFLOP/s a core where OpenBLAS's own choice, SkylakeX, ran 171)."""
    from threadpoolctl import threadpool_info

    env = os.environ if env is None else env
    libs = sorted({f"{i.get('internal_api')} {i.get('version') or ''}".strip()
                   + (f" ({i['architecture']})" if i.get("architecture") else "")
                   for i in threadpool_info() if i.get("user_api") == "blas"})
    pinned = [f"{k}={env[k]}" for k in BLAS_ENV if env.get(k)]
    return (", ".join(libs) or "no BLAS loaded") + (f"; {' '.join(pinned)}" if pinned else "")
