"""Training shared between experiments: what one run trained is not trained again by another.

An experiment whose harness entry names `reuses="X"` starts from experiment X's trained model at the same seed:
X's trained state reaches its training as the data tensors `reused.0`, `reused.1`, ... when this process holds it,
and the harness's training skips what it would have trained again (w8l1: dae_mnist's plain AE is ae_mnist's
recipe bit for bit), when course.yaml configures X with the same steps (reused_here). Without it, the training
does everything itself, with the same result. The reference's runs (run_reference) train X first when this process
has not; graded runs keep what they trained (ae_mnist before dae_mnist in a grading).

A state is kept in this process's memory only (never in the results cache on disk), under the identity of X's run:
for a graded run its experiment key (the student's cells as they ran, the grader's code, seed, device, threads,
...), so a regrade with a reference standing in (other cells, another key) never reuses the student's own model;
for the reference's in-process runs the same inputs with the solution in place of the cells.
"""
from collections import OrderedDict

KEPT = 16              # states held at most (a w8l1 grading holds two per seed, a few MB)
PREFIX = "reused."     # the data tensors that carry a kept state into a training

_kept: "OrderedDict[str, tuple[list, dict]]" = OrderedDict()


def reused_name(spec):
    """The experiment whose trained model this one starts from, or None."""
    return spec.get("reuses")


def reused_here(assignment, name, spec):
    """The experiment `name` starts from in this course (assignment: its course.yaml entry), or None: only one
    that course.yaml configures with the same steps, so that its run is the recipe this one would train (a
    course that drops it, or cuts one of the two, trains everything in the experiment itself)."""
    reused = reused_name(spec)
    if reused is None or reused not in assignment.experiments or name not in assignment.experiments:
        return None
    same = assignment.experiments[reused].cfg.get("steps") == assignment.experiments[name].cfg.get("steps")
    return reused if same else None


def is_reused(experiments, name):
    """Whether some experiment of the harness's EXPERIMENTS reuses `name`'s trained model."""
    return any(reused_name(spec) == name for spec in experiments.values())


def shareable(history):
    """Whether a run's state may stand in for its retraining elsewhere: a training that drew from torch's global
    random generators (dropout in a student's forward) would have drawn other numbers there, so it is never
    shared (the harness records it as `global_rng_used`)."""
    return not (history or {}).get("global_rng_used")


def keep(identity, state, history):
    """Hold a trained state (a list of tensors, state_dict order) under its run's identity; the oldest goes first."""
    if identity is None or not shareable(history):
        return
    _kept[identity] = ([t.detach().clone() for t in state], dict(history or {}))
    _kept.move_to_end(identity)
    while len(_kept) > KEPT:
        _kept.popitem(last=False)


def kept(identity):
    """(state, history) held for that identity, or None; the tensors are the store's own: never write to them."""
    found = _kept.get(identity) if identity is not None else None
    if found is not None:
        _kept.move_to_end(identity)
    return found


def as_data(state):
    """The state as data tensors for a training request (w8l1's reused_state reads them back)."""
    return {f"{PREFIX}{i}": t for i, t in enumerate(state)}


def state_of(model):
    """A model's state as the list of tensors a sandbox's training returns."""
    return [t.detach().clone() for t in model.state_dict().values()]


def forget():
    """Drop every kept state (tests)."""
    _kept.clear()

