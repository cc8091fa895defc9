import pytest
import torch

from headstore.heads.model import HeadConfig, StackedMLP
from headstore.heads.stacked_adamw import StackedAdamW


def head_loss(out, target):  # (H, B, d) -> (H,) independent per head
    return (out - target).pow(2).mean(dim=(1, 2))


@pytest.mark.parametrize("kw", [dict(), dict(layer_norm=True, depth=3)])
def test_per_head_lr_equals_separate_torch_adamw(kw):
    c = HeadConfig(in_dim=5, hidden=7, out_dim=3, **kw, residual=False)
    seeds, lrs, wds = [0, 1, 2], [1e-2, 3e-3, 0.05], [0.0, 0.1, 0.01]
    stack = StackedMLP(3, c, seeds=seeds)
    opt = StackedAdamW(stack.parameters(), lr=torch.tensor(lrs), weight_decay=torch.tensor(wds))
    singles = [StackedMLP(1, c, seeds=[s]) for s in seeds]
    opts = [torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=wd) for m, lr, wd in zip(singles, lrs, wds)]
    g = torch.Generator().manual_seed(0)
    for _ in range(6):
        x, target = torch.randn(8, 5, generator=g), torch.randn(8, 3, generator=g)
        opt.zero_grad()
        head_loss(stack(x), target).sum().backward()
        opt.step()
        for m, o in zip(singles, opts):
            o.zero_grad()
            head_loss(m(x), target).sum().backward()
            o.step()
    for h, m in enumerate(singles):
        for p, q in zip(stack.parameters(), m.parameters()):
            torch.testing.assert_close(p[h:h + 1], q, rtol=1e-5, atol=1e-6)
    moved = [p for p in stack.parameters()][0]
    assert not torch.equal(moved, StackedMLP(3, c, seeds=seeds).weights[0])


def test_scalar_lr_and_param_groups_and_scheduler():
    c = HeadConfig(in_dim=4, hidden=4, out_dim=2, residual=False)
    stack = StackedMLP(2, c)
    groups = [{"params": list(stack.weights)}, {"params": list(stack.biases), "weight_decay": 0.0}]
    opt = StackedAdamW(groups, lr=torch.tensor([1e-2, 2e-2]), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)
    x = torch.randn(3, 4)
    for _ in range(2):
        opt.zero_grad()
        stack(x).pow(2).sum().backward()
        opt.step()
        sched.step()
    effective = opt.param_groups[0]["lr"] * opt.param_groups[0]["head_lr"]
    torch.testing.assert_close(effective.float(), torch.tensor([1e-2, 2e-2]) * 0.25)
    assert opt.param_groups[1]["weight_decay"] == 0.0


def test_lr_head_count_mismatch():
    stack = StackedMLP(2, HeadConfig(in_dim=4, hidden=4, out_dim=2, residual=False))
    opt = StackedAdamW(stack.parameters(), lr=[1e-3, 1e-3, 1e-3])
    stack(torch.randn(2, 4)).sum().backward()
    with pytest.raises(ValueError, match="3 heads"):
        opt.step()
