"""What a pickle's names turn into: :class:`Record` types for every class outside the allow-list
(kept as data, never run) and :class:`Allowed` for the allow-listed ones.

A record can be *created* the way pickle creates class instances (``NEWOBJ`` + ``BUILD``: it
keeps the args and state, e.g. a whole ``nn.Module``'s ``__dict__``), but *calling* its type
(``REDUCE``: ``os.system``, ``builtins.eval``, ``functools.partial`` ...) is refused with an error
naming the callable.
"""
from __future__ import annotations

from typing import Any, Callable

from .errors import Refused


class RecordType(type):
    """Metaclass of the stand-in types: instances come only from NEWOBJ (``cls.__new__``);
    a call of the type itself is a pickle REDUCE/INST of arbitrary code and is refused, and
    so is a BUILD that would set attributes on the type."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise Refused(cls.class_name)

    def __setattr__(cls, name: str, value: Any) -> None:
        raise Refused(cls.class_name, f"setting attribute {name!r} on it")

    @property
    def class_name(cls) -> str:
        return f"{cls._pickle_module}.{cls._pickle_name}"


class Record(metaclass=RecordType):
    """An object of a class outside the allow-list, kept as data and never run.

    ``args``/``kwargs``: what the pickle passed to ``__new__``; ``state``: what it passed to
    ``__setstate__`` (usually the object's ``__dict__``); ``items``/``values``: entries added to
    dict or list subclasses. ``attrs`` is the state as a dict.
    """

    _pickle_module = "?"
    _pickle_name = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> "Record":
        obj = object.__new__(cls)
        obj.args, obj.kwargs, obj.state, obj.items, obj.values = args, kwargs, None, {}, []
        return obj

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items[key] = value

    def append(self, value: Any) -> None:
        self.values.append(value)

    def extend(self, values: Any) -> None:
        self.values.extend(values)

    @property
    def class_name(self) -> str:
        return type(self).class_name

    @property
    def attrs(self) -> dict:
        state = self.state
        if isinstance(state, tuple) and len(state) == 2:  # (__dict__, slots)
            return {**(state[0] or {}), **(state[1] or {})}
        return state if isinstance(state, dict) else {}

    def __repr__(self) -> str:
        return f"<Record {self.class_name}>"


class Allowed:
    """One allow-listed name: a safe callable (``fn``) or a marker (a storage type, a torch dtype
    or a type that may only be named, ``dtype``). Frozen, so a pickle BUILD cannot alter what
    later loads see."""

    __slots__ = ("name", "kind", "fn", "dtype")

    def __init__(self, name: str, kind: str, fn: Callable | None = None, dtype: Any = None) -> None:
        for k, v in (("name", name), ("kind", kind), ("fn", fn), ("dtype", dtype)):
            object.__setattr__(self, k, v)

    def __setattr__(self, name: str, value: Any) -> None:
        raise Refused(self.name, f"setting attribute {name!r} on it")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fn is None:
            raise Refused(self.name, "it is not callable")
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return self.name
