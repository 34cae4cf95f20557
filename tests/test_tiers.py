"""tests/tiers.py, ``make test``'s two processes: which arguments each gets, and one exit code."""

from tests.tiers import REST, SERVICES, combined, plain, rest_args


def test_every_test_is_in_exactly_one_tier_whatever_its_markers():
    from itertools import combinations

    from _pytest.mark.expression import Expression

    tiers = [Expression.compile(SERVICES), Expression.compile(REST)]
    names = ("session", "spark", "ray", "slow")
    for n in range(len(names) + 1):
        for marks in combinations(names, n):
            hits = [t.evaluate(lambda name, marks=marks, **kw: name in marks) for t in tiers]
            assert hits.count(True) == 1, (marks, hits)


def test_a_marker_expression_of_the_callers_runs_one_plain_pytest():
    assert plain(["-m", "spark"]) and plain(["-mspark"]) and plain(["-q", "-m", "not slow"])
    assert not plain(["-q", "-k", "etl"]) and not plain([])


def test_the_second_process_keeps_its_cache_and_junit_file_apart():
    args = ["-q", "--junitxml=out/a.xml", "--junit-xml", "b.xml", "-k", "x"]
    assert rest_args(args) == ["-o", "cache_dir=.pytest_cache/rest", "-q",
                               "--junitxml=out/a-rest.xml", "--junit-xml", "b-rest.xml",
                               "-k", "x"]


def test_one_exit_code_the_worst_and_nothing_collected_only_when_neither_ran():
    assert combined(0, 0) == 0 and combined(0, 1) == 1 and combined(2, 1) == 2
    assert combined(0, 5) == 0 and combined(5, 1) == 1 and combined(5, 5) == 5


def test_a_standalone_spark_test_runs_beside_the_services_tier_and_not_in_the_fast_one():
    import subprocess
    import sys

    from tests.tiers import ROOT

    def collected(marks: str) -> list[str]:
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                              "no:cacheprovider", "-m", marks, "tests/infra/test_package.py"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        return [line for line in out.stdout.splitlines() if "::" in line]

    # its own spark-submit JVM, no session fixture: the second process, with the rest
    assert len(collected(REST)) == 2 and collected(SERVICES) == []
    assert collected("not spark and not ray and not slow") == []  # make test-fast leaves it out
