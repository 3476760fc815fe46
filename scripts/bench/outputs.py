"""Where a benchmark script's results go: ``<name>.json`` and ``<name>.md``."""

import json
import os


def write_results(output_dir: str, name: str, result: dict, table: str) -> None:
    """Writes ``result`` to ``<output_dir>/<name>.json`` and the Markdown
    ``table`` to ``<output_dir>/<name>.md`` (making the directory)."""
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, f"{name}.json"), "w", encoding="utf-8") as out:
        json.dump(result, out, indent=2)
    with open(os.path.join(output_dir, f"{name}.md"), "w", encoding="utf-8") as out:
        out.write(table)
