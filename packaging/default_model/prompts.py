"""Question phrasings, optional system prompts and a few self-description turns for the corpus."""

from __future__ import annotations

import random

_CALLABLE = (
    "What does `{q}` do?",
    "What does {q} do?",
    "How do I use `{q}`?",
    "How do I use {q}?",
    "What is `{q}` for?",
    "Explain `{q}`.",
    "Explain {q}.",
    "Describe {q}.",
    "What does the function {q} do?",
    "Tell me about `{q}`.",
    "What is {q} used for?",
    "Can you explain what {q}() does?",
)
_CLASS = (
    "What is `{q}`?",
    "What is {q}?",
    "How do I use `{q}`?",
    "What does the class {q} do?",
    "Describe the class `{q}`.",
    "Explain {q}.",
    "Tell me about {q}.",
    "What is {q} used for?",
)
_PROPERTY = (
    "What is `{q}`?",
    "What is {q}?",
    "What does the attribute {q} hold?",
    "Explain `{q}`.",
)
_MODULE = (
    "What is the `{q}` module?",
    "What does the {q} module do?",
    "Tell me about the `{q}` module.",
    "What is {q} used for in Python?",
    "What is the {q} module for?",
    "Explain the {q} module.",
)
_TEMPLATES = {"module": _MODULE, "class": _CLASS, "property": _PROPERTY}

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a helpful assistant that answers questions about Python.",
    "Answer briefly.",
    "You are SwarmLLM, a small assistant that knows the Python standard library.",
)
SYSTEM_FRACTION = 0.2  # share of chats that start with a system message
SECOND_TURN_FRACTION = 0.1  # share of chats with a second question about another item

_IDENTITY = (
    (("Who are you?", "What are you?", "Hello! Who am I talking to?", "Introduce yourself."),
     "I am the small default model built into SwarmLLM. I was trained on the docstrings of the "
     "Python standard library, so I answer best when you ask what a Python module, class or "
     "function does."),
    (("Hello", "Hi!", "Hello, how are you?", "Hey there."),
     "Hello! I am SwarmLLM's built-in model. Ask me what a Python standard library function "
     "does, for example: What does `os.path.join` do?"),
    (("What can you do?", "What do you know?", "How can you help me?"),
     "I can describe modules, classes and functions of the Python standard library, in the "
     "words of their docstrings. I am a tiny model, so for anything else please load a larger "
     "model into SwarmLLM."),
)
IDENTITY_REPEATS = 8  # each (phrasing, answer) pair appears this often in the training corpus


def question(qualname: str, kind: str, rng: random.Random) -> str:
    """A user question about one documented object."""
    return rng.choice(_TEMPLATES.get(kind, _CALLABLE)).format(q=qualname)


def conversation(item, rng: random.Random, others=None) -> list[dict]:
    """One chat: optional system prompt, a question about ``item`` and its docstring answer."""
    messages = []
    if rng.random() < SYSTEM_FRACTION:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    messages.append({"role": "user", "content": question(item.qualname, item.kind, rng)})
    messages.append({"role": "assistant", "content": item.answer})
    if others and rng.random() < SECOND_TURN_FRACTION:
        other = rng.choice(others)
        messages.append({"role": "user", "content": question(other.qualname, other.kind, rng)})
        messages.append({"role": "assistant", "content": other.answer})
    return messages


def identity_conversations(rng: random.Random) -> list[list[dict]]:
    """Short self-description chats so greetings get a sensible answer."""
    out = []
    for phrasings, answer in _IDENTITY:
        for phrasing in phrasings:
            for _ in range(IDENTITY_REPEATS):
                messages = []
                if rng.random() < SYSTEM_FRACTION:
                    messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
                messages += [{"role": "user", "content": phrasing}, {"role": "assistant", "content": answer}]
                out.append(messages)
    return out
