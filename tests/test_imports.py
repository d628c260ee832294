"""The repository's folders are subpackages of `toolkit`: no code names them as top-level packages (a bare
`import runtime` would load a second copy of every module from the checkout)."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOMS = ("runtime", "bench", "diagnose", "reports", "tune", "traces")
_ROOM = rf"(?:{'|'.join(ROOMS)})(?:\.\w+)*"
# `from runtime.x import y` / `import runtime.x`, in code or in code kept in a string (a subprocess's -c script)
BARE = re.compile(rf"(?:^|[;\"'])\s*(?:from\s+{_ROOM}\s+import\b|import\s+{_ROOM}(?:\s*$|\s*;|\s+as\b))",
                  re.MULTILINE)
# a dotted module path in quotes (monkeypatch targets, `-m` arguments); file names are not module paths
FILE_SUFFIXES = ("json", "jsonl", "html", "jinja", "csv", "log", "md", "py", "png", "css", "gz", "out", "txt")
QUOTED = re.compile(rf"[\"']{_ROOM}[\"']")


def test_no_module_imports_a_room_as_a_top_level_package():
    offenders = []
    for path in sorted(REPO.glob("**/*.py")):
        if {".venv", "build", ".git"} & set(path.relative_to(REPO).parts):
            continue
        text = path.read_text(errors="replace")
        found = [m.group(0).strip() for m in BARE.finditer(text)]
        found += [m.group(0) for m in QUOTED.finditer(text)
                  if "." in m.group(0) and not m.group(0)[1:-1].endswith(FILE_SUFFIXES)]
        offenders += [f"{path.relative_to(REPO)}: {hit}" for hit in found]
    assert not offenders, offenders
