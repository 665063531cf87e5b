"""Loading other packages' plugins (losses, evaluation tasks) from their entry points."""

from __future__ import annotations

_LOADED: set[str] = set()


def load_plugins(group: str) -> None:
    """Import every module an installed package declares in the entry-point `group`, once per process.

    Importing such a module is what registers its plugins (it calls `register_loss` or `register_task`). A group
    counts as loaded before its modules are imported, so a plugin whose import fails raises once and is then left
    out instead of failing every later lookup.
    """
    if group in _LOADED:
        return
    _LOADED.add(group)
    from importlib.metadata import entry_points

    for entry_point in entry_points(group=group):
        entry_point.load()
