"""runtime.machine: the CPU every timing records, read from /proc/cpuinfo."""

import numpy  # noqa: F401  (its BLAS loaded for blas())

from runtime.machine import blas, cpu, describe_cpu

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512vl avx512_bf16 avx512_vnni
processor\t: 1
cpu family\t: 99
model name\t: another
flags\t\t: sse2
"""


def test_the_first_cpus_model_family_and_vector_flags_in_a_fixed_order(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text(ZEN4)
    info = cpu(str(f))
    assert info["model"] == "AMD EPYC" and info["family"] == "25/17" and info["vendor"] == "AMD"
    assert info["flags"] == ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                             "avx512_bf16"]
    assert describe_cpu(info).startswith("AMD EPYC (family/model 25/17), ")
    assert describe_cpu(info).endswith("flags avx2 fma avx512f avx512bw avx512vl avx512_vnni "
                                       "avx512_bf16")


def test_without_cpuinfo_the_model_is_still_named(tmp_path):
    info = cpu(str(tmp_path / "missing"))
    assert info["model"] and info["flags"] == [] and info["family"] == "" and info["vendor"] == ""
    assert "flags none" in describe_cpu(info)


def test_an_unknown_vendor_id_is_kept_as_written(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text(ZEN4.replace("AuthenticAMD", "HygonGenuine").replace("99", "24"))
    assert cpu(str(f))["vendor"] == "HygonGenuine"
    f.write_text(ZEN4.replace("AuthenticAMD", "GenuineIntel"))
    assert cpu(str(f))["vendor"] == "Intel"


def test_blas_names_every_blas_loaded_its_kernels_and_what_pinned_them():
    from threadpoolctl import threadpool_info
    libs = [i for i in threadpool_info() if i["user_api"] == "blas"]  # numpy's, scipy's, ...
    plain = blas({})
    assert libs and ";" not in plain
    for lib in libs:
        arch = f" ({lib['architecture']})" if lib.get("architecture") else ""
        assert f"{lib['internal_api']} {lib['version']}{arch}" in plain.split(", ")
    pinned = blas({"OPENBLAS_CORETYPE": "Haswell", "MKL_CBWR": "", "OTHER": "x"})
    assert pinned == plain + "; OPENBLAS_CORETYPE=Haswell"  # set and empty: only the set one
