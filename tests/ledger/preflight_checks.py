"""Preflight checks the store tests register (a lane row names a registered check, never a function)."""


def down() -> bool:
    return False


def up() -> bool:
    return True
