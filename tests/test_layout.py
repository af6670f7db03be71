"""The package's layout rules, read from the source (ast; nothing is imported):

1. no import cycle between modules (module-level and function-level imports alike; importing
   `starpo_jax.rollout.host` from outside rollout/ also runs rollout/__init__.py);
2. a module imports only modules of its own folder or of a lower rank (RANKS);
3. no private name (`_x`) of another module: neither `from m import _x` nor `m._x`;
4. nothing in the package imports the public facade, starpo_jax.api.

Pre-existing violations that another change is removing are listed in KNOWN with why; an entry
that no longer occurs fails too, so that the list shrinks as they are fixed.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "starpo_jax"

# folder (or root module) -> rank; "" is the package root (config.py, phases.py)
RANKS = {"": 0, "text": 1, "models": 1, "algo": 2, "rollout": 3, "train": 4, "sizing": 5,
         "run": 6, "analysis": 7, "api": 8}

# violation key -> why it is still there (the change that removes it deletes the entry)
KNOWN: dict[str, str] = {}  # none left: the package has no upward import, cycle or private name


class Package:
    """The modules of a package directory (`root/<name>/**.py`) and their imports."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.modules = {self.module_name(p): p for p in sorted(directory.rglob("*.py"))}
        self.packages = {m for m, p in self.modules.items() if p.name == "__init__.py"}
        self.name = directory.name

    def module_name(self, path: Path) -> str:
        parts = path.relative_to(self.directory.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def folder(self, module: str) -> str:
        """starpo_jax.run.loop -> "run"; starpo_jax.config -> ""; starpo_jax.api -> "api"."""
        parts = module.split(".")
        if len(parts) > 2 or module in self.packages and len(parts) == 2:
            return parts[1]
        return "api" if module == f"{self.name}.api" else ""

    def imports(self, module: str, tree: ast.Module) -> list[tuple[str, str | None, int]]:
        """(imported module, imported name or None, line) per import of a package module."""
        base = module if module in self.packages else module.rpartition(".")[0]
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(a.name, None, node.lineno) for a in node.names
                          if a.name in self.modules]
            elif isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:  # relative: from the importer's package upwards
                    keep = base.split(".")[: len(base.split(".")) - node.level + 1]
                    source = ".".join(keep + ([source] if source else []))
                if source.split(".")[0] != self.name:
                    continue
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    found.append((sub, None, node.lineno) if sub in self.modules
                                 else (source, alias.name, node.lineno))
        return found

    def module_aliases(self, tree: ast.Module) -> dict[str, str]:
        """Local name -> package module, for the modules a file imports as objects."""
        names = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(self.name):
                for a in node.names:
                    if f"{node.module}.{a.name}" in self.modules:
                        names[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                names.update({a.asname: a.name for a in node.names
                              if a.asname and a.name in self.modules})
        return names

    def violations(self, known: dict[str, str]) -> dict[str, str]:
        """Every broken rule: key (as in KNOWN) -> a readable line. Edges listed in `known`
        are left out of the cycle search."""
        found: dict[str, str] = {}
        edges: dict[str, dict[str, int]] = {m: {} for m in self.modules}
        for module, path in self.modules.items():
            where = path.relative_to(self.directory.parent)
            tree = ast.parse(path.read_text())
            for target, name, line in self.imports(module, tree):
                if target == module:
                    continue
                edges[module].setdefault(target, line)
                parent = target.rpartition(".")[0]
                if (parent in self.packages and parent != self.name
                        and not module.startswith(parent + ".") and module != parent):
                    edges[module].setdefault(parent, line)  # its __init__ runs first
                if name and name.startswith("_"):
                    found[f"{module} -> {target}.{name}"] = (
                        f"{where}:{line} imports the private name {name} of {target}")
                mine, theirs = self.folder(module), self.folder(target)
                if theirs == "api" and mine != "api":
                    found[f"{module} -> {target}"] = (
                        f"{where}:{line} imports {target}, the public facade: import the "
                        f"module that defines the name (run/experiment.py, run/loop.py, ...)")
                elif mine != theirs and RANKS[theirs] >= RANKS[mine]:
                    found[f"{module} -> {target}"] = (
                        f"{where}:{line} imports {target}: {theirs or 'the root'} (rank "
                        f"{RANKS[theirs]}) is not below {mine or 'the root'} (rank "
                        f"{RANKS[mine]}); move the shared piece down")
            aliases = self.module_aliases(tree)
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                        and node.value.id in aliases and aliases[node.value.id] != module
                        and node.attr.startswith("_") and not node.attr.startswith("__")):
                    target = aliases[node.value.id]
                    found[f"{module} -> {target}.{node.attr}"] = (
                        f"{where}:{node.lineno} uses the private name {node.attr} of {target}")
        graph = {m: {t for t in ts if f"{m} -> {t}" not in known} for m, ts in edges.items()}
        self.graph = graph
        for cycle in cycles(graph):
            steps = [f"{a} ({self.modules[a].relative_to(self.directory.parent)}:{edges[a][b]})"
                     for a, b in zip(cycle, cycle[1:] + cycle[:1])]
            found["cycle " + " -> ".join(cycle)] = "import cycle: " + " -> ".join(steps)
        return found

    def closes_cycle(self, edge: str) -> bool:
        """Whether the import `edge` ("a -> b", left out of the graph) would close a cycle:
        b reaches a through the other imports."""
        source, target = edge.split(" -> ")
        seen, todo = set(), [target]
        while todo:
            node = todo.pop()
            if node == source:
                return True
            if node not in seen:
                seen.add(node)
                todo += self.graph.get(node, ())
        return False


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path, first module repeated implicitly) per strongly connected component
    of more than one module (Tarjan's algorithm, iterative over a sorted graph)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(set(component))
            elif child not in graph:
                continue
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return [_path_in(component, graph) for component in components]


def _path_in(component: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first)."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return path[::-1]
                if child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def test_the_package_keeps_its_layout():
    found = Package(PACKAGE).violations(KNOWN)
    new = sorted(line for key, line in found.items() if key not in KNOWN)
    assert not new, "layout rules broken (docs/architecture.md):\n" + "\n".join(new)


def test_known_violations_still_exist():
    """A fixed violation leaves KNOWN with its fix."""
    package = Package(PACKAGE)
    found = package.violations(KNOWN)  # a cycle's allowed edge is an import, not a violation
    stale = sorted(key for key in KNOWN if key not in found and not package.closes_cycle(key))
    assert not stale, "fixed; delete from tests/test_layout.py's KNOWN: " + ", ".join(stale)


def test_each_rule_fires_on_a_planted_violation(tmp_path):
    """A made-up package breaking each rule once (function-level imports included)."""
    files = {
        "__init__.py": "",
        "config.py": "",
        "api.py": "from pkg.run.loop import train\n",
        "text/__init__.py": "",
        "text/parse.py": "def f():\n    from pkg.rollout.sampling import stop\n",  # upward
        "rollout/__init__.py": "from pkg.rollout.sampling import stop\n",
        "rollout/sampling.py": "from pkg.text import parse\nstop = parse\n",
        "models/__init__.py": "",
        "models/a.py": "from pkg.models.b import x\n",
        "models/b.py": "def g():\n    from pkg.models import a\n    return a._hidden\n",
        "run/__init__.py": "",
        "run/loop.py": "from pkg.config import _fail\ndef train():\n    from pkg import api\n",
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    found = Package(tmp_path / "pkg").violations({})
    assert set(found) == {
        "pkg.text.parse -> pkg.rollout.sampling",
        "cycle pkg.rollout -> pkg.rollout.sampling -> pkg.text.parse",
        "cycle pkg.models.a -> pkg.models.b",
        "pkg.models.b -> pkg.models.a._hidden",
        "pkg.run.loop -> pkg.config._fail",
        "pkg.run.loop -> pkg.api",
        "cycle pkg.api -> pkg.run.loop",
    }, found
    assert found["pkg.text.parse -> pkg.rollout.sampling"] == (
        "pkg/text/parse.py:2 imports pkg.rollout.sampling: rollout (rank 3) is not below text "
        "(rank 1); move the shared piece down")
    assert found["cycle pkg.models.a -> pkg.models.b"] == (
        "import cycle: pkg.models.a (pkg/models/a.py:1) -> pkg.models.b (pkg/models/b.py:2)")
    allowed = Package(tmp_path / "pkg")  # a KNOWN edge breaks its cycle while it closes one
    assert "cycle pkg.models.a -> pkg.models.b" not in allowed.violations(
        {"pkg.models.b -> pkg.models.a": "planted"})
    assert allowed.closes_cycle("pkg.models.b -> pkg.models.a")
    assert not allowed.closes_cycle("pkg.models.a -> pkg.models.b")
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
