"""Multi-turn conversations of real text, built from what ships with Python itself.

The standard library's module documentation is real English prose that every machine with
Python has, so tests and benchmarks need no download and no bundled data set.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import random
import textwrap
from collections.abc import Callable, Iterator, Sequence

from semantic.domain.chat import ChatMessage

MODULES = (
    "json",
    "csv",
    "argparse",
    "asyncio",
    "collections",
    "functools",
    "itertools",
    "pathlib",
    "re",
    "logging",
    "unittest",
    "sqlite3",
    "zipfile",
    "decimal",
    "fractions",
    "statistics",
    "textwrap",
    "string",
    "datetime",
    "calendar",
    "heapq",
    "bisect",
    "shutil",
    "tempfile",
    "threading",
    "subprocess",
    "socket",
    "http.client",
    "urllib.parse",
    "email.message",
    "xml.etree.ElementTree",
    "contextlib",
    "dataclasses",
    "enum",
    "abc",
    "copy",
    "pickle",
    "shelve",
    "hashlib",
    "hmac",
    "secrets",
    "random",
    "math",
    "cmath",
    "operator",
)

QUESTIONS = (
    "Can you explain this part of the documentation to me?",
    "What does the following passage mean in practice?",
    "Summarise this for a new team member, please.",
    "I read this in the docs; how would I use it?",
    "Here is more of the text. What is the key idea?",
    "Please continue: what does this section add?",
)


@functools.cache
def passages() -> list[str]:
    """Paragraphs of documentation prose, in a fixed order."""
    out: list[str] = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        doc = inspect.getdoc(module) or ""
        for member in vars(module).values():
            if inspect.isclass(member) or inspect.isfunction(member):
                doc += "\n\n" + (inspect.getdoc(member) or "")
        for paragraph in doc.split("\n\n"):
            text = " ".join(paragraph.split())
            if len(text) > 120:
                out.append(textwrap.shorten(text, 900, placeholder=" ..."))
    return out


def conversation(
    seed: int, target_tokens: int, count_tokens: Callable[[Sequence[ChatMessage]], int]
) -> list[ChatMessage]:
    """A system prompt and user/assistant turns, grown until about ``target_tokens`` long.

    The last message is always a user turn, so the conversation is ready for a reply.
    """
    rng = random.Random(seed)
    texts = passages()
    messages = [ChatMessage("system", "You are a concise assistant who explains Python.")]
    while True:
        question = f"{rng.choice(QUESTIONS)}\n\n{rng.choice(texts)}"
        messages.append(ChatMessage("user", question))
        if count_tokens(messages) >= target_tokens:
            return messages
        messages.append(ChatMessage("assistant", rng.choice(texts)))


def spread(
    n: int, max_tokens: int, seed: int, count_tokens: Callable[[Sequence[ChatMessage]], int]
) -> Iterator[list[ChatMessage]]:
    """``n`` conversations whose lengths spread evenly from 200 to ``max_tokens`` tokens."""
    for index in range(n):
        target = 200 + (max_tokens - 200) * index // max(1, n - 1)
        yield conversation(seed + index, target, count_tokens)
