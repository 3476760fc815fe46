"""``python -m scripts.bench NAME [flags]``: the one entry point of the
measuring tools (`scripts.bench.registry`); without NAME, lists them.

    python -m scripts.bench training --quick
    python -m scripts.bench soak --mode=mwms --minutes=3
"""

import pathlib
import subprocess
import sys

from scripts.bench.registry import TOOLS

SCRIPTS = pathlib.Path(__file__).resolve().parents[1]


def usage() -> str:
    lines = ["usage: python -m scripts.bench NAME [flags]  (NAME --help: its flags)", ""]
    for kind in ("benchmark", "reliability"):
        lines.append(f"{kind}:")
        lines += [f"  {name:<17} {tool.measures}" for name, tool in TOOLS.items()
                  if tool.kind == kind]
    return "\n".join(lines)


def main(argv) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, flags = argv[0], argv[1:]
    if name not in TOOLS:
        print(f"python -m scripts.bench: no tool {name!r}.\n\n{usage()}", file=sys.stderr)
        return 2
    command = [sys.executable, str(SCRIPTS / TOOLS[name].script), *flags]
    return subprocess.call(command, cwd=SCRIPTS.parent)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
