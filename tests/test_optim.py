"""EagerSGD (clients/optim.py) is torch's SGD, bit for bit, without torch.compile's imports."""

import subprocess
import sys

import torch

from clients.arrays import load_momentum, momentum_arrays
from clients.optim import EagerSGD


def _train(optimizer_class, steps: int = 6, saved=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    model[0].bias.requires_grad_(False)  # a frozen parameter: no gradient, no momentum
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    opt = optimizer_class([{"params": model[0].parameters()},
                           {"params": model[2].parameters(), "lr": 0.03}],
                          lr=0.1, momentum=0.9, weight_decay=5e-4)
    if saved is not None:
        load_momentum(opt, saved)
    hooks = []
    opt.register_step_post_hook(lambda *args: hooks.append(1))
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
        opt.step()
    assert torch.is_grad_enabled() and len(hooks) == steps
    return [t.clone() for t in model.state_dict().values()], momentum_arrays(opt)


def test_eager_sgd_takes_torch_sgds_steps_exactly():
    ours, ours_momentum = _train(EagerSGD)
    theirs, their_momentum = _train(torch.optim.SGD)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert [m.tolist() for m in ours_momentum] == [m.tolist() for m in their_momentum]
    assert ours_momentum[1].size == 0  # the frozen bias
    # momentum carried into a new optimizer (train.optimizer-state persist) acts the same
    again, _ = _train(EagerSGD, saved=ours_momentum)
    again_torch, _ = _train(torch.optim.SGD, saved=their_momentum)
    assert all(torch.equal(a, b) for a, b in zip(again, again_torch, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(again, ours, strict=True))


def test_eager_sgd_never_imports_the_compiler():
    code = ("import sys, torch; from clients.optim import EagerSGD; "
            "m = torch.nn.Linear(3, 2); o = EagerSGD(m.parameters(), lr=0.1, momentum=0.9); "
            "o.zero_grad(); m(torch.ones(4, 3)).sum().backward(); o.step(); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
