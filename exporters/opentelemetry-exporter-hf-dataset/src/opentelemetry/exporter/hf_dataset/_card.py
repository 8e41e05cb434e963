"""Dataset card (README.md) with one ``configs:`` entry per table.

``datasets.load_dataset(path_or_repo, "<table>")`` reads these configs locally and on the
Hub. Only tables that have at least one shard are listed; ``scalars`` (when present) is the
default config because the dataset builder is inferred from the first config's files.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Iterable, Mapping

import pyarrow as pa

_DEFAULT_ORDER = ("scalars", "runs", "layers", "system", "alerts", "spans", "logs", "metrics")
_SETTINGS = Path(".observers") / "card.json"


def present_tables(root: Path) -> list[str]:
    data = root / "data"
    if not data.is_dir():
        return []
    return _sorted_tables(p.name for p in data.iterdir()
                          if p.is_dir() and not p.name.startswith(".") and any(p.rglob("*.parquet")))


def render_card(tables: list[str], description: str, tags: Iterable[str],
                schemas: Mapping[str, pa.Schema] | None = None) -> str:
    lines = ["---", "configs:"]
    for i, table in enumerate(tables):
        lines.append(f"- config_name: {table}")
        if i == 0:
            lines.append("  default: true")
        lines.append("  data_files:")
        lines.append("  - split: train")
        lines.append(f'    path: "data/{table}/**/*.parquet"')
    all_tags = ["observability", "opentelemetry", "training-telemetry", *tags]
    lines.append("tags:")
    lines.extend(f"- {t}" for t in dict.fromkeys(all_tags))
    lines.append("---")
    lines.append("")
    lines.append(f"# {description.splitlines()[0] if description else 'Telemetry dataset'}")
    lines.append("")
    if description and len(description.splitlines()) > 1:
        lines.append("\n".join(description.splitlines()[1:]).strip())
        lines.append("")
    lines.append("Telemetry recorded with OpenTelemetry and stored as Parquet shards, one per "
                 "epoch, table and run. Load a table with:")
    lines.append("")
    lines.append("```python")
    lines.append("from datasets import load_dataset")
    first = tables[0] if tables else "scalars"
    lines.append(f'ds = load_dataset("<this repo or folder>", "{first}")')
    lines.append("```")
    lines.append("")
    lines.append("| config | columns |")
    lines.append("|---|---|")
    for table in tables:
        schema = (schemas or {}).get(table)
        cols = ", ".join(schema.names) if schema is not None else ""
        lines.append(f"| `{table}` | {cols} |")
    lines.append("")
    return "\n".join(lines)


def _sorted_tables(tables: Iterable[str]) -> list[str]:
    order = {name: i for i, name in enumerate(_DEFAULT_ORDER)}
    return sorted(set(tables), key=lambda t: (order.get(t, len(order)), t))


def card_text(root: Path, extra_tables: Iterable[str] = ()) -> str:
    """The card of ``root`` listing its tables plus ``extra_tables`` (e.g. tables that
    other runs already pushed to the same Hub repo), with the saved description/tags."""
    import pyarrow.parquet as pq

    root = Path(root)
    try:
        settings = json.loads((root / _SETTINGS).read_text())
    except (OSError, ValueError):
        settings = {}
    local = present_tables(root)
    schemas: dict[str, pa.Schema] = {}
    for table in local:
        for shard in sorted((root / "data" / table).rglob("*.parquet")):
            if any(part.startswith(".") for part in shard.relative_to(root).parts):
                continue
            try:
                schemas[table] = pq.read_schema(shard)
                break
            except (OSError, pa.ArrowException):
                continue
    return render_card(_sorted_tables([*local, *extra_tables]), settings.get("description", ""),
                       settings.get("tags", []), schemas)


def write_card(root: Path, description: str | None = None, tags: Iterable[str] = (),
               schemas: Mapping[str, pa.Schema] | None = None) -> Path:
    """(Re)write ``root/README.md`` atomically; description and tags persist across calls."""
    root = Path(root)
    settings_path = root / _SETTINGS
    try:
        settings = json.loads(settings_path.read_text())
    except (OSError, ValueError):
        settings = {}
    if description is not None:
        settings["description"] = description
    tags = list(tags)
    if tags:
        settings["tags"] = sorted(set(settings.get("tags", [])) | set(tags))
    settings_path.parent.mkdir(parents=True, exist_ok=True)
    text = render_card(present_tables(root), settings.get("description", ""),
                       settings.get("tags", []), schemas)
    for path, payload in ((settings_path, json.dumps(settings, indent=1)), (root / "README.md", text)):
        tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            tmp.write_text(payload)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return root / "README.md"
