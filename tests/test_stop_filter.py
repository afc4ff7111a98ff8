"""StopStringFilter: text that may start a stop string is held back until it cannot, across pieces."""

from __future__ import annotations

from collections.abc import Sequence

from hyserve.engine.stop import StopStringFilter


def _run_filter(stops: Sequence[str], pieces: Sequence[str]) -> tuple[list[str], str | None, str]:
    f = StopStringFilter(stops)
    out, hit = [], None
    for piece in pieces:
        released, hit = f.push(piece)
        out.append(released)
        if hit is not None:
            break
    return out, hit, f.flush()


def test_stop_filter_passes_text_through_without_stop_strings() -> None:
    assert _run_filter([], ["ab", "c"]) == (["ab", "c"], None, "")


def test_stop_filter_holds_back_a_possible_start_and_matches_across_pieces() -> None:
    out, hit, rest = _run_filter(["END"], ["hello E", "N", "D more"])
    assert out == ["hello ", "", ""] and hit == "END" and rest == ""


def test_stop_filter_releases_a_false_start() -> None:
    out, hit, rest = _run_filter(["END"], ["a E", "Nx", "y"])
    assert out == ["a ", "ENx", "y"] and hit is None and rest == ""


def test_stop_filter_flush_releases_held_text() -> None:
    out, hit, rest = _run_filter(["\n\nuser:"], ["hi\n", "\n"])
    assert out == ["hi", ""] and hit is None and rest == "\n\n"


def test_stop_filter_earliest_match_wins() -> None:
    out, hit, _ = _run_filter(["cd", "b"], ["abcd"])
    assert out == ["a"] and hit == "b"
    out, hit, _ = _run_filter(["bc", "bcd"], ["abcde"])
    assert out == ["a"] and hit == "bcd"  # same start: the longer one


def test_stop_filter_done_after_match() -> None:
    f = StopStringFilter(["x"])
    assert f.push("ax") == ("a", "x")
    assert f.push("more") == ("", None) and f.flush() == ""
