#!/usr/bin/python3
"""Every C++ block in docs/*.md and README.md is an excerpt of a source that the build compiles.

A block is split at lines that are `...` alone (what the excerpt leaves out); each piece must
appear, line for line (trailing spaces ignored), in one of the examples' or the library's sources.
A block that no compiled source holds has drifted from the code: the test names it and fails.
Usage: snippets.py REPO_ROOT [FILE.md ...] (the files default to README.md and docs/*.md).
"""
import pathlib
import re
import sys


def blocks(text):
    return re.findall(r"```(?:cpp|c\+\+)\n(.*?)```", text, re.S)


def pieces(block):
    out, cur = [], []
    for line in block.splitlines():
        if line.strip() == "...":
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(line.rstrip())
    if cur:
        out.append(cur)
    return out


def main():
    root = pathlib.Path(sys.argv[1])
    docs = [pathlib.Path(f) for f in sys.argv[2:]] or [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    sources = []
    for pattern in ("examples/**/*.cpp", "src/**/*.cpp", "include/**/*.hpp", "apps/**/*.cpp"):
        sources += [p.read_text().splitlines() for p in root.glob(pattern)]
    sources = [[line.rstrip() for line in s] for s in sources]

    def found(piece):
        n = len(piece)
        return any(s[i:i + n] == piece for s in sources for i in range(len(s) - n + 1))

    bad, count = [], 0
    for doc in docs:
        for k, block in enumerate(blocks(doc.read_text())):
            for piece in pieces(block):
                count += 1
                if not found(piece):
                    bad.append(f"{doc.name}, C++ block {k + 1}: not in any compiled source:\n    " + "\n    ".join(piece))
    print(f"{count} excerpts checked")
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
