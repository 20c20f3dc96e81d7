"""Every public name of the package has a docstring the Python reference renders: what
rsched/__init__.py exports, and every public method and property of the classes a user
touches (Client, AsyncClient, App, JobSpec, the JobContext a handler gets, the models)."""

from __future__ import annotations

import enum
import inspect
from typing import Any

import rsched

CLASSES = ("App", "AsyncClient", "Client", "JobContext", "JobSpec", "Job", "Run", "Attempt")


def own_doc(obj: Any) -> str:
    """The object's own docstring: not a dataclass's generated signature, nor a parent's."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    if inspect.isclass(obj) and doc and doc.startswith(f"{obj.__name__}("):
        return ""  # what @dataclass writes when the class has none
    return (doc or "").strip()


def public_members(cls: type) -> dict[str, Any]:
    """Public methods and properties defined by rsched along the class's MRO."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("rsched"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(value, property):
                out[name] = value.fget
            elif isinstance(value, (staticmethod, classmethod)):
                out[name] = value.__func__
            elif inspect.isfunction(value):
                out[name] = value
    return out


def test_every_exported_name_has_a_docstring_of_its_own() -> None:
    names = [n for n in rsched.__all__ if not n.startswith("__")]
    assert len(names) > 10
    assert [n for n in names if not own_doc(getattr(rsched, n))] == []


def test_every_public_method_and_property_of_the_user_facing_classes_has_a_docstring() -> None:
    missing = []
    for cls_name in CLASSES:
        cls = getattr(rsched, cls_name)
        missing += [f"{cls_name}.{name}" for name, fn in public_members(cls).items()
                    if not own_doc(fn)]
    assert len(public_members(rsched.Client)) > 15
    assert missing == []


def test_the_enums_say_what_their_members_mean() -> None:
    enums = [getattr(rsched, n) for n in rsched.__all__
             if inspect.isclass(getattr(rsched, n, None))
             and issubclass(getattr(rsched, n), enum.Enum)]
    assert enums
    assert [e.__name__ for e in enums if not own_doc(e)] == []
