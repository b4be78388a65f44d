"""The package graph of src/dit_trainer is a DAG: no cycle between sub-packages (a top-level module is a
node of its own) and no private name imported across packages. Every import counts, those inside
functions included (a lazy import is still a dependency), relative ones resolved."""

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = "dit_trainer"
SRC = Path(__file__).resolve().parents[1] / "src"


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _node(root: Path, module: str):
    """The graph node a dotted module belongs to: its sub-package, or "<top>:name"; None outside the package."""
    parts = module.split(".")
    if parts[0] != PACKAGE or len(parts) < 2:
        return None
    return parts[1] if (root / PACKAGE / parts[1]).is_dir() else f"<top>:{parts[1]}"


def _is_module(root: Path, module: str) -> bool:
    path = root.joinpath(*module.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _imports(root: Path, path: Path):
    """(line, target module, imported name or None) for every import in the file, relative ones resolved."""
    here = _module_name(root, path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                # `from pkg import module` depends on that module; `from module import name` on the module.
                if alias.name != "*" and _is_module(root, sub):
                    yield node.lineno, sub, None
                else:
                    yield node.lineno, base, alias.name


def package_graph(root: Path):
    """(edges {node: {node: [where]}}, private imports across packages) of the package under `root`."""
    edges, private = defaultdict(lambda: defaultdict(list)), []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        rel = path.relative_to(root / PACKAGE)
        src = rel.parts[0] if len(rel.parts) > 1 else f"<top>:{rel.stem}"
        for line, module, name in _imports(root, path):
            dst = _node(root, module)
            if dst is None or dst == src:
                continue
            edges[src][dst].append(f"{path.relative_to(root)}:{line}")
            names = module.split(".")[2:] + ([name] if name else [])
            private += [f"{path.relative_to(root)}:{line} imports {module}.{n}" for n in names if _private(n)]
    return edges, private


def cycles(edges) -> list:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    for start in sorted(set(edges) | {d for ds in edges.values() for d in ds}):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start), on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w), on.add(w)
                work.append((w, iter(sorted(edges.get(w, ())))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return out


def _describe(edges, comps) -> str:
    return "; ".join(" <-> ".join(c) + " (" + ", ".join(f"{a}->{b} at {edges[a][b][0]}" for a in c for b in c
                                                        if b in edges.get(a, {})) + ")" for c in comps)


def test_sub_packages_form_a_dag_without_private_reaches():
    edges, private = package_graph(SRC)
    assert edges, "no imports found: is src/dit_trainer where this test looks?"
    found = cycles(edges)
    assert not found, "package cycles: " + _describe(edges, found)
    assert not private, "private names imported across packages: " + "; ".join(private)


def _write(root: Path, files: dict) -> None:
    for rel, text in files.items():
        path = root / PACKAGE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_check_sees_lazy_relative_cycles_and_private_names(tmp_path):
    _write(tmp_path, {
        "__init__.py": "",
        "leaf.py": "X = 1\n",
        "a/__init__.py": "from dit_trainer.b.impl import _hidden\nfrom dit_trainer import leaf\n",
        "b/__init__.py": "",
        "b/impl.py": "def f():\n    from ..a import thing\n    return thing\n_hidden = 1\n",
        "c/__init__.py": "from .. import leaf\n",
    })
    edges, private = package_graph(tmp_path)
    assert set(edges["a"]) == {"b", "<top>:leaf"} and set(edges["b"]) == {"a"} and set(edges["c"]) == {"<top>:leaf"}
    assert cycles(edges) == [["a", "b"]]
    assert private == ["dit_trainer/a/__init__.py:1 imports dit_trainer.b.impl._hidden"]
