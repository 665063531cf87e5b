"""The checking program run inside the sandbox: a model-written solution, then its benchmark's tests.

This file is never imported by trl_emo: `_code_execution` reads it as text and runs it with
`Sandbox.run`, which hands it `SANDBOX_INPUT` (the fields below). Standard library only, and only
modules that are cheap to import (every program pays for them).

Fields (length-prefixed, UTF-8): the run's token, the solution, the test setup (definitions the
checks use: imports, helper classes, HumanEval's `def check(candidate)`), the checks (MBPP's
asserts, HumanEval's `check(entry_point)`).

How the verdict is protected against the usual shortcuts:
- The token is printed, by this program, only after every check has run; the parent counts a
  program as passed only when it exits with status 0 AND printed the token. A solution that calls
  `sys.exit(0)` / `os._exit(0)` before the checks, or whose checks raise, never prints it, and it
  cannot print it itself: the token is drawn per run by the parent, after the model wrote the
  solution, and is not in the program text, the command line, the environment or any file.
- The checks see the solution's functions through a guard that turns every value they return into
  plain built-in data (exact `int`, `float`, `str`, `list`, `dict`, ... rebuilt through the
  built-in types' own methods, subclasses included; generators and other built-in iterators wrapped
  so that what they yield is converted too; `Fraction`, `Decimal`, `range` kept). So `==`, `<`,
  `in`, truth tests and arithmetic in the checks run on built-in objects and never call a method
  the solution defined: an answer object whose `__eq__` always returns True fails. A value that
  cannot be converted (an instance of a class the solution defined) fails the program, even if a
  check swallowed the error.
- The solution's own calls to its functions are not guarded (its globals are its own; the checks
  run in a copy of them), so recursion depth and speed are unchanged.
Out of scope (the sandbox still contains it): a program written to attack this checker from inside
its own process (reading this program's frames or memory, rebinding built-ins the checks use).
"""

import builtins
import os
import sys


class UntrustedResult(Exception):
    """A solution returned a value the checks cannot compare safely."""


def _fields(data):
    out = []
    while data:
        split = data.index(b"\n")
        size = int(data[:split])
        out.append(data[split + 1 : split + 1 + size].decode("utf-8"))
        data = data[split + 1 + size :]
    return out


def _code_names(code):
    """Every global name `code` and the functions it defines may look up."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _code_names(const)
    return names


def _run(data):
    token, solution, setup, checks = _fields(data)
    state = {"untrusted": None}
    scalars = {type(None), bool, int, float, complex, str, bytes, type(Ellipsis), type(NotImplemented), range}
    test_types = set()
    iterator_types = {
        type(x) for x in (
            (i for i in ()), map(len, ()), filter(None, ()), zip(), enumerate(()), reversed(()), iter([]), iter(()),
            iter(""), iter(b""), iter(set()), iter(range(0)), iter({}), iter({}.values()), iter({}.items()),
            reversed([]), reversed(range(0)), iter(bytearray()),
        )
    }
    view_types = (type({}.keys()), type({}.values()), type({}.items()))

    def stdlib_number(kind):
        for module, name in (("fractions", "Fraction"), ("decimal", "Decimal")):
            loaded = sys.modules.get(module)
            if loaded is not None and getattr(loaded, name, None) is kind:
                return True
        return False

    def canonical(value, memo):
        kind = type(value)
        if kind in scalars or kind in test_types:
            return value
        key = id(value)
        if key in memo:
            return memo[key]
        # Subclasses of the built-in types are rebuilt through the built-in type's own methods, never the
        # subclass's overrides (a `str` subclass with a lying `__eq__` becomes a plain `str`).
        if isinstance(value, int):  # bool is final: handled above
            return int.__int__(value)
        if isinstance(value, float):
            return float.__float__(value)
        if isinstance(value, complex):
            return complex(complex.real.__get__(value), complex.imag.__get__(value))
        if isinstance(value, str):
            return str.__str__(value)
        if isinstance(value, bytes):
            return bytes.__getitem__(value, slice(None))
        if isinstance(value, list):
            out = memo[key] = []
            out.extend(canonical(item, memo) for item in list.copy(value))
            return out
        if isinstance(value, tuple):
            return tuple(canonical(item, memo) for item in tuple.__getitem__(value, slice(None)))
        if isinstance(value, dict):
            out = memo[key] = {}
            for k, v in dict.items(dict.copy(value)):
                out[canonical(k, memo)] = canonical(v, memo)
            return out
        if isinstance(value, (set, frozenset)):
            items = [canonical(item, memo) for item in set(value)]
            return frozenset(items) if isinstance(value, frozenset) else set(items)
        if kind is bytearray:
            return bytearray(value)
        if kind in view_types:
            if kind is view_types[0]:
                return dict.fromkeys([canonical(k, memo) for k in value]).keys()
            if kind is view_types[1]:
                return dict(enumerate(canonical(v, memo) for v in value)).values()
            return dict((canonical(k, memo), canonical(v, memo)) for k, v in value).items()
        if kind in iterator_types:
            return (canonical(item, {}) for item in value)
        if stdlib_number(kind):
            return value
        state["untrusted"] = kind.__qualname__
        raise UntrustedResult(
            f"the solution returned an object of type {kind.__qualname__}, which the checks cannot compare safely"
        )

    def guard(function):
        def guarded(*args, **kwargs):
            return canonical(function(*args, **kwargs), {})

        for attribute in ("__name__", "__qualname__", "__doc__"):
            setattr(guarded, attribute, getattr(function, attribute, None))
        guarded.__wrapped__ = function
        return guarded

    namespace = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(solution, "solution.py", "exec"), namespace)
    setup_code = compile(setup, "tests.py", "exec")
    checks_code = compile(checks, "checks.py", "exec")
    referenced = _code_names(setup_code) | _code_names(checks_code)
    function_type = type(_fields)
    # The checks run in a copy of the solution's globals, where its functions are guarded.
    tests = dict(namespace)
    for name, value in namespace.items():
        if name in referenced and type(value) is function_type and value.__code__.co_filename == "solution.py":
            tests[name] = guard(value)
    before = dict(tests)
    exec(setup_code, tests)
    added = {name: value for name, value in tests.items() if before.get(name) is not value}
    test_types.update(value for value in added.values() if isinstance(value, type))
    # As in one shared file: the solution's functions may use what the setup defines (MBPP's test_setup_code).
    for name, value in added.items():
        namespace.setdefault(name, value)
    exec(checks_code, tests)
    if state["untrusted"] is not None:
        kind = state["untrusted"]
        sys.stderr.write(f"UntrustedResult: the solution returned an object of type {kind} (a check caught the error)\n")
        sys.stderr.flush()
        os._exit(3)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os.write(1, ("\n" + token + "\n").encode())
    os._exit(0)


if __name__ == "__main__" and "SANDBOX_INPUT" in globals():
    _run(globals().pop("SANDBOX_INPUT"))
