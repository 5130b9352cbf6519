"""The student's namespace seen from the grader: every call crosses into the sandbox and comes back as data.

A suite gets one `student` per test (the `student` fixture): bound to the item the test scores, its seed and
the item's deadline, over the one sandbox of the grading session. Every request carries the from-scratch table
(autograder.grading.scoring.tripwire_table), which the sandbox takes once and watches from then on; a call of the item
carries the oracles it may not use (`watch`), and its answer the ones it called (`oracle_calls`).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from autograder.grading.checks import Fail
from autograder.grading.device_check import ON_OTHER_DEVICE, OTHER_DEVICE
from autograder.sandbox.protocol import DICT, LIST, Remote, SandboxFailure, to_student


class Student:
    """The student's namespace, seen from the grader: every call crosses into the sandbox."""

    def __init__(self, sandbox: Any, item: str, device: str, deadline: float, watch: Sequence[str] = (),
                 limit_s: float | None = None, tripwire: dict | None = None) -> None:
        self.sandbox, self.item, self.device = sandbox, item, device
        self.deadline, self.watch, self.label = deadline, list(watch), ""
        self.tripwire = tripwire  # {"oracles", "scratch", "experiments"}: what the sandbox watches, and for whom
        self.limit_s = limit_s  # the item's whole time limit, which a timeout names
        self.oracle_calls = set()
        self.seed = 0

    def case(self, label: str) -> None:
        """Name the case being checked; failure messages end with it (and, on the fake GPU, say why there)."""
        self.label = label if self.device != OTHER_DEVICE else f"{label}; {ON_OTHER_DEVICE}"

    def _left(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SandboxFailure("timeout", "ran out of its time limit")
        return left

    def _request(self, op, tensors, fields):
        """One request within the item's deadline; the oracles the answer says the item called are kept."""
        if self.tripwire:
            fields = {**fields, "tripwire": self.tripwire}
        if self.device == OTHER_DEVICE:  # its tensors and modules on the fake GPU (sandbox/child/fake_gpu.py)
            fields = {**fields, "fake_gpu": True, "item": self.item}
        answer = self.sandbox.request(op, self._left(), tensors=tensors, limit_s=self.limit_s, seed=self.seed, **fields)
        self.oracle_calls.update(answer.get("oracle_calls", []))
        return answer

    def _ask(self, op, fields, args=(), kwargs=None, raw=False, grad=None):
        """One request with its arguments (tensors sent to self.device); the answer's value, or with `raw` the answer.

        `grad` = (wrt, upstream): the arguments at `wrt` require grad, and the answer holds the gradients of
        sum_i <out_i, upstream_i> with respect to them (None in `upstream`: that output is left out).
        """
        tensors = {}
        fields = dict(fields)
        if args or kwargs or grad:
            fields["args"] = to_student(list(args), tensors, self.device)[LIST]
            fields["kwargs"] = to_student(dict(kwargs or {}), tensors, self.device)[DICT]
        if grad:
            wrt, upstream = grad
            for j in wrt:
                fields["args"][j]["grad"] = True
            keys = [None if u is None else f"u{k}" for k, u in enumerate(upstream)]
            tensors.update({key: u for key, u in zip(keys, upstream, strict=True) if key})
            fields["grad"] = {"wrt": list(wrt), "upstream": keys}
        answer = self._request(op, tensors, fields)
        return answer if raw else self.sandbox.value(answer)

    def _target(self, target):
        return {"handle": target.handle} if isinstance(target, Remote) else {"name": target}

    def call(self, name: str | Remote, *args: Any, **kwargs: Any) -> Any:
        """name(*args, **kwargs) in the student's process; tensors are sent to self.device."""
        return self._ask("call", {**self._target(name), "watch": self.watch}, args, kwargs)

    def method(self, obj: Remote, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._ask("call", {"handle": obj.handle, "method": method, "watch": self.watch}, args, kwargs)

    def grad(self, name: str | Remote, args: Sequence[Any], wrt: Sequence[int], upstream: Sequence[Any],
             method: str | None = None, **kwargs: Any) -> tuple[Any, list]:
        """(outputs, grads of sum <out_i, upstream_i> w.r.t. args[j] for j in wrt)."""
        target = {"handle": name.handle, "method": method} if isinstance(name, Remote) else {"name": name}
        return self._ask("call", {**target, "watch": self.watch}, args, kwargs, grad=(wrt, upstream))

    def new(self, name: str, *args: Any, **kwargs: Any) -> Remote:
        """An instance of the student's class, built with the grader's seed on self.device."""
        obj = self._ask("new", {"name": name, "device": self.device, "watch": self.watch}, args, kwargs)
        if not isinstance(obj, Remote):
            raise Fail(f"'{name}(...)' gave {obj!r}, expected a torch.nn.Module")
        return obj

    def state(self, obj: Remote) -> dict[str, Any]:
        """The module's state_dict() as a dict name -> tensor, in registration order."""
        answer = self._ask("state", {"handle": obj.handle}, raw=True)
        return dict(zip(answer.get("names", []), self.sandbox.value(answer), strict=False))

    def load_state(self, obj: Remote, tensors: Sequence[Any]) -> None:
        """Copy tensors into the module's state_dict() entries, by order and shape."""
        named = {f"p{k}": t for k, t in enumerate(tensors)}
        self._request("load_state", named, {"handle": obj.handle, "keys": list(named)})

    def attr(self, target: str | Remote, attr: str) -> Any:
        return self._ask("attr", {**self._target(target), "attr": attr})

    def signature(self, name: str, methods: Sequence[str] = ()) -> Any:
        return self._ask("signature", {"name": name, "methods": list(methods)})
