"""The workflow's experiment matrices: a config file checked against ``config/schema.yaml``, split
into its sub-matrices, and each (algorithm, task, nodes) of them resolved as its runs will be.

The Snakefile's rules (``rules/common.smk``) call these before any run starts, so that a misspelt
key or a setting no run reads fails the dry run with one line naming the fix; ``overrides_for``
gives each run the ``key=value`` items its algorithm, task or settings know.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import yaml

import algorithms
from benchmarks import tasks
from benchmarks.config import ConfigError, ignored_settings, resolve
from benchmarks.settings import CLOCK_ONLY, SETTINGS


def yaml_value(value: object) -> str:
    """Render a config value as the text ``--set`` parses back to the same value (flow-style YAML)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").strip()


def overrides_for(algorithm: str, task: str, overrides: list[str]) -> list[str]:
    """The ``key=value`` items of a matrix's ``set:`` that this run's algorithm, task or settings know."""
    known = set(SETTINGS)
    if algorithm in algorithms.REGISTRY:
        known |= set(algorithms.params(algorithm))
    if task in tasks.REGISTRY:
        known |= set(tasks.get(task).hparams)
    return [o for o in overrides if o.partition("=")[0].strip() in known]


def check_matrix(
    algorithm_names: list[str], task_names: list[str], nodes: list[int], procs_per_node: int, overrides: list[str]
) -> None:
    """Resolve every (algorithm, task, nodes) of a matrix; raise ``ConfigError`` on the first problem.

    ``--set`` keys that belong to only some algorithms or tasks of the matrix go to the runs that
    know them (``overrides_for``); a key that no run knows is an error. Data roots are checked when
    a run starts, not here, so that a matrix can be listed (``snakemake -n``) where the data is not.
    """
    used: set[str] = set()
    for algorithm in algorithm_names:
        for task in task_names:
            mine = overrides_for(algorithm, task, overrides)
            used |= {o.partition("=")[0].strip() for o in mine}
            for n in nodes:
                resolve(algorithm, task, n, procs_per_node, 0, Path("unused"), mine, check_data=False)
    unknown = [o for o in overrides if o.partition("=")[0].strip() not in used]
    if unknown:
        resolve(
            algorithm_names[0], task_names[0], nodes[0], procs_per_node, 0, Path("unused"), unknown, check_data=False
        )


def available_algorithms(names: list[str], simulated: bool = False) -> list[str]:
    """``names`` less the algorithms that cannot run here (on the virtual cluster when ``simulated``),
    each skipped with one line on stderr.

    Unknown names are kept, so that ``check_matrix`` reports them with the list of valid ones.
    """
    kept = []
    for name in names:
        reason = algorithms.get(name).unavailable(simulated) if name in algorithms.REGISTRY else None
        if reason:
            print(f"skipping algorithm {name!r}: {reason}", file=sys.stderr)
        else:
            kept.append(name)
    return kept


MATRIX_KEYS = ("suite", "algorithms", "tasks", "nodes", "procs_per_node", "seeds", "set")
SCHEMA = Path(__file__).resolve().parent.parent / "config" / "schema.yaml"


def check_matrix_file(config: dict[str, object], name: str = "the matrix") -> None:
    """Check a workflow config against ``config/schema.yaml``; raise ``ConfigError`` with one line
    that names the key, what it should be, and a close key for a misspelt one (no schema dump)."""
    import jsonschema  # snakemake's dependency: only the workflow and its tests check matrix files

    schema = yaml.safe_load(SCHEMA.read_text())
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(config))
    if error is None:
        return
    where = "".join(f"[{p + 1}]" if isinstance(p, int) else f"{'.' if i else ''}{p}" for i, p in enumerate(error.path))
    at = f" in {where}" if where else ""
    if error.validator == "additionalProperties":
        allowed = list(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed))
        hints = [f"{k!r}{_did_you_mean(k, allowed)}" for k in unknown]
        raise ConfigError(f"{name}: unknown key {', '.join(hints)}{at}; the keys are {', '.join(allowed)}")
    if error.validator == "type":
        kind = {"array": "a list, e.g. [a, b]", "object": "a mapping of key: value", "integer": "a whole number"}
        expected = kind.get(error.validator_value, error.validator_value)
        raise ConfigError(f"{name}: {where} must be {expected}, got {error.instance!r}")
    if error.validator in ("required", "anyOf"):
        need = "suite, algorithms, tasks, nodes, procs_per_node and seeds (or matrices:)"
        raise ConfigError(f"{name}: {error.message}{at}; a matrix gives {need}")
    raise ConfigError(f"{name}: {where or 'the file'}: {error.message}")


def _did_you_mean(key: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(key, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def matrices(config: dict[str, object]) -> list[dict[str, object]]:
    """The sub-matrices of a workflow config, each complete: suite, algorithms, tasks, nodes,
    procs_per_node, seeds and set (a list of ``key=value``).

    A config is one matrix, or several under ``matrices:`` (a paper whose experiments differ in
    environment or recipe, such as DANA's homogeneous and heterogeneous runs). Each entry inherits
    every top-level key it does not give; its ``set`` is merged over the top-level one. Suites must
    differ, since a run's identity within a suite is task, algorithm, nodes and seed.

    Under ``matrices:`` the top-level ``set`` is every matrix's default, whatever its clock: a key of
    it that a matrix's clock ignores (``ignored_settings``) is left out of that matrix's runs, and one
    that every matrix's clock ignores is an error. A key of an entry's own ``set`` (or of a config's
    only matrix) that its clock ignores is refused when its runs are resolved (``check_matrix``).
    """
    base = {k: config[k] for k in MATRIX_KEYS if k in config}
    entries = config.get("matrices") or [{}]
    defaults = set(base.get("set", {})) if config.get("matrices") else set()
    result, suites, read = [], set(), set()
    for n, entry in enumerate(entries):
        m = {**base, **{k: v for k, v in entry.items() if k != "set"}}
        m["set"] = {**base.get("set", {}), **entry.get("set", {})}
        clock = str(m["set"].get("clock", SETTINGS["clock"][1]))
        dropped = (defaults - set(entry.get("set", {}))) & ignored_settings(clock)
        m["set"] = {k: v for k, v in m["set"].items() if k not in dropped}
        read |= defaults - dropped
        missing = [k for k in MATRIX_KEYS if k not in m]
        if missing:
            raise ConfigError(
                f"matrix {n + 1} ({m.get('suite', '?')}) lacks {', '.join(missing)}: give them "
                "at the top level of the config or in the entry"
            )
        if m["suite"] in suites:
            raise ConfigError(f"two matrices share the suite {m['suite']!r}; give each its own suite")
        suites.add(m["suite"])
        m["overrides"] = [f"{k}={yaml_value(v)}" for k, v in m["set"].items()]
        result.append(m)
    unread = sorted(defaults - read)
    if unread:
        owner = {k: clock for clock, keys in CLOCK_ONLY.items() for k in keys}
        names = ", ".join(f"{k} (clock={owner[k]} only)" for k in unread)
        raise ConfigError(
            f"set: {names} at the top level: no matrix of this config runs on that clock, so no run reads "
            "it; leave it out, or run a matrix on that clock"
        )
    return result
