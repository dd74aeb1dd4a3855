"""engine/stop_strings.py on its own: text that may start a stop string waits; streamed text is never taken back."""
from __future__ import annotations

from engine.events import TextPiece
from engine.stop_strings import StopStrings


def _feed(stops: StopStrings, steps: list[str], ending_at: int | None = None):
    text, shown, cut = "", [], None
    for i, delta in enumerate(steps):
        text += delta
        pieces, stop = stops.release(text, [TextPiece(delta, False)] if delta else [], i == ending_at)
        shown.append("".join(p.text for p in pieces))
        if stop is not None:
            cut = stop
            break
    return shown, cut


def test_a_possible_start_waits_and_is_released_when_ruled_out() -> None:
    shown, cut = _feed(StopStrings(["END"]), ["hello E", "N", "x more"])
    assert shown == ["hello ", "", "ENx more"] and cut is None


def test_a_stop_string_across_steps_cuts_the_text_there() -> None:
    shown, cut = _feed(StopStrings(["END"]), ["abc E", "ND tail"])
    assert shown == ["abc ", ""] and cut == 4
    shown, cut = _feed(StopStrings(["END"], include_in_output=True), ["abc E", "ND tail"])
    assert shown == ["abc ", "END"] and cut == 7
    # The earliest of several stop strings wins.
    shown, cut = _feed(StopStrings(["tail", "ND"]), ["abc END tail"])
    assert cut == 5 and shown == ["abc E"]


def test_ending_for_another_reason_releases_everything_and_flush_gives_the_rest() -> None:
    shown, _ = _feed(StopStrings(["END"]), ["a E"], ending_at=0)
    assert shown == ["a E"]
    stops = StopStrings(["END"])
    assert "".join(p.text for p in stops.release("x EN", [TextPiece("x EN", True)], False)[0]) == "x "
    assert [(p.text, p.from_draft) for p in stops.flush("x EN")] == [("EN", True)] and stops.flush("x EN") == []
    assert _feed(StopStrings([]), ["E", "N", "D"]) == (["E", "N", "D"], None)  # no stop strings: nothing waits
