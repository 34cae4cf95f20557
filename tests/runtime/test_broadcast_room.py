"""A broadcast too large for Spark's driver is refused with the memory that fits it (the numbers
worked by hand from ``check_broadcast``'s rule: the bytes plus Spark's 300 MiB reserve, a quarter
more, rounded up to whole GiB)."""

import pytest

from prepared.errors import UsageError
from runtime.spark import SPARK_RESERVED, check_broadcast

MIB, GIB = 1 << 20, 1 << 30


def test_what_fits_the_heap_passes():
    # measured: a 1 GiB heap broadcast 700 MB (667 MiB) of bytes and failed at 850 MB (811 MiB)
    check_broadcast(700 * 10**6, GIB - SPARK_RESERVED, "w")
    check_broadcast(GIB - SPARK_RESERVED, GIB - SPARK_RESERVED, "w")


def test_what_does_not_names_the_memory_that_would():
    with pytest.raises(UsageError) as e:
        check_broadcast(850 * 10**6, GIB - SPARK_RESERVED, "--model m's weights")
    # (810.6 + 300) MiB x 1.25 = 1388 MiB: 2 GiB
    assert str(e.value) == ("--model m's weights are 0.79 GiB, more than Spark's driver can "
                            "broadcast with its 1.0 GiB heap: give it --driver-memory 2g "
                            "(spark-submit; on a cluster --executor-memory 2g too), or "
                            "SPARK_DRIVER_MEMORY=2g under plain python")
    with pytest.raises(UsageError, match="--driver-memory 2g"):  # Gowalla's 3-member ensemble
        check_broadcast(1_066_342_195, GIB - SPARK_RESERVED, "w")  # (1017 + 300) x 1.25 = 1646 MiB: 2 GiB
