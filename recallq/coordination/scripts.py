"""Lua scripts kept as .lua files beside this module, registered with a Redis client."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis import Redis
    from redis.commands.core import Script


@cache
def source(name: str) -> str:
    return resources.files(__package__).joinpath(f"{name}.lua").read_text()


def register(redis: Redis, name: str) -> Script:
    """The script `name`.lua, ready to call as script(keys=..., args=...)."""
    return redis.register_script(source(name))
