"""MkDocs hook: fills the pages' ``<!-- gen: ... -->`` markers from the code at build time.

What the code already says (every algorithm's knobs with their types and defaults, every task's
hyper-parameters, the run settings, the matrix keys of ``config/schema.yaml``, the configs, the
network presets, the claims' verdict rule) is read here, from the same functions that
``python -m benchmarks.run --list`` uses, so the documentation cannot drift from it.

Markers, each alone on a line:

- ``<!-- gen: knobs NAME... -->``: one table per algorithm, knob | type | default | meaning (the
  meaning is the knob's entry in the class docstring's ``Args:``);
- ``<!-- gen: algorithms -->``: every registered algorithm, its summary line and its simulated clock;
- ``<!-- gen: tasks -->`` and ``<!-- gen: task-hparams -->``: the task registry;
- ``<!-- gen: settings -->``: ``benchmarks.settings.Settings`` with the comment beside each field;
- ``<!-- gen: matrix-keys -->``: the properties of ``config/schema.yaml``;
- ``<!-- gen: configs -->``: every ``config/*.yaml`` but the schema, with its header comment;
- ``<!-- gen: networks -->``: ``benchmarks.virtual.network.PRESETS``;
- ``<!-- gen: claims-rule -->``: ``analysis.claims.RULE``;
- ``<!-- gen: file PATH -->``: the file, as a code block.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

MARKER = re.compile(r"^<!-- gen: ([a-z-]+)(.*?) -->$", re.MULTILINE)


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _type_name(kind: object) -> str:
    name = getattr(kind, "__name__", None)
    return name if name and not str(kind).startswith("typing.") and "|" not in str(kind) else str(kind)


def _args_section(doc: str) -> dict[str, str]:
    """``{name: text}`` from a Google-style ``Args:`` section (names joined by commas each get the text)."""
    found: dict[str, str] = {}
    lines = doc.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Args:")
    except StopIteration:
        return found
    current: list[str] = []
    for line in lines[start + 1 :]:
        if line and not line.startswith(" "):
            break
        match = re.match(r"^    ([A-Za-z_][\w, ]*): (.*)$", line)
        if match:
            current = [name.strip() for name in match.group(1).split(",")]
            for name in current:
                found[name] = match.group(2).strip()
        elif line.startswith("        ") and current:
            for name in current:
                found[name] += " " + line.strip()
    return found


def _rst_to_md(text: str) -> str:
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def _knob_docs(cls: type) -> dict[str, str]:
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's entry wins over its base's
        docs.update(_args_section(inspect.getdoc(klass) or "") if klass.__doc__ else {})
    return docs


def knobs(names: list[str]) -> str:
    """Knob tables; algorithms with the same knobs and the same docstring entries share one table."""
    import algorithms

    groups: list[tuple[list[str], dict[str, tuple[object, object]], dict[str, str]]] = []
    for name in names:
        params, docs = algorithms.params(name), _knob_docs(algorithms.get(name))
        if groups and groups[-1][1] == params and groups[-1][2] == docs:
            groups[-1][0].append(name)
        else:
            groups.append(([name], params, docs))
    out = []
    for members, params, docs in groups:
        for name in members:
            cls = algorithms.get(name)
            out.append(f"- **`{name}`** (`{cls.__module__}.{cls.__name__}`): {_rst_to_md(algorithms.describe(name))}")
        out.append("")
        if not params:
            out.append("No knobs.\n")
            continue
        if len(members) > 1:
            out.append("Their knobs, shared:\n")
        out.append("| knob | type | default | meaning |\n|---|---|---|---|")
        for knob, (kind, default) in params.items():
            meaning = _rst_to_md(docs.get(knob, ""))
            out.append(f"| `{knob}` | {_cell(_type_name(kind))} | `{default!r}` | {_cell(meaning)} |")
        out.append("")
    return "\n".join(out)


def algorithm_table() -> str:
    import algorithms

    where = {"virtual": "virtual cluster", "arrivals": "parameter-server simulator"}
    out = ["| name | class | what | `clock=simulated` on |", "|---|---|---|---|"]
    for name in algorithms.names():
        cls = algorithms.get(name)
        out.append(
            f"| `{name}` | `{cls.__module__}.{cls.__name__}` | {_cell(_rst_to_md(algorithms.describe(name)))} "
            f"| {where.get(cls.simulator, 'not yet')} |"
        )
    return "\n".join(out)


def task_table() -> str:
    from benchmarks import tasks

    out = ["| name | what | metric, target | data |", "|---|---|---|---|"]
    for name in tasks.names():
        t = tasks.get(name)
        data = f"`--set data_root=DIR` holding {t.data_hint}" if t.data_hint else "embedded, no download"
        out.append(f"| `{name}` | {_cell(t.description)} | {t.metric} {t.target} | {_cell(data)} |")
    return "\n".join(out)


def task_hparams() -> str:
    """The keys every task sets alike on one line; a table of the others, a row per task."""
    from benchmarks import tasks

    names = tasks.names()
    hparams = {name: tasks.get(name).hparams for name in names}
    keys = list(dict.fromkeys(k for hp in hparams.values() for k in hp))
    missing = object()
    alike = [k for k in keys if len({repr(hp.get(k, missing)) for hp in hparams.values()}) == 1]
    varying = [k for k in keys if k not in alike]
    out = ["Alike in every task: " + ", ".join(f"`{k}={hparams[names[0]][k]!r}`" for k in alike) + ".\n"]
    out.append("| task | " + " | ".join(f"`{k}`" for k in varying) + " |")
    out.append("|---|" + "---|" * len(varying))
    for name in names:
        cells = [f"`{hparams[name][k]!r}`" if k in hparams[name] else "" for k in varying]
        out.append(f"| `{name}` | " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(out)


def settings() -> str:
    from benchmarks import settings as run_settings

    source = Path(run_settings.__file__).read_text()
    lines = source.splitlines()
    comments: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == "Settings":
            for field in node.body:
                if isinstance(field, ast.AnnAssign):  # the comment may sit inside a wrapped default
                    span = lines[field.lineno - 1 : field.end_lineno]
                    said = [line.partition("#")[2].strip() for line in span if "#" in line]
                    comments[field.target.id] = said[0] if said else ""
    out = ["| setting | type | default | meaning |", "|---|---|---|---|"]
    for key, (kind, default) in run_settings.SETTINGS.items():
        out.append(f"| `{key}` | {_cell(_type_name(kind))} | `{default!r}` | {_cell(comments.get(key, ''))} |")
    return "\n".join(out)


def matrix_keys() -> str:
    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    out = ["| key | type | meaning |", "|---|---|---|"]
    for key, spec in schema["properties"].items():
        kind = spec.get("type", "")
        if kind == "array" and "items" in spec:
            kind = f"array of {spec['items'].get('type', 'objects')}"
        required = " (required)" if key in schema.get("required", []) else ""
        out.append(f"| `{key}` | {kind}{required} | {_cell(spec.get('description', '').strip())} |")
    return "\n".join(out)


def configs() -> str:
    out = ["| file | suites | algorithms | tasks | nodes × procs | seeds |", "|---|---|---|---|---|---|"]
    headers = []
    for path in sorted((ROOT / "config").glob("*.yaml")):
        if path.name == "schema.yaml":
            continue
        data = yaml.safe_load(path.read_text())
        entries = [{**data, **sub} for sub in data.get("matrices", [])] or [data]

        def joined(key: str, entries: list[dict] = entries) -> str:
            values = dict.fromkeys(str(v) for e in entries for v in (e.get(key) or []))
            return ", ".join(values)

        suites = ", ".join(dict.fromkeys(e["suite"] for e in entries))
        layout = ", ".join(
            dict.fromkeys(f"{'/'.join(map(str, e.get('nodes') or []))} × {e.get('procs_per_node')}" for e in entries)
        )
        out.append(
            f"| `config/{path.name}` | {suites} | {_cell(joined('algorithms'))} | {_cell(joined('tasks'))} "
            f"| {_cell(layout)} | {_cell(joined('seeds'))} |"
        )
        header = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            header.append(line[1:].removeprefix(" "))
        if header:
            headers.append(f"**`config/{path.name}`**\n\n```text\n" + "\n".join(header) + "\n```\n")
    return "\n".join(out) + "\n\nEach file's header:\n\n" + "\n".join(headers)


def networks() -> str:
    from benchmarks.virtual import network

    out = []
    for name, net in network.PRESETS.items():
        out.append(
            f"**`{name}`**: inside a node {net.intra.latency_s * 1e6:g} µs, {net.intra.bandwidth_bps / 1e9:g} GB/s; "
            f"between nodes {net.inter.latency_s * 1e6:g} µs, {net.inter.bandwidth_bps / 1e9:g} GB/s an adapter, "
            f"{net.rails} adapter{'s' if net.rails > 1 else ''} a node "
            f"(`sync_s` {net.sync_s:g}, `skips_empty_segments` {net.skips_empty_segments}).\n"
        )
        out += [f"- {what}: {source}" for what, source in net.sources.items()]
        out.append("")
    return "\n".join(out)


def claims_rule() -> str:
    from analysis import claims

    return "\n".join(f"> {line}" for line in claims.RULE.splitlines())


def file_block(path: str) -> str:
    text = (ROOT / path).read_text()
    language = {".yaml": "yaml", ".yml": "yaml", ".sh": "bash", ".py": "python"}.get(Path(path).suffix, "text")
    return f"`{path}`:\n\n```{language}\n{text.rstrip()}\n```"


GENERATORS = {
    "knobs": lambda arg: knobs(arg.split()),
    "algorithms": lambda arg: algorithm_table(),
    "tasks": lambda arg: task_table(),
    "task-hparams": lambda arg: task_hparams(),
    "settings": lambda arg: settings(),
    "matrix-keys": lambda arg: matrix_keys(),
    "configs": lambda arg: configs(),
    "networks": lambda arg: networks(),
    "claims-rule": lambda arg: claims_rule(),
    "file": lambda arg: file_block(arg.strip()),
}


def on_config(config: object) -> None:
    # MkDocs loads a hook with its own folder first on sys.path and pops that entry afterwards, so
    # the repository root goes in here, once the hook is loaded.
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def on_page_markdown(markdown: str, page: object, config: object, files: object) -> str:
    def fill(match: re.Match[str]) -> str:
        kind, arg = match.group(1), match.group(2)
        if kind not in GENERATORS:
            raise ValueError(f"{page}: unknown marker <!-- gen: {kind} -->")
        return GENERATORS[kind](arg)

    return MARKER.sub(fill, markdown)
