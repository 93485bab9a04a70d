"""AdamW with decoupled weight decay (Loshchilov & Hutter)."""
import torch


class AdamW:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self.params = [p for p in params if p.requires_grad]
        self.param_groups = [{"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}]
        self.state = {}
        self.steps = 0

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        g = self.param_groups[0]
        lr, (b1, b2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
        self.steps += 1
        bc1, bc2 = 1 - b1 ** self.steps, 1 - b2 ** self.steps
        embed = self.params[0]
        for p in self.params:
            if p.grad is None:
                continue
            if p is not embed and p.shape == embed.shape[::-1]:
                continue  # output projection tied to the embedding: already stepped through it
            m, v = self.state.setdefault(id(p), (torch.zeros_like(p), torch.zeros_like(p)))
            p.mul_(1 - lr * wd)  # decoupled decay, scaled by the learning rate
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            p.addcdiv_(m, (v / bc2).sqrt().add_(eps), value=-lr / bc1)
