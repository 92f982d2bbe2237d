"""``python -m tools.soak --hang-timeout S``: every agent of the campaign runs with
``--hang-timeout S``, the injected hang (``stop``) is expected to be ended by it, and its
stops are counted (a stop outside ``stop`` is a false positive the summary names)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.soak import __main__ as soak_main  # noqa: E402
from tools.soak import campaign, faults  # noqa: E402


def test_off_by_default_the_campaign_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.HANG_ENV, raising=False)
    assert "TORCHSTEP_HANG_TIMEOUT" not in faults.tail_env("none")
    assert faults.timeout_of("stop") == faults.STOP_TIMEOUT_S
    assert campaign.expect_of("local", "stop") == faults.FAULTS["stop"][1]


def test_on_every_run_gets_it_and_stop_is_ended_by_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.HANG_ENV, "20")
    for fault in ("none", "cancel", "rdzv_stall"):
        assert faults.tail_env(fault)["TORCHSTEP_HANG_TIMEOUT"] == "20", fault
    assert faults.tail_env("cancel")["SOAK_TAIL_S"] == "60"  # the fault's own variables stay
    # the stopped rank: the hang stop (20 s), not the run's short timeout, ends it; it restarts
    assert faults.timeout_of("stop") == faults.RUN_TIMEOUT_S
    expect = campaign.expect_of("local", "stop")
    assert (expect.state, expect.exit_code) == ("SUCCEEDED", 0) and "--hang-timeout" in expect.guarantee


def test_hang_stops_are_counted_from_the_result_or_the_agents_lines() -> None:
    hung = {"replicas": [{"ranks": [{"reason": "hang_timeout"}, {"reason": "stopped"}]}, {"ranks": []}]}
    restarted = {"replicas": [{"ranks": [{"reason": None}], "message": "attempt 0: rank 0 hang_timeout (SIGKILL): …"}]}
    assert faults.hang_stops(hung) == 1 and faults.hang_stops(restarted) == 1
    assert faults.hang_stops({"replicas": [{"ranks": [{"reason": "timeout"}]}]}) == 0 and faults.hang_stops(None) == 0
    line = "[torchstep-agent …] where the ranks were (no progress for 20.1s (--hang-timeout 20s); 0.1s): …\n"
    assert faults.hang_stops(None, line * 2) == 2


def test_a_negative_hang_timeout_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        soak_main.main(["--hang-timeout", "-1", "--replay", "local:none:1"])
    assert e.value.code == 2 and "--hang-timeout must be > 0 seconds" in capsys.readouterr().err
