"""bench/airflow_parse.py's headline reads the real ``airflow dag-processor``'s own
"DAG File Processing Stats": the parser on a captured log of a real run
(``dag_processor_stats.log``: Airflow 3.3.2, a 50-task AppDefOperator file, a 50-task
BashOperator file and a file that raises, ``--num-runs 4``, machine paths replaced), and
one real dag-processor run of a tiny dags folder.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import airflow_parse  # noqa: E402

SAMPLE = (Path(__file__).resolve().parent / "dag_processor_stats.log").read_text()


def without(text: str, name: str) -> str:
    return "\n".join(line for line in text.splitlines() if name not in line)


def test_each_parse_counts_once_with_its_last_duration() -> None:
    # 8 tables, each repeating the files' last parse until the next one: 3 parses per file were logged
    assert SAMPLE.count(airflow_parse.STATS_TITLE) == 8
    parsed = airflow_parse.parse_stats_tables(without(SAMPLE, "broken.py"))
    assert parsed == {"appdef_builtin_50.py": [0.5, 0.29, 0.13], "bash_50.py": [0.19, 0.27, 0.1]}


def test_colours_do_not_move_the_columns() -> None:
    coloured = without(SAMPLE, "broken.py").replace(
        "DAG File Processing Stats", "\x1b[1mDAG File Processing Stats\x1b[0m"
    )
    assert airflow_parse.parse_stats_tables(coloured)["bash_50.py"] == [0.19, 0.27, 0.1]


def test_a_file_with_import_errors_is_named_not_timed() -> None:
    with pytest.raises(ValueError, match=r"broken\.py: the dag-processor reports 0 DAG\(s\) and 1 import error"):
        airflow_parse.parse_stats_tables(SAMPLE)


def test_a_table_without_the_duration_column_is_an_error_naming_it() -> None:
    renamed = without(SAMPLE, "broken.py").replace("Last Duration", "Last Runtime   ")
    with pytest.raises(ValueError, match=r"without column\(s\) \['Last Duration'\]"):
        airflow_parse.parse_stats_tables(renamed)


def test_the_headline_section_is_replaced_and_the_rest_kept() -> None:
    old = airflow_parse.TITLE + airflow_parse.OLD_FORK_TITLE + "\n\nfork rows\n\n## Whole process\n\nwhole rows\n"
    first = airflow_parse.splice_headline(old, [airflow_parse.DP_TITLE, "", "run 1", ""])
    assert first.index(airflow_parse.DP_TITLE) < first.index(airflow_parse.FORK_TITLE) < first.index("whole rows")
    assert airflow_parse.OLD_FORK_TITLE not in first
    second = airflow_parse.splice_headline(first, [airflow_parse.DP_TITLE, "", "run 2", ""])
    assert "run 2" in second and "run 1" not in second
    assert second.count(airflow_parse.DP_TITLE) == 1 and "fork rows" in second and "whole rows" in second


@pytest.mark.slow
def test_a_real_dag_processor_run_gives_every_file_its_reparse_durations(tmp_path: Path) -> None:
    env = airflow_parse.env_for(tmp_path, tmp_path)
    subprocess.run([str(airflow_parse.BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True)
    files = {
        "bash_3.py": airflow_parse.fork_dag(airflow_parse.PEER, 3),
        "appdef_builtin_3.py": airflow_parse.fork_dag(airflow_parse.BUILTIN, 3),
    }
    parsed = airflow_parse.run_dag_processor(tmp_path, files, loops=2)
    assert set(parsed) == set(files)
    for name, durations in parsed.items():
        # --num-runs 4: the first parse dropped, the last one logged only if a table came before the exit
        assert 1 <= len(durations) <= 3, (name, durations)
        assert all(0 < d < 120 for d in durations), (name, durations)
