#!/usr/bin/env python3
"""Real-document tasks for the KV-compression quality benchmark: open-ended instructions about
a real document, scored by how long the compressed cache's greedy output stays identical to the
full cache's (issue 15's measure), not by an answer.

The documents are real prose that every Debian 12 machine with Python 3.11 has, so the task set
is the same on every machine without shipping text: sections of the Python Language Reference
(the stdlib's `pydoc_data.topics`, what `help("with")` prints) and the licence texts in
/usr/share/common-licenses. Each is cut at a paragraph boundary to a target length, then a
ChatML prompt is built: "Read the document below." + the document + an instruction after it
(summarise, list the main points, explain to a beginner, ...). No answer prefix: the reply is
free text, as when a user pastes a document into a chat.

Two prompt layouts, both what clients send: `spans` marks the document as a context segment
(modality-aware policies score the instruction after it and evict only the document), `plain`
sends the whole prompt as text.

Lengths: `short` 1.2k-1.7k tokens (the issue's prompts; twelve documents), `long` 2k-6k tokens
(six).

    python bench/quality/documents.py --length short --layout plain > docs.jsonl
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
LICENSES = pathlib.Path("/usr/share/common-licenses")

# (source, name): "topic" is a pydoc_data topic, "license" a file under LICENSES. The chars
# target per token (~3.9 for this prose with SmolLM2's tokenizer) only sizes the cut; the
# bench reports exact token counts.
SOURCES = {
    # The first six are the set `make test` asserts on; the other six make the first
    # divergence, a noisy mean, steadier in the benchmark (--count 6 gives the first set).
    "short": [("topic", "execmodel"), ("topic", "import"), ("license", "Apache-2.0"),
              ("topic", "try"), ("topic", "calls"), ("license", "CC0-1.0"),
              ("topic", "assignment"), ("topic", "comparisons"), ("license", "GPL-2"),
              ("topic", "debugger"), ("topic", "typesmapping"), ("license", "GFDL-1.3")],
    "long": [("topic", "compound"), ("license", "MPL-2.0"), ("topic", "specialnames"),
             ("license", "GPL-3"), ("topic", "formatstrings"), ("topic", "types")],
}
TARGET_CHARS = {"short": 6400, "long": 16000}
CHARS_PER_TOKEN = 3.9

INSTRUCTIONS = [
    "Summarize the document above in a few sentences.",
    "What are the main points of this text? Answer as a short list.",
    "Explain what the document above describes to someone who has never read it.",
    "Write a short summary of the text above for a busy colleague.",
    "What is this document about, and what does it say in its first part?",
    "Give a brief overview of the rules described above.",
]


def read_source(kind: str, name: str) -> str | None:
    if kind == "topic":
        try:
            import pydoc_data.topics as topics
        except ImportError:
            return None
        return topics.topics.get(name)
    path = LICENSES / name
    return path.read_text(encoding="utf-8") if path.exists() else None


def cut(text: str, target_chars: int) -> str:
    """The text up to the last paragraph break before target_chars (whole text if shorter)."""
    text = text.strip()
    if len(text) <= target_chars:
        return text
    head = text[:target_chars]
    at = head.rfind("\n\n")
    return head[:at] if at > target_chars // 2 else head[:head.rfind("\n")]


def segments(document: str, instruction: str, layout: str) -> list[dict]:
    head = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
            "Read the document below.\n\n")
    tail = f"\n\n{instruction}<|im_end|>\n<|im_start|>assistant\n"
    if layout == "plain":
        return [{"text": head + document + tail}]
    return [{"text": head}, {"context": document}, {"text": tail}]


def generate(length: str, layout: str, count: int | None = None) -> list[dict]:
    """Tasks in SOURCES order; sources missing on this machine are skipped (the caller checks
    the count it needs)."""
    tasks = []
    for i, (kind, name) in enumerate(SOURCES[length]):
        text = read_source(kind, name)
        if not text:
            continue
        if length == "long":
            # Long documents vary between 2k and 6k tokens: 0.5x-1.5x the target.
            target = int(TARGET_CHARS[length] * (0.5 + i / max(1, len(SOURCES[length]) - 1)))
        else:
            target = TARGET_CHARS[length]
        doc = cut(text, target)
        tasks.append({"id": f"{length}-{name}", "kind": f"document-{length}", "answer": "",
                      "source": f"{kind}:{name}",
                      "segments": segments(doc, INSTRUCTIONS[i % len(INSTRUCTIONS)], layout)})
    return tasks[:count] if count else tasks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", choices=sorted(SOURCES), default="short")
    ap.add_argument("--layout", choices=("plain", "spans"), default="plain")
    ap.add_argument("--count", type=int, default=0, help="at most this many (0: all)")
    args = ap.parse_args(argv)
    for t in generate(args.length, args.layout, args.count or None):
        sys.stdout.write(json.dumps(t) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
