"""The graded training run of w9l2_normalization: NormMLP on MNIST, the grader's own data, loop and evaluation
around the student's parts (`parts`: the student's module in the sandbox; `ref`: the reference, for data)."""
import torch
import torch.nn.functional as F

from .training import pass_marks, seeded, shuffled_rows, train_until

BATCH, LR = 64, 3e-3  # Adam, no schedule
VAL_EVERY = 25  # steps between validations: each costs a pass over the validation data
N_TRAIN, N_VAL, N_TEST = 2000, 500, 1000


def mnist_normmlp_data(ref, cfg, seed, device):
    """2,000 training images, and 500 more that only stop the training."""
    from autograder.course.mnist import load_mnist
    X, y, _, _ = load_mnist(n_train=N_TRAIN + N_VAL, n_test=N_TEST)
    X = X.reshape(-1, 1, 28, 28)
    return {"X": X[:N_TRAIN].to(device), "y": y[:N_TRAIN].to(device),
            "X_val": X[N_TRAIN:].to(device), "y_val": y[N_TRAIN:].to(device)}


def mnist_normmlp_model(parts, cfg, seed, device):
    """The student's NormMLP, built from `seed` on `device`."""
    return seeded(lambda: parts.NormMLP(), seed, device)


def mnist_normmlp_train(model, parts, data, cfg, seed):
    """Adam, batch BATCH; validates every VAL_EVERY steps and stops once the marks are cleared."""
    X, y = data["X"], data["y"]
    rows = shuffled_rows(X.size(0), BATCH, torch.Generator().manual_seed(seed), X.device)

    def batch_loss(step):
        idx = rows(step)
        return F.cross_entropy(model(X[idx]), y[idx])

    def validate():
        return {"test_accuracy": mnist_normmlp_score(model, data["X_val"], data["y_val"])}

    marks = pass_marks(cfg, {"test_accuracy": 0.1})  # stop well over the pass mark
    return train_until(model, batch_loss, cfg["steps"], LR, validate, marks, every=VAL_EVERY)


@torch.no_grad()
def mnist_normmlp_score(model, X, y):
    """The share of images whose largest logit is their label."""
    model.eval()
    accuracy = (model(X).argmax(-1) == y).float().mean().item()
    model.train()
    return accuracy


def mnist_normmlp_evaluate(model, ref, cfg, seed, device):
    """Accuracy on 1,000 test images the training never saw."""
    from autograder.course.mnist import load_mnist
    _, _, X_test, y_test = load_mnist(n_train=N_TRAIN + N_VAL, n_test=N_TEST)
    return {"test_accuracy": mnist_normmlp_score(model, X_test.reshape(-1, 1, 28, 28).to(device), y_test.to(device))}


EXPERIMENTS = {
    "mnist_normmlp": dict(
        parts=["NormMLP"],
        data=mnist_normmlp_data,
        build=mnist_normmlp_model,
        train=mnist_normmlp_train,
        evaluate=mnist_normmlp_evaluate,
    ),
}
