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


def test_fused_update_is_the_eager_update(monkeypatch):
    import headstore.heads.training.stacked_adamw as module

    # the function torch.compile fuses, run as plain torch: same maths as the eager path, grad_scale included
    monkeypatch.setattr(module, "_compiled_update", module._adamw_update)
    fused, eager = _train({"fused": True}), _train({})
    for p, q in zip(fused.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert not torch.equal(fused.weights[0], StackedMLP(3, fused.cfg, seeds=[0, 1, 2]).weights[0])


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


def test_fused_update_that_cannot_compile_falls_back_to_eager(monkeypatch):
    import headstore.heads.training.stacked_adamw as module

    def broken(*args):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(module, "_compiled_update", broken)
    with pytest.warns(UserWarning, match="could not be compiled"):
        fused = _train({"fused": True})
    assert module._compiled_update is False
    for p, q in zip(fused.parameters(), _train({}).parameters()):
        torch.testing.assert_close(p, q)


def test_the_compiled_update_serves_stacks_of_every_shape_without_a_fallback(monkeypatch):
    """A grid compiles the update once for all its stacks: twelve stacks of different head counts, depths,
    widths and layer norms (more shapes than dynamo's default limit of 8 graphs, which a grid once hit:
    "FailOnRecompileLimitHit ...; using the eager update") train with the compiled update, no warning, and
    end where the eager update does. Dynamo's capture and guards are the real ones; backend="eager" runs the
    captured graph without generating C++ (what costs a compile its seconds)."""
    import warnings

    import headstore.heads.training.stacked_adamw as module

    torch._dynamo.reset()
    monkeypatch.setattr(module, "_compiled_update", module._compile(backend="eager"))
    shapes = [(12, 1, False, 64), (12, 2, False, 64), (3, 2, True, 32), (1, 1, False, 16), (5, 3, True, 48),
              (2, 1, False, 8), (7, 2, False, 24), (12, 1, True, 64), (4, 2, True, 16), (24, 1, False, 24),
              (6, 1, False, 6), (1, 2, True, 12)]
    for H, depth, layer_norm, hidden in shapes:
        c = HeadConfig(in_dim=6, hidden=hidden, out_dim=6, depth=depth, layer_norm=layer_norm)
        stacks = []
        for fused in (True, False):
            stack = StackedMLP(H, c, seeds=list(range(H)))
            opt = StackedAdamW(stack.parameters(), lr=[1e-2] * H, weight_decay=0.01, fused=fused)
            g = torch.Generator().manual_seed(H)
            for step in range(2):
                x = torch.randn(8, 6, generator=g)
                opt.zero_grad()
                stack(x).pow(2).sum().backward()
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    opt.step(grad_scale=torch.full((H,), 0.5) if step else None)
            stacks.append(stack)
        assert module._compiled_update is not False, (H, depth, layer_norm, hidden)
        for p, q in zip(*(s.parameters() for s in stacks)):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    torch._dynamo.reset()


def test_whether_a_stack_compiles_depends_on_its_own_work_only(monkeypatch):
    """A stack's update (compiled or eager, which round differently) follows from its own parameters x steps,
    never from a bigger stack that compiled earlier in the process: a grid's axis order or the Ray engine's
    longest-first submission must not change a small stack's numbers (once it did: 1.9e-3 of Spearman)."""
    import headstore.heads.training.stacked_adamw as module
    from headstore.heads.training.stacked_adamw import fused_pays

    monkeypatch.delenv(module.COMPILE_ENV, raising=False)
    monkeypatch.setattr(module, "_compiled_update", module._adamw_update)  # a "compiled" update that runs here
    small, big = int(module.FUSED_MIN_UPDATES // 10), int(module.FUSED_MIN_UPDATES)
    before = fused_pays(small, 1)
    _train({"fused": fused_pays(big, 1)})  # a big stack took the compiled path
    assert fused_pays(big, 1) and not before and not fused_pays(small, 1)
