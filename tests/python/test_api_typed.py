"""Issue 33: the package as Python users expect it. Every public name of kiln (kiln.__all__)
and of kiln.torch has a docstring, every parameter and return of its functions and methods an
annotation that resolves (typing.get_type_hints: with `from __future__ import annotations` a
misspelt name would otherwise pass unseen), and help(kiln.Model) shows the class's docstring.
The checker is run on a function that lacks them, so the test can fail."""

import inspect
import pydoc
import typing

import kiln


def problems(obj, where):
    """What a public callable lacks: a docstring, annotations on its parameters and return, or
    annotations that resolve. Classes: their own docstring, and each public method, property,
    classmethod and staticmethod they define (and __init__)."""
    out = []
    if inspect.isclass(obj):
        if not obj.__dict__.get("__doc__"):
            out.append(f"{where}: no docstring")
        for name, member in obj.__dict__.items():
            if name.startswith("_") and name != "__init__":
                continue
            if isinstance(member, property):
                out += problems_fn(member.fget, f"{where}.{name} (property)", returns_only=True)
            elif isinstance(member, (classmethod, staticmethod)):
                out += problems_fn(member.__func__, f"{where}.{name}")
            elif inspect.isfunction(member):
                out += problems_fn(member, f"{where}.{name}", doc=name != "__init__")
        return out
    if callable(obj):
        return problems_fn(obj, where)
    return out


def problems_fn(fn, where, returns_only=False, doc=True):
    out = []
    if doc and not (fn.__doc__ or "").strip():
        out.append(f"{where}: no docstring")
    sig = inspect.signature(fn)
    for i, (name, p) in enumerate(sig.parameters.items()):
        if returns_only or (i == 0 and name in ("self", "cls")):
            continue
        if p.annotation is inspect.Parameter.empty:
            out.append(f"{where}: parameter {name!r} has no annotation")
    if sig.return_annotation is inspect.Signature.empty:
        out.append(f"{where}: no return annotation")
    try:
        typing.get_type_hints(fn)
    except Exception as e:  # a NameError, a syntax error in a string annotation
        out.append(f"{where}: annotations do not resolve ({type(e).__name__}: {e})")
    return out


def public_of_torch():
    try:
        import kiln.torch as kt
    except ImportError:  # pragma: no cover - Debian's python3-torch is there in the tests
        return {}
    return {f"kiln.torch.{n}": v for n, v in vars(kt).items()
            if not n.startswith("_") and (inspect.isfunction(v) or inspect.isclass(v))
            and getattr(v, "__module__", None) == "kiln.torch"}


def test_api_typed_every_public_name():
    named = {f"kiln.{n}": getattr(kiln, n) for n in kiln.__all__}
    named.update(public_of_torch())
    assert "kiln.torch.TSMoE" in named and "kiln.split" in named, sorted(named)
    found = [p for where, obj in sorted(named.items()) for p in problems(obj, where)]
    assert not found, "\n".join(found)


def test_api_typed_checker_can_fail():
    def bare(a, b=1):
        return a

    def typed(a: int, b: int = 1) -> int:
        """Typed."""
        return a

    def unresolved(a: "NoSuchType") -> int:  # noqa: F821
        """Misspelt."""
        return 0

    class Bare:
        def method(self, x):
            return x

    got = problems(bare, "bare")
    assert "bare: no docstring" in got and "bare: parameter 'a' has no annotation" in got
    assert "bare: no return annotation" in got
    assert problems(typed, "typed") == []
    assert any("do not resolve" in p for p in problems(unresolved, "unresolved"))
    got = problems(Bare, "Bare")
    assert "Bare: no docstring" in got and "Bare.method: parameter 'x' has no annotation" in got


def test_api_typed_help_shows_docstrings():
    text = pydoc.render_doc(kiln.Model, renderer=pydoc.plaintext)
    doc = inspect.getdoc(kiln.Model)
    assert doc and doc.splitlines()[0] in text, text[:400]
    assert "def forward" not in text and "forward(self, features: 'Any') -> 'np.ndarray'" in text
    assert inspect.getdoc(kiln.Model.forward).splitlines()[0] in text
    for obj in (kiln.Dataset, kiln.Split, kiln.Run, kiln.Stream, kiln.Error):
        text = pydoc.render_doc(obj, renderer=pydoc.plaintext)
        assert inspect.getdoc(obj).splitlines()[0] in text, obj
