"""Public checks for the test cells: a failure says what was expected, what came back and, for a mistake the
checks recognise, what it probably is; `self_check()` runs them all again and prints where each task stands.

One helper for every notebook of the course, kept in one file that the course's tools copy into each notebook's
`setup_checks` cell; the hidden checks use the same mistake hints. It needs only torch and the standard library.
"""
import contextlib
import io
import linecache
import math
import re
import sys

import torch

SCALE_MISSING = 'off by a factor close to sqrt(d_k): is the scale missing?'
# what torch says when one operation meets tensors on two devices (PublicChecks.device, and the hidden shapes
# checks' own run on a fake GPU)
MIXED_DEVICES = re.compile(r'not on the expected device|on the same device|found at least two devices')


def unscaled(Q):
    """Q * sqrt(d_k): an oracle run on it gives what attention without its 1/sqrt(d_k) scale gives."""
    return Q * math.sqrt(Q.shape[-1])


def unscaled_mha(mha):
    """A copy of an nn.MultiheadAttention whose queries come out sqrt(d_k) larger: it attends without the scale."""
    bad = torch.nn.MultiheadAttention(mha.embed_dim, mha.num_heads, bias=mha.in_proj_bias is not None,
                                      batch_first=mha.batch_first, dtype=mha.in_proj_weight.dtype)
    bad.load_state_dict(mha.state_dict())
    with torch.no_grad():
        bad.in_proj_weight[:mha.embed_dim] *= math.sqrt(mha.head_dim)
        if bad.in_proj_bias is not None:
            bad.in_proj_bias[:mha.embed_dim] *= math.sqrt(mha.head_dim)
    return bad


def max_diff(a, b):
    """Largest absolute elementwise difference, as a plain float."""
    diff = (a.detach().double().cpu() - b.detach().double().cpu()).abs()
    return diff.max().item() if diff.numel() else 0.0


def known_mistake(got, mistakes, atol):
    """The hint of the first known mistake that `got` reproduces, or ''.

    `mistakes` maps a hint to what the oracle gives when run the mistaken way (say, on unscaled inputs); ten times
    the check's tolerance is close enough, since the hint only has to tell one mistake from another.
    """
    for hint, wrong in (mistakes or {}).items():
        if (torch.is_tensor(got) and tuple(got.shape) == tuple(wrong.shape)
                and max_diff(got, wrong) <= max(10 * atol, 1e-6)):
            return hint
    return ''


def first_difference(expected, got):
    """(k, expected[k], got[k]) at the first index where two sequences differ (an entry past one's end is None), or
    None when they are equal: a mismatch of two long lists is told by its first entry, not by both lists."""
    expected, got = list(expected), list(got)
    if expected == got:
        return None
    k = next((k for k, (e, g) in enumerate(zip(expected, got, strict=False)) if e != g),
             min(len(expected), len(got)))
    return k, expected[k] if k < len(expected) else None, got[k] if k < len(got) else None


def is_pair(result):
    return isinstance(result, tuple) and len(result) == 2


def describe(result):
    if torch.is_tensor(result):
        return f'tensor of shape {tuple(result.shape)}'
    if isinstance(result, tuple):
        return f'tuple of length {len(result)}'
    return type(result).__name__


# item -> (points, source, file name, namespace) of the test cell that last made its PublicChecks in this session;
# kept when this cell is run again, so a rerun of the setup cells does not forget the test cells already run
TEST_CELLS = globals().get('TEST_CELLS', {})
RERUNS = []  # while self_check reruns a test cell: a list collecting the PublicChecks that cell makes


def cell_source(frame):
    """The text of the notebook cell that `frame` runs at top level; '' for a function or a file on disk."""
    name = frame.f_code.co_filename
    entry = linecache.cache.get(name)
    # IPython keeps each cell's text there for its tracebacks: mtime None (IPython 8+), or in _ipython_cache (7)
    in_cell = (entry is not None and len(entry) == 4
               and (entry[1] is None or name in getattr(linecache, '_ipython_cache', {})))
    return ''.join(entry[2]) if in_cell and frame.f_code.co_name == '<module>' else ''


class PublicChecks:
    """The public checks of one test cell; the first failure stops the cell with what was expected and what came
    back."""

    def __init__(self, item, points, note='hidden tests'):
        self.item, self.points, self.note, self.passed, self.failure = item, points, note, 0, ''
        if RERUNS:
            RERUNS[-1].append(self)
            return
        caller = sys._getframe(1)
        source = cell_source(caller)
        if source:
            TEST_CELLS[item] = (points, source, caller.f_code.co_filename, caller.f_globals)

    def check(self, ok, what, expected, got, hint=''):
        if not bool(ok):
            self.failure = (f'{self.item}: public check {self.passed + 1} failed: {what}\n'
                            f'    expected: {expected}\n'
                            f'    got:      {got}' + (f'\n    hint:     {hint}' if hint else ''))
            raise AssertionError(self.failure)
        self.passed += 1
        print(f'  ok  {what}')

    def shape(self, what, t, expected):
        got = tuple(t.shape) if torch.is_tensor(t) else describe(t)
        self.check(got == tuple(expected), f'shape of {what}', tuple(expected), got)

    def sequence(self, what, expected, got, names=()):
        """Two lists equal entry by entry; a failure names the first entry that differs (and its name, from
        `names`: say, the parameter names of what came back) with both lists' lengths."""
        expected, got, names = list(expected), list(got), list(names)
        diff = first_difference(expected, got)
        if diff is None:
            return self.check(True, what, None, None)
        k, want, have = diff
        label = f'entry {k}' + (f' ({names[k]})' if k < len(names) else '')
        self.check(False, what, f'{label}: {"nothing (the list ends)" if want is None else want}, '
                                f'of {len(expected)} entries',
                   f'{label}: {"nothing (the list ends)" if have is None else have}, of {len(got)} entries')

    def close(self, what, got, ref, atol=1e-5, rtol=0.0, against='the reference', mistakes=None):
        """`got` within atol + rtol |ref| of `ref`; `mistakes` maps a hint to what a known mistake would give."""
        what = f'{what} vs {against}'
        if not torch.is_tensor(got) or tuple(got.shape) != tuple(ref.shape):
            return self.check(False, what, f'a tensor of shape {tuple(ref.shape)}', describe(got))
        g, r = got.detach().double().cpu(), ref.detach().double().cpu()
        ok = bool(torch.allclose(g, r, atol=atol, rtol=rtol))
        self.check(ok, what, f'max |difference| <= {atol:g}' + (f' + {rtol:g} |reference|' if rtol else ''),
                   f'{max_diff(g, r):.3g}', hint='' if ok else known_mistake(got, mistakes, atol))

    def device(self, what, fn, *args, **kwargs):
        """fn(*args, **kwargs) with every tensor argument, fn's own weights when it is a module, and any torch.device
        argument on a fake GPU:
        a `cuda` device that exists only as torch's FakeTensorMode, on any machine, GPU or not (torch's meta device
        where torch has no FakeTensorMode). A tensor the code makes on the CPU, or moves there with .cpu(), meets a
        fake CUDA one and raises, in a matrix product, a linear layer or an embedding as anywhere else, as it would on
        Colab's GPU; every tensor that comes back must be on that device too. Fake tensors have no values: this checks
        devices only (and the hidden shapes check does the same, on every grader)."""
        mode = fake_gpu()
        target = 'cuda' if mode is not None else 'meta'
        what = f"{what} with every input on {'a fake GPU (cuda)' if mode is not None else 'the meta device'}"
        try:
            with contextlib.ExitStack() as stack:  # fn and every module argument moved there, their own after
                for v in (fn, *args, *kwargs.values()):
                    stack.enter_context(moved_module(v, target, mode))
                if mode is not None:
                    stack.enter_context(mode)
                out = fn(*(moved(v, target) for v in args), **{k: moved(v, target) for k, v in kwargs.items()})
        except Exception as e:
            if not MIXED_DEVICES.search(str(e)):  # an op it cannot run, or one that reads values: no verdict
                print(f'  --  {what}: not checkable there ({type(e).__name__}: {str(e).splitlines()[0][:80]})')
                return
            self.check(False, what, "every tensor made on the inputs' device (device=x.device)",
                       f'{str(e).splitlines()[0]}\n    through:  {where_made(e)}',
                       hint='torch.arange, torch.zeros, torch.ones, torch.full, torch.tensor, torch.triu(...) and '
                            'causal_mask make their tensor on the CPU unless given device=; .cpu() takes one there')
        outs = out if isinstance(out, (tuple, list)) else (out,)
        off = [f'output {k} on {t.device}' for k, t in enumerate(outs)
               if torch.is_tensor(t) and t.device.type != target]
        self.check(not off, what, f"every output on {target}, the inputs' device", ', '.join(off))

    def done(self):
        print(f'{self.item}: public checks passed ({self.passed}/{self.passed}); '
              f'{self.note} worth {self.points:g} points run at grading')


def moved(v, target):
    """An argument on `target`: a tensor moved there, a torch.device (`causal_mask(T, device=...)`) replaced by it."""
    if torch.is_tensor(v):
        return v.to(target)
    return torch.device(target) if isinstance(v, torch.device) else v


def fake_gpu():
    """A FakeTensorMode whose `cuda` tensors stand for a GPU's, or None where torch has none (a private module of
    torch's since 2.0: the device check falls back to the meta device)."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
        return FakeTensorMode(allow_non_fake_inputs=True)
    except Exception:  # an older or newer torch without it
        return None


@contextlib.contextmanager
def moved_module(fn, target, mode):
    """A module's parameters, gradients and buffers on `target` (fake ones under `mode`) while the block runs, then
    its own again (a module that caches a forward's tensors cannot be deep-copied)."""
    if not isinstance(fn, torch.nn.Module):
        yield
        return
    # each parameter and buffer is replaced by a new one there: the originals go back in their places
    kept = [(m._parameters, name, t) for m in fn.modules() for name, t in m._parameters.items() if t is not None]
    kept += [(m._buffers, name, t) for m in fn.modules() for name, t in m._buffers.items() if t is not None]
    try:
        if mode is None:
            fn.to(target)
        else:
            with mode, torch.no_grad():
                for place, name, t in kept:
                    fake = t.detach().to(target)
                    place[name] = torch.nn.Parameter(fake, t.requires_grad) if isinstance(t, torch.nn.Parameter) \
                        else fake
        yield
    finally:
        for place, name, t in kept:
            place[name] = t


def where_made(error):
    """The student's lines an error went through, outermost first (at most the last four): the functions outside
    torch and this helper, each as `name(), line N: code`."""
    lines, tb = [], error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if '/torch/' not in code.co_filename.replace('\\', '/') and code is not PublicChecks.device.__code__:
            text = linecache.getline(code.co_filename, tb.tb_lineno).strip()
            lines.append(f"{getattr(code, 'co_qualname', code.co_name)}(), line {tb.tb_lineno}: {text}")
        tb = tb.tb_next
    return '\n              '.join(lines[-4:]) or 'inside torch'


def raised_in(error):
    """Where `error` was raised: the qualified name of the innermost function of its traceback."""
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return getattr(tb.tb_frame.f_code, 'co_qualname', tb.tb_frame.f_code.co_name)


def rerun(item, points, source, name, namespace):
    """(item, status, points, reason): the item's test cell run again, quietly; any exception is its status."""
    made, error = [], None
    RERUNS.append(made)
    try:
        # on a copy of the notebook's variables, so the cell's own (chk, g, Q, ...) do not overwrite the student's;
        # its prints and random draws stay out of the notebook (CUDA's only once in use: forking would start it)
        gpus = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []
        with contextlib.redirect_stdout(io.StringIO()), torch.random.fork_rng(gpus):
            exec(compile(source, name, 'exec'), dict(namespace))
    except Exception as e:  # one item's failure is its row; KeyboardInterrupt still stops the table
        error = e
    finally:
        RERUNS.pop()
    mine = [c for c in made if c.item == item] or made
    passed, failure = (mine[-1].passed, mine[-1].failure) if mine else (0, '')
    if error is None:
        return item, f'all {passed} passed', points, ''
    where = raised_in(error)
    if isinstance(error, NotImplementedError):
        # a stub of another item (TransformerClassifier uses EncoderBlock) is said, so the row does not mislead
        other = where.split('.')[0] != item
        return item, 'not started', points, f'{item}: waits on {where}, not written yet' if other else ''
    if failure and isinstance(error, AssertionError):
        return item, f'{passed} passed, check {passed + 1} failed', points, failure
    message = (str(error).splitlines() or [''])[0][:200]
    return item, f'{passed} passed, then {type(error).__name__}', points, \
        f'{item}: {type(error).__name__} in {where}: {message}'


def self_check():
    """Run the public checks of every test cell run so far in this session again, and print one table of them."""
    if RERUNS:  # called from a test cell that self_check is rerunning
        return
    if not TEST_CELLS:
        print('No test cell has run yet in this session: run the notebook from the top (Run all), then self_check().')
        return
    rows = [rerun(item, *cell) for item, cell in list(TEST_CELLS.items())]
    done = sum(status.startswith('all ') for _, status, _, _ in rows)
    table = [('item', 'public checks', 'points at stake')]
    table += [(item, status, f'{points:g}') for item, status, points, _ in rows]
    table.append(('total', f'{done} of {len(rows)} items pass', f'{sum(points for _, _, points, _ in rows):g}'))
    widths = [max(len(row[k]) for row in table) for k in range(3)]
    print('Self-check: the public checks of each test cell run so far, run again now')
    for k, (item, status, points) in enumerate(table):
        if k in (1, len(table) - 1):
            print('-' * (sum(widths) + 4))
        print(f'{item:<{widths[0]}}  {status:<{widths[1]}}  {points:>{widths[2]}}')
    reasons = [reason for _, _, _, reason in rows if reason]
    if reasons:
        print('\nWhy:\n' + '\n'.join('  ' + reason.replace('\n', '\n  ') for reason in reasons))
    print('\nThis counts for nothing: the hidden tests (and the training runs) decide the score at grading.')
