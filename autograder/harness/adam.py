"""Adam, as the harnesses' training loop steps it: torch.optim.Adam's arithmetic without its import.

torch.optim's first optimizer imports torch._dynamo (through torch._disable_dynamo), about 2 s of CPU, in every
process that trains: every sandbox, or the zygote before it (which put those seconds before every grading's first
check). This class does what torch.optim.Adam(params, lr) does on the CPU (its single-tensor path: no weight decay,
no amsgrad), op for op, so a run's weights are the same bit for bit (tests/unit/test_adam.py), and it imports
nothing beyond torch. The update, with g the gradient and t the step (Kingma & Ba, Algorithm 1):

    m_t = b1 m_{t-1} + (1 - b1) g            v_t = b2 v_{t-1} + (1 - b2) g^2
    theta_t = theta_{t-1} - lr / (1 - b1^t) * m_t / (sqrt(v_t) / sqrt(1 - b2^t) + eps)
"""
import torch


class Adam:
    """Adam over `params` at `lr` (betas, eps as torch.optim.Adam's defaults); a parameter with no gradient at a
    step is left alone, its moments and step count included, as torch leaves it."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        self.params = [p for p in params if p.requires_grad]
        self.lr, (self.beta1, self.beta2), self.eps = lr, betas, eps
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]     # m
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]  # v
        self.steps = [0] * len(self.params)  # t, per parameter (one that had no gradient has taken fewer)

    def zero_grad(self):
        """Drop every gradient (set_to_none, as torch's default)."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, lr=None):
        """One update of every parameter that has a gradient, at `lr` (the constructor's when None)."""
        lr = self.lr if lr is None else lr
        groups = {}  # step count t -> the parameters taking their t-th step: the bias corrections differ
        for i, p in enumerate(self.params):
            if p.grad is not None:
                self.steps[i] += 1
                groups.setdefault(self.steps[i], []).append(i)
        for t, group in groups.items():
            params, grads = [self.params[i] for i in group], [self.params[i].grad for i in group]
            m, v = [self.exp_avg[i] for i in group], [self.exp_avg_sq[i] for i in group]
            # 1. the moments: m <- m + (1 - b1)(g - m), v <- b2 v + (1 - b2) g*g
            torch._foreach_lerp_(m, grads, 1 - self.beta1)
            torch._foreach_mul_(v, self.beta2)
            torch._foreach_addcmul_(v, grads, grads, value=1 - self.beta2)
            # 2. the bias corrections, as Python floats (torch's step count is a float32 tensor read back as one)
            correction1, correction2 = 1 - self.beta1 ** float(t), 1 - self.beta2 ** float(t)
            # 3. theta <- theta - lr / c1 * m / (sqrt(v) / sqrt(c2) + eps)
            denom = torch._foreach_sqrt(v)
            torch._foreach_div_(denom, correction2 ** 0.5)
            torch._foreach_add_(denom, self.eps)
            torch._foreach_addcdiv_(params, m, denom, value=-(lr / correction1))
