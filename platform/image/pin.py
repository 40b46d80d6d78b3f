"""Write an image digest into the chart's values: `pin.py VALUES KEY DIGEST`.

Edits the `digest:` line of the top-level block KEY (image or gpuImage) in place, keeping the
file's comments and layout, so `make image` leaves the chart naming exactly the image it built.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def digest_pinned(text: str, key: str, digest: str) -> str:
    """Return the values text with KEY's `digest:` set to DIGEST."""
    if not DIGEST.fullmatch(digest):
        raise ValueError(f"not an image digest: {digest!r}")
    lines = text.splitlines(keepends=True)
    inside = False
    for index, line in enumerate(lines):
        if re.match(rf"{re.escape(key)}:\s*$", line):
            inside = True
        elif inside and line.strip() and not line.startswith((" ", "#")):
            break
        elif inside and re.match(r"\s+digest:", line):
            indent = line[: len(line) - len(line.lstrip())]
            comment = line.partition("#")[2]
            tail = f"  #{comment}" if comment else "\n"
            lines[index] = f'{indent}digest: "{digest}"{tail}'
            return "".join(lines)
    raise ValueError(f"no {key}.digest line in the values")


def main() -> None:
    path, key, digest = Path(sys.argv[1]), sys.argv[2], sys.argv[3].strip()
    text = path.read_text()
    pinned = digest_pinned(text, key, digest)
    if pinned != text:
        path.write_text(pinned)
        print(f"{path}: {key}.digest is now {digest}")


if __name__ == "__main__":
    main()
