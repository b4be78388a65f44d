"""Packages whose public names load on first use, so that `dit --help` and config reading stay
torch-free: one `__getattr__`/`__dir__` pair for every such `__init__`."""

import importlib


def lazy_exports(package: str, table: dict, namespace: dict):
    """(`__getattr__`, `__dir__`) for `package`: `table` maps a name to the module defining it
    (absolute, or relative to `package`); `namespace` is the package's `globals()`."""

    def __getattr__(name):
        if name in table:
            module = table[name]
            if not module.startswith(package.split(".")[0]):
                module = f"{package}.{module}"
            return getattr(importlib.import_module(module), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        # The lazy names are what a user looks for; list them beside the module's own attributes.
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__


def resolve(target: str):
    """The object a "module:attr" string names (attr may be dotted): how registries name their factories
    without importing them until asked."""
    module_name, attr = target.split(":")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def register_target(table: dict, name: str, target: str, what: str) -> None:
    """`table[name] = target` ("module:attr"), for a registry of `what`s; a malformed target, or a name
    another target holds, is a ValueError."""
    if ":" not in target:
        raise ValueError(f"{what} target {target!r} must read 'module:attr'")
    if name in table and table[name] != target:
        raise ValueError(f"{what} {name!r} is already registered as {table[name]}")
    table[name] = target
