"""`web_search`: one sentence about a topic, from DuckDuckGo's instant answer (preferred) and Wikipedia's
lead sentence, fetched in parallel; keyless. Base URLs are parameters (tests point them at loopback).

Example:
    >>> search = make_web_search(duckduckgo_url="http://127.0.0.1:8082/", wikipedia_url="http://127.0.0.1:8082/w")
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp

from duetaspan.registry import FunctionTool, ToolFailed, tool

DUCKDUCKGO_URL = "https://api.duckduckgo.com/"
WIKIPEDIA_URL = "https://en.wikipedia.org/w/api.php"
USER_AGENT = "duetaspan/0.1 (https://github.com/duetaspan/duetaspan)"

# A sentence ends at . ! ? followed by a space and a capital, not after an initial ("J. R. R.") or "St.".
_SENTENCE_END = re.compile(
    r"(?<!\b[A-Z])(?<!\bSt)(?<!\bDr)(?<!\bMr)(?<!\bMs)(?<!\bvs)[.!?](?=\s+[A-Z0-9\"'(])"
)


def first_sentence(text: str, max_chars: int = 300) -> str:
    """The first sentence of `text` (cut at a word near `max_chars` when there is no end in sight)."""
    text = (
        " ".join(re.sub(r"\([^()]*\)", "", text).split()) if len(text) > max_chars else " ".join(text.split())
    )
    match = _SENTENCE_END.search(text)
    sentence = text[: match.end()] if match else text
    if len(sentence) > max_chars:
        sentence = sentence[:max_chars].rsplit(" ", 1)[0] + "…"
    return sentence.replace(" ,", ",").strip()


async def _get_json(session: aiohttp.ClientSession, url: str, params: dict[str, Any]) -> Any:
    async with session.get(url, params=params, headers={"User-Agent": USER_AGENT}) as response:
        if response.status != 200:
            raise ToolFailed(f"HTTP {response.status} from {url}")
        return await response.json(content_type=None)


async def _duckduckgo(session: aiohttp.ClientSession, url: str, query: str) -> str | None:
    data = await _get_json(
        session, url, {"q": query, "format": "json", "no_html": 1, "skip_disambig": 1, "no_redirect": 1}
    )
    for key in ("Answer", "AbstractText", "Definition"):
        value = data.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    for topic in data.get("RelatedTopics") or []:
        if isinstance(topic, dict) and topic.get("Text"):
            return str(topic["Text"])
    return None


async def _wikipedia(session: aiohttp.ClientSession, url: str, query: str) -> str | None:
    data = await _get_json(
        session,
        url,
        {
            "action": "query",
            "format": "json",
            "generator": "search",
            "gsrsearch": query,
            "gsrlimit": 1,
            "prop": "extracts",
            "exintro": 1,
            "explaintext": 1,
            "redirects": 1,
        },
    )
    pages = ((data or {}).get("query") or {}).get("pages") or {}
    for page in pages.values():
        extract = (page or {}).get("extract")
        if extract and extract.strip():
            return extract.strip()
    return None


def make_web_search(
    duckduckgo_url: str = DUCKDUCKGO_URL, wikipedia_url: str = WIKIPEDIA_URL, http_timeout_s: float = 4.0
) -> FunctionTool:
    """`web_search` against the given DuckDuckGo- and MediaWiki-compatible endpoints."""

    @tool(name="web_search", render=lambda r: r["answer"])
    async def web_search(query: str) -> dict:
        """Look up a fact on the web (encyclopedic facts, definitions, recent events); returns one sentence.

        Args:
            query: what to look up, as a short search query
        """
        timeout = aiohttp.ClientTimeout(total=http_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            ddg, wiki = await asyncio.gather(
                _duckduckgo(session, duckduckgo_url, query),
                _wikipedia(session, wikipedia_url, query),
                return_exceptions=True,
            )
        for source, found in (("duckduckgo", ddg), ("wikipedia", wiki)):
            if isinstance(found, str) and found:
                return {"query": query, "source": source, "answer": first_sentence(found)}
        errors = [e for e in (ddg, wiki) if isinstance(e, BaseException)]
        if len(errors) == 2:
            raise ToolFailed(f"web search is unavailable ({type(errors[0]).__name__}: {errors[0]})")
        raise ToolFailed(f"nothing found for {query!r}")

    return web_search


web_search = make_web_search()
