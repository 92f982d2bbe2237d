"""torchstep.agent.store_move's rules without processes: who may move the store, and which
survivor hosts the new one (every survivor must pick the same)."""

from __future__ import annotations

from dataclasses import dataclass

from torchstep.agent.store_move import choose_successor, enabled


@dataclass(frozen=True)
class Node:
    addr: str
    pid: int = 1


A, B, C = Node("10.0.0.1"), Node("10.0.0.2"), Node("10.0.0.3")
RANKS = {A: 0, B: 1, C: 2}


def test_the_option_is_off_unless_asked_and_never_for_a_fixed_size() -> None:
    assert not enabled({}, min_nodes=1, max_nodes=3)
    assert not enabled({"store_takeover": "off"}, min_nodes=1, max_nodes=3)
    assert enabled({"store_takeover": "on"}, min_nodes=1, max_nodes=3)
    assert enabled({"store_takeover": " True "}, min_nodes=2, max_nodes=3)
    # a fixed --nnodes cannot form again at another size: it fails fast instead
    assert not enabled({"store_takeover": "on"}, min_nodes=3, max_nodes=3)


def test_every_survivor_picks_the_lowest_rank_off_the_lost_stores_host() -> None:
    alive = {A: "gone", B: "alive", C: "alive"}
    for me in (B, C):  # both survivors agree
        assert choose_successor(RANKS, me, alive.__getitem__, store_host={"10.0.0.1"}) == B


def test_the_stores_host_is_passed_over_even_when_its_probe_port_is_unknown() -> None:
    # the store was lost right after the round formed: nobody learnt A's probe port yet
    assert choose_successor(RANKS, C, lambda n: "unknown", store_host={"host-a", "10.0.0.1"}) == B


def test_a_survivor_whose_agent_is_gone_or_silent_is_passed_over() -> None:
    verdicts = {A: "gone", B: "silent", C: "alive"}
    assert choose_successor(RANKS, C, verdicts.__getitem__, store_host={"10.0.0.1"}) == C
    verdicts[B] = "gone"
    assert choose_successor({**RANKS, Node("10.0.0.4"): 3}, C, verdicts.__getitem__, store_host={"10.0.0.1"}) == C


def test_a_node_that_was_not_in_the_round_finds_no_successor_among_the_dead() -> None:
    late = Node("10.0.0.9")
    assert choose_successor({A: 0}, late, lambda n: "gone", store_host={"10.0.0.1"}) is None
