import subprocess
import sys

import pytest
import torch

from headstore.heads.settings.config import HeadConfig
from headstore.heads.network.model import StackedMLP
from headstore.heads.training.stacked_adamw import StackedAdamW


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


def _train(opt_kwargs, monkeypatch=None, steps=5):
    c = HeadConfig(in_dim=5, hidden=7, out_dim=3, residual=False)
    stack = StackedMLP(3, c, seeds=[0, 1, 2])
    opt = StackedAdamW(stack.parameters(), lr=[1e-2, 3e-3, 0.05], weight_decay=[0.0, 0.1, 0.01], **opt_kwargs)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x, target = torch.randn(8, 5, generator=g), torch.randn(8, 3, generator=g)
        opt.zero_grad()
        head_loss(stack(x), target).sum().backward()
        opt.step(grad_scale=torch.tensor([1.0, 0.5, 0.25]))
    return stack


def test_fused_update_is_the_eager_update():
    """torch's fused kernel, one call per head (the default), against the eager passes: the same maths, per-head
    lr, weight decay and gradient scale included."""
    fused, eager = _train({"fused": True}), _train({"fused": False})
    for p, q in zip(fused.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert not torch.equal(fused.weights[0], StackedMLP(3, fused.cfg, seeds=[0, 1, 2]).weights[0])


def test_only_the_heads_asked_for_are_updated():
    """A stopped head (not in `heads`) keeps its weights bit for bit; the others move as they would alone."""
    c = HeadConfig(in_dim=5, hidden=7, out_dim=3, residual=False)
    stack, alone = StackedMLP(3, c, seeds=[0, 1, 2]), StackedMLP(3, c, seeds=[0, 1, 2])
    before = [p.detach().clone() for p in stack.parameters()]
    opts = [StackedAdamW(m.parameters(), lr=[1e-2, 3e-3, 0.05], weight_decay=0.1) for m in (stack, alone)]
    x, target = torch.randn(8, 5), torch.randn(8, 3)
    for m, opt, heads in zip((stack, alone), opts, (torch.tensor([True, False, True]), None)):
        head_loss(m(x), target).sum().backward()
        opt.step(heads=heads)
    for p, q, b in zip(stack.parameters(), alone.parameters(), before):
        assert torch.equal(p[1], b[1])
        torch.testing.assert_close(p[[0, 2]], q[[0, 2]], rtol=0, atol=0)


def test_grad_scale_scales_each_heads_gradient():
    stack = StackedMLP(2, HeadConfig(in_dim=4, hidden=4, out_dim=2, residual=False))
    p0 = [p.detach().clone() for p in stack.parameters()]
    opt = StackedAdamW(stack.parameters(), lr=[1e-2, 1e-2], weight_decay=0.0, eps=1e-3)
    stack(torch.randn(3, 4)).pow(2).sum().backward()
    grads = [p.grad.clone() for p in stack.parameters()]
    opt.step(grad_scale=torch.tensor([1.0, 0.0]))
    for p, q, g in zip(stack.parameters(), p0, grads):
        assert torch.equal(p[1], q[1])  # a zero gradient moves nothing (no weight decay)
        torch.testing.assert_close(p[0], q[0] - 1e-2 * g[0] / (g[0].abs() + 1e-3))  # Adam's first step


def test_a_device_without_the_fused_kernel_falls_back_to_eager(monkeypatch):
    import headstore.heads.training.stacked_adamw as module

    def missing(*args, **kwargs):
        raise NotImplementedError("no fused AdamW kernel for this device")

    monkeypatch.setattr(module, "_fused_ok", True)
    monkeypatch.setattr(torch, "_fused_adamw_", missing)
    with pytest.warns(UserWarning, match="fused AdamW kernel cannot run here"):
        fused = _train({"fused": True})
    assert module._fused_ok is False
    for p, q in zip(fused.parameters(), _train({"fused": False}).parameters()):
        torch.testing.assert_close(p, q)


def test_training_stacks_compiles_nothing():
    """The update needs no compiler: stacks of several shapes train without dynamo capturing a single graph (an
    earlier torch.compile'd update cost a grid 3-20 s before its first step, once per process and shape)."""
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    for H, depth in [(12, 1), (12, 2), (3, 2), (1, 1)]:
        stack = StackedMLP(H, HeadConfig(in_dim=6, hidden=16, out_dim=6, depth=depth), seeds=list(range(H)))
        opt = StackedAdamW(stack.parameters(), lr=[1e-2] * H, weight_decay=0.01)
        for _ in range(2):
            stack(torch.randn(8, 6)).pow(2).sum().backward()
            opt.step(grad_scale=torch.full((H,), 0.5))
            opt.zero_grad(set_to_none=True)
    assert counters["stats"]["unique_graphs"] == graphs


def test_runs_of_heads_in_one_call_equal_a_call_per_head():
    """Heads with the same lr, weight decay and gradient scale side by side are updated in one kernel call (their
    slices); each head's numbers equal those of torch's fused AdamW called on that head alone."""
    H = 8
    lrs = [1e-3, 1e-3, 1e-3, 3e-3, 3e-3, 1e-3, 1e-3, 1e-3]
    wds = [0.0, 0.0, 0.0, 0.0, 0.0, 0.01, 0.01, 0.0]
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(H, 6, 5))
    ref = [p.detach()[h].clone() for h in range(H)]  # each head alone, torch's fused kernel
    ref_m, ref_v = [torch.zeros(6, 5) for _ in range(H)], [torch.zeros(6, 5) for _ in range(H)]
    opt = StackedAdamW([p], lr=lrs, weight_decay=wds)
    for step in range(1, 5):
        grad = torch.randn(H, 6, 5)
        scale = torch.tensor([1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 0.25, 1.0]) if step % 2 else None
        alive = torch.tensor([True] * H) if step < 3 else torch.tensor([True, False, True, True, True, True, True, True])
        p.grad = grad.clone()
        opt.step(grad_scale=scale, heads=alive)
        for h in range(H):
            if not alive[h]:
                continue
            inv = None if scale is None else (1.0 / scale.double()).float()[h]
            torch._fused_adamw_([ref[h]], [grad[h].clone()], [ref_m[h]], [ref_v[h]], [], [torch.tensor(float(step))],
                                lr=lrs[h], beta1=0.9, beta2=0.999, weight_decay=wds[h], eps=1e-8, amsgrad=False,
                                maximize=False, grad_scale=inv, found_inf=None)
        assert all(torch.equal(p.detach()[h], ref[h]) for h in range(H)), step


def test_a_stack_trains_without_importing_torch_dynamo():
    """torch.optim.Optimizer's add_param_group and zero_grad import torch._dynamo on their first call (over a second
    of a grid); StackedAdamW runs the functions they wrap, so a stack's training never imports it."""
    code = ("import sys, torch\n"
            "from headstore.heads.training.stacked_adamw import StackedAdamW\n"
            "w = torch.nn.Parameter(torch.ones(3, 4, 2))\n"
            "opt = StackedAdamW([w], lr=[1e-2, 1e-3, 0.0], weight_decay=0.01)\n"
            "(w ** 2).sum().backward(); opt.step(); opt.zero_grad()\n"
            "assert w.grad is None and not torch.equal(w[0], torch.ones(4, 2)) and torch.equal(w[2], torch.ones(4, 2))\n"
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"


def test_a_selection_of_heads_goes_on_as_the_whole_stack_would():
    """StackedAdamW.select_heads: an optimizer over some heads' rows (a stack that dropped its stopped heads) takes
    the next steps the whole stack's optimizer takes for those heads, bit for bit (rates, decays, moments, step)."""
    torch.manual_seed(0)
    whole = [torch.nn.Parameter(torch.randn(4, 5, 3)), torch.nn.Parameter(torch.randn(4, 3))]
    opt = StackedAdamW(whole, lr=[1e-3, 3e-3, 1e-2, 3e-2], weight_decay=[0.0, 0.1, 0.01, 0.5])
    grads = [[torch.randn_like(p) for p in whole] for _ in range(4)]
    for g in grads[:2]:
        for p, gp in zip(whole, g):
            p.grad = gp.clone()
        opt.step()
    keep = [3, 1]
    part = [torch.nn.Parameter(p.detach()[keep].clone()) for p in whole]
    sub = opt.select_heads(keep, part)
    for g in grads[2:]:
        for p, q, gp in zip(whole, part, g):
            p.grad, q.grad = gp.clone(), gp[keep].clone()
        opt.step()
        sub.step()
    for p, q in zip(whole, part):
        assert torch.equal(p.detach()[keep], q.detach())
