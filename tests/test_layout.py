"""Specification of the package's layout: folders name the flow, and imports only point down."""

from __future__ import annotations

import ast

from tests import paths

PACKAGE = paths.REPO / "exporter"

#: Each folder's floor: a module may import its own folder and anything on a lower floor.
FLOORS: dict[str, int] = {
    "__main__": 7,
    "cli": 6,
    "testing": 5,
    "service": 4,
    "sim": 4,
    "sweep": 4,
    "sizing": 3,
    "vllm": 2,
    "gpu": 2,
    "core": 1,
    "": 0,  # exporter/__init__.py, errors.py, validation.py
}


def _module(path_parts: tuple[str, ...]) -> str:
    return ".".join(part.removesuffix(".py") for part in path_parts).removesuffix(".__init__")


def _imports() -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports (type-only included).

    ``from exporter.sim import families`` imports the module ``exporter.sim.families``; a name
    that is not a module is imported from the module named.
    """
    files = {_module(p.relative_to(paths.REPO).parts): p for p in PACKAGE.rglob("*.py")}
    found: dict[str, set[str]] = {}
    for name, path in sorted(files.items()):
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    targets.add(submodule if submodule in files else node.module)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
        found[name] = {t for t in targets if t in files and t != name}
    return found


def _floor(module: str) -> tuple[str, int]:
    parts = module.split(".")
    folder = parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in FLOORS) else ""
    return folder, FLOORS[folder]


def test_every_folder_of_the_package_has_a_floor() -> None:
    """A new folder must be placed in the flow before it can hold code."""
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(FLOORS) - {"", "__main__"}


def test_imports_only_point_down_or_within_a_folder() -> None:
    """A module imports its own folder or a lower floor: never a higher one, nor a sibling."""
    wrong = []
    for module, targets in _imports().items():
        folder, floor = _floor(module)
        for target in targets:
            target_folder, target_floor = _floor(target)
            if target_folder != folder and target_floor >= floor:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(sorted(wrong))


def test_no_module_imports_itself_back_through_others() -> None:
    """No import circle, inside a folder or across folders."""
    graph = _imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[str] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "\n".join(circles)
