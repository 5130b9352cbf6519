"""The graded training runs of w9l1_vit: the grader's own data, loop and evaluation around the student's
parts (`parts`: the student's module in the sandbox; `ref`: the reference, for data)."""
import torch
import torch.nn.functional as F

from .training import pass_marks, seeded, shuffled_rows, train_until

BATCH, LR = 64, 2e-3   # the lecture's recipe: Adam, no schedule
N_TRAIN, N_VAL, N_TEST = 4000, 500, 1000


def images(X):
    """MNIST rows (N, 784) as images (N, 1, 28, 28)."""
    return X.reshape(-1, 1, 28, 28)


def mnist_vit_data(ref, cfg, seed, device):
    """4,000 training images, and 500 more that only stop the training."""
    from autograder.course.mnist import load_mnist
    X, y, _, _ = load_mnist(n_train=N_TRAIN + N_VAL, n_test=N_TEST)
    return {"X": images(X[:N_TRAIN]).to(device), "y": y[:N_TRAIN].to(device),
            "X_val": images(X[N_TRAIN:]).to(device), "y_val": y[N_TRAIN:].to(device)}


def mnist_vit_model(parts, cfg, seed, device):
    """The student's PatchClassifier, built from `seed` on `device`."""
    return seeded(lambda: parts.PatchClassifier(), seed, device)


def mnist_vit_train(model, parts, data, cfg, seed):
    """Adam, batch BATCH; validates as it goes and stops once the marks are cleared."""
    X, y = data['X'], data['y']
    rows = shuffled_rows(X.size(0), BATCH, torch.Generator().manual_seed(seed), X.device)

    def batch_loss(step):
        idx = rows(step)
        return F.cross_entropy(model(X[idx]), y[idx])

    def validate():
        return {"score": mnist_vit_score(model, data["X_val"], data["y_val"])}

    marks = pass_marks(cfg, {"score": 0.05})  # stop with a margin over the pass mark
    return train_until(model, batch_loss, cfg["steps"], LR, validate, marks, every=25)


@torch.no_grad()
def mnist_vit_score(model, X, y):
    """Test accuracy: the share of images whose largest logit is their label."""
    model.eval()
    return (model(X).argmax(-1) == y).float().mean().item()


def mnist_vit_evaluate(model, ref, cfg, seed, device):
    """Accuracy on 1,000 test images the training never saw."""
    from autograder.course.mnist import load_mnist
    _, _, X_test, y_test = load_mnist(n_train=N_TRAIN + N_VAL, n_test=N_TEST)
    return {"score": mnist_vit_score(model, images(X_test).to(device), y_test.to(device))}


EXPERIMENTS = {
    "mnist_vit": dict(parts=["PatchClassifier"], data=mnist_vit_data, build=mnist_vit_model, train=mnist_vit_train,
                evaluate=mnist_vit_evaluate),
}
