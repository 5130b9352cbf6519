"""Public checks for the test cells: a failure says what was expected, what came back and, for a mistake the
checks recognise, what it probably is.

One helper for every notebook of the course, kept in one file that the course's tools copy into each notebook's
`setup_checks` cell; the hidden checks use the same mistake hints. It needs only torch and math.
"""
import math

import torch

SCALE_MISSING = 'off by a factor close to sqrt(d_k): is the scale missing?'


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


def is_pair(result):
    return isinstance(result, tuple) and len(result) == 2


def describe(result):
    if torch.is_tensor(result):
        return f'tensor of shape {tuple(result.shape)}'
    if isinstance(result, tuple):
        return f'tuple of length {len(result)}'
    return type(result).__name__


class PublicChecks:
    """The public checks of one test cell; the first failure stops the cell with what was expected and what came back."""

    def __init__(self, item, points, note='hidden tests'):
        self.item, self.points, self.note, self.passed = item, points, note, 0

    def check(self, ok, what, expected, got, hint=''):
        if not bool(ok):
            raise AssertionError(f'{self.item}: public check {self.passed + 1} failed: {what}\n'
                                 f'    expected: {expected}\n'
                                 f'    got:      {got}' + (f'\n    hint:     {hint}' if hint else ''))
        self.passed += 1
        print(f'  ok  {what}')

    def shape(self, what, t, expected):
        got = tuple(t.shape) if torch.is_tensor(t) else describe(t)
        self.check(got == tuple(expected), f'shape of {what}', tuple(expected), got)

    def close(self, what, got, ref, atol=1e-5, rtol=0.0, against='the reference', mistakes=None):
        """`got` within atol + rtol |ref| of `ref`; `mistakes` maps a hint to what a known mistake would give."""
        what = f'{what} vs {against}'
        if not torch.is_tensor(got) or tuple(got.shape) != tuple(ref.shape):
            return self.check(False, what, f'a tensor of shape {tuple(ref.shape)}', describe(got))
        g, r = got.detach().double().cpu(), ref.detach().double().cpu()
        ok = bool(torch.allclose(g, r, atol=atol, rtol=rtol))
        self.check(ok, what, f'max |difference| <= {atol:g}' + (f' + {rtol:g} |reference|' if rtol else ''),
                   f'{max_diff(g, r):.3g}', hint='' if ok else known_mistake(got, mistakes, atol))

    def done(self):
        print(f'{self.item}: public checks passed ({self.passed}/{self.passed}); '
              f'{self.note} worth {self.points:g} points run at grading')
