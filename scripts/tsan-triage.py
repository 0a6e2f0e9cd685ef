#!/usr/bin/env python3
"""Sorts ThreadSanitizer reports from a live daemon into winnow's and the libraries'.

Debian's gRPC, Abseil and Protobuf are not built with TSan, so the synchronisation inside
them (their own mutexes, the executor that hands a call from one gRPC thread to the next) is
invisible, and a daemon under TSan reports hundreds of races on gRPC's own objects. A
suppressions file cannot separate those from winnow's: their top frame is often
`operator delete` or a libstdc++ template, and winnow's frames sit below gRPC's in most of them.
This script looks at each of the two accesses of a report instead (the first stack of a report
without accesses, such as a lock-order inversion), past the sanitizer runtime and libstdc++: a
report counts as winnow's when such a stack's first remaining frame is in winnow's own sources.
Everything else is counted as the libraries'.

    scripts/tsan-triage.py DIR      # the daemon ran with TSAN_OPTIONS=log_path=DIR/report
Exit status 1 when any report is winnow's (each is printed), 0 otherwise.
"""
import pathlib
import re
import sys

REPO = str(pathlib.Path(__file__).resolve().parent.parent) + "/"
# Frames that are neither side of the question: the sanitizer runtime and the C++ library (its
# headers under /usr/include/c++/, its thread wrappers under /usr/include/<triplet>/c++/).
SKIP = ("libtsan", "sanitizer", "/c++/", "libstdc++")
ACCESS = re.compile(r"(Previous )?(atomic )?(read|write)", re.IGNORECASE)
FRAME = re.compile(r"#\d+ (\S+) (\S+)")


def reports(text):
    for chunk in text.split("==================\n"):
        if "WARNING: ThreadSanitizer" in chunk:
            yield chunk


def first_frame(section):
    for function, location in FRAME.findall(section):
        if not any(s in location for s in SKIP):
            return function, location
    return None


def is_winnows(location):
    # Generated protobuf code lives under the build directory; it is Protobuf's, not ours.
    return location.startswith(REPO) and "/gen/" not in location


def owner(report):
    """The winnow frame a report's stacks start in, or None when they start in a library."""
    sections = re.split(r"\n  (?=\S)", report)
    stacks = [s for s in sections if ACCESS.match(s)][:2]
    if not stacks:  # a lock-order inversion, a leaked thread, ...: judged by its first stack
        stacks = [s for s in sections if FRAME.search(s)][:1]
    for section in stacks:
        frame = first_frame(section)
        if frame and is_winnows(frame[1]):
            return f"{frame[0]} {frame[1][len(REPO):]}"
    return None


def main(directory):
    ours, theirs = [], 0
    for path in sorted(pathlib.Path(directory).glob("report.*")):
        for report in reports(path.read_text(errors="replace")):
            frame = owner(report)
            if frame:
                ours.append((frame, report))
            else:
                theirs += 1
    for frame, report in ours:
        print(f"=== winnow: {frame}\n{report}")
    print(f"tsan-triage: {len(ours)} report(s) in winnow's code, {theirs} inside gRPC, "
          f"Abseil or Protobuf (uninstrumented; not checked)")
    return 1 if ours else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
