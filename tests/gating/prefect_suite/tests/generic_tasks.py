# Vendored verbatim from https://github.com/PrefectHQ/prefect, tests/generic_tasks.py
# at tag 3.8.4.dev6, commit ce79dd3d6cfa2b7337265498210dbc4d25bcdc98.
# Copyright 2019- Prefect Technologies, Inc. Licensed under the Apache License, Version 2.0
# (http://www.apache.org/licenses/LICENSE-2.0; a copy is LICENSE-prefect beside this folder).
# Nothing below this header is changed; tests/gating/prefect_suite/README.md says how it runs.
import time

from prefect import task


@task(name=f"{__name__}.noop")
def noop():
    return


@task(name=f"{__name__}.add_one")
def add_one(x: int) -> int:
    return x + 1


@task(name=f"{__name__}.subtract_ten")
def subtract_ten(x: int) -> int:
    return x - 10


@task(name=f"{__name__}.sleep")
def sleep(x: float):
    time.sleep(x)


@task(name=f"{__name__}-async_multiply_by_two")
async def async_multiply_by_two(x: int) -> int:
    return x * 2
