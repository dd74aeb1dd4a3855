"""Reading the chat view back: which runs of text carry the accepted-draft colour."""
from __future__ import annotations

from app.chat.view import DRAFT_BG


def fragments(view) -> list[tuple[str, bool]]:
    """Every text fragment in the chat document and whether it is marked as an accepted draft run."""
    out: list[tuple[str, bool]] = []
    block = view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.isValid():
                marked = frag.charFormat().background().color() == DRAFT_BG
                out.append((frag.text(), marked))
            it += 1
        block = block.next()
    return out


def marked_text(view) -> str:
    """The marked text, line breaks left out (they become block boundaries in the document)."""
    return "".join(t for t, m in fragments(view) if m)


def draft_text(pieces) -> str:
    """What marked_text should show for a message's pieces."""
    return "".join(t for t, d in pieces if d).replace("\n", "")
