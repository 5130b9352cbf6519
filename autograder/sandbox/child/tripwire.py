"""The from-scratch rule at run time: the oracles course.yaml names, watched where they live. See Tripwire."""
import sys


class Tripwire:
    """The from-scratch rule at run time: the oracles course.yaml names, watched at the functions themselves.

    The grader sends the table (oracle name -> dotted paths; this script reads no course file). A path is
    watched once its module is loaded (one the student imports later, from the next request on):
    - a Python function (F.mse_loss, nn.MultiheadAttention.forward, scipy's subspace_angles, PCA.fit) is patched
      in place, its code object swapped, so every reference to it reaches the watch: aliases the student's cells
      stored while loading, getattr with a built name, importlib, a subclass's super() call;
    - a built-in (torch's C functions: F.scaled_dot_product_attention is torch._C._nn's) is replaced where its
      module holds it, and while a check calls the student's code a TorchFunctionMode matches it by identity
      however it was reached (a stored alias, torch._C, torch.ops.aten's packets and overloads).
    Calls count only while the grader asks: during a check's call (`checking`) every call of an oracle the
    item may not use is the item's; during an experiment's training (`training`) only the calls made while a
    frame of the item's own cell is on the stack, so the harness's own code (a baseline's nn.MultiheadAttention,
    a loss) never counts. The mode is left out of training: it would tax every torch call of every step.
    """

    def __init__(self, torch):
        self.torch = torch
        self.oracles, self.scratch, self.experiments = {}, {}, {}
        self.pending = []      # (oracle, path) not resolved yet
        self.names = {}        # id(watched object) -> the oracles it stands for (a path may be listed under two)
        self.builtins = {}     # id(built-in or op) -> those names: what the TorchFunctionMode matches
        self.keep = []         # the objects behind those ids, alive as long as their ids are used
        self.standins = {}     # id(built-in) -> the Python stand-in put where its modules hold it
        self.armed = None      # None, or the names that count now and the item whose frames must be on the stack
        self.seen = {}         # oracle -> (item, line) of the first call that counted
        self.mode = None

    def configure(self, table, namespace=None):
        """Take the table ({"oracles", "scratch", "experiments"}) once, and watch what is loaded by now."""
        first = bool(table) and not self.oracles
        if first:
            self.oracles = {name: list(paths) for name, paths in table.get("oracles", {}).items()}
            self.scratch = {item: set(names) for item, names in table.get("scratch", {}).items()}
            self.experiments = dict(table.get("experiments", {}))
            self.pending = [(name, path) for name, paths in self.oracles.items() for path in paths]
        if self.pending:
            self.pending = [(name, path) for name, path in self.pending if not self.watch(name, path)]
        if first and namespace:
            self.adopt(namespace)

    def adopt(self, namespace):
        """The table came after the notebook loaded: the built-ins its cells stored (`_f = getattr(F, ...)`, a
        default argument, a closure, a class attribute) are swapped for their stand-ins, so training sees them too.
        Checks need none of this: the TorchFunctionMode matches the built-in itself."""
        import types

        def swap(v):
            return self.standins.get(id(v), v)

        def adopt_function(f):
            if isinstance(f, types.FunctionType) and f.__code__.co_filename.startswith("<cell "):
                if f.__defaults__:
                    f.__defaults__ = tuple(swap(v) for v in f.__defaults__)
                if f.__kwdefaults__:
                    f.__kwdefaults__ = {k: swap(v) for k, v in f.__kwdefaults__.items()}
                for cell in f.__closure__ or ():
                    try:
                        cell.cell_contents = swap(cell.cell_contents)
                    except ValueError:  # an empty cell
                        pass
        for key, value in list(namespace.items()):
            namespace[key] = swap(value)
            adopt_function(value)
            if isinstance(value, type) and value.__module__ == "__main__":
                for attr, v in list(vars(value).items()):
                    adopt_function(v)
                    if id(v) in self.standins:
                        setattr(value, attr, swap(v))

    def watch(self, name, path):
        """Watch one dotted path; False while its module is not loaded yet."""
        try:
            found = resolve(path)
            if found is None:
                return False
            owner, attr, obj = found
            kind = self.kind(obj)
            if kind == "stand-in":  # put there for another path: watch its built-in
                obj, kind = obj._course_oracle, "builtin"
            if id(obj) in self.names:
                self.names[id(obj)].add(name)
            elif kind == "function":
                self.patch(self.named(obj, name), obj)
            elif kind == "op":
                names = self.named(obj, name)
                for overload in [obj] + [getattr(obj, o) for o in obj.overloads()]:
                    self.builtins[id(overload)], _ = names, self.keep.append(overload)
            elif kind == "builtin":
                self.builtins[id(obj)] = self.named(obj, name)
            if id(obj) in self.builtins and isinstance(owner, type(sys)) and vars(owner).get(attr) is obj:
                setattr(owner, attr, self.standins.setdefault(id(obj), self.wrapper(self.names[id(obj)], obj)))
        except Exception:  # noqa: BLE001 -- an unwatchable path is skipped (tests/test_tripwire.py checks them all)
            pass
        return True

    def kind(self, obj):
        """How an object is watched: function (patched in place), builtin or op (matched by the mode), or None."""
        import types
        if isinstance(obj, types.FunctionType):
            return "stand-in" if "_course_oracle" in vars(obj) else "function"
        if isinstance(obj, self.torch._ops.OpOverloadPacket):
            return "op"
        return "builtin" if isinstance(obj, types.BuiltinFunctionType) else None

    def named(self, obj, name):
        self.keep.append(obj)
        self.names[id(obj)] = names = {name}
        return names

    def patch(self, names, fn):
        """Swap the function's code for a trampoline into `enter`, in place: every reference to it is watched."""
        import functools
        import types
        original = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        original.__kwdefaults__, original.__qualname__ = fn.__kwdefaults__, fn.__qualname__
        fn.__code__ = trampoline(len(fn.__code__.co_freevars))  # the same closure: the count must match
        fn.__defaults__, fn.__kwdefaults__ = None, {"_course_oracle": functools.partial(self.enter, names, original)}

    def wrapper(self, names, builtin):
        """A Python stand-in for a built-in, put where its module holds it (what training lookups find)."""
        def oracle(*args, **kwargs):
            return self.enter(names, builtin, args, kwargs)
        oracle._course_oracle = builtin
        oracle.__name__ = oracle.__qualname__ = getattr(builtin, "__name__", "oracle")
        oracle.__doc__ = getattr(builtin, "__doc__", None)
        return oracle

    def enter(self, names, original, args, kwargs):
        if self.armed is not None:
            self.hit(names)
        return original(*args, **kwargs)

    def hit(self, names):
        """Record a call of an oracle standing for `names` if it counts now (see the class's docstring)."""
        counted, item = self.armed
        for name in names & counted - self.seen.keys():
            if item is None:
                self.seen[name] = (None, 0)
                continue
            frame = sys._getframe(1)
            while frame is not None:  # the innermost frame of the item's own cell: the line that reached the oracle
                if frame.f_code.co_filename == f"<cell {item}>":
                    self.seen[name] = (item, frame.f_lineno)
                    break
                frame = frame.f_back

    def mode_class(self):
        wire = self

        class Watch(self.torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None, _id=id):  # the student may patch builtins
                names = wire.builtins.get(_id(func))
                if names is not None and wire.armed is not None:
                    wire.hit(names)
                return func(*args, **(kwargs or {}))
        return Watch

    def checking(self, watch):
        """A context: the student's item is called by a check; returns the names seen via `.seen`."""
        self.configure(None)
        names = set(watch)
        if names and self.mode is None:
            self.mode = self.mode_class()
        return Armed(self, names, None, self.mode() if names else None)

    def training(self, experiment):
        """A context: the harness trains the experiment's item with the student's parts."""
        self.configure(None)
        item = self.experiments.get(experiment)
        return Armed(self, self.scratch.get(item, set()), item or "", None)


class Armed:
    """Arm a Tripwire (and enter its TorchFunctionMode) for one request; `seen` holds what counted."""

    def __init__(self, wire, names, item, mode):
        self.wire, self.names, self.item, self.mode = wire, names, item, mode
        self.seen = {}

    def __enter__(self):
        self.wire.seen = self.seen
        self.wire.armed = (self.names, self.item) if self.names else None
        if self.mode is not None:
            self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.wire.armed = None
        if self.mode is not None:
            self.mode.__exit__(*exc)
        return False


def resolve(path):
    """(owner, attribute, object) for a dotted path under a module already loaded, else None; never imports."""
    parts = path.split(".")
    for k in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:k]))
        if module is not None:
            break
    else:
        return None
    owner = module
    for i, part in enumerate(parts[k:], start=k):
        if sys.modules.get(getattr(owner, "__name__", None)) is owner and part not in vars(owner):
            return None  # a submodule not imported yet (a module's lazy __getattr__ would import it)
        obj = getattr(owner, part)
        if i == len(parts) - 1:
            return owner, part, obj
        owner = obj


_TRAMPOLINES = {}


def trampoline(free):
    """The code of `def oracle(*args, _course_oracle, **kwargs): return _course_oracle(args, kwargs)`, with
    `free` free variables (never read) so that it fits a function whose closure has that many cells."""
    if free not in _TRAMPOLINES:
        cells = "".join(f"    _c{i} = None\n" for i in range(free))
        unread = f"        if False:\n            ({', '.join(f'_c{i}' for i in range(free))},)\n" if free else ""
        source = (f"def outer():\n{cells}    def oracle(*args, _course_oracle=None, **kwargs):\n{unread}"
                  f"        return _course_oracle(args, kwargs)\n    return oracle\n")
        namespace = {}
        exec(compile(source, "<oracle watch>", "exec"), namespace)
        _TRAMPOLINES[free] = namespace["outer"]().__code__
    return _TRAMPOLINES[free]

