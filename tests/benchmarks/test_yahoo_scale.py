"""benchmarks/yahoo_scale.py's reading of the stages' own log lines (no pipeline runs): the steps
the report lists beside each stage's floor."""

from benchmarks.yahoo_scale import stage_phases


def test_the_etl_steps_and_the_evaluation_phases_are_read_from_their_log_lines():
    assert stage_phases("   11:18:20 [etl] dedup           57.0s  rows=48,728,401, "
                        "duplicates=0") == {"dedup": 57.0}
    assert stage_phases("11:18:32 [etl] items            2.1s  items=44,865") == {"items": 2.1}
    # the ETL's closing line is its total, not a step; other stages' lines name no step
    assert stage_phases("11:19:20 [etl] wrote /tmp/x in 120.3s: 1,876,280 users") == {}
    assert stage_phases("11:20:00 [training] epoch 1 took 97.0s") == {}
    line = ('11:26:18 [evaluation] evaluation phase seconds: {"start": 0.49, '
            '"per-user metrics": 29.96, "logging to MLflow": 2.33}')
    assert stage_phases(line) == {"start": 0.49, "per-user metrics": 29.96,
                                  "logging to MLflow": 2.33}
