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
    for path in _files(layer):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        found[_module(layer, path)] = names
    return found


def _files(layer: str) -> list[Path]:
    """A layer's modules, its wings' (sub-packages, e.g. spark_jobs/passes/) included."""
    return sorted((FOLDERS.get(layer) or ROOT / layer).rglob("*.py"))


def _module(layer: str, path: Path) -> str:
    """The dotted name of a layer's file: spark_jobs/passes/base.py -> spark_jobs.passes.base; a
    package's __init__ is the package."""
    parts = path.relative_to(FOLDERS.get(layer) or ROOT / layer).with_suffix("").parts
    return ".".join((layer, *parts[:-1]) if parts[-1] == "__init__" else (layer, *parts))


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
    assert "pyspark.sql" in MODULES["spark_jobs.steps.sql_step"]


def _sources() -> dict[str, ast.Module]:
    return {_module(layer, path): ast.parse(path.read_text(), str(path)) for layer in LAYERS for path in _files(layer)}


SOURCES = _sources()


def _private_names(tree: ast.Module) -> set[str]:
    """Underscore names a module defines: its functions, classes, constants and their methods."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _root(node: ast.AST) -> str:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return getattr(node, "id", "")


def _foreign_names(tree: ast.Module) -> set[str]:
    """Names a module binds to other libraries' modules and objects (their privates are theirs)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] not in LAYERS)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] not in LAYERS:
            names.update(a.asname or a.name for a in node.names)
    return names


def test_no_module_reaches_into_another_modules_underscore_names():
    """A module's underscore names are its own: another module neither imports them nor calls
    them on an object (as the batch path once called the runner's `_partials`), so a newcomer
    can change a private helper knowing every caller is in the same file."""
    owners: dict[str, set[str]] = {}
    for module, tree in SOURCES.items():
        for name in _private_names(tree):
            owners.setdefault(name, set()).add(module)
    reached = []
    for module, tree in SOURCES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LAYERS:
                reached += [f"{module}:{node.lineno} imports {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
            elif isinstance(node, ast.Attribute) and node.attr in owners and module not in owners[node.attr] \
                    and _root(node) not in {"self", "cls"} | _foreign_names(tree):
                reached.append(f"{module}:{node.lineno} uses .{node.attr} of {sorted(owners[node.attr])}")
    assert reached == []


def test_the_batch_path_reads_as_small_steps():
    """#44, #67: the runner only orders the steps (plan, pass, merge, commit, after-commit); no
    module of the Spark layer is over 600 lines, no class over 250."""
    assert len((ROOT / "spark_jobs" / "batches" / "microbatch.py").read_text().splitlines()) < 350
    long = [f"{path.relative_to(ROOT)}: {n} lines" for path in _files("spark_jobs")
            if (n := len(path.read_text().splitlines())) > 600]
    assert long == []
    big = [f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines" for module, tree in SOURCES.items()
           if module.startswith("spark_jobs.") for node in ast.walk(tree)
           if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 250]
    assert big == []
    runner = next(n for n in SOURCES["spark_jobs.batches.microbatch"].body
                  if isinstance(n, ast.ClassDef) and n.name == "MicroBatchRunner")
    init = next(n for n in runner.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    called = {c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", "")
              for c in ast.walk(init) if isinstance(c, ast.Call)}
    assert called <= {"TableRun", "pass_for"}, f"the runner's constructor calls {sorted(called)}: no I/O there"


KIND_FACTS = {"kind", "over_table", "table_join", "input_table"}


def test_only_pass_for_asks_a_tables_kind():
    """#67: a table kind is a Pass (spark_jobs/passes/); the modules around the passes ask it, or
    are handed what it says, and never read the kind off the definition themselves: a new kind is
    one module in passes/, not an edit in a dozen rooms. (`join.kind`, inner or left, is a join's.)"""
    asked = [f"{module}:{node.lineno} .{node.attr}" for module, tree in SOURCES.items()
             if module.startswith("spark_jobs.") and not module.startswith("spark_jobs.passes")
             for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in KIND_FACTS
             and not (isinstance(node.value, ast.Name) and node.value.id == "join")]
    assert asked == []
    init = SOURCES["spark_jobs.passes"]
    branching = [f.name for f in init.body if isinstance(f, ast.FunctionDef)
                 and any(isinstance(n, ast.Attribute) and n.attr in KIND_FACTS for n in ast.walk(f))]
    assert branching == ["pass_for"]
    inside = [f"{module}:{node.lineno}" for module, tree in SOURCES.items()
              if module.startswith("spark_jobs.passes.") for node in ast.walk(tree)
              if isinstance(node, ast.Attribute) and node.attr in {"kind", "over_table", "table_join"}]
    assert inside == [], "the passes themselves know their kind by being it"


# spark_jobs/'s wings by floor, top first (#67): a module imports its own wing and the floors
# below it, never one above; batches/ and recompute/ stand side by side over passes/. The entry
# points (jobs, submit, smoke, warmup, worker_daemon) stand over every wing, errors under all of them.
WING_FLOORS = {"batches": 6, "recompute": 6, "passes": 5, "steps": 4, "delta": 3, "frames": 2, "engine": 1}
ENTRY_POINTS = {"spark_jobs.jobs", "spark_jobs.submit", "spark_jobs.smoke", "spark_jobs.worker_daemon",
                "spark_jobs.warmup"}


def _floor(module: str) -> int:
    if module in ENTRY_POINTS or module == "spark_jobs":
        return 7
    if module == "spark_jobs.errors":
        return 0
    return WING_FLOORS[module.split(".")[1]]


def test_spark_jobs_wings_import_down_their_floors():
    """A wing's module imports its own wing or the floors below (the map: spark_jobs/__init__.py)."""
    # A wing may hold a package of its own (frames/formats/): it stands on its wing's floor.
    assert {path.relative_to(ROOT / "spark_jobs").parts[0] for path in _files("spark_jobs")
            if path.parent.name != "spark_jobs"} == set(WING_FLOORS)
    top = {_module("spark_jobs", path) for path in _files("spark_jobs") if path.parent.name == "spark_jobs"}
    assert top - ENTRY_POINTS == {"spark_jobs", "spark_jobs.errors"}, "a new module belongs in a wing"
    wing = lambda m: "entry points" if m in ENTRY_POINTS else m.split(".")[1]
    up = [f"{module} imports {name}" for module, names in MODULES.items() if module.startswith("spark_jobs.")
          for name in names if name in MODULES and name.startswith("spark_jobs.") and name != "spark_jobs"
          and wing(name) != wing(module) and _floor(name) >= _floor(module)]
    assert up == []


# What frames/ may not import: a store of the product or a client that reads one. A frame is
# handed what it reads (TableFrames' `inputs`, the Arrow pass's `write_file`), so it can be
# built and tested over in-memory data.
STORAGE = ("catalog.batch_log", "catalog.registry", "catalog.runtime", "state.table.StateTable", "state.changelog",
           "state.snapshots", "state.backends", "state.partition", "state.restore", "state.kafka_admin",
           "confluent_kafka", "deltalake", "delta", "pyarrow.fs", "pyarrow.parquet", "rocksdict", "spark_jobs.delta",
           "spark_jobs.steps", "spark_jobs.engine.session")


def test_frames_read_no_storage():
    found = [f"{module} imports {name}" for module, names in MODULES.items() if module.startswith("spark_jobs.frames")
             for name in names if any(name == s or name.startswith(s + ".") for s in STORAGE)]
    assert found == []


def test_every_package_of_the_product_is_in_the_wheel():
    """The wheel lists its packages (pyproject.toml): a new wing left out installs, then fails to
    import in a team's Airflow (spark_jobs.passes did, caught only by the install test)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {_module(layer, init) for layer in LAYERS for init in _files(layer) if init.name == "__init__.py"}
    assert found == listed


BUILTINS = {"ValueError", "RuntimeError", "TypeError", "KeyError", "LookupError", "OSError", "Exception", "IOError",
            "PermissionError", "FileNotFoundError", "TimeoutError", "SystemExit", "IndexError"}
# Raised and caught inside one evaluator as control flow ("this text is no number"), never out
# of it: the evaluators are total (tests/test_fuzz.py).
CONTROL_FLOW = {"catalog.expressions", "spark_jobs.frames.arrow_values"}


def test_no_product_code_raises_a_bare_builtin():
    """#67: `raise ValueError(...)` escaped `except StatetableError` and exited 1 for a mistake
    the user can fix; every such raise is a named error of its layer (state.errors has the tree),
    or, in an evaluator's control flow, caught where it is raised. A module's own command line
    (`if __name__ == "__main__"`) may exit with its usage."""
    def raises(node, found: list) -> list:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
            return found
        if isinstance(node, ast.Raise) and node.exc is not None:
            called = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(called, ast.Name) and called.id in BUILTINS:
                found.append(f"{node.lineno} raise {called.id}")
        for child in ast.iter_child_nodes(node):
            raises(child, found)
        return found

    bare = {module: found for module, tree in SOURCES.items() if module not in CONTROL_FLOW
            and (found := raises(tree, []))}
    assert bare == {}
