"""Reference solution for Week 9, Lecture 1: vision transformers on MNIST.

Dimension names: B batch, C channels, H W image size, P patch size, N = (H/P)(W/P) patches, D embedding width.
"""
import torch
import torch.nn as nn


def patchify(images, P):
    """(B, C, H, W) -> (B, N, C*P*P): the image cut into P x P patches, row by row."""
    B, C, H, W = images.shape
    x = images.unfold(2, P, P).unfold(3, P, P)                          # (B, C, H/P, W/P, P, P)
    return x.permute(0, 2, 3, 1, 4, 5).reshape(B, -1, C * P * P)        # (B, N, C*P*P)


class PatchClassifier(nn.Module):
    """Patches -> linear embedding + learned positions -> one encoder layer -> mean over patches -> logits."""

    def __init__(self, P=7, D=32, n_classes=10, image=28):
        """The patch embedding, the positions, one encoder layer and the head."""
        super().__init__()
        self.P = P
        self.embed = nn.Linear(P * P, D)
        self.pos = nn.Parameter(torch.zeros(1, (image // P) ** 2, D))
        self.layer = nn.TransformerEncoderLayer(D, 4, 2 * D, dropout=0.0, batch_first=True)
        self.head = nn.Linear(D, n_classes)

    def forward(self, images):
        """(B, 1, H, W) -> (B, n_classes) logits."""
        h = self.embed(patchify(images, self.P)) + self.pos             # (B, N, D)
        return self.head(self.layer(h).mean(1))                         # (B, n_classes)
