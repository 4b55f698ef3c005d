"""Preflight callables used by the store tests (``module:function`` specs)."""


def down() -> bool:
    return False


def up() -> bool:
    return True
