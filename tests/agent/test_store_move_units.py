"""torchstep.agent.store_move's rules without processes: who may move the store, which
survivor hosts the new one (every survivor must pick the same), and which side of a split
keeps the run (never both)."""

from __future__ import annotations

from dataclasses import dataclass

from torchstep.agent.store_move import answering, choose_successor, enabled, holds_majority, outvoted, side


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


D, E = Node("10.0.0.4"), Node("10.0.0.5")


def _reach(side: set[Node]) -> object:
    """A probe as seen from inside ``side`` of a split: its nodes answer, the others are silent."""
    return lambda n: "alive" if n in side else "silent"


def test_of_three_the_two_without_the_silent_store_host_hold_a_majority_and_it_is_outvoted() -> None:
    majority = _reach({B, C})
    for me in (B, C):
        assert answering(RANKS, me, majority, store_host={"10.0.0.1"}) == [B, C]
        assert holds_majority(RANKS, me, majority, store_host={"10.0.0.1"})
    assert outvoted(RANKS, A, _reach({A}))  # the store's host alone: it must not train on


def test_two_nodes_split_evenly_the_store_stays_and_nobody_is_outvoted() -> None:
    pair = {A: 0, B: 1}
    assert not holds_majority(pair, B, _reach({B}), store_host={"10.0.0.1"})
    assert not outvoted(pair, A, _reach({A}))  # the store's side trains on, as before


def test_an_even_split_is_named_on_both_halves_so_the_witness_can_decide() -> None:
    pair = {A: 0, B: 1}
    assert side(pair, B, _reach({B}), store_host={"10.0.0.1"}) == ("even", 1)  # lost the store's host
    assert side(pair, A, _reach({A})) == ("even", 1)  # the store's host, its peer silent
    assert side(RANKS, B, _reach({B, C}), store_host={"10.0.0.1"}) == ("majority", 2)
    assert side(RANKS, A, _reach({A})) == ("minority", 1)


def test_a_split_never_lets_both_sides_go_on() -> None:
    """Every split of five nodes with the store on A: at most one side trains (the store's
    side goes on unless outvoted; the other moves the store only with a majority)."""
    ranks = {A: 0, B: 1, C: 2, D: 3, E: 4}
    nodes = list(ranks)
    for mask in range(1 << 5):
        side = {n for i, n in enumerate(nodes) if mask >> i & 1}
        if A not in side or side == set(nodes):
            continue
        other = set(nodes) - side
        store_side_goes_on = not outvoted(ranks, A, _reach(side))
        others_move = holds_majority(ranks, min(other, key=ranks.get), _reach(other), store_host={"10.0.0.1"})
        assert not (store_side_goes_on and others_move), (sorted(n.addr for n in side), store_side_goes_on)
        assert store_side_goes_on or others_move  # and one of them does


def test_a_node_whose_probe_port_is_unknown_never_makes_a_majority() -> None:
    unknown = {A: "silent", B: "unknown", C: "alive"}
    assert answering(RANKS, C, unknown.__getitem__, store_host={"10.0.0.1"}) == [C]
    assert not holds_majority(RANKS, C, unknown.__getitem__, store_host={"10.0.0.1"})
