"""The folders import one way, so a table name walks from its SQL file down to the REST answer
without climbing back up: state <- catalog <- spark_jobs <- ops <- serving <- plugins <- deploy.

Pure logic over the source (ast), no stack: a new import that climbs, a cycle, or Spark in a
folder that promises none fails here, naming the file and the import."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["state", "catalog", "spark_jobs", "ops", "serving", "statetable_airflow", "deploy"]
FOLDERS = {"statetable_airflow": ROOT / "plugins" / "statetable_airflow"}
NO_SPARK = {"state", "catalog", "ops", "serving"}


def _imports(layer: str) -> dict[str, set[str]]:
    """module -> every module it imports (at the top or inside a function), as dotted names."""
    found = {}
    for path in sorted((FOLDERS.get(layer) or ROOT / layer).glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        found[f"{layer}.{path.stem}"] = names
    return found


MODULES = {m: names for layer in LAYERS for m, names in _imports(layer).items()}


def test_every_import_between_folders_points_down():
    climbing = [f"{module} imports {name}" for module, names in MODULES.items() for name in names
                if name.split(".")[0] in LAYERS
                and LAYERS.index(name.split(".")[0]) > LAYERS.index(module.split(".")[0])]
    assert climbing == []


def test_folders_that_promise_no_spark_import_none():
    spark = [f"{module} imports {name}" for module, names in MODULES.items() for name in names
             if module.split(".")[0] in NO_SPARK and name.split(".")[0] in ("pyspark", "delta", "py4j")]
    assert spark == []


def test_state_imports_nothing_of_the_project_above_it():
    above = [f"{module} imports {name}" for module, names in MODULES.items() if module.startswith("state.")
             for name in names if name.split(".")[0] in LAYERS[1:] + ["airflow"]]
    assert above == []


def test_no_module_import_cycle():
    graph = {m: {n for n in names if n in MODULES and n != m} for m, names in MODULES.items()}
    state: dict[str, int] = {}       # 1: on the path, 2: done
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for nxt in sorted(graph[module]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_walk_sees_the_real_imports():
    """The checks above can fail only if the walk finds imports: known edges must be there."""
    assert any(n.startswith("catalog.") for n in MODULES["spark_jobs.jobs"])
    assert any(n.startswith("ops.") for n in MODULES["serving.query"])
    assert "pyspark.sql" in MODULES["spark_jobs.microbatch"]
