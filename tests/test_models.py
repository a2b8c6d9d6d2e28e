"""The built-in ResNet as its comments describe it: each residual block starts as the
identity, its branch scaled by a last BatchNorm whose weight is zero, and still learns."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import inside, render


@pytest.fixture(scope="module")
def models(template, tmp_path_factory):
    project = render(template, tmp_path_factory.mktemp("models") / "p", extras=[])
    with inside(project):
        from proj import models

        yield models


def test_residual_branches_start_at_zero_and_learn(models):
    torch.manual_seed(0)
    block = models.BasicBlock(8, 8, 1)
    x = torch.rand(4, 8, 6, 6)  # non-negative, as after a ReLU
    assert torch.equal(block(x), x)  # the branch adds exactly zero
    model = models.ResNetSmall(10)
    blocks = [m for m in model.modules() if isinstance(m, models.BasicBlock)]
    assert len(blocks) == 3
    assert all(not b.bn2.weight.any() and b.bn1.weight.eq(1).all() for b in blocks)
    # From zero, the first step moves the branch's last norm alone; with it, the second
    # step reaches the convolutions of every branch.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    images, targets = torch.randn(8, 3, 16, 16), torch.randint(10, (8,))
    convolutions = [(b.conv1.weight, b.conv2.weight) for b in blocks]
    before = [[w.detach().clone() for w in pair] for pair in convolutions]
    for step in range(2):
        F.cross_entropy(model(images), targets).backward()
        optimizer.step()
        optimizer.zero_grad()
        moved = [
            [not torch.equal(w, w0) for w, w0 in zip(*pairs, strict=True)]
            for pairs in zip(convolutions, before, strict=True)
        ]
        assert moved == [[step == 1] * 2] * 3, (step, moved)
        assert all(b.bn2.weight.any() for b in blocks)


def test_torchvision_models_with_side_heads_give_their_outputs_alone(models):
    """googlenet (and inception_v3) return their side heads' outputs too, in training: built
    without them, they give the (N, classes) outputs the loss takes, in both modes."""
    from proj.data import DataInfo

    model = models.build_model("googlenet", DataInfo(7, (3, 32, 32)))
    for training in (True, False):
        outputs = model.train(training)(torch.zeros(2, 3, 32, 32))
        assert type(outputs) is torch.Tensor and outputs.shape == (2, 7)


def test_the_resnet_keeps_the_stem_size_then_halves_it_twice_with_he_initialised_kernels(models):
    """A 3x3 stem and three stages (16, 32, 64 channels): the first keeps 32x32, the next
    two halve it. Kernels are drawn as He et al. do for ReLU, std sqrt(2 / fan_out)."""
    torch.manual_seed(0)
    model = models.ResNetSmall(10, widths=(64, 64, 64))
    shapes = []
    hooks = [block.register_forward_hook(lambda m, i, out: shapes.append(tuple(out.shape)))
             for block in model.layers]  # fmt: skip
    model(torch.zeros(2, 3, 32, 32))
    for hook in hooks:
        hook.remove()
    assert shapes == [(2, 64, 32, 32), (2, 64, 16, 16), (2, 64, 8, 8)]
    kernel = models.ResNetSmall(10, widths=(16, 256, 256)).layers[1].conv1.weight
    fan_out = kernel.shape[0] * kernel[0, 0].numel()  # 256 x 9, where fan_in is 16 x 9
    assert kernel.std().item() == pytest.approx((2 / fan_out) ** 0.5, rel=0.02)
