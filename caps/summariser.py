"""Claude Code's WebFetch: the page in the summariser's request, a web-fetch segment.

Claude Code's WebFetch does not put the page in the conversation. It fetches the URL with its
own HTTP client, turns the HTML into markdown and sends it, with the model's `prompt`, as a
separate request through the same base URL: no tools, no history, one user message of one text
block (captured from 2.1.330; the bundle's `acl` function). Only the summariser's short answer
goes back into the conversation as the WebFetch result. The page is the cost, so that request
is where the web-fetch cap applies. Two layouts:

    \\nWeb page content:\\n---\\n<page>\\n---\\n\\n<prompt>\\n\\nProvide a concise response …

and, for pages from sources it does not trust, the page fenced in a tag it escapes inside:

    The text inside the <untrusted-content> tag below is ... \\n\\n<untrusted-content>\\n<page>
    \\n</untrusted-content>\\n\\nIMPORTANT: ...\\n\\n<prompt>\\n\\nProvide a concise response ...

Only the page is cut (head + tail with a note saying so); the prompt and instructions stay
as they are. In the first layout the page's end is the last `\\n---\\n\\n` before the closing
instructions: a prompt that itself holds such a line would put its start in the page's
tail, which a cut keeps (the tail is a quarter of the cap).

>>> page = "Paragraph about lorem ipsum.\\n\\n" * 100
>>> ask = "Summarise it\\n\\nProvide a concise response based only on the content above."
>>> text = f"\\nWeb page content:\\n---\\n{page}\\n---\\n\\n{ask}"
>>> out, [seg] = clamp_page(text, 300)
>>> seg.kind, seg.label, seg.before, seg.after, seg.action
('web_fetch', 'WebFetch page (summariser request)', 3000, 300, 'clamped')
>>> out.endswith(f"\\n---\\n\\n{ask}")
True
>>> "[...truncated by ctxbudget: kept " in out, clamp_page(out, 300)[0] == out
(True, True)
>>> clamp_page("Web page content: my own question", 10)   # not the summariser's layout
('Web page content: my own question', [])
"""

from __future__ import annotations

from ctxbudget.caps._cut import head_tail
from ctxbudget.caps._text import utf16_len
from ctxbudget.caps.passages import pick, picked
from ctxbudget.caps.types import Segment

_PLAIN = "\nWeb page content:\n---\n"
_PLAIN_END = "\n---\n\n"
_ASK = "\n\nProvide a concise response based "
_FENCED = "The text inside the <"
LABEL = "WebFetch page (summariser request)"
TOOL = "WebFetch"
HEAD_SHARE = 0.75
"""A page's head holds its title and what it is about: it gets 3/4 of what is kept."""


def clamp_page(text: str, cap: int | None, *, query: bool = False) -> tuple[str, list[Segment]]:
    """Clamp the page in one text block of the WebFetch summariser's request to `cap` UTF-16
    units. Returns the text (the same object when nothing changed) and one segment when the
    text is that request's; `cap=None` clamps nothing but reports the page. `query` (the
    `query` strategy): the page keeps its head and the passages that answer the model's prompt,
    which follows the page in the same text (`caps.passages`), else its head and tail."""
    found = _page(text)
    if found is None:
        return text, []
    start, end = found
    page = text[start:end]
    clamped = page if cap is None else _cut(page, cap, _prompt(text, end) if query else None)
    segment = Segment(
        kind="web_fetch",
        label=LABEL,
        before=utf16_len(page),
        after=utf16_len(clamped),
        action="clamped" if clamped != page else "kept",
        cap=cap,
        tool=TOOL,
        strategy=None if clamped == page else ("query" if picked(page, clamped) else "head"),
        original=page,
        clamped=clamped,
    )
    if clamped == page:
        return text, [segment]
    return f"{text[:start]}{clamped}{text[end:]}", [segment]


def _cut(page: str, cap: int, prompt: str | None) -> str:
    if prompt is not None:
        out = pick(page, cap, prompt, how="the page is cut by ctxbudget")
        if out is not None:
            return out
    return head_tail(page, cap, _MARKERS, head_share=HEAD_SHARE)


def _prompt(text: str, end: int) -> str:
    """The model's prompt: what follows the page, up to Claude Code's closing instructions
    (it is the question, and it is in the same text: the same every time the page is)."""
    ask = text.rfind(_ASK)
    return text[end : ask if ask > end else len(text)]


def _page(text: str) -> tuple[int, int] | None:
    """(start, end) of the page, or None when `text` is not the summariser's."""
    if text.startswith(_PLAIN):
        ask = text.rfind(_ASK)
        end = text.rfind(_PLAIN_END, len(_PLAIN) - 1, ask) if ask >= 0 else -1
        return (len(_PLAIN), max(len(_PLAIN), end)) if end >= 0 else None
    if not text.startswith(_FENCED):
        return None
    tag_end = text.find(">", len(_FENCED))
    fence = text[len(_FENCED) : tag_end] if tag_end >= 0 else ""
    if not fence or any(c in fence for c in "<>\n /"):
        return None
    opening, closing = f"\n\n<{fence}>\n", f"\n</{fence}>\n\n"
    start = text.find(opening, tag_end)
    if start < 0 or text.rfind(_ASK) < 0:
        return None
    start += len(opening)
    end = text.find(closing, start - 1)  # the page is escaped: its first closing tag is it
    return (start, max(start, end)) if end >= 0 else None


def _marker(head: int, tail: int, size: int) -> str:
    return f"\n[...truncated by ctxbudget: kept {head}+{tail} of {size} chars of the page...]\n"


def _compact(head: int, tail: int, size: int) -> str:
    return f"[…truncated {head}+{tail}/{size}]"


_MARKERS = (_marker, _compact)
